"""Start sandboxes by forking a process that has imported torch already (the zygote).

A sandbox started as a fresh interpreter spends about 2 s importing torch before it can run a
cell, and grading starts one per notebook. The zygote (``zygote`` below) imports torch
once and forks a child per sandbox; the child confines itself exactly as a fresh one does, before
any submitted code exists in it.

The zygote is reached through a socket pair, never a path: a sandboxed submission must not be
able to ask it for an unconfined process, and a socket it cannot name it cannot reach. Grading
processes forked later (``workbook.py grade``) inherit their parent's end and share its zygote;
each request is one datagram carrying its own reply socket, so they never mix.

``spawn`` returns a ``Child``: ``poll``, ``wait`` and ``kill`` as on ``subprocess.Popen``. The
zygote sends the child's pidfd (a signal reaches that process, never a later one with its pid)
and, when the child ends, its exit code.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

from autograder.grading.confine import PR_SET_PDEATHSIG, _libc
from autograder.grading.server import run

_zygote: dict = {}     # "process", "control" (our end of the socket pair), "pid" (who started it)


class Child:
    """A sandbox forked by the zygote, handled like a ``subprocess.Popen``."""

    def __init__(self, conn: socket.socket, pid: int, pidfd: int, received: bytes = b""):
        self.conn, self.pid, self.pidfd, self._received = conn, pid, pidfd, received
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and (b"\n" in self._received or select.select([self.conn], [], [], 0)[0]):
            self._read_code()
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._read_code()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _read_code(self) -> None:
        data = self._received
        while b"\n" not in data:
            chunk = self.conn.recv(64)
            if not chunk:      # the zygote is gone, and with it this child's exit code
                data = b"-9\n"
                break
            data += chunk
        self.returncode = int(data.split(b"\n", 1)[0])
        self.conn.close()
        os.close(self.pidfd)


def started() -> bool:
    """This process, or the one it was forked from, has a zygote already."""
    return bool(_zygote)


def available() -> bool:
    return sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def spawn(config: dict, env: dict, cwd: Path, request_fd: int, response_fd: int, log_fd: int) -> Child:
    """A sandbox process like ``python -m autograder.grading.server REQ RESP CONFIG`` in ``cwd`` with ``env``."""
    message = json.dumps({"config": config, "env": env, "cwd": str(cwd)}).encode()
    reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with theirs:
            _send(message, [request_fd, response_fd, log_fd, theirs.fileno()], env)
        answer, fds, _, _ = socket.recv_fds(reply, 64, 1)
        if not fds or b"\n" not in answer:
            raise OSError("the sandbox zygote did not start a sandbox")
        pid, received = answer.split(b"\n", 1)       # a child that ended at once: its code may follow
        return Child(reply, int(pid), fds[0], received)
    except BaseException:
        reply.close()
        raise


def _send(message: bytes, fds: list[int], env: dict) -> None:
    """To the zygote this process or its parent started; one is started if none is there."""
    for attempt in (1, 2):
        if _zygote:
            try:
                socket.send_fds(_zygote["control"], [message], fds)
                return
            except OSError:
                pass
        if attempt == 1:
            _start(env)
    raise OSError("the sandbox zygote does not answer")


def _start(env: dict) -> None:
    """Start this process's zygote, with the environment every sandbox shares."""
    _stop()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    shared = {k: v for k, v in env.items() if k not in ("HOME", "TMPDIR", "MPLCONFIGDIR")}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "autograder.grading.zygote", str(theirs.fileno())],
            cwd="/", env=shared, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
    finally:
        theirs.close()
    _zygote.update(process=process, control=ours, pid=os.getpid())


def _stop() -> None:
    if _zygote:
        _zygote["control"].close()            # the zygote ends when no process holds this end any more
        if _zygote["pid"] == os.getpid():
            try:
                _zygote["process"].wait(timeout=10)
            except subprocess.TimeoutExpired:   # a forked grader still holds an end: do not wait for it
                _zygote["process"].kill()
                _zygote["process"].wait()
    _zygote.clear()


stop = _stop        # end this process's zygote now (a process that started one only to check, say)
atexit.register(_stop)


# ---- the zygote's own side: sandboxes forked from a process that has imported torch already -----------

def zygote(control_fd: int) -> None:
    """Serve ``spawn``: fork one sandbox per request, and send back its pidfd,
    then its exit code when it ends. Runs no submitted code itself: only its children do, after ``run``
    has confined them, so it saves each sandbox the 2 s of importing torch. Ends when every grading
    process has closed its end of the control socket, or when the one that started it dies."""
    import selectors

    import autograder.grading.wire  # noqa: F401  (torch and numpy, for every child)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(0)
    control = socket.socket(fileno=control_fd)
    watch = selectors.DefaultSelector()
    watch.register(control, selectors.EVENT_READ)
    dynamo_imported = False
    while True:
        ready = watch.select(timeout=None if dynamo_imported else 0)
        if not ready:                             # only before the warm-up: no request is waiting
            import_dynamo()
            dynamo_imported = True
            continue
        for key, _ in ready:
            if key.fileobj is control:
                try:
                    message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
                except OSError:
                    continue
                if not message and not fds:
                    os._exit(0)                   # no grader holds the other end any more
                started = _fork_sandbox(message, fds)
                if started is not None:
                    watch.register(started[1], selectors.EVENT_READ, started)
            else:
                pid, pidfd, reply = key.data
                watch.unregister(pidfd)
                os.close(pidfd)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                try:
                    reply.sendall(f"{code}\n".encode())
                except OSError:
                    pass
                reply.close()


def import_dynamo() -> None:
    """Import torch._dynamo in this process, once, for every process forked from it afterwards.

    torch.optim imports it on an optimizer's first step (1.3 s: sympy and the compiler's tables), so
    each notebook that trains would pay it again. The zygote imports it while it idles, after the first
    sandbox is on its way (a lone self-check waits for none of it), and workbook-grade before it forks
    its grading children. It starts no thread, so forking stays as safe as before.
    """
    try:
        import torch._dynamo  # noqa: F401
    except Exception:
        pass    # a warm-up only: a sandbox imports it itself if it needs it


def _fork_sandbox(message: bytes, fds: list[int]) -> tuple[int, int, socket.socket] | None:
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        return None
    request_fd, response_fd, log_fd, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    try:
        spec = json.loads(message)
    except ValueError:
        spec = None
    if not isinstance(spec, dict):
        for fd in fds[:3]:
            os.close(fd)
        reply.close()
        return None
    pid = os.fork()
    if pid == 0:
        try:
            # What subprocess.Popen did for a sandbox started on its own: new session, its folder,
            # its environment, stdin from /dev/null and output to its log; no other descriptor.
            os.setsid()
            os.chdir(spec["cwd"])
            os.environ.clear()
            os.environ.update(spec["env"])
            import tempfile
            tempfile.tempdir = None
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            low, high = sorted((request_fd, response_fd))
            os.closerange(3, low)
            os.closerange(low + 1, high)
            os.closerange(high + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            run(request_fd, response_fd, spec["config"])
        finally:
            os._exit(70)
    for fd in fds[:3]:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        socket.send_fds(reply, [b"%d\n" % pid], [pidfd])
    except OSError:
        pass
    return pid, pidfd, reply


if __name__ == "__main__":
    zygote(int(sys.argv[1]))
