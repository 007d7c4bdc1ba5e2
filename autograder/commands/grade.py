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
(``run_class(..., grade=...)`` takes another). This module is the command: which submissions
to grade, the grading record, the cluster's workers, the summary. ``submission`` grades one
submission, ``class_run`` runs the grading children.

Afterwards it prints, for each test cell (one trap each), how many students lost it
and with which failure message, and saves the table and a bar chart under
``class_reports/<assignment>/`` in the course folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps.autogradeapp import AutogradeApp

from autograder.contract import DEFAULT_CELL_TIMEOUT, with_tools_on_path
from autograder.course import matching
from autograder.grading import layout, protections, sandbox

# The children and the one submission they each grade; every name they had here still imports from here.
from .class_run import INTERRUPT_GRACE, Interrupted, Progress, run_class  # noqa: F401
from .submission import (DATABASE_LOCKED, RobustExecute, SubmissionJob, SubmissionOutcome,  # noqa: F401
                         grade_submission, record_zero_scores, submitted_notebooks)

SQLITE_BUSY_TIMEOUT = 120  # seconds a writer waits for the gradebook before "database is locked"
REPORTS = "class_reports"


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


def grade_assignment(course: Path, assignment: str, settings: dict, workers, cell_timeout: int,
                     students: list[str] | None = None, regrade: bool = False,
                     submission_timeout: float | None = None, quiet: bool = False,
                     scheduler: str = "", allow_unconfined: bool = False) -> list[SubmissionOutcome]:
    """Grade every (or the chosen) submission of one assignment; returns the outcomes of all of them. ``workers``:
    how many at once, or a callable that says it each time (a cluster's ``WorkerSlots``)."""
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
              + (f", {min(workers, max(len(todo), 1))} at a time" if not callable(workers) else
                 f", one per worker of the cluster at a time (now {workers()})"), flush=True)
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


def cluster_workers(address: str, wait_seconds: float = 60, wanted: int = 1):
    """The cluster's workers of this course as a ``WorkerSlots`` (called, how many submissions to send at once;
    workers that join later count as they come). Others are refused, each with the reason. Waits up to
    ``wait_seconds`` for ``wanted`` of them (workers started with the scheduler register a few seconds later),
    saying how many are there; ends the command when the scheduler does not answer or too few came."""
    from autograder.grading.cluster import ClusterError, WorkerSlots, check_workers, connect

    try:
        client = connect(address)
    except ClusterError as exc:
        raise SystemExit(f"workbook-grade: {exc}") from None
    deadline = time.monotonic() + wait_seconds
    try:
        accepted, refused = check_workers(client)
        said = None
        while len(accepted) < wanted and time.monotonic() < deadline:
            if len(accepted) != said:
                said = len(accepted)
                print(f"workbook-grade: waiting up to {deadline - time.monotonic():.0f} s (--wait-for-workers) for "
                      f"{wanted} worker{'s' if wanted > 1 else ''} of this course at {address}: {said} there so far",
                      file=sys.stderr, flush=True)
            try:                   # Dask's own wait for a worker to register, then: does it hold this course?
                client.wait_for_workers(len(client.scheduler_info()["workers"]) + 1,
                                        timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            except (TimeoutError, OSError):
                pass
            accepted, refused = check_workers(client)
        known = set(client.scheduler_info(n_workers=-1)["workers"])
    finally:
        client.close()   # the grading children connect on their own: a client does not survive a fork
    for line in refused:
        print(f"workbook-grade: refused worker {line}", file=sys.stderr)
    start = f"start {'some' if not accepted else 'more'} with `python3 workbook.py worker {address}`"
    if not accepted:
        raise SystemExit(f"workbook-grade: no worker of {address} holds this course"
                         + (f" (waited {wait_seconds:g} s)" if wait_seconds > 0 else "")
                         + ("" if refused else f": {start}"))
    if len(accepted) < wanted:
        raise SystemExit(f"workbook-grade: {len(accepted)} of the {wanted} workers asked for (--workers {wanted}) "
                         f"hold this course at {address} after {wait_seconds:g} s: {wanted - len(accepted)} missing; "
                         f"{start}, wait longer (--wait-for-workers) or ask for fewer")
    print(f"workbook-grade: {len(accepted)} workers of {address} grade; workers that join later are used too",
          flush=True)
    return WorkerSlots(address, accepted, known,
                       lambda line: print(f"workbook-grade: {line}", file=sys.stderr, flush=True))


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
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="with --scheduler: wait for N workers of this course before grading (default: "
                             "%(default)s); workers that join later are used as they come either way")
    parser.add_argument("--wait-for-workers", type=float, default=60, metavar="SECONDS",
                        help="with --scheduler: how long to wait for them (default %(default)s)")
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
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    workers = args.jobs or (cluster_workers(args.scheduler, args.wait_for_workers, args.workers) if args.scheduler
                            else default_workers())

    course = Path(args.course).resolve()
    if not (course / "nbgrader_config.py").exists():
        raise SystemExit(f"workbook-grade: {course} has no nbgrader_config.py: is it the course folder?")
    disagreement = layout.course_disagreement(course)
    if disagreement:
        print(f"workbook-grade: grading refused: {disagreement}", file=sys.stderr)
        return 2
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
