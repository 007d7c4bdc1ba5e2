"""Checks for notebook 05: atomic checkpoint writes, proven under real crashes.

``torch.save(obj, path)`` opens ``path`` for writing at once: from that moment
until the last byte lands, the only checkpoint on the load path is a partial
file. The crash trials fork a writer (after torch is imported, so it starts in
milliseconds), let it save, and SIGKILL it, with every process it started, when the
directory shows that a given share of the checkpoint's bytes has been written; once
none of them is left, they try to load what is under the final name. The other
checks watch one call of the learner's ``atomic_save``: ``os.fsync`` /
``os.fdatasync`` / ``os.replace`` / ``os.rename`` are wrapped for the duration of
that call, recording what was synced, how many bytes it held at that moment, and the
order of events.

The forking, killing and recording happen in probes, where the learner's code lives
(in graded mode, the sandbox); they report how each writer ended, or the recorded
events. The checks make the scratch folders and the checkpoints themselves, then
read, load and judge what is on disk from outside.

Conventions the notebook states: checkpoints end in ``.pt``; a writer's temp file
ends in ``.tmp`` and lives next to its checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from .checking import expect, graded_check, load_written, observe, silence_this_process
from .grading.confine import CLONE_NEWPID, CLONE_NEWUSER, PR_SET_PDEATHSIG, exit_code, map_ids_to_self

CHECKPOINT_SUFFIX = ".pt"
TEMP_SUFFIX = ".tmp"


# ---------------------------------------------------------------------------------------------
# Checkpoints to write, and telling them apart after a crash

def make_checkpoint(step: int, layers: int = 8, layer_kib: int = 1024, seed: int = 0) -> dict:
    """A checkpoint-shaped dict: a step count and ``layers`` tensors of ``layer_kib`` KiB each.

    Many mid-sized tensors, not one big one: torch.save writes one record per
    tensor, so the file grows in steps that a crash can land between. Each call
    returns its own copies, so a save that changes what it is given changes nothing else.
    """
    return {"step": step, "model": {f"layer{i}.weight": t.clone()
                                    for i, t in enumerate(_checkpoint_tensors(step, layers, layer_kib, seed))}}


@functools.lru_cache(maxsize=16)
def _checkpoint_tensors(step: int, layers: int, layer_kib: int, seed: int) -> tuple:
    # Drawing 8 MiB of normals takes 10 ms, copying them 0.5 ms; the checks ask for the same ones often.
    g = torch.Generator().manual_seed(seed * 1000 + step)
    numel = layer_kib * 1024 // 4
    return tuple(torch.randn(numel, generator=g) for _ in range(layers))


def same_checkpoint(a, b) -> bool:
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("step") == b.get("step")):
        return False
    ma, mb = a.get("model", {}), b.get("model", {})
    return ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


def _first_sentence(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(path, old, new, known_bytes: dict | None = None) -> tuple[str, str]:
    """('old' | 'new' | 'unloadable' | 'missing' | 'other', detail) for the file at ``path``.

    ``known_bytes`` ({'old': bytes, 'new': bytes}) is a shortcut: a byte-identical file
    needs no torch.load.
    """
    if not os.path.exists(path):
        return "missing", "no file"
    if known_bytes:
        data = Path(path).read_bytes()
        for label, expected in known_bytes.items():
            if data == expected:
                return label, ""
    try:
        loaded = load_written(path)
    except Exception as exc:
        return "unloadable", _first_sentence(exc)
    if same_checkpoint(loaded, old):
        return "old", ""
    if same_checkpoint(loaded, new):
        return "new", ""
    return "other", "it loads, but holds neither the old nor the new checkpoint"


def save_directly(obj, path) -> None:
    """The trap: torch.save straight onto the final name."""
    torch.save(obj, path)


# ---------------------------------------------------------------------------------------------
# Crash trials: a forked writer saves, the parent SIGKILLs it (and all it started) part-way through the write

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


def _child_saves(save, obj, path) -> None:
    """Runs in the trial's writer: save, then leave at once without any cleanup of the parent's state."""
    code = 1
    try:
        silence_this_process()
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
    """The trial leader: runs the writer of trial i, ``save(obj, paths[i])``, for each index i read from
    ``commands``, and reports on ``events``: "ready INIT" once (INIT 0 without a PID namespace), then
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
                writer = os.fork()
                if writer == 0:
                    os.close(commands)
                    os.close(events)
                    os.setpgid(0, 0)
                    _child_saves(save, obj, paths[int(line)])
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


