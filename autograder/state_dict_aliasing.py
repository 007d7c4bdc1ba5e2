"""Checks for notebook 01: state_dict aliasing.

``state_dict()`` hands out references to live tensors, and
``optimizer.load_state_dict(d)`` keeps using ``d``'s tensors. The probes train a
small model, call the learner's ``snapshot_state`` / ``restore_state``, keep
training, and report what the snapshot and the model hold afterwards; the checks
compare that with the same training run done on their own.
"""

from __future__ import annotations

import torch

from .checking import expect, graded_check, max_abs_diff, observe, type_name
from .helpers import (live_tensors, regression_data, serialized_copy, storage_pointer, tiny_mlp, train_step,
                      watch)

VARIANTS = ("adam", "sgd_momentum", "adam_batchnorm")


def _model(seed: int, batchnorm: bool, hidden: int = 8) -> torch.nn.Module:
    """tiny_mlp seeded with ``seed``, built without touching the process's global RNG (tiny_mlp reseeds it):
    the learner's code, run next to it, cannot read the check's seed (which tells the scenarios apart) from
    torch.initial_seed(), and a check leaves the learner's kernel RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        return tiny_mlp(hidden=hidden, seed=seed, batchnorm=batchnorm)


class _Run:
    """A model, an optimizer and data: the live training state the learner's code must copy."""

    def __init__(self, seed: int, variant: str = "adam", init_seed: int | None = None, hidden: int = 8):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}")
        self.X, self.y = regression_data(n=32, seed=seed)
        init_seed = seed if init_seed is None else init_seed
        self.model = _model(init_seed, batchnorm=variant.endswith("batchnorm"), hidden=hidden)
        if variant == "sgd_momentum":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def train(self, steps: int) -> list[float]:
        return [train_step(self.model, self.optimizer, self.X, self.y) for _ in range(steps)]

    def state(self) -> dict:
        return serialized_copy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})


def _part(snapshot, key: str):
    expect(isinstance(snapshot, dict), f"snapshot_state should return a dict, but it returned {type_name(snapshot)}.")
    expect(key in snapshot, f"the snapshot has no {key!r} entry (its keys are {sorted(map(str, snapshot))}).")
    expect(isinstance(snapshot[key], dict), f"snapshot[{key!r}] should be a state dict, not {type_name(snapshot[key])}.")
    return snapshot[key]


def _shared_with(snapshot, live: dict[int, str]) -> list:
    """Where the snapshot holds a tensor that shares storage with the live run: ["model", key] or [index, key]."""
    found = []
    if isinstance(snapshot, dict):
        if isinstance(snapshot.get("model"), dict):
            found += [["model", key] for key, value in snapshot["model"].items()
                      if torch.is_tensor(value) and storage_pointer(value) in live]
        if isinstance(snapshot.get("optimizer"), dict):
            found += [list(where) for where, value in _optimizer_tensors(snapshot["optimizer"]).items()
                      if storage_pointer(value) in live]
    return found


