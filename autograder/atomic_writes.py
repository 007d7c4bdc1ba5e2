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

``path`` must hold the old or the new checkpoint at every moment, not only where a
byte count lands a kill: the watched call also records, after each of those calls
and of ``os.remove`` / ``os.unlink`` / ``os.link`` / ``os.symlink``, what the file
at ``path`` holds (a digest, or nothing), and whether it is still the old file,
written over in place. Removing ``path`` before renaming the new file onto it, moving
the old one away first, or copying the temp file onto ``path`` all show there.

Every call of the learner's ``atomic_save`` looks alike, so that none can tell which
check it is in: ``path`` is ``<scratch>/checkpoints/model.pt``, and tempfile's default
folder is ``<scratch>/system-tmp`` during the call.

Conventions the notebook states: checkpoints end in ``.pt`` (``load_latest_checkpoint``'s
are named ``step_<n>.pt``, n the step they record as ``checkpoint["step"]``, and the
newest is the one with the largest step); a writer's temp file ends in ``.tmp`` and
lives next to its checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path

import torch

from .checking import expect, graded_check, load_written, observe, returned_path
from .helpers import changed_global_rngs, describe_rng_change, recording_global_rngs
from .demos.crash_demo import demo_crash, save_directly  # noqa: F401  (the notebook imports them from here)
from .engine.crash_trials import CrashTrials, run_and_kill  # noqa: F401  (run_and_kill: the notebook's too)
from .engine.file_operations import content_digest, recorded_file_operations

CHECKPOINT_SUFFIX = ".pt"
TEMP_SUFFIX = ".tmp"
CHECKPOINT_NAME = "model.pt"       # every call of atomic_save the checks make writes <scratch>/checkpoints/model.pt
PRIVATE_TMP = "system-tmp"         # tempfile's default folder meanwhile: <scratch>/system-tmp


# ---------------------------------------------------------------------------------------------
# Checkpoints to write, and telling them apart after a crash

def make_checkpoint(step: int, layers: int = 8, layer_kib: int = 1024, seed: int = 0) -> dict:
    """A checkpoint-shaped dict: a step count and ``layers`` tensors of ``layer_kib`` KiB each.

    Many mid-sized tensors, not one big one: torch.save writes one record per
    tensor, so the file grows in steps that a crash can land between. Each call
    returns its own copies, so a save that changes what it is given changes nothing else.
    """
    ckpt = {"step": step, "model": {f"layer{i}.weight": t.clone()
                                    for i, t in enumerate(_checkpoint_tensors(step, layers, layer_kib, seed))}}
    first = next(iter(ckpt["model"].values()))
    _DRAWN[id(first)] = (step, layers, layer_kib, seed)
    weakref.finalize(first, _DRAWN.pop, id(first), None)
    return ckpt


# make_checkpoint's checkpoints -> the numbers that drew them (keyed by their first tensor, which a dict
# cannot be): what classify is given is told by those, so it compares no other checkpoints than these.
_DRAWN: dict[int, tuple] = {}


def _drawn_of(checkpoint) -> tuple | None:
    """(step, layers, layer_kib, seed) of a checkpoint make_checkpoint made, given as itself or as those numbers."""
    if checkpoint is None or isinstance(checkpoint, tuple):
        return checkpoint
    first = next(iter(checkpoint.get("model", {}).values()), None) if isinstance(checkpoint, dict) else None
    drawn = _DRAWN.get(id(first)) if torch.is_tensor(first) else None
    if drawn is None:
        raise TypeError("classify tells apart checkpoints that make_checkpoint made, not others")
    return drawn


@functools.lru_cache(maxsize=16)
def _checkpoint_tensors(step: int, layers: int, layer_kib: int, seed: int) -> tuple:
    # Drawing 8 MiB of normals takes 10 ms, copying them 0.5 ms; the checks ask for the same ones often.
    g = torch.Generator().manual_seed(seed * 1000 + step)
    numel = layer_kib * 1024 // 4
    return tuple(torch.randn(numel, generator=g) for _ in range(layers))


def holds_drawn(loaded, step: int, layers: int = 8, layer_kib: int = 1024, seed: int = 0) -> bool:
    """Whether ``loaded`` is the checkpoint ``make_checkpoint(step, layers, layer_kib, seed)`` makes: told from
    the numbers it was drawn from, not from another checkpoint, so it compares nothing a learner holds."""
    if not (isinstance(loaded, dict) and loaded.get("step") == step and isinstance(loaded.get("model"), dict)):
        return False
    drawn = _checkpoint_tensors(step, layers, layer_kib, seed)
    model = loaded["model"]
    return list(model) == [f"layer{i}.weight" for i in range(layers)] and all(
        torch.is_tensor(t) and t.dtype == d.dtype and t.shape == d.shape and bool((t == d).all())
        for t, d in zip(model.values(), drawn))


