"""One student's submission, graded in this process by nbgrader's own Autograde (``workbook-grade``).

``grade_submission`` is the one step a grading child runs: nbgrader autograde for that one student,
a second attempt with a restarted kernel (``RobustExecute``) when nbgrader's Execute could not finish
it, and zeros in the gradebook (``record_zero_scores``) for a submission that cannot be graded at all.
``SubmissionJob`` says what to grade, ``SubmissionOutcome`` how it went.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from nbgrader.apps.autogradeapp import AutogradeApp
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Integer

from autograder.contract import DEFAULT_CELL_TIMEOUT, read_notebook
from autograder.grading.nbgrader_plugins import JudgeInSandbox

from .check import CellRunner

DATABASE_LOCKED = "database is locked"


@dataclasses.dataclass
class SubmissionJob:
    course: str  # absolute path of the course folder
    assignment: str
    student: str
    db_url: str  # the gradebook, with a busy timeout
    cell_timeout: int = DEFAULT_CELL_TIMEOUT
    log_path: str | None = None
    scheduler: str = ""  # a Dask scheduler: the judging happens on its workers (grading/cluster.py)
    parallel: bool = False          # other submissions are judged beside it on this machine
    allow_unconfined: bool = False  # grade even where a protection is missing (recorded with each grade)


@dataclasses.dataclass
class SubmissionOutcome:
    student: str
    status: str  # "graded": as nbgrader graded it; "recovered": graded with a restarted kernel; "failed": zeros
    seconds: float = 0.0
    error: str | None = None  # what went wrong with this submission, for the instructor

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class RobustExecute(NbGraderPreprocessor):
    """nbgrader's Execute step, but a hang or a dead kernel costs only the cell it happened in.

    Used only for a second attempt at a submission that nbgrader's own Execute could not
    finish. Runs the cells with the self-check's executor (restart the kernel, replay
    the cells that ran cleanly, go on) and records each lost cell as an error output,
    which nbgrader's SaveAutoGrades scores as zero.
    """

    timeout = Integer(DEFAULT_CELL_TIMEOUT).tag(config=True)
    problems: dict[int, str] = {}  # cell index -> what happened; read by the grading child

    def preprocess(self, nb, resources):
        workdir = Path(resources.get("metadata", {}).get("path") or ".")
        found = CellRunner(nb, workdir, self.timeout).run_all()
        for index, why in found.items():
            nb.cells[index].outputs.append(nbformat.v4.new_output(
                "error", ename="GradingError", evalue=why, traceback=[f"GradingError: {why}"]))
        RobustExecute.problems = dict(found)
        return nb, resources


def _autograde(job: SubmissionJob, robust: bool) -> int:
    """``nbgrader autograde ASSIGNMENT --student STUDENT --force --create``, in this process."""
    argv = [job.assignment, "--student", job.student, "--force", "--create",
            f"--CourseDirectory.root={job.course}", f"--CourseDirectory.db_url={job.db_url}",
            f"--Execute.timeout={job.cell_timeout}", f"--JudgeInSandbox.timeout={job.cell_timeout}",
            f"--JudgeInSandbox.scheduler={job.scheduler}", f"--JudgeInSandbox.parallel={job.parallel}",
            f"--JudgeInSandbox.allow_unconfined={job.allow_unconfined}"]
    os.chdir(job.course)  # nbgrader reads nbgrader_config.py from the working folder (we are a child)
    app = AutogradeApp()
    app.initialize(argv)
    if robust:
        configured = app.config.Autograde
        chosen = (configured["autograde_preprocessors"] if "autograde_preprocessors" in configured
                  else Autograde.class_traits()["autograde_preprocessors"].default())
        steps = [RobustExecute if step in (Execute, "nbgrader.preprocessors.Execute") else step for step in chosen]
        app.config.Autograde.autograde_preprocessors = steps
        app.config.RobustExecute.timeout = job.cell_timeout
    try:
        app.start()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def submitted_notebooks(course: Path, assignment: str, student: str) -> list[Path]:
    return sorted((course / "submitted" / student / assignment).glob("*.ipynb"))


def grade_submission(job: SubmissionJob) -> SubmissionOutcome:
    """Grade one student's submission into the gradebook; never raises for bad input.

    The one step a sandbox replaces: it gets the job, writes the gradebook rows and
    autograded/ files of that one submission, and says how it went.
    """
    start = time.monotonic()
    course = Path(job.course)
    JudgeInSandbox.stopped = []
    submitted = submitted_notebooks(course, job.assignment, job.student)
    unreadable = [why for why in (read_notebook(path)[1] for path in submitted) if why]
    if _autograde(job, robust=False) == 0:
        if unreadable:       # nbgrader scored it zero cell by cell (the course's SubmissionExporter)
            return SubmissionOutcome(job.student, "failed", time.monotonic() - start,
                                     "; ".join(unreadable) + ": every test cell scored zero")
        # The judge stops a hanging or process-killing cell and goes on; the instructor hears which.
        note = "; ".join(JudgeInSandbox.stopped) or None
        return SubmissionOutcome(job.student, "graded", time.monotonic() - start, note)
    if _log_mentions(job, DATABASE_LOCKED):  # not the submission's fault: the caller grades it again
        return SubmissionOutcome(job.student, "failed", time.monotonic() - start,
                                 f"the gradebook stayed busy ({DATABASE_LOCKED})")
    if not unreadable:
        RobustExecute.problems = {}
        if _autograde(job, robust=True) == 0:
            lost = sorted(set(RobustExecute.problems.values()))
            why = "; ".join(lost) if lost else "nbgrader could not finish it (see the log)"
            return SubmissionOutcome(job.student, "recovered", time.monotonic() - start,
                                     f"graded with a restarted kernel: {why}")
        unreadable = ["nbgrader could not grade it, even with a restarted kernel (see the log)"]
    record_zero_scores(job.db_url, job.assignment, job.student)
    return SubmissionOutcome(job.student, "failed", time.monotonic() - start,
                             "; ".join(unreadable) + ": every test cell scored zero")


def _log_mentions(job: SubmissionJob, text: str) -> bool:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return text in Path(job.log_path).read_text(errors="replace") if job.log_path else False
    except OSError:
        return False


def record_zero_scores(db_url: str, assignment: str, student: str) -> None:
    """Zero for every graded cell, as nbgrader records a notebook that was never submitted."""
    with Gradebook(db_url) as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(assignment, student)
        for notebook in gb.find_assignment(assignment).notebooks:
            for grade in gb.find_submission_notebook(notebook.name, assignment, student).grades:
                grade.auto_score = 0
                grade.needs_manual_grade = False
        gb.db.commit()
