"""Checks for notebook 09: checkpoints across ranks.

Conventions the notebook states: a run folder holds one folder per checkpoint, ``step_<n>``
(n the number of committed updates), each written by ``torch.distributed.checkpoint``
(DCP), whose coordinator writes ``.metadata`` last: a step folder is *committed* when it
holds a readable ``.metadata``. Next to them, the file ``latest`` holds the name of the newest
committed folder (``step_<n>``), replaced by notebook 05's recipe once the commit is durable.

``latest_checkpoint`` is judged on run folders the check writes with real DCP saves and
leaves as crashes leave them (a folder whose ``.metadata`` never came, one with only
``.metadata.tmp``, an empty or a truncated marker, a pointer that lags). The path it returns is
judged as text: a relative one is a name, an absolute one outside the check's run folder is wrong,
and neither is looked up in the file system (the answer would be one bit about the grader's folders).

``save_checkpoint`` runs in two probes. One calls it three times on one run folder with every
fsync, rename and symlink watched: a first save in a forked process (a job before this one), a
second in the probe's process, a third whose rename onto ``latest`` fails. The other runs it on
three real gloo ranks, each holding its own rows of every tensor. The probes load what the folders
hold (DCP's ``.metadata`` is a pickle: the grading process never loads one the learner's code wrote)
and report it with the files' digests. ``resume_plan`` is judged on the positions it returns, update
by update. ``PreemptionGuard`` runs inside real gloo ranks; a scheduler, a process of its own started
after the ranks, decides when its SIGTERMs come and to which ranks, so nothing in a rank's memory says.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import torch

from .checking import Remembered, expect, failing_if_raised, graded_check, observe, placed_path
from .engine.file_operations import RenameWatch, folder_tree, inode_of, noting_renames_onto
from .engine.forked_ranks import (fork_ranks, forked_report, quiet_distributed, rank_reports, reap, reporting_rank,
                                  scheduled_jobs, warm_dcp)

METADATA = ".metadata"
POINTER = "latest"
STEP_NAME = re.compile(r"step_(\d+)")


# ---------------------------------------------------------------------------------------------
# the scenarios: run folders written with real DCP saves

def _state(seed: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return {"model": {"0.weight": torch.randn(16, 8, generator=g), "0.bias": torch.randn(16, generator=g)},
            "train": {"cursor": 12 * step}}


def _write_step(run_dir: Path, step: int, seed: int, how: str = "committed") -> Path:
    """A real single-process DCP save of step_<step>, then left as a crash leaves it: 'no_marker' (a rank
    died before the coordinator wrote .metadata), 'tmp_marker' (the coordinator died writing it: only
    .metadata.tmp), 'empty_marker' (the marker's name survived a power cut, its bytes did not),
    'truncated_marker' (half of its bytes did)."""
    import torch.distributed.checkpoint as dcp
    quiet_distributed()
    folder = run_dir / f"step_{step}"
    dcp.save(_state(seed, step), checkpoint_id=folder)
    marker = folder / METADATA
    if how == "no_marker":
        marker.unlink()
    elif how == "tmp_marker":
        marker.rename(folder / (METADATA + ".tmp"))
    elif how == "empty_marker":
        marker.write_bytes(b"")
    elif how == "truncated_marker":
        marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    return folder


def _write_pointer(run_dir: Path, name: str) -> None:
    (run_dir / POINTER).write_text(name)


@contextlib.contextmanager
def _scratch():
    root = tempfile.mkdtemp(prefix="sharded-check-")
    try:
        run_dir = Path(root) / "run"
        run_dir.mkdir()
        yield run_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# latest_checkpoint

def judged_path(result, run_dir: Path) -> tuple[str, Path | None]:
    """What a returned path names, judged as text and never looked up (``checking.placed_path``): ('none',
    None), ('not_a_path', None), ('name', None) for a relative path, ('outside', None) for an absolute path
    outside ``run_dir``, or ('inside', the path rewritten onto ``run_dir`` as the check spells it)."""
    if result is None:
        return "none", None
    kind, shown = placed_path(result, str(run_dir))
    if kind == "inside":
        return "inside", Path(run_dir) / shown
    return {"not a path": "not_a_path", "relative": "name"}.get(kind, kind), None


def _call_loader(latest_checkpoint, run_dir: Path):
    call = f"latest_checkpoint({str(run_dir)!r})"
    with failing_if_raised(call):
        result = latest_checkpoint(str(run_dir))
    kind, path = judged_path(result, run_dir)
    if kind == "not_a_path":
        raise AssertionError(f"latest_checkpoint should return the path of a step folder (a str) or None, not "
                             f"{type(result).__name__}.")
    if kind == "name":
        raise AssertionError(f"latest_checkpoint returned {os.fspath(result)!r}, a name, not a path: return the "
                             f"folder's path inside run_dir (run_dir joined with the folder's name), which a caller "
                             f"can hand to dcp.load from any working directory.")
    if kind == "outside":
        name = os.path.basename(os.fspath(result))
        raise AssertionError(f"latest_checkpoint returned a path to {name!r} outside the "
                             f"run folder it was given (resolved against the working folder?): a step folder of that "
                             f"run lives inside run_dir, and its path is run_dir joined with its name.")
    return path


def _named(path) -> str:
    return "None" if path is None else repr(Path(path).name)


def _expect_folder(got, expected: Path | None, situation: str, trap: str) -> None:
    same = (got is None and expected is None) or (
        got is not None and expected is not None and os.path.normpath(got) == os.path.normpath(expected))
    expect(same, f"{situation}, latest_checkpoint returned {_named(got)} instead of {_named(expected)}. {trap}")


def _expect_untouched(before: dict, run_dir: Path) -> None:
    after = folder_tree(run_dir)
    gone = sorted(set(before) - set(after))
    changed = sorted(name for name in before if name in after and before[name] != after[name])
    expect(not gone and not changed,
           f"latest_checkpoint {'deleted ' + ', '.join(gone) if gone else 'changed ' + ', '.join(changed)} in the "
           f"run folder. A loader only reads: a folder without a marker is skipped, not cleaned up. It may be a "
           f"save still being written by the ranks of a running job, and it is the evidence of a crash.")


@graded_check("latest_checkpoint never returns a step folder without a readable .metadata (a partial checkpoint)")
def check_latest_checkpoint_committed(latest_checkpoint, seed: int = 0) -> None:
    base = 2 + seed % 3
    with _scratch() as run_dir:
        good = _write_step(run_dir, 2 * base, seed)
        _write_step(run_dir, 4 * base, seed, "no_marker")
        _write_pointer(run_dir, good.name)
        before = folder_tree(run_dir)
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, good, f"With {good.name} committed and step_{4 * base} holding every rank's shard but "
                       f"no .metadata (a rank was killed before the coordinator wrote it)",
                       "A folder with shards and no marker looks like a checkpoint but is not one: DCP writes "
                       ".metadata last, only once every rank's shard is on disk, and dcp.load cannot read a folder "
                       "without it. Which file says a step folder is committed?")
        _expect_untouched(before, run_dir)
    with _scratch() as run_dir:
        good = _write_step(run_dir, base, seed)
        empty = _write_step(run_dir, base + 2, seed, "empty_marker")
        truncated = _write_step(run_dir, base + 3 + seed % 2, seed, "truncated_marker")
        _write_pointer(run_dir, good.name)
        before = folder_tree(run_dir)
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, good, f"With {good.name} committed, {empty.name} whose .metadata is empty (0 bytes) and "
                       f"{truncated.name} whose .metadata holds half of its bytes (a power cut after the marker's "
                       f"rename, before its bytes reached the disk)",
                       "A marker that exists is not yet a marker that can be read: a folder counts only if its "
                       ".metadata loads, which FileSystemReader(folder).read_metadata() tells (dcp.load reads it "
                       "the same way). Skip a folder whose marker is empty or does not load.")
        _expect_untouched(before, run_dir)
    with _scratch() as run_dir:
        _write_step(run_dir, base, seed, "tmp_marker")
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, None, f"With only step_{base}, whose coordinator died while writing its metadata "
                       f"(.metadata.tmp, never renamed to .metadata)",
                       "A temp file is not the marker: the checkpoint is committed only once .metadata itself "
                       "exists. With no committed checkpoint, return None (start from scratch).")


@graded_check("latest_checkpoint returns the committed step folder with the largest step, even when `latest` lags")
def check_latest_checkpoint_newest(latest_checkpoint, seed: int = 0) -> None:
    with _scratch() as run_dir:
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, None, "In an empty run folder", "No checkpoint yet: return None.")
    low = 8 + seed % 2            # step_8 / step_9 against step_10 / step_11: text order is not step order
    with _scratch() as run_dir:
        older = _write_step(run_dir, low, seed)
        newer = _write_step(run_dir, low + 2 + seed % 3, seed)
        (run_dir / "notes.txt").write_text("not a checkpoint")
        _write_pointer(run_dir, older.name)
        got = _call_loader(latest_checkpoint, run_dir)
        trap = ("The job crashed after DCP committed the newer folder and before `latest` moved to it: the pointer "
                "lags, the folders do not. Compare the steps of the committed folders (numbers, not names: "
                "'step_10' < 'step_9' as text).")
        _expect_folder(got, newer, f"With {older.name} and {newer.name} both committed and `latest` still "
                       f"naming {older.name}", trap)
        (run_dir / POINTER).unlink()
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, newer, f"With {older.name} and {newer.name} committed and no `latest` file", trap)
        later = newer.stat().st_mtime + 60    # a clean-up, a copy or a restore touched the older folder
        os.utime(older, (later, later))
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, newer, f"With {older.name} and {newer.name} committed and {older.name} modified last "
                       f"(a clean-up wrote into it)", "A folder's modification time is not its step: cleaning up, "
                       "copying or restoring a folder changes it. Compare the steps in the folder names.")


# ---------------------------------------------------------------------------------------------
# save_checkpoint, in one process: three saves on one run folder, every file operation watched

def _read_pointer(run_dir: Path) -> str | None:
    path = run_dir / POINTER
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()[:200].decode("utf-8", "replace").strip()


def _committed_folder(run_dir: Path, name: str) -> bool:
    """Whether run_dir/<name> holds a non-empty .metadata; only a plain folder name of run_dir is looked up."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return False
    marker = run_dir / name / METADATA
    return marker.is_file() and marker.stat().st_size > 0


def _watch(run_dir: Path, fail_pointer: bool = False, slow: float = 0.0) -> RenameWatch:
    """Every fsync, rename and symlink of one save_checkpoint call, as notebook 05's recorder sees them (see
    engine.file_operations.RenameWatch): right after a rename onto ``latest``, what the pointer holds, whether
    that folder is committed and what the run folder holds; right after DCP's rename onto a ``.metadata`` (the
    commit), what the run folder holds. ``fail_pointer``: a rename onto ``latest`` raises EIO instead."""
    pointer = os.path.abspath(run_dir / POINTER)

    def after_rename(dst: str) -> dict:
        if dst == pointer:
            held = _read_pointer(run_dir)
            return {"pointer": held, "committed": _committed_folder(run_dir, held or ""),
                    "tree": folder_tree(run_dir)}
        return {"tree": folder_tree(run_dir)} if os.path.basename(dst) == METADATA else {}
    return RenameWatch(after_rename, fail_onto=pointer if fail_pointer else None, slow=slow)


def _load_folder(folder: Path, like: dict) -> dict | None:
    import torch.distributed.checkpoint as dcp
    if not (folder / METADATA).is_file():
        return None
    template = {"model": {k: torch.zeros_like(v) for k, v in like["model"].items()}, "train": {"cursor": -1}}
    dcp.load(template, checkpoint_id=folder)
    return template


def _loaded(run_dir: Path, like: dict) -> dict:
    out = {}
    for entry in sorted(run_dir.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        try:
            out[entry.name] = _load_folder(entry, like)
        except BaseException as exc:  # a folder DCP cannot read (CheckpointException is a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            out[entry.name] = type(exc).__name__
    return out


def _watched_save(save_checkpoint, run_dir: Path, state: dict, step: int, in_a_child: bool = False,
                  **watch) -> dict:
    """One call, watched: its events, what it raised (if anything), and the run folder afterwards."""
    with _watch(run_dir, **watch) as watched:
        try:
            save_checkpoint(state, str(run_dir), step)
            raised = None
        except NotImplementedError as exc:
            if not in_a_child:
                raise                     # the stub: the runner says "not answered yet"
            raised = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            raised = f"{type(exc).__name__}: {exc}"
    tree = folder_tree(run_dir)      # every file's digest: read once
    return {"events": watched.events, "raised": raised, "tree": tree, "pointer": _read_pointer(run_dir),
            "pointer_inode": inode_of(run_dir / POINTER), "pointer_is_symlink": (run_dir / POINTER).is_symlink(),
            "run_dir_inode": inode_of(run_dir),
            "inodes": {f"{name}/{METADATA}": inode_of(run_dir / name / METADATA) for name in tree}
            | {name: inode_of(run_dir / name) for name in tree}}


def probe_saves(save_checkpoint, run_dir: str, states: list, steps: list) -> dict:
    """save_checkpoint(states[i], run_dir, steps[i]) three times, each watched (see _watch): the first in a
    forked process (a job that ran before this one), the second here, the third here with the rename onto `latest`
    failing. Reports each call's events, what it raised, the run folder after it, and what each step folder loads
    as. Background fsyncs are slowed (a pointer moved before an async save's future is done is then seen early)."""
    quiet_distributed()
    run_dir = Path(run_dir)
    first, code = forked_report(_watched_save, save_checkpoint, run_dir, states[0], steps[0], slow=0.2,
                                in_a_child=True)
    first = first if first is not None else {"raised": f"the process ended ({code})"}
    second = _watched_save(save_checkpoint, run_dir, states[1], steps[1], slow=0.2)
    loaded = _loaded(run_dir, states[1])
    third = _watched_save(save_checkpoint, run_dir, states[2], steps[2], fail_pointer=True)
    return {"saves": [first, second, third], "loaded": loaded}


_saves = Remembered(keep=4)


def _three_saves(save_checkpoint, seed: int) -> dict:
    steps = [4 + 4 * (seed % 3), 8 + 4 * (seed % 3), 12 + 4 * (seed % 3)]

    def run():
        with _scratch() as run_dir:
            with failing_if_raised("save_checkpoint(state, run_dir, step)"):
                seen = observe(probe_saves, save_checkpoint, str(run_dir), [_state(seed, s) for s in steps], steps)
            seen["run_dir"] = str(run_dir)
        for i, save in enumerate(seen["saves"][:2]):
            if save["raised"]:
                raise AssertionError(f"save_checkpoint(state, run_dir, {steps[i]}) raised {save['raised']}")
        seen["steps"] = steps
        return seen
    return _saves((save_checkpoint, seed), run)


def _same_state(loaded, expected: dict) -> bool:
    return (isinstance(loaded, dict) and loaded.get("train", {}).get("cursor") == expected["train"]["cursor"]
            and all(torch.is_tensor(loaded["model"].get(k)) and torch.equal(loaded["model"][k], v)
                    for k, v in expected["model"].items()))


def _folders(tree: dict) -> dict:
    return {name: files for name, files in tree.items() if isinstance(files, dict)}


def _pointer_renames(save: dict, run_dir: str) -> list[dict]:
    target = os.path.abspath(os.path.join(run_dir, POINTER))
    return [(i, e) for i, e in enumerate(save["events"]) if e["op"] == "rename" and e["dst"] == target and e["ok"]]


@graded_check("save_checkpoint writes each step into a new step_<n> folder and keeps the committed one until "
              "`latest` has moved on")
def check_save_checkpoint_new_folder(save_checkpoint, seed: int = 0) -> None:
    seen = _three_saves(save_checkpoint, seed)
    first, second = seen["saves"][:2]
    new = f"step_{seen['steps'][1]}"
    before = _folders(first["tree"])
    commits = [e for e in second["events"] if e["op"] == "rename" and e.get("tree") is not None
               and os.path.basename(e["dst"]) == METADATA and e["ok"]]
    for event in commits[:1]:
        folder = os.path.basename(os.path.dirname(event["dst"]))
        if folder in before:
            raise AssertionError(
                f"Saving step {seen['steps'][1]} rewrote the committed checkpoint {folder!r} in place. While DCP "
                f"rewrites a folder, its old .metadata describes shards that are being replaced, and torch removes "
                f"it just before renaming the new one: a crash then leaves no committed checkpoint, or one whose "
                f"marker lies. Write every step into a new folder, and leave the last committed one untouched.")
        gone = sorted(name for name in before if name not in event["tree"])
        changed = sorted(name for name in before if name in event["tree"] and event["tree"][name] != before[name])
        if gone or changed:
            raise AssertionError(
                f"When DCP committed {folder!r}, the previous checkpoint {(gone or changed)[0]!r} was already "
                f"{'deleted' if gone else 'changed'}: a previous checkpoint deleted first. A crash between the two "
                f"leaves no checkpoint at all. Delete older step folders, if you delete them, only once `latest` "
                f"names the new one.")
    for _, event in _pointer_renames(second, seen["run_dir"])[:1]:
        held = first["pointer"]
        expect(not held or held in _folders(event["tree"]),
               f"`latest` named {held!r} until it moved to {event['pointer']!r}, but {held!r} was deleted before "
               f"that: for a moment the pointer named a folder that no longer existed (an evaluation job following "
               f"`latest` finds nothing). Delete older folders only after the pointer has moved.")
    for step, save in zip(seen["steps"][:2], (first, second)):
        name = f"step_{step}"
        expect(name in _folders(save["tree"]),
               f"After save_checkpoint(state, run_dir, {step}), run_dir holds {sorted(save['tree'])} but no folder "
               f"{name!r}: each checkpoint goes into run_dir/step_<step>, the name the loader looks for.")
    loaded = seen["loaded"].get(new)
    expect(_same_state(loaded, _state(seed, seen["steps"][1])),
           f"After the second save, {new!r} does not load as the state saved at step {seen['steps'][1]} "
           f"({'no .metadata' if loaded is None else 'other contents' if isinstance(loaded, dict) else loaded}): "
           f"dcp.save(state, checkpoint_id=run_dir/step_<step>) writes it, .metadata last.")


def _saved_into(save: dict, step: int) -> str:
    """The folder a watched call committed (where DCP renamed a .metadata); step_<step> if none was."""
    commits = [e for e in save["events"] if e["op"] == "rename" and e["ok"] and os.path.basename(e["dst"]) == METADATA]
    return os.path.basename(os.path.dirname(commits[-1]["dst"])) if commits else f"step_{step}"


def _temp_names(save: dict, run_dir: str) -> list[str]:
    return [os.path.basename(e["src"]) for _, e in _pointer_renames(save, run_dir)]


@graded_check("save_checkpoint moves `latest` after the commit by notebook 05's recipe: a unique temp file in "
              "run_dir, fsynced, os.replace, run_dir fsynced, nothing left behind when it fails")
def check_save_checkpoint_pointer(save_checkpoint, seed: int = 0) -> None:
    seen = _three_saves(save_checkpoint, seed)
    first, second, third = seen["saves"]
    run_dir, step = seen["run_dir"], seen["steps"][1]
    new = _saved_into(second, step)
    expect(not second["pointer_is_symlink"],
           f"After save_checkpoint(state, run_dir, {step}), `latest` is a symbolic link: a pointer swapped by "
           f"symlink. The contract is a file holding the folder's name, read with open(...).read(): a symlink is "
           f"followed by copies and archives as if it were the folder, and is lost on storage without links. Write "
           f"the name into a temp file and os.replace it onto `latest`.")
    expect(second["pointer"] == new,
           f"After save_checkpoint(state, run_dir, {step}), run_dir/latest holds {second['pointer']!r}, not the "
           f"name of the folder just saved ({new!r}): the pointer holds the newest committed folder's name (a "
           f"name, not a path, so that a run folder that is copied or moved keeps working).")
    renames = _pointer_renames(second, run_dir)
    expect(renames and second["pointer_inode"] != first["pointer_inode"],
           "`latest` was written in place (open(...).write), not renamed into place: a crash or a reader in the "
           "middle of that write sees an empty or half-written pointer. Apply notebook 05's rule: write a temp "
           "file, fsync it, os.replace it onto latest.")
    early = [e for _, e in renames if not e["committed"]]
    expect(not early,
           f"`latest` moved to {early[0]['pointer'] if early else ''!r} before that folder held .metadata: the "
           f"pointer was ahead of the commit. A crash right then leaves a pointer to a partial checkpoint. Move it "
           f"only after dcp.save returned (an async_save's folder is committed only once its future is done).")
    index, rename = renames[-1]
    expect(os.path.dirname(rename["src"]) == os.path.abspath(run_dir),
           f"The temp file renamed onto `latest` was written in {os.path.dirname(rename['src'])!r}, not in run_dir: "
           f"a rename is atomic only within one filesystem, and another folder can be another one. Put the temp "
           f"file next to `latest`.")
    names = _temp_names(first, run_dir), _temp_names(second, run_dir)
    expect(not (names[0] and names[1] and names[0][-1] == names[1][-1]),
           f"Two save_checkpoint calls from two processes both wrote the pointer through the temp file "
           f"{(names[1] or [''])[-1]!r}: a fixed temp name. Two writers at once (two ranks, or a job restarted "
           f"while the old one still runs) then write into the same file, and one os.replace finds it gone. Let "
           f"tempfile.mkstemp(dir=run_dir) pick a unique name.")
    size = len(new.encode())
    syncs = [i for i, e in enumerate(second["events"][:index]) if e["op"] == "fsync" and not e["is_dir"]
             and e["inode"] == second["pointer_inode"]]
    expect(syncs, "The temp file that became `latest` was never fsynced before os.replace: after a power cut the "
                  "renamed pointer can be empty although the rename survived. os.fsync it first.")
    expect(any(second["events"][i]["size"] >= size for i in syncs),
           "The pointer's temp file was fsynced before its text was written (Python's buffer is flushed only at "
           "close or flush()): the sync covered nothing. Flush, then fsync.")
    dir_syncs = [i for i, e in enumerate(second["events"]) if e["op"] == "fsync" and e["is_dir"]
                 and e["inode"] == second["run_dir_inode"] and i > index]
    expect(dir_syncs, "run_dir was not fsynced after os.replace put `latest` in place: the rename is a change to "
                      "the folder, durable only once the folder is synced. After a power cut `latest` can name the "
                      "older folder again.")
    leftovers = sorted(n for n, v in third["tree"].items() if not isinstance(v, dict) and n != POINTER)
    expect(third["raised"],
           "When the rename onto `latest` failed (the check's disk raised EIO), save_checkpoint returned normally: "
           "the caller believes the pointer moved. Clean up, then let the exception propagate.")
    expect(not leftovers,
           f"When the rename onto `latest` failed, save_checkpoint left {len(leftovers)} file(s) beside `latest` in "
           f"run_dir (its temp file): every failed save would leave another one. Remove it when anything goes "
           f"wrong, then raise.")
    expect(third["pointer"] == new,
           f"When the rename onto `latest` failed, `latest` ended up holding {third['pointer']!r} instead of still "
           f"naming {new!r}: a failed save must leave the pointer as it was.")


@graded_check("save_checkpoint makes the commit durable before `latest` moves: .metadata and its step folder fsynced")
def check_save_checkpoint_durable(save_checkpoint, seed: int = 0) -> None:
    seen = _three_saves(save_checkpoint, seed)
    second = seen["saves"][1]
    run_dir, step = seen["run_dir"], seen["steps"][1]
    new = _saved_into(second, step)
    renames = _pointer_renames(second, run_dir)
    index = renames[-1][0] if renames else len(second["events"])
    before = second["events"][:index]
    marker, folder = second["inodes"].get(f"{new}/{METADATA}"), second["inodes"].get(new)
    marker_syncs = [e["size"] for e in before if e["op"] == "fsync" and not e["is_dir"] and e["inode"] == marker]
    folder_synced = any(e["op"] == "fsync" and e["is_dir"] and e["inode"] == folder for e in before)
    missing = []
    if not any(size > 0 for size in marker_syncs):
        sizes = ", ".join(map(str, marker_syncs))
        seen_sizes = (f" (the only fsync of its bytes came at {sizes} bytes: torch {torch.__version__} syncs "
                      f".metadata.tmp before Python has written it out)" if marker_syncs else "")
        missing.append(f"{new}/.metadata was never fsynced with its bytes in it{seen_sizes}")
    if not folder_synced:
        missing.append(f"{new} itself was never fsynced (DCP does not: the rename of .metadata.tmp to .metadata is "
                       f"an entry of that folder)")
    expect(not missing,
           f"Before `latest` moved to {new!r}: {'; '.join(missing)}. Against a killed process the marker is enough, "
           f"the kernel keeps what was written; after a power cut, `latest` can name a folder whose .metadata is "
           f"empty or absent. After dcp.save returns, open .metadata and fsync it, then fsync the step folder, "
           f"then move the pointer.")


# ---------------------------------------------------------------------------------------------
# save_checkpoint on real ranks: who writes which shard, who moves the pointer

RANKS = 3


def _rows(tensor, rank: int, world_size: int):
    """This rank's rows of ``tensor``, split on dim 0 as FSDP2 splits it (torch.chunk), in storage of their own."""
    chunks = tensor.chunk(world_size)
    return (chunks[rank] if rank < len(chunks) else tensor[:0]).clone()


def _saving_rank(save_checkpoint, steps: list, seed: int, workdir: str, rank: int, world_size: int,
                 report: dict) -> None:
    """A rank of probe_saves_on_ranks (engine.forked_ranks.reporting_rank runs it): saves its rows of each
    step's state, counting in ``report`` how many times it renamed something onto `latest`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (world_size,))
    run_dir = os.path.join(workdir, "run")
    pointer = os.path.abspath(os.path.join(run_dir, POINTER))

    def moved():
        report["pointer_moves"] += 1

    with noting_renames_onto(pointer, moved):
        for step in steps:
            full = _state(seed, step)
            model = {k: DTensor.from_local(_rows(v, rank, world_size), mesh, [Shard(0)], run_check=False,
                                           shape=v.shape, stride=v.stride())
                     for k, v in full["model"].items()}
            save_checkpoint({"model": model, "train": dict(full["train"])}, run_dir, step)


def probe_saves_on_ranks(save_checkpoint, world_size: int, steps: list, seed: int) -> dict:
    """Fork ``world_size`` gloo ranks; each holds its rows (dim 0, as FSDP2 shards) of every tensor of the
    state and calls save_checkpoint(state, run_dir, step) for each step. Per rank: how it ended, how many times
    it renamed something onto `latest`; per step folder: its files and whether it loads as the whole state."""
    quiet_distributed()
    warm_dcp(_state(0, 0))
    workdir = tempfile.mkdtemp(prefix="ranks-save-")
    try:
        os.mkdir(os.path.join(workdir, "run"))
        body = functools.partial(_saving_rank, save_checkpoint, steps, seed, workdir)
        blank = {"pointer_moves": 0, "error": None, "done": False}     # a report before it runs, or when none came
        pids = fork_ranks(reporting_rank, world_size, (body, world_size, workdir, blank))
        codes = reap(pids, deadline=30.0)
        ranks = rank_reports(workdir, codes, blank)
        run_dir = Path(workdir, "run")
        folders = {}
        for step in steps:
            folder = run_dir / f"step_{step}"
            try:
                loaded = _load_folder(folder, _state(seed, step)) if folder.is_dir() else None
                whole = _same_state(loaded, _state(seed, step))
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                whole = False
            folders[folder.name] = {"files": sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [],
                                    "whole": whole}
        return {"ranks": ranks, "folders": folders, "pointer": _read_pointer(run_dir)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_rank_saves = Remembered(keep=4)


@graded_check("save_checkpoint on 3 real ranks: every rank writes its own shard through dcp.save, rank 0 alone "
              "moves `latest`")
def check_save_checkpoint_ranks(save_checkpoint, seed: int = 0) -> None:
    steps = [4 + 4 * (seed % 3), 8 + 4 * (seed % 3)]

    def run():
        with failing_if_raised("save_checkpoint on the ranks"):
            return observe(probe_saves_on_ranks, save_checkpoint, RANKS, steps, seed)
    seen = _rank_saves((save_checkpoint, seed), run)
    ranks = seen["ranks"]
    if any(r["error"] == "NotImplementedError" for r in ranks):
        raise NotImplementedError("save_checkpoint")
    story = (f"{RANKS} ranks, each holding its own rows of every tensor, called save_checkpoint(state, run_dir, "
             f"step) for steps {steps[0]} and {steps[1]}")
    movers = [r for r, info in enumerate(ranks) if info["pointer_moves"]]
    expect(movers in ([], [0]),
           f"{story}: ranks {', '.join(map(str, movers))} moved `latest`. The pointer has one writer, rank 0, once "
           f"the commit is durable: another rank's move can come before rank 0's fsyncs, and several writers race "
           f"on the temp file.")
    failed = [(r, info) for r, info in enumerate(ranks) if not info["done"]]
    if failed:
        finished = [r for r, info in enumerate(ranks) if info["done"]]
        rank, info = failed[0]
        hint = (f" while rank(s) {', '.join(map(str, finished))} returned from it: dcp.save is a collective. Every "
                f"rank calls it with its own part of the state, the coordinator writes .metadata once all have, and "
                f"only then does it return" if finished else "")
        raise AssertionError(f"{story}: rank {rank} failed inside save_checkpoint "
                             f"({info['error'] or info['exit']}){hint}.")
    for name, folder in seen["folders"].items():
        if not folder["files"]:
            continue        # no such folder: check_save_checkpoint_new_folder says so
        writers = sorted(int(m.group(1)) for m in map(re.compile(r"__(\d+)_0\.distcp").fullmatch, folder["files"]) if m)
        expect(writers == list(range(RANKS)),
               f"{story}: {name} holds shard files from rank(s) {writers} only ({', '.join(folder['files'])}): the "
               f"whole state went through one writer (gathered onto rank 0, or saved there alone). Every rank saves "
               f"its own shard in the same dcp.save; that is what lets a checkpoint be larger than one rank's memory.")
        expect(folder["whole"],
               f"{story}: {name} does not load as the whole state (every rank's rows): each rank must hand dcp.save "
               f"its own part, under the same keys.")


# ---------------------------------------------------------------------------------------------
# resume_plan

def _saved(world_size: int, global_batch: int, updates: int) -> dict:
    return {"world_size": world_size, "global_batch": global_batch,
            "samples_seen": [updates * global_batch // world_size] * world_size}


def _plan(resume_plan, saved: dict, new_world_size: int, steps: int, inputs_judged: bool = False) -> tuple[str, list]:
    call = f"resume_plan({saved!r}, new_world_size={new_world_size}, steps={steps})"
    given = copy.deepcopy(saved)
    with failing_if_raised(call):
        plan = resume_plan(given, new_world_size, steps)
    expect(given == saved or not inputs_judged,
           f"{call} changed the saved state it was given (afterwards it reads {given!r}). That state is what the "
           f"checkpoint holds: the next resume, or an audit, reads it too. Compute from it, do not write into it.")
    try:
        plan = [[[int(p) for p in update] for update in rank] for rank in plan]
    except (TypeError, ValueError):
        raise AssertionError(f"{call} should return plan[rank][update] = a list of global positions.") from None
    expect(len(plan) == new_world_size and all(len(rank) == steps for rank in plan),
           f"{call} returned {len(plan)} ranks x {[len(r) for r in plan][:6]} updates; expected {new_world_size} "
           f"ranks, each with {steps} updates.")
    return call, plan


def _plan_cases(seed: int) -> list[tuple]:
    b = 12
    return [(_saved(4, b, 2 + seed % 3), 3, 3), (_saved(4, b, 3 + seed % 2), 2, 2), (_saved(2, b, 1 + seed % 4), 4, 2),
            (_saved(3, b, 2), 6, 2), (_saved(4, b, 0), 3, 2)]


@graded_check("resume_plan continues from the global cursor: update u trains the u-th global batch after it")
def check_resume_plan_cursor(resume_plan, seed: int = 0) -> None:
    for saved, new_world_size, steps in _plan_cases(seed):
        call, plan = _plan(resume_plan, saved, new_world_size, steps, inputs_judged=True)
        cursor = sum(saved["samples_seen"])
        trained = sorted(p for rank in plan for update in rank for p in update)
        expected = list(range(cursor, cursor + len(trained)))
        if trained != expected:
            replayed = sorted({p for p in trained if p < cursor})
            twice = len(trained) - len(set(trained))
            skipped = sorted(set(range(cursor, max(trained, default=cursor))) - set(trained))
            found = [f"trains {len(replayed)} of them again (e.g. {replayed[:5]})" if replayed else "",
                     f"trains {twice} positions twice" if twice else "",
                     f"skips {len(skipped)} positions after the cursor (e.g. {skipped[:5]})" if skipped else ""]
            found = [f for f in found if f] or [f"trains {trained[:5]}... instead of {expected[:5]}..."]
            raise AssertionError(
                f"{call}: the {saved['world_size']} old ranks committed positions 0..{cursor - 1}, and the plan "
                f"{', '.join(found)}. A rank-local count ('rank r saw k samples of its slice') "
                f"names a place in a slice that no longer exists once the world size changes. Turn the saved counts "
                f"into one global cursor first, then deal out the positions after it.")
        updates = [sorted(p for rank in plan for p in rank[u]) for u in range(steps)]
        for u in range(steps - 1):
            if updates[u] and updates[u + 1] and updates[u][-1] > updates[u + 1][0]:
                raise AssertionError(
                    f"{call}: every position after the cursor is trained once, but not in order: update {u} trains "
                    f"position {updates[u][-1]} and update {u + 1} position {updates[u + 1][0]}, which comes before "
                    f"it. In order means that the u-th update trains the u-th global batch after the cursor, split "
                    f"among the ranks, as the run that never stopped did; the same positions in another order give "
                    f"other updates.")


@graded_check("resume_plan keeps the global batch: each update trains global_batch positions, split evenly")
def check_resume_plan_global_batch(resume_plan, seed: int = 0) -> None:
    for saved, new_world_size, steps in _plan_cases(seed):
        call, plan = _plan(resume_plan, saved, new_world_size, steps)
        sizes = [[len(rank[s]) for rank in plan] for s in range(steps)]
        want = saved["global_batch"] // new_world_size
        expect(all(size == want for update in sizes for size in update),
               f"{call}: per-rank batch sizes {sizes[0]} at the first update, {sum(sizes[0])} positions in all, "
               f"instead of {want} on each of the {new_world_size} ranks ({saved['global_batch']} in all). "
               f"Keeping the per-rank batch changes the global batch with the world size, so every later update "
               f"(its gradient noise, the step Adam takes per sample) differs from the run that never stopped. "
               f"Keep the global batch and divide it by the new world size.")


# ---------------------------------------------------------------------------------------------
# PreemptionGuard: real gloo ranks, and a scheduler process that decides when the SIGTERMs come

GLOBAL_BATCH = 12
# The scenarios a cluster produces, one job each: a notice to one rank in the middle of the run, and a node's
# worth of ranks signalled at once, as early as the first update (before any commit). The scheduler draws the
# rank(s) and the update itself, in its own process, after the ranks exist: nothing the ranks hold says which
# job is which, nor when.
JOBS = ("one", "first")
STORIES = {"one": "the scheduler's SIGTERM reached one of the {R} ranks in the middle of an update",
           "first": "the scheduler's SIGTERM reached two of the {R} ranks at once, during the first update, before "
                    "any commit"}


def _draw(job: str, steps: int, world_size: int, rng) -> dict:
    if job == "one":
        return {"ranks": [rng.randrange(1, world_size)], "update": rng.randrange(2, steps)}
    return {"ranks": sorted(rng.sample(range(world_size), 2)), "update": 1}


def _guarded_rank(guard_class, steps: int, rank: int, world_size: int, channel) -> dict:
    """A rank of a preemption job (engine.forked_ranks.rank_process runs it): trains with guard_class(save),
    calling at_commit() after each update; its report."""
    import torch.distributed as dist
    from .helpers import regression_data

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    X, y = regression_data(n=GLOBAL_BATCH * (steps + 1), seed=1)
    state = {"cursor": 0, "updates": 0}
    history = [[p.detach().clone() for p in model.parameters()]]   # weights after each committed update
    saves = []

    def save():
        weights = [p.detach().clone() for p in model.parameters()]
        match = next((u for u, w in enumerate(history) if all(torch.equal(a, b) for a, b in zip(w, weights))), None)
        saves.append({"cursor": state["cursor"], "updates": state["updates"], "weights_of_update": match})

    guard = guard_class(save)
    stopped_at = None
    for step in range(1, steps + 1):
        rows = list(range(state["cursor"] + rank, state["cursor"] + GLOBAL_BATCH, world_size))
        loss = torch.nn.functional.mse_loss(model(X[rows]), y[rows])
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():      # plain SGD by hand: torch.optim's first step imports torch._dynamo
                dist.all_reduce(p.grad)
                p -= 0.1 * p.grad / world_size
        state["updates"] += 1
        channel.mid_update()                          # the weights moved, the cursor has not
        state["cursor"] += GLOBAL_BATCH               # the update commits: weights, count and cursor agree
        history.append([p.detach().clone() for p in model.parameters()])
        if guard.at_commit():
            stopped_at = step
            break
    return {"stopped_at": stopped_at, "updates": state["updates"], "saves": saves}


def probe_preemption(guard_class, world_size: int, steps: int) -> list[dict]:
    """Two jobs at once, one per scenario of JOBS, each of ``world_size`` forked gloo ranks training with
    ``guard_class(save)`` and calling ``at_commit()`` after each update, under a scheduler process of its own
    that draws which rank(s) get a SIGTERM and in which update. Per job: the schedule it drew, the signals it
    sent, and per rank how it ended and its report."""
    return scheduled_jobs({job: (functools.partial(_guarded_rank, guard_class, steps),
                                 functools.partial(_draw, job, steps)) for job in JOBS},
                          world_size, deadline=40.0, prefix="preempt-")


_preemptions = Remembered(keep=4)


def _preemption(PreemptionGuard, world_size: int, steps: int) -> list[dict]:
    def run():
        with failing_if_raised("the ranks running PreemptionGuard"):
            return observe(probe_preemption, PreemptionGuard, world_size, steps)
    jobs = _preemptions((PreemptionGuard, world_size, steps), run)
    if any(rank["error"] == "NotImplementedError" for job in jobs for rank in job["ranks"]):
        raise NotImplementedError("PreemptionGuard")     # the stub: the runner says "not answered yet"
    for job in jobs:
        expect(job["schedule"] is not None and len(job["ranks"]) == world_size,
               f"The job in which {STORIES[job['job']].format(R=world_size)} did not report back: its ranks did not "
               f"end within 40 s.")
    return jobs


def _ending(rank: dict, notice: int) -> str:
    report = rank["report"]
    if report is None:
        return ("ended by the SIGTERM itself: no handler was installed" if rank["exit"] == -signal.SIGTERM
                else f"died ({rank['error'] or rank['exit']})")
    stopped = report["stopped_at"]
    if stopped is None:
        return f"never stopped (ran all {report['updates']} updates)"
    if stopped == notice:
        return "stopped at that update's commit"
    return (f"stopped {stopped - notice} commit{'s' * (stopped - notice > 1)} later" if stopped > notice
            else "stopped before the notice came")


def _summary(job: dict) -> str:
    notice, signalled = job["schedule"]["update"], set(job["schedule"]["ranks"])
    groups = [("the rank that got it" if len(signalled) == 1 else "the two that got it",
               [r for r in range(len(job["ranks"])) if r in signalled]),
              ("the other rank" if len(job["ranks"]) - len(signalled) == 1 else
               f"the other {len(job['ranks']) - len(signalled)}",
               [r for r in range(len(job["ranks"])) if r not in signalled])]
    parts = []
    for label, members in groups:
        endings = sorted({_ending(job["ranks"][r], notice) for r in members})
        parts.append(f"{label}: {' / '.join(endings)}")
    return "; ".join(parts)


def _story(job: dict, world_size: int) -> str:
    return STORIES[job["job"]].format(R=world_size)


@graded_check("PreemptionGuard stops every rank at the same commit, the first one after the notice")
def check_preemption_guard_same_boundary(PreemptionGuard, seed: int = 0, world_size: int = 3,
                                         notice: tuple | None = None, steps: int = 8) -> None:
    # `notice` is still accepted from test cells released before the scheduler drew the schedule itself.
    for job in _preemption(PreemptionGuard, world_size, steps):
        ranks, update, signalled = job["ranks"], job["schedule"]["update"], set(job["schedule"]["ranks"])
        stops = {r["report"]["stopped_at"] if r["report"] else None for r in ranks}
        if stops == {update} and all(r["exit"] == 0 for r in ranks):
            continue
        if any(ranks[r]["report"] is None and ranks[r]["exit"] == -signal.SIGTERM for r in signalled):
            trap = ("The SIGTERM found no handler and ended the rank on the spot (Python's default). "
                    + ("This notice came before the first commit: install the handler in __init__, before training "
                       "starts, not at the first at_commit." if job["job"] == "first" else
                       "Install the handler in __init__."))
        elif (all(ranks[r]["report"] and ranks[r]["report"]["stopped_at"] == update for r in signalled)
              and any(ranks[r]["report"] is None or ranks[r]["report"]["stopped_at"] != update
                      for r in range(len(ranks)) if r not in signalled)):
            trap = ("Only the rank that got the notice stopped; the others went on to the next collective and met a "
                    "dead peer. A flag is local to one process: at the commit, every rank must learn whether any rank "
                    "got a notice (one all_reduce of the flags).")
        elif all(r["report"] and r["report"]["stopped_at"] is None for r in ranks):
            trap = ("No rank stopped: the scheduler's SIGKILL at the end of the grace period would take the job, and "
                    "every update since the last checkpoint with it. One rank's notice must stop all ranks"
                    + (", and notices can reach several ranks at once" if len(signalled) > 1 else "")
                    + ": how do your ranks combine their flags?")
        elif any(r["error"] for r in ranks):
            trap = ("A rank ended outside the commit: a signal handler that saves or exits runs in the middle of "
                    "whatever the rank was doing, and the other ranks wait for it in a collective that never comes. "
                    "Let the handler only set a flag.")
        else:
            trap = ("The ranks must stop together at the first commit after the notice: the grace period is short, "
                    "and ranks that stop at different updates leave checkpoints that disagree.")
        raise AssertionError(f"{world_size} ranks; {_story(job, world_size)}: {_summary(job)}. {trap}")


def _torn(record: dict) -> str | None:
    """What is wrong with a saved record, in words that do not depend on the update: None when weights,
    count and cursor all belong to one commit."""
    weights, count, cursor = record["weights_of_update"], record["updates"], record["cursor"] // GLOBAL_BATCH
    if weights is None:
        return "weights that belong to no commit"
    if weights == count == cursor and record["cursor"] % GLOBAL_BATCH == 0:
        return None
    ahead = weights - cursor
    return (f"weights {ahead} update{'s' * (abs(ahead) != 1)} {'ahead of' if ahead >= 0 else 'behind'} its cursor "
            f"(and {count - cursor:+d} in its update count)")


@graded_check("PreemptionGuard has every rank save once, at that commit: weights, count and cursor of one update")
def check_preemption_guard_saves(PreemptionGuard, seed: int = 0, world_size: int = 3, notice: tuple | None = None,
                                 steps: int = 8) -> None:
    for job in _preemption(PreemptionGuard, world_size, steps):
        story, signalled = _story(job, world_size), set(job["schedule"]["ranks"])
        # the ranks that got the notice first: which rank numbers they have is the scheduler's draw
        order = sorted(range(len(job["ranks"])), key=lambda r: r not in signalled)
        for rank, seen in ((r, job["ranks"][r]) for r in order):
            who = "a rank that got the notice" if rank in signalled else "a rank that did not get it"
            for record in (seen["report"] or {}).get("saves", []):
                torn = _torn(record)
                expect(torn is None,
                       f"{world_size} ranks; {story}: {who} saved {torn}: a state from the middle of an update. A "
                       f"signal handler runs between two lines of the training loop, wherever it happens to be; a "
                       f"save inside it writes a half-done update, and on that one rank only. Save at the commit.")
        for rank, seen in ((r, job["ranks"][r]) for r in order):
            who = "a rank that got the notice" if rank in signalled else "a rank that did not get it"
            expect(seen["report"] is not None,
                   f"{world_size} ranks; {story}: {who} {_ending(seen, job['schedule']['update'])}, so its saves are "
                   f"unknown. A preemption handler must leave one checkpoint that every rank wrote, at the same "
                   f"commit.")
            saves = seen["report"]["saves"]
            expect(len(saves) == 1,
                   f"{world_size} ranks; {story}: {who} saved {len(saves)} times. Every rank must save exactly once, "
                   f"at the commit where all of them stop: a checkpoint missing one rank's shard is not a checkpoint.")
