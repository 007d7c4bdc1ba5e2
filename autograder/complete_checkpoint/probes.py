"""Notebook 03's fresh processes and probes: run where the learner's functions live (in graded mode, the
sandbox), they train, save with the learner's ``save_checkpoint`` in a forked child, resume with its
``load_checkpoint`` in a fresh process, and return data.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable

from ..engine import fresh_process, fresh_runs
from ..engine.fresh_runs import preserved_rngs, scramble_rngs
from ..engine.travel import copy_regular_files, recording_writes_outside
from ..helpers import watch
from .trainer import Trainer, make_trainer, snapshot, train_steps


# ---- a fresh process -------------------------------------------------------------------------

def run_in_fresh_process(task: Callable[[], object], timeout: float = 20.0, readable=()):
    """``task()`` in a fresh process with scrambled RNGs, this package warmed up there (engine.fresh_runs)."""
    return fresh_runs.run_in_fresh_process(task, timeout, readable, preload=__package__)


def warm_up_fresh_processes() -> None:
    """In the server of fresh processes (engine/fresh_server._warm): a resume's first steps, imported once there."""
    with preserved_rngs():
        train_steps(make_trainer(0), 1)


# ---- probes: run where the learner's functions live, return data ------------------------------

def _trainer_parts(trainer: Trainer):
    """The trainer and the objects it trains with, as helpers.watch names them."""
    return lambda: {"trainer": trainer, **{f"trainer.{name}": getattr(trainer, name)
                                           for name in ("model", "optimizer", "scheduler", "scaler", "loader")}}


def _save_and_train_on(save_checkpoint, path: str, seed: int, k: int, after: int) -> dict:
    """In a forked child: train ``k`` steps, save, train ``after`` more (see probe_save)."""
    trainer = make_trainer(seed)
    train_steps(trainer, k)
    changed = watch(_trainer_parts(trainer), replaceable=False)
    returned = save_checkpoint(path, trainer)
    tampering = changed()
    return {"returned": None if returned is None else type(returned).__name__,
            "after_save": train_steps(trainer, after), "tampering": tampering}


def probe_save(save_checkpoint, path: str, seed: int, k: int, after: int, timeout: float = 20.0) -> dict:
    """Train ``k`` steps, save with the learner's save_checkpoint to ``path``, train ``after`` more: the type
    of what it returned (None for None), the records of those later steps, and what save_checkpoint changed
    in the trainer's objects (the records are read through them); or {"died": why} when the save did not
    return. The save runs in a forked child, so that what it leaves in this process's memory (a global, a
    patched function) dies with it: a later resume cannot find it here."""
    try:
        return fresh_process.in_a_fork(_save_and_train_on, save_checkpoint, path, seed, k, after, timeout=timeout)
    except fresh_process.FreshProcessError as exc:
        return {"raised": exc.described()} if exc.described() else {"died": str(exc)}


_FRESH_TRAINER_SEED, _FRESH_ENTROPY = 2 ** 31 - 1, 2 ** 40 + 2026     # no check's seed


def _resumed(load_checkpoint, seed: int, steps: int, path: str) -> tuple:
    """Load ``path`` into a trainer built with another seed, RNGs elsewhere, and train ``steps`` steps: its
    snapshot right after loading, the steps' records, its snapshot after them, and what load_checkpoint
    changed in the trainer's objects besides their state (those snapshots and records are read through them)."""
    # Another seed and RNGs elsewhere, the same for every scenario: nothing in the trainer's weights or in
    # torch.initial_seed() tells which run was saved (a seed derived from the run's could be inverted and
    # the run rebuilt instead of loaded). The same place every time: a resume that fails to restore an RNG
    # then reads the same on every run, in the judge as in the learner's kernel.
    trainer = make_trainer(_FRESH_TRAINER_SEED)
    scramble_rngs(entropy=_FRESH_ENTROPY)
    changed = watch(_trainer_parts(trainer))
    load_checkpoint(path, trainer)
    tampering = changed()
    at_load = snapshot(trainer)
    records = train_steps(trainer, steps)
    return at_load, records, snapshot(trainer), tampering


def _saved_then_resumed(save_checkpoint, load_checkpoint, seed: int, k: int, steps: int, path: str) -> tuple:
    """The control, in one forked child: the save, then the resume, in one and the same process."""
    trainer = make_trainer(seed)
    train_steps(trainer, k)
    save_checkpoint(path, trainer)
    return _resumed(load_checkpoint, seed, steps, path)


def _train_and_save(save_checkpoint, path: str, seed: int, k: int) -> list[str]:
    """In a forked child: train ``k`` steps and save; the files the save opened for writing outside the
    checkpoint's folder, as (place, name) pairs."""
    opened = recording_writes_outside(os.path.dirname(path))
    trainer = make_trainer(seed)
    train_steps(trainer, k)
    save_checkpoint(path, trainer)
    return opened


def probe_resume_experiment(save_checkpoint, load_checkpoint, seed: int, k: int, steps: int,
                            timeout: float = 20.0) -> dict:
    """Train ``k`` steps and save with the learner's save_checkpoint (in a forked child); copy the file it
    wrote at `path` to another folder; load it there with the learner's load_checkpoint in a fresh process
    (see run_in_fresh_process) and train ``steps`` steps. load_checkpoint is packed before the save runs:
    nothing the save leaves in memory reaches it (nor anything but the folder's files). Returns what each
    part saw: {"save_died", "listing" (the
    folder's names when no file is at `path`), "resumed" (_resumed's tuple) or "resume_error", "left_out"
    (load_checkpoint's globals and closure variables that could not travel), "written_outside" (files the
    save wrote outside the checkpoint's folder)}."""
    resume = fresh_process.packed(_resumed, load_checkpoint, seed, steps)
    seen = {"save_died": None, "save_raised": None, "listing": None, "resumed": None, "resume_error": None,
            "resume_raised": None,
            "left_out": resume.left_out, "written_outside": []}
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as elsewhere:
        # The same name as check_save_checkpoint's: nothing in the path tells the save which check runs it.
        written = os.path.join(folder, "checkpoint.pt")
        try:
            seen["written_outside"] = fresh_process.in_a_fork(_train_and_save, save_checkpoint, written, seed, k,
                                                              timeout=timeout)
        except fresh_process.FreshProcessError as exc:
            seen["save_died"], seen["save_raised"] = str(exc), exc.described()
            return seen
        # Only what the save left on disk travels: the folder's files' bytes, not a link.
        if "checkpoint.pt" not in copy_regular_files(folder, elsewhere):
            seen["listing"] = sorted(os.listdir(folder))
            return seen
        path = os.path.join(elsewhere, "checkpoint.pt")
        try:
            seen["resumed"] = resume.run(path, readable=[elsewhere], timeout=timeout, preload=__package__)
        except fresh_process.FreshProcessError as exc:
            seen["resume_error"] = str(exc)
            seen["resume_raised"] = exc.described()
    return seen


def probe_saved_then_resumed(save_checkpoint, load_checkpoint, seed: int, k: int, steps: int,
                             timeout: float = 20.0):
    """The control: the save and the resume of probe_resume_experiment in one and the same forked child
    (_resumed's tuple), or None when that fails too. Where the fresh process's run is wrong and this one is
    right, the state went through memory or another file."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            return fresh_process.in_a_fork(_saved_then_resumed, save_checkpoint, load_checkpoint, seed, k, steps,
                                           os.path.join(folder, "checkpoint.pt"), timeout=timeout)
        except fresh_process.FreshProcessError:
            return None
