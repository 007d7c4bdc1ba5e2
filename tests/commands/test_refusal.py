"""A missing protection is never silent (docs/grading.md, principle 3), at each place grading starts.

`WORKBOOK_SANDBOX_WITHOUT=landlock` makes the sandbox really go without Landlock, as on a kernel older
than 5.13: `workbook.py grade` and `nbgrader autograde` must say so and refuse, naming it and the fix,
and grade only with `--allow-unconfined`, recording it with each grade; a grading worker must refuse to
start. The toy class of test_class_grading keeps each run short.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from autograder.commands import grade as class_grading
from autograder.course import REPO_ROOT
from dask_support import start_scheduler
from notebook_files import run_nbgrader
from test_class_grading import CELL_TIMEOUT, NAME, blank_course, copy_course  # noqa: F401

STUDENTS = ["correct", "wrong"]
WITHOUT = {"WORKBOOK_SANDBOX_WITHOUT": "landlock"}
LINE = "trusted grading confines each submission with"


def _scores(course: Path) -> dict:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        found = {}
        for student in STUDENTS:
            try:
                grades = gb.find_submission_notebook(NAME, NAME, student).grades
            except Exception:      # noqa: BLE001 (never graded: no submission row)
                continue
            found[student] = {g.name: g.auto_score for g in grades}
        return found


def _comments(course: Path, student: str) -> list[str]:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return [c.auto_comment or "" for c in gb.find_submission_notebook(NAME, NAME, student).comments]


def test_workbook_grade_says_what_confines_each_submission(blank_course, tmp_path, capsys):  # noqa: F811
    course = copy_course(blank_course, tmp_path, STUDENTS)
    assert class_grading.main([NAME, "--course", str(course), "--jobs", "2", "--timeout", str(CELL_TIMEOUT)]) == 0
    out = capsys.readouterr().out
    assert LINE in out and "files: Landlock" in out and "course folder: unreadable" in out


def test_workbook_grade_refuses_a_machine_without_a_protection_and_grades_only_when_allowed(
        blank_course, tmp_path, monkeypatch, capsys):  # noqa: F811
    course = copy_course(blank_course, tmp_path, STUDENTS)
    monkeypatch.setenv(*next(iter(WITHOUT.items())))
    code = class_grading.main([NAME, "--course", str(course), "--jobs", "2", "--timeout", str(CELL_TIMEOUT)])
    err = capsys.readouterr().err
    assert code == 2
    assert "trusted grading refused" in err and "files: off" in err and "Fix: Landlock needs Linux 5.13" in err
    assert "--allow-unconfined" in err
    assert all(score is None for cells in _scores(course).values() for score in cells.values())

    code = class_grading.main([NAME, "--course", str(course), "--jobs", "2", "--timeout", str(CELL_TIMEOUT),
                               "--allow-unconfined"])
    assert code == 0
    assert _scores(course)["correct"] == {"test_add": 1, "test_double": 2, "test_double_negative": 1}
    for student in STUDENTS:
        notes = _comments(course, student)
        assert notes and all("Graded with --allow-unconfined; this sandbox lacked files: off" in n for n in notes)


def test_nbgrader_autograde_refuses_too_and_records_an_allowed_grade(blank_course, tmp_path):  # noqa: F811
    course = copy_course(blank_course, tmp_path, STUDENTS)
    env = dict(os.environ, **WITHOUT)
    run = run_nbgrader(course, "autograde", NAME, "--create", f"--JudgeInSandbox.timeout={CELL_TIMEOUT}", env=env)
    assert run.returncode != 0
    assert run.stderr.count("trusted grading refused") >= 1 and "files: off" in run.stderr
    assert all(score is None for cells in _scores(course).values() for score in cells.values())

    run = run_nbgrader(course, "autograde", NAME, "--create", "--force", f"--JudgeInSandbox.timeout={CELL_TIMEOUT}",
                       "--JudgeInSandbox.allow_unconfined=True", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Graded with --allow-unconfined" in run.stderr
    assert _scores(course)["correct"] == {"test_add": 1, "test_double": 2, "test_double_negative": 1}
    assert all("lacked files: off" in n for n in _comments(course, "correct"))


def test_nbgrader_autograde_says_what_confines_each_submission(blank_course, tmp_path):  # noqa: F811
    course = copy_course(blank_course, tmp_path, STUDENTS)
    run = run_nbgrader(course, "autograde", NAME, "--create", f"--JudgeInSandbox.timeout={CELL_TIMEOUT}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count(LINE) == 1          # once per command, not once per submission


def test_a_grading_worker_refuses_to_start_on_a_machine_without_a_protection(tmp_path):
    scheduler, address = start_scheduler(tmp_path)
    try:
        worker = subprocess.run([sys.executable, str(REPO_ROOT / "workbook.py"), "worker", address, "--nworkers", "1",
                                 "--death-timeout", "20"], capture_output=True, text=True, timeout=240,
                                env=dict(os.environ, **WITHOUT))
        said = worker.stdout + worker.stderr
        assert worker.returncode == 2 and "Traceback" not in said, said[-3000:]
        assert "trusted grading refused" in said and "files: off" in said, said[-3000:]
        from distributed import Client
        with Client(address, timeout=10, set_as_default=False) as client:
            assert client.scheduler_info()["workers"] == {}
    finally:
        os.killpg(scheduler.pid, 9)
        scheduler.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)
