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
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable

from . import portable
from .confinement import _READABLE, _landlock_abi, _seccomp_program, confine, readable_roots

# Bound when this module is imported (before any submitted code runs in a sandbox): the interpreter that
# starts the server, where this package lives, and the little of the environment it keeps.
_PYTHON = sys.executable
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # above autograder/
_KEPT_ENVIRONMENT = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL") if name in os.environ}
_SERVER: dict = {}          # the running server of this process (a dict: changed in place, never rebound)
AVAILABLE = hasattr(os, "fork") and hasattr(socket, "send_fds")   # not on Windows


class FreshProcessError(RuntimeError):
    """The task failed in the fresh process (its error, as text), or the process did not report back."""

    def __init__(self, message: str, raised: dict | None = None, where: str = ""):
        super().__init__(message)
        self.raised, self.where = raised, where

    def described(self) -> dict | None:
        """What the task raised, as grading.server.describe_exception gives it; None when it raised nothing
        (the process died, or ran out of time)."""
        return self.raised


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


def ask(question):
    """In a fresh process: ``question`` (data) to the process that runs the task; its answer (data)."""
    connection = _BOX.get("connection")
    if connection is None:
        raise RuntimeError("ask() is for a task that runs in a fresh process")
    _send_frame(connection, _encode({"ask": question}))
    reply = _decode(_receive_frame(connection))
    if "raised" in reply:
        raise RuntimeError(reply["raised"])
    return reply["answer"]


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
        try:
            # -I: no PYTHON* variable, no user site, no working directory on sys.path; -B: no .pyc written.
            launcher = subprocess.Popen(
                [_PYTHON, "-I", "-B", "-c", _BOOT, _PACKAGE_ROOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, cwd=own, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            launcher.wait()      # it forks the server and ends: the server is nobody's child to wait for
        finally:
            theirs.close()
        self.control, self.lock, self.preloaded = ours, threading.Lock(), set()

    def alive(self) -> bool:
        try:
            self.control.send(b'{"ping": true}')
            return True
        except OSError:
            return False

    def preload(self, module: str) -> None:
        if module not in self.preloaded:
            self.preloaded.add(module)
            with self.lock:
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
                    _SERVER.pop("server", None)
                    raise FreshProcessError("the server of fresh processes has ended") from None
                finally:
                    theirs.close()
                pidfd = self._forked(request["id"], time.monotonic() + max(timeout, 60.0))
            deadline = time.monotonic() + timeout
            _send_frame(ours, payload)
            while True:
                try:
                    frame = _receive_frame(ours, deadline)
                except (ConnectionError, BrokenPipeError):
                    frame = None
                if frame is None:
                    raise FreshProcessError("the fresh process died before reporting back")
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
                    raise FreshProcessError("the fresh process died before reporting back") from None
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
            message, fds, _, _ = socket.recv_fds(self.control, 65536, 1)
            if not message:
                _SERVER.pop("server", None)          # the next task starts another one
                raise FreshProcessError("the server of fresh processes has ended")
            reply = json.loads(message)
            if reply.get("id") == request_id and len(fds) == 1:
                return fds[0]
            for fd in fds:           # a late answer to an earlier request
                os.close(fd)
            if reply.get("id") == request_id:
                raise FreshProcessError("the fresh process ended as soon as it started")


def _outcome(message: dict):
    if "error" not in message and "ok" not in message:
        raise FreshProcessError("the fresh process sent a report without a result")
    if "error" in message:
        where = message.get("where") or ""
        raised = ({key: message[key] for key in ("type", "builtin", "message", "strerror") if key in message}
                  if "type" in message else None)
        raise FreshProcessError(message["error"] + (f" (in {where})" if where else ""), raised, where)
    return message["ok"]


def _described(exc: BaseException, frames) -> dict:
    """An exception raised by the task, as data: its text, type, message, where, whether a builtin type."""
    try:
        message = str(exc)
    except Exception:           # noqa: BLE001 (a learner's exception may fail even to print)
        message = "(the exception's message could not be read)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    described = {"error": text[:4000], "type": type(exc).__name__[:100], "message": message[:4000],
                 "builtin": type(exc).__module__ == "builtins", "where": frames[-1].name if frames else ""}
    if isinstance(exc, OSError) and exc.filename is not None and isinstance(exc.strerror, str):
        described["strerror"] = exc.strerror[:200]
    return described


def raised_text(raised: dict) -> str:
    """What a task raised, in words that do not depend on where it ran: an error on a file gives its
    reason, not the file's path (which names a folder of the process it ran in)."""
    if "strerror" in raised:
        return f"{raised['type']} ({raised['strerror']}) on a file it opened"
    return f"{raised['type']}: {raised['message']}" if raised.get("message") else raised["type"]


def _run_here(payload: bytes):
    """Without fork (Windows): the task in this very process, a weaker test (what memory holds is shared)."""
    return _outcome(_decode(_encode(_execute(payload))))


# ---- frames on a stream socket: a length, then JSON made by wire.encode ---------------------------

def _encode(value) -> bytes:
    from ..grading import wire

    def refuse(obj):
        raise TypeError(f"a {type(obj).__name__} is not data")
    return json.dumps(wire.encode(value, refuse), separators=(",", ":")).encode()


def _decode(frame: bytes):
    from ..grading import wire

    def refuse(ref):
        raise ValueError("a reference is not data")
    return wire.decode(json.loads(frame), refuse)


_MAX_FRAME = 256 << 20


def _send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack(">Q", len(data)) + data)


