"""Checks for notebook 05's ``atomic_save(obj, path)``: crash trials, and one watched call per check.
"""

from __future__ import annotations

import os

from ..checking import expect, graded_check, observe
from ..helpers import changed_global_rngs, describe_rng_change
from .checkpoints import CHECKPOINT_NAME, PRIVATE_TMP, TEMP_SUFFIX, _tempfile_folder_of, classify, make_checkpoint
from .crashes import crash_trials
from .watched_call import (_NO_RENAME, _call_save, _final, _final_rename, _scratch_directory, _watched_save,
                           _window_problem)


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
    # written in place. What this finds, it finds every time; the trials find what a kill at a byte leaves.
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


@graded_check("atomic_save: the temp file is a *.tmp file in the checkpoint's own directory, under a name of "
              "its own for each save, drawn without touching the global RNGs")
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
        first = os.path.basename(rename["src"])
    with _watched_save(atomic_save, seed + 1, layers) as (_, path, events):  # a second save, to a path named alike
        _, rename = _final_rename(events, path)
        expect(rename is not None, _NO_RENAME)
    expect(os.path.basename(rename["src"]) != first,
           f"atomic_save named its temp file {first!r} in both of two saves of one path: a name that stays the "
           f"same from one save to the next is shared by every writer of that checkpoint. Two saves at once (an "
           f"asynchronous checkpoint and the one at exit, two processes writing one folder) write into the same "
           f"temp file, and one renames the other's half-written bytes into place; a temp file a crashed save "
           f"left behind is overwritten, or blocks the next save. Let tempfile.mkstemp or NamedTemporaryFile "
           f"make a name of its own for each save.")


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