class _CrashTrials:
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
        """Trial i: 'killed', 'finished' (the save completed before the threshold was seen), 'failed' (it
        raised) or 'timeout'. When it returns, no process the save started is left."""
        directory = os.path.dirname(os.path.abspath(self.paths[i]))
        before = _snapshot(directory)
        try:
            os.write(self.commands, f"{i}\n".encode())
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
    """Fork a writer that runs ``save(obj, path)``; SIGKILL it, and every process it started, once
    ``kill_at_bytes`` are on disk.

    Returns 'killed', 'finished' (it completed before the threshold was seen),
    'failed' (the save raised) or 'timeout'. When it returns, no process the save started is left.
    """
    with _CrashTrials(save, obj, [path]) as trials:
        return trials.run(0, kill_at_bytes, timeout)


def probe_killed_saves(save, obj, kills: list, old: str) -> list[str]:
    """For each (path, kill_at_bytes): how a forked ``save(obj, path)`` ended, SIGKILLed (with every process
    it started) once ``kill_at_bytes`` were on disk (see run_and_kill), over a copy of the file ``old`` put
    at path first. What it left on disk is the check's to read.

    The copies are made here: in graded mode only ``old`` travels into the sandbox, not one per trial."""
    for path, _ in kills:
        shutil.copyfile(old, path)  # the good checkpoint the save replaces
    with _CrashTrials(save, obj, [path for path, _ in kills]) as trials:
        return [trials.run(i, kill_at_bytes) for i, (_, kill_at_bytes) in enumerate(kills)]


def crash_trials(save, trials: int = 10, seed: int = 0, layers: int = 8, workdir=None,
                 progress=None) -> list[dict]:
    """Run ``trials`` crash trials of ``save``; each replaces an old checkpoint by a new one.

    Trial i kills the writer when (i + 0.5) / trials of the new file's bytes are on
    disk, so the kills are spread over the whole write. Returns one record per
    trial: the kill point, how the child ended and what the final name then held.
    Only the writers run (and are killed) where ``save`` lives, all in one probe: the
    trial folders are made, and the files left in them loaded, here. ``progress(done,
    total, record)``, if given, sees each record as it is made.
    """
    if not hasattr(os, "fork"):
        raise RuntimeError("crash trials need os.fork and SIGKILL (Linux or macOS)")
    old, new = make_checkpoint(1, layers, seed=seed), make_checkpoint(2, layers, seed=seed)
    root = tempfile.mkdtemp(prefix="crash-trials-", dir=workdir)
    try:
        known = {}
        for label, ckpt in (("old", old), ("new", new)):
            torch.save(ckpt, os.path.join(root, f"{label}.pt"))
            known[label] = Path(root, f"{label}.pt").read_bytes()
        fractions = [(i + 0.5) / trials for i in range(trials)]
        kills = []
        for i, fraction in enumerate(fractions):
            path = os.path.join(root, f"trial{i:02d}", "checkpoint.pt")
            os.mkdir(os.path.dirname(path))
            kills.append((path, int(fraction * len(known["new"]))))
        endings = observe(probe_killed_saves, save, new, kills, os.path.join(root, "old.pt"))
        records = []
        for i, ((path, _), fraction, ended) in enumerate(zip(kills, fractions, endings)):
            outcome, detail = classify(path, old, new, known)
            leftovers = sorted(n for n in os.listdir(os.path.dirname(path)) if n != "checkpoint.pt")
            records.append({"fraction": fraction, "ended": ended, "outcome": outcome, "detail": detail,
                            "leftovers": leftovers})
            if progress:
                progress(i + 1, trials, records[-1])
        return records
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Watching one call from outside: what got synced, when, holding how many bytes