def _receive_frame(sock: socket.socket, deadline: float | None = None) -> bytes | None:
    header = _receive_exactly(sock, 8, deadline)
    if header is None:
        return None
    (size,) = struct.unpack(">Q", header)
    if size > _MAX_FRAME:
        raise FreshProcessError(f"the fresh process sent {size} bytes, more than a result may hold")
    return _receive_exactly(sock, size, deadline)


def _receive_exactly(sock: socket.socket, n: int, deadline: float | None) -> bytes | None:
    chunks = []
    while n:
        if deadline is not None:
            ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ---- the server (a new interpreter) ----------------------------------------------------------------

_BOOT = """
import os, sys
sys.path.insert(0, sys.argv[1])
if os.fork():
    os._exit(0)
try:
    os.setsid()         # out of the caller's session, so its terminal's signals stay there
except PermissionError:
    pass                # in the grading sandbox, whose filter refuses setsid: it stays in the sandbox's
from autograder.engine.fresh_process import _serve
_serve(int(sys.argv[2]))
"""

_BOX: dict = {}     # in a fresh process: its connection to the process that runs the task


def _serve(control_fd: int) -> None:
    """The server's loop: import what is asked for, fork a child per task; end when the caller is gone."""
    import importlib

    from autograder.course import CHECK_MODULES, CHECK_SUPPORT
    signal.signal(signal.SIGCHLD, _reap)
    control = socket.socket(fileno=control_fd)
    importlib.import_module("autograder.grading.wire")  # torch and NumPy, once
    _READABLE["roots"] = readable_roots()
    allowed = set(CHECK_MODULES) | set(CHECK_SUPPORT)
    try:
        _serve_requests(control, allowed)
    finally:
        shutil.rmtree(os.environ.get("TMPDIR", "/nonexistent"), ignore_errors=True)   # its own folder


def _serve_requests(control: socket.socket, allowed: set) -> None:
    import importlib
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 65536, 4)
        except OSError:
            return
        if not message:
            return
        try:
            request = json.loads(message)
            if "preload" in request:
                if request["preload"] in allowed:
                    _warm(importlib.import_module(request["preload"]))
                continue
            if "folder" not in request or len(fds) != 1:
                continue
        except Exception:      # noqa: BLE001 (a request it cannot read is dropped)
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                _child(request, fds[0])
            finally:
                os._exit(0)
        os.close(fds[0])
        try:
            pidfd = [os.pidfd_open(pid)]
        except OSError:      # it has ended already
            pidfd = []
        try:
            socket.send_fds(control, [json.dumps({"id": request.get("id")}).encode()], pidfd)
        except OSError:
            return
        finally:
            for fd in pidfd:
                os.close(fd)


