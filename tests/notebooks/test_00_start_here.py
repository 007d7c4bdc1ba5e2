"""Notebook 00: the warm-up `same_weights`. The checks, driven on right and wrong implementations."""

import copy

import pytest
import torch

from autograder import start_here as checks
from check_outcomes import failing_checks, failure_of
from fixtures import start_here_impls as impls
from notebook_checks import checks_of

CHECKS = checks_of("00")



@pytest.mark.parametrize("constant", [True, False])
def test_a_constant_answer_fails_every_check(constant):
    assert failing_checks(checks, CHECKS, lambda a, b: constant) == set(CHECKS)


def test_a_non_boolean_answer_is_explained():
    message = failure_of(checks.check_same_weights, lambda a, b: "yes")
    assert "should return True or False" in message


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_same_weights, None)


def test_checks_leave_no_output_on_stderr(capsys):
    """nbgrader scores a test cell with any stderr as zero."""
    for name in CHECKS:
        getattr(checks, name)(impls.same_weights_torch_equal)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.count("✓") == len(CHECKS)


def test_torch_behaviour_the_notebook_teaches():
    """The facts notebook 00 is built on, against the installed torch."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state_keys = set(model.state_dict())
    parameter_names = {name for name, _ in model.named_parameters()}
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= state_keys - parameter_names
    twin = copy.deepcopy(model)
    with torch.no_grad():
        w = twin[0].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
    assert torch.allclose(model[0].weight, twin[0].weight)       # a tolerance calls them equal
    assert not torch.equal(model[0].weight, twin[0].weight)      # exact comparison does not


def test_torch_facts_the_exercise_text_and_messages_state():
    """torch.equal's reading of signed zeros and NaN (the exercise accepts it and a bit comparison alike),
    and num_batches_tracked: an int64 buffer that a BatchNorm made with momentum=None averages over."""
    assert torch.equal(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert not torch.equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    norm = torch.nn.BatchNorm1d(2, momentum=None)
    batches = [torch.randn(8, 2, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    for batch in batches:
        norm(batch)
    assert norm.num_batches_tracked.dtype == torch.int64 and int(norm.num_batches_tracked) == 3
    assert torch.allclose(norm.running_mean, torch.stack([b.mean(0) for b in batches]).mean(0))
