"""Start sandboxes by forking a process that has imported torch already (the zygote).

A sandbox started as a fresh interpreter spends about 2 s importing torch before it can run a
cell, and grading starts one per notebook. The zygote (``sandbox_child.zygote``) imports torch
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
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

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


def available() -> bool:
    return sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def spawn(config: dict, env: dict, cwd: Path, request_fd: int, response_fd: int, log_fd: int) -> Child:
    """A sandbox process like ``python -m autograder.sandbox_child REQ RESP CONFIG`` in ``cwd`` with ``env``."""
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
            [sys.executable, "-m", "autograder.sandbox_child", "--zygote", str(theirs.fileno())],
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


atexit.register(_stop)
