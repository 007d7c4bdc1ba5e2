"""The checks of ``seed_worker``: loaders over ``NoisyDataset`` (generators built in ``__init__``) with the
learner's function as ``worker_init_fn``.
"""

from __future__ import annotations

from ..checking import graded_check
from .expectations import (_EPOCH_HINT, _expect_epochs_differ, _expect_independent_streams, _expect_new_draw_per_item,
                           _expect_reproducible, _expect_workers_differ, _shape_ok, _shared_run)
from .loaders import NoisyDataset


_SEED_WORKER_HINT = ("Reseed the dataset's own generators in seed_worker, reaching the dataset through "
                     "torch.utils.data.get_worker_info().")


def _seed_worker_run(seed_worker, seed: int, num_workers: int, size: int, epochs: int) -> dict:
    return _shared_run(seed_worker, lambda: NoisyDataset(size, seed=seed), seed_worker, "seed_worker",
                       seed, num_workers, size, epochs)


@graded_check("seed_worker: each worker draws its own augmentation stream")
def check_seed_worker_workers(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    (epoch,) = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=1)["streams"]
    _shape_ok([epoch], "NoisyDataset")
    _expect_workers_differ(epoch, "With worker_init_fn=seed_worker", _SEED_WORKER_HINT)
    _expect_new_draw_per_item(epoch, "With worker_init_fn=seed_worker")


@graded_check("seed_worker: no two generators of a worker draw one stream")
def check_seed_worker_independent(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    # The dataset's generators and the global torch and NumPy RNGs, in every worker: a generator seeded
    # with another's seed (torch.initial_seed() is the global torch RNG's) repeats its stream.
    (next_words,) = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=1)["next_words"]
    _expect_independent_streams(next_words, "With worker_init_fn=seed_worker")


@graded_check("seed_worker: a new epoch brings new augmentations")
def check_seed_worker_epochs(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    first, second = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=2)["streams"]
    _expect_epochs_differ(first, second, "With worker_init_fn=seed_worker", _EPOCH_HINT)


@graded_check("seed_worker: the same loader seed gives the same augmentations")
def check_seed_worker_reproducible(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    # Two loaders built alike: the one-epoch run and the first epoch of the two-epoch run.
    (run_a,) = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=1)["streams"]
    run_b, _ = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=2)["streams"]
    _expect_reproducible(run_a, run_b, seed, "With worker_init_fn=seed_worker",
                         "Derive the worker's seeds from what the loader's generator decides (the worker's "
                         "torch.initial_seed()), not from the clock, the process id or fresh OS entropy.")