def _warm(module) -> None:
    """Run a check module's ``warm_up_fresh_processes()`` here, in the server, once: what its tasks import
    on first use (torch.manual_seed imports torch.cuda, an optimizer's first step torch._dynamo) is then
    imported in every child already, instead of in each. torch's RNG is put back where a new interpreter
    has it; NumPy's and Python's were seeded from the OS and stay so."""
    warm = getattr(module, "warm_up_fresh_processes", None)
    if warm is None:
        return
    import torch
    seed = torch.initial_seed()
    try:
        warm()
    except Exception:     # noqa: BLE001 (a child then imports what it needs itself)
        pass
    torch.manual_seed(seed)


def _reap(signum, frame) -> None:
    """In the server, on SIGCHLD: end the process group each ended child led (what it started and left
    running), while its id still names it (a child's id is free again once it is reaped), then reap it."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(ended.si_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ended.si_pid, 0)


def _child(request: dict, connection_fd: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setpgid(0, 0)          # its own group: the caller ends it with everything it started
    signal.alarm(int(request["timeout"]) + 2)   # and it ends itself when nobody does
    folder = request["folder"]
    os.environ.clear()
    os.environ.update({**{k: v for k, v in _KEPT_ENVIRONMENT.items()}, "HOME": folder, "TMPDIR": folder,
                       "OMP_NUM_THREADS": "1"})
    tempfile.tempdir = None
    os.chdir(folder)
    _close_all_but(connection_fd)
    confine(list(request["readable"]), [folder], list(request.get("listable", [])))
    connection = socket.socket(fileno=connection_fd)
    _BOX["connection"] = connection
    payload = _receive_frame(connection)
    if payload is None:
        return
    import torch
    torch.set_num_threads(1)
    _send_frame(connection, _encode(_execute(payload)))


def _execute(payload: bytes) -> dict:
    import pickle
    try:
        packed_globals, (task, args), extra, paths = pickle.loads(payload)
        sys.path[:0] = [p for p in paths if p not in sys.path]     # for modules of the learner's own
        unpacker = portable._Unpacker(packed_globals)
        outcome = {"ok": unpacker.value(task)(*unpacker.value(args), *unpacker.value(extra))}
        _encode(outcome)            # data only, or the error below says what is not
        return outcome
    except BaseException as exc:    # noqa: BLE001 (reported to the caller, not raised here)
        return _described(exc, [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__])


def _close_all_but(keep: int) -> None:
    """Close every file descriptor but 0, 1, 2 (which lead to /dev/null) and ``keep``."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


# ---- a forked child, for the learner's save ----------------------------------------------------------

def in_a_fork(task: Callable, *args, timeout: float = 20.0):
    """``task(*args)`` in a forked child; what it returns, as data. The child holds everything this process
    holds at the fork, and what it changes dies with it. Errors there come back as FreshProcessError."""
    from ..checking import silence_this_process
    if not hasattr(os, "fork"):
        return _outcome(_decode(_encode(_call(task, args))))
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
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
        finally:
            os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise FreshProcessError(f"the process did not finish within {timeout:g} s")
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    if not chunks:
        raise FreshProcessError("the process died before reporting back")
    return _outcome(_decode(b"".join(chunks)))


def _call(task: Callable, args: tuple) -> dict:
    try:
        return {"ok": task(*args)}
    except BaseException as exc:    # noqa: BLE001 (reported to the parent, not raised here)
        return _described(exc, traceback.extract_tb(exc.__traceback__))
