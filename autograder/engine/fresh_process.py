"""A fresh process: a new Python interpreter that never held the memory of the process that saved.

A check that resumes the learner's code "in a fresh process" must share nothing with the process that
saved but the file it moved: no module global, no closure, no memory mapping or tensor in shared memory,
no file in /dev/shm, the temp folder or the home folder. A fork shares all of them. So:

* **A server of fresh processes.** ``start()`` launches, once per process, a new interpreter (isolated
  mode, an environment of its own) that imports torch and the check modules, then forks one child per
  task. It never runs code it is sent: each child unpacks its task itself. So every child starts from
  that interpreter's memory, which no submitted code ever touched, in milliseconds instead of the 2 s an
  ``import torch`` costs. A notebook starts it in its set-up cell, beside its own imports.
* **The task travels by value, packed before the save runs.** ``packed(task, *args)`` packs a function
  of a check module with the learner's functions among its arguments, as ``portable._DataPacker`` does:
  their code, and the globals, defaults and closure cells they use, copied as data and running none of
  their code. What the save leaves in memory afterwards cannot reach the copy; what cannot travel as data
  (an mmap, a shared tensor, a socket) stays behind, and ``left_out`` says so.
* **The child is confined.** Its own empty folder is its home, temp folder and working directory; every
  other file descriptor is closed; Landlock lets it read the Python installation, this package and the
  files it is given (the checkpoint), and write its own folder only; it may not connect over TCP or to
  an abstract socket, nor signal or trace processes outside it; a seccomp filter refuses ``socket()``.
  What the machine lacks is skipped and said in ``confinement()`` (the filters: ``engine.confinement``).

Results come back as data (``autograder.grading.wire``), never unpickled. A task may also ask questions
of the process that runs it while it runs (``ask``): notebook 08's checks keep their training runs there,
and the learner's code in the child only holds handles to them.

``in_a_fork`` is the other half: the learner's save runs in a forked child, so that what it changes in
memory (module globals, patched functions) dies with it.

Three modules: this one is the caller's side and the entry (every name below imports from here);
``fresh_server`` is the new interpreter's loop and each child it forks, with ``ask``; ``fresh_wire``
is what crosses between them: frames of data, the task's report, ``FreshProcessError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable

from . import portable
from .confinement import _READABLE, _landlock_abi, _seccomp_program, confine, readable_roots  # noqa: F401
# Every name this module held before its server and its wire moved out still imports from here (and the
# sandbox's guard, which names shared code by the first module that holds it, names each as before).
from .fresh_server import (_BOOT, _BOX, _KEPT_ENVIRONMENT, _child, _close_all_but, _execute,  # noqa: F401
                           _reap, _serve, _serve_requests, _warm, ask)
from .fresh_wire import (_MAX_FRAME, FreshProcessError, _decode, _described, _encode, _outcome,  # noqa: F401
                         _receive_exactly, _receive_frame, _send_frame, raised_text)

# Bound when this module is imported (before any submitted code runs in a sandbox): the interpreter that
# starts the server and where this package lives (the environment it keeps: fresh_server).
_PYTHON = sys.executable
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # above autograder/
_SERVER: dict = {}          # the running server of this process (a dict: changed in place, never rebound)
AVAILABLE = hasattr(os, "fork") and hasattr(socket, "send_fds")   # not on Windows


# ---- the caller's side ----------------------------------------------------------------------------

def start(preload: str | None = None) -> None:
    """Launch this process's server of fresh processes if it is not running, and have it import
    ``preload`` (a check module) once. Returns at once: the server imports torch on its own."""
    if not AVAILABLE:
        return
    server = _SERVER.get("server")
    if server is None or not server.alive():
        server = _SERVER["server"] = _Server()
    if preload:
        server.preload(preload)


def packed(task: Callable, *args) -> "Packed":
    """``task(*args, *more)`` for ``Packed.run(*more)``, with the learner's functions among ``args``
    copied now (see the module's docstring): call it before the learner's save runs."""
    return Packed(task, args)


class Packed:
    def __init__(self, task: Callable, args: tuple):
        self.packer = portable._DataPacker(by_value=_by_value)
        self.encoded = (self.packer.value(task), self.packer.value(args))
        self.payload_globals = self.packer.globals

    @property
    def left_out(self) -> dict[str, str]:
        """The globals and closure variables of the learner's code that could not travel: name -> what."""
        return dict(self.packer.left_out)

    def run(self, *more, readable=(), timeout: float = 20.0, serve: Callable | None = None,
            preload: str | None = None):
        """Run the task in a fresh process with ``more`` appended to its arguments (data only), letting it
        read the files ``readable``; ``serve(question)`` answers what it ``ask``s. Returns what it returned;
        raises FreshProcessError for what it raised, or when it did not report back within ``timeout``."""
        import pickle
        extra = portable._DataPacker(by_value=lambda obj: False).value(more)
        own = self.packer.own_modules
        payload = pickle.dumps((self.payload_globals, self.encoded, extra, own.get("paths", [])))
        if not AVAILABLE:
            return _run_here(payload)
        start(preload)
        listable = sorted({os.path.dirname(f) for f in own.get("files", [])} | set(own.get("paths", [])))
        return _SERVER["server"].run(payload, list(readable) + own.get("files", []), listable, timeout, serve)


def _by_value(obj) -> bool:
    """A notebook's function or class, or one of a module a fresh process would not import the same (a
    learner's helper module, a test's fixtures): it travels as code."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return module is None or module.__name__ == "__main__" or not portable.trusted_module(module)


def server_pid() -> int | None:
    """The pid of this process's server of fresh processes, while it runs."""
    server = _SERVER.get("server")
    return server.pid if server is not None else None


def confinement() -> dict:
    """What a fresh process is confined by on this machine: {"landlock": ABI or 0, "seccomp": bool}."""
    return {"landlock": _landlock_abi(), "seccomp": _seccomp_program() is not None}


def files_are_private() -> bool:
    """Whether a fresh process here can read only the files it is given (Landlock)."""
    return AVAILABLE and _landlock_abi() >= 1


class _Server:
    """The caller's handle on one server: a socket pair of messages to it, and a lock per request."""

    def __init__(self):
        # Messages with their boundaries; SEQPACKET also tells the caller when the server has ended.
        kind = socket.SOCK_SEQPACKET if sys.platform.startswith("linux") else socket.SOCK_DGRAM
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
        own = tempfile.mkdtemp(prefix="fresh-processes-")     # the server's home and temp folder (torch writes there)
        env = {**_KEPT_ENVIRONMENT, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HOME": own, "TMPDIR": own}
        # What the server prints (a traceback if it cannot start) goes to a file: a task that finds it gone
        # says why, instead of a bare ConnectionResetError. Its children print nowhere (fresh_server._child).
        self.log = os.path.join(own, "server.log")
        said_pid, says_pid = os.pipe()
        try:
            with open(self.log, "wb") as log:
                # -I: no PYTHON* variable, no user site, no working directory on sys.path; -B: no .pyc written.
                launcher = subprocess.Popen(
                    [_PYTHON, "-I", "-B", "-c", _BOOT, _PACKAGE_ROOT, str(theirs.fileno()), str(says_pid)],
                    pass_fds=(theirs.fileno(), says_pid), env=env, cwd=own, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=log)
            os.close(says_pid)
            launcher.wait()      # it forks the server and ends: the server is nobody's child to wait for
            told = os.read(said_pid, 32)
        finally:
            theirs.close()
            for fd in (said_pid, says_pid):
                with contextlib.suppress(OSError):
                    os.close(fd)
        # The server's pid: the grading sandbox ends what a call of the learner's code leaves running, not this.
        self.pid = int(told) if told.isdigit() else None
        self.control, self.lock, self.preloaded = ours, threading.Lock(), set()

    def why_ended(self) -> str:
        """What the server printed last (the error it ended with), or that it printed nothing."""
        try:
            with open(self.log, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 4096))
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        if not lines:
            return "it printed nothing"
        return f"it ended with {lines[-1].strip()}, importing autograder from {_PACKAGE_ROOT}"

    def died(self, what: str) -> "FreshProcessError":
        """The error for a task whose fresh process went away: where the server has ended too, why."""
        if self.alive():
            return FreshProcessError(what)
        _SERVER.pop("server", None)          # the next task starts another one
        return FreshProcessError(f"{what}: the server of fresh processes has ended ({self.why_ended()})")

    def alive(self) -> bool:
        try:
            self.control.send(b'{"ping": true}')
            return True
        except OSError:
            return False

    def preload(self, module: str) -> None:
        if module not in self.preloaded:
            self.preloaded.add(module)
            with self.lock, contextlib.suppress(OSError):      # a server that has ended: the task says why
                self.control.send(json.dumps({"preload": module}).encode())

    def run(self, payload: bytes, readable: list, listable: list, timeout: float, serve):
        folder = tempfile.mkdtemp(prefix="fresh-process-")
        ours, theirs = socket.socketpair()
        pidfd = None
        try:
            request = {"folder": folder, "readable": readable, "listable": listable, "timeout": timeout,
                       "id": os.urandom(8).hex()}
            with self.lock:
                try:
                    socket.send_fds(self.control, [json.dumps(request).encode()], [theirs.fileno()])
                except OSError:
                    raise self.died("the server of fresh processes did not take the task") from None
                finally:
                    theirs.close()
                pidfd = self._forked(request["id"], time.monotonic() + max(timeout, 60.0))
            deadline = time.monotonic() + timeout
            try:
                _send_frame(ours, payload)
            except (ConnectionError, BrokenPipeError):
                raise self.died("the fresh process died before it read its task") from None
            while True:
                try:
                    frame = _receive_frame(ours, deadline)
                except (ConnectionError, BrokenPipeError):
                    frame = None
                if frame is None:
                    raise self.died("the fresh process died before reporting back")
                try:
                    message = _decode(frame)
                except (ValueError, TypeError, KeyError) as exc:
                    raise FreshProcessError(f"the fresh process sent something that is not data ({exc})") from None
                if not isinstance(message, dict):
                    raise FreshProcessError("the fresh process sent something that is not a report")
                if "ask" not in message:
                    break
                try:
                    answer = {"answer": serve(message["ask"]) if serve else None}
                except Exception as exc:      # noqa: BLE001 (the question was not one to answer)
                    answer = {"raised": f"{type(exc).__name__}: {exc}"}
                try:
                    _send_frame(ours, _encode(answer))
                except (ConnectionError, BrokenPipeError):
                    raise self.died("the fresh process died before reporting back") from None
        except TimeoutError:
            # By its pidfd: a process id may already name another process. The server then ends the
            # process group it led, before the id is free again.
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            raise FreshProcessError(f"the fresh process did not finish within {timeout:g} s") from None
        finally:
            ours.close()
            if pidfd is not None:
                os.close(pidfd)
            shutil.rmtree(folder, ignore_errors=True)
        return _outcome(message)

    def _forked(self, request_id: str, deadline: float) -> int:
        """The pidfd of the child the server forked for this request."""
        while True:
            ready, _, _ = select.select([self.control], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise FreshProcessError("the server of fresh processes did not answer in time")
            try:
                message, fds, _, _ = socket.recv_fds(self.control, 65536, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                _SERVER.pop("server", None)          # the next task starts another one
                raise FreshProcessError(f"the server of fresh processes has ended ({self.why_ended()})")
            reply = json.loads(message)
            if reply.get("id") == request_id and len(fds) == 1:
                return fds[0]
            for fd in fds:           # a late answer to an earlier request
                os.close(fd)
            if reply.get("id") == request_id:
                raise FreshProcessError("the fresh process ended as soon as it started")


def _run_here(payload: bytes):
    """Without fork (Windows): the task in this very process, a weaker test (what memory holds is shared)."""
    return _outcome(_decode(_encode(_execute(payload))))


# ---- a forked child, for the learner's save ----------------------------------------------------------

def in_a_fork(task: Callable, *args, timeout: float = 20.0):
    """``task(*args)`` in a forked child; what it returns, as data. The child holds everything this process
    holds at the fork, and what it changes dies with it. Errors there come back as FreshProcessError.

    Every process the task starts dies before the call returns, however it detached (a double fork, a
    process group of its own): for the call, this process adopts the orphans below it (a child subreaper:
    the learner's code, which runs in the child, cannot undo that), and once the child has ended it ends
    each process it adopted. So nothing a learner's save left running can hand the save's memory to the
    fresh process that resumes after it."""
    from ..checking import silence_this_process
    if not hasattr(os, "fork"):
        return _outcome(_decode(_encode(_call(task, args))))
    adopting = _Adopting()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:     # the child: never return into the caller's code, never write to its outputs
        try:
            os.close(read_end)
            silence_this_process()
            signal.alarm(int(timeout) + 2)
            outcome = _call(task, args)
            try:
                data = _encode(outcome)
            except Exception as exc:      # noqa: BLE001
                data = _encode({"error": f"it returned something that is not data ({exc})", "where": ""})
            with os.fdopen(write_end, "wb") as out:      # its length first: a process the task left
                out.write(len(data).to_bytes(8, "big") + data)    # holding the pipe keeps it open
        finally:
            os._exit(0)
    os.close(write_end)
    received, deadline = bytearray(), time.monotonic() + timeout
    try:
        while len(received) < 8 or len(received) < 8 + int.from_bytes(received[:8], "big"):
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise FreshProcessError(f"the process did not finish within {timeout:g} s")
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            received += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
        adopting.end()
    if len(received) < 8 or len(received) < 8 + int.from_bytes(received[:8], "big"):
        raise FreshProcessError("the process died before reporting back")
    return _outcome(_decode(bytes(received[8:])))


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


class _Adopting:
    """From here to ``end()``, this process adopts every orphan below it; ``end()`` SIGKILLs each process
    that became its child meanwhile, round after round (each one ended hands its own children up), then
    puts the setting back. Where the machine has no subreaper (not Linux), nothing is adopted or ended."""

    def __init__(self):
        import ctypes
        self.previous = None
        try:
            self.libc = ctypes.CDLL(None, use_errno=True)
            flag = ctypes.c_int(0)
            if self.libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and \
                    self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                self.previous = flag.value
        except (OSError, AttributeError):
            pass
        self.before = set(_children())

    def end(self, rounds: int = 1000) -> int:
        """End what was adopted; how many processes that was."""
        if self.previous is None:
            return 0
        ended = 0
        try:
            for _ in range(rounds):
                adopted = [child for child in _children() if child not in self.before]
                if not adopted:
                    break
                for pid, _ in adopted:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                        ended += 1
                for pid, _ in adopted:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
        finally:
            self.libc.prctl(_PR_SET_CHILD_SUBREAPER, self.previous, 0, 0, 0)
        return ended


def _children() -> list[tuple[int, bytes]]:
    """This process's children, each as (pid, start time): a pid alone may name a later process."""
    found = []
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/children") as f:
                pids = [int(pid) for pid in f.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    found.append((pid, f.read().rsplit(b")", 1)[1].split()[19]))
            except (OSError, IndexError):
                continue
    return found


def _call(task: Callable, args: tuple) -> dict:
    try:
        return {"ok": task(*args)}
    except BaseException as exc:    # noqa: BLE001 (reported to the parent, not raised here)
        return _described(exc, traceback.extract_tb(exc.__traceback__))
