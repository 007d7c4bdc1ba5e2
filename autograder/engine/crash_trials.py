"""Crash trials: a forked writer runs ``save(obj, path)``, and is killed, with every process it started,
part-way through the write, once it has written that many bytes into a file.

The kill lands at exactly that byte, whatever the machine's load: the writer runs under a file-size limit
(RLIMIT_FSIZE) of that many bytes, so the kernel stops its write there and ends it with SIGXFSZ, which it
cannot clean up after any more than after SIGKILL. Watching the file's size and killing afterwards would
race the writer: on a busy machine a small file is finished before the watcher reacts.

Notebook 05's checks (through their probe) and its demos run them; the writers run where ``save`` lives.
``CrashTrials`` runs several trials from one trial leader; ``run_and_kill`` runs one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import warnings

from ..checking import silence_this_process
from ..grading.confine import CLONE_NEWPID, CLONE_NEWUSER, PR_SET_PDEATHSIG, exit_code, map_ids_to_self


def _bytes_written(directory: str, before: dict) -> int:
    """Largest size among files in ``directory`` that are new or changed since ``before``."""
    largest = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # renamed or removed while we looked
                if before.get(entry.name) != (st.st_ino, st.st_size):
                    largest = max(largest, st.st_size)
    except FileNotFoundError:
        pass
    return largest


def _snapshot(directory: str) -> dict:
    return {e.name: (e.stat().st_ino, e.stat().st_size) for e in os.scandir(directory)}


def _stop_at_byte(kill_at_bytes: int) -> None:
    """Make this process (and every process it starts) die the moment it would write past ``kill_at_bytes``
    of any file: the kernel writes up to the limit, then ends the process with SIGXFSZ. No core dump."""
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    limit = kill_at_bytes if hard == resource.RLIM_INFINITY else min(kill_at_bytes, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # the hard limit too: no child raises it
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)


def _child_saves(save, obj, path, kill_at_bytes: int | None) -> None:
    """Runs in the trial's writer: save, then leave at once without any cleanup of the parent's state."""
    code = 1
    try:
        silence_this_process()
        if kill_at_bytes is not None:
            _stop_at_byte(kill_at_bytes)
        save(obj, path)
        code = 0
    except BaseException:
        pass
    finally:
        os._exit(code)


# Every process a trial's save starts must end with the trial: a writer that forks (and lets a grandchild go
# on writing the final name after the SIGKILL, or after atomic_save returned) would otherwise finish its
# file before the check reads it. So the writers run in a PID namespace of their own, made by a trial leader
# (forked once for all the trials of a call) whose first child is the namespace's PID 1: no process leaves
# its PID namespace, and on SIGUSR1 that init SIGKILLs every process in it with a single kill(-1), then
# waits until all of them are gone. A trial's writer is the leader's next child, PID 2 or later: an ordinary
# process (PID 1 ignores the signals it has no handler for) and the leader of a process group. A kill is
# SIGKILL to that group and SIGUSR1 to the init at the same moment: not SIGKILL to the init, which would
# take the others only once its own memory had been torn down, milliseconds in which they went on writing.
# Where no PID namespace can be made (macOS; kernels or distributions without unprivileged user namespaces)
# only the writer's process group is killed, and waited for until /proc shows none of it running. That
# fallback is weaker: a process that calls setsid() or setpgid() leaves the group, and escapes.
# What the trial leader tries, in order: a PID namespace alone (where it is privileged in its user
# namespace, as in the sandbox), else with a user namespace of its own. Empty: the process-group fallback.
PID_NAMESPACE_FLAGS = (CLONE_NEWPID, CLONE_NEWUSER | CLONE_NEWPID)


def _own_pid_namespace():
    """Make this (single-threaded, freshly forked) process's children members of a new PID namespace, the
    first of them its PID 1. With a new user namespace too, it maps this user to itself.

    Returns libc (through ctypes) when it worked, else None."""
    if not sys.platform.startswith("linux") or not PID_NAMESPACE_FLAGS:
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None
    uid, gid = os.getuid(), os.getgid()
    for flags in PID_NAMESPACE_FLAGS:
        if libc.unshare(flags) == 0:
            break
    else:
        return None
    if flags & CLONE_NEWUSER:
        with contextlib.suppress(OSError):  # best effort: unmapped, the writer still acts as this user, as nobody
            map_ids_to_self(uid, gid)
    return libc


def _namespace_init(libc, done: int) -> None:
    """PID 1 of the trials' PID namespace. At each SIGUSR1: SIGKILL every other process in the namespace,
    reap the orphans among them, and write one byte to ``done`` once none is left, zombies included.
    No process in the namespace can signal it; it dies with the trial leader."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        while True:
            signal.sigwait({signal.SIGUSR1})  # blocked since before this process existed: none is lost
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signal.SIGKILL)  # every process of the namespace but this one, in one call
                with contextlib.suppress(ChildProcessError):
                    while os.waitpid(-1, os.WNOHANG)[0]:
                        pass
                try:
                    os.kill(-1, 0)  # ProcessLookupError: no process is left (the leader reaps its writers)
                except ProcessLookupError:
                    break
                time.sleep(0.0002)
            os.write(done, b".")
    except BaseException:
        pass
    finally:
        os._exit(0)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` is still running (zombies, which can write nothing, do not count)."""
    try:
        proc_is_ours = os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        proc_is_ours = False
    if not proc_is_ours:  # no /proc, or one of another PID namespace: ask the kernel
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while we looked
        if int(fields[2]) == group and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _end_group(group: int) -> None:
    """The fallback's end of a trial: SIGKILL the writer's process group until none of it is running."""
    deadline = time.monotonic() + 10.0
    while True:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)  # again each round: a process forked while the last one went round
        if not _group_alive(group) or time.monotonic() > deadline:
            return
        time.sleep(0.0002)


def _trial_leader(save, obj, paths: list, commands: int, events: int, done: int) -> None:
    """The trial leader: runs the writer of trial i, ``save(obj, paths[i])``, for each line "i KILL_AT_BYTES"
    (or "i -") read from ``commands``, and reports on ``events``: "ready INIT" once (INIT 0 without a PID namespace), then
    "started WRITER" and "exited CODE" for each trial, the latter once its writer has been reaped (and,
    without a namespace, its process group is gone)."""
    code = 1
    try:
        libc = _own_pid_namespace()
        init = 0
        if libc is not None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            init = os.fork()
            if init == 0:
                os.close(commands)
                os.close(events)
                _namespace_init(libc, done)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        os.close(done)
        os.write(events, f"ready {init}\n".encode())
        with os.fdopen(commands, "rb") as requests:
            for line in requests:
                index, kill_at_bytes = line.split()
                writer = os.fork()
                if writer == 0:
                    os.close(commands)
                    os.close(events)
                    os.setpgid(0, 0)
                    _child_saves(save, obj, paths[int(index)], None if kill_at_bytes == b"-" else int(kill_at_bytes))
                with contextlib.suppress(OSError):
                    os.setpgid(writer, writer)  # both sides: the group exists before the parent can kill it
                os.write(events, f"started {writer}\n".encode())
                status = os.waitpid(writer, 0)[1]
                if not init:
                    _end_group(writer)
                os.write(events, f"exited {exit_code(status)}\n".encode())
        code = 0
    except BaseException:
        pass
    finally:
        if init:  # the namespace is empty between trials: its init ends alone
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
                os.waitpid(init, 0)
        os._exit(code)


class CrashTrials:
    """Crash trials of ``save(obj, path)`` for each of ``paths``, run by one trial leader (forked on entry,
    ended on exit); ``run(i, kill_at_bytes)`` runs trial i."""

    def __init__(self, save, obj, paths: list):
        self.save, self.obj, self.paths = save, obj, list(paths)

    def __enter__(self):
        commands_r, self.commands = os.pipe()
        self.events, events_w = os.pipe()
        self.done, done_w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork in a threaded process
            self.leader = os.fork()
        if self.leader == 0:
            for fd in (self.commands, self.events, self.done):
                os.close(fd)
            _trial_leader(self.save, self.obj, self.paths, commands_r, events_w, done_w)
        for fd in (commands_r, events_w, done_w):
            os.close(fd)
        self._buffer, self.writer = b"", None
        told = self._event()
        self.init = int(told[1]) if told and told[0] == "ready" else 0
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # interrupted mid-trial: end the writer, and the leader (its init dies with it)
            self._kill()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, signal.SIGKILL)
        os.close(self.commands)  # the leader ends once it reads no more trials
        os.waitpid(self.leader, 0)
        os.close(self.events)
        os.close(self.done)

    def _event(self, wait: bool = True) -> list[str] | None:
        """The leader's next report, split; None when there is none yet (and not ``wait``); [] at its end."""
        while b"\n" not in self._buffer:
            os.set_blocking(self.events, wait)
            try:
                chunk = os.read(self.events, 4096)
            except BlockingIOError:
                return None
            if not chunk:
                return []
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().split()

    def run(self, i: int, kill_at_bytes: int | None, timeout: float = 20.0) -> str:
        """Trial i: 'killed' (at kill_at_bytes of a file), 'finished' (the save completed without writing that
        many bytes into any file), 'failed' (it raised) or 'timeout'. When it returns, no process the save started is left."""
        directory = os.path.dirname(os.path.abspath(self.paths[i]))
        before = _snapshot(directory)
        try:
            os.write(self.commands, f"{i} {'-' if kill_at_bytes is None else int(kill_at_bytes)}\n".encode())
        except BrokenPipeError:  # the leader is gone
            return "failed"
        told = self._event()
        if not told or told[0] != "started":
            return "failed"
        self.writer, ending = int(told[1]), None
        deadline = time.monotonic() + timeout
        while True:
            told = self._event(wait=ending is not None)
            if told is not None:
                break  # the writer was reaped ("exited CODE"), or the leader ended ([])
            if kill_at_bytes is not None and _bytes_written(directory, before) >= kill_at_bytes:
                ending = "killed"
            elif time.monotonic() > deadline:
                ending = "timeout"
            else:
                continue
            self._kill()
        if ending is None:
            self._kill(writer=False)  # what an ordinary save left running dies too
            if kill_at_bytes is not None and told == ["exited", str(128 + signal.SIGXFSZ)]:
                ending = "killed"  # its file-size limit stopped it at kill_at_bytes
        if self.init:
            os.read(self.done, 1)  # the namespace's init found it empty
        self.writer = None
        if ending:
            return ending
        return "finished" if told == ["exited", "0"] else "failed"

    def _kill(self, writer: bool = True) -> None:
        """SIGKILL the writer's process group and, through the namespace's init (it reports on ``done``),
        every process in the namespace."""
        if writer and self.writer:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.writer, signal.SIGKILL)
        if self.init:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init, signal.SIGUSR1)


def run_and_kill(save, obj, path, kill_at_bytes: int | None, timeout: float = 20.0) -> str:
    """Fork a writer that runs ``save(obj, path)``; kill it, and every process it started, the moment it has
    written ``kill_at_bytes`` into a file (none: let it finish).

    Returns 'killed', 'finished' (it completed without writing that many bytes into any file),
    'failed' (the save raised) or 'timeout'. When it returns, no process the save started is left.
    """
    with CrashTrials(save, obj, [path]) as trials:
        return trials.run(0, kill_at_bytes, timeout)
