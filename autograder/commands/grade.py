"""``workbook-grade``: autograde a whole class in parallel, then show which traps it fell into.

    workbook-grade 01_state_dict_aliasing            # every submission, one worker per core
    workbook-grade 01 --jobs 4                       # assignments by prefix; choose the workers
    workbook-grade 01 --students ada bob             # only these students
    workbook-grade 01 --regrade                      # grade again even what is already graded

Run it in the course folder (the one with nbgrader_config.py, submitted/ and gradebook.db),
or pass ``--course``. The assignment must have been generated against that gradebook
(``nbgrader generate_assignment NAME``), exactly as ``nbgrader autograde`` requires.

What it writes is what ``nbgrader autograde`` writes: each submission is graded by
nbgrader's own Autograde converter (same preprocessors, same config, same gradebook
rows, same autograded/ notebooks, so ``nbgrader generate_feedback`` works afterwards).
Only the scheduling differs:

* Each submission is graded in its own forked child process. The parent imports
  nbgrader once (seconds of start-up per student saved); the child is its own process
  group, so a stuck submission is killed alone, and it dies with the parent.
* Children write to the one SQLite gradebook concurrently; SQLite serialises the short
  write transactions, and a busy timeout (``?timeout=`` on the database URL) makes a
  writer wait instead of failing with "database is locked". A submission that still
  fails on the database is graded again (``--retries``).
* With this course's nbgrader_config.py, nbgrader's Autograde runs the trusted judge
  (``autograder.grading.judge``): a cell that hangs or ends its sandbox is stopped and skipped,
  the cells before and after keep their scores, and the report names what was stopped.
  With a config that still uses nbgrader's kernel Execute, a submission whose kernel
  dies, or that hangs beyond what an interrupt can stop, is graded a second time with a
  kernel that is restarted and replayed after the bad cell. A file that is not a
  notebook at all gets zero for every cell and its own error. The batch goes on.
* Interrupting (Ctrl-C, SIGTERM) stops the children cleanly (nbgrader removes the
  half-graded notebook) and exits 130; SQLite rolls back any half-written transaction.
  Rerunning grades what is missing: a submission counts as done only when the gradebook
  holds all its scores and its files are unchanged since (``grading.json``).

``grade_submission`` is the one function that grades one student's submission
(``run_class(..., grade=...)`` takes another).

Afterwards it prints, for each test cell (one trap each), how many students lost it
and with which failure message, and saves the table and a bar chart under
``class_reports/<assignment>/`` in the course folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import nbformat
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps.autogradeapp import AutogradeApp
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Integer

from autograder.contract import DEFAULT_CELL_TIMEOUT, read_notebook, with_tools_on_path
from autograder.course import matching
from autograder.grading import protections, sandbox, zygote
from autograder.grading.nbgrader_plugins import JudgeInSandbox

from .check import CellRunner

SQLITE_BUSY_TIMEOUT = 120  # seconds a writer waits for the gradebook before "database is locked"
INTERRUPT_GRACE = 10  # seconds a child gets to clean up after SIGINT before it is killed
REPORTS = "class_reports"
DATABASE_LOCKED = "database is locked"


# ---- one submission ------------------------------------------------------------------------------

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


# ---- the worker children ---------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: the kernel kills this child if the grading command itself is killed (even kill -9)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass  # elsewhere the parent's signal handlers still stop the children


def _child_main(grade: Callable, job: SubmissionJob, conn) -> None:
    # Its own session (so its own process group: a stop signal reaches it and nothing else). Where the
    # scheduler shares the CPU by session (autogroup), each judge then gets its share, as each sandbox does.
    os.setsid()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if job.log_path:  # nbgrader's and the kernel's chatter go to the student's log, not the progress bar
        fd = os.open(job.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    try:
        outcome = grade(job)
    except KeyboardInterrupt:
        os._exit(130)
    except BaseException as exc:  # a bug in the grader: this submission fails, the batch goes on
        outcome = SubmissionOutcome(job.student, "failed", 0.0, f"the grader itself failed: {type(exc).__name__}: {exc}")
        try:
            record_zero_scores(job.db_url, job.assignment, job.student)
        except Exception:
            pass
    conn.send(outcome.to_json())
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclasses.dataclass
class _Running:
    job: SubmissionJob
    process: multiprocessing.Process
    conn: object
    started: float
    attempt: int


class Progress:
    """A plain-text progress bar on stderr (one line per submission when stderr is not a terminal)."""

    def __init__(self, total: int, stream=sys.stderr, width: int = 30):
        self.total, self.stream, self.width = total, stream, width
        self.done = self.errors = 0
        self.started = time.monotonic()
        self.live = hasattr(stream, "isatty") and stream.isatty()

    def update(self, outcome: SubmissionOutcome | None, running: int) -> None:
        if outcome is not None:
            self.done += 1
            self.errors += outcome.status != "graded"
        elapsed = time.monotonic() - self.started
        filled = int(self.width * self.done / max(self.total, 1))
        left = (elapsed / self.done * (self.total - self.done)) if self.done else None
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} graded"
                f", {self.errors} with errors, {running} running, {elapsed:.0f} s"
                + (f", ~{left:.0f} s left" if left is not None and self.done < self.total else ""))
        if self.live:
            self.stream.write("\r" + line.ljust(110))
            self.stream.flush()
        elif outcome is not None:
            note = "" if outcome.status == "graded" else f"  ({outcome.status}: {outcome.error})"
            self.stream.write(f"{line}  {outcome.student}{note}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


class Interrupted(Exception):
    pass


def run_class(jobs: list[SubmissionJob], workers: int, grade: Callable = grade_submission,
              submission_timeout: float | None = None, retries: int = 1,
              on_outcome: Callable[[SubmissionOutcome], None] = lambda o: None,
              progress: Progress | None = None) -> list[SubmissionOutcome]:
    """Grade ``jobs`` with up to ``workers`` children at a time; raise Interrupted on SIGINT/SIGTERM.

    ``on_outcome`` is called in this process as each submission finishes (before the next
    one is started), so what it records survives an interruption.
    """
    context = multiprocessing.get_context("fork")
    if not any(job.scheduler for job in jobs):   # judged here, not on a cluster's workers
        if not zygote.started():
            sandbox.warm_up()     # every child forked below starts its sandboxes from this one zygote
        # The judge trains reference models with torch.optim, whose first step imports torch._dynamo (1.3 s):
        # once here, not in every child (it starts no thread, so forking stays safe).
        zygote.import_dynamo()
    pending = list(reversed(jobs))
    running: dict[int, _Running] = {}
    outcomes: list[SubmissionOutcome] = []
    stop: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: stop.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}

    def launch(job: SubmissionJob, attempt: int) -> None:
        receive, send = context.Pipe(duplex=False)
        sys.stdout.flush()
        sys.stderr.flush()
        process = context.Process(target=_child_main, args=(grade, job, send), daemon=False)
        process.start()
        send.close()
        running[process.sentinel] = _Running(job, process, receive, time.monotonic(), attempt)

    def finish(outcome: SubmissionOutcome) -> None:
        outcomes.append(outcome)
        on_outcome(outcome)
        if progress:
            progress.update(outcome, len(running))

    try:
        while pending or running:
            while pending and len(running) < workers and not stop:
                launch(pending.pop(), attempt=1)
            if stop:
                raise Interrupted(stop[0])
            ready = multiprocessing.connection.wait(list(running), timeout=0.5)
            now = time.monotonic()
            for sentinel in list(running):
                item = running[sentinel]
                overdue = submission_timeout is not None and now - item.started > submission_timeout
                if sentinel not in ready and not overdue:
                    continue
                if overdue and item.process.is_alive():
                    _stop_child(item.process, grace=2)
                result = item.conn.recv() if item.conn.poll() else None
                item.process.join()
                del running[sentinel]
                if result is not None:
                    outcome = SubmissionOutcome(**result)
                    if outcome.status == "failed" and DATABASE_LOCKED in (outcome.error or "") \
                            and item.attempt <= retries:
                        launch(item.job, item.attempt + 1)
                        continue
                else:
                    why = (f"grading took longer than {submission_timeout:g} s and was stopped" if overdue
                           else f"the grading process died (exit code {item.process.exitcode})")
                    record_zero_scores(item.job.db_url, item.job.assignment, item.job.student)
                    outcome = SubmissionOutcome(item.job.student, "failed", now - item.started,
                                                f"{why}: every test cell scored zero")
                finish(outcome)
    except Interrupted:
        for item in running.values():
            _stop_child(item.process, grace=INTERRUPT_GRACE)
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return outcomes


def _stop_child(process: multiprocessing.Process, grace: float) -> None:
    """SIGINT to the child's group (nbgrader cleans up its kernel and half-written notebook), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        process.join(wait)
        if not process.is_alive():
            return


