"""Checks for notebook 01: state_dict aliasing.

``state_dict()`` hands out references to live tensors, and
``optimizer.load_state_dict(d)`` keeps using ``d``'s tensors. The checks train a
small model, call the learner's ``snapshot_state`` / ``restore_state``, keep
training, and observe whether the snapshot moved with it.
"""

from __future__ import annotations

import torch

from .checking import expect, graded_check, max_abs_diff, require_callable
from .helpers import live_tensors, regression_data, serialized_copy, storage_pointer, tiny_mlp, train_step

VARIANTS = ("adam", "sgd_momentum", "adam_batchnorm")


class _Run:
    """A model, an optimizer and data: the live training state the learner's code must copy."""

    def __init__(self, seed: int, variant: str = "adam", init_seed: int | None = None, hidden: int = 8):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}")
        self.X, self.y = regression_data(n=32, seed=seed)
        init_seed = seed if init_seed is None else init_seed
        self.model = tiny_mlp(hidden=hidden, seed=init_seed, batchnorm=variant.endswith("batchnorm"))
        if variant == "sgd_momentum":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def train(self, steps: int) -> list[float]:
        return [train_step(self.model, self.optimizer, self.X, self.y) for _ in range(steps)]

    def state(self) -> dict:
        return serialized_copy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})


def _part(snapshot, key: str):
    expect(isinstance(snapshot, dict), f"snapshot_state should return a dict, but it returned {type(snapshot).__name__}.")
    expect(key in snapshot, f"the snapshot has no {key!r} entry (its keys are {sorted(map(str, snapshot))}).")
    expect(isinstance(snapshot[key], dict), f"snapshot[{key!r}] should be a state dict, not {type(snapshot[key]).__name__}.")
    return snapshot[key]


def _optimizer_tensors(optimizer_state: dict) -> dict[tuple, torch.Tensor]:
    """(parameter index, key) -> tensor, for every tensor in an optimizer state dict.

    The step count comes last, so a shared moment buffer is reported before it.
    """
    found = {}
    for index, per_param in optimizer_state.get("state", {}).items():
        for key, value in sorted(per_param.items(), key=lambda item: item[0] == "step"):
            if torch.is_tensor(value):
                found[(int(index), key)] = value
    return found


def _compare_model(got: dict, expected: dict, what: str) -> None:
    for key, ref in expected.items():
        expect(key in got, f"{what} lacks {key!r}: a model's state includes its buffers "
                           f"(such as BatchNorm's running statistics), not only its parameters.")
        diff = max_abs_diff(got[key], ref)
        expect(torch.equal(got[key], ref), f"{what}[{key!r}] differs from the expected values (max |diff| {diff:.1e}).")


def _compare_optimizer(got: dict, expected: dict, what: str) -> None:
    got_tensors, ref_tensors = _optimizer_tensors(got), _optimizer_tensors(expected)
    for (index, key), ref in ref_tensors.items():
        expect((index, key) in got_tensors,
               f"{what} has no {key!r} for parameter {index}: the optimizer's per-parameter state "
               f"(momentum, Adam's moments and step count) was not carried over.")
        value = got_tensors[(index, key)]
        expect(torch.equal(value, ref),
               f"{what}: {key!r} of parameter {index} differs from the expected state "
               f"(max |diff| {max_abs_diff(value, ref):.1e}).")
    for group, ref_group in zip(got.get("param_groups", []), expected["param_groups"]):
        expect(group.get("lr") == ref_group["lr"], f"{what}: the learning rate is {group.get('lr')}, expected {ref_group['lr']}.")


@graded_check("snapshot_state returns loadable model and optimizer state dicts")
def check_snapshot_state(snapshot_state, seed: int = 0, variant: str = "adam") -> None:
    require_callable(snapshot_state, "snapshot_state")
    run = _Run(seed, variant)
    run.train(3)
    expected = run.state()
    snapshot = snapshot_state(run.model, run.optimizer)
    fresh = _Run(seed, variant, init_seed=seed + 1000)
    for key, target in (("model", fresh.model), ("optimizer", fresh.optimizer)):
        part = _part(snapshot, key)
        try:
            target.load_state_dict(part)
        except Exception as exc:
            raise AssertionError(f"snapshot[{key!r}] does not load with {key}.load_state_dict: {exc}") from None
    _compare_model(fresh.model.state_dict(), expected["model"], "the restored model state")
    _compare_optimizer(fresh.optimizer.state_dict(), expected["optimizer"], "the restored optimizer state")


@graded_check("the snapshot's model state does not move when training continues")
def check_snapshot_state_model(snapshot_state, seed: int = 0, variant: str = "adam") -> None:
    require_callable(snapshot_state, "snapshot_state")
    run = _Run(seed, variant)
    run.train(2)
    expected = run.state()["model"]
    model_state = _part(snapshot_state(run.model, run.optimizer), "model")
    run.train(3)
    live = live_tensors(run.model)
    for key, ref in expected.items():
        expect(key in model_state, f"snapshot['model'] lacks {key!r}: a model's state includes its buffers "
                                   f"(such as BatchNorm's running statistics), not only its parameters.")
        value = model_state[key]
        expect(torch.is_tensor(value), f"snapshot['model'][{key!r}] is a {type(value).__name__}, not a tensor.")
        if not torch.equal(value, ref):
            shared = storage_pointer(value) in live
            raise AssertionError(
                f"After 3 more training steps, snapshot['model'][{key!r}] changed too "
                f"(max |diff| {max_abs_diff(value, ref):.1e})"
                + (", because it shares storage with the live model's tensor" if shared else "")
                + ". model.state_dict() returns references to the live tensors, and detach() or a new dict "
                "does not copy the data. What in your snapshot actually copies the numbers?")


