"""Checks for notebook 09: checkpoints across ranks.

Conventions the notebook states: a run folder holds one folder per checkpoint, ``step_<n>``
(n the number of committed updates), each written by ``torch.distributed.checkpoint``
(DCP), whose coordinator writes ``.metadata`` last: a step folder is *committed* when it
holds ``.metadata``. Next to them, the file ``latest`` holds the name of the newest
committed folder (``step_<n>``), replaced atomically.

``latest_checkpoint`` is judged on run folders the check writes with real DCP saves and
leaves as crashes leave them (a folder whose ``.metadata`` never came, one with only
``.metadata.tmp``, a pointer that lags). ``save_checkpoint`` runs in a probe, twice on one
run folder, with ``os.replace`` / ``os.rename`` watched during the second call; the probe
loads what the folders hold (DCP's ``.metadata`` is a pickle: the grading process never
loads one the learner's code wrote) and reports it with the files' digests. ``resume_plan``
is judged on the positions it returns. ``PreemptionGuard`` runs inside real gloo ranks forked
by a probe; the scheduler's SIGTERM reaches one rank in the middle of an update.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from .checking import Remembered, expect, failing_if_raised, graded_check, observe, silence_this_process

METADATA = ".metadata"
POINTER = "latest"


def quiet_distributed() -> None:
    """Silence what torch.distributed says on the side (a single-process DCP save warns that no process
    group exists; FSDP2 and DCP log at INFO) in the process that calls it: the learner sees none of it."""
    import logging
    import warnings
    warnings.filterwarnings("ignore", module=r"torch\.distributed.*")
    warnings.filterwarnings("ignore", message=".*torch.distributed.*")
    for name in ("torch.distributed", "torch.distributed.checkpoint"):
        logging.getLogger(name).setLevel(logging.ERROR)


_quiet_distributed = quiet_distributed


# ---------------------------------------------------------------------------------------------
# latest_checkpoint

def _state(seed: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return {"model": {"0.weight": torch.randn(16, 8, generator=g), "0.bias": torch.randn(16, generator=g)},
            "train": {"cursor": 12 * step}}


def _write_step(run_dir: Path, step: int, seed: int, how: str = "committed") -> Path:
    """A real single-process DCP save of step_<step>; 'no_marker' then takes .metadata away (a rank died
    before the coordinator wrote it), 'tmp_marker' leaves only .metadata.tmp (the coordinator died
    writing it)."""
    import torch.distributed.checkpoint as dcp
    _quiet_distributed()
    folder = run_dir / f"step_{step}"
    dcp.save(_state(seed, step), checkpoint_id=folder)
    if how == "no_marker":
        (folder / METADATA).unlink()
    elif how == "tmp_marker":
        (folder / METADATA).rename(folder / (METADATA + ".tmp"))
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


def _call_loader(latest_checkpoint, run_dir: Path):
    with failing_if_raised(f"latest_checkpoint({str(run_dir)!r})"):
        result = latest_checkpoint(str(run_dir))
    if result is None:
        return None
    expect(isinstance(result, (str, os.PathLike)),
           f"latest_checkpoint should return the path of a step folder (a str) or None, not {type(result).__name__}.")
    path = Path(os.fspath(result))
    if not path.is_absolute() and not path.exists() and (run_dir / path).exists():
        raise AssertionError(f"latest_checkpoint returned {os.fspath(result)!r}, a name, not a path: return the "
                             f"folder's path inside run_dir, which a caller can hand to dcp.load as it is.")
    return path


def _named(path) -> str:
    return "None" if path is None else repr(Path(path).name)


def _expect_folder(got, expected: Path | None, situation: str, trap: str) -> None:
    same = (got is None and expected is None) or (
        got is not None and expected is not None and got.exists() and got.samefile(expected))
    expect(same, f"{situation}, latest_checkpoint returned {_named(got)} instead of {_named(expected)}. {trap}")


@graded_check("latest_checkpoint never returns a step folder without DCP's .metadata (a partial checkpoint)")
def check_latest_checkpoint_committed(latest_checkpoint, seed: int = 0) -> None:
    base = 2 + seed % 3
    with _scratch() as run_dir:
        good = _write_step(run_dir, 2 * base, seed)
        _write_step(run_dir, 4 * base, seed, "no_marker")
        _write_pointer(run_dir, good.name)
        got = _call_loader(latest_checkpoint, run_dir)
        _expect_folder(got, good, f"With {good.name} committed and step_{4 * base} holding every rank's shard but "
                       f"no .metadata (a rank was killed before the coordinator wrote it)",
                       "A folder with shards and no marker looks like a checkpoint but is not one: DCP writes "
                       ".metadata last, only once every rank's shard is on disk, and dcp.load cannot read a folder "
                       "without it. Which file says a step folder is committed?")
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
# save_checkpoint: a probe calls it twice on one run folder and watches the second call

def _digests(folder: Path) -> dict[str, str]:
    out = {}
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(folder))] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


def _committed_folder(run_dir: Path, name: str) -> bool:
    return bool(name) and "/" not in name and (run_dir / name / METADATA).is_file()


def _read_pointer(run_dir: Path) -> str | None:
    path = run_dir / POINTER
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()[:200].decode("utf-8", "replace").strip()


@contextlib.contextmanager
def _watched_renames(run_dir: Path):
    """Record each os.replace / os.rename: its target, and, for one onto `latest`, what the pointer then
    holds and whether the folder it names is committed at that moment."""
    events: list[dict] = []
    originals = {name: getattr(os, name) for name in ("replace", "rename")}

    def wrap(name):
        def wrapper(src, dst, *args, **kwargs):
            result = originals[name](src, dst, *args, **kwargs)
            target = os.path.abspath(os.fspath(dst))
            event = {"call": name, "target": os.path.basename(target)}
            if target == os.path.abspath(run_dir / POINTER):
                held = _read_pointer(run_dir)
                event.update(pointer=held, committed=_committed_folder(run_dir, held or ""))
            events.append(event)
            return result
        return wrapper

    for name in originals:
        setattr(os, name, wrap(name))
    try:
        yield events
    finally:
        for name, original in originals.items():
            setattr(os, name, original)


def _load_folder(folder: Path, like: dict) -> dict | None:
    import torch.distributed.checkpoint as dcp
    if not (folder / METADATA).is_file():
        return None
    template = {"model": {k: torch.zeros_like(v) for k, v in like["model"].items()}, "train": {"cursor": -1}}
    dcp.load(template, checkpoint_id=folder)
    return template


def probe_two_saves(save_checkpoint, run_dir: str, first: dict, second: dict, steps: list) -> dict:
    """save_checkpoint(first, run_dir, steps[0]), then save_checkpoint(second, run_dir, steps[1]) with renames
    watched. Reports the files of run_dir (with digests) after each call, the renames of the second call, what
    `latest` holds and its inode around the second call, and what each step folder loads as."""
    _quiet_distributed()
    run_dir = Path(run_dir)
    save_checkpoint(first, str(run_dir), steps[0])
    after_first = {p.name: _digests(p) for p in run_dir.iterdir() if p.is_dir()}
    pointer_first = _read_pointer(run_dir)
    inode_before = os.stat(run_dir / POINTER).st_ino if (run_dir / POINTER).is_file() else None
    with _watched_renames(run_dir) as events:
        save_checkpoint(second, str(run_dir), steps[1])
    after_second = {p.name: _digests(p) for p in run_dir.iterdir() if p.is_dir()}
    loaded = {}
    for name in after_second:
        try:
            loaded[name] = _load_folder(run_dir / name, first)
        except BaseException as exc:  # a folder DCP cannot read (CheckpointException is a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            loaded[name] = f"{type(exc).__name__}"
    return {"after_first": after_first, "after_second": after_second, "pointer_first": pointer_first,
            "pointer": _read_pointer(run_dir), "pointer_is_file": (run_dir / POINTER).is_file(),
            "inode_before": inode_before,
            "inode_after": os.stat(run_dir / POINTER).st_ino if (run_dir / POINTER).is_file() else None,
            "renames": events, "loaded": loaded}


_saves = Remembered(keep=4)


def _two_saves(save_checkpoint, seed: int) -> dict:
    steps = [4 + 4 * (seed % 3), 8 + 4 * (seed % 3)]

    def run():
        with _scratch() as run_dir:
            with failing_if_raised("save_checkpoint(state, run_dir, step)"):
                seen = observe(probe_two_saves, save_checkpoint, str(run_dir), _state(seed, steps[0]),
                               _state(seed, steps[1]), steps)
        seen["steps"] = steps
        return seen
    return _saves((save_checkpoint, seed), run)


def _same_state(loaded, expected: dict) -> bool:
    return (isinstance(loaded, dict) and loaded.get("train", {}).get("cursor") == expected["train"]["cursor"]
            and all(torch.is_tensor(loaded["model"].get(k)) and torch.equal(loaded["model"][k], v)
                    for k, v in expected["model"].items()))


@graded_check("save_checkpoint writes each step into a new step_<n> folder and leaves the committed one alone")
def check_save_checkpoint_new_folder(save_checkpoint, seed: int = 0) -> None:
    seen = _two_saves(save_checkpoint, seed)
    first, second = (f"step_{n}" for n in seen["steps"])
    rewritten = {name: sorted(k for k, v in files.items() if seen["after_second"].get(name, {}).get(k) != v)
                 for name, files in seen["after_first"].items()}
    rewritten = {name: files for name, files in rewritten.items() if files}
    if rewritten:
        name, files = next(iter(rewritten.items()))
        raise AssertionError(
            f"Saving step {seen['steps'][1]} rewrote the committed checkpoint {name!r} in place (changed: "
            f"{', '.join(files[:4])}). While DCP rewrites a folder, its old .metadata describes shards that are being "
            f"replaced, and torch removes it just before renaming the new one: a crash then leaves no committed "
            f"checkpoint, or one whose marker lies. Write every step into a new folder, and leave the last "
            f"committed one untouched.")
    for step, name, after in ((seen["steps"][0], first, seen["after_first"]), (seen["steps"][1], second,
                                                                               seen["after_second"])):
        expect(name in after,
               f"After save_checkpoint(state, run_dir, {step}), run_dir holds the folders {sorted(after)} but no "
               f"{name!r}: each checkpoint goes into run_dir/step_<step>, the name the loader looks for.")
        expect(_same_state(seen["loaded"].get(name), _state(seed, step)),
               f"After the second save, {name!r} does not load as the state saved at step {step} "
               f"({'no .metadata' if seen['loaded'].get(name) is None else 'other contents'}): dcp.save(state, "
               f"checkpoint_id=run_dir/step_<step>) writes it, .metadata last.")


@graded_check("save_checkpoint moves `latest` to the new folder atomically, after DCP committed it")
def check_save_checkpoint_pointer(save_checkpoint, seed: int = 0) -> None:
    seen = _two_saves(save_checkpoint, seed)
    held = seen["pointer"]
    expect(seen["pointer_is_file"] and held in seen["loaded"]
           and _same_state(seen["loaded"][held], _state(seed, seen["steps"][1])),
           f"After save_checkpoint(state, run_dir, {seen['steps'][1]}), run_dir/latest holds {held!r}, which is not "
           f"the name of the folder just saved: the pointer holds the newest committed folder's name (a name, "
           f"not a path, so that a run folder that is copied or moved keeps working).")
    onto = [e for e in seen["renames"] if e["target"] == POINTER]
    expect(onto and seen["inode_after"] != seen["inode_before"],
           "`latest` was written in place (open(...).write), not renamed into place: a crash or a reader in the "
           "middle of that write sees an empty or half-written pointer. Apply notebook 05's rule: write "
           "latest.tmp, fsync it, os.replace it onto latest.")
    early = [e for e in onto if not e["committed"]]
    expect(not early,
           f"`latest` moved to {early[0]['pointer'] if early else ''!r} before that folder held .metadata: the "
           f"pointer was ahead of the commit. A crash right then leaves a pointer to a partial checkpoint. Move "
           f"it only after dcp.save returned (every rank's shard and the metadata are on disk).")


# ---------------------------------------------------------------------------------------------
# resume_plan

def _saved(world_size: int, global_batch: int, updates: int) -> dict:
    return {"world_size": world_size, "global_batch": global_batch,
            "samples_seen": [updates * global_batch // world_size] * world_size}


def _plan(resume_plan, saved: dict, new_world_size: int, steps: int) -> tuple[str, list]:
    call = f"resume_plan({saved!r}, new_world_size={new_world_size}, steps={steps})"
    with failing_if_raised(call):
        plan = resume_plan(dict(saved, samples_seen=list(saved["samples_seen"])), new_world_size, steps)
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
            (_saved(3, b, 2), 6, 2)]


@graded_check("resume_plan continues from the global cursor: every position after it once, none before it")
def check_resume_plan_cursor(resume_plan, seed: int = 0) -> None:
    for saved, new_world_size, steps in _plan_cases(seed):
        call, plan = _plan(resume_plan, saved, new_world_size, steps)
        cursor = sum(saved["samples_seen"])
        trained = sorted(p for rank in plan for update in rank for p in update)
        expected = list(range(cursor, cursor + len(trained)))
        if trained == expected:
            continue
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
# PreemptionGuard: real gloo ranks, forked by the probe

GLOBAL_BATCH = 12


def _guarded_rank(guard_class, rank: int, world_size: int, notice: tuple, steps: int, workdir: str) -> dict:
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
        if (rank, step) == tuple(notice):
            os.kill(os.getpid(), signal.SIGTERM)     # the scheduler's notice lands mid-update
        state["cursor"] += GLOBAL_BATCH              # the update commits: weights, count and cursor agree
        history.append([p.detach().clone() for p in model.parameters()])
        if guard.at_commit():
            stopped_at = step
            break
    return {"stopped_at": stopped_at, "updates": state["updates"], "saves": saves}


def _first_line(exc: BaseException) -> str:
    """How a rank ended, in words that are the same on every run (no ports, no C++ locations): a rank whose
    peer is gone fails inside gloo with a RuntimeError (or a subclass), worded after the socket's fate."""
    if isinstance(exc, NotImplementedError):     # a RuntimeError too: the answer cell's stub
        return "NotImplementedError"
    if isinstance(exc, RuntimeError):
        return "a collective failed: a peer was gone"
    return type(exc).__name__