# ---- which submissions, and which are already done ----------------------------------------------------

def sqlite_with_busy_timeout(db_url: str, seconds: int = SQLITE_BUSY_TIMEOUT) -> str:
    if not db_url.startswith("sqlite:") or "timeout=" in db_url:
        return db_url
    return f"{db_url}{'&' if '?' in db_url else '?'}timeout={seconds}"


def course_settings(course: Path) -> dict:
    """The course's nbgrader settings (nbgrader_config.py), read the way nbgrader reads them."""
    here = os.getcwd()
    os.chdir(course)
    try:
        app = AutogradeApp()
        app.initialize([f"--CourseDirectory.root={course}"])
        return {"db_url": app.coursedir.db_url, "source": app.coursedir.source_directory,
                "submitted": app.coursedir.submitted_directory}
    finally:
        os.chdir(here)


def find_assignments(course: Path, selectors: list[str]) -> list[str]:
    submitted = sorted({p.name for p in (course / "submitted").glob("*/*") if p.is_dir()})
    return matching(selectors, submitted, "workbook-grade", f" among the submissions in {course / 'submitted'}")


def submission_fingerprint(course: Path, assignment: str, student: str, source_dir: str, cell_timeout: int) -> str:
    """Changes when the submission, the assignment's source or the time limit changes."""
    digest = hashlib.sha256(f"timeout={cell_timeout}".encode())
    for root in (course / "submitted" / student / assignment, course / source_dir / assignment):
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def completely_graded(db_url: str, assignment: str, students: list[str]) -> set[str]:
    """Students whose every graded cell of this assignment holds a score in the gradebook."""
    done = set()
    with Gradebook(db_url) as gb:
        for student in students:
            try:
                submission = gb.find_submission(assignment, student)
            except MissingEntry:
                continue
            if all(g.auto_score is not None or g.manual_score is not None
                   for nb in submission.notebooks for g in nb.grades):
                done.add(student)
    return done


