"""Start sandboxes by forking a process that has imported torch already (the zygote).

A sandbox started as a fresh interpreter spends about 2 s importing torch before it can run a
cell, and grading starts one per notebook. The zygote (``sandbox_child.zygote``) imports torch
once and forks a child per sandbox; the child confines itself exactly as a fresh one does, before
any submitted code exists in it. The zygote listens on a socket in a private folder, so
grading processes forked later (``workbook.py grade``) share the one their parent started.

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
import tempfile
from pathlib import Path

_zygote: dict = {}     # "process", "path", "folder" of the zygote this process (or its parent) started


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
    conn = _connect(env)
    try:
        message = json.dumps({"config": config, "env": env, "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [message], [request_fd, response_fd, log_fd])
        conn.shutdown(socket.SHUT_WR)
        reply, fds, _, _ = socket.recv_fds(conn, 64, 1)
        if not fds or b"\n" not in reply:
            raise OSError("the sandbox zygote did not start a sandbox")
        pid, received = reply.split(b"\n", 1)       # a child that ended at once: its code may follow
        return Child(conn, int(pid), fds[0], received)
    except BaseException:
        conn.close()
        raise


def _connect(env: dict) -> socket.socket:
    """A connection to the zygote this process or its parent started; one is started if none answers."""
    for attempt in (1, 2):
        if _zygote:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(_zygote["path"])
                return conn
            except OSError:
                conn.close()
        if attempt == 1:
            _start(env)
    raise OSError("the sandbox zygote does not answer")


def _start(env: dict) -> None:
    """Start this process's zygote, with the environment every sandbox shares."""
    _stop()
    folder = tempfile.mkdtemp(prefix="workbook-zygote-")   # mode 0700: only this user reaches the socket
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    shared = {k: v for k, v in env.items() if k not in ("HOME", "TMPDIR", "MPLCONFIGDIR")}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "autograder.sandbox_child", "--zygote", str(listener.fileno())],
            cwd=folder, env=shared, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(listener.fileno(),), start_new_session=True)
    finally:
        listener.close()
    _zygote.update(process=process, path=path, folder=folder, pid=os.getpid())


def _stop() -> None:
    if _zygote and _zygote["pid"] == os.getpid():
        _zygote["process"].kill()
        _zygote["process"].wait()
        try:
            os.unlink(_zygote["path"])
            os.rmdir(_zygote["folder"])
        except OSError:
            pass
    _zygote.clear()


atexit.register(_stop)