def _first_sentence(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(path, old, new, known_bytes: dict | None = None) -> tuple[str, str]:
    """('old' | 'new' | 'unloadable' | 'missing' | 'other', detail) for the file at ``path``; ``old`` and
    ``new`` are checkpoints make_checkpoint made, or the arguments (step, layers, layer_kib, seed) that drew
    them, or None.

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
    old, new = _drawn_of(old), _drawn_of(new)
    if old is not None and holds_drawn(loaded, *old):
        return "old", ""
    if new is not None and holds_drawn(loaded, *new):
        return "new", ""
    return "other", "it loads, but holds neither the old nor the new checkpoint"


# ---------------------------------------------------------------------------------------------
# Where every call of atomic_save writes: alike for every check

def _new_scratch(workdir=None) -> str:
    """A fresh ``<scratch>`` with ``checkpoints/`` (the checkpoint's folder) and ``system-tmp/`` (tempfile's
    default folder during the call: a temp file made with tempfile's defaults lands where the checks look)."""
    root = tempfile.mkdtemp(prefix="atomic-check-", dir=workdir)
    for folder in ("checkpoints", PRIVATE_TMP):
        os.mkdir(os.path.join(root, folder))
    return root


@contextlib.contextmanager
def _tempfile_folder_of(path):
    """tempfile's default folder is the scratch's ``system-tmp`` while atomic_save(obj, path) runs (where path
    is in a scratch of _new_scratch; elsewhere, as in the notebook's demos, it stays what it is)."""
    private = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), PRIVATE_TMP)
    saved = tempfile.tempdir
    if os.path.isdir(private):
        tempfile.tempdir = private
    try:
        yield
    finally:
        tempfile.tempdir = saved


# ---------------------------------------------------------------------------------------------
# Crash trials (engine/crash_trials.py): a forked writer saves, SIGKILLed (with all it started) part-way through

def _saving_in_scratch(save, obj, path) -> None:
    """What a trial's writer runs: the save, with tempfile's default folder the scratch's own."""
    with _tempfile_folder_of(path):
        save(obj, path)


def probe_killed_saves(save, obj, kills: list, old: str) -> list[str]:
    """For each (path, kill_at_bytes): how a forked ``save(obj, path)`` ended, SIGKILLed (with every process
    it started) once ``kill_at_bytes`` were on disk (see run_and_kill), over a copy of the file ``old`` put
    at path first. What it left on disk is the check's to read.

    The copies are made here: in graded mode only ``old`` travels into the sandbox, not one per trial."""
    for path, _ in kills:
        shutil.copyfile(old, path)  # the good checkpoint the save replaces
    with CrashTrials(functools.partial(_saving_in_scratch, save), obj, [path for path, _ in kills]) as trials:
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
    known_folder = tempfile.mkdtemp(prefix="atomic-known-", dir=workdir)
    scratches = []
    try:
        known = {}
        for label, ckpt in (("old", old), ("new", new)):
            torch.save(ckpt, os.path.join(known_folder, f"{label}.pt"))
            known[label] = Path(known_folder, f"{label}.pt").read_bytes()
        fractions = [(i + 0.5) / trials for i in range(trials)]
        kills = []
        for fraction in fractions:  # each trial in a scratch of its own, laid out as every other check's
            scratches.append(_new_scratch(workdir))
            kills.append((os.path.join(scratches[-1], "checkpoints", CHECKPOINT_NAME),
                          int(fraction * len(known["new"]))))
        endings = observe(probe_killed_saves, save, new, kills, os.path.join(known_folder, "old.pt"))
        records = []
        for i, ((path, _), fraction, ended) in enumerate(zip(kills, fractions, endings)):
            outcome, detail = classify(path, (1, layers, 1024, seed), (2, layers, 1024, seed), known)
            leftovers = sorted(n for n in os.listdir(os.path.dirname(path)) if n != CHECKPOINT_NAME)
            records.append({"fraction": fraction, "ended": ended, "outcome": outcome, "detail": detail,
                            "leftovers": leftovers})
            if progress:
                progress(i + 1, trials, records[-1])
        return records
    finally:
        for folder in (known_folder, *scratches):
            shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Watching one call from outside: what got synced, when, holding how many bytes; what path held meanwhile

