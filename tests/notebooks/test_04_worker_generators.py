"""Notebook 04: generators copied into DataLoader workers. The checks, driven on right and wrong implementations.

Workers are real processes. Most tests fork them (Linux's default); the spawn tests
force the start method that macOS and Windows use, with implementations defined
the way a notebook cell defines them (in module ``__main__``).
"""

import pickle
import subprocess
import sys

import pytest
import torch

from autograder import worker_seeding as checks
from check_outcomes import failure_of
from fixtures import worker_seeding_impls as impls

# The visible test arguments and the hidden ones the notebook uses.
def test_an_error_inside_a_worker_is_reported_not_raised():
    def broken(worker_id):
        raise ValueError("no such attribute")
    assert "raised an error inside a DataLoader worker" in failure_of(checks.check_seed_worker_workers, broken)


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_seed_worker_epochs, None)
    assert "should be a function" in failure_of(checks.check_LazyNoisyDataset_peek, 3)


def test_torch_behaviour_the_notebook_teaches():
    """PyTorch reseeds the global RNGs per worker from base_seed + worker_id, not a Dataset's generator."""
    (epoch,) = checks.worker_streams(checks.NoisyDataset(8), None, seed=0)
    assert torch.equal(epoch[0], epoch[1])  # the copied generator
    dataset = checks.GlobalRngDataset(4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=checks.tag_with_worker_id,
                                         generator=torch.Generator().manual_seed(0), multiprocessing_context="fork")
    seeds = {wid: batch["torch.initial_seed()"][0].item() for wid, batch in loader}
    assert seeds[1] - seeds[0] == 1  # base_seed + worker_id
    draws = {wid: batch["np.random.random()"][0].item() for wid, batch in loader}
    assert draws[0] != draws[1]  # NumPy's global RNG is reseeded per worker too
    copy = pickle.loads(pickle.dumps(checks.NoisyDataset(4)))  # what spawn sends a worker
    assert torch.equal(copy[0], checks.NoisyDataset(4)[0])


def test_a_notebook_defined_function_cannot_be_loaded_by_a_fresh_interpreter():
    namespace = {"__name__": "__main__"}
    exec("def seed_worker(worker_id):\n    pass\n", namespace)
    sys.modules["__main__"].seed_worker = namespace["seed_worker"]  # pickle finds it, as in a kernel
    try:
        payload = pickle.dumps(namespace["seed_worker"])
    finally:
        del sys.modules["__main__"].seed_worker
    result = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                            input=payload, capture_output=True)
    assert b"Can't get attribute 'seed_worker'" in result.stderr


def _as_notebook_cells():
    """The fixtures module executed as a notebook executes cells: everything lands in __main__."""
    namespace = {"__name__": "__main__"}
    source = open(impls.__file__).read()
    exec(compile(source, "<notebook cells>", "exec"), namespace)
    return namespace


def test_spawn_runs_a_notebook_defined_seed_worker(monkeypatch):
    monkeypatch.setenv("WORKBOOK_WORKER_START", "spawn")
    cells = _as_notebook_cells()
    assert failure_of(checks.check_seed_worker_workers, cells["seed_worker_from_initial_seed"]) is None


def test_spawn_sends_a_notebook_defined_dataset_as_a_pickled_copy(monkeypatch):
    """Under spawn, a generator made in the main process reaches every worker as a copy, as under fork."""
    monkeypatch.setenv("WORKBOOK_WORKER_START", "spawn")
    cells = _as_notebook_cells()
    message = failure_of(checks.check_LazyNoisyDataset_peek, cells["LazyOnceInWhicheverProcess"])
    assert message and "drew exactly the same" in message


def test_an_unanswered_exercise_reaches_the_grader_as_not_implemented():
    """The grader says "not answered yet" only for NotImplementedError, so the checks let it through."""
    def stub(worker_id):
        raise NotImplementedError()

    class StubDataset(torch.utils.data.Dataset):
        def __init__(self, size):
            raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_seed_worker_workers(stub)
    with pytest.raises(NotImplementedError):
        checks.check_LazyNoisyDataset_peek(StubDataset)
