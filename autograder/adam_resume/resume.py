"""Notebook 02's resume checks: a full checkpoint resumed bitwise (then continued by torch.optim.Adam to the
uninterrupted run), and a weights-only resume that restarts Adam's state.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checking import expect, graded_check
from .problem import _TorchReference, hyper
from .round_trip import _differs, _saved_and_resumed


@graded_check("a full resume after a disk round trip equals the uninterrupted run bitwise")
def check_resume_from_full_checkpoint(resume_from_full_checkpoint, save_checkpoint, seed: int = 0,
                                      k: int = 20, n: int = 50, lr: float = 0.05, **hp) -> None:
    hp = hyper(lr=lr, **hp)
    problem, (w_saved, s_saved), (w, state) = _saved_and_resumed(save_checkpoint, resume_from_full_checkpoint,
                                                                 seed, k, hp, "resume_from_full_checkpoint")
    expect(int(state["t"]) == k,
           f"The resumed state has t = {state['t']}, but {k} steps were taken before the save. "
           + ("Adam's step count restarted, so bias correction treats the resume as a fresh start. "
              "What does your checkpoint store for t?" if int(state["t"]) == 0 else
              "Is t saved and read back as the step count?"))
    for key, name in (("m", "first moment m"), ("v", "second moment v")):
        if not np.array_equal(state[key], s_saved[key]):
            raise AssertionError(
                f"The resumed {name} differs from the one saved ({_differs(state[key], s_saved[key])})"
                + (": it is all zeros, as in a fresh Adam. A full checkpoint holds both moments."
                   if not np.any(state[key]) else ". The round trip must be exact: keep float64."))
    if not np.array_equal(w, w_saved):
        raise AssertionError(f"The resumed weights differ from the saved ones ({_differs(w, w_saved)}). "
                             + "The round trip must be exact: keep float64.")
    expected = _TorchReference(seed, hp).advance(n)
    # The resumed (w, state), continued by torch.optim.Adam: PyTorch's own state after k steps, given its values.
    resumed_run = _TorchReference(seed, hp)
    resumed_run.advance(k)
    torch_state = resumed_run.optimizer.state[resumed_run.param]
    with torch.no_grad():
        for target, value in ((resumed_run.param, w), (torch_state["exp_avg"], state["m"]),
                              (torch_state["exp_avg_sq"], state["v"])):
            target.copy_(torch.tensor(np.asarray(value, dtype=np.float64)))
        torch_state["step"].fill_(int(state["t"]))
    resumed = resumed_run.advance(n - k)
    expect(np.array_equal(resumed, expected),
           f"After resuming at step {k} and training to step {n}, the weights differ from the uninterrupted "
           f"run by {float(np.max(np.abs(resumed - expected))):.2e}; they should be bitwise equal.")


@graded_check("a weights-only resume restores the weights and restarts Adam's state")
def check_resume_from_weights_only(resume_from_weights_only, save_checkpoint, seed: int = 0,
                                   k: int = 20, lr: float = 0.05, **hp) -> None:
    hp = hyper(lr=lr, **hp)
    problem, (w_saved, _), (w, state) = _saved_and_resumed(save_checkpoint, resume_from_weights_only,
                                                           seed, k, hp, "resume_from_weights_only", full=False)
    if not np.array_equal(w, w_saved):
        raise AssertionError(f"The weights-only resume did not give back the saved weights ({_differs(w, w_saved)})"
                             + (": they look like what the arrays held after the save, so the checkpoint "
                                "was not really on disk." if not np.any(w) else "."))
    expect(int(state["t"]) == 0 and not np.any(state["m"]) and not np.any(state["v"]),
           f"A weights-only resume starts a fresh Adam (m = v = 0, t = 0), but the returned state has "
           f"t = {state['t']}, |m| up to {float(np.max(np.abs(state['m']))):.2e}, |v| up to "
           f"{float(np.max(np.abs(state['v']))):.2e}. This function plays the mistake, so restore the weights only.")
    # What the restart predicts: with m-hat = g and v-hat = g*g, the first step is lr * sign(g) per coordinate.
    g = problem.grad(w)
    restarted = _TorchReference(seed, hp)          # a new torch.optim.Adam, its state as fresh as the resumed one
    with torch.no_grad():
        restarted.param.copy_(torch.tensor(np.asarray(w, dtype=np.float64)))
    after = restarted.advance(1)
    eps = hp.get("eps", 1e-8)
    predicted = w - hp["lr"] * g / (np.abs(g) + eps)
    expect(np.allclose(after, predicted, rtol=0, atol=1e-12),
           f"After the weights-only resume the first Adam step should move each weight by lr * sign(g) "
           f"(up to eps), but it moved by up to {float(np.max(np.abs(after - w))):.3g}.")