def _inode(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def _scratch_directory():
    """The checkpoint folder of a fresh scratch (see _new_scratch), removed afterwards with all of it."""
    root = _new_scratch()
    try:
        yield os.path.join(root, "checkpoints")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _inode_or_none(path) -> tuple[int, int] | None:
    try:
        return _inode(path)
    except OSError:
        return None


def probe_save(atomic_save, obj, path) -> list[dict]:
    """The file operations one call ``atomic_save(obj, path)`` made, each with what path held right after it
    (see recorded_file_operations), then a last event ``{"op": "final", ...}``: the (device, inode) path had
    before the call and has after it, its content digest before and after, its folder's (device, inode), and
    the process's global RNG states before and after the call (see helpers.global_rng_states).
    All read where the save ran (in graded mode the check reads copies of its files, with inodes of their own).
    """
    final = {"op": "final", "path_before": _inode_or_none(path), "content_before": content_digest(path)}
    with _tempfile_folder_of(path), recording_global_rngs() as rng:
        with recorded_file_operations(watch=path) as events:
            atomic_save(obj, path)
    final["rng"] = rng
    final.update(path=_inode_or_none(path), directory=_inode_or_none(os.path.dirname(path)),
                 content=content_digest(path))
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
        path = os.path.join(directory, CHECKPOINT_NAME)
        torch.save(make_checkpoint(1, layers, seed=seed), path)
        new = make_checkpoint(2, layers, seed=seed)
        events = _call_save(atomic_save, new, path)
        outcome, detail = classify(path, None, (2, layers, 1024, seed))
        expect(outcome == "new", f"After atomic_save(obj, path) returned, path did not hold obj ({outcome}"
                                 f"{': ' + detail if detail else ''}).")
        yield directory, path, events


def _final(events) -> dict:
    """The last event of probe_save: where path and its folder ended up and path was before, as (device, inode)
    pairs (None: no file); path's content digests before and after; the global RNG states around the call."""
    final = dict(events[-1]) if events and events[-1].get("op") == "final" else {}
    for key in ("path", "directory", "path_before"):
        final[key] = tuple(final[key]) if final.get(key) is not None else None
    return final


def _operations(events) -> list[dict]:
    return [e for e in events if e.get("op") != "final"]


def _window_problem(events, path) -> str | None:
    """Where, during the watched call, path held neither the old checkpoint nor the new one, in words (the
    first such moment); None when it always held one of them."""
    final = _final(events)
    old, new, target = final.get("content_before"), final.get("content"), os.path.abspath(path)
    for event in _operations(events):
        held = event.get("watched", old)
        if held in (old, new):
            continue
        call = f"os.{event['call']}"
        if held is None and event["op"] == "remove" and event["path"] == target:
            return (f"atomic_save removed path ({call}) before the new checkpoint was renamed onto it: from that "
                    f"call until the rename there is no checkpoint at all, and a crash in between leaves none. "
                    f"os.replace(temp, path) replaces the old file in one atomic step, with nothing removed first "
                    f"(on Linux and macOS os.rename does too; only Windows refuses to rename onto an existing file).")
        if held is None and event["op"] == "rename" and event["src"] == target:
            return (f"atomic_save moved the old checkpoint away ({call} to {os.path.basename(event['dst'])!r}) "
                    f"before the new one was in place: in between, path names no file, and a crash there leaves "
                    f"no checkpoint under it. Rename the new file straight onto path: os.replace removed the old "
                    f"one in the same atomic step.")
        if held is None:
            return (f"Right after atomic_save's {call} call, path named no file at all: a crash at that moment "
                    f"leaves no checkpoint. The final name must hold the old checkpoint until one rename puts the "
                    f"new one there.")
        if event["op"] == "rename" and event["dst"] == target:
            return (f"atomic_save renamed a file onto path ({call}) before that file was complete: right after "
                    f"the rename path held neither the old checkpoint nor the new one, and the rest was written "
                    f"under the final name. Write (and fsync) the temp file completely, then rename it.")
        return (f"Right after atomic_save's {call} call, path held neither the old checkpoint nor the new one: a "
                f"crash at that moment leaves a broken checkpoint under the final name.")
    if final.get("path_before") is not None and final.get("path") == final["path_before"] and new != old:
        return ("atomic_save wrote the new checkpoint into the old file at path itself (afterwards path is still "
                "the old file, with new content): while it wrote, path held a partial checkpoint, and a crash "
                "then leaves a broken one. torch.save(obj, path) does that, and so does copying a finished temp "
                "file onto path (shutil.copy, shutil.copyfile, or shutil.move from another filesystem write the "
                "target in place). Write a temp file, then rename it onto path.")
    return None


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
    with _scratch_directory() as directory:  # first, one ordinary call must work, where there is no checkpoint yet
        path = os.path.join(directory, CHECKPOINT_NAME)
        new = make_checkpoint(2, 2, seed=seed)
        _call_save(atomic_save, new, path)
        outcome, detail = classify(path, None, (2, 2, 1024, seed))
        expect(outcome == "new", f"atomic_save(obj, path) ran without a crash, but path then held "
                                 f"{'nothing' if outcome == 'missing' else 'something else'} ({detail}).")
    # Then over an old checkpoint, watched: what path holds after each file operation (a crash can come
    # between any two of them, not only where the trials below land by byte counts), and whether path was
    # written in place. What this finds, it finds every time; the trials' kills race the writer.
    with _watched_save(atomic_save, seed, layers=2) as (_, path, events):
        window = _window_problem(events, path)
    expect(window is None, window)
    records = crash_trials(atomic_save, trials=trials, seed=seed, layers=layers)
    bad = [r for r in records if r["outcome"] not in ("old", "new")]
    if bad:
        where = ", ".join(f"{r['fraction']:.0%}" for r in bad)
        what = ("no file at all: the old checkpoint was removed or moved away before the new one was in place"
                if bad[0]["outcome"] == "missing" else f"{bad[0]['outcome']} (torch.load said: {bad[0]['detail']})")
        raise AssertionError(
            f"In {len(bad)} of {trials} trials, a SIGKILL during atomic_save left path {what} (killed after "
            f"{where} of the bytes were written). While the new checkpoint is being written, the final name "
            f"must still point at the old one.")
    failed = [r for r in records if r["ended"] == "failed"]
    expect(not failed, f"atomic_save raised an error in {len(failed)} of {trials} trial processes.")


@graded_check("atomic_save: the temp file is a *.tmp file in the checkpoint's own directory, named without "
              "touching the global RNGs")
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
        # A name drawn from the global RNGs shifts the training loop's random stream at every save.
        rng = _final(events)["rng"]
        changed = changed_global_rngs(rng)
        expect(not changed,
               f"atomic_save changed the process's global random state: {describe_rng_change(rng, changed)}. "
               f"A save must not draw from the RNGs the training loop uses: a checkpoint records their states "
               f"(notebook 03), so a run resumed from it draws other numbers than the run that went on after "
               f"the save. Let tempfile.mkstemp or NamedTemporaryFile make the name (they draw from a generator "
               f"of their own), or use uuid.uuid4().hex.")


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


def probe_failing_save(atomic_save, obj, path) -> str | None:
    """Call atomic_save on ``obj`` plus a value torch.save fails on: the type of what it raised, or None.

    tempfile's default folder is the scratch's own meanwhile, as in every call (so that a temp file
    made with tempfile's defaults lands where the check looks). The failing value is added here:
    in graded mode it could not even be pickled into the sandbox.
    """
    try:
        with _tempfile_folder_of(path):
            atomic_save(dict(obj, extra=_FailsToSerialize()), path)
    except Exception as exc:
        return type(exc).__name__
    return None


@graded_check("atomic_save: an error while saving leaves the old checkpoint and no temp file")
def check_atomic_save_cleanup(atomic_save, seed: int = 0, layers: int = 2) -> None:
    with _scratch_directory() as directory:
        private_tmp = os.path.join(os.path.dirname(directory), PRIVATE_TMP)
        path = os.path.join(directory, CHECKPOINT_NAME)
        old = make_checkpoint(1, layers, seed=seed)
        _call_save(atomic_save, old, path)  # an ordinary save first: doing nothing must not pass
        outcome, detail = classify(path, (1, layers, 1024, seed), None)
        expect(outcome == "old", f"atomic_save(obj, path) returned, but path did not hold obj ({outcome}"
                                 f"{': ' + detail if detail else ''}).")
        raised = observe(probe_failing_save, atomic_save, make_checkpoint(2, layers, seed=seed), path)
        outcome, detail = classify(path, (1, layers, 1024, seed), None)
        expect(outcome == "old",
               f"After torch.save failed inside atomic_save, path was {outcome} ({detail or 'it changed'}): the "
               f"old checkpoint must stay untouched until the new one is complete.")
        leftovers = sorted(n for n in os.listdir(directory) if n != CHECKPOINT_NAME) + sorted(os.listdir(private_tmp))
        expect(not leftovers,
               f"After torch.save failed inside atomic_save, the temp file was left behind ({', '.join(leftovers)}). "
               f"Every failed save would leave another one: remove the temp file when anything goes wrong.")
        expect(raised is not None,
               "torch.save failed inside atomic_save, but atomic_save returned normally: the caller believes "
               "the checkpoint was written. Clean up, then let the exception propagate.")


# ---------------------------------------------------------------------------------------------
# Checks: load_latest_checkpoint

def _write_checkpoints(directory: str, steps: list[int], seed: int, start_time: float = 1_700_000_000.0) -> dict:
    """step_<n>.pt for each step (n is also its checkpoint["step"]), with modification times in the order
    given (later = newer), a minute apart."""
    written = {}
    for order, step in enumerate(steps):
        path = os.path.join(directory, f"step_{step}.pt")
        ckpt = make_checkpoint(step, layers=2, layer_kib=4, seed=seed)
        torch.save(ckpt, path)
        os.utime(path, (start_time + 60 * order, start_time + 60 * order))
        written[path] = (step, 2, 4, seed)
    return written


def _returned_name(result) -> str | None:
    if isinstance(result, tuple) and len(result) == 2:
        with contextlib.suppress(TypeError):
            return os.path.basename(os.fspath(result[0]))
    return None


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


def _expect_result(result, expected_path, expected_drawn: tuple, situation: str) -> None:
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{situation}: load_latest_checkpoint should return a (path, checkpoint) tuple, but it returned "
           f"{type(result).__name__}{'' if result is not None else ' (None)'}.")
    path, obj = result
    # Judged as data (checking.returned_path): a path is never looked up outside the check's own folder.
    verdict, shown = returned_path(path, expected_path, os.path.dirname(expected_path))
    if verdict in ("name", "relative"):
        what = "the file's name, not its path" if verdict == "name" else "a relative path"
        raise AssertionError(
            f"{situation}: it returned {shown!r}, {what}. A caller opens the path it gets, from whatever working "
            f"directory it runs in: return the path in `directory`, os.path.join(directory, name).")
    expect(verdict != "not a path", f"{situation}: load_latest_checkpoint should return (path, checkpoint) with "
                                    f"the path as a str, not a {shown}.")
    expect(verdict != "outside", f"{situation}: it returned {shown!r}, a path outside the folder it was given. "
                                 f"The checkpoint to load is a file in `directory`: return its path there.")
    expect(verdict == "same", f"{situation}: it returned {shown!r}, but the loadable checkpoint of the latest "
                              f"step is {os.path.basename(expected_path)!r}.")
    expect(holds_drawn(obj, *expected_drawn),
           f"{situation}: the returned checkpoint is not what {os.path.basename(expected_path)!r} holds.")


