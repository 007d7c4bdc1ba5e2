"""Notebook 02's adam_step checks: each step against torch.optim.Adam's from the same state (within a few
ulps), and the state dict updated in place.
"""

from __future__ import annotations

import numpy as np

from ..checking import expect, graded_check
from .problem import _as_state, _as_weights, _TorchReference, hyper, new_adam_state

ULPS = 16  # a single Adam step: textbook and PyTorch forms differ by at most a few ulps


def _problem_and_gradients(seed: int, steps: int, hp: dict):
    """The reference trajectory: weights, gradient and PyTorch's state before each step."""
    reference = _TorchReference(seed, hp)
    trajectory = []
    for _ in range(steps):
        w, state = reference.w, reference.state
        g = reference.problem.grad(w)
        reference.advance(1, g)
        trajectory.append((w, g, state, reference.w))
    return reference.problem, trajectory


@graded_check("adam_step matches torch.optim.Adam step by step (within a few ulps)")
def check_adam_step(adam_step, seed: int = 0, steps: int = 30, **hp) -> None:
    hp = hyper(**hp)
    lr = hp.get("lr", 1e-3)
    _, trajectory = _problem_and_gradients(seed, steps, hp)
    for k, (w, g, state, expected) in enumerate(trajectory):
        # Each step starts from PyTorch's own state, so this check is about the update rule only.
        got = _as_weights(adam_step(w.copy(), g.copy(), {"m": state["m"].copy(), "v": state["v"].copy(),
                                                         "t": state["t"]}, **hp), w, "adam_step")
        scale = np.maximum(np.abs(w), np.abs(expected))
        if np.all(np.abs(got - expected) <= ULPS * np.spacing(scale)):
            continue
        moved, should = np.abs(got - w), np.abs(expected - w)
        ratio = float(np.median(moved / np.maximum(should, 1e-300)))
        size = (f"your step is {ratio:.3g} times PyTorch's" if abs(ratio - 1) > 0.005 else
                "your step has about the right size, but not the right value")
        evidence = (f"At step t={state['t'] + 1} your weights differ from torch.optim.Adam's by up to "
                    f"{np.max(np.abs(got - expected)):.2e} (allowed: {ULPS} ulps); {size}.")
        if not np.all(np.isfinite(got)):
            raise AssertionError(evidence.split(";")[0] + ": your update is inf or nan. With t counting "
                                 "completed steps, the bias correction of step t uses 1 - beta**t after t is "
                                 "incremented; 1 - beta**0 is 0.")
        if k == 0:
            ratios = moved / np.maximum(should, 1e-300)
            uncorrected = (1 - hp.get("beta1", 0.9)) / np.sqrt(1 - hp.get("beta2", 0.999))
            if abs(ratio - 1) > 0.005 and np.allclose(ratios, ratio, rtol=1e-3) and \
                    not np.isclose(ratio, uncorrected, rtol=1e-3):
                default = ("this call passes none, so your signature's default is used" if "lr" not in hp
                           else f"this call passes lr={lr:g}")
                raise AssertionError(
                    f"{evidence} On the very first step PyTorch moves every weight by about lr = {lr:g}; yours moved "
                    f"every weight {ratio:.3g} times as far, all alike. A constant factor is the learning rate: "
                    f"{default}. (Without the bias correction the factor would be (1 - beta1) / sqrt(1 - beta2) = "
                    f"{uncorrected:.3g}, and that is not it.)")
            exactly = (f" That factor is (1 - beta1) / sqrt(1 - beta2) = {uncorrected:.3g}: what m and v give "
                       f"uncorrected." if np.isclose(ratio, uncorrected, rtol=1e-3) else "")
            raise AssertionError(
                f"{evidence} On the very first step PyTorch moves every weight by about lr = {lr:g}: "
                f"m-hat / sqrt(v-hat) is g / |g| once both moments are bias-corrected.{exactly} Check how you "
                f"correct m and v for their zero start, and where eps goes.")
        raise AssertionError(f"{evidence} Check the moment updates, the bias correction with the current t, "
                             f"and where eps goes (outside the square root).")


@graded_check("adam_step updates the state in place: t counts steps, m and v are the moving averages")
def check_adam_step_state(adam_step, seed: int = 0, steps: int = 6, **hp) -> None:
    hp = hyper(**hp)
    _, trajectory = _problem_and_gradients(seed, steps + 1, hp)
    w0 = trajectory[0][0]
    state = new_adam_state(w0)
    for k, (w, g, _, _) in enumerate(trajectory[:steps]):
        # Feed PyTorch's gradients whatever the returned weights are: only the state is judged here.
        adam_step(w.copy(), g.copy(), state, **hp)
        ref = trajectory[k + 1][2]
        _as_state(state, w0, f"after {k + 1} call(s) of adam_step, the state")
        expect(int(state["t"]) == k + 1,
               f"After {k + 1} call(s) of adam_step, state['t'] is {state['t']}, expected {k + 1}: t counts "
               f"completed steps and must grow by one per call, in the dict you were given (update it in "
               f"place; rebinding the name `state` inside the function changes nothing for the caller).")
        for key, name, beta, default in (("m", "first moment m", "beta1", 0.9), ("v", "second moment v", "beta2", 0.999)):
            got = np.asarray(state[key], dtype=np.float64)
            term = g if key == "m" else g * g
            scale = np.maximum(np.abs(trajectory[k][2][key]), np.abs(term))
            if np.all(np.abs(got - ref[key]) <= ULPS * np.spacing(np.maximum(scale, np.abs(ref[key])))):
                continue
            # What the state holds instead, where it matches a mistake exactly (the earlier calls matched).
            b = hp.get(beta, default)
            corrected = ref[key] / (1 - b ** (k + 1))
            with_default = default * trajectory[k][2][key] + (1 - default) * term
            if np.allclose(got, corrected, rtol=1e-9, atol=0):
                why = (f": it holds the bias-corrected average (divided by 1 - {beta}**t). Keep the raw moving "
                       f"average in the state, and correct a copy of it for the step.")
            elif b != default and np.allclose(got, with_default, rtol=1e-9, atol=0):
                why = (f": it matches the moving average with the default {beta}={default:g}, not the {beta}={b:g} "
                       f"this call passes. Use the betas adam_step is given.")
            else:
                why = (" (it is still all zeros)" if not np.any(got) else "") + (
                    f". It should be the raw moving average with {beta}={b:g} (not bias-corrected), kept in the "
                    f"state dict.")
            raise AssertionError(
                f"After {k + 1} call(s), state[{key!r}] (the {name}) differs from torch.optim.Adam's "
                f"{'exp_avg' if key == 'm' else 'exp_avg_sq'} by up to {np.max(np.abs(got - ref[key])):.2e}{why}")
