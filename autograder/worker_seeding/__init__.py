"""Checks for notebook 04: generators copied into every DataLoader worker.

A Dataset that builds a ``torch.Generator`` or a NumPy ``default_rng`` in
``__init__`` hands every worker a copy of the same generator: by ``fork`` (the
child inherits the parent's memory) or by pickling (``spawn``). PyTorch reseeds
the *global* RNGs in each worker, never generator objects a Dataset holds. The
checks run the learner's code in real worker processes (num_workers >= 2), read
back which worker drew which values, and compare the streams across workers,
across epochs and across two loaders built with the same seed. Every item must
carry a new draw (a generator made anew per item from one seed repeats it), and no
dataset generator may repeat a global RNG's stream: seeded with ``torch.initial_seed()``
itself, a ``torch.Generator`` draws what the worker's global torch RNG draws, so a
transform using the global RNG repeats the dataset's noise (``tag_with_global_next``).

Graded mode. The workers must be forked where the learner's ``seed_worker`` and
``LazyNoisyDataset`` live, so the loader runs in a probe (``probe_worker_streams``):
in the sandbox it returns the rows each worker drew, as tensors, and the check
judges them in the grading process. In the learner's kernel the probes run right there.

Start method. Workers are forked where the OS offers ``fork`` (Linux, macOS): it
is fast, and a worker sees functions and classes defined in notebook cells. Under
``spawn`` (Windows; or forced with WORKBOOK_WORKER_START=spawn) or ``forkserver`` (Linux's
default from Python 3.14; the notebook's 3.2 runs it) a worker is a new
interpreter that can only import objects from modules, so a function or class
defined in a notebook cell cannot be loaded there. ``portable`` then ships such an
object by value (its compiled code and the module-level names it uses) and the
worker rebuilds it; a dataset *instance* still travels by pickling, exactly as
spawn does it, so a generator built in ``__init__`` arrives as a copy.
"""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from ..checking import Remembered, error_text, expect, failing_if_raised, graded_check, observe
from ..engine.portable import portable

# ---------------------------------------------------------------------------------------------
# Start method

def default_start_method() -> str:
    """fork where the OS has it (fast, sees notebook cells); spawn elsewhere."""
    forced = os.environ.get("WORKBOOK_WORKER_START")
    if forced:
        return forced
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


# ---------------------------------------------------------------------------------------------
# The datasets the notebook and the checks share (importable, so they load under spawn too)

class NoisyDataset(Dataset):
    """The trap: generators built once, in ``__init__``.

    Each item is the pair of random augmentation parameters drawn for it: one
    from a ``torch.Generator``, one from a NumPy ``default_rng``.
    """

    def __init__(self, size: int = 16, seed: int = 0):
        self.size = size
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        torch_draw = torch.rand((), generator=self.generator, dtype=torch.float64).item()
        return torch.tensor([torch_draw, self.rng.random()], dtype=torch.float64)


class GlobalRngDataset(Dataset):
    """Draws from the global RNGs PyTorch does reseed, and reports the worker's seeds, through public API only.

    Before drawing, it compares each global RNG's state with that of a fresh generator seeded with the
    worker's seed (``get_worker_info().seed``, documented as the seed set for the worker): in the first item a
    worker loads, that says what the worker's RNGs were seeded with (later items have drawn)."""

    def __init__(self, size: int = 8):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        import random
        info = get_worker_info()
        seed = info.seed if info else torch.initial_seed()
        return {"torch.initial_seed()": torch.initial_seed(),
                "get_worker_info().seed": info.seed if info else None,
                "random seeded with it": random.getstate() == random.Random(seed).getstate(),
                "torch seeded with it": torch.equal(torch.get_rng_state(),
                                                    torch.Generator().manual_seed(seed).get_state()),
                "NumPy seeded with it": bool(np.array_equal(np.random.get_state()[1],
                                                            np.random.RandomState(seed % 2**32).get_state()[1])),
                "random.random()": random.random(),
                "torch.rand(())": torch.rand((), dtype=torch.float64).item(),
                "np.random.random()": np.random.random()}


