"""Notebook 02's train_n_steps check: two calls on one state against torch.optim.Adam, and which usual
mistake the weights match, each replayed from where the call started.
"""

from __future__ import annotations

import numpy as np

from ..checking import expect, graded_check
from .problem import _as_state, _as_weights, _TorchReference, hyper, new_adam_state


def _close(w: np.ndarray, expected: np.ndarray) -> bool:
    return float(np.max(np.abs(w - expected))) <= 1e-9 * max(1.0, float(np.max(np.abs(expected))))


def _shown(hp: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in hp.items()) or "none"


def _what_train_n_steps_did(w: np.ndarray, start: _TorchReference, n: int, hp: dict) -> str | None:
    """Which mistake the weights after one call of train_n_steps match, if one does: each is replayed with
    torch.optim.Adam from where the call started."""
    candidates = [
        (lambda: start.branch().advance(n, start.problem.grad(start.w)),
         f"an Adam that used one and the same gradient, the one at the starting weights, for all {n} steps of "
         f"this call. Each step needs the gradient at the current weights: call grad_fn(w) in every step"),
        (lambda: start.branch(hp={}).advance(n),
         f"torch.optim.Adam with the default hyperparameters (lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08), not "
         f"with the ones train_n_steps received ({_shown(hp)}). Pass them on to adam_step")
        if hp else None,
        (lambda: start.branch(hp, fresh=True).advance(n),
         "an Adam that started afresh (m = v = 0, t = 0) at this call, instead of continuing the state it was "
         "given. Step with that very dict, which adam_step updates in place")
        if int(start.state["t"]) else None,
    ]
    for replay, story in filter(None, candidates):
        if _close(w, replay()):
            return story
    return None


@graded_check("train_n_steps continues from the state it is given and counts n steps")
def check_train_n_steps(train_n_steps, seed: int = 0, first: int = 7, then: int = 13, **hp) -> None:
    hp = hyper(**hp)
    reference = _TorchReference(seed, hp)
    problem = reference.problem
    state = new_adam_state(problem.w0)
    w = problem.w0.copy()
    for n in (first, then):
        start = reference.branch()
        w = _as_weights(train_n_steps(w, state, n, problem.grad, **hp), problem.w0, "train_n_steps")
        expected = reference.advance(n)
        done = int(reference.state["t"])
        _as_state(state, problem.w0, "after train_n_steps, the state")
        expect(int(state["t"]) == done,
               f"After train_n_steps with n={first}" + (f" and then n={then}" if n == then else "")
               + f", state['t'] is {state['t']}, expected {done}: every step must advance the state you "
                 f"were given, and a second call must continue from it, not start a new Adam.")
        if _close(w, expected):
            continue
        evidence = (f"After {done} steps in total (this call: n={n}) the weights differ from torch.optim.Adam's by "
                    f"{float(np.max(np.abs(w - expected))):.2e}")
        story = _what_train_n_steps_did(w, start, n, hp)
        if story:
            raise AssertionError(f"{evidence}, and they match {story}.")
        raise AssertionError(
            f"{evidence}. They match none of the usual mistakes, each replayed with torch.optim.Adam from where "
            f"this call started: the gradient at the starting weights reused for every step, the default "
            f"hyperparameters instead of the ones received ({_shown(hp)}), a fresh Adam state. Several at once, "
            f"or adam_step itself? Check that each step computes grad_fn(w) at the current weights, passes the "
            f"hyperparameters on, and continues the state it was given.")
