"""Notebook 03's save_checkpoint check: one file at `path` that torch.load opens with its safe default and
nothing allowlisted, nothing else beside it, and a run that saving did not change.
"""

from __future__ import annotations

import os
import tempfile

from ..checking import expect, graded_check, load_written, observe
from ..engine.fresh_runs import preserved_rngs
from ..grading.sandbox import learner_exception
from .experiment import _record_difference, _refusal
from .probes import probe_save
from .trainer import make_trainer, train_steps


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
