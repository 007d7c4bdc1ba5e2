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


_DISTINCT_SEEDS_HINT = ("Derive a separate seed for each generator from torch.initial_seed(), e.g. "
                        "np.random.SeedSequence(torch.initial_seed()).spawn(2), so that no generator of the "
                        "dataset repeats a global one.")


def _expect_not_a_global_stream(epoch, global_next, what: str) -> None:
    """No worker's first draw is what some worker's global RNG would draw next (global_next: per worker,
    [torch float64, torch float32, NumPy] read in that worker after its first batch, the RNGs left as
    they were). A dataset generator seeded with a global RNG's seed repeats that RNG's stream; one that
    draws from the global RNG itself has moved it on, so its draw is never the next one."""
    for column, name in enumerate(COLUMNS):
        for worker_id in sorted(epoch):
            if not len(epoch[worker_id]):
                continue
            first = epoch[worker_id][0, column].item()
            for other in sorted(global_next):
                upcoming = global_next[other].tolist()
                candidates = upcoming[:2] if column == 0 else upcoming[2:]
                if first not in candidates:
                    continue
                rng = "torch RNG" if column == 0 else "NumPy RNG (np.random)"
                whose = "its own" if other == worker_id else f"worker {other}'s"
                raise AssertionError(
                    f"{what}, the first {name} draw of worker {worker_id} ({first:.4f}) is exactly the next "
                    f"number {whose} global {rng} gives: the dataset's generator was seeded with the number "
                    f"that global RNG was seeded with (inside a worker, torch.initial_seed() is the global torch "
                    f"RNG's seed), so the two produce one stream. A random transform that draws from the global "
                    f"RNG (torchvision's do) then repeats the dataset's noise exactly. {_DISTINCT_SEEDS_HINT}")


def _expect_own_streams(seen: dict, what: str, copied_hint: str) -> None:
    """Each worker's streams are its own: not a copy of another worker's, a new draw for every item, and
    not the stream of a global RNG."""
    epoch, global_next = seen["streams"][0], seen["global_next"][0]
    _expect_workers_differ(epoch, what, copied_hint)
    _expect_new_draw_per_item(epoch, what)
    _expect_not_a_global_stream(epoch, global_next, what)


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
