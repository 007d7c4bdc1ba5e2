"""Judging on a Dask cluster: the same judge and sandbox, on another machine.

The grading process (nbgrader's Autograde, with ``JudgeInSandbox.scheduler`` set) prepares each
submission as it always does, with the course's gradebook, then sends the notebook to a Dask worker
(``workbook-worker``) and gets the judgement back as data. Only the grading process writes the
gradebook, ``autograded/`` and the class summary.

A worker grades only if it holds the same course: the Dask resource it offers is named after a
fingerprint of the hidden tests, the grader's code and the torch and Python versions, and every
submission asks for the grading process's own. A worker of another course version never receives
one; ``check_workers`` says which part differs.

``WorkerSlots`` is how many submissions the grading process sends at once: one per worker of this course
that the scheduler knows, asked again every few seconds while the class is graded, so a worker that joins
late is used as soon as it has registered (and one that left is no longer counted).

A worker that dies in the middle of a submission (killed, out of memory) has its submission graded
again on another: Dask reschedules it. One that kills every worker it reaches is given up after Dask's
``distributed.scheduler.allowed-failures`` tries and scored zero with the reason (``not_gradable``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import platform
import time
from typing import Callable

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


def scheduler_workers(address: str) -> dict[str, dict]:
    """{worker address: the resources it offers}, as the scheduler knows them now. One request and no Client: a
    Client leaves an event-loop thread behind it, and the grading process forks its children between two asks."""
    from distributed.core import rpc
    from distributed.security import Security

    async def ask() -> dict:
        async with rpc(address, connection_args=Security().get_connection_args("client")) as scheduler:
            return await scheduler.identity()

    workers = asyncio.run(asyncio.wait_for(ask(), CONNECT_SECONDS))["workers"]
    return {worker: dict(info.get("resources") or {}) for worker, info in workers.items()
            if info.get("status", "running") == "running"}


POLL_SECONDS = 2.0


class WorkerSlots:
    """Called, the number of submissions to judge at once: the workers of this course the scheduler has now
    (each ``workbook-worker`` process judges one at a time), asked at most every ``POLL_SECONDS``; at least 1, so
    a class waits in Dask's queue for a worker rather than here. Says when a worker joins or leaves."""

    def __init__(self, address: str, workers: list[str], known: set[str], say: Callable[[str], None]):
        self.address, self.say = address, say
        self.workers, self.others = set(workers), set(known) - set(workers)   # the refused were said already
        self.asked = time.monotonic()

    def __call__(self) -> int:
        if time.monotonic() - self.asked >= POLL_SECONDS:
            self.asked = time.monotonic()
            try:
                offered = scheduler_workers(self.address)
            except Exception:            # the scheduler did not answer this time: keep the last count
                return max(1, len(self.workers))
            mine = course_resource()
            workers = {worker for worker, resources in offered.items() if resources.get(mine)}
            others = {worker for worker, resources in offered.items() if worker not in workers
                      and any(name.startswith(RESOURCE_PREFIX) for name in resources)}
            for worker in sorted(others - self.others):
                self.say(f"refused worker {worker}: it holds another version of this course (Dask resource "
                         f"{', '.join(r for r in offered[worker] if r.startswith(RESOURCE_PREFIX))}, here {mine})")
            changes = [f"{worker} joined" for worker in sorted(workers - self.workers)] + \
                      [f"{worker} left" for worker in sorted(self.workers - workers)]
            if changes:
                self.say(f"{'; '.join(changes)}: {len(workers)} workers of {self.address} grade")
            self.workers, self.others = workers, others
        return max(1, len(self.workers))


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