def _rank_process(guard_class, rank, world_size, notice, steps, workdir) -> None:
    code = 1
    try:
        silence_this_process()
        _quiet_distributed()
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        import torch.distributed as dist
        store = dist.FileStore(os.path.join(workdir, "store"), world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=10))
        report = _guarded_rank(guard_class, rank, world_size, notice, steps, workdir)
        Path(workdir, f"rank{rank}.json").write_text(json.dumps(report))
        code = 0
    except BaseException as exc:
        with contextlib.suppress(Exception):
            Path(workdir, f"rank{rank}.error").write_text(_first_line(exc))
    finally:
        os._exit(code)


def probe_preemption(guard_class, world_size: int, notice: list, steps: int, deadline: float = 20.0) -> list[dict]:
    """Fork ``world_size`` gloo ranks that train with ``guard_class(save)`` and call ``at_commit()`` after each
    update; SIGTERM reaches rank notice[0] during update notice[1]. Per rank: how it ended, its report."""
    workdir = tempfile.mkdtemp(prefix="preempt-")
    pids = []
    try:
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                _rank_process(guard_class, rank, world_size, notice, steps, workdir)
            pids.append(pid)
        codes, end = {}, time.monotonic() + deadline
        while len(codes) < len(pids) and time.monotonic() < end:
            for rank, pid in enumerate(pids):
                if rank not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[rank] = os.waitstatus_to_exitcode(status)
            time.sleep(0.005)
        ranks = []
        for rank, pid in enumerate(pids):
            if rank not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            report_path, error_path = Path(workdir, f"rank{rank}.json"), Path(workdir, f"rank{rank}.error")
            ranks.append({"exit": codes.get(rank, "killed at the deadline"),
                          "report": json.loads(report_path.read_text()) if report_path.exists() else None,
                          "error": error_path.read_text() if error_path.exists() else None})
        return ranks
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_preemptions = Remembered(keep=4)


