"""The grading children of ``workbook-grade``: each submission in a forked child process of its own.

``run_class`` grades a list of ``SubmissionJob`` with up to N children at a time: the parent has imported
nbgrader (and started the sandbox zygote) once, each child is its own process group and dies with the
parent, a child that outlives ``submission_timeout`` or dies is stopped and its submission scored zero,
one that found the gradebook locked is graded again, and SIGINT/SIGTERM stop them all cleanly
(``Interrupted``). ``Progress`` is the progress bar it updates.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from typing import Callable

from autograder.grading import sandbox, zygote

from .submission import DATABASE_LOCKED, SubmissionJob, SubmissionOutcome, grade_submission, record_zero_scores

INTERRUPT_GRACE = 10  # seconds a child gets to clean up after SIGINT before it is killed


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


def run_class(jobs: list[SubmissionJob], workers: int | Callable[[], int], grade: Callable = grade_submission,
              submission_timeout: float | None = None, retries: int = 1,
              on_outcome: Callable[[SubmissionOutcome], None] = lambda o: None,
              progress: Progress | None = None) -> list[SubmissionOutcome]:
    """Grade ``jobs`` with up to ``workers`` children at a time (a callable is asked again before each start: a
    cluster's workers that join later are used); raise Interrupted on SIGINT/SIGTERM.

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
            while pending and len(running) < (workers() if callable(workers) else workers) and not stop:
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
