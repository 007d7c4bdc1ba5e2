"""The instructor's flow with nbgrader's own commands, in a temporary course folder.

generate_assignment -> submissions (correct, wrong, untouched) -> autograde ->
generate_feedback -> export from the SQLite gradebook, asserted on the gradebook.
"""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.validator import Validator

from notebook_files import ROOT, built_once, fill_answers, solution_answers

NAME = "01_state_dict_aliasing"
BIN = Path(sys.executable).parent

WRONG_ANSWERS = {
    # snapshot keeps the live state dicts; restore hands the snapshot's tensors to the optimizer
    "snapshot_state": "def snapshot_state(model, optimizer):\n"
                      "    return {'model': model.state_dict(), 'optimizer': optimizer.state_dict()}\n",
    "restore_state": "def restore_state(model, optimizer, snapshot):\n"
                     "    model.load_state_dict(snapshot['model'])\n"
                     "    optimizer.load_state_dict(snapshot['optimizer'])\n",
}


def nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, capture_output=True, text=True, timeout=600)


def build_course(folder: Path) -> None:
    course = folder / "course"
    course.mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "solutions" / NAME, course / "solutions" / NAME)
    run = nbgrader(course, "generate_assignment", NAME)
    assert run.returncode == 0, run.stderr
    released = course / "notebooks" / NAME / f"{NAME}.ipynb"
    submissions = {
        "correct": fill_answers(released, solution_answers(course / "solutions" / NAME / f"{NAME}.ipynb")),
        "wrong": fill_answers(released, WRONG_ANSWERS),
        "untouched": nbformat.read(released, as_version=4),
    }
    for student, nb in submissions.items():
        submitted = course / "submitted" / student / NAME
        submitted.mkdir(parents=True)
        nbformat.write(nb, submitted / f"{NAME}.ipynb")
    for step in (["autograde", NAME, "--create"], ["generate_feedback", NAME], ["export"]):
        run = nbgrader(course, *step)
        assert run.returncode == 0, f"nbgrader {' '.join(step)} failed:\n{run.stderr}"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Built by the first worker that needs it, read by the others."""
    return built_once(tmp_path_factory, "nbgrader_pipeline", build_course) / "course"


def cell_scores(course: Path, student: str) -> dict:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_submission_notebook(NAME, NAME, student)
        return {grade.name: grade.score for grade in nb.grades}


def test_gradebook_holds_the_expected_scores(course):
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission(NAME, s).score for s in ("correct", "wrong", "untouched")}
    assert scores == {"correct": 10, "wrong": 3, "untouched": 0}


def test_wrong_submission_loses_exactly_the_aliasing_checks(course):
    scores = cell_scores(course, "wrong")
    assert scores == {"test_snapshot_state": 1, "test_snapshot_state_model": 0,
                      "test_snapshot_state_optimizer": 0, "test_restore_state": 2,
                      "test_restore_state_twice": 0}


def test_gradebook_agrees_with_the_self_check(course):
    from autograder.commands.check import grade_notebook
    for student in ("correct", "wrong", "untouched"):
        result = grade_notebook(course / "submitted" / student / NAME / f"{NAME}.ipynb")
        assert {t.grade_id: t.points for t in result.tests} == cell_scores(course, student)


def test_feedback_names_the_trap_but_never_shows_hidden_tests(course):
    html = (course / "feedback" / "wrong" / NAME / f"{NAME}.html").read_text()
    assert "shares storage with the live optimizer" in html
    assert "keeps using d&#39;s tensors" in html or "keeps using d's tensors" in html
    leaks = ("BEGIN HIDDEN TESTS", "seed=7", "variant=", "adam_batchnorm",  # hidden test source
             "most recent call last", "Cell In[", "state_dict_aliasing.py")  # traceback lines
    for hidden in leaks:
        assert hidden not in html, f"feedback leaks {hidden!r}"
    assert "hidden tests with other seeds and sizes ran here" in html


def test_feedback_wraps_a_long_failure_message(course):
    """nbconvert's page keeps each output line whole, so a failure message (one long line) ran off to the
    side; nbgrader_config.py's WrapLongOutputs adds the rule that wraps it (seen in Chromium by
    tests/project/test_jupyterhub.py)."""
    html = (course / "feedback" / "wrong" / NAME / f"{NAME}.html").read_text()
    assert "div.output_area pre { white-space: pre-wrap; overflow-wrap: anywhere; }" in html


def test_exported_grades_list_every_student(course):
    rows = list(csv.DictReader(open(course / "grades.csv")))
    assert {(r["student_id"], float(r["score"])) for r in rows} == {("correct", 10.0), ("wrong", 3.0), ("untouched", 0.0)}


def test_learner_validate_button_agrees(course):
    """nbgrader's Validator (what the Validate button runs) fails the stub and passes the solution."""
    validator = Validator()
    untouched = validator.validate(str(course / "submitted" / "untouched" / NAME / f"{NAME}.ipynb"))
    assert untouched.get("failed")
    correct = validator.validate(str(course / "submitted" / "correct" / NAME / f"{NAME}.ipynb"))
    assert not correct.get("failed") and not correct.get("changed")


def config_before_the_layout_change() -> str:
    """nbgrader_config.py as released before autograder/ was laid out by role: the same file with the
    module names of then."""
    config = (ROOT / "nbgrader_config.py").read_text()
    then = {"from autograder.contract import DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS":
            "from autograder.notebook_runner import DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS",
            "from autograder.grading.nbgrader_plugins import JudgeInSandbox, RedactHiddenTests":
            "from autograder.nbgrader_feedback import RedactHiddenTests\nfrom autograder.nbgrader_judge import JudgeInSandbox"}
    for now, before in then.items():
        assert now in config, now
        config = config.replace(now, before)
    return config


def test_a_course_set_up_before_the_layout_change_still_autogrades(tmp_path):
    """A course folder from the release before autograder/ was laid out by role keeps its own copy of
    nbgrader_config.py (it imports autograder.nbgrader_judge, .nbgrader_feedback and .notebook_runner)
    and its gradebook: autograde still judges in the sandbox, and feedback still hides the hidden tests."""
    name = "00_start_here"
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(config_before_the_layout_change())
    shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name)
    assert nbgrader(course, "generate_assignment", name).returncode == 0
    released = course / "notebooks" / name / f"{name}.ipynb"
    answers = {"correct": solution_answers(course / "solutions" / name / f"{name}.ipynb"),
               "wrong": {"same_weights": "def same_weights(a, b):\n    return a is b\n"}}
    for student, answer in answers.items():
        (course / "submitted" / student / name).mkdir(parents=True)
        nbformat.write(fill_answers(released, answer), course / "submitted" / student / name / f"{name}.ipynb")
    run = nbgrader(course, "autograde", name, "--create")
    assert run.returncode == 0 and "Judged 3 test cells" in run.stderr, run.stderr
    assert nbgrader(course, "generate_feedback", name).returncode == 0
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert {s: gb.find_submission(name, s).score for s in answers} == {"correct": 3, "wrong": 0}
    feedback = (course / "feedback" / "wrong" / name / f"{name}.html").read_text()
    assert "hidden tests with other seeds and sizes ran here" in feedback and "seed=3" not in feedback
