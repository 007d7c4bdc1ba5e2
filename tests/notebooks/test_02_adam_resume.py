"""Notebook 02: Adam's bias correction on resume. The checks, driven on right and wrong implementations."""

import os

import nbformat
import numpy as np
import pytest
import torch

from autograder import adam_resume as checks
from autograder.adam_resume.problem import _TorchReference
from autograder.course import NOTEBOOKS
from autograder.engine import fresh_process
from check_outcomes import failure_of
from fixtures import adam_resume_impls as impls
from notebook_checks import lost_checks



def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_adam_step, None)


def test_weights_only_restart_moves_every_weight_by_lr():
    """The prediction the notebook plots, against torch.optim.Adam itself."""
    trained = _TorchReference(0, {"lr": 0.05})
    w = trained.advance(40)
    g = trained.problem.grad(w)
    restarted = trained.branch({"lr": 0.05}, fresh=True).advance(1)
    np.testing.assert_allclose(np.abs(restarted - w), 0.05, rtol=1e-4)  # |g| >> eps
    continued = trained.branch().advance(1)
    assert np.all(np.abs(continued - w) < 0.05)
    assert np.array_equal(np.sign(w - restarted), np.sign(g))


def test_torch_adam_state_keys_the_notebook_shows():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    optimizer = torch.optim.Adam([p])
    p.grad = torch.ones(3, dtype=torch.float64)
    optimizer.step()
    assert set(optimizer.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(optimizer.state_dict()["state"][0]["step"]) == 1.0


def test_a_wrong_default_learning_rate_is_caught_by_the_hidden_call():
    assert failure_of(checks.check_adam_step, impls.adam_step_default_lr_too_high, lr=0.01, beta1=0.85,
                      beta2=0.995) is None
    message = failure_of(checks.check_adam_step, impls.adam_step_default_lr_too_high, seed=3)
    assert "10 times PyTorch's" in message and "your signature's default" in message


def test_the_notebook_measures_how_much_larger_sqrt_v_hat_is_than_g():
    """Section 2's claim about the run that never stopped is printed from the run, not asserted in prose."""
    adam = _TorchReference(0, {"lr": 0.05})
    problem = adam.problem
    adam.advance(150)
    t = adam.state["t"]
    ratio = np.sqrt(adam.state["v"] / (1 - 0.999 ** t)) / np.abs(problem.grad(adam.w))
    assert ratio.min() > 100 and ratio.max() / ratio.min() > 10   # far larger, by no single factor
    notebook = next(n for n in NOTEBOOKS if n.number == "02")
    cells = nbformat.read(str(notebook.source()), as_version=4).cells
    assert not any("hundreds of times" in c.source for c in cells)
    assert any("sqrt(v_hat) / |g|" in c.source and c.cell_type == "code" for c in cells)


# ---- only what is on disk gets through: the save runs in a process of its own -------------------

def test_a_checkpoint_kept_in_memory_beside_a_placeholder_is_named():
    """Something is on disk, and a resume in the saving process finds the arrays: only a resume in another
    process shows that the file holds nothing."""
    assert failure_of(checks.check_save_checkpoint, impls.save_placeholder_and_copies) is None
    for check, resume in ((checks.check_resume_from_full_checkpoint, impls.resume_full_from_copies),
                          (checks.check_resume_from_weights_only, impls.resume_weights_only_from_copies)):
        message = failure_of(lambda _: check(resume, impls.save_placeholder_and_copies), None)
        assert message.startswith("The checkpoint was not really on disk: the resume in a fresh process found")
        assert "KeyError: 'path'" in message  # the learner's own error, without the made-up folder


def test_a_resume_that_reads_other_values_than_were_saved_is_named():
    """No error, but the values come from memory (the last save this process made), not from the file."""
    last = {}

    def save(path, w, state):
        impls.save_npz(path, w, state)
        last["saved"] = (w.copy(), {k: np.copy(v) for k, v in state.items()})

    def resume(path):
        w, state = last["saved"]
        return w.copy(), {k: np.copy(v) for k, v in state.items()}

    last["saved"] = (np.zeros(5), checks.new_adam_state(np.zeros(5)))  # what the notebook's own run left
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(resume, save), None)
    assert "not really on disk" in message and "returned other values than were saved (weights: max |diff|" in message


class CheckpointStorageFull(Exception):
    pass


@pytest.mark.parametrize("error", [ValueError("no space left for the checkpoint"), NotImplementedError(),
                                   CheckpointStorageFull("quota exceeded")], ids=lambda e: type(e).__name__)
def test_an_error_of_the_save_reaches_the_learner_as_raised(error):
    """The save raises in its own process; the learner sees its type and message, as from a save run here
    (an unanswered exercise still reads as NotImplementedError)."""
    def save(path, w, state):
        raise error

    with pytest.raises(Exception) as caught:
        checks.check_resume_from_full_checkpoint(impls.resume_full_npz, save)
    assert type(caught.value).__name__ == type(error).__name__ and str(caught.value) == str(error)


def test_a_resume_that_fails_by_itself_raises_its_own_error():
    """Failing in the saving process too, it is a bug of the resume, not a checkpoint kept in memory."""
    def resume(path):
        with np.load(path) as saved:
            return saved["weights"], {}

    with pytest.raises(KeyError, match="weights"):
        checks.check_resume_from_full_checkpoint(resume, impls.save_npz)


def test_a_save_that_ends_its_process_is_reported():
    def save(path, w, state):
        os._exit(3)

    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(impls.resume_full_npz, save), None)
    assert message.startswith("save_checkpoint, run in a process of its own, did not return")


def test_without_fork_the_round_trip_runs_in_one_process(monkeypatch):
    """Where there is no fork (Windows), the save runs in the checking process: correct formats still pass,
    and a checkpoint that only keeps references still fails (weaker: copies kept in memory would pass)."""
    monkeypatch.setattr(fresh_process, "AVAILABLE", False)
    assert lost_checks("02", impls.CORRECT["save_checkpoint"][0]) == {}
    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(
        impls.resume_full_in_memory, impls.save_in_memory), None)
    assert "not really on disk" in message


def test_the_checkpoint_is_the_file_at_path(tmp_path):
    def save_by_name(path, w, state):
        np.savez(path, w=w, m=state["m"], v=state["v"], t=state["t"])  # writes path + ".npz"

    def save_empty(path, w, state):
        open(path, "wb").close()
        impls.save_npz(path + ".real", w, state)

    message = failure_of(checks.check_save_checkpoint, save_by_name)
    assert "no file at `path`, only adam.ckpt.npz" in message and "append .npz" in message
    assert "left an empty file at `path`" in failure_of(checks.check_save_checkpoint, save_empty)


def test_the_control_round_trip_cannot_be_told_from_the_real_one(tmp_path):
    """Where the resume from the file alone fails, a save and resume in one process are tried as a control:
    with the same file name, so that nothing in the path says which of the two is running."""
    log = tmp_path / "paths.txt"

    def save(path, w, state):
        with open(log, "a") as f:
            f.write(path + "\n")
        impls.save_placeholder_and_copies(path, w, state)

    message = failure_of(lambda _: checks.check_resume_from_full_checkpoint(impls.resume_full_from_copies, save),
                         None)
    assert "not really on disk" in message
    paths = log.read_text().split()
    assert len(paths) == 2 and len(set(paths)) == 2 and {os.path.basename(p) for p in paths} == {"adam.ckpt"}