def _preemption(PreemptionGuard, world_size: int, notice: tuple, steps: int) -> list[dict]:
    def run():
        with failing_if_raised("the ranks running PreemptionGuard"):
            return observe(probe_preemption, PreemptionGuard, world_size, list(notice), steps)
    ranks = _preemptions((PreemptionGuard, world_size, notice, steps), run)
    if any(rank["error"] == "NotImplementedError" for rank in ranks):
        raise NotImplementedError("PreemptionGuard")     # the stub: the runner says "not answered yet"
    return ranks


def _story(world_size: int, notice: tuple) -> str:
    return (f"{world_size} ranks; the scheduler's SIGTERM reached rank {notice[0]} in the middle of update "
            f"{notice[1]}")


def _ending(rank: dict) -> str:
    report = rank["report"]
    if report is None:
        return f"died ({rank['error'] or rank['exit']})"
    if report["stopped_at"] is None:
        return f"never stopped (ran all {report['updates']} updates)"
    return f"stopped after update {report['stopped_at']}"


@graded_check("PreemptionGuard stops every rank at the same commit, the first one after the notice")
def check_preemption_guard_same_boundary(PreemptionGuard, seed: int = 0, world_size: int = 3,
                                         notice: tuple = (1, 3), steps: int = 8) -> None:
    ranks = _preemption(PreemptionGuard, world_size, tuple(notice), steps)
    endings = [_ending(r) for r in ranks]
    summary = "; ".join(f"rank {r}: {e}" for r, e in enumerate(endings))
    stops = {r["report"]["stopped_at"] if r["report"] else None for r in ranks}
    if stops == {notice[1]} and all(r["exit"] == 0 for r in ranks):
        return
    if None in stops and any(r["report"] and r["report"]["stopped_at"] == notice[1] for r in ranks):
        trap = ("Only the rank that got the notice stopped; the others went on to the next collective and met a "
                "dead peer. A flag is local to one process: at the commit, every rank must learn whether any rank "
                "got a notice (one all_reduce of the flags).")
    elif all(r["report"] and r["report"]["stopped_at"] is None for r in ranks):
        trap = ("No rank stopped: the scheduler's SIGKILL at the end of the grace period would take the job, and "
                "every update since the last checkpoint with it. One rank's notice must stop all ranks: how do "
                "your ranks combine their flags?")
    elif any(r["error"] for r in ranks):
        trap = ("A rank ended outside the commit: a signal handler that saves or exits runs in the middle of "
                "whatever the rank was doing, and the other ranks wait for it in a collective that never comes. "
                "Let the handler only set a flag.")
    else:
        trap = ("The ranks must stop together at the first commit after the notice: the grace period is short, "
                "and ranks that stop at different updates leave checkpoints that disagree.")
    raise AssertionError(f"{_story(world_size, tuple(notice))}: {summary}. {trap}")