@contextlib.contextmanager
def recorded_file_operations():
    """Wrap os.fsync / os.fdatasync / os.replace / os.rename (and fcntl F_FULLFSYNC on macOS).

    Yields the list of events they record, in call order: for a sync, whether it was a
    directory, which file (device, inode) and its size at that moment; for a rename,
    source and target.
    """
    events: list[dict] = []
    patched = [(os, name) for name in ("fsync", "fdatasync", "replace", "rename") if hasattr(os, name)]
    if fcntl is not None and hasattr(fcntl, "F_FULLFSYNC"):
        patched.append((fcntl, "fcntl"))  # macOS: fsync does not flush the drive's cache, F_FULLFSYNC does
    originals = {(module, name): getattr(module, name) for module, name in patched}

    def record_sync(call: str, fd) -> None:
        st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
        events.append({"op": "fsync", "call": call, "is_dir": stat.S_ISDIR(st.st_mode),
                       "inode": (st.st_dev, st.st_ino), "size": st.st_size})

    def syncing(original, name):
        def wrapper(fd):
            record_sync(name, fd)
            return original(fd)
        return wrapper

    def full_syncing(original):
        def wrapper(fd, cmd, *args):
            if cmd == fcntl.F_FULLFSYNC:
                record_sync("F_FULLFSYNC", fd)
            return original(fd, cmd, *args)
        return wrapper

    def renaming(original, name):
        def wrapper(src, dst, *args, **kwargs):
            result = original(src, dst, *args, **kwargs)
            events.append({"op": "rename", "call": name, "src": os.path.abspath(os.fspath(src)),
                           "dst": os.path.abspath(os.fspath(dst))})
            return result
        return wrapper

    for (module, name), original in originals.items():
        if module is not os:
            setattr(module, name, full_syncing(original))
        elif name in ("fsync", "fdatasync"):
            setattr(module, name, syncing(original, name))
        else:
            setattr(module, name, renaming(original, name))
    try:
        yield events
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)