@graded_check("the snapshot's optimizer state does not move when training continues")
def check_snapshot_state_optimizer(snapshot_state, seed: int = 0, variant: str = "adam") -> None:
    require_callable(snapshot_state, "snapshot_state")
    run = _Run(seed, variant)
    run.train(2)
    expected = _optimizer_tensors(run.state()["optimizer"])
    optimizer_state = _part(snapshot_state(run.model, run.optimizer), "optimizer")
    run.train(3)
    got = _optimizer_tensors(optimizer_state)
    live = live_tensors(run.model, run.optimizer)
    for (index, key), ref in expected.items():
        expect((index, key) in got, f"snapshot['optimizer'] has no {key!r} for parameter {index}: "
                                    f"use the optimizer's own state_dict(), which holds its per-parameter state.")
        value = got[(index, key)]
        if not torch.equal(value, ref):
            shared = storage_pointer(value) in live
            if key == "step":
                raise AssertionError(
                    f"After 3 more training steps, the snapshot's step count for parameter {index} went from "
                    f"{ref.item():g} to {value.item():g}: the step counter is a tensor the optimizer increments "
                    f"in place, so the snapshot must hold its own copy of it as well.")
            raise AssertionError(
                f"After 3 more training steps, the snapshot's {key!r} for parameter {index} changed "
                f"(max |diff| {max_abs_diff(value, ref):.1e})"
                + (": the snapshot still shares storage with the live optimizer's " + key if shared else "")
                + ". optimizer.state_dict() hands out the live per-parameter buffers; copy them when you "
                "take the snapshot, not just the dict around them.")


def _trained_snapshot(seed: int, variant: str) -> dict:
    source = _Run(seed, variant)
    source.train(4)
    return source.state()


@graded_check("restore_state puts the model and the optimizer back to the snapshot")
def check_restore_state(restore_state, seed: int = 0, variant: str = "adam") -> None:
    require_callable(restore_state, "restore_state")
    snapshot = _trained_snapshot(seed, variant)
    expected = serialized_copy(snapshot)
    target = _Run(seed, variant, init_seed=seed + 1)
    restore_state(target.model, target.optimizer, snapshot)
    _compare_model(target.model.state_dict(), expected["model"], "after restore_state, the model state")
    expect(_optimizer_tensors(target.optimizer.state_dict()),
           "after restore_state the optimizer has no state at all (no momentum, no Adam moments or step "
           "count): only the model was restored, so the next update behaves like a fresh optimizer.")
    _compare_optimizer(target.optimizer.state_dict(), expected["optimizer"],
                       "after restore_state, the optimizer state")
    before = serialized_copy(target.model.state_dict())
    target.train(1)
    moved = any(not torch.equal(before[k], v) for k, v in target.model.state_dict().items())
    expect(moved, "after restore_state, an optimizer step no longer changes the model: the optimizer updates "
                  "parameter tensors the model no longer uses. Loading with assign=True swaps in new parameter "
                  "objects behind the optimizer's back; load values into the existing parameters instead.")


@graded_check("restoring twice from one snapshot gives identical runs")
def check_restore_state_twice(restore_state, seed: int = 0, variant: str = "adam") -> None:
    require_callable(restore_state, "restore_state")
    snapshot = _trained_snapshot(seed, variant)
    untouched = serialized_copy(snapshot)

    first = _Run(seed, variant, init_seed=seed + 1)
    restore_state(first.model, first.optimizer, snapshot)
    first.train(3)
    for (index, key), ref in _optimizer_tensors(untouched["optimizer"]).items():
        value = _optimizer_tensors(snapshot["optimizer"])[(index, key)]
        expect(torch.equal(value, ref),
               f"Training after restore_state changed the snapshot itself: its {key!r} for parameter {index} "
               f"moved by up to {max_abs_diff(value, ref):.1e}. optimizer.load_state_dict(d) keeps using "
               f"d's tensors, so the restored optimizer writes into your snapshot. What does the optimizer "
               f"get to keep?")
    for key, ref in untouched["model"].items():
        value = snapshot["model"][key]
        expect(torch.equal(value, ref),
               f"Training after restore_state changed the snapshot's model entry {key!r} "
               f"(max |diff| {max_abs_diff(value, ref):.1e}): the restored model shares its tensors.")

    second = _Run(seed, variant, init_seed=seed + 2)
    restore_state(second.model, second.optimizer, snapshot)
    second.train(3)
    for (name, a), b in zip(first.model.state_dict().items(), second.model.state_dict().values()):
        expect(torch.equal(a, b),
               f"Two restores from the same snapshot, each followed by 3 steps, ended with different "
               f"{name!r} (max |diff| {max_abs_diff(a, b):.1e}): the second restore did not start from "
               f"what the snapshot held when it was taken.")