class GradingRecord:
    """``class_reports/<assignment>/grading.json``: each student's outcome and fingerprint, written atomically."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries: dict = json.loads(path.read_text())["students"]
        except (OSError, ValueError, KeyError):
            self.entries = {}

    def is_current(self, student: str, fingerprint: str) -> bool:
        return self.entries.get(student, {}).get("fingerprint") == fingerprint

    def record(self, outcome: SubmissionOutcome, fingerprint: str) -> None:
        self.entries[outcome.student] = dict(outcome.to_json(), fingerprint=fingerprint)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".grading-")
        with os.fdopen(fd, "w") as f:
            json.dump({"schema": "workbook-grade/1", "students": self.entries}, f, indent=2)
        os.replace(tmp, self.path)

    def outcomes(self) -> list[SubmissionOutcome]:
        return [SubmissionOutcome(**{k: v for k, v in e.items() if k != "fingerprint"})
                for e in self.entries.values()]


def grade_assignment(course: Path, assignment: str, settings: dict, workers: int, cell_timeout: int,
                     students: list[str] | None = None, regrade: bool = False,
                     submission_timeout: float | None = None, quiet: bool = False,
                     scheduler: str = "", allow_unconfined: bool = False) -> list[SubmissionOutcome]:
    """Grade every (or the chosen) submission of one assignment; returns the outcomes of all of them."""
    db_url = sqlite_with_busy_timeout(settings["db_url"])
    with Gradebook(db_url) as gb:
        try:
            gb.find_assignment(assignment)
        except MissingEntry:
            raise SystemExit(f"workbook-grade: the gradebook has no assignment {assignment!r}: run "
                             f"`nbgrader generate_assignment {assignment}` in {course} first")
    everyone = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}") if p.is_dir())
    chosen = [s for s in everyone if students is None or s in students]
    reports = course / REPORTS / assignment
    (reports / "logs").mkdir(parents=True, exist_ok=True)
    record = GradingRecord(reports / "grading.json")
    fingerprints = {s: submission_fingerprint(course, assignment, s, settings["source"], cell_timeout) for s in chosen}
    in_gradebook = set() if regrade else completely_graded(db_url, assignment, chosen)
    todo = [s for s in chosen if regrade or s not in in_gradebook or not record.is_current(s, fingerprints[s])]
    if not quiet:
        skipped = len(chosen) - len(todo)
        print(f"{assignment}: {len(chosen)} submissions, {len(todo)} to grade"
              + (f" ({skipped} already graded and unchanged; --regrade grades them again)" if skipped else "")
              + f", {min(workers, max(len(todo), 1))} at a time", flush=True)
    parallel = not scheduler and min(workers, len(todo)) > 1
    jobs = [SubmissionJob(str(course), assignment, s, db_url, cell_timeout, str(reports / "logs" / f"{s}.log"),
                          scheduler, parallel, allow_unconfined) for s in todo]
    progress = None if quiet else Progress(len(jobs))
    try:
        run_class(jobs, workers, submission_timeout=submission_timeout, progress=progress,
                  on_outcome=lambda outcome: record.record(outcome, fingerprints[outcome.student]))
    finally:
        if progress:
            progress.close()
    return [o for o in record.outcomes() if o.student in set(chosen)]


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def confinement_here(course: Path, parallel: bool, allow_unconfined: bool) -> list[str]:
    """Start one sandbox (and the zygote the grading children share), print what confines it, and refuse
    (ConfinementRefused) where a protection is missing, unless allowed; what is missing."""
    confinement = sandbox.warm_up(protected=[str(course)])
    print(f"workbook-grade: {protections.summary(confinement)}", flush=True)
    lacking = protections.enforce(confinement, parallel, allow_unconfined)
    if lacking:
        print(f"workbook-grade: {protections.unconfined_note(lacking)}", file=sys.stderr, flush=True)
    return lacking


def cluster_workers(address: str, wait_seconds: float = 60) -> int:
    """The workers of the cluster that hold this course (others are refused, each with the reason), waited
    for up to ``wait_seconds`` (workers started with the scheduler register a few seconds later); ends the
    command when the scheduler does not answer or no worker of this course came."""
    from autograder.grading.cluster import ClusterError, check_workers, connect

    try:
        client = connect(address)
    except ClusterError as exc:
        raise SystemExit(f"workbook-grade: {exc}") from None
    deadline = time.monotonic() + wait_seconds
    try:
        accepted, refused = check_workers(client)
        if not accepted and wait_seconds > 0:
            print(f"workbook-grade: waiting up to {wait_seconds:g} s for a worker of this course at {address} "
                  f"(--wait-for-workers)", file=sys.stderr, flush=True)
        while not accepted and time.monotonic() < deadline:
            try:                   # Dask's own wait for a worker to register, then: does it hold this course?
                client.wait_for_workers(len(client.scheduler_info()["workers"]) + 1,
                                        timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            except (TimeoutError, OSError):
                pass
            accepted, refused = check_workers(client)
    finally:
        client.close()   # the grading children connect on their own: a client does not survive a fork
    for line in refused:
        print(f"workbook-grade: refused worker {line}", file=sys.stderr)
    if not accepted:
        raise SystemExit(f"workbook-grade: no worker of {address} holds this course"
                         + (f" (waited {wait_seconds:g} s)" if wait_seconds > 0 else "")
                         + ("" if refused else ": start some with `python3 workbook.py worker " + address + "`"))
    print(f"workbook-grade: {len(accepted)} workers of {address} grade", flush=True)
    return len(accepted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook-grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="assignment names or prefixes such as 01 (default: all submitted)")
    parser.add_argument("--course", default=".", help="the course folder (default: here)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help=f"submissions graded at once (default: one per core, here {default_workers()}; with "
                             f"--scheduler, one per worker of the cluster)")
    parser.add_argument("--scheduler", default="",
                        help="judge on the workers of this Dask scheduler, tcp://HOST:PORT (workbook-worker); "
                             "this machine still writes the gradebook")
    parser.add_argument("--wait-for-workers", type=float, default=60, metavar="SECONDS",
                        help="with --scheduler: how long to wait for a worker of this course (default %(default)s)")
    parser.add_argument("--students", nargs="+", help="grade only these students")
    parser.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT, help="seconds allowed per cell")
    parser.add_argument("--submission-timeout", type=float, default=None,
                        help="seconds allowed per submission in all (default: no limit beyond the per-cell one)")
    parser.add_argument("--regrade", action="store_true", help="grade again submissions already graded")
    parser.add_argument("--no-summary", action="store_true", help="skip the per-trap class summary")
    parser.add_argument("--allow-unconfined", action="store_true",
                        help="grade even where this machine lacks a protection of the sandbox (it says which); "
                             "each grade records what was missing")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    workers = args.jobs or (cluster_workers(args.scheduler, args.wait_for_workers) if args.scheduler
                            else default_workers())

    course = Path(args.course).resolve()
    if not (course / "nbgrader_config.py").exists():
        raise SystemExit(f"workbook-grade: {course} has no nbgrader_config.py: is it the course folder?")
    if not args.scheduler:     # judged here: say what confines each submission, or refuse (docs/grading.md)
        try:
            confinement_here(course, parallel=workers > 1, allow_unconfined=args.allow_unconfined)
        except protections.ConfinementRefused as refused:
            print(f"workbook-grade: {refused}", file=sys.stderr)
            return 2
    # nbgrader shells out to `alembic` for a new gradebook: our environment's bin/ must come first.
    os.environ.update(with_tools_on_path())
    settings = course_settings(course)
    from .class_summary import summarize, write_summary  # matplotlib only when needed

    status = 0
    for assignment in find_assignments(course, args.assignments):
        try:
            outcomes = grade_assignment(course, assignment, settings, workers, args.timeout, args.students,
                                        args.regrade, args.submission_timeout, scheduler=args.scheduler,
                                        allow_unconfined=args.allow_unconfined)
        except Interrupted:
            print("\nworkbook-grade: interrupted; the gradebook is consistent. Run the same command again "
                  "to grade what is left.", file=sys.stderr)
            return 130
        problems = [o for o in outcomes if o.status != "graded"]
        for o in problems:
            print(f"  {o.student}: {o.status}: {o.error}")
        if not args.no_summary:
            summary = summarize(course, assignment, sqlite_with_busy_timeout(settings["db_url"]), outcomes)
            print(write_summary(summary, course / REPORTS / assignment))
        status = status or (1 if any(o.status == "failed" for o in outcomes) else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
