"""A task run in a fresh process whose global RNGs are scrambled, as in a process that just started: how
notebook 03 (and its checks) show that a resume depends on nothing but the file it reads."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Callable

import numpy as np
import torch

from . import fresh_process


@contextlib.contextmanager
def preserved_rngs():
    """Leave the caller's global RNGs as they were: a check must not reseed the learner's kernel."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


def scramble_rngs(entropy: int | None = None) -> None:
    """Put every global RNG somewhere unpredictable, as in a process that just started.

    ``entropy`` fixes where (the same place every time); without it the OS picks.
    """
    if entropy is None:
        entropy = int.from_bytes(os.urandom(8), "little")
    torch.manual_seed(entropy)
    np.random.seed(entropy % 2 ** 32)
    random.seed(entropy)


def _scrambled(task: Callable[[], object], entropy: int | None):
    scramble_rngs(entropy)
    return task()


def run_in_fresh_process(task: Callable[[], object], timeout: float = 20.0, readable=(), preload: str | None = None):
    """Run ``task()`` in a fresh process (``autograder.engine.fresh_process``) whose RNGs are scrambled; return
    what it returns, as data.

    The process is a new Python interpreter: it never held this one's memory. ``task`` travels by value,
    copied now: its code, and the globals and closure variables it uses, as data. It reads no file but
    those in ``readable``, and writes only a folder of its own. Errors there come back as RuntimeError.
    ``preload``: a check module the server imports (and warms up) once, before the first task.
    Where there is no fork (Windows) it runs here, with the caller's RNGs kept: a weaker test.
    """
    if not fresh_process.AVAILABLE:
        return _run_in_this_process(task)
    packed = fresh_process.packed(_scrambled, task, None)
    try:
        return packed.run(readable=readable, timeout=timeout, preload=preload)
    except fresh_process.FreshProcessError as exc:
        behind = "; ".join(f"{name} ({what})" for name, what in packed.left_out.items())
        raise RuntimeError(f"{exc}" + (f"; not handed to the fresh process: {behind}" if behind else "")) from None


def _run_in_this_process(task: Callable[[], object]):
    """The fallback where there is no fork: scrambled RNGs, same process, the caller's RNGs kept.

    Weaker than a fresh process (module-level state is shared), but every RNG still starts elsewhere.
    """
    with preserved_rngs():
        scramble_rngs()
        try:
            return task()
        except Exception as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
