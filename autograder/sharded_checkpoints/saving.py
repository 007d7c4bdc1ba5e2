"""Checks for notebook 09's ``save_checkpoint(state, run_dir, step)``, in two probes: three saves on one run
folder in one process, every fsync, rename and symlink watched; and saves on three real gloo ranks, each
holding its own rows of every tensor.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from ..checking import Remembered, expect, failing_if_raised, graded_check, observe
from ..engine.file_operations import RenameWatch, folder_tree, inode_of, noting_renames_onto
from ..engine.forked_ranks import (fork_ranks, forked_report, quiet_distributed, rank_reports, reap, reporting_rank,
                                   warm_dcp)
from .folders import (METADATA, POINTER, _committed_folder, _folders, _load_folder, _loaded, _read_pointer, _same_state,
                      _scratch, _state)


# ---------------------------------------------------------------------------------------------
# in one process: three saves on one run folder, every file operation watched

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


def _pointer_text(run_dir: Path) -> str | None:
    """What ``latest`` holds, as written (``_read_pointer`` strips it)."""
    path = run_dir / POINTER
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()[:200].decode("utf-8", "replace")


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
            "pointer_text": _pointer_text(run_dir),
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


def _pointer_renames(save: dict, run_dir: str) -> list[dict]:
    target = os.path.abspath(os.path.join(run_dir, POINTER))
    return [(i, e) for i, e in enumerate(save["events"]) if e["op"] == "rename" and e["dst"] == target and e["ok"]]


@graded_check("save_checkpoint writes each step into a new step_<n> folder and keeps the durable one until "
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
                f"Saving step {seen['steps'][1]} rewrote the durable checkpoint {folder!r} in place. While DCP "
                f"rewrites a folder, its old .metadata describes shards that are being replaced, and torch removes "
                f"it just before renaming the new one: a crash then leaves no durable checkpoint, or one whose "
                f"marker lies. Write every step into a new folder, and leave the last durable one untouched.")
        gone = sorted(name for name in before if name not in event["tree"])
        changed = sorted(name for name in before if name in event["tree"] and event["tree"][name] != before[name])
        if gone or changed:
            raise AssertionError(
                f"When DCP wrote {folder!r}'s .metadata, the previous checkpoint {(gone or changed)[0]!r} was already "
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


@graded_check("save_checkpoint moves `latest` after DCP's .metadata, by notebook 05's recipe: a unique temp file in "
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
           f"name of the folder just saved ({new!r}): the pointer holds the newest durable folder's name (a "
           f"name, not a path, so that a run folder that is copied or moved keeps working).")
    expect(second["pointer_text"] in (new, new + "\n"),
           f"After save_checkpoint(state, run_dir, {step}), run_dir/latest holds {second['pointer_text']!r}: the "
           f"pointer holds exactly the folder's name ({new!r}), with at most one newline after it. A reader that "
           f"takes the file as written (open(...).read(), or .rstrip('\\n')) looks for a folder named "
           f"{second['pointer_text'].rstrip(chr(10))!r}, which does not exist.")
    renames = _pointer_renames(second, run_dir)
    expect(renames and second["pointer_inode"] != first["pointer_inode"],
           "`latest` was written in place (open(...).write), not renamed into place: a crash or a reader in the "
           "middle of that write sees an empty or half-written pointer. Apply notebook 05's rule: write a temp "
           "file, fsync it, os.replace it onto latest.")
    early = [e for _, e in renames if not e["committed"]]
    expect(not early,
           f"`latest` moved to {early[0]['pointer'] if early else ''!r} before that folder held .metadata: the "
           f"pointer was ahead of the checkpoint. A crash right then leaves a pointer to a partial checkpoint. Move it "
           f"only after dcp.save returned (an async_save's folder is a checkpoint only once its future is done).")
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


@graded_check("save_checkpoint makes the checkpoint durable before `latest` moves: .metadata and its step folder fsynced")
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
# on real ranks: who writes which shard, who moves the pointer

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
           f"the checkpoint is durable: another rank's move can come before rank 0's fsyncs, and several writers race "
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
