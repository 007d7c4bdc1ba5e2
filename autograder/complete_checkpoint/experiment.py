"""Notebook 03's resume experiment and its diagnosis, which the load_checkpoint checks share: the
uninterrupted run against a save and a resume in a fresh process (remembered for the last few argument sets),
and which component diverged first.
"""

from __future__ import annotations

import dataclasses

import torch

from ..checking import Remembered, expect, observe
from ..engine import fresh_process
from ..engine.fresh_runs import preserved_rngs
from ..engine.travel import what_did_not_travel
from ..grading.sandbox import learner_exception
from .probes import probe_resume_experiment, probe_saved_then_resumed
from .trainer import make_trainer, snapshot, train_steps


@dataclasses.dataclass
class ResumeExperiment:
    at_k: dict            # the uninterrupted run's state after k steps
    expected: list        # its records for steps k+1 .. n
    final: dict           # its state after n steps
    at_load: dict         # the resumed trainer's state right after load_checkpoint
    resumed: list         # its records for steps k+1 .. n
    resumed_final: dict
    k: int
    n: int
    tampering: list = dataclasses.field(default_factory=list)  # what load_checkpoint changed besides state


_RECENT_EXPERIMENTS = Remembered(keep=4)  # the four load checks share one experiment per argument set


def resume_experiment(save_checkpoint, load_checkpoint, seed: int = 0, k: int = 8, n: int = 14) -> ResumeExperiment:
    """run_resume_experiment, remembered for the last few (save, load, arguments)."""
    return _RECENT_EXPERIMENTS((save_checkpoint, load_checkpoint, seed, k, n),
                               lambda: run_resume_experiment(save_checkpoint, load_checkpoint, seed, k, n))


def run_resume_experiment(save_checkpoint, load_checkpoint, seed: int = 0, k: int = 8, n: int = 14,
                          timeout: float = 20.0) -> ResumeExperiment:
    """Continuous n steps vs k steps, save, load into a fresh trainer in a fresh process, n - k steps.

    The uninterrupted run is computed here; the learner's save and load run in a probe.
    """
    with preserved_rngs():
        continuous = make_trainer(seed)
        train_steps(continuous, k)
        at_k = snapshot(continuous)
        expected = train_steps(continuous, n - k)
        final = snapshot(continuous)
    seen = observe(probe_resume_experiment, save_checkpoint, load_checkpoint, seed, k, n - k, timeout)
    for raised in (seen["save_raised"], seen["resume_raised"]):
        if raised and raised["type"] == "NotImplementedError":
            raise NotImplementedError(raised["message"])     # an exercise not answered yet
    if seen["save_raised"]:
        raise learner_exception(seen["save_raised"])
    if seen["save_died"]:
        raise AssertionError(f"save_checkpoint, run in a process of its own, did not return: {seen['save_died']}.")
    expect(seen["listing"] is None, f"save_checkpoint(path, trainer) wrote no file at `path` (the folder holds "
                                    f"{seen['listing']}): the resume reads that file.")
    if seen["resume_error"] and "Weights only load failed" in seen["resume_error"]:
        raise AssertionError(
            f"In a fresh process, load_checkpoint's torch.load refused the checkpoint ({_refusal(seen['resume_error'])}): "
            f"its safe default, weights_only=True, unpickles tensors and plain data only, and that process has "
            f"allowlisted nothing. An add_safe_globals allowlist lives in the process that registered it, not in "
            f"the file. Store the state as tensors and plain data.")
    if seen["resume_error"] or seen["resumed"][1] != expected:
        control = observe(probe_saved_then_resumed, save_checkpoint, load_checkpoint, seed, k, n - k, timeout)
        if control is not None and control[1] == expected and not control[3]:
            raise AssertionError(_not_on_disk(seen))
    if seen["resume_error"]:
        raise AssertionError(f"Loading the checkpoint into a fresh trainer in a fresh process failed: "
                             f"{seen['resume_error']}")
    at_load, resumed, resumed_final, tampering = seen["resumed"]
    return ResumeExperiment(at_k, expected, final, at_load, resumed, resumed_final, k, n, tampering)


def _not_on_disk(seen: dict) -> str:
    """A resume in a fresh process fails, the same save and load in one process give the uninterrupted run."""
    raised = seen["resume_raised"]
    did = (f"raised {fresh_process.raised_text(raised)}" if raised else f"failed: {seen['resume_error']}"
           if seen["resume_error"] else "gave another run than the uninterrupted one")
    return (f"The checkpoint was not really on disk: in a fresh process, which receives only the file at `path`, "
            f"load_checkpoint {did}; saved and resumed within one process, the same functions give the "
            f"uninterrupted run. The state went from the save to the load through memory or another file, not "
            f"through the checkpoint. {what_did_not_travel(seen, 'save_checkpoint', 'load_checkpoint')}After a "
            f"crash only the file is left: write everything into it.")


