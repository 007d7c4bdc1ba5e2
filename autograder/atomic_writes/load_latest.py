"""Checks for notebook 05's ``load_latest_checkpoint(directory)``: folders of ``step_<n>.pt`` files the check
writes, some of them as crashes leave them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from pathlib import Path

import torch

from ..checking import expect, graded_check, returned_path
from .checkpoints import CHECKPOINT_SUFFIX, TEMP_SUFFIX, _first_sentence, holds_drawn, make_checkpoint
from .watched_call import _scratch_directory


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


def _returned_folder(result) -> str | None:
    if isinstance(result, tuple) and len(result) == 2:
        with contextlib.suppress(TypeError):
            return os.path.dirname(os.fspath(result[0]))
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
        with _scratch_directory() as restored:  # the run's folder restored from a copy made latest step first
            _expect_own_folder(load_latest_checkpoint, restored, directory, steps, seed)


def _expect_own_folder(load_latest_checkpoint, directory, earlier, steps, seed) -> None:
    """The restored copy, judged while the folder of the call before still exists."""
    written = _write_checkpoints(directory, steps[::-1], seed)
    latest = os.path.join(directory, f"step_{steps[-1]}.pt")
    last_modified = list(written)[-1]
    result, _ = _call_loader(load_latest_checkpoint, directory)
    if _returned_folder(result) == earlier:
        raise AssertionError(
            f"Called on a second folder, load_latest_checkpoint returned {_returned_name(result)!r} of the "
            f"folder its previous call was given: something kept from call to call (a mutable default "
            f"argument such as `steps={{}}`, a module-level cache) still lists that folder's checkpoints. "
            f"Build every list and dict inside the function, for the `directory` of this call.")
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
        # Complete, but it holds an object torch.load(weights_only=True) refuses: unpickling it runs code.
        unsafe = os.path.join(directory, f"step_{max(steps) + 3}.pt")
        torch.save({**make_checkpoint(max(steps) + 3, layers=2, layer_kib=4, seed=seed),
                    "args": argparse.Namespace(lr=0.1)}, unsafe)
        os.utime(truncated, (later, later))
        os.utime(empty, (later + 60, later + 60))
        os.utime(unsafe, (later + 120, later + 120))
        result, messages = _call_loader(
            load_latest_checkpoint, directory,
            "A damaged checkpoint can make torch.load raise more than one kind of exception (an empty file "
            "raises EOFError, a truncated one RuntimeError): skipping a bad file must not depend on which.")
        if _returned_name(result) == os.path.basename(unsafe):
            raise AssertionError(
                f"load_latest_checkpoint returned {os.path.basename(unsafe)!r}, which torch.load(path, "
                f"weights_only=True) refuses: it holds an argparse.Namespace, and loading it took weights_only=False, "
                f"which unpickles arbitrary objects and so runs code from the file. A checkpoint that does not load "
                f"with weights_only=True is one to skip (with a warning), never to load another way.")
        _expect_result(result, good, written[good],
                       "The three newest files are a truncated and an empty checkpoint (crashed writes) and one "
                       "that torch.load(weights_only=True) refuses")
        gone = [os.path.basename(p) for p in (truncated, empty, unsafe) if not os.path.exists(p)]
        expect(not gone,
               f"load_latest_checkpoint deleted {', '.join(gone)}, which it could not load. Skip such a file and keep "
               f"it: a damaged checkpoint is the evidence of what crashed, and one that weights_only=True refuses may "
               f"hold a whole run. Only .tmp files (never committed) are removed.")
        for skipped in (truncated, empty, unsafe):
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
        hidden_temp = os.path.join(directory, f".step_{max(steps) + 2}.pt.x7q2m{TEMP_SUFFIX}")   # a dot-file
        Path(hidden_temp).write_bytes(b"PK\x03\x04 a writer's hidden temp file")
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
                f"temp file was never renamed into place, so it was never a durable checkpoint, even when it "
                f"happens to load. Only *{CHECKPOINT_SUFFIX} files are checkpoints.")
        _expect_result(result, good, written[good], "Next to temp files left by crashed writers")
        left = sorted(n for n in os.listdir(directory) if n.endswith(TEMP_SUFFIX))
        expect(left != [os.path.basename(hidden_temp)],
               f"load_latest_checkpoint left {os.path.basename(hidden_temp)!r} in place: its name begins with a dot, "
               f"which glob's `*` does not match (glob.glob and the shell skip hidden files). A writer may hide its "
               f"temp file so: list the folder (os.listdir) and remove every name that ends in {TEMP_SUFFIX}.")
        expect(not left, f"load_latest_checkpoint left the temp files {', '.join(left)} in place: crashed writers' "
                         f"leftovers pile up with every crash. Remove them.")
        expect(os.path.exists(notes), "load_latest_checkpoint removed notes.txt, which is not a temp file.")