def _written_by_training(model, optimizer) -> dict[int, str]:
    """Storage pointer -> readable name, for every tensor a training step writes: the parameters the
    optimizer updates, its per-parameter state, the model's buffers (BatchNorm's running statistics)."""
    param_names = {id(p): name for name, p in model.named_parameters()}
    names = {storage_pointer(t): f"model {name}" for name, t in model.named_buffers()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            names[storage_pointer(param)] = f"model {param_names.get(id(param), 'a parameter')}"
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                names[storage_pointer(value)] = f"optimizer {key}"
    return names


def _watched(run: _Run):
    """What the learner's code changes in the run's model and optimizer (see helpers.watch)."""
    return watch(lambda: {"model": run.model, "optimizer": run.optimizer})


# ---- probes: run where the learner's functions live, return data ----------------------------------

def probe_snapshot_after_training(snapshot_state, seed: int, variant: str, before: int, after: int) -> dict:
    """Train ``before`` steps, take the learner's snapshot, train ``after`` more: what does it hold now?

    Also the live run's state after those steps, and what snapshot_state changed in the objects it was
    given: a snapshot that stayed put shows nothing unless the training after it did happen."""
    run = _Run(seed, variant)
    run.train(before)
    changed = _watched(run)
    snapshot = snapshot_state(run.model, run.optimizer)
    tampering = changed()
    run.train(after)
    return {"snapshot": snapshot, "shared": _shared_with(snapshot, live_tensors(run.model, run.optimizer)),
            "live": run.state(), "tampering": tampering}


def probe_restore(restore_state, snapshot: dict, seed: int, variant: str) -> dict:
    """Restore into a differently initialised run; its state then, and its model after one more step
    (and what restore_state changed in the objects it was given, besides their state)."""
    target = _Run(seed, variant, init_seed=seed + 1)
    changed = _watched(target)
    restore_state(target.model, target.optimizer, snapshot)
    tampering = changed()
    restored = target.state()
    target.train(1)
    return {"restored": restored, "after_step": target.state()["model"], "tampering": tampering}


def probe_restore_twice(restore_state, snapshot: dict, seed: int, variant: str) -> dict:
    """Restore, train 3 steps, and again from the same snapshot: the snapshot after the first, both models.

    Also where the first restored run trains on the snapshot's own tensors (that training should then
    have moved the snapshot) and what restore_state changed in the objects it was given."""
    first = _Run(seed, variant, init_seed=seed + 1)
    changed = _watched(first)
    restore_state(first.model, first.optimizer, snapshot)
    tampering = changed()
    shared = _shared_with(snapshot, _written_by_training(first.model, first.optimizer))
    first.train(3)
    snapshot_then = serialized_copy(snapshot)
    second = _Run(seed, variant, init_seed=seed + 2)
    changed = _watched(second)
    restore_state(second.model, second.optimizer, snapshot)
    tampering += [change for change in changed() if change not in tampering]
    second.train(3)
    return {"snapshot": snapshot_then, "first": first.state()["model"], "second": second.state()["model"],
            "shared": shared, "tampering": tampering}


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


def _live_difference(live, reference: dict) -> str | None:
    """Where the live run's state is not where the same training takes the reference run, or None."""
    model = live.get("model") if isinstance(live, dict) and isinstance(live.get("model"), dict) else {}
    for key, ref in reference["model"].items():
        value = model.get(key)
        if not (torch.is_tensor(value) and value.shape == ref.shape):
            return f"the live model has no {key!r} any more"
        if not torch.equal(value, ref):
            return f"the live model's {key!r} is {max_abs_diff(value, ref):.1e} away from where that training takes it"
    optimizer = live.get("optimizer") if isinstance(live, dict) and isinstance(live.get("optimizer"), dict) else {}
    got = _optimizer_tensors(optimizer)
    for (index, key), ref in _optimizer_tensors(reference["optimizer"]).items():
        value = got.get((index, key))
        if not (torch.is_tensor(value) and value.shape == ref.shape):
            return f"the live optimizer has no {key!r} for parameter {index} any more"
        if not torch.equal(value, ref):
            return (f"the live optimizer's {key!r} for parameter {index} is {max_abs_diff(value, ref):.1e} away "
                    f"from where that training takes it")
    return None


def _expect_live_run_trained(seen: dict, reference: dict, steps: int) -> None:
    """A snapshot that did not move counts only if the live run did: snapshot_state left the objects it was
    given alone, and the live run then trained exactly as the same training does here."""
    tampering = seen["tampering"]
    difference = None if tampering else _live_difference(seen["live"], reference)
    if tampering or difference:
        how = "; ".join(tampering) if tampering else f"after {steps} more training steps, {difference}"
        raise AssertionError(
            f"Your snapshot_state changed the live model/optimizer it was given ({how}): the training after the "
            f"snapshot did not happen as it should, so the snapshot's independence could not be observed. "
            f"snapshot_state must only read.")


def _expect_only_loaded(tampering: list) -> None:
    expect(not tampering,
           f"Your restore_state changed the model/optimizer it was given beyond loading their state "
           f"({'; '.join(tampering)}): the training after the restore did not happen as it should, so what it "
           f"restored could not be observed. restore_state must only load the state into them.")


@graded_check("snapshot_state returns loadable model and optimizer state dicts")
def check_snapshot_state(snapshot_state, seed: int = 0, variant: str = "adam") -> None:
    run = _Run(seed, variant)
    run.train(3)
    expected = run.state()
    snapshot = observe(probe_snapshot_after_training, snapshot_state, seed, variant, before=3, after=0)["snapshot"]
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
    run = _Run(seed, variant)
    run.train(2)
    expected = run.state()["model"]
    seen = observe(probe_snapshot_after_training, snapshot_state, seed, variant, before=2, after=3)
    run.train(3)
    _expect_live_run_trained(seen, run.state(), steps=3)
    model_state = _part(seen["snapshot"], "model")
    shared_keys = {key for where, key in seen["shared"] if where == "model"}
    for key, ref in expected.items():
        expect(key in model_state, f"snapshot['model'] lacks {key!r}: a model's state includes its buffers "
                                   f"(such as BatchNorm's running statistics), not only its parameters.")
        value = model_state[key]
        expect(torch.is_tensor(value), f"snapshot['model'][{key!r}] is a {type_name(value)}, not a tensor.")
        if not torch.equal(value, ref):
            shared = key in shared_keys
            raise AssertionError(
                f"After 3 more training steps, snapshot['model'][{key!r}] changed too "
                f"(max |diff| {max_abs_diff(value, ref):.1e})"
                + (", because it shares storage with the live model's tensor" if shared else "")
                + ". model.state_dict() returns references to the live tensors, and neither detach(), .cpu() "
                "or .to() of a tensor already on that device, nor a new dict around them, copies the data. What "
                "in your snapshot actually copies the numbers?")


@graded_check("the snapshot's optimizer state does not move when training continues")
def check_snapshot_state_optimizer(snapshot_state, seed: int = 0, variant: str = "adam") -> None:
    run = _Run(seed, variant)
    run.train(2)
    expected = _optimizer_tensors(run.state()["optimizer"])
    seen = observe(probe_snapshot_after_training, snapshot_state, seed, variant, before=2, after=3)
    run.train(3)
    _expect_live_run_trained(seen, run.state(), steps=3)
    got = _optimizer_tensors(_part(seen["snapshot"], "optimizer"))
    shared_places = {tuple(where) for where in seen["shared"] if where[0] != "model"}
    for (index, key), ref in expected.items():
        expect((index, key) in got, f"snapshot['optimizer'] has no {key!r} for parameter {index}: "
                                    f"use the optimizer's own state_dict(), which holds its per-parameter state.")
        value = got[(index, key)]
        if not torch.equal(value, ref):
            shared = (index, key) in shared_places
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


def _restored(probe, restore_state, seed: int, variant: str) -> tuple[dict, dict]:
    """A snapshot of 4 trained steps, restored by the learner's code in ``probe``: what the probe saw, and
    a copy of the snapshot as it was given."""
    source = _Run(seed, variant)
    source.train(4)
    snapshot = source.state()
    given = serialized_copy(snapshot)
    seen = observe(probe, restore_state, snapshot, seed, variant)
    _expect_only_loaded(seen["tampering"])
    return seen, given


@graded_check("restore_state puts the model and the optimizer back to the snapshot")
def check_restore_state(restore_state, seed: int = 0, variant: str = "adam") -> None:
    seen, expected = _restored(probe_restore, restore_state, seed, variant)
    restored = seen["restored"]
    _compare_model(restored["model"], expected["model"], "after restore_state, the model state")
    expect(_optimizer_tensors(restored["optimizer"]),
           "after restore_state the optimizer has no state at all (no momentum, no Adam moments or step "
           "count): only the model was restored, so the next update behaves like a fresh optimizer.")
    _compare_optimizer(restored["optimizer"], expected["optimizer"], "after restore_state, the optimizer state")
    # Its parameters, not BatchNorm's running statistics (the forward pass moves those, trained or not).
    parameters = {name for name, _ in _model(0, batchnorm=variant.endswith("batchnorm")).named_parameters()}
    moved = any(not torch.equal(restored["model"][k], v) for k, v in seen["after_step"].items() if k in parameters)
    expect(moved, "after restore_state, an optimizer step no longer changes the model: the optimizer updates "
                  "parameter tensors the model no longer uses. Loading with assign=True swaps in new parameter "
                  "objects behind the optimizer's back; load values into the existing parameters instead.")
    # The same step from the snapshot, here: a restore that only looks right (its run moves, but otherwise
    # than the run it restored would) fails.
    reference = _Run(seed, variant, init_seed=seed + 1)
    reference.model.load_state_dict(expected["model"])
    reference.optimizer.load_state_dict(serialized_copy(expected["optimizer"]))
    reference.train(1)
    for key, ref in reference.state()["model"].items():
        value = seen["after_step"].get(key)
        expect(torch.is_tensor(value) and value.shape == ref.shape and torch.equal(value, ref),
               f"After restore_state, one training step takes the model's {key!r} elsewhere than the same step "
               f"from the snapshot does"
               + (f" (max |diff| {max_abs_diff(value, ref):.1e})" if torch.is_tensor(value) and value.shape == ref.shape else "")
               + ": the restored model and optimizer do not train like the ones the snapshot was taken from. "
               "Load the snapshot's values into the existing model and optimizer, and change nothing else.")


@graded_check("restoring twice from one snapshot gives identical runs")
def check_restore_state_twice(restore_state, seed: int = 0, variant: str = "adam") -> None:
    seen, untouched = _restored(probe_restore_twice, restore_state, seed, variant)
    snapshot = seen["snapshot"]      # as the first restore and 3 steps of training left it
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

    for (name, a), b in zip(seen["first"].items(), seen["second"].values()):
        expect(torch.equal(a, b),
               f"Two restores from the same snapshot, each followed by 3 steps, ended with different "
               f"{name!r} (max |diff| {max_abs_diff(a, b):.1e}): the second restore did not start from "
               f"what the snapshot held when it was taken.")
    # An unchanged snapshot counts only if the training could have changed it and did not: the restored run
    # trained on none of the snapshot's own tensors.
    shared = [f"{key!r} of parameter {where}" if isinstance(where, int) else f"its {where} entry {key!r}"
              for where, key in seen["shared"]]
    expect(not shared,
           f"The run restored by restore_state trains on your snapshot's own tensors ({', '.join(shared[:3])}), "
           f"yet 3 training steps left the snapshot unchanged: the training did not happen as it should, so "
           f"whether it writes into the snapshot could not be observed. optimizer.load_state_dict(d) keeps "
           f"using d's tensors: what does the optimizer get to keep?")
