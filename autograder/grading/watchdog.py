"""The judge's watch over one sandbox, from a thread of the grading process.

Two jobs:

- **Its output.** Whatever the sandbox's processes print goes into a pipe that this thread drains into a
  bounded tail kept in memory (the last 64 KiB): a submission that prints without end fills no disk, and
  the tail says why a sandbox that failed to start failed.
- **Its memory, where no memory cgroup bounds it** (an ordinary user without a delegated cgroup). Twenty
  times a second it adds up the anonymous memory its processes hold (``/proc/<pid>/statm``, a few
  microseconds a process); only when that passes the bound does it read each process's proportional
  share (``smaps_rollup``: pages shared by forked processes count once), and past the bound it kills the
  sandbox and says so. Files the sandbox writes live on its own size-bounded tmpfs, outside this count;
  SysV shared memory and memfd, which no process's count would show, are refused by its system-call
  filter (``seccomp``). The sandbox's processes are also the kernel's first choice when the machine runs
  out of memory (``oom_score_adj`` 1000), never the grader. Between two looks a process can fault in
  what two cores manage in 50 ms (a few hundred MB): the bound is that much softer than a cgroup's.
"""

from __future__ import annotations

import collections
import os
import select
import threading

PAGE = os.sysconf("SC_PAGE_SIZE")
TAIL_BYTES = 64 << 10
INTERVAL = 0.05


class Watchdog(threading.Thread):
    def __init__(self, log_fd: int, kill, memory_bytes: int | None = None):
        super().__init__(daemon=True, name="workbook-sandbox-watchdog")
        self.log_fd = log_fd
        self.kill = kill                       # kill(reason): end the whole sandbox, the reason for its report
        self.memory_bytes = memory_bytes       # None: a memory cgroup bounds it, nothing to watch
        self.root: int | None = None           # the sandbox's first process, once started
        self.peak = 0                          # the most memory its processes held together at one look
        self._tail = collections.deque()
        self._tail_size = 0
        self._halt = threading.Event()

    def tail(self) -> str:
        return b"".join(self._tail).decode(errors="replace")

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                if select.select([self.log_fd], [], [], INTERVAL)[0]:
                    chunk = os.read(self.log_fd, 1 << 16)
                    if not chunk:          # every writer is gone: only the memory is left to watch
                        self._watch_memory_only()
                        return
                    self._keep(chunk)
                if self.memory_bytes is not None and self.root is not None:
                    self._look()
        except OSError:
            pass
        finally:
            os.close(self.log_fd)

    def _watch_memory_only(self) -> None:
        while not self._halt.wait(INTERVAL):
            if self.memory_bytes is None or self.root is None:
                return
            self._look()

    def _keep(self, chunk: bytes) -> None:
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())

    def _look(self) -> None:
        pids = tree(self.root)
        held = sum(_anonymous(pid) for pid in pids)
        if held > self.memory_bytes:                 # maybe only counted twice: pages shared since a fork
            held = sum(_proportional(pid) for pid in pids)
        self.peak = max(self.peak, held)
        if held > self.memory_bytes:
            self.kill(f"its processes held {held / 2**30:.1f} GiB of memory together, more than the "
                      f"{self.memory_bytes / 2**30:.1f} GiB a submission may use")
            self.memory_bytes = None


def tree(root: int) -> list[int]:
    """``root`` and every process below it (orphans are adopted by the sandbox's init, so stay below)."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _anonymous(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            fields = f.read().split()
        return max(int(fields[1]) - int(fields[2]), 0) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _proportional(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _anonymous(pid)
