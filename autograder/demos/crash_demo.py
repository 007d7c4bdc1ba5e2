"""Notebook 05's demo writer: a save killed at a chosen byte, with the recipe's steps switched on or off."""

from __future__ import annotations

import io
import os
import time

import torch

from ..engine.crash_trials import run_and_kill


def save_directly(obj, path) -> None:
    """The trap: torch.save straight onto the final name."""
    torch.save(obj, path)


def demo_crash(obj, path, kill_at_bytes: int, temp_file_and_replace: bool, fsync_file: bool,
               fsync_directory: bool) -> str:
    """Notebook 05's live demo: fork a writer of ``obj`` to ``path`` with the recipe's steps switched on or
    off, SIGKILL it once ``kill_at_bytes`` of the file are on disk, and say how it ended (run_and_kill).

    The writer writes exactly that many bytes and waits for the kill (the trial's file-size limit would stop
    it there too). It never gets past that byte, so it never completes a save: the kill point must fall
    inside the file, and nothing here is an atomic_save."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    if not 0 < kill_at_bytes < buffer.tell():
        raise ValueError(f"the kill must land inside the file's {buffer.tell()} bytes, not at {kill_at_bytes}")

    def killed_write(obj, path) -> None:
        target = path + ".tmp" if temp_file_and_replace else path   # atomic_writes.TEMP_SUFFIX
        with _PausingFile(target, "wb", pause_at=kill_at_bytes) as f:
            torch.save(obj, f)                # pauses inside, until the SIGKILL
            if fsync_file:
                os.fsync(f.fileno())
        raise RuntimeError("the demo's writer was not killed")   # what the steps after would do is never reached

    return run_and_kill(killed_write, obj, path, kill_at_bytes=kill_at_bytes)


class _PausingFile(io.FileIO):
    """A file that, once ``pause_at`` bytes are written, puts exactly those on disk and waits to be killed."""

    def __init__(self, path, mode, pause_at: int):
        super().__init__(path, mode)
        self.pause_at, self.written = pause_at, 0

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        room = self.pause_at - self.written
        if len(data) < room:
            self.written += len(data)
            return super().write(data)
        super().write(data[:room])
        self.written = self.pause_at
        while True:  # the watcher sees the bytes and sends SIGKILL; a watcher that never does ends the trial
            time.sleep(1)