@graded_check("load_latest_checkpoint: returns the checkpoint of the latest step, or None when there is none")
def check_load_latest_checkpoint_newest(load_latest_checkpoint, seed: int = 0, steps: tuple = (8, 9, 10)) -> None:
    steps = sorted(steps)
    with _scratch_directory() as directory:  # a run's folder: written step after step
        result, _ = _call_loader(load_latest_checkpoint, directory)
        expect(result is None, f"In an empty directory, load_latest_checkpoint returned {result!r} instead of None.")
        written = _write_checkpoints(directory, steps, seed)
        latest = list(written)[-1]
        result, _ = _call_loader(load_latest_checkpoint, directory)
        names = [os.path.basename(p) for p in written]
        returned = _returned_name(result)
        if returned == max(names) != names[-1]:
            raise AssertionError(
                f"load_latest_checkpoint returned {returned!r}, the last name in alphabetical order, but "
                f"{names[-1]!r} holds a later step ({names[-1]!r} sorts before {max(names)!r}: text compares digit "
                f"by digit). Compare the step numbers, not the names.")
        _expect_result(result, latest, written[latest], f"With checkpoints {', '.join(names)}")
    with _scratch_directory() as directory:  # the same run's folder, restored from a copy made latest step first
        written = _write_checkpoints(directory, steps[::-1], seed)
        latest = os.path.join(directory, f"step_{steps[-1]}.pt")
        last_modified = list(written)[-1]
        result, _ = _call_loader(load_latest_checkpoint, directory)
        if _returned_name(result) == os.path.basename(last_modified):
            raise AssertionError(
                f"load_latest_checkpoint returned {os.path.basename(last_modified)!r}, the file modified last, "
                f"but {os.path.basename(latest)!r} records a later step. This folder was restored from a copy "
                f"made latest step first, so its modification times run against the steps. A modification time "
                f"says when a file was last written, not how far training had got: a copy (cp without -p, rsync "
                f"without -t, a download) resets it, and saves closer together than the filesystem's timestamp "
                f"resolution share one. Order by the step: the n of step_<n>.pt, or checkpoint['step'].")
        _expect_result(result, latest, written[latest],
                       f"With checkpoints {', '.join(os.path.basename(p) for p in written)} (copied in that order)")


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
