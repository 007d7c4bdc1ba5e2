"""What the checks of both exercises share: the loader runs they read (each remembered for the checks that
follow) and what they expect of the streams the workers drew.
"""

from __future__ import annotations

import torch

from ..checking import Remembered, expect, observe
from .loaders import probe_worker_streams


COLUMNS = ("torch.Generator", "NumPy default_rng")


def _run(dataset, worker_init_fn, what: str, **kwargs) -> dict:
    seen = observe(probe_worker_streams, dataset, worker_init_fn, **kwargs)
    if "worker_error" in seen:
        raise AssertionError(f"{what} raised an error inside a DataLoader worker: {seen['worker_error']}")
    return seen


_RECENT_RUNS = Remembered(keep=8)  # an exercise's three checks share its loader runs per argument set


def _shared_run(answer, make_dataset, worker_init_fn, what: str, seed: int, num_workers: int,
                size: int, epochs: int) -> dict:
    """``_run`` of a new dataset, remembered for the last few (answer, arguments, epochs).

    The workers, epochs and reproducible checks of an exercise read the same two runs (one epoch,
    two epochs) instead of five: each worker start is a fork, 10-20 ms with torch loaded.
    """
    return _RECENT_RUNS((answer, what, seed, num_workers, size, epochs),
                        lambda: _run(make_dataset(), worker_init_fn, what, seed=seed,
                                     num_workers=num_workers, epochs=epochs))


def _shape_ok(streams, what: str) -> None:
    for epoch in streams:
        for worker_id, rows in epoch.items():
            expect(rows.ndim == 2 and rows.shape[1] == 2 and len(rows) > 0,
                   f"{what}: each item should be a tensor of 2 numbers (the torch draw, then the NumPy draw), "
                   f"but worker {worker_id} produced rows of shape {tuple(rows.shape[1:])}.")


def _first_identical_pair(epoch: dict[int, torch.Tensor]):
    """(column, worker a, worker b, rows) for the first column two workers drew identically."""
    workers = sorted(epoch)
    for column, name in enumerate(COLUMNS):
        for i, a in enumerate(workers):
            for b in workers[i + 1:]:
                n = min(len(epoch[a]), len(epoch[b]))
                if torch.equal(epoch[a][:n, column], epoch[b][:n, column]):
                    return name, a, b, epoch[a][:n, column]
    return None


def _values(rows: torch.Tensor, n: int = 3) -> str:
    return ", ".join(f"{v:.4f}" for v in rows[:n].tolist())


def _expect_workers_differ(epoch, what: str, hint: str) -> None:
    same = _first_identical_pair(epoch)
    if same:
        name, a, b, rows = same
        raise AssertionError(
            f"{what}, workers {a} and {b} drew exactly the same {name} stream ({_values(rows)}, ...). "
            f"Every worker started from a copy of the same generator. {hint}")


_PER_ITEM_HINT = ("A generator created and seeded alike for every item starts over each time: create it "
                  "once per worker, or seed each item's generator from the worker's seed and the item's "
                  "index together.")


def _expect_new_draw_per_item(epoch, what: str) -> None:
    """No draw repeats within the epoch, within a worker or across workers (two continuous draws of
    independent streams coincide with probability about 2^-24 or less)."""
    for column, name in enumerate(COLUMNS):
        drawn_at: dict[float, tuple[int, int]] = {}
        for worker_id in sorted(epoch):
            values = epoch[worker_id][:, column].tolist()
            if len(values) > 1 and len(set(values)) == 1:
                raise AssertionError(
                    f"{what}, all {len(values)} items worker {worker_id} returned carry the same {name} draw "
                    f"({values[0]:.4f}): every item gets the same augmentation. {_PER_ITEM_HINT}")
            for draw, value in enumerate(values):
                if value not in drawn_at:
                    drawn_at[value] = (worker_id, draw)
                    continue
                other, other_draw = drawn_at[value]
                if other == worker_id:
                    raise AssertionError(
                        f"{what}, items {other_draw + 1} and {draw + 1} that worker {worker_id} returned carry "
                        f"the same {name} draw ({value:.4f}): two items got the same augmentation, so their "
                        f"generators were most likely seeded with the same number. {_PER_ITEM_HINT}")
                raise AssertionError(
                    f"{what}, item {other_draw + 1} that worker {other} returned and item {draw + 1} that worker "
                    f"{worker_id} returned carry the same {name} draw ({value:.4f}): two items of one epoch got "
                    f"the same augmentation, so their generators were most likely seeded with the same number. "
                    f"Seeds made by adding the item's index to the worker's seed overlap across workers, whose "
                    f"seeds are consecutive (base_seed + worker_id): combine the two numbers so that different "
                    f"pairs give different seeds, e.g. np.random.SeedSequence([seed, index]).")