def tag_with_worker_id(batch):
    """A collate_fn: runs inside the worker, so it can say which worker built the batch."""
    info = get_worker_info()
    return (info.id if info else -1), default_collate(batch)


def tag_with_global_next(batch):
    """``tag_with_worker_id``, plus what the worker's global RNGs would draw next, read without drawing.

    It runs in the worker after the batch's items were drawn: [torch.rand as float64, torch.rand as
    float32, np.random.random()], each from the global RNG's current state, which is put back. A dataset
    generator seeded with the number a global RNG was seeded with repeats that global stream: its first
    draw is the global RNG's next one while nothing drew from the global RNG yet. A dataset that draws
    from the global RNG itself has moved it on, so its draw is never the next one.
    """
    worker_id, collated = tag_with_worker_id(batch)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    as_float64 = torch.rand((), dtype=torch.float64).item()
    torch.set_rng_state(torch_state)
    as_float32 = torch.rand((), dtype=torch.float32).item()
    torch.set_rng_state(torch_state)
    numpy_next = float(np.random.random())
    np.random.set_state(numpy_state)
    return worker_id, collated, torch.tensor([as_float64, as_float32, numpy_next], dtype=torch.float64)


def documented_seed_worker(worker_id: int) -> None:
    """The recipe from PyTorch's reproducibility notes: reseeds the global NumPy and random."""
    import random
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


# ---------------------------------------------------------------------------------------------
# Running a loader and grouping what each worker drew

class WorkerFailed(Exception):
    """The learner's code raised inside a worker; the message is the worker's own error."""


def _worker_error(exc: BaseException) -> str:
    text = str(exc)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # DataLoader re-raises the worker's exception with its traceback as text: the last line is the error.
    return lines[-1].strip() if lines else type(exc).__name__


def _loader_epochs(dataset, worker_init_fn, seed: int, num_workers: int, epochs: int, batch_size: int,
                   start_method: str | None, collate_fn):
    """The batches of ``epochs`` passes of a DataLoader, one list per epoch, as ``collate_fn`` made them."""
    start_method = start_method or default_start_method()
    if start_method != "fork":
        dataset, worker_init_fn = portable(dataset), portable(worker_init_fn)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed), collate_fn=collate_fn,
                        multiprocessing_context=start_method)
    for _ in range(epochs):
        batches = iter(loader)
        try:
            epoch = list(batches)
        except NotImplementedError:
            raise  # an unanswered exercise: the grader reports it as "not answered yet"
        except Exception as exc:  # the worker's exception arrives re-raised, its traceback as text
            raise WorkerFailed(_worker_error(exc)) from None
        finally:
            # After a worker's error the iterator lives on in the traceback, and when the garbage
            # collector ends it, torch waits 5 s for each worker; ended here, its workers stop at once.
            # (_shutdown_workers is torch's own clean-up, private but stable since 1.x; idempotent.)
            getattr(batches, "_shutdown_workers", lambda: None)()
        yield epoch


def _rows(batch) -> torch.Tensor:
    return torch.as_tensor(batch).reshape(len(batch), -1).double()


def worker_streams(dataset, worker_init_fn=None, seed: int = 0, num_workers: int = 2, epochs: int = 1,
                   batch_size: int = 2, start_method: str | None = None) -> list[dict[int, torch.Tensor]]:
    """Run ``epochs`` passes of a DataLoader; per epoch, {worker id: rows that worker produced}.

    Non-persistent workers (the default): every epoch starts new worker processes.
    ``generator=`` is seeded with ``seed``, so ``base_seed`` is reproducible.
    """
    result = []
    for batches in _loader_epochs(dataset, worker_init_fn, seed, num_workers, epochs, batch_size, start_method,
                                  tag_with_worker_id):
        per_worker: dict[int, list] = {w: [] for w in range(num_workers)}
        for worker_id, batch in batches:
            per_worker[worker_id].append(_rows(batch))
        result.append({w: torch.cat(rows) if rows else torch.empty(0, 2) for w, rows in per_worker.items()})
    return result


