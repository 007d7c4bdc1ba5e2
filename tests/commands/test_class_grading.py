"""Grading a whole class in parallel (``workbook-grade``) against nbgrader's own ``autograde``.

Uses a tiny assignment built in code (two exercises, three test cells, no torch) so the
kernels start in a second: what is tested is the grading pipeline, not a notebook.
The same submissions are graded by ``nbgrader autograde`` in one course folder and by
``workbook-grade`` in a copy, and the two gradebooks are compared cell by cell.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import class_grading
from autograder.commands.class_summary import (CRASHED, MISSING, NOT_ANSWERED, UNGRADABLE, failure_kind, summarize)
from notebook_files import (ROOT, built_once, fill_answers, nbgrader_cell, nbgrader_in_process, new_course, own_copy,
                            run_nbgrader, source_notebook, submit)

NAME = "toy"
CELL_TIMEOUT = 3  # seconds: the hanging submission is stopped quickly
ADD_TRAP = "add dropped the second number"

ANSWERS = {
    "correct": {"add": "def add(a, b):\n    return b + a", "double": "def double(x):\n    return x + x"},
    "wrong": {"add": "def add(a, b):\n    return a - b", "double": "def double(x):\n    return abs(2 * x)"},
    "wrong2": {"add": "def add(a, b):\n    return a", "double": "def double(x):\n    return 2 * x"},
    "hang": {"add": "while True:\n    pass", "double": "def double(x):\n    return 2 * x"},
    "crash": {"add": "def add(a, b):\n    return a + b", "double": "import os\nos._exit(1)"},
}
# Every student's expected score per test cell (test_add 1 pt, test_double 2, test_double_negative 1).
EXPECTED = {
    "correct": {"test_add": 1, "test_double": 2, "test_double_negative": 1},
    "wrong": {"test_add": 0, "test_double": 2, "test_double_negative": 0},
    "wrong2": {"test_add": 0, "test_double": 2, "test_double_negative": 1},
    "untouched": {"test_add": 0, "test_double": 0, "test_double_negative": 0},
    "hang": {"test_add": 0, "test_double": 2, "test_double_negative": 1},    # only the hanging exercise lost
    "crash": {"test_add": 1, "test_double": 0, "test_double_negative": 0},   # cells before the crash keep theirs
    "malformed": {"test_add": 0, "test_double": 0, "test_double_negative": 0},
}
# All of them: a file that is not a notebook gets zero in every cell from nbgrader too (SubmissionExporter).
NBGRADER_CAN_GRADE = ["correct", "wrong", "wrong2", "untouched", "hang", "crash", "malformed"]
POINTS = {"test_add": 1, "test_double": 2, "test_double_negative": 1}


def toy_assignment():
    return source_notebook([
        nbgrader_cell("# A toy assignment", "intro", markdown=True),
        nbgrader_cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
                      "add", solution=True),
        nbgrader_cell(f'assert add(1, 2) == 3, f"{ADD_TRAP}: add(1, 2) gave {{add(1, 2)}}."\nprint("ok")\n'
                      "### BEGIN HIDDEN TESTS\n"
                      f'assert add(5, 7) == 12, f"{ADD_TRAP}: add(5, 7) gave {{add(5, 7)}}."\n'
                      "### END HIDDEN TESTS", "test_add", grade=True, points=1),
        nbgrader_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
                      "double", solution=True),
        nbgrader_cell('assert double(3) == 6, f"double is off by a factor: double(3) gave {double(3)}."',
                      "test_double", grade=True, points=2),
        nbgrader_cell('assert double(-4) == -8, f"double lost the sign (double(-4) gave {double(-4)})."',
                      "test_double_negative", grade=True, points=1),
    ])


def build_blank_course(folder: Path) -> None:
    """A course with the toy assignment generated into its gradebook, and every submission."""
    course = new_course(folder / "course", {NAME: toy_assignment()})
    released = course / "notebooks" / NAME / f"{NAME}.ipynb"
    for student in EXPECTED:
        if student == "malformed":
            submit(course, student, NAME, '{"cells": [ this is not JSON')
        else:
            submit(course, student, NAME, fill_answers(released, ANSWERS.get(student, {})))


def copy_course(blank: Path, folder: Path, students) -> Path:
    course = folder / "course"
    shutil.copytree(blank, course, ignore=shutil.ignore_patterns("submitted"))
    for student in students:
        shutil.copytree(blank / "submitted" / student, course / "submitted" / student)
    return course


@pytest.fixture(scope="module")
def blank_course(tmp_path_factory):
    return built_once(tmp_path_factory, "blank", build_blank_course) / "course"


@pytest.fixture(scope="module")
def by_nbgrader(blank_course, tmp_path_factory):
    def build(folder):
        course = copy_course(blank_course, folder, NBGRADER_CAN_GRADE)
        run = run_nbgrader(course, "autograde", NAME, "--create", f"--JudgeInSandbox.timeout={CELL_TIMEOUT}")
        assert run.returncode == 0, run.stderr[-3000:]
    return built_once(tmp_path_factory, "by_nbgrader", build) / "course"


@pytest.fixture(scope="module")
def by_workbook_grade(blank_course, tmp_path_factory):
    """The whole class graded by workbook-grade, two at a time: (course folder, exit status)."""
    def build(folder):
        course = copy_course(blank_course, folder, EXPECTED)
        here = os.getcwd()
        os.chdir(folder)  # not the course folder, nor the repository: --course is what counts
        try:
            code = class_grading.main([NAME, "--course", str(course), "--jobs", "2", "--timeout", str(CELL_TIMEOUT)])
        finally:
            os.chdir(here)
        (folder / "exit_status").write_text(str(code))
    folder = built_once(tmp_path_factory, "by_workbook_grade", build)
    return folder / "course", int((folder / "exit_status").read_text())


def gradebook_rows(course: Path, students) -> dict:
    """(student, grade cell) -> every column nbgrader autograde fills in, plus the submission total."""
    rows = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in students:
            submission = gb.find_submission(NAME, student)
            rows[student, "total"] = submission.score
            for grade in gb.find_submission_notebook(NAME, NAME, student).grades:
                rows[student, grade.name] = (grade.auto_score, grade.manual_score, grade.needs_manual_grade,
                                             grade.max_score)
    return rows


def executed_cells(path: Path) -> list:
    """What an autograded notebook shows: source and outputs of each cell (execution counts aside)."""
    nb = nbformat.read(path, as_version=4)
    return [(c.source, [{k: v for k, v in o.items() if k != "execution_count"} for o in c.get("outputs", [])])
            for c in nb.cells]


def test_gradebook_matches_nbgrader_autograde_cell_by_cell(by_nbgrader, by_workbook_grade):
    course, _ = by_workbook_grade
    assert gradebook_rows(course, NBGRADER_CAN_GRADE) == gradebook_rows(by_nbgrader, NBGRADER_CAN_GRADE)


def test_autograded_notebooks_match_nbgrader_autograde(by_nbgrader, by_workbook_grade):
    course, _ = by_workbook_grade
    for student in NBGRADER_CAN_GRADE:
        ours = course / "autograded" / student / NAME / f"{NAME}.ipynb"
        theirs = by_nbgrader / "autograded" / student / NAME / f"{NAME}.ipynb"
        assert executed_cells(ours) == executed_cells(theirs), student


def test_every_student_gets_the_expected_scores(by_workbook_grade):
    course, code = by_workbook_grade
    rows = gradebook_rows(course, EXPECTED)
    got = {s: {cell: rows[s, cell][0] for cell in EXPECTED[s]} for s in EXPECTED}
    assert got == EXPECTED
    assert code == 1  # a submission that could not be graded at all is reported in the exit status


def test_hang_crash_and_malformed_each_get_their_own_error(by_workbook_grade):
    course, _ = by_workbook_grade
    record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    status = {s: (e["status"], e["error"] or "") for s, e in record.items()}
    # The judge stops the cell that ends its process or hangs, and the report says which and why.
    assert status["crash"][0] == "graded" and "cell 4: this cell was stopped" in status["crash"][1]
    assert "ended the process running it (exit code 1)" in status["crash"][1]
    assert status["hang"][0] == "graded" and "cell 2: this cell was stopped" in status["hang"][1]
    assert f"time limit ({CELL_TIMEOUT} s for a cell)" in status["hang"][1]
    assert status["malformed"][0] == "failed" and "could not be read as a notebook" in status["malformed"][1]
    assert all(status[s] == ("graded", "") for s in NBGRADER_CAN_GRADE if s not in ("hang", "crash", "malformed"))


def test_nbgrader_autograde_gives_a_file_that_is_not_a_notebook_zero_with_the_reason(by_nbgrader):
    nb = nbformat.read(by_nbgrader / "autograded" / "malformed" / NAME / f"{NAME}.ipynb", as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(errors) == 3 and all(o.ename == "NotGradable" and "could not be read as a notebook" in o.evalue
                                    for o in errors)


def test_crashed_and_malformed_submissions_are_not_left_for_manual_grading(by_workbook_grade):
    course, _ = by_workbook_grade
    rows = gradebook_rows(course, ["crash", "malformed"])
    assert all(not row[2] for key, row in rows.items() if key[1] != "total")


def test_feedback_can_be_generated_after_parallel_grading(by_workbook_grade, tmp_path):
    course = own_copy(by_workbook_grade[0], tmp_path)
    nbgrader_in_process(course, "generate_feedback", NAME)
    html = (course / "feedback" / "wrong" / NAME / f"{NAME}.html").read_text()
    assert ADD_TRAP in html and "add(5, 7)" not in html  # the message, not the hidden test


def test_class_summary_counts_each_trap_by_failure_kind(by_workbook_grade):
    course, _ = by_workbook_grade
    outcomes = class_grading.GradingRecord(course / "class_reports" / NAME / "grading.json").outcomes()
    summary = summarize(course, NAME, f"sqlite:///{course / 'gradebook.db'}", outcomes)
    rows = {r.grade_id: r for r in summary.rows}
    assert [r.grade_id for r in summary.rows] == ["test_add", "test_double", "test_double_negative"]
    assert summary.students == len(EXPECTED)
    assert rows["test_add"].lost == 5
    assert rows["test_add"].kinds == {ADD_TRAP: 2, NOT_ANSWERED: 1, CRASHED: 1, UNGRADABLE: 1}
    assert rows["test_double"].kinds == {NOT_ANSWERED: 1, CRASHED: 1, UNGRADABLE: 1}
    assert (course / "class_reports" / NAME / "summary.png").stat().st_size > 10_000


def test_rerun_grades_only_what_changed(by_workbook_grade, tmp_path, capsys):
    course = own_copy(by_workbook_grade[0], tmp_path)
    class_grading.main([NAME, "--course", str(course), "--timeout", str(CELL_TIMEOUT), "--no-summary"])
    assert f"{len(EXPECTED)} submissions, 0 to grade" in capsys.readouterr().out
    submit(course, "wrong2", NAME, fill_answers(course / "notebooks" / NAME / f"{NAME}.ipynb", ANSWERS["correct"]))
    class_grading.main([NAME, "--course", str(course), "--timeout", str(CELL_TIMEOUT), "--no-summary"])
    assert f"{len(EXPECTED)} submissions, 1 to grade" in capsys.readouterr().out
    assert gradebook_rows(course, ["wrong2"])["wrong2", "total"] == 4


def clean_run_rows(students) -> dict:
    """The gradebook rows a clean run writes (the parity test shows nbgrader writes the same)."""
    rows = {}
    for student in students:
        rows[student, "total"] = sum(EXPECTED[student].values())
        for cell, score in EXPECTED[student].items():
            rows[student, cell] = (score, None, False, POINTS[cell])
    return rows


def test_interrupted_run_then_rerun_matches_a_clean_run(blank_course, tmp_path, capsys):
    students = ["correct", "wrong", "crash"]
    course = copy_course(blank_course, tmp_path, students)
    arguments = [NAME, "--course", str(course), "--jobs", "1", "--timeout", str(CELL_TIMEOUT), "--no-summary"]
    record = course / "class_reports" / NAME / "grading.json"
    started = subprocess.Popen([sys.executable, "-m", "autograder.commands.grade", *arguments], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not record.exists() and time.monotonic() < deadline and started.poll() is None:
        time.sleep(0.2)
    started.send_signal(signal.SIGTERM)  # one submission graded, the next one mid-run
    out, err = started.communicate(timeout=120)
    assert started.returncode == 130, err[-2000:]
    graded_before = json.loads(record.read_text())["students"]
    assert 1 <= len(graded_before) < len(students)

    assert class_grading.main(arguments) == 0
    assert f"{len(students) - len(graded_before)} to grade" in capsys.readouterr().out
    assert gradebook_rows(course, students) == clean_run_rows(students)
    for student in students:
        assert (course / "autograded" / student / NAME / f"{NAME}.ipynb").exists()


@pytest.mark.parametrize("message, kind", [
    ("AssertionError: Resumed weights differ after 3 steps (max |diff| 4.1e-04). The Adam step restarted.",
     "Resumed weights differ after # steps"),
    ("AssertionError: After 3 more training steps, snapshot['model']['0.weight'] changed too (max |diff| 0.01), "
     "so it is live.", "After # more training steps, snapshot['…']['…'] changed too, so it is live"),
    ("AssertionError: double lost the sign (double(-4) gave 8).", "double lost the sign"),
    ("AssertionError: After 3 more training steps, the snapshot's 'exp_avg' for parameter 2 changed (max |diff| 0.1)",
     "After # more training steps, the snapshot's '…' for parameter # changed"),
    ("AssertionError: the snapshot shares storage with the live optimizer: exp_avg of 0.weight moved by 0.25",
     "the snapshot shares storage with the live optimizer"),
    ("not answered yet: the answer cell for `add` still raises NotImplementedError", NOT_ANSWERED),
    ("`add` is not defined: the answer cell must define a function or class named exactly `add`", MISSING),
    ("CellTimeoutError: the answer cell for `add` never finished", CRASHED),
    ("ZeroDivisionError: division by zero", "error: ZeroDivisionError"),
])
def test_failure_messages_are_grouped_by_the_trap_they_name(message, kind):
    assert failure_kind(message) == kind


def test_same_trap_with_different_evidence_is_one_kind():
    a = failure_kind("AssertionError: Resumed weights differ after 3 steps (max |diff| 4.1e-04).")
    b = failure_kind("AssertionError: Resumed weights differ after 5 steps (max |diff| 2.0e-02).")
    assert a == b


def test_command_refuses_a_folder_that_is_not_a_course(tmp_path):
    with pytest.raises(SystemExit, match="nbgrader_config.py"):
        class_grading.main(["toy", "--course", str(tmp_path)])
