"""Notebook 08, the commit boundary: the training loop's policies behave as the notebook says,
and the capstone's checks accept every correct resume_equivalent and catch each wrong one.
"""

import io
import pickle

import nbformat
import pytest
import torch

from autograder import commit_boundary as checks
from autograder.commit_boundary import (BROKEN_POLICIES, CHECKPOINTING, CORRECT_POLICIES, POLICIES, RESUMING,
                                        new_run_factory, run_with_a_crash, uninterrupted_run)
from autograder.commit_boundary import training_loop
from autograder.course import NOTEBOOKS
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
    state = training_loop._from_bytes(crashed.checkpoint())
    state["config"]["seed"] += 1
    with pytest.raises(RuntimeError, match="data order changed"):
        checks.AccumulationRun.resume(training_loop._to_bytes(state))


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


# ---- what resume_equivalent is handed names no scenario ----------------------------------------

LABELS = set(POLICIES) | set(CHECKPOINTING) | set(RESUMING) | {"policy"}


def _strings(value):
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in value.items()))
    if isinstance(value, (list, tuple, set)):
        return set().union(set(), *(_strings(v) for v in value))
    return set()


@pytest.mark.parametrize("policy", POLICIES)
def test_nothing_handed_to_resume_equivalent_names_the_policy(policy):
    """What pickle sends of new_run and resume_run, the run's own attributes, and its checkpoint's contents
    hold numbers and neutral names: an answer cannot read which scenario a check is testing."""
    new_run, resume_run = new_run_factory(3, 3, policy)
    sent = pickle.loads(pickle.dumps((new_run, resume_run)))
    assert not _strings([new_run.__reduce__()[1:], resume_run.__reduce__()[1:]])
    assert [type(x).__name__ for x in sent] == ["NewRun", "ResumeRun"]
    assert not any(hasattr(x, "__dict__") or hasattr(x, "keywords") for x in (new_run, resume_run))
    run = new_run()
    run.train(5)
    assert not LABELS & _strings({k: v for k, v in vars(run).items() if isinstance(v, (str, dict, list, tuple))})
    assert not LABELS & _strings(torch.load(io.BytesIO(run.checkpoint()), weights_only=True))
    assert not LABELS & {repr(new_run), repr(resume_run), type(run).__name__}


def test_a_resume_of_the_parameters_only_differs_in_the_buffer_alone():
    """The comparison check's single-tensor scenario: a tensor in the middle of weights(), and only that one."""
    reference = uninterrupted_run(0, 4, 12)
    got = run_with_a_crash("buffers_not_restored", 0, 4, 12, 8)
    differing = [name for name in reference if not torch.equal(reference[name], got[name])]
    assert differing == ["2.running_mean"] and list(reference).index("2.running_mean") not in (0, len(reference) - 1)


@pytest.mark.parametrize("args", [(0, 4, 12, 8), (7, 3, 15, 6)])   # the comparison check's calls in the notebook
def test_a_resume_whose_last_bits_differ_ends_a_few_ulps_away(args):
    seed, accum_steps, total, crash_at = args
    reference = uninterrupted_run(seed, accum_steps, total)
    got = run_with_a_crash("last_bits_differ", *args)
    largest = max(float((got[k] - reference[k]).abs().max()) for k in reference)
    assert 0 < largest < 1e-6
    assert all(torch.allclose(got[k], reference[k]) for k in reference)   # allclose's defaults accept it


def test_the_reproducibility_table_is_the_same_in_notebooks_03_and_08():
    """One story: both notebooks show the very same table of the reproducibility boundary."""
    cells = []
    for number in ("03", "08"):
        nb = nbformat.read(str(next(n for n in NOTEBOOKS if n.number == number).source()), as_version=4)
        cells.append([c.source for c in nb.cells if c.get("id") == "reproducibility-boundary"])
    assert len(cells[0]) == len(cells[1]) == 1 and cells[0] == cells[1]
    for named in ("torch.backends.cudnn.benchmark", "torch.use_deterministic_algorithms(True)",
                  "CUBLAS_WORKSPACE_CONFIG", "`torch.equal`", "a declared tolerance"):
        assert named in cells[0][0]


def test_torch_behaviour_the_table_states():
    """What the table says of the installed torch: cuDNN's autotuner is off by default; the deterministic
    flag keeps this loop's bits; the release's documentation of the flag no longer asks for
    CUBLAS_WORKSPACE_CONFIG (PyTorch 2.7's did)."""
    assert torch.backends.cudnn.benchmark is False
    assert "CUBLAS_WORKSPACE_CONFIG" not in torch.use_deterministic_algorithms.__doc__
    plain = uninterrupted_run(0, 4, 12)
    torch.use_deterministic_algorithms(True)
    try:
        flagged = uninterrupted_run(0, 4, 12)
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(plain[k], flagged[k]) for k in plain)
