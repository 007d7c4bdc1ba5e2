"""What crosses between a caller and its fresh processes (``fresh_process``): frames of data, and reports.

On the stream socket between them, each message is a frame: its length, then JSON made by
``autograder.grading.wire`` that decodes to data only (a reference, which would stand for an object
left behind, is refused). A task reports ``{"ok": what it returned}`` or what it raised, as data
(``_described``); ``_outcome`` turns a report back into the value, or into ``FreshProcessError``.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time


class FreshProcessError(RuntimeError):
    """The task failed in the fresh process (its error, as text), or the process did not report back."""

    def __init__(self, message: str, raised: dict | None = None, where: str = ""):
        super().__init__(message)
        self.raised, self.where = raised, where

    def described(self) -> dict | None:
        """What the task raised, as grading.server.describe_exception gives it; None when it raised nothing
        (the process died, or ran out of time)."""
        return self.raised


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