@graded_check("PreemptionGuard has every rank save once, at that commit: weights, count and cursor of one update")
def check_preemption_guard_saves(PreemptionGuard, seed: int = 0, world_size: int = 3, notice: tuple = (1, 3),
                                 steps: int = 8) -> None:
    ranks = _preemption(PreemptionGuard, world_size, tuple(notice), steps)
    story = _story(world_size, tuple(notice))
    for rank, seen in enumerate(ranks):
        for record in (seen["report"] or {}).get("saves", []):
            torn = (record["weights_of_update"] != record["updates"]
                    or record["cursor"] != record["updates"] * GLOBAL_BATCH)
            expect(not torn,
                   f"{story}: rank {rank} saved "
                   f"{'weights of no committed update' if record['weights_of_update'] is None else 'the weights of update ' + str(record['weights_of_update'])} with "
                   f"{record['updates']} updates counted and a cursor of {record['cursor']} positions "
                   f"({record['cursor'] // GLOBAL_BATCH} updates): a state from the middle of an update. A signal "
                   f"handler runs between two lines of the training loop, wherever it happens to be; a save "
                   f"inside it writes a half-done update, and on that one rank only. Save at the commit.")
    for rank, seen in enumerate(ranks):
        expect(seen["report"] is not None,
               f"{story}: rank {rank} {_ending(seen)}, so its saves are unknown. A preemption handler must leave one "
               f"checkpoint that every rank wrote, at the same commit.")
        saves = seen["report"]["saves"]
        expect(len(saves) == 1,
               f"{story}: rank {rank} saved {len(saves)} times. Every rank must save exactly once, at the commit "
               f"where all of them stop: a checkpoint missing one rank's shard is not a checkpoint.")
