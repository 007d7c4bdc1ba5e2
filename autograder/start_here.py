"""Checks for notebook 00: the warm-up exercise ``same_weights``.

A resume is right when the resumed model ends bitwise equal to an uninterrupted
run: on one CPU with deterministic code, nothing less is correct. The checks hand
the learner's ``same_weights(model_a, model_b)`` pairs of models that are
identical, clearly different, different by a hair, or different only in a buffer
(BatchNorm's running statistics), and look at the answer.
"""

from __future__ import annotations

import copy

import torch

from .checking import expect, graded_check
from .helpers import regression_data, tiny_mlp, train_step


def _trained_pair(seed: int, hidden: int, batchnorm: bool):
    """A trained model and an exact, independent copy of it."""
    X, y = regression_data(n=16, seed=seed)
    model = tiny_mlp(hidden=hidden, seed=seed, batchnorm=batchnorm)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(3):
        train_step(model, optimizer, X, y)
    return model, copy.deepcopy(model), (X, y)


def _verdict(same_weights, a, b, what: str) -> bool:
    answer = same_weights(a, b)
    if torch.is_tensor(answer) and answer.numel() == 1:
        answer = bool(answer)
    expect(isinstance(answer, bool),
           f"same_weights should return True or False, but for {what} it returned {type(answer).__name__} "
           f"{answer!r:.80}.")
    return answer


def _identical_are_same(same_weights, a, b) -> None:
    expect(_verdict(same_weights, a, b, "two identical models"),
           "same_weights said False for two models with identical state (one is a deep copy of the "
           "other). Does it compare the models' values, rather than the objects themselves?")


@graded_check("same_weights tells identical models from different ones")
def check_same_weights(same_weights, seed: int = 0, hidden: int = 8, batchnorm: bool = False) -> None:
    model, twin, (X, y) = _trained_pair(seed, hidden, batchnorm)
    _identical_are_same(same_weights, model, twin)
    train_step(twin, torch.optim.SGD(twin.parameters(), lr=0.1), X, y)
    expect(not _verdict(same_weights, model, twin, "two different models"),
           "same_weights said True for two models whose weights differ clearly (one took an extra "
           "training step).")


@graded_check("same_weights sees a difference of a single rounding step")
def check_same_weights_exact(same_weights, seed: int = 0, hidden: int = 8) -> None:
    model, twin, _ = _trained_pair(seed, hidden, batchnorm=False)
    _identical_are_same(same_weights, model, twin)
    with torch.no_grad():
        weight = twin[0].weight
        # The next representable float32 above one weight: the smallest drift a resume can show.
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(float("inf")))
    diff = (twin[0].weight - model[0].weight).abs().max().item()
    if bool(_verdict(same_weights, model, twin, "two nearly equal models")):
        raise AssertionError(
            f"same_weights said True for two models that differ in one weight by {diff:.1e}. A tolerance "
            f"(as in torch.allclose) hides exactly the small drift a broken resume leaves behind; on one CPU "
            f"a correct resume is bitwise equal. How can you compare without any tolerance?")


@graded_check("same_weights compares buffers too, not only parameters")
def check_same_weights_buffers(same_weights, seed: int = 0, hidden: int = 8) -> None:
    model, twin, _ = _trained_pair(seed, hidden, batchnorm=True)
    _identical_are_same(same_weights, model, twin)
    with torch.no_grad():
        twin[1].running_mean += 0.5   # BatchNorm's running statistics: a buffer, not a parameter
    if bool(_verdict(same_weights, model, twin, "models that differ in a buffer")):
        raise AssertionError(
            "same_weights said True for two models with equal parameters whose BatchNorm running_mean "
            "differs by 0.5. Running statistics are buffers, not parameters, and a resumed model needs "
            "them too. Which method lists everything a model saves?")
