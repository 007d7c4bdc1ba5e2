"""The checks of ``LazyNoisyDataset``: loaders over the learner's dataset, which makes its generators inside
each worker, and a look at one sample in the main process before the workers start.
"""

from __future__ import annotations

import torch

from ..checking import expect, failing_if_raised, graded_check, observe
from .expectations import (_EPOCH_HINT, _expect_epochs_differ, _expect_own_streams, _expect_reproducible,
                           _expect_workers_differ, _shape_ok, _shared_run)
from .loaders import probe_peek_then_streams


def _lazy_dataset(LazyNoisyDataset, size: int):
    with failing_if_raised(f"LazyNoisyDataset({size})"):
        dataset = LazyNoisyDataset(size)
    with failing_if_raised(f"len(LazyNoisyDataset({size}))"):
        length = len(dataset)
    expect(length == size, f"len(LazyNoisyDataset({size})) is {length}, expected {size}.")
    return dataset


_LAZY_HINT = "Create the generators inside the worker, the first time an item is drawn there."


def _lazy_run(LazyNoisyDataset, dataset, seed: int, num_workers: int, size: int, epochs: int) -> dict:
    """The shared run of ``epochs`` over a new LazyNoisyDataset: ``dataset``, if it is not remembered yet."""
    return _shared_run(LazyNoisyDataset, lambda: dataset, None, "LazyNoisyDataset", seed, num_workers,
                       size, epochs)


@graded_check("LazyNoisyDataset: each worker draws its own augmentation stream")
def check_LazyNoisyDataset_workers(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    dataset = _lazy_dataset(LazyNoisyDataset, size)
    seen = _lazy_run(LazyNoisyDataset, dataset, seed, num_workers, size, epochs=1)
    _shape_ok(seen["streams"], "LazyNoisyDataset")
    _expect_own_streams(seen, f"With LazyNoisyDataset and {num_workers} workers",
                        _LAZY_HINT + " Seed them from something that differs per worker.")


@graded_check("LazyNoisyDataset: a new epoch brings new augmentations")
def check_LazyNoisyDataset_epochs(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    dataset = _lazy_dataset(LazyNoisyDataset, size)
    first, second = _lazy_run(LazyNoisyDataset, dataset, seed, num_workers, size, epochs=2)["streams"]
    _shape_ok([first], "LazyNoisyDataset")
    _expect_epochs_differ(first, second, f"With LazyNoisyDataset and {num_workers} workers", _EPOCH_HINT)


@graded_check("LazyNoisyDataset: the same loader seed gives the same augmentations")
def check_LazyNoisyDataset_reproducible(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    # Two loaders built alike over two new datasets: the one-epoch run and the two-epoch run's first epoch.
    (run_a,) = _lazy_run(LazyNoisyDataset, _lazy_dataset(LazyNoisyDataset, size), seed, num_workers, size,
                         epochs=1)["streams"]
    run_b, _ = _lazy_run(LazyNoisyDataset, _lazy_dataset(LazyNoisyDataset, size), seed, num_workers, size,
                         epochs=2)["streams"]
    _shape_ok([run_a], "LazyNoisyDataset")
    _expect_reproducible(run_a, run_b, seed, f"With LazyNoisyDataset and {num_workers} workers",
                         "Derive the lazily created generators' seeds from the worker's torch.initial_seed() "
                         "(or get_worker_info().seed), not from the clock, the process id or fresh OS entropy.")


@graded_check("LazyNoisyDataset: looking at a sample first does not hand every worker one generator")
def check_LazyNoisyDataset_peek(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    dataset = _lazy_dataset(LazyNoisyDataset, size)
    seen = observe(probe_peek_then_streams, dataset, seed, num_workers)  # a look at one item, then workers
    if "peek_error" in seen:
        raise AssertionError(f"LazyNoisyDataset({size})[0] in the main process (no worker) raised "
                             f"{seen['peek_error']}. get_worker_info() returns None there.")
    sample = seen["sample"]
    expect(torch.as_tensor(sample).numel() == 2,
           f"LazyNoisyDataset items should hold 2 numbers, but dataset[0] is {sample!r}.")
    if "worker_error" in seen:
        raise AssertionError(f"LazyNoisyDataset raised an error inside a DataLoader worker: {seen['worker_error']}")
    (epoch,) = seen["streams"]
    _expect_workers_differ(
        epoch, "After dataset[0] was read in the main process",
        "The generators were created in the main process on that first read and then copied into every "
        "worker. Create them again when the dataset finds itself in a different worker (or process) "
        "than the one that made them.")
