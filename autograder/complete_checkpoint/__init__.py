"""Checks for notebook 03: the complete checkpoint, resumed bitwise in a fresh process.

The notebook provides the training setup (``make_trainer``, ``train_steps``) from
here, so the checks and the learner run the very same code. A check trains one
trainer for N steps without a break. Its probes, run where the learner's functions
live, train another for k steps and save it with the learner's ``save_checkpoint`` in a
forked child (what the save leaves in memory dies with it); then, in a fresh process
(``autograder.engine.fresh_process``: a new interpreter that never held the saving process's
memory, given a copy of what the save left in its folder), build a trainer with another
seed, move its RNGs elsewhere, call the learner's ``load_checkpoint`` and train N - k
steps, and report what they saw. Every component is compared right after loading and
step by step afterwards, so a failure names the component that diverged first; where the
fresh process fails and a save and load in one process succeed, the state went through
memory or another file, and the message says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import tempfile
import warnings
from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn

from ..engine import fresh_process, fresh_runs
from ..engine.fresh_runs import preserved_rngs, scramble_rngs
from ..checking import Remembered, expect, graded_check, load_written, observe
from ..grading.sandbox import learner_exception
from ..engine.travel import copy_regular_files, recording_writes_outside, what_did_not_travel
from ..helpers import state_copy, watch

from torchdata.stateful_dataloader import StatefulDataLoader

FEATURES = 6
DATASET_SIZE = 24
BATCH_SIZE = 4


# ---- the training setup the notebook provides ------------------------------------------------

def stateful_loader(dataset, **options) -> StatefulDataLoader:
    """A StatefulDataLoader, built without the warning torchdata 0.11 triggers on torch 2.13.

    torchdata calls torch.set_vital(), which torch 2.13 deprecates with a UserWarning at
    every construction: harmless, and not the learner's business.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return StatefulDataLoader(dataset, **options)


class AugmentedRegression(torch.utils.data.Dataset):
    """24 fixed samples (the dataset version never changes); every read augments its sample.

    The augmentation draws from Python's ``random`` (a scale jitter) and from NumPy's
    global RNG (additive noise), as many real pipelines do, so both RNGs are part of
    the training state. Each item carries its sample ID for the audit ledger.
    """

    def __init__(self, size: int = DATASET_SIZE, features: int = FEATURES):
        g = torch.Generator().manual_seed(20261130)
        self.x = torch.randn(size, features, generator=g)
        self.y = self.x @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(size, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        scale = 1.0 + 0.2 * (random.random() - 0.5)
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, size=self.x.shape[1]).astype(np.float32))
        return self.x[index] * scale + noise, self.y[index], index


@dataclasses.dataclass
class Trainer:
    """Everything that changes while training, in one place.

    ``batches`` is the live iterator over ``loader`` for the current epoch; it is
    None until the first batch is needed, and replaced at every epoch end.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    loader: StatefulDataLoader
    epoch: int = 0
    step: int = 0
    batches: Iterator | None = None


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def make_trainer(seed: int = 0) -> Trainer:
    """A fresh trainer: model with dropout, SGD with momentum, StepLR, GradScaler, shuffled loader.

    ``seed`` sets the initial weights and every global RNG; the data are the same for every seed.
    """
    seed_everything(seed)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    # On CPU in float32 nothing overflows; the scale still doubles every 4 clean steps, so the
    # scaler carries state a resume must restore (on a GPU in fp16 it decides which steps are skipped).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=4)
    loader = stateful_loader(AugmentedRegression(), batch_size=BATCH_SIZE, shuffle=True)
    return Trainer(model, optimizer, scheduler, scaler, loader)


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:10]


def rng_fingerprints() -> dict[str, str]:
    """Short digests of the three global RNG states: equal digests, equal future draws."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch_rng": _digest(torch.get_rng_state().numpy().tobytes()),
        "numpy_rng": _digest(keys.tobytes() + repr((pos, has_gauss, gauss)).encode()),
        "python_rng": _digest(repr(random.getstate()).encode()),
    }


def next_batch(trainer: Trainer):
    if trainer.batches is None:
        trainer.batches = iter(trainer.loader)
    try:
        return next(trainer.batches)
    except StopIteration:
        trainer.epoch += 1
        trainer.batches = iter(trainer.loader)
        return next(trainer.batches)


_next_batch = next_batch   # the name notebook 03 showed before it was public