_DISTINCT_SEEDS_HINT = ("Give each generator a seed of its own derived from torch.initial_seed(), e.g. "
                        "np.random.SeedSequence(torch.initial_seed()).spawn(2), and leave the global RNGs as "
                        "PyTorch seeded them (or reseed each with a child seed of its own).")


def _shared_words(words_a: list[int], words_b: list[int]) -> list[int]:
    """The words two windows share, in a's order. Two independent streams share none: 2 coincidences of
    31-bit words among 32 x 32 pairs happen with probability about 1e-13."""
    shared = set(words_a) & set(words_b)
    return [w for w in words_a if w in shared]


def _expect_independent_streams(next_words: dict[int, dict[str, list[int]]], what: str,
                                hint: str = _DISTINCT_SEEDS_HINT) -> None:
    """No two streams of the workers are one (next_words: per worker, {stream: its next raw words after the
    worker's first batch}): not a dataset generator and a global RNG, not the global torch RNG and the
    global NumPy one, not one global RNG in two workers. Two copies of one dataset generator are left to
    ``_expect_workers_differ``, whose trap that is."""
    streams = [(worker, name, words) for worker in sorted(next_words)
               for name, words in sorted(next_words[worker].items())]
    for i, (worker_a, a, words_a) in enumerate(streams):
        for worker_b, b, words_b in streams[i + 1:]:
            if a == b and (worker_a == worker_b or not a.startswith("the global")):
                continue
            shared = _shared_words(words_a, words_b)
            if len(shared) < 2:
                continue
            shown = ", ".join(str(w) for w in shared[:3])
            if a == b:
                raise AssertionError(
                    f"{what}, {a} gives the same numbers in workers {worker_a} and {worker_b} (the same raw "
                    f"32-bit words: {shown}, ...): it was seeded with the same number in both, so every worker's "
                    f"augmentations that draw from it are one stream. {hint}")
            pair = (f"{a} and {b} of worker {worker_a}" if worker_a == worker_b
                    else f"{a} of worker {worker_a} and {b} of worker {worker_b}")
            recipe = (" np.random.seed(torch.initial_seed() % 2**32), the recipe of PyTorch's reproducibility "
                      "notes, does exactly this."
                      if {a, b} == {"the global torch RNG", "the global NumPy RNG (np.random)"} else "")
            raise AssertionError(
                f"{what}, {pair} are one stream: the next numbers they give are the same raw 32-bit "
                f"words ({shown}, ...). They were seeded with the same number: torch's generators and NumPy's "
                f"legacy np.random are all Mersenne Twisters that keep the low 32 bits of a seed, and inside a "
                f"worker torch.initial_seed() is the seed PyTorch gave the global torch RNG.{recipe} A "
                f"torch-based and a NumPy-based augmentation, or the dataset's noise and a random transform, "
                f"then draw the same numbers. {hint}")


def _expect_own_streams(seen: dict, what: str, copied_hint: str) -> None:
    """Each worker's streams are its own: not a copy of another worker's, a new draw for every item, and
    not one stream with another generator of the workers."""
    epoch = seen["streams"][0]
    _expect_workers_differ(epoch, what, copied_hint)
    _expect_new_draw_per_item(epoch, what)
    _expect_independent_streams(seen["next_words"][0], what)


def _expect_epochs_differ(first, second, what: str, hint: str) -> None:
    for worker_id in sorted(first):
        for column, name in enumerate(COLUMNS):
            n = min(len(first[worker_id]), len(second[worker_id]))
            a, b = first[worker_id][:n, column], second[worker_id][:n, column]
            expect(not torch.equal(a, b),
                   f"{what}, worker {worker_id} repeated its epoch-1 {name} stream exactly in epoch 2 "
                   f"({_values(a)}, ...): every epoch gets the same augmentations. {hint}")


def _expect_reproducible(run_a, run_b, seed: int, what: str, hint: str) -> None:
    for worker_id in sorted(run_a):
        for column, name in enumerate(COLUMNS):
            a, b = run_a[worker_id][:, column], run_b.get(worker_id, torch.empty(0, 2))[:, column]
            expect(a.shape == b.shape and torch.equal(a, b),
                   f"{what}, two DataLoaders built with generator=torch.Generator().manual_seed({seed}) gave "
                   f"worker {worker_id} different {name} streams ({_values(a)} vs {_values(b)}). {hint}")


_EPOCH_HINT = ("Whatever seeds the generators inside a worker must change from one epoch to the next: "
               "worker_id or the item's index alone do not, the worker's torch.initial_seed() does (the "
               "loader draws a new base seed each epoch).")
