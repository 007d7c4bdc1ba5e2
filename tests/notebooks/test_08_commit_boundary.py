"""Notebook 08, the commit boundary: the training loop's policies behave as the notebook says,
and the capstone's checks accept every correct resume_equivalent and catch each wrong one.
"""

import pytest
import torch

from autograder import commit_boundary as checks
from autograder.commit_boundary import BROKEN_POLICIES, CORRECT_POLICIES, new_run_factory
from check_outcomes import failure_of
from fixtures import commit_boundary_impls as impls
from notebook_checks import lost_checks

def final_weights_after_crash(policy, crash_at, total=16, seed=0, accum_steps=4):
    new_run, resume_run = new_run_factory(seed, accum_steps, policy)
    crashed = new_run()
    crashed.train(crash_at)
    blob = crashed.checkpoint()
    torch.manual_seed(12345)                      # what a new process would have
    resumed = resume_run(blob)
    resumed.train(total - resumed.position)
    return resumed.weights()


def uninterrupted_weights(total=16, seed=0, accum_steps=4):
    run = new_run_factory(seed, accum_steps)[0]()
    run.train(total)
    return run.weights()


@pytest.mark.parametrize("policy", CORRECT_POLICIES)
@pytest.mark.parametrize("crash_at", [8, 11])
def test_correct_resumes_match_the_uninterrupted_run_bitwise(policy, crash_at):
    reference, resumed = uninterrupted_weights(), final_weights_after_crash(policy, crash_at)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)


@pytest.mark.parametrize("policy", BROKEN_POLICIES)
def test_each_broken_resume_diverges_mid_update(policy):
    reference, resumed = uninterrupted_weights(), final_weights_after_crash(policy, 11)
    assert max(float((reference[k] - resumed[k]).abs().max()) for k in reference) > 1e-3


def test_claiming_uncommitted_microbatches_is_harmless_only_at_the_boundary():
    reference = uninterrupted_weights()
    at_boundary = final_weights_after_crash("claims_uncommitted", 8)
    assert all(torch.equal(reference[k], at_boundary[k]) for k in reference)


def test_commit_boundary_checkpoint_rolls_back_to_the_last_update():
    new_run, resume_run = new_run_factory(policy="commit_boundary")
    crashed = new_run()
    crashed.train(11)
    assert resume_run(crashed.checkpoint()).position == 8


def test_transaction_refuses_gradients_from_a_different_data_order():
    new_run, _ = new_run_factory(policy="transaction")
    crashed = new_run()
    crashed.train(11)
    state = checks._from_bytes(crashed.checkpoint())
    state["config"]["seed"] += 1
    with pytest.raises(RuntimeError, match="data order changed"):
        checks.AccumulationRun.resume(checks._to_bytes(state))


def test_checks_leave_the_learners_rng_alone():
    torch.manual_seed(42)
    before = torch.get_rng_state()
    failure_of(checks.check_resume_equivalent_catches_changed_seed, impls.resume_equivalent)
    assert torch.equal(before, torch.get_rng_state())


def test_a_checker_that_always_says_false_fails_the_correct_resume():
    def always_false(*args, **kwargs):
        return False
    assert set(lost_checks("08", always_false, {"check_resume_equivalent_accepts_correct_resume"})) == {
        "check_resume_equivalent_accepts_correct_resume"}