def _inode(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def _scratch_directory():
    """A checkpoint directory that is not tempfile.gettempdir() itself, removed afterwards."""
    root = tempfile.mkdtemp(prefix="atomic-check-")
    try:
        directory = os.path.join(root, "checkpoints")
        os.mkdir(directory)
        yield directory
    finally:
        shutil.rmtree(root, ignore_errors=True)


def probe_save(atomic_save, obj, path) -> list[dict]:
    """The file operations one call ``atomic_save(obj, path)`` made (see recorded_file_operations), then
    a last event ``{"op": "final", ...}``: the (device, inode) that path and its folder have afterwards,
    read where the save ran (in graded mode the check reads copies of its files, with inodes of their own)."""
    with recorded_file_operations() as events:
        atomic_save(obj, path)
    final = {"op": "final", "path": None, "directory": None}
    for key, where in (("path", path), ("directory", os.path.dirname(path))):
        try:
            final[key] = _inode(where)
        except OSError:
            pass
    return events + [final]


def _call_save(atomic_save, obj, path) -> list[dict]:
    """Call atomic_save(obj, path) where it lives; the file operations it made."""
    try:
        return observe(probe_save, atomic_save, obj, path)
    except NotImplementedError:
        raise  # an unanswered exercise: the grader reports it as "not answered yet"
    except Exception as exc:
        raise AssertionError(f"atomic_save raised {_first_sentence(exc)}") from None


@contextlib.contextmanager
def _watched_save(atomic_save, seed: int, layers: int):
    """Call atomic_save once over an existing checkpoint; yield (directory, path, recorded events)."""
    with _scratch_directory() as directory:
        path = os.path.join(directory, "model.pt")
        torch.save(make_checkpoint(1, layers, seed=seed), path)
        new = make_checkpoint(2, layers, seed=seed)
        events = _call_save(atomic_save, new, path)
        outcome, detail = classify(path, None, new)
        expect(outcome == "new", f"After atomic_save(obj, path) returned, path did not hold obj ({outcome}"
                                 f"{': ' + detail if detail else ''}).")
        yield directory, path, events


def _final(events) -> dict:
    """Where path and its folder ended up (see probe_save), as (device, inode) pairs."""
    final = events[-1] if events and events[-1].get("op") == "final" else {}
    return {key: tuple(final[key]) if final.get(key) is not None else None for key in ("path", "directory")}


def _final_rename(events, path):
    target = os.path.abspath(path)
    renames = [(i, e) for i, e in enumerate(events) if e["op"] == "rename" and e["dst"] == target]
    return renames[-1] if renames else (None, None)


_NO_RENAME = ("atomic_save never renamed a file onto path (no os.replace or os.rename with path as the "
              "target): it wrote the final name directly, so a crash mid-write leaves a partial checkpoint there.")


# ---------------------------------------------------------------------------------------------
# Checks: atomic_save

@graded_check("atomic_save: after a SIGKILL at any moment, the checkpoint loads (old or new)")
def check_atomic_save_crash(atomic_save, seed: int = 0, trials: int = 6, layers: int = 8) -> None:
    with _scratch_directory() as directory:  # first, one ordinary call must work
        path = os.path.join(directory, "model.pt")
        new = make_checkpoint(2, layers, seed=seed)
        _call_save(atomic_save, new, path)
        outcome, detail = classify(path, None, new)
        expect(outcome == "new", f"atomic_save(obj, path) ran without a crash, but path then held "
                                 f"{'nothing' if outcome == 'missing' else 'something else'} ({detail}).")
    records = crash_trials(atomic_save, trials=trials, seed=seed, layers=layers)
    bad = [r for r in records if r["outcome"] not in ("old", "new")]
    if bad:
        where = ", ".join(f"{r['fraction']:.0%}" for r in bad)
        raise AssertionError(
            f"In {len(bad)} of {trials} trials, a SIGKILL during atomic_save left path {bad[0]['outcome']} "
            f"(killed after {where} of the bytes were written; torch.load said: {bad[0]['detail']}). "
            f"While the new checkpoint is being written, the final name must still point at the old one.")
    failed = [r for r in records if r["ended"] == "failed"]
    expect(not failed, f"atomic_save raised an error in {len(failed)} of {trials} trial processes.")


@graded_check("atomic_save: the temp file is a *.tmp file in the checkpoint's own directory")
def check_atomic_save_temp_location(atomic_save, seed: int = 0, layers: int = 2) -> None:
    with _watched_save(atomic_save, seed, layers) as (directory, path, events):
        _, rename = _final_rename(events, path)
        expect(rename is not None, _NO_RENAME)
        src_dir = os.path.dirname(rename["src"])
        expect(src_dir == os.path.abspath(directory),
               f"atomic_save wrote its temp file in {src_dir}, not in the checkpoint's directory {directory}. "
               f"A rename is atomic only within one filesystem, and {src_dir} can be another one (a tmpfs, "
               f"another disk): os.replace then fails, or a copying move leaves a partial file. Put the temp "
               f"file next to its target.")
        expect(rename["src"].endswith(TEMP_SUFFIX),
               f"atomic_save's temp file is named {os.path.basename(rename['src'])!r}; name it with the "
               f"suffix {TEMP_SUFFIX!r} so load_latest_checkpoint can recognise what a crashed writer left.")


@graded_check("atomic_save: the temp file is fsynced after its last byte, before the rename")
def check_atomic_save_fsync_file(atomic_save, seed: int = 0, layers: int = 2) -> None:
    with _watched_save(atomic_save, seed, layers) as (directory, path, events):
        final_inode, final_size = _final(events)["path"], os.path.getsize(path)
        syncs = [(i, e) for i, e in enumerate(events)
                 if e["op"] == "fsync" and not e["is_dir"] and e["inode"] == final_inode]
        expect(syncs, "atomic_save never fsynced the file that ends up under path. Without os.fsync the "
                      "bytes may sit only in the OS page cache: after a power loss the renamed file can be "
                      "empty or partial even though the rename survived.")
        rename_index, _ = _final_rename(events, path)
        complete = [(i, e) for i, e in syncs if e["size"] == final_size]
        if not complete:
            sizes = ", ".join(str(e["size"]) for _, e in syncs)
            raise AssertionError(
                f"os.fsync ran when the file held {sizes} of its {final_size} bytes: bytes written after an "
                f"fsync are not covered by it. Write everything (and flush Python's buffer) first, then fsync.")
        if rename_index is not None:
            expect(any(i < rename_index for i, _ in complete),
                   "The file was fsynced only after the rename: for a moment the final name pointed at data "
                   "that was not yet durable. fsync the temp file before os.replace.")


@graded_check("atomic_save: the directory is fsynced after the rename")
def check_atomic_save_fsync_directory(atomic_save, seed: int = 0, layers: int = 2) -> None:
    with _watched_save(atomic_save, seed, layers) as (directory, path, events):
        rename_index, _ = _final_rename(events, path)
        expect(rename_index is not None, _NO_RENAME)
        dir_inode = _final(events)["directory"]
        dir_syncs = [i for i, e in enumerate(events) if e["op"] == "fsync" and e["is_dir"] and e["inode"] == dir_inode]
        expect(dir_syncs, "atomic_save never fsynced the checkpoint's directory. The rename is a change to the "
                          "directory, and it is durable only once the directory itself is synced: after a power "
                          "loss the name can still point at the old file, or at nothing.")
        expect(any(i > rename_index for i in dir_syncs),
               "atomic_save fsynced the directory before the rename, so the rename itself was not made durable. "
               "Sync the directory after os.replace.")


class _FailsToSerialize:
    """Raises while torch.save is pickling: a serialization error halfway through a save."""

    def __reduce__(self):
        raise RuntimeError("this object cannot be serialized (raised on purpose by the check)")


def probe_failing_save(atomic_save, obj, path, tempdir) -> str | None:
    """Call atomic_save on ``obj`` plus a value torch.save fails on: the type of what it raised, or None.

    tempfile's default folder is ``tempdir`` meanwhile, so that a temp file made with
    tempfile's defaults lands where the check looks. The failing value is added here:
    in graded mode it could not even be pickled into the sandbox.
    """
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = tempdir
    try:
        atomic_save(dict(obj, extra=_FailsToSerialize()), path)
    except Exception as exc:
        return type(exc).__name__
    finally:
        tempfile.tempdir = saved_tempdir
    return None


@graded_check("atomic_save: an error while saving leaves the old checkpoint and no temp file")
def check_atomic_save_cleanup(atomic_save, seed: int = 0, layers: int = 2) -> None:
    with _scratch_directory() as directory:
        private_tmp = os.path.join(os.path.dirname(directory), "system-tmp")
        os.mkdir(private_tmp)
        path = os.path.join(directory, "model.pt")
        old = make_checkpoint(1, layers, seed=seed)
        _call_save(atomic_save, old, path)  # an ordinary save first: doing nothing must not pass
        outcome, detail = classify(path, old, None)
        expect(outcome == "old", f"atomic_save(obj, path) returned, but path did not hold obj ({outcome}"
                                 f"{': ' + detail if detail else ''}).")
        raised = observe(probe_failing_save, atomic_save, make_checkpoint(2, layers, seed=seed), path, private_tmp)
        outcome, detail = classify(path, old, None)
        expect(outcome == "old",
               f"After torch.save failed inside atomic_save, path was {outcome} ({detail or 'it changed'}): the "
               f"old checkpoint must stay untouched until the new one is complete.")
        leftovers = sorted(n for n in os.listdir(directory) if n != "model.pt") + sorted(os.listdir(private_tmp))
        expect(not leftovers,
               f"After torch.save failed inside atomic_save, the temp file was left behind ({', '.join(leftovers)}). "
               f"Every failed save would leave another one: remove the temp file when anything goes wrong.")
        expect(raised is not None,
               "torch.save failed inside atomic_save, but atomic_save returned normally: the caller believes "
               "the checkpoint was written. Clean up, then let the exception propagate.")


# ---------------------------------------------------------------------------------------------
# Checks: load_latest_checkpoint

def _write_checkpoints(directory: str, steps: list[int], seed: int, start_time: float = 1_700_000_000.0) -> dict:
    """step_<n>.pt for each step, with modification times in the order given (later = newer)."""
    written = {}
    for order, step in enumerate(steps):
        path = os.path.join(directory, f"step_{step}.pt")
        ckpt = make_checkpoint(step, layers=2, layer_kib=4, seed=seed)
        torch.save(ckpt, path)
        os.utime(path, (start_time + 60 * order, start_time + 60 * order))
        written[path] = ckpt
    return written


def _call_loader(load_latest_checkpoint, directory, hint: str = ""):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = load_latest_checkpoint(directory)
        except NotImplementedError:
            raise
        except Exception as exc:
            raise AssertionError(f"load_latest_checkpoint raised {_first_sentence(exc)}. {hint}".strip()) from None
    return result, [str(w.message) for w in caught]


def _expect_result(result, expected_path, expected_obj, situation: str) -> None:
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{situation}: load_latest_checkpoint should return a (path, checkpoint) tuple, but it returned "
           f"{type(result).__name__}{'' if result is not None else ' (None)'}.")
    path, obj = result
    expect(os.path.exists(os.fspath(path)) and os.path.samefile(os.fspath(path), expected_path),
           f"{situation}: it returned {os.path.basename(os.fspath(path))!r}, but the newest loadable "
           f"checkpoint is {os.path.basename(expected_path)!r}.")
    expect(same_checkpoint(obj, expected_obj),
           f"{situation}: the returned checkpoint is not what {os.path.basename(expected_path)!r} holds.")


