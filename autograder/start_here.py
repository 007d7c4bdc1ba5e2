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

from .checking import expect, graded_check, observe
from .helpers import (changed_global_rngs, describe_rng_change, recording_global_rngs, regression_data, tiny_mlp,
                      train_step)


def _trained_pair(seed: int, hidden: int, batchnorm: bool):
    """A trained model and an exact, independent copy of it."""
    X, y = regression_data(n=16, seed=seed)
    model = tiny_mlp(hidden=hidden, seed=seed, batchnorm=batchnorm)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(3):
        train_step(model, optimizer, X, y)
    return model, copy.deepcopy(model), (X, y)


def probe_same_weights(same_weights, a, b) -> dict:
    """Runs where the learner's same_weights lives: its answer, and what the call changed there (the
    models' saved state, torch's global random number generator), as data."""
    before = [{k: v.clone() for k, v in model.state_dict().items()} for model in (a, b)]
    with recording_global_rngs() as rng:     # a reseed shows even to the seed the process had; put back after
        answer = same_weights(a, b)
    if torch.is_tensor(answer) and answer.numel() == 1:
        answer = bool(answer)
    changed = [f"{which}'s {key!r}" for which, model, old in (("model_a", a, before[0]), ("model_b", b, before[1]))
               for key, value in model.state_dict().items() if not torch.equal(value, old[key])]
    return {"answer": answer if isinstance(answer, bool) else None, "type": type(answer).__name__,
            "shown": repr(answer)[:80], "changed": changed, "rngs_changed": describe_rng_change(rng, changed_global_rngs(rng))}


def _verdict(same_weights, a, b, what: str, side_effects: bool = False) -> bool:
    seen = observe(probe_same_weights, same_weights, a, b)
    expect(seen["answer"] is not None,
           f"same_weights should return True or False, but for {what} it returned {seen['type']} {seen['shown']}.")
    if side_effects:
        expect(not seen["changed"],
               f"same_weights changed the models it compared ({', '.join(seen['changed'][:3])} moved): running a "
               f"model in training mode updates BatchNorm's running statistics. Compare what the models hold "
               f"(their state_dict) without running them.")
        expect(not seen["rngs_changed"],
               f"same_weights changed the process's global random number generators ({seen['rngs_changed']}), as "
               f"drawing an input to run both models on does: the training that follows would draw other batches "
               f"and dropout masks. Compare what the models hold, without drawing anything.")
    return seen["answer"]


_SAID_FALSE_FOR_TWINS = ("same_weights said False for two models with identical state (one is a deep copy of the "
                         "other). Does it compare the models' values, rather than the objects themselves?")


def _identical_are_same(same_weights, a, b) -> None:
    expect(_verdict(same_weights, a, b, "two identical models"), _SAID_FALSE_FOR_TWINS)


@graded_check("same_weights tells identical models from different ones")
def check_same_weights(same_weights, seed: int = 0, hidden: int = 8, batchnorm: bool = False) -> None:
    model, twin, (X, y) = _trained_pair(seed, hidden, batchnorm)
    expect(_verdict(same_weights, model, twin, "two identical models", side_effects=True),
           _SAID_FALSE_FOR_TWINS)
    train_step(twin, torch.optim.SGD(twin.parameters(), lr=0.1), X, y)
    expect(not _verdict(same_weights, model, twin, "two different models", side_effects=True),
           "same_weights said True for two models whose weights differ clearly (one took an extra "
           "training step): does it compare the values, or only names and shapes?")


@graded_check("same_weights sees a difference of a single rounding step, in any tensor")
def check_same_weights_exact(same_weights, seed: int = 0, hidden: int = 8) -> None:
    model, twin, _ = _trained_pair(seed, hidden, batchnorm=False)
    _identical_are_same(same_weights, model, twin)
    # Not the first tensor: an answer that looks at only some of them must not pass by luck.
    names = [name for name, _ in twin.named_parameters()]
    name = names[(seed + 1) % len(names)]
    tensor = twin.get_parameter(name)
    with torch.no_grad():
        # The next representable float32 above one entry: the smallest drift a resume can show.
        flat = tensor.view(-1)
        flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf")))
    diff = (tensor - model.get_parameter(name)).abs().max().item()
    if not _verdict(same_weights, model, twin, "two nearly equal models"):
        return
    with torch.no_grad():
        tensor.add_(1.0)
    if _verdict(same_weights, model, twin, f"models that differ by 1.0 in {name!r}"):
        raise AssertionError(
            f"same_weights said True for two models whose {name!r} differs by 1.0 in every entry: it does not "
            f"look at that tensor at all. Compare every tensor the model holds, not only some of them.")
    raise AssertionError(
        f"same_weights said True for two models that differ in one entry of {name!r} by {diff:.1e} (one rounding "
        f"step). A tolerance (as in torch.allclose), a sum of the values, or the models' outputs on some input hide "
        f"exactly the small drift a broken resume leaves behind; on one CPU a correct resume is bitwise equal. How can you compare without any "
        f"tolerance?")


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
    counted = copy.deepcopy(model)
    counted[1].num_batches_tracked += 1   # an integer buffer: state too, and saved with the rest
    if bool(_verdict(same_weights, model, counted, "models that differ in an integer buffer")):
        raise AssertionError(
            f"same_weights said True for two models whose BatchNorm num_batches_tracked differs "
            f"({int(model[1].num_batches_tracked)} vs {int(counted[1].num_batches_tracked)}): it is an integer "
            f"(int64) buffer, and state too: a BatchNorm made with momentum=None averages its statistics over it. "
            f"Compare every tensor of the state, whatever its dtype.")
