"""Crash trials of a save (engine/crash_trials.py): a forked writer saves, SIGKILLed (with every process it
started) part-way through, over an old checkpoint; then what the final name holds.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..checking import observe
from ..engine.crash_trials import CrashTrials
from .checkpoints import CHECKPOINT_NAME, _new_scratch, _tempfile_folder_of, classify, make_checkpoint


def _saving_in_scratch(save, obj, path) -> None:
    """What a trial's writer runs: the save, with tempfile's default folder the scratch's own."""
    with _tempfile_folder_of(path):
        save(obj, path)


def probe_killed_saves(save, obj, kills: list, old: str) -> list[str]:
    """For each (path, kill_at_bytes): how a forked ``save(obj, path)`` ended, SIGKILLed (with every process
    it started) once ``kill_at_bytes`` were on disk (see run_and_kill), over a copy of the file ``old`` put
    at path first. What it left on disk is the check's to read.

    The copies are made here: in graded mode only ``old`` travels into the sandbox, not one per trial."""
    for path, _ in kills:
        shutil.copyfile(old, path)  # the good checkpoint the save replaces
    with CrashTrials(functools.partial(_saving_in_scratch, save), obj, [path for path, _ in kills]) as trials:
        return [trials.run(i, kill_at_bytes) for i, (_, kill_at_bytes) in enumerate(kills)]


def crash_trials(save, trials: int = 10, seed: int = 0, layers: int = 8, workdir=None,
                 progress=None) -> list[dict]:
    """Run ``trials`` crash trials of ``save``; each replaces an old checkpoint by a new one.

    Trial i kills the writer when (i + 0.5) / trials of the new file's bytes are on
    disk, so the kills are spread over the whole write. Returns one record per
    trial: the kill point, how the child ended and what the final name then held.
    Only the writers run (and are killed) where ``save`` lives, all in one probe: the
    trial folders are made, and the files left in them loaded, here. ``progress(done,
    total, record)``, if given, sees each record as it is made.
    """
    if not hasattr(os, "fork"):
        raise RuntimeError("crash trials need os.fork and SIGKILL (Linux or macOS)")
    old, new = make_checkpoint(1, layers, seed=seed), make_checkpoint(2, layers, seed=seed)
    known_folder = tempfile.mkdtemp(prefix="atomic-known-", dir=workdir)
    scratches = []
    try:
        known = {}
        for label, ckpt in (("old", old), ("new", new)):
            torch.save(ckpt, os.path.join(known_folder, f"{label}.pt"))
            known[label] = Path(known_folder, f"{label}.pt").read_bytes()
        fractions = [(i + 0.5) / trials for i in range(trials)]
        kills = []
        for fraction in fractions:  # each trial in a scratch of its own, laid out as every other check's
            scratches.append(_new_scratch(workdir))
            kills.append((os.path.join(scratches[-1], "checkpoints", CHECKPOINT_NAME),
                          int(fraction * len(known["new"]))))
        endings = observe(probe_killed_saves, save, new, kills, os.path.join(known_folder, "old.pt"))
        records = []
        for i, ((path, _), fraction, ended) in enumerate(zip(kills, fractions, endings)):
            outcome, detail = classify(path, (1, layers, 1024, seed), (2, layers, 1024, seed), known)
            leftovers = sorted(n for n in os.listdir(os.path.dirname(path)) if n != CHECKPOINT_NAME)
            records.append({"fraction": fraction, "ended": ended, "outcome": outcome, "detail": detail,
                            "leftovers": leftovers})
            if progress:
                progress(i + 1, trials, records[-1])
        return records
    finally:
        for folder in (known_folder, *scratches):
            shutil.rmtree(folder, ignore_errors=True)
