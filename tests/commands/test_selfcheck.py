"""The self-check command on bad input: a clear per-exercise message and a zero, never a crash or a hang."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.commands.check import grade_notebook
from autograder.contract import nbgrader_meta, score_test_cell
from notebook_files import ROOT, fill_answers, solution_answers

NAME = "01_state_dict_aliasing"
RELEASED = ROOT / "notebooks" / NAME / f"{NAME}.ipynb"
SOLUTION = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
WORKBOOK_CHECK = str(Path(sys.executable).parent / "workbook-check")
SNAPSHOT_TESTS = {"test_snapshot_state", "test_snapshot_state_model", "test_snapshot_state_optimizer"}
RESTORE_TESTS = {"test_restore_state", "test_restore_state_twice"}


def submission(tmp_path, nb) -> Path:
    path = tmp_path / f"{NAME}.ipynb"  # the learner's file keeps its name
    nbformat.write(nb, path)
    return path


def by_id(result):
    return {t.grade_id: t for t in result.tests}


@pytest.fixture
def answered():
    return fill_answers(RELEASED, solution_answers(SOLUTION))


def test_not_a_notebook_zeroes_every_exercise_with_a_clear_message(tmp_path):
    path = tmp_path / f"{NAME}.ipynb"
    path.write_text('{"cells": [ this is not json')
    result = grade_notebook(path)
    assert set(by_id(result)) == SNAPSHOT_TESTS | RESTORE_TESTS
    assert result.score == 0 and "could not be read as a notebook" in result.error
    assert all("could not be read" in t.message for t in result.tests)


def test_deleted_answer_cell_costs_only_its_exercise(tmp_path, answered):
    answered.cells = [c for c in answered.cells if nbgrader_meta(c).get("grade_id") != "restore_state"]
    tests = by_id(grade_notebook(submission(tmp_path, answered)))
    assert all(tests[g].passed for g in SNAPSHOT_TESTS)
    for grade_id in RESTORE_TESTS:
        assert tests[grade_id].points == 0
        assert "answer cell for `restore_state` is missing" in tests[grade_id].message


def test_renamed_function_is_reported_by_name(tmp_path):
    answers = solution_answers(SOLUTION)
    answers["snapshot_state"] = answers["snapshot_state"].replace("def snapshot_state", "def take_snapshot")
    tests = by_id(grade_notebook(submission(tmp_path, fill_answers(RELEASED, answers))))
    assert all(tests[g].passed for g in RESTORE_TESTS)
    for grade_id in SNAPSHOT_TESTS:
        assert "`snapshot_state` is not defined" in tests[grade_id].message and tests[grade_id].points == 0


def test_endless_loop_in_an_answer_cell_is_stopped_and_grading_goes_on(tmp_path):
    answers = solution_answers(SOLUTION)
    answers["snapshot_state"] += "\n\nwhile True:\n    pass\n"
    # 20 s a cell: the limit must leave every other cell room on a loaded machine with torch's CUDA build, whose
    # import in the restarted kernel takes ~3.6 s (2.5 s for the CPU build).
    result = grade_notebook(submission(tmp_path, fill_answers(RELEASED, answers)), timeout=20)
    tests = by_id(result)
    assert all(tests[g].passed for g in RESTORE_TESTS)
    for grade_id in SNAPSHOT_TESTS:
        assert tests[grade_id].points == 0
        assert "did not finish" in tests[grade_id].message and "stopped after 20 s" in tests[grade_id].message


def test_killing_the_kernel_costs_only_the_cells_that_kill_it(tmp_path):
    answers = solution_answers(SOLUTION)
    answers["snapshot_state"] = ("def snapshot_state(model, optimizer):\n"
                                 "    import os, signal\n"
                                 "    os.kill(os.getpid(), signal.SIGKILL)\n")
    tests = by_id(grade_notebook(submission(tmp_path, fill_answers(RELEASED, answers))))
    assert all(tests[g].passed for g in RESTORE_TESTS)
    for grade_id in SNAPSHOT_TESTS:
        assert tests[grade_id].points == 0 and "kernel died" in tests[grade_id].message


def test_edited_test_cell_is_restored_before_grading(tmp_path):
    nb = nbformat.read(RELEASED, as_version=4)  # unanswered...
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade_id") == "test_snapshot_state":
            cell.source = "print('✓ all good')"  # ...with a forged test cell
    tests = by_id(grade_notebook(submission(tmp_path, nb)))
    assert tests["test_snapshot_state"].points == 0
    assert "not answered yet" in tests["test_snapshot_state"].message


def test_deleted_test_cell_is_listed_with_zero(tmp_path, answered):
    answered.cells = [c for c in answered.cells
                      if nbgrader_meta(c).get("grade_id") != "test_restore_state_twice"]
    tests = by_id(grade_notebook(submission(tmp_path, answered)))
    assert tests["test_restore_state_twice"].points == 0
    assert "missing from the notebook" in tests["test_restore_state_twice"].message
    assert tests["test_restore_state"].passed


def test_command_prints_json_schema_and_exit_status(tmp_path):
    wrong = solution_answers(SOLUTION)
    wrong["restore_state"] = ("def restore_state(model, optimizer, snapshot):\n"
                              "    model.load_state_dict(snapshot['model'])\n"
                              "    optimizer.load_state_dict(snapshot['optimizer'])\n")
    path = submission(tmp_path, fill_answers(RELEASED, wrong))
    run = subprocess.run([WORKBOOK_CHECK, "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["schema"] == "workbook-check/1" and report["passed"] is False
    (notebook,) = report["notebooks"]
    assert (notebook["score"], notebook["max_score"]) == (7, 10)
    failed = [t for t in notebook["tests"] if not t["passed"]]
    assert [t["grade_id"] for t in failed] == ["test_restore_state_twice"]
    assert "keeps using d's tensors" in failed[0]["message"]
    assert set(failed[0]) == {"grade_id", "exercise", "points", "max_points", "passed", "message"}


def test_command_exits_zero_on_a_fully_correct_notebook_and_prints_a_table():
    run = subprocess.run([WORKBOOK_CHECK, str(SOLUTION)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_restore_state_twice" in run.stdout and "10 / 10 points" in run.stdout
    assert run.stderr == ""


def test_unknown_notebook_name_is_a_clear_error():
    run = subprocess.run([WORKBOOK_CHECK, "99"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "no notebook matches '99'" in run.stderr


_OUTPUTS = {
    "nothing": [],
    "a pass line": [nbformat.v4.new_output("stream", name="stdout", text="✓ fine\n")],
    "a warning": [nbformat.v4.new_output("stream", name="stderr", text="UserWarning: hm\n")],
    "an error": [nbformat.v4.new_output("error", ename="AssertionError", evalue="no", traceback=[])],
    "output then error": [nbformat.v4.new_output("stream", name="stdout", text="x\n"),
                          nbformat.v4.new_output("error", ename="ValueError", evalue="", traceback=[])],
    "a partial grade": [nbformat.v4.new_output("execute_result", data={"text/plain": "0.5"}, execution_count=1)],
    "a result that is no grade": [nbformat.v4.new_output("execute_result", data={"text/plain": "'ok'"},
                                                         execution_count=1)],
}


@pytest.mark.parametrize("shows", list(_OUTPUTS))
def test_test_cells_are_scored_exactly_as_nbgrader_scores_them(shows):
    # The self-check scores test cells without importing nbgrader (a second of start-up); same rule.
    from nbgrader.utils import determine_grade
    cell = nbformat.v4.new_code_cell("check(answer)", outputs=_OUTPUTS[shows])
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": 2,
                                 "grade_id": "test_answer", "schema_version": 3}
    points, max_points = determine_grade(cell)
    assert score_test_cell(cell) == (float(points or 0), float(max_points))
