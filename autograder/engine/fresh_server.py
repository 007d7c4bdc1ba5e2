"""The server of fresh processes (``fresh_process``): the new interpreter's loop, and each child it forks.

``_BOOT`` is what the new interpreter runs: it leaves the caller's session and serves (``_serve``),
importing the check modules it is asked to preload, forking a child per task (ahead of the task: ``_Spare``)
and handing the caller the child's pidfd; on SIGCHLD it ends the process group each ended child led (``_reap``). A child
(``_child``) makes its own folder its home, temp folder and working directory, closes every other file
descriptor, confines itself (``engine.confinement``), then receives the packed task, runs it
(``_execute``) and sends back the report (``fresh_wire``). While it runs, the task may ``ask``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import traceback

from . import portable
from .confinement import _READABLE, _prctl, confine, readable_roots
from .fresh_wire import _decode, _described, _encode, _receive_frame, _send_frame

# Bound when this module is imported (before any submitted code runs in a sandbox): the little of the
# environment the server and its children keep.
_KEPT_ENVIRONMENT = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL") if name in os.environ}
# Where a task raised is its last frame outside this machinery (one module once, three now).
_MACHINERY = frozenset(os.path.join(os.path.dirname(__file__), f"{name}.py")
                       for name in ("fresh_process", "fresh_server", "fresh_wire"))

# The new interpreter's program; it imports _serve through the entry module, which imports this one.
_BOOT = """
import os, sys
sys.path.insert(0, sys.argv[1])
server = os.fork()
if server:
    os.write(int(sys.argv[3]), str(server).encode())    # its pid, for the caller (fresh_process._Server.pid)
    os._exit(0)
os.close(int(sys.argv[3]))
try:
    os.setsid()         # out of the caller's session, so its terminal's signals stay there
except PermissionError:
    pass                # in the grading sandbox, whose filter refuses setsid: it stays in the sandbox's
from autograder.engine.fresh_process import _serve
_serve(int(sys.argv[2]))
"""

_BOX: dict = {}     # in a fresh process: its connection to the process that runs the task


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


def _serve(control_fd: int) -> None:
    """The server's loop: import what is asked for, fork a child per task; end when the caller is gone."""
    import importlib

    from autograder.course import CHECK_MODULES, CHECK_SUPPORT
    from autograder.engine.fresh_process import _Adopting
    _Adopting()         # the orphans of its children's children are its own: _reap ends them
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
    spare = _Spare()
    try:
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
                        spare.end()         # forked before this module was imported: it lacks it
                        _warm(importlib.import_module(request["preload"]))
                    continue
                if "folder" not in request or len(fds) != 1:
                    continue
            except Exception:      # noqa: BLE001 (a request it cannot read is dropped)
                for fd in fds:
                    os.close(fd)
                continue
            pid = spare.take(message, fds[0])
            if pid is None:      # none yet, or it has ended: one now (a fork refused here ends the server)
                spare.fork(control, for_a_task=True)
                pid = spare.take(message, fds[0])
            if pid is not None:
                _OWN.add(pid)
            os.close(fds[0])
            try:
                pidfd = [os.pidfd_open(pid)] if pid is not None else []
            except OSError:      # it has ended already
                pidfd = []
            try:
                socket.send_fds(control, [json.dumps({"id": request.get("id")}).encode()], pidfd)
            except OSError:
                return
            finally:
                for fd in pidfd:
                    os.close(fd)
            spare.fork(control)      # the next task's child, forked while this one runs
    finally:
        spare.end()


class _Spare:
    """A child forked ahead of its task, waiting for it: a task then starts without a fork of the server
    (a few ms each, and a check runs dozens). It is the fork the task would have had, only earlier, so it
    holds what the server holds; after a preload it is ended and forked again. Where it cannot be used
    (none yet, or it has ended), the server forks as before."""

    def __init__(self):
        self.pid, self.socket = None, None

    def fork(self, control: socket.socket, for_a_task: bool = False) -> None:
        """A spare, unless one waits already. Ahead of a task, a fork refused at a limit of processes is let
        be: the task forks when it comes (``for_a_task``), and there the refusal is raised, as it always was."""
        if self.pid is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # No SIGCHLD between the fork and _OWN knowing the child: _reap would take it for an orphan.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            ours.close()
            theirs.close()
            if for_a_task:
                raise
            return
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            try:
                control.close()
                ours.close()
                message, fds, _, _ = socket.recv_fds(theirs, 65536, 1)   # nothing: the server has ended
                if message and len(fds) == 1:
                    _child(json.loads(message), fds[0])
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.socket = pid, ours
        _OWN.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})

    def take(self, message: bytes, connection_fd: int) -> int | None:
        """Hand the request and its connection to the spare; its pid, or None where it could not."""
        pid, sock = self.pid, self.socket
        self.pid, self.socket = None, None
        if pid is None:
            return None
        try:
            socket.send_fds(sock, [message], [connection_fd])
            return pid
        except OSError:             # it has ended (the server's SIGCHLD handler reaps it)
            return None
        finally:
            sock.close()

    def end(self) -> None:
        if self.pid is not None:
            self.socket.close()     # it reads nothing, and ends
            self.pid, self.socket = None, None


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


_OWN: set = set()      # in the server: the children it forked (the spare, the tasks), until reaped


def _reap(signum, frame) -> None:
    """In the server, on SIGCHLD: end the process group each ended child led (what it started and left
    running), while its id still names it (a child's id is free again once it is reaped), then reap it.
    Then end every child it did not fork: orphans of what its children started, which the server adopts
    (a child subreaper), however they left their group (a double fork, setpgid)."""
    from autograder.engine.fresh_process import _children
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if ended is None:
            break
        with contextlib.suppress(OSError):
            os.killpg(ended.si_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ended.si_pid, 0)
        _OWN.discard(ended.si_pid)
        for pid, _ in _children():
            if pid not in _OWN:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)     # reaped by this loop: its end is a SIGCHLD too


def _child(request: dict, connection_fd: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setpgid(0, 0)          # its own group: the caller ends it with everything it started
    # It adopts the orphans of what its task starts, while the task runs: the server, which ends every
    # child it did not fork, gets them only once this child has ended (_reap).
    _prctl(36, 1)             # PR_SET_CHILD_SUBREAPER
    signal.alarm(int(request["timeout"]) + 2)   # and it ends itself when nobody does
    folder = request["folder"]
    os.environ.clear()
    os.environ.update({**{k: v for k, v in _KEPT_ENVIRONMENT.items()}, "HOME": folder, "TMPDIR": folder,
                       "OMP_NUM_THREADS": "1"})
    tempfile.tempdir = None
    os.chdir(folder)
    devnull = os.open(os.devnull, os.O_WRONLY)     # not the server's log: nothing of a task is kept there
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
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
        return _described(exc, [f for f in traceback.extract_tb(exc.__traceback__) if f.filename not in _MACHINERY])


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
