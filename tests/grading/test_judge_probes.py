"""A check that probes the submission's objects is judged outside, and a probe cannot be forged by patching.

Notebook 01's aliasing trap shows only where the model lives, so its check sends a probe into the
sandbox. A submission that disables training while the probe runs (so its live view never moves)
patches shared code: the judge puts it back and scores the test zero, naming what was changed.
"""

import nbformat

from autograder.complete_checkpoint import experiment
from autograder.course import SOLUTIONS_DIR
from autograder.grading.judge import judge_notebook

SOLUTIONS = SOLUTIONS_DIR

LIVE_VIEW = '''
def snapshot_state(model, optimizer):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
'''

# The same live view, hidden by making every later optimizer step a no-op while the probe runs.
LIVE_VIEW_WITH_FROZEN_TRAINING = '''
import torch

def snapshot_state(model, optimizer):
    torch.optim.Adam.step = lambda self, closure=None: None
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
'''

# Training frozen by a method added to Adam that shadows the one it inherits (Optimizer.zero_grad keeps the
# gradients: every step repeats the first), while the JSON encoder the report would travel through is
# patched to drop what the guard reports.
SHADOW_AND_SILENCE_THE_REPORT = '''
import json, threading, time, torch

def snapshot_state(model, optimizer):
    def keep_going():
        while True:
            torch.optim.Adam.step = lambda self, closure=None: None
            json.encoder.c_make_encoder = None
            json.JSONEncoder.encode = lambda self, o: json.dumps({k: v for k, v in o.items() if k != "tampered"})
            time.sleep(0.001)
    threading.Thread(target=keep_going, daemon=True).start()
    torch.optim.Adam.zero_grad = lambda self, set_to_none=True: None
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
'''

# The same live view, hidden by replacing step on the very optimizer the probe hands it: no shared code changes.
LIVE_VIEW_WITH_STEP_REPLACED_ON_THE_INSTANCE = '''
def snapshot_state(model, optimizer):
    optimizer.step = lambda *args, **kwargs: None
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
'''

COPY = '''
import copy

def snapshot_state(model, optimizer):
    return copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
'''

TEST = "from autograder.state_dict_aliasing import check_snapshot_state_model\ncheck_snapshot_state_model(snapshot_state)"


def _judged(answer: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(answer, metadata={"nbgrader": {"solution": True, "grade": False,
                                                                         "grade_id": "snapshot_state"}}),
                nbformat.v4.new_code_cell(TEST, metadata={"nbgrader": {"solution": False, "grade": True, "points": 1,
                                                                       "grade_id": "test_snapshot_state_model"}})]
    (verdict,) = judge_notebook(nb, cell_seconds=60).verdicts
    return verdict


def test_a_correct_snapshot_passes_outside():
    verdict = _judged(COPY)
    assert verdict.passed and verdict.outside and verdict.stdout.startswith("✓")


def test_a_live_view_fails_outside_naming_the_trap():
    verdict = _judged(LIVE_VIEW)
    assert not verdict.passed and verdict.outside
    assert "shares storage with the live model's tensor" in verdict.message


def test_freezing_training_during_the_probe_scores_zero_and_says_what_was_patched():
    verdict = _judged(LIVE_VIEW_WITH_FROZEN_TRAINING)
    assert not verdict.passed and verdict.error["ename"] == "SubmissionStopped"
    assert "torch.optim.Adam.step" in verdict.error["evalue"]


def test_a_shadowing_method_and_a_patched_report_path_still_score_zero():
    verdict = _judged(SHADOW_AND_SILENCE_THE_REPORT)
    assert not verdict.passed and verdict.error["ename"] == "SubmissionStopped", verdict
    assert "torch.optim.Adam.zero_grad" in verdict.error["evalue"] or "Adam.step" in verdict.error["evalue"]


def test_freezing_training_on_the_objects_the_probe_hands_over_fails_naming_it():
    verdict = _judged(LIVE_VIEW_WITH_STEP_REPLACED_ON_THE_INSTANCE)
    assert not verdict.passed and verdict.outside
    assert "optimizer.step replaced on the instance" in verdict.message


def test_consecutive_test_cells_share_the_submissions_names_as_in_a_kernel(monkeypatch):
    """Notebook 03's four load checks share one resume experiment per argument set, in graded mode too."""
    runs = []
    real = experiment.run_resume_experiment
    monkeypatch.setattr(experiment, "run_resume_experiment", lambda *a, **k: runs.append(a[2:]) or real(*a, **k))
    experiment._RECENT_EXPERIMENTS.clear()
    nb = nbformat.read(SOLUTIONS / "03_complete_checkpoint" / "03_complete_checkpoint.ipynb", as_version=4)
    verdicts = judge_notebook(nb, cell_seconds=120).verdicts
    assert [v.grade_id for v in verdicts if not (v.passed and v.outside)] == []
    assert len(runs) == len(set(runs)) > 0      # each argument set once, not once per test cell