def _first_tensor_difference(got, expected, where: str = "") -> str | None:
    """A readable path to the first entry that differs, or None when all are bitwise equal."""
    if torch.is_tensor(expected):
        if not torch.is_tensor(got) or got.shape != expected.shape or got.dtype != expected.dtype:
            return f"{where} is {type(got).__name__ if not torch.is_tensor(got) else tuple(got.shape)}"
        if not torch.equal(got, expected):
            return f"{where} differs by up to {float((got.double() - expected.double()).abs().max()):.2e}"
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where} is missing"
        for key, value in expected.items():
            if key not in got:
                return f"{where}[{key!r}] is missing"
            found = _first_tensor_difference(got[key], value, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{where} has another length"
        for i, (a, b) in enumerate(zip(got, expected)):
            found = _first_tensor_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if got == expected else f"{where} is {got!r}, expected {expected!r}"


def _epoch_window(experiment: ResumeExperiment) -> int:
    """How many resumed steps stay in the epoch the checkpoint was taken in."""
    epoch = experiment.at_k["epoch"]
    return sum(1 for r in experiment.expected if r["epoch"] == epoch)


def diagnose(experiment: ResumeExperiment) -> dict[str, str]:
    """component -> what diverged, for every component that a resume failed to restore."""
    found: dict[str, str] = {}
    got, ref = experiment.at_load, experiment.at_k
    k = experiment.k
    if experiment.tampering:
        found["tampering"] = (f"load_checkpoint changed the trainer's objects beyond loading their state "
                              f"({'; '.join(experiment.tampering)}): the resumed state is read and trained through "
                              f"them, so it could not be observed. Restore each component with its own "
                              f"load_state_dict and leave the objects' methods alone.")
    if (got["epoch"], got["step"]) != (ref["epoch"], ref["step"]):
        found["counters"] = (f"After load_checkpoint the trainer says epoch {got['epoch']}, step {got['step']}; "
                             f"the checkpoint was taken at epoch {ref['epoch']}, step {ref['step']}. The epoch "
                             f"and step counters are part of the training state too.")
    for part, name, why in (
        ("model", "the model state", "the weights every other part acts on"),
        ("optimizer", "the optimizer state", "SGD's momentum buffers and the current learning rate live there"),
        ("scheduler", "the learning-rate scheduler's state", "StepLR counts steps to know when to decay"),
        ("scaler", "the GradScaler's state", "its loss scale and growth tracker change during training"),
    ):
        difference = _first_tensor_difference(got[part], ref[part], part)
        if difference:
            found[part] = (f"After load_checkpoint, {name} is not what it was at step {k}: {difference}. "
                           f"Save and restore its state_dict(): {why}.")

    window = _epoch_window(experiment)
    for i, (a, b) in enumerate(zip(experiment.resumed[:window], experiment.expected[:window])):
        if a["sample_ids"] != b["sample_ids"]:
            found["data position"] = (
                f"Resumed step {b['step']} trained on samples {a['sample_ids']}, but the uninterrupted run "
                f"trained on {b['sample_ids']} there: the loader did not continue where the checkpoint "
                f"left it mid-epoch. A StatefulDataLoader has a state of its own.")
            break

    for key, name, how in (
        ("torch_rng", "torch's RNG (dropout masks)", "torch.get_rng_state()"),
        ("numpy_rng", "NumPy's global RNG (the augmentation noise)", "np.random.get_state()"),
        ("python_rng", "Python's random (the augmentation scale)", "random.getstate()"),
    ):
        if got[key] != ref[key]:
            found[key] = (f"Right after load_checkpoint, {name} is not in the state it had at step {k}: "
                          f"the resumed run draws other random numbers. Save {how} and set it back.")
            continue
        for a, b in zip(experiment.resumed[:window], experiment.expected[:window]):
            if a[key] != b[key]:
                found[key] = (
                    f"{name[0].upper() + name[1:]} matched right after load_checkpoint, but no longer when the "
                    f"batch of step {b['step']} had been read: something drew from it after you restored it. "
                    f"Creating the loader's iterator draws from torch's RNG; restore the RNG states last, once "
                    f"the iterator for the current epoch exists (trainer.batches).")
                break
    return found


COMPONENT_GROUPS = {
    "training_state": ("tampering", "counters", "model", "optimizer", "scheduler", "scaler"),
    "rng": ("torch_rng", "numpy_rng", "python_rng"),
    "data_position": ("data position",),
}


def _report(found: dict[str, str], components) -> None:
    problems = [found[c] for c in components if c in found]
    expect(not problems, "\n".join(problems))

def _refusal(exc) -> str:
    """What torch.load refused, in one line: the global it met, else the first line of its error (``exc``
    an exception, or its text)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "Unsupported global" in line:
            return line.split(" was not an allowed global")[0].replace("WeightsUnpickler error: ", "")[:200]
        if "allowlisted via" in line:
            return line[:200]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _record_difference(a: dict, b: dict) -> str:
    return ", ".join(f"{key} {a[key]!r} instead of {b[key]!r}" for key in b if a.get(key) != b[key])
