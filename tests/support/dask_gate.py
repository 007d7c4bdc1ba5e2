"""A Dask preload for tests (``workbook.py worker ADDR --preload tests/support/dask_gate.py``): this worker
judges nothing until the file named by $WORKBOOK_TEST_GATE exists. A submission it takes stays on it, so a
test can see whether the grading command sends the next one to a worker that joined meanwhile.

Dask sends the judging function by name, so the worker runs the one this module puts in its place (once:
Dask may run a preload file again in the same process)."""

import os
import time

from autograder.grading import cluster

_judge = getattr(cluster.judge_on_worker, "__wrapped__", cluster.judge_on_worker)


def judge_on_worker(notebook: str, cell_seconds: float):
    while not os.path.exists(os.environ["WORKBOOK_TEST_GATE"]):
        time.sleep(0.1)
    return _judge(notebook, cell_seconds)


judge_on_worker.__wrapped__ = _judge
cluster.judge_on_worker = judge_on_worker
