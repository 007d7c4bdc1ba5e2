"""Notebook 01: state_dict aliasing. The checks, driven on right and wrong implementations."""

import copy

import pytest
import torch

from autograder import state_dict_aliasing as checks
from check_outcomes import failure_of
from fixtures import state_dict_aliasing_impls as impls
from notebook_checks import checks_of

SNAPSHOT_CHECKS, RESTORE_CHECKS = checks_of("01", "snapshot_state"), checks_of("01", "restore_state")



def test_assign_trap_is_named_with_batchnorm_too():
    """BatchNorm's running statistics move in every forward pass: they do not show that the optimizer still
    updates the model's parameters (before, the assign=True trap passed the hidden BatchNorm variant)."""
    message = failure_of(checks.check_restore_state, impls.restore_assign_aliasing, seed=11, variant="adam_batchnorm")
    assert "an optimizer step no longer changes the model" in message


@pytest.mark.parametrize("change, named", [
    (lambda model, optimizer: setattr(model, "forward", lambda x: x), "model.forward replaced on the instance"),
    (lambda model, optimizer: setattr(model[2], "forward", lambda x: x), "model[2].forward replaced on the instance"),
    (lambda model, optimizer: optimizer.register_step_post_hook(lambda *a: None),
     "optimizer step post hook added to optimizer"),
    (lambda model, optimizer: model[0].register_forward_hook(lambda *a: None), "forward hook added to model[0]"),
    (lambda model, optimizer: model[0].weight.register_hook(lambda g: g), "gradient hook added to model[0].weight"),
    (lambda model, optimizer: setattr(optimizer, "__class__", type("Frozen", (type(optimizer),), {})),
     "optimizer.__class__ changed to Frozen"),
], ids=["forward", "submodule", "step hook", "forward hook", "gradient hook", "class"])
def test_watch_names_what_learner_code_changed_in_the_objects_it_was_given(change, named):
    run = checks._Run(0)
    changed = checks._watched(run)
    assert changed() == []
    change(run.model, run.optimizer)
    assert changed() == [named]


def test_watch_finds_nothing_in_training_or_in_loading_state():
    run = checks._Run(0, "adam_batchnorm")
    changed = checks._watched(run)
    run.train(3)
    run.model.load_state_dict(run.state()["model"])
    run.optimizer.load_state_dict(run.state()["optimizer"])
    run.model.eval(), run.model.train()
    assert changed() == []


def test_hidden_batchnorm_variant_catches_parameters_only_snapshot():
    # The visible Adam model has no buffers, so only the hidden variant shows this trap.
    assert failure_of(checks.check_snapshot_state_model, impls.snapshot_parameters_only) is None
    assert failure_of(checks.check_snapshot_state_model, impls.snapshot_parameters_only,
                      seed=11, variant="adam_batchnorm")


def test_a_hard_coded_snapshot_fails_the_hidden_seed():
    """A learner who returns a snapshot captured once (from the visible run) cannot pass other seeds."""
    run = checks._Run(0)
    run.train(3)
    frozen = copy.deepcopy({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict()})
    assert failure_of(checks.check_snapshot_state, lambda m, o: frozen) is None
    assert failure_of(checks.check_snapshot_state, lambda m, o: frozen, seed=7) is not None


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_snapshot_state, None)


def test_torch_behaviour_the_notebook_teaches():
    """The facts notebook 01 is built on, against the installed torch."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert model.state_dict()["weight"].data_ptr() == model.weight.data_ptr()
    state = optimizer.state_dict()["state"][0]
    assert state["exp_avg"] is optimizer.state[model.weight]["exp_avg"]
    snapshot = copy.deepcopy(optimizer.state_dict())
    fresh = torch.optim.Adam(model.parameters())
    fresh.load_state_dict(snapshot)
    assert fresh.state[model.weight]["exp_avg"] is snapshot["state"][0]["exp_avg"]


# What the learner's functions see of the process they run in, logged by spies.
_SEEN = []


def _spy_snapshot(model, optimizer):
    _SEEN.append((torch.initial_seed(), torch.get_rng_state().sum().item()))
    return impls.snapshot_deepcopy(model, optimizer)


def _spy_restore(model, optimizer, snapshot):
    _SEEN.append((torch.initial_seed(), torch.get_rng_state().sum().item()))
    impls.restore_deepcopy(model, optimizer, snapshot)


@pytest.mark.parametrize("seed, variant", [(0, "adam"), (7, "sgd_momentum"), (11, "adam_batchnorm")])
def test_nothing_of_the_scenario_reaches_the_answer_through_the_global_rng(seed, variant):
    """The checks' models are seeded with the scenario's seed (0 visible, 7 and 11 hidden): built without
    touching the global RNG, an answer cannot read from torch.initial_seed() which test it is in, and the
    learner's kernel RNG stays as it was."""
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    _SEEN.clear()
    for name in SNAPSHOT_CHECKS:
        assert failure_of(getattr(checks, name), _spy_snapshot, seed=seed, variant=variant) is None
    for name in RESTORE_CHECKS:
        assert failure_of(getattr(checks, name), _spy_restore, seed=seed, variant=variant) is None
    assert set(_SEEN) == {(1234, state.sum().item())}
    assert torch.equal(torch.get_rng_state(), state)


def test_optimizer_load_state_dict_keeps_the_given_tensors_since_torch_2_1():
    """The version note of section 2: the installed torch (2.1 or later) keeps the state tensors it is given,
    the step counter included, when device and dtype already match."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 1)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    given = copy.deepcopy(optimizer.state_dict())
    optimizer.load_state_dict(given)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert optimizer.state[model.weight][key] is given["state"][0][key]
