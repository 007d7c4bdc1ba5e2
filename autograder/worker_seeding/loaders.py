"""The datasets the notebook and the checks share, and the DataLoader runs: the start method, the datasets
(importable, so they load under spawn too) and the collate functions that tag a batch with its worker, a
loader's epochs grouped by worker (``worker_streams``), and the probes, which run where the learner's code
lives and return data.
"""
from __future__ import annotations

import multiprocessing
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from ..checking import error_text
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


class TorchAndNumpyAugmentations(Dataset):
    """Two random transforms per item, drawn from the worker's global RNGs as real pipelines draw them: a
    torch-based one picks one of 4 rotations (``torch.randint``), a NumPy-based one one of 4 crops
    (``np.random.randint``)."""

    def __init__(self, size: int = 16):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        rotation = torch.randint(4, ()).item()
        crop = np.random.randint(4)
        return torch.tensor([rotation, crop], dtype=torch.float64)


class AugmentedSamples(Dataset):
    """Each item: its sample id, a draw from the worker's global torch RNG (as torchvision's random
    transforms draw), and a draw from a generator made for this sample alone, seeded from
    (seed, epoch, index) mixed by a SeedSequence. ``set_epoch`` before each epoch's iterator."""

    def __init__(self, size: int = 12, seed: int = 0):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch   # workers get a copy of the dataset when the epoch's iterator starts

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        sample_seed = np.random.SeedSequence([self.seed, self.epoch, index]).generate_state(1, np.uint64)[0]
        per_sample = torch.Generator().manual_seed(int(sample_seed))
        return torch.tensor([index, torch.rand((), dtype=torch.float64).item(),
                             torch.rand((), generator=per_sample, dtype=torch.float64).item()], dtype=torch.float64)


def tag_with_worker_id(batch):
    """A collate_fn: runs inside the worker, so it can say which worker built the batch."""
    info = get_worker_info()
    return (info.id if info else -1), default_collate(batch)


WORDS = 32   # raw words read from each stream: two streams that are one share all but their offset's


def _words_of(rng) -> tuple[str, list[int]] | None:
    """(what ``rng`` is, its next ``WORDS`` raw 32-bit words with the top bit dropped), read without moving
    it on (its state is put back); None for what is no generator or is a global RNG.

    torch's ``int32`` ``random_()`` and NumPy's legacy ``randint(2**31)`` both return one raw word of the
    MT19937 stream per draw with its top bit dropped (tests/notebooks/test_04 holds both to it), so a torch
    stream and a NumPy stream seeded alike give the same numbers here. A PCG64 (``default_rng``) gives
    words of its own.
    """
    if isinstance(rng, torch.Generator) and rng is not torch.default_generator:
        state = rng.get_state()
        words = torch.empty(WORDS, dtype=torch.int32).random_(generator=rng).tolist()
        rng.set_state(state)
        return "torch.Generator", words
    if isinstance(rng, np.random.RandomState) and rng is not np.random.mtrand._rand:
        state = rng.get_state()
        words = rng.randint(0, 2**31, WORDS).tolist()
        rng.set_state(state)
        return "NumPy RandomState", words
    if isinstance(rng, np.random.Generator):
        state = rng.bit_generator.state
        words = (rng.bit_generator.random_raw(WORDS) & 0x7FFFFFFF).tolist()
        rng.bit_generator.state = state
        return f"NumPy Generator, {type(rng.bit_generator).__name__}", words
    return None


def next_words() -> dict[str, list[int]]:
    """In a worker: {stream: its next raw words} for the global torch and NumPy RNGs and every generator
    the worker's copy of the dataset holds, each left where it was (``_words_of``)."""
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    words = {"the global torch RNG": torch.empty(WORDS, dtype=torch.int32).random_().tolist(),
             "the global NumPy RNG (np.random)": np.random.randint(0, 2**31, WORDS).tolist()}
    torch.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    info, seen = get_worker_info(), set()
    for name, value in sorted(getattr(info.dataset, "__dict__", {}).items() if info else ()):
        held = None if id(value) in seen else _words_of(value)   # one generator under two names is one stream
        seen.add(id(value))
        if held is not None:
            words[f"the dataset's {name} ({held[0]})"] = held[1]
    return words


def tag_with_next_words(batch):
    """``tag_with_worker_id``, plus ``next_words()`` read in the worker after the batch's items were drawn.

    A dataset generator seeded with the number a global RNG was seeded with, or two generators seeded
    alike, are one stream: their next words coincide (shifted by what each drew already).
    """
    worker_id, collated = tag_with_worker_id(batch)
    return worker_id, collated, next_words()


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


def worker_streams_and_next_words(dataset, worker_init_fn=None, seed: int = 0, num_workers: int = 2,
                                  epochs: int = 1, batch_size: int = 2):
    """``worker_streams``, and per epoch {worker id: the next raw words of each of its streams after its
    first batch} (``tag_with_next_words``)."""
    streams, next_words = [], []
    for batches in _loader_epochs(dataset, worker_init_fn, seed, num_workers, epochs, batch_size, None,
                                  tag_with_next_words):
        per_worker: dict[int, list] = {w: [] for w in range(num_workers)}
        first_next: dict[int, dict[str, list[int]]] = {}
        for worker_id, batch, following in batches:
            per_worker[worker_id].append(_rows(batch))
            first_next.setdefault(worker_id, following)
        streams.append({w: torch.cat(rows) if rows else torch.empty(0, 2) for w, rows in per_worker.items()})
        next_words.append(first_next)
    return streams, next_words


# ---------------------------------------------------------------------------------------------
# Probes: they run where the learner's code lives (the sandbox, in graded mode) and return data

def probe_worker_streams(dataset, worker_init_fn, seed: int, num_workers: int, epochs: int = 1) -> dict:
    """Run ``worker_streams_and_next_words`` on ``dataset``: {"streams": per epoch, {worker id: the rows it
    drew}, "next_words": per epoch, {worker id: {stream: its next raw words after the worker's first
    batch}}}, or {"worker_error": the error a worker raised}, as data (a ``WorkerFailed`` would not travel
    as one)."""
    try:
        streams, next_words = worker_streams_and_next_words(dataset, worker_init_fn, seed=seed,
                                                            num_workers=num_workers, epochs=epochs)
    except WorkerFailed as exc:
        return {"worker_error": str(exc)}
    return {"streams": streams, "next_words": next_words}


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
