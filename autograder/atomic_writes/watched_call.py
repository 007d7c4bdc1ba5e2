"""Watching one call of the learner's ``atomic_save`` from outside: what got synced, when, holding how many
bytes; what ``path`` held meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import torch

from ..checking import expect, observe
from ..helpers import recording_global_rngs
from ..engine.file_operations import content_digest, recorded_file_operations
from .checkpoints import CHECKPOINT_NAME, _first_sentence, _new_scratch, _tempfile_folder_of, classify, make_checkpoint


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