@graded_check("load_latest_checkpoint: returns the newest checkpoint, or None when there is none")
def check_load_latest_checkpoint_newest(load_latest_checkpoint, seed: int = 0, steps: tuple = (8, 9, 10)) -> None:
    with _scratch_directory() as directory:
        result, _ = _call_loader(load_latest_checkpoint, directory)
        expect(result is None, f"In an empty directory, load_latest_checkpoint returned {result!r} instead of None.")
        written = _write_checkpoints(directory, list(steps), seed)
        newest = list(written)[-1]
        result, _ = _call_loader(load_latest_checkpoint, directory)
        names = [os.path.basename(p) for p in written]
        returned = os.path.basename(os.fspath(result[0])) if isinstance(result, tuple) and result else None
        if returned == max(names) != names[-1]:
            raise AssertionError(
                f"load_latest_checkpoint returned {returned!r}, the last name in alphabetical order, but "
                f"{names[-1]!r} was written last ({names[-1]!r} sorts before {max(names)!r}). Compare "
                f"modification times (or step numbers), not names.")
        _expect_result(result, newest, written[newest], f"With checkpoints {', '.join(names)}")


@graded_check("load_latest_checkpoint: skips unreadable checkpoints with a warning")
def check_load_latest_checkpoint_unreadable(load_latest_checkpoint, seed: int = 0, steps: tuple = (3, 4)) -> None:
    with _scratch_directory() as directory:
        written = _write_checkpoints(directory, list(steps), seed)
        good = list(written)[-1]
        later = max(os.path.getmtime(p) for p in written) + 60
        truncated = os.path.join(directory, f"step_{max(steps) + 1}.pt")  # a crashed direct write
        data = open(good, "rb").read()
        with open(truncated, "wb") as f:
            f.write(data[: len(data) // 2])
        empty = os.path.join(directory, f"step_{max(steps) + 2}.pt")  # killed right after opening
        open(empty, "wb").close()
        os.utime(truncated, (later, later))
        os.utime(empty, (later + 60, later + 60))
        result, messages = _call_loader(
            load_latest_checkpoint, directory,
            "A damaged checkpoint can make torch.load raise more than one kind of exception (an empty file "
            "raises EOFError, a truncated one RuntimeError): skipping a bad file must not depend on which.")
        _expect_result(result, good, written[good],
                       "The two newest files are a truncated and an empty checkpoint (crashed writes)")
        for skipped in (truncated, empty):
            name = os.path.basename(skipped)
            expect(any(name in m for m in messages),
                   f"load_latest_checkpoint skipped {name!r} without a warning naming it"
                   f"{' (warnings seen: ' + '; '.join(messages) + ')' if messages else ''}. A silently "
                   f"ignored corrupt checkpoint hides a problem: use warnings.warn with the file name.")
        for path in written:
            os.remove(path)
        result, _ = _call_loader(load_latest_checkpoint, directory)
        expect(result is None, f"When every checkpoint is unreadable, load_latest_checkpoint should return None, "
                               f"but it returned {result!r}.")


@graded_check("load_latest_checkpoint: ignores and removes temp files left by crashed writers")
def check_load_latest_checkpoint_temp_files(load_latest_checkpoint, seed: int = 0, steps: tuple = (5,)) -> None:
    with _scratch_directory() as directory:
        written = _write_checkpoints(directory, list(steps), seed)
        good = list(written)[-1]
        later = os.path.getmtime(good) + 60
        # A writer killed after its temp file was complete but before the rename: it loads, yet was never committed.
        complete_temp = os.path.join(directory, f"step_{max(steps) + 1}.pt{TEMP_SUFFIX}")
        torch.save(make_checkpoint(max(steps) + 1, layers=2, layer_kib=4, seed=seed), complete_temp)
        partial_temp = os.path.join(directory, f"tmpk3x9q{TEMP_SUFFIX}")
        with open(partial_temp, "wb") as f:
            f.write(b"PK\x03\x04 half a checkpoint")
        notes = os.path.join(directory, "notes.txt")
        Path(notes).write_text("not a checkpoint")
        for i, p in enumerate((complete_temp, partial_temp, notes)):
            os.utime(p, (later + 60 * i, later + 60 * i))
        result, _ = _call_loader(load_latest_checkpoint, directory)
        if isinstance(result, tuple) and len(result) == 2 and os.fspath(result[0]).endswith(TEMP_SUFFIX):
            raise AssertionError(
                f"load_latest_checkpoint returned the temp file {os.path.basename(os.fspath(result[0]))!r}. A "
                f"temp file was never renamed into place, so it was never a committed checkpoint, even when it "
                f"happens to load. Only *{CHECKPOINT_SUFFIX} files are checkpoints.")
        _expect_result(result, good, written[good], "Next to temp files left by crashed writers")
        left = sorted(n for n in os.listdir(directory) if n.endswith(TEMP_SUFFIX))
        expect(not left, f"load_latest_checkpoint left the temp files {', '.join(left)} in place: crashed writers' "
                         f"leftovers pile up with every crash. Remove them.")
        expect(os.path.exists(notes), "load_latest_checkpoint removed notes.txt, which is not a temp file.")