def worker_streams_and_global_next(dataset, worker_init_fn=None, seed: int = 0, num_workers: int = 2,
                                   epochs: int = 1, batch_size: int = 2):
    """``worker_streams``, and per epoch {worker id: what its global RNGs would have drawn next after its
    first batch} (``tag_with_global_next``)."""
    streams, global_next = [], []
    for batches in _loader_epochs(dataset, worker_init_fn, seed, num_workers, epochs, batch_size, None,
                                  tag_with_global_next):
        per_worker: dict[int, list] = {w: [] for w in range(num_workers)}
        first_next: dict[int, torch.Tensor] = {}
        for worker_id, batch, following in batches:
            per_worker[worker_id].append(_rows(batch))
            first_next.setdefault(worker_id, following)
        streams.append({w: torch.cat(rows) if rows else torch.empty(0, 2) for w, rows in per_worker.items()})
        global_next.append(first_next)
    return streams, global_next


# ---------------------------------------------------------------------------------------------
# Probes: they run where the learner's code lives (the sandbox, in graded mode) and return data

def probe_worker_streams(dataset, worker_init_fn, seed: int, num_workers: int, epochs: int = 1) -> dict:
    """Run ``worker_streams_and_global_next`` on ``dataset``: {"streams": per epoch, {worker id: the rows it
    drew}, "global_next": per epoch, {worker id: its global RNGs' next draws after its first batch}}, or
    {"worker_error": the error a worker raised}, as data (a ``WorkerFailed`` would not travel as one)."""
    try:
        streams, global_next = worker_streams_and_global_next(dataset, worker_init_fn, seed=seed,
                                                              num_workers=num_workers, epochs=epochs)
    except WorkerFailed as exc:
        return {"worker_error": str(exc)}
    return {"streams": streams, "global_next": global_next}


def probe_peek_then_streams(dataset, seed: int, num_workers: int) -> dict:
    """``dataset[0]`` read in this process, then ``probe_worker_streams`` on the same dataset: one probe,
    so the first read's effect on the dataset (a generator made there) is what the workers inherit."""
    try:
        sample = probe_first_item(dataset, seed)
    except NotImplementedError:
        raise
    except Exception as exc:                 # reported as data: the check words it
        return {"peek_error": error_text(exc)}
    return {"sample": sample, **probe_worker_streams(dataset, None, seed=seed, num_workers=num_workers)}


def probe_first_item(dataset, seed: int):
    """``dataset[0]``, read in this process (no worker), as a learner looks at a sample before training.

    The global torch seed is ``seed`` for that read (and put back after): a dataset that seeds from
    ``torch.initial_seed()`` there then draws the same values in the kernel and in the sandbox.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return dataset[0]


# ---------------------------------------------------------------------------------------------
# Checks

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


def _seed_worker_run(seed_worker, seed: int, num_workers: int, size: int, epochs: int) -> dict:
    return _shared_run(seed_worker, lambda: NoisyDataset(size, seed=seed), seed_worker, "seed_worker",
                       seed, num_workers, size, epochs)


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
_SEED_WORKER_HINT = ("Reseed the dataset's own generators in seed_worker, reaching the dataset through "
                     "torch.utils.data.get_worker_info().")


@graded_check("seed_worker: each worker draws its own augmentation stream")
def check_seed_worker_workers(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    seen = _seed_worker_run(seed_worker, seed, num_workers, size, epochs=1)
    _shape_ok(seen["streams"], "NoisyDataset")
    _expect_own_streams(seen, "With worker_init_fn=seed_worker", _SEED_WORKER_HINT)


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
