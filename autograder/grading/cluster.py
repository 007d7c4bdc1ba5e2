"""Judging on a Dask cluster: the same judge and sandbox, on another machine.

The grading process (nbgrader's Autograde, with ``JudgeInSandbox.scheduler`` set) prepares each
submission as it always does, with the course's gradebook, then sends the notebook to a Dask worker
(``workbook-worker``) and gets the judgement back as data. Only the grading process writes the
gradebook, ``autograded/`` and the class summary.

A worker grades only if it holds the same course: the Dask resource it offers is named after a
fingerprint of the hidden tests, the grader's code and the torch and Python versions, and every
submission asks for the grading process's own. A worker of another course version never receives
one; ``check_workers`` says which part differs.

A worker that dies in the middle of a submission (killed, out of memory) has its submission graded
again on another: Dask reschedules it. One that kills every worker it reaches is given up after Dask's
``distributed.scheduler.allowed-failures`` tries and scored zero with the reason (``not_gradable``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform

import nbformat

from autograder.contract import is_test_cell, nbgrader_meta
from autograder.course import NOTEBOOKS
from autograder.grading.judge import NOT_GRADABLE, Judgement, Policy, Verdict, error_output, judge_notebook
from autograder.grading.layout import package_digest

RESOURCE_PREFIX = "workbook-course-"
CONNECT_SECONDS = 10


class ClusterError(Exception):
    """The cluster cannot grade: unreachable, or no worker holds this course. Its message says what to do."""


@functools.cache
def course_fingerprint() -> dict[str, str]:
    """What every machine that grades must hold alike, part by part."""
    import torch

    hidden_tests = hashlib.sha256()
    for notebook in NOTEBOOKS:
        for cell in filter(is_test_cell, nbformat.read(notebook.source(), as_version=4).cells):
            hidden_tests.update(f"{notebook.folder}/{nbgrader_meta(cell)['grade_id']}\n{cell.source}\n".encode())
    return {"hidden tests": hidden_tests.hexdigest()[:16], "check modules and grader": package_digest()[:16],
            "torch": torch.__version__, "python": platform.python_version()}


def course_resource(parts: dict | None = None) -> str:
    """The Dask resource a worker of this course offers and every submission asks for."""
    digest = hashlib.sha256(json.dumps(parts or course_fingerprint(), sort_keys=True).encode()).hexdigest()
    return RESOURCE_PREFIX + digest[:16]


def connect(address: str):
    from distributed import Client

    try:
        return Client(address, timeout=CONNECT_SECONDS, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"no Dask scheduler answers at {address} ({type(exc).__name__}: {exc}). Start one with "
                           f"`.venv/bin/dask scheduler --host 127.0.0.1` and give its address (README, \"Grading a "
                           f"large class on several machines\").") from None


def check_workers(client) -> tuple[list[str], list[str]]:
    """(the workers that may grade, a line per worker refused saying which part of its course differs)."""
    mine = course_fingerprint()
    theirs = client.run(course_fingerprint, on_error="return")
    accepted, refused = [], []
    for address, parts in sorted(theirs.items()):
        if isinstance(parts, BaseException):
            refused.append(f"{address}: could not say which course it holds ({type(parts).__name__}: {parts})")
            continue
        differ = [f"{part} ({parts.get(part)} there, {value} here)" for part, value in mine.items()
                  if parts.get(part) != value]
        (refused.append(f"{address}: another course: {'; '.join(differ)}") if differ else accepted.append(address))
    return accepted, refused


# What a grading worker was started with (workbook-worker sets both for its Dask worker processes).
WORKER_PARALLEL, WORKER_ALLOW_UNCONFINED = "WORKBOOK_WORKER_PARALLEL", "WORKBOOK_ALLOW_UNCONFINED"


def worker_policy() -> Policy:
    """A worker's sandboxes protect its own course checkout; several worker processes on a machine judge
    side by side."""
    return Policy(parallel=os.environ.get(WORKER_PARALLEL) == "1",
                  allow_unconfined=os.environ.get(WORKER_ALLOW_UNCONFINED) == "1")


def judge_on_worker(notebook: str, cell_seconds: float) -> Judgement:
    """On a worker: the judgement of one prepared submission (its notebook as JSON)."""
    return judge_notebook(nbformat.reads(notebook, as_version=4), cell_seconds=cell_seconds, policy=worker_policy())


SUBMISSIONS_TO_DASK = 2


def judge_remotely(address: str, nb, cell_seconds: float, name: str) -> Judgement:
    """The judgement of ``nb`` by a worker of this course, waited for here.

    Dask gives a task up (KilledWorker) once the workers holding it died more often than it allows,
    and counts a death against every task queued on that worker, running or not. So a submission
    given up is handed to Dask once more, afresh: one that only queued behind a worker-killer is then
    graded, one that kills every worker it runs on is not gradable."""
    from distributed import KilledWorker

    client = connect(address)
    notebook = nbformat.writes(nb)
    try:
        for attempt in range(1, SUBMISSIONS_TO_DASK + 1):
            future = client.submit(judge_on_worker, notebook, cell_seconds, key=f"judge-{name}-{attempt}-{id(nb):x}",
                                   resources={course_resource(): 1}, pure=False)
            try:
                return future.result()
            except KilledWorker as exc:
                last = getattr(getattr(exc, "last_worker", None), "address", "a worker")
        return not_gradable(nb, f"its grading worker died each time it was judged ({SUBMISSIONS_TO_DASK} rounds of "
                                f"Dask's retries, the last on {last}), so it is not gradable")
    finally:
        client.close()


def not_gradable(nb, reason: str) -> Judgement:
    """Zero for every test cell, each saying why."""
    failed = error_output(NOT_GRADABLE, reason)
    verdicts = [Verdict(nbgrader_meta(cell)["grade_id"], False, reason, "", failed, True)
                for cell in nb.cells if is_test_cell(cell)]
    return Judgement(verdicts, {}, {"cluster": reason}, 0.0)

