"""Notebook 02's save_checkpoint check: the learner's save in a forked child writes a file at `path`,
returns None, and leaves the weights and the Adam state it was given untouched.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..checking import expect, graded_check, observe, type_name
from ..engine import fresh_process
from ..grading.sandbox import learner_exception
from .problem import _trained, hyper


def _saved_here(save_checkpoint, path: str, w: np.ndarray, state: dict) -> dict:
    """In a forked child: save, and say what it returned, what was at `path`, what else in its folder, and
    whether the arrays it was given changed."""
    before = (w.copy(), {key: np.copy(v) for key, v in state.items()})
    result = save_checkpoint(path, w, state)
    folder, name = os.path.split(path)
    return {"returned": None if result is None else type_name(result),
            "size": os.path.getsize(path) if os.path.isfile(path) else None,
            "elsewhere": sorted(n for n in os.listdir(folder) if n != name),
            "changed": not (np.array_equal(w, before[0]) and all(np.array_equal(state[key], before[1][key])
                                                                 for key in before[1]))}


def probe_save_checkpoint(save_checkpoint, path: str, w: np.ndarray, state: dict, timeout: float = 20.0) -> dict:
    """The learner's save, in a forked child (what it keeps in memory dies with it: a later resume cannot
    find it in this process): _saved_here's report, or {"raised": what it raised} or {"died": why}."""
    try:
        return fresh_process.in_a_fork(_saved_here, save_checkpoint, path, w, state, timeout=timeout)
    except fresh_process.FreshProcessError as exc:
        return {"raised": exc.described()} if exc.described() else {"died": str(exc)}


@graded_check("save_checkpoint writes the weights and the Adam state to disk and leaves them untouched")
def check_save_checkpoint(save_checkpoint, seed: int = 0, k: int = 9, **hp) -> None:
    _, w, state = _trained(seed, k, hyper(**hp))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "adam.ckpt")
        seen = observe(probe_save_checkpoint, save_checkpoint, path, w, state)
    if "died" in seen:
        raise AssertionError(f"save_checkpoint, run in a process of its own, did not return: {seen['died']}.")
    if "raised" in seen:
        raise learner_exception(seen["raised"])
    expect(seen["returned"] is None, f"save_checkpoint returned a {seen['returned']}; it should write to disk "
                                     f"and return None (the checkpoint is the file, not a value in memory).")
    name = os.path.basename(path)
    expect(seen["size"] is not None, _no_file_at_path(name, seen["elsewhere"]))
    expect(seen["size"], f"save_checkpoint({name!r}, w, state) left an empty file at `path`: the weights and "
                         f"the Adam state must be in it.")
    expect(not seen["changed"],
           "Saving changed the weights or the Adam state it was given: save_checkpoint must only read them.")


def _no_file_at_path(name: str, elsewhere: list[str]) -> str:
    """Why there is no file at `path` after save_checkpoint(path, ...), from what its folder holds."""
    if not elsewhere:
        return (f"save_checkpoint({name!r}, w, state) wrote nothing to disk: a checkpoint kept in memory dies with "
                f"the process it was meant to survive.")
    numpy_suffix = [n for n in elsewhere if n in (name + ".npz", name + ".npy")]
    return (f"save_checkpoint({name!r}, w, state) wrote no file at `path`, only {', '.join(elsewhere)} next to it"
            + (": given a file name, np.savez and np.save append .npz or .npy to it. Open the file yourself and "
               "pass the file object." if numpy_suffix else ". The checkpoint is the file `path`: that is where "
                                                            "a resume looks for it."))
