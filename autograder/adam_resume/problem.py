"""Notebook 02's problem and the checks' reference: the regression the notebook provides, Adam's fresh state,
torch.optim.Adam in float64 driving NumPy arrays (private: it starts only at a seed's problem, so it is no Adam
step to wrap), and what every check asks of returned weights and states.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from ..checking import expect, type_name


# ---- what the notebook provides ------------------------------------------------------------

@dataclasses.dataclass
class RegressionProblem:
    """Least squares ``0.5 * mean((X @ w - y)**2)`` in float64, with its exact gradient."""

    X: np.ndarray
    y: np.ndarray
    w0: np.ndarray

    def loss(self, w: np.ndarray) -> float:
        return float(0.5 * np.mean((self.X @ w - self.y) ** 2))

    def grad(self, w: np.ndarray) -> np.ndarray:
        return self.X.T @ (self.X @ w - self.y) / len(self.y)


def regression_problem(seed: int = 0, n: int = 32, dim: int = 5) -> RegressionProblem:
    """A small, well-conditioned regression: Adam brings the loss down within 100 steps."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    true_w = rng.normal(size=dim)
    y = X @ true_w + 0.1 * rng.normal(size=n)
    return RegressionProblem(X, y, w0=np.zeros(dim))


def new_adam_state(w: np.ndarray) -> dict:
    """Adam before its first step: both moments zero, no step taken yet (t counts completed steps)."""
    return {"m": np.zeros_like(w, dtype=np.float64), "v": np.zeros_like(w, dtype=np.float64), "t": 0}


# ---- the reference: torch.optim.Adam driving NumPy arrays ------------------------------------

HYPER = ("lr", "beta1", "beta2", "eps")


class _TorchReference:
    """torch.optim.Adam in float64 on the regression problem of one seed, from its w0 and a fresh state.

    The reference of every check: it starts nowhere else (no weights, state or gradient function of a
    caller's), and goes on by copying itself (``branch``), so it is no Adam step to wrap.
    """

    def __init__(self, seed: int, hp: dict):
        self.problem = regression_problem(seed)
        self.param = torch.nn.Parameter(torch.tensor(self.problem.w0, dtype=torch.float64))
        self.optimizer = torch.optim.Adam([self.param], **_torch_hyper(hp))

    @property
    def w(self) -> np.ndarray:
        return self.param.detach().numpy().copy()

    @property
    def state(self) -> dict:
        s = self.optimizer.state.get(self.param)
        if not s:
            return new_adam_state(self.w)
        return {"m": s["exp_avg"].numpy().copy(), "v": s["exp_avg_sq"].numpy().copy(), "t": int(s["step"])}

    def branch(self, hp: dict | None = None, fresh: bool = False) -> "_TorchReference":
        """A copy that goes on from here: with other hyperparameters, or a new Adam on these weights."""
        other = copy.deepcopy(self)
        if fresh:
            other.optimizer = torch.optim.Adam([other.param], **_torch_hyper(hp or {}))
        elif hp is not None:
            other.optimizer.param_groups[0].update(_torch_hyper(hp))
        return other

    def advance(self, n: int, gradient: np.ndarray | None = None) -> np.ndarray:
        """n steps on the problem's gradient at the current weights (or on one fixed gradient)."""
        for _ in range(n):
            g = self.problem.grad(self.w) if gradient is None else gradient
            self.param.grad = torch.tensor(np.asarray(g, dtype=np.float64))
            self.optimizer.step()
        return self.w


def _torch_hyper(hp: dict) -> dict:
    return {"lr": hp.get("lr", 1e-3), "betas": (hp.get("beta1", 0.9), hp.get("beta2", 0.999)),
            "eps": hp.get("eps", 1e-8)}


def hyper(**hp) -> dict:
    return {k: v for k, v in hp.items() if k in HYPER}


def _trained(seed: int, k: int, hp: dict):
    reference = _TorchReference(seed, hp)
    reference.advance(k)
    return reference.problem, reference.w, reference.state


# ---- small utilities for messages ------------------------------------------------------------

def _as_weights(value, like: np.ndarray, what: str) -> np.ndarray:
    expect(value is not None, f"{what} returned None: it should return the weights as a NumPy array.")
    expect(isinstance(value, np.ndarray),
           f"{what} returned a {type_name(value)}; return the weights as a NumPy array.")
    expect(value.shape == like.shape, f"{what} returned weights of shape {value.shape}, expected {like.shape}.")
    return value


def _as_state(state, like: np.ndarray, what: str) -> dict:
    expect(isinstance(state, dict), f"{what} should be a dict {{'m', 'v', 't'}}, not {type_name(state)}.")
    missing = [k for k in ("m", "v", "t") if k not in state]
    expect(not missing, f"{what} has no {missing} entry (its keys are {sorted(map(str, state))}).")
    for key in ("m", "v"):
        expect(np.shape(state[key]) == like.shape,
               f"{what}[{key!r}] has shape {np.shape(state[key])}, expected {like.shape}.")
    expect(float(state["t"]) == int(float(state["t"])), f"{what}['t'] should count steps, but it is {state['t']!r}.")
    return state