def train_steps(trainer: Trainer, n: int) -> list[dict]:
    """Train ``n`` optimizer steps; return one audit record per step.

    A record holds the step and epoch, the sample IDs of the batch, digests of the
    three RNG states once the batch is read (the dropout draws come after), the loss,
    the learning rate used and the loss scale.
    """
    records = []
    trainer.model.train()
    for _ in range(n):
        x, y, ids = next_batch(trainer)
        record = {"step": trainer.step + 1, "epoch": trainer.epoch, "sample_ids": ids.tolist(),
                  **rng_fingerprints(), "lr": trainer.optimizer.param_groups[0]["lr"],
                  "scale": trainer.scaler.get_scale()}
        trainer.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(trainer.model(x), y)
        trainer.scaler.scale(loss).backward()
        trainer.scaler.step(trainer.optimizer)
        trainer.scaler.update()
        trainer.scheduler.step()
        trainer.step += 1
        record["loss"] = loss.item()
        records.append(record)
    return records


def snapshot(trainer: Trainer) -> dict:
    """Copies of every component's state, to compare two trainers."""
    return {
        "model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": state_copy(trainer.optimizer.state_dict()),
        "scheduler": state_copy(trainer.scheduler.state_dict()),
        "scaler": dict(trainer.scaler.state_dict()),
        "epoch": trainer.epoch,
        "step": trainer.step,
        **rng_fingerprints(),
    }


# ---- a fresh process -------------------------------------------------------------------------

def run_in_fresh_process(task: Callable[[], object], timeout: float = 20.0, readable=()):
    """``task()`` in a fresh process with scrambled RNGs, this module warmed up there (engine.fresh_runs)."""
    return fresh_runs.run_in_fresh_process(task, timeout, readable, preload=__name__)


def warm_up_fresh_processes() -> None:
    """In the server of fresh processes (fresh_process._warm): a resume's first steps, imported once there."""
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
            seen["resumed"] = resume.run(path, readable=[elsewhere], timeout=timeout, preload=__name__)
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


# ---- the resume experiment and its diagnosis -------------------------------------------------

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


# ---- checks ----------------------------------------------------------------------------------

@graded_check("save_checkpoint writes one file that torch.load opens with its safe default, in any process")
def check_save_checkpoint(save_checkpoint, seed: int = 0, k: int = 8) -> None:
    with preserved_rngs(), tempfile.TemporaryDirectory() as folder:
        reference = make_trainer(seed)
        train_steps(reference, k)
        expected = train_steps(reference, 3)

        path = os.path.join(folder, "checkpoint.pt")
        seen = observe(probe_save, save_checkpoint, path, seed, k, after=3)
        if "raised" in seen:
            raise learner_exception(seen["raised"])
        if "died" in seen:
            raise AssertionError(f"save_checkpoint, run in a process of its own, did not return: {seen['died']}.")
        expect(seen["returned"] is None, f"save_checkpoint returned a {seen['returned']}; it should write the "
                                         f"checkpoint to `path` and return None.")
        # The check reads the folder and the file itself (in graded mode the folder lies in the sandbox's
        # own): the safe torch.load below is the one the learner's code could not have changed.
        expect(os.path.isfile(path), f"save_checkpoint(path, trainer) wrote no file at `path` "
                                     f"(the folder holds {sorted(os.listdir(folder))}).")
        try:
            # As the process that resumes after a crash loads it: nothing allowlisted (load_written sets
            # aside any allowlist the kernel holds).
            load_written(path)
        except Exception as exc:
            reason = _refusal(exc)
            hint = ("NumPy's RNG state holds an ndarray, which it refuses: store such state as tensors or plain "
                    "numbers" if "numpy" in reason.lower() else
                    "save each part's state_dict() (tensors and plain data), not the objects themselves"
                    if "torch.nn" in reason or "torch.optim" in reason or "torchdata" in reason else
                    "write the checkpoint with torch.save, holding tensors and plain Python data only")
            raise AssertionError(
                f"torch.load(path), with its safe default weights_only=True and nothing allowlisted, refuses your "
                f"checkpoint ({reason}). Since torch 2.6 it only unpickles tensors and plain Python containers, "
                f"numbers and strings: {hint}. An allowlist (torch.serialization.add_safe_globals) lives in the "
                f"process that registered it, not in the file: the process that resumes after a crash has "
                f"none. Never turn the safe default off to read your own checkpoints.") from None
        leftovers = sorted(name for name in os.listdir(folder) if name != "checkpoint.pt")
        expect(not leftovers, f"save_checkpoint left other files next to the checkpoint: {leftovers}.")
        expect(not seen["tampering"],
               f"save_checkpoint changed the trainer it was given ({'; '.join(seen['tampering'])}): the training "
               f"after the save, read through those objects, cannot show whether saving changed the run. "
               f"Saving must only read the training state.")
        for a, b in zip(seen["after_save"], expected):
            expect(a == b, f"Saving changed the run: step {b['step']} after the save differs from a run that did "
                           f"not save ({_record_difference(a, b)}). Reading state for a checkpoint must not "
                           f"draw random numbers or touch the loader's iterator.")


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

