"""The judge's watch over one sandbox, from a thread of the grading process.

Two jobs:

- **Its output.** Whatever the sandbox's processes print goes into a pipe that this thread drains into a
  bounded tail kept in memory (the last 64 KiB): a submission that prints without end fills no disk, and
  the tail says why a sandbox that failed to start failed.
- **Its memory, where no memory cgroup bounds it** (an ordinary user without a delegated cgroup, or
  ``WORKBOOK_SANDBOX_WITHOUT=cgroups``). Twenty times a second it adds up what its processes hold of every
  kind a process can hold: private anonymous memory, shared memory (``RssShmem``) and page tables
  (``VmPTE``), from ``/proc/<pid>/status`` (0.06 to 0.15 ms a process on a loaded 2-core machine), plus,
  for each shared anonymous object they map, the most it may hold (``seccomp.SHARED_ANONYMOUS_BYTES``):
  such an object keeps the pages it was given after all but one page of it is unmapped, where no count
  of a process shows them. Their maps are read once a second, and at the next look whenever the
  machine's shared memory moves by 64 MiB (about 1 ms a process). Only when the sum passes the bound
  does it read each process's proportional share (``smaps_rollup`` ``Pss_Anon`` and ``Pss_Shmem``: pages
  shared by forked processes count once), and past the bound it kills the sandbox and says so.
  What no process's count shows is bounded elsewhere: files on the sandbox's own size-bounded tmpfs
  (``/dev/shm`` too; a mapped one counts there and here, so twice, never less); memory that belongs to
  no process (SysV shared memory, POSIX message queues, memfd, pages pinned by ``vmsplice``) is refused
  by its system-call filter (``seccomp``); kernel memory in its pipes and sockets is bounded only by its
  open-files and process limits (docs/grading.md gives the numbers). The sandbox's processes are also
  the kernel's first choice when the machine runs out of memory (``oom_score_adj`` 1000), never the
  grader. Between two looks a process can fault in what two cores manage in 50 ms (a few hundred MB):
  the bound is that much softer than a cgroup's.
"""

from __future__ import annotations

import collections
import os
import select
import threading

from autograder.grading.seccomp import SHARED_ANONYMOUS_BYTES

TAIL_BYTES = 64 << 10
INTERVAL = 0.05
SCAN_EVERY = 20                      # looks between two reads of its processes' maps (1 s) ...
SCAN_WHEN_SHARED_MOVES = 64 << 20    # ... or sooner, when the machine's shared memory moved by this much


class Watchdog(threading.Thread):
    def __init__(self, log_fd: int, kill, memory_bytes: int | None = None):
        super().__init__(daemon=True, name="workbook-sandbox-watchdog")
        self.log_fd = log_fd
        self.kill = kill                       # kill(reason): end the whole sandbox, the reason for its report
        self.memory_bytes = memory_bytes       # None: a memory cgroup bounds it, nothing to watch
        self.root: int | None = None           # the sandbox's first process, once started
        self.peak = 0                          # the most memory its processes held together at one look
        self._objects = 0                      # shared anonymous objects its processes map, at the last scan
        self._scanned_at = (-SCAN_EVERY, 0)    # (look, the machine's shared memory) at that scan
        self._looks = 0
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
        self._looks += 1
        shared = _machine_shared_memory()
        look, seen = self._scanned_at
        if self._looks - look >= SCAN_EVERY or abs(shared - seen) >= SCAN_WHEN_SHARED_MOVES:
            self._objects = len(_shared_anonymous_objects(pids))
            self._scanned_at = (self._looks, shared)
        hidden = self._objects * SHARED_ANONYMOUS_BYTES      # what such objects may hold, unmapped or not
        held = sum(_resident(pid) for pid in pids) + hidden
        if held > self.memory_bytes:                 # maybe only counted twice: pages shared since a fork
            held = sum(_proportional(pid) for pid in pids) + hidden
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


_RESIDENT = ("RssAnon:", "RssShmem:", "VmPTE:")


def _machine_shared_memory() -> int:
    """The machine's shared memory (``Shmem`` in ``/proc/meminfo``, KiB): what moves when any sandbox makes some."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("Shmem:"))
    except (OSError, ValueError, StopIteration):
        return 0


def _shared_anonymous_objects(pids: list[int]) -> set[int]:
    """The shared anonymous objects (``MAP_SHARED|MAP_ANONYMOUS``, shown as ``/dev/zero (deleted)``) the
    processes map, by inode: one a forked child shares with its parent counts once. Such an object keeps
    the pages it was given after all but one page of it is unmapped, where no count of the process shows
    them; the filter bounds each to ``SHARED_ANONYMOUS_BYTES``. About 1 ms a process that imported torch."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    if line.endswith(b" /dev/zero (deleted)\n"):
                        found.add(int(line.split()[4]))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _resident(pid: int) -> int:
    """Its private and shared anonymous memory and its page tables (shared pages count in each process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith(_RESIDENT)) * 1024
    except (OSError, ValueError, IndexError):
        return 0


def _proportional(pid: int) -> int:
    """The same, with each shared page split between the processes that map it."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            shares = sum(int(line.split()[1]) for line in f if line.startswith(("Pss_Anon:", "Pss_Shmem:")))
        with open(f"/proc/{pid}/status") as f:
            tables = sum(int(line.split()[1]) for line in f if line.startswith("VmPTE:"))
        return (shares + tables) * 1024
    except (OSError, ValueError, IndexError):
        return _resident(pid)
