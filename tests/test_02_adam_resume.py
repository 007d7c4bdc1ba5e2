"""Notebook 02: Adam's bias correction on resume. The checks, driven on right and wrong implementations."""

import numpy as np
import pytest
import torch

from autograder import adam_resume as checks
from check_outcomes import failing_checks, failure_of
from fixtures import adam_resume_impls as impls

# The visible test arguments and the hidden ones, as the notebook's test cells use them.
ADAM_STEP_ARGUMENTS = [dict(lr=0.01, beta1=0.85, beta2=0.995), dict(seed=5, lr=0.1, beta1=0.8, beta2=0.99, eps=1e-6)]
TRAIN_ARGUMENTS = [dict(lr=0.02), dict(seed=4, first=3, then=20, lr=0.1, beta1=0.8)]
CHECKPOINT_ARGUMENTS = [dict(), dict(seed=6, k=35, n=60, lr=0.02, beta2=0.99)]


def _ids(kwargs):
    return "hidden" if kwargs.get("seed") else "visible"


def failing_format_checks(save, resume_full, resume_weights_only, **kwargs):
    """Which checkpoint checks fail for one (save, full resume, weights-only resume) triple."""
    calls = {
        "check_save_checkpoint": lambda: checks.check_save_checkpoint(
            save, **{k: v for k, v in kwargs.items() if k not in ("n",)}),
        "check_resume_from_full_checkpoint": lambda: checks.check_resume_from_full_checkpoint(
            resume_full, save, **kwargs),
        "check_resume_from_weights_only": lambda: checks.check_resume_from_weights_only(
            resume_weights_only, save, **{k: v for k, v in kwargs.items() if k != "n"}),
    }
    return {name for name, call in calls.items() if failure_of(lambda _: call(), None)}


@pytest.mark.parametrize("kwargs", ADAM_STEP_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("adam_step", impls.CORRECT_ADAM_STEPS, ids=lambda f: f.__name__)
def test_correct_adam_steps_pass(adam_step, kwargs):
    assert failing_checks(checks, impls.ADAM_STEP_CHECKS, adam_step, **kwargs) == set()


@pytest.mark.parametrize("kwargs", ADAM_STEP_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("wrong", list(impls.WRONG_ADAM_STEPS), ids=lambda f: f.__name__)
def test_each_adam_step_trap_loses_exactly_its_checks(wrong, kwargs):
    assert failing_checks(checks, impls.ADAM_STEP_CHECKS, wrong, **kwargs) == impls.WRONG_ADAM_STEPS[wrong]


@pytest.mark.parametrize("kwargs", TRAIN_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("train", impls.CORRECT_TRAINS, ids=lambda f: f.__name__)
def test_correct_training_loops_pass(train, kwargs):
    assert failing_checks(checks, impls.TRAIN_CHECKS, train, **kwargs) == set()


@pytest.mark.parametrize("kwargs", TRAIN_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("wrong", list(impls.WRONG_TRAINS), ids=lambda f: f.__name__)
def test_each_training_loop_trap_loses_exactly_its_check(wrong, kwargs):
    assert failing_checks(checks, impls.TRAIN_CHECKS, wrong, **kwargs) == impls.WRONG_TRAINS[wrong]


@pytest.mark.parametrize("kwargs", CHECKPOINT_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("triple", impls.CORRECT_FORMATS, ids=lambda t: t[0].__name__)
def test_correct_checkpoint_formats_pass(triple, kwargs):
    assert failing_format_checks(*triple, **kwargs) == set()


@pytest.mark.parametrize("kwargs", CHECKPOINT_ARGUMENTS, ids=_ids)
@pytest.mark.parametrize("triple", list(impls.WRONG_FORMATS), ids=lambda t: "-".join(f.__name__ for f in t))
def test_each_checkpoint_trap_loses_exactly_its_checks(triple, kwargs):
    assert failing_format_checks(*triple, **kwargs) == impls.WRONG_FORMATS[triple]


def test_missing_bias_correction_is_named_on_the_first_step():
    message = failure_of(checks.check_adam_step, impls.adam_step_no_bias_correction)
    assert "t=1" in message and "about lr" in message and "zero start" in message


def test_step_count_reset_on_resume_is_named():
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_without_step_count, impls.save_without_step_count), None)
    assert "t = 0" in message and "bias correction" in message


def test_weights_only_disguised_as_full_resume_is_caught():
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_is_weights_only, impls.save_npz), None)
    assert "restarted" in message


def test_missing_second_moment_in_checkpoint_is_named():
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_without_second_moment, impls.save_without_second_moment), None)
    assert "second moment v" in message and "all zeros" in message


def test_float32_checkpoint_is_named():
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_float32, impls.save_float32), None)
    assert "float32" in message


def test_in_memory_checkpoint_is_named():
    assert "wrote nothing to disk" in failure_of(checks.check_save_checkpoint, impls.save_in_memory)
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_in_memory, impls.save_in_memory), None)
    assert "not really on disk" in message


def test_state_kept_in_a_local_dict_is_named():
    message = failure_of(checks.check_adam_step_state, impls.adam_step_state_rebound)
    assert "in place" in message


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_adam_step, None)


def test_weights_only_restart_moves_every_weight_by_lr():
    """The prediction the notebook plots, against torch.optim.Adam itself."""
    problem = checks.regression_problem(0)
    trained = checks.TorchAdam(problem.w0, lr=0.05)
    w = trained.run(problem.grad, 40)
    g = problem.grad(w)
    restarted = checks.TorchAdam(w, lr=0.05).run(problem.grad, 1)
    np.testing.assert_allclose(np.abs(restarted - w), 0.05, rtol=1e-4)  # |g| >> eps
    continued = checks.TorchAdam(w, trained.state, lr=0.05).run(problem.grad, 1)
    assert np.all(np.abs(continued - w) < 0.05)
    assert np.array_equal(np.sign(w - restarted), np.sign(g))


def test_torch_adam_state_keys_the_notebook_shows():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = torch.optim.Adam([p])
    p.grad = torch.ones(3, dtype=torch.float64)
    optimizer.step()
    assert set(optimizer.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(optimizer.state_dict()["state"][0]["step"]) == 1.0


@pytest.mark.parametrize("adam_step", impls.CORRECT_ADAM_STEPS, ids=lambda f: f.__name__)
def test_the_hidden_call_with_default_hyperparameters_passes_correct_steps(adam_step):
    assert failure_of(checks.check_adam_step, adam_step, seed=3) is None


def test_a_wrong_default_learning_rate_is_caught_by_the_hidden_call():
    def adam_step_default_lr_too_high(w, g, state, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8):
        return impls.adam_step_textbook(w, g, state, lr, beta1, beta2, eps)
    assert failure_of(checks.check_adam_step, adam_step_default_lr_too_high, lr=0.01, beta1=0.85,
                      beta2=0.995) is None
    assert "10 times PyTorch's" in failure_of(checks.check_adam_step, adam_step_default_lr_too_high, seed=3)
