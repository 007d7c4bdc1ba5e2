"""Notebook 03's load_checkpoint checks: each component group restored at step k, and the resume in a fresh
process equal to the uninterrupted run bitwise (all four read one shared resume experiment).
"""

from __future__ import annotations

from ..checking import graded_check
from .experiment import (COMPONENT_GROUPS, _first_tensor_difference, _record_difference, _report, diagnose,
                         resume_experiment)


def _report_group(group: str, load_checkpoint, save_checkpoint, seed: int, k: int, n: int) -> None:
    _report(diagnose(resume_experiment(save_checkpoint, load_checkpoint, seed, k, n)), COMPONENT_GROUPS[group])


@graded_check("after load_checkpoint, model, optimizer, scheduler, scaler and counters match step k")
def check_load_checkpoint_training_state(load_checkpoint, save_checkpoint, seed=0, k=8, n=14) -> None:
    _report_group("training_state", load_checkpoint, save_checkpoint, seed, k, n)


@graded_check("after load_checkpoint, the torch, NumPy and Python RNGs continue where they were")
def check_load_checkpoint_rng(load_checkpoint, save_checkpoint, seed=0, k=8, n=14) -> None:
    _report_group("rng", load_checkpoint, save_checkpoint, seed, k, n)


@graded_check("after load_checkpoint, the loader continues mid-epoch with the next samples")
def check_load_checkpoint_data_position(load_checkpoint, save_checkpoint, seed=0, k=8, n=14) -> None:
    _report_group("data_position", load_checkpoint, save_checkpoint, seed, k, n)


@graded_check("a resume in a fresh process equals the uninterrupted run bitwise")
def check_load_checkpoint(load_checkpoint, save_checkpoint, seed: int = 0, k: int = 8, n: int = 14) -> None:
    experiment = resume_experiment(save_checkpoint, load_checkpoint, seed, k, n)
    mismatch = None
    for a, b in zip(experiment.resumed, experiment.expected):
        if a != b:
            mismatch = f"step {b['step']} differs: {_record_difference(a, b)}"
            break
    if mismatch is None:
        for part in ("model", "optimizer", "scheduler", "scaler", "epoch", "step"):
            difference = _first_tensor_difference(experiment.resumed_final[part], experiment.final[part], part)
            if difference:
                mismatch = f"after step {experiment.n}, {difference}"
                break
    if mismatch is None:
        _report(diagnose(experiment), ("tampering",))   # the same run, read through changed objects, shows nothing
        return
    found = diagnose(experiment)
    cause = next(iter(found.values()), "No single component was found to differ right after loading; "
                                       "look for state the trainer keeps outside those components.")
    raise AssertionError(f"Resumed at step {experiment.k} in a fresh process, the run is not the uninterrupted "
                         f"one: {mismatch}.\nFirst cause found: {cause}")
