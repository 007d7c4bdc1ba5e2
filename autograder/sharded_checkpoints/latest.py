"""Checks for notebook 09's ``latest_checkpoint(run_dir)``: run folders written with real DCP saves, left as
crashes leave them; the path it returns is judged as text.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checking import expect, failing_if_raised, graded_check, placed_path
from ..engine.file_operations import folder_tree
from .folders import POINTER, _scratch, _write_pointer, _write_step


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
        _expect_folder(got, good, f"With {good.name} durable and step_{4 * base} holding every rank's shard but "
                       f"no .metadata (a rank was killed before the coordinator wrote it)",
                       "A folder with shards and no marker looks like a checkpoint but is not one: DCP writes "
                       ".metadata last, only once every rank's shard is on disk, and dcp.load cannot read a folder "
                       "without it. Which file says a step folder is a durable checkpoint?")
        _expect_untouched(before, run_dir)
    with _scratch() as run_dir:
        good = _write_step(run_dir, base, seed)
        empty = _write_step(run_dir, base + 2, seed, "empty_marker")
        truncated = _write_step(run_dir, base + 3 + seed % 2, seed, "truncated_marker")
        _write_pointer(run_dir, good.name)
        before = folder_tree(run_dir)
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, good, f"With {good.name} durable, {empty.name} whose .metadata is empty (0 bytes) and "
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
                       "A temp file is not the marker: the checkpoint is durable only once .metadata itself "
                       "exists. With no durable checkpoint, return None (start from scratch).")


@graded_check("latest_checkpoint returns the durable step folder with the largest step, even when `latest` lags")
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
        trap = ("The job crashed after DCP wrote the newer folder's .metadata and before `latest` moved to it: the "
                "pointer lags, the folders do not. Compare the steps of the durable folders (numbers, not names: "
                "'step_10' < 'step_9' as text).")
        _expect_folder(got, newer, f"With {older.name} and {newer.name} both durable and `latest` still "
                       f"naming {older.name}", trap)
        (run_dir / POINTER).unlink()
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, newer, f"With {older.name} and {newer.name} durable and no `latest` file", trap)
        later = newer.stat().st_mtime + 60    # a clean-up, a copy or a restore touched the older folder
        os.utime(older, (later, later))
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, newer, f"With {older.name} and {newer.name} durable and {older.name} modified last "
                       f"(a clean-up wrote into it)", "A folder's modification time is not its step: cleaning up, "
                       "copying or restoring a folder changes it. Compare the steps in the folder names.")
