"""Checks for notebook 04: generators copied into every DataLoader worker.

A Dataset that builds a ``torch.Generator`` or a NumPy ``default_rng`` in
``__init__`` hands every worker a copy of the same generator: by ``fork`` (the
child inherits the parent's memory) or by pickling (``spawn``). PyTorch reseeds
the *global* RNGs in each worker, never generator objects a Dataset holds. The
checks run the learner's code in real worker processes (num_workers >= 2), read
back which worker drew which values, and compare the streams across workers,
across epochs and across two loaders built with the same seed.

Graded mode. The workers must be forked where the learner's ``seed_worker`` and
``LazyNoisyDataset`` live, so the loader runs in a probe (``probe_worker_streams``):
in the sandbox it returns the rows each worker drew, as tensors, and the check
judges them in the grading process. In the learner's kernel the probes run right there.

Start method. Workers are forked where the OS offers ``fork`` (Linux, macOS): it
is fast, and a worker sees functions and classes defined in notebook cells. Under
``spawn`` (Windows; or forced with WORKBOOK_WORKER_START=spawn) a worker is a new
interpreter that can only import objects from modules, so a function or class
defined in a notebook cell cannot be loaded there. ``portable`` then ships such an
object by value (its compiled code and the module-level names it uses) and the
worker rebuilds it; a dataset *instance* still travels by pickling, exactly as
spawn does it, so a generator built in ``__init__`` arrives as a copy.
"""

from __future__ import annotations

import builtins
import marshal
import multiprocessing
import os
import pickle
import types

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

from .checking import Remembered, expect, graded_check, observe, require_callable

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
    """Draws from the global RNGs PyTorch does reseed, and reports the worker's seeds."""

    def __init__(self, size: int = 8):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        import random
        info = get_worker_info()
        return {"torch.initial_seed()": torch.initial_seed(),
                "get_worker_info().seed": info.seed if info else None,
                "random.random()": random.random(),
                "torch.rand(())": torch.rand((), dtype=torch.float64).item(),
                "np.random.random()": np.random.random()}


def tag_with_worker_id(batch):
    """A collate_fn: runs inside the worker, so it can say which worker built the batch."""
    info = get_worker_info()
    return (info.id if info else -1), default_collate(batch)


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


def worker_streams(dataset, worker_init_fn=None, seed: int = 0, num_workers: int = 2, epochs: int = 1,
                   batch_size: int = 2, start_method: str | None = None) -> list[dict[int, torch.Tensor]]:
    """Run ``epochs`` passes of a DataLoader; per epoch, {worker id: rows that worker produced}.

    Non-persistent workers (the default): every epoch starts new worker processes.
    ``generator=`` is seeded with ``seed``, so ``base_seed`` is reproducible.
    """
    start_method = start_method or default_start_method()
    if start_method != "fork":
        dataset, worker_init_fn = portable(dataset), portable(worker_init_fn)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed), collate_fn=tag_with_worker_id,
                        multiprocessing_context=start_method)
    result = []
    for _ in range(epochs):
        per_worker: dict[int, list] = {w: [] for w in range(num_workers)}
        try:
            for worker_id, batch in loader:
                per_worker[worker_id].append(torch.as_tensor(batch).reshape(len(batch), -1).double())
        except NotImplementedError:
            raise  # an unanswered exercise: the grader reports it as "not answered yet"
        except Exception as exc:  # the worker's exception arrives re-raised, its traceback as text
            raise WorkerFailed(_worker_error(exc)) from None
        result.append({w: torch.cat(rows) if rows else torch.empty(0, 2) for w, rows in per_worker.items()})
    return result


# ---------------------------------------------------------------------------------------------
# Shipping notebook-defined functions and classes to spawned workers

def _is_notebook_defined(obj) -> bool:
    return getattr(obj, "__module__", None) == "__main__"


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


class _Packer:
    """Encodes notebook-defined functions and classes, plus the globals they use, as plain data."""

    def __init__(self, namespace: dict):
        self.source_namespace = namespace
        self.globals: dict[str, tuple] = {}

    def value(self, value):
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__)
        if isinstance(value, types.FunctionType) and _is_notebook_defined(value):
            return ("function", self.function(value))
        if isinstance(value, type) and _is_notebook_defined(value):
            return ("class", self.klass(value))
        return ("pickle", pickle.dumps(value))

    def _globals_of(self, code: types.CodeType) -> None:
        for name in sorted(_referenced_names(code)):
            if name in self.globals or name not in self.source_namespace:
                continue
            self.globals[name] = ("pending",)  # stops cycles: a class whose methods name the class
            try:
                self.globals[name] = self.value(self.source_namespace[name])
            except Exception:
                del self.globals[name]  # unpicklable and unused in the worker, most likely

    def function(self, fn: types.FunctionType) -> tuple:
        self._globals_of(fn.__code__)
        cells = []
        for free_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if free_name == "__class__":
                cells.append(("own_class",))  # zero-argument super(): filled in once the class exists
            else:
                cells.append(self.value(cell.cell_contents))
        return (marshal.dumps(fn.__code__), fn.__name__, fn.__qualname__,
                tuple(self.value(d) for d in (fn.__defaults__ or ())),
                {k: self.value(v) for k, v in (fn.__kwdefaults__ or {}).items()}, cells)

    def klass(self, cls: type) -> tuple:
        members = {}
        for name, member in vars(cls).items():
            if isinstance(member, (staticmethod, classmethod)):
                members[name] = (type(member).__name__, self.function(member.__func__))
            elif isinstance(member, property):
                members[name] = ("property", *(self.function(f) if f else None
                                               for f in (member.fget, member.fset, member.fdel)))
            elif isinstance(member, types.FunctionType):
                members[name] = ("method", self.function(member))
            elif name == "__doc__" or not (name.startswith("__") and name.endswith("__")):
                members[name] = ("attribute", self.value(member))
        bases = tuple(self.value(b) for b in cls.__bases__)
        return (cls.__name__, cls.__qualname__, bases, members)


class _Unpacker:
    def __init__(self, packed_globals: dict):
        self.namespace = {"__builtins__": builtins, "__name__": "__main__"}
        self.packed = packed_globals
        for name in packed_globals:
            self.namespace[name] = self.value(packed_globals[name])

    def value(self, encoded):
        kind = encoded[0]
        if kind == "module":
            import importlib
            return importlib.import_module(encoded[1])
        if kind == "function":
            return self.function(encoded[1])[0]
        if kind == "class":
            return self.klass(encoded[1])
        return pickle.loads(encoded[1])

    def function(self, packed) -> tuple[types.FunctionType, list]:
        code, name, qualname, defaults, kwdefaults, cells = packed
        closure = tuple(types.CellType() if c[0] == "own_class" else types.CellType(self.value(c)) for c in cells)
        fn = types.FunctionType(marshal.loads(code), self.namespace, name,
                                tuple(self.value(d) for d in defaults), closure or None)
        fn.__kwdefaults__ = {k: self.value(v) for k, v in kwdefaults.items()} or None
        fn.__qualname__, fn.__module__ = qualname, "__main__"
        own_class_cells = [cell for cell, c in zip(closure, cells) if c[0] == "own_class"]
        return fn, own_class_cells

    def klass(self, packed) -> type:
        name, qualname, bases, members = packed
        if isinstance(self.namespace.get(name), type) and self.namespace[name].__qualname__ == qualname:
            return self.namespace[name]  # already rebuilt (a method referred to its own class)
        namespace, own_class_cells = {"__module__": "__main__", "__qualname__": qualname}, []
        for member_name, (kind, *rest) in members.items():
            if kind == "attribute":
                namespace[member_name] = self.value(rest[0])
                continue
            if kind == "property":
                parts = []
                for packed_fn in rest:
                    fn, cells = self.function(packed_fn) if packed_fn else (None, [])
                    parts.append(fn)
                    own_class_cells += cells
                namespace[member_name] = property(*parts)
                continue
            fn, cells = self.function(rest[0])
            own_class_cells += cells
            namespace[member_name] = {"staticmethod": staticmethod, "classmethod": classmethod}.get(kind, lambda f: f)(fn)
        cls = type(name, tuple(self.value(b) for b in bases), namespace)
        for cell in own_class_cells:
            cell.cell_contents = cls
        self.namespace[name] = cls
        return cls


def _rebuild_function(packed_globals, packed_function):
    return _Unpacker(packed_globals).function(packed_function)[0]


def _rebuild_instance(packed_globals, packed_class, state: bytes):
    cls = _Unpacker(packed_globals).klass(packed_class)
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))  # the instance's attributes travel as spawn sends them: pickled
    return obj


class _PortableFunction:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        packer = _Packer(self.fn.__globals__)
        packed = packer.function(self.fn)
        return _rebuild_function, (packer.globals, packed)


class _PortableDataset(Dataset):
    """Sends a dataset to a spawned worker the way spawn does, by pickling its attributes.

    The attributes travel as plain pickle bytes rather than through multiprocessing's
    shared-memory tensor sharing, which some sandboxed Linux kernels refuse; the
    worker receives the same copy either way.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __reduce__(self):
        cls, state = type(self.dataset), pickle.dumps(vars(self.dataset))
        if not _is_notebook_defined(cls):
            return _rebuild_importable_instance, (cls, state)
        any_method = next((m for m in vars(cls).values() if isinstance(m, types.FunctionType)), None)
        packer = _Packer(any_method.__globals__ if any_method else {})
        packed = packer.klass(cls)
        return _rebuild_instance, (packer.globals, packed, state)


def _rebuild_importable_instance(cls, state: bytes):
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))
    return obj


def portable(obj):
    """``obj``, made loadable by a spawned worker even if it was defined in a notebook cell."""
    if obj is None:
        return None
    if isinstance(obj, types.FunctionType) and _is_notebook_defined(obj):
        return _PortableFunction(obj)
    if isinstance(obj, Dataset) or (_is_notebook_defined(type(obj)) and hasattr(obj, "__dict__")):
        return _PortableDataset(obj) if hasattr(obj, "__dict__") else obj
    return obj


# ---------------------------------------------------------------------------------------------
# Probes: they run where the learner's code lives (the sandbox, in graded mode) and return data

def probe_worker_streams(dataset, worker_init_fn, seed: int, num_workers: int, epochs: int = 1) -> dict:
    """Run ``worker_streams`` on ``dataset``: {"streams": per epoch, {worker id: the rows it drew}},
    or {"worker_error": the error a worker raised}, as data (a ``WorkerFailed`` would not travel as one)."""
    try:
        return {"streams": worker_streams(dataset, worker_init_fn, seed=seed, num_workers=num_workers,
                                          epochs=epochs)}
    except WorkerFailed as exc:
        return {"worker_error": str(exc)}


def probe_peek_then_streams(dataset, seed: int, num_workers: int) -> dict:
    """``dataset[0]`` read in this process, then ``probe_worker_streams`` on the same dataset: one probe,
    so the first read's effect on the dataset (a generator made there) is what the workers inherit."""
    try:
        sample = probe_first_item(dataset, seed)
    except NotImplementedError:
        raise
    except Exception as exc:                 # reported as data: the check words it
        return {"peek_error": _error_text(exc)}
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


def _streams(dataset, worker_init_fn, what: str, **kwargs):
    seen = observe(probe_worker_streams, dataset, worker_init_fn, **kwargs)
    if "worker_error" in seen:
        raise AssertionError(f"{what} raised an error inside a DataLoader worker: {seen['worker_error']}")
    return seen["streams"]


_RECENT_RUNS = Remembered(keep=8)  # an exercise's three checks share its loader runs per argument set


def _shared_streams(answer, make_dataset, worker_init_fn, what: str, seed: int, num_workers: int,
                    size: int, epochs: int):
    """``_streams`` of a new dataset, remembered for the last few (answer, arguments, epochs).

    The workers, epochs and reproducible checks of an exercise read the same two runs (one epoch,
    two epochs) instead of five: each worker start is a fork, 10-20 ms with torch loaded.
    """
    return _RECENT_RUNS((answer, what, seed, num_workers, size, epochs),
                        lambda: _streams(make_dataset(), worker_init_fn, what, seed=seed,
                                         num_workers=num_workers, epochs=epochs))


def _seed_worker_streams(seed_worker, seed: int, num_workers: int, size: int, epochs: int):
    return _shared_streams(seed_worker, lambda: NoisyDataset(size, seed=seed), seed_worker, "seed_worker",
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
               "worker_id alone does not, the worker's torch.initial_seed() does (the loader draws a new "
               "base seed each epoch).")
_SEED_WORKER_HINT = ("Reseed the dataset's own generators in seed_worker, reaching the dataset through "
                     "torch.utils.data.get_worker_info().")


@graded_check("seed_worker: each worker draws its own augmentation stream")
def check_seed_worker_workers(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    require_callable(seed_worker, "seed_worker")
    (epoch,) = _seed_worker_streams(seed_worker, seed, num_workers, size, epochs=1)
    _shape_ok([epoch], "NoisyDataset")
    _expect_workers_differ(epoch, "With worker_init_fn=seed_worker", _SEED_WORKER_HINT)


@graded_check("seed_worker: a new epoch brings new augmentations")
def check_seed_worker_epochs(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    require_callable(seed_worker, "seed_worker")
    first, second = _seed_worker_streams(seed_worker, seed, num_workers, size, epochs=2)
    _expect_epochs_differ(first, second, "With worker_init_fn=seed_worker", _EPOCH_HINT)


@graded_check("seed_worker: the same loader seed gives the same augmentations")
def check_seed_worker_reproducible(seed_worker, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    require_callable(seed_worker, "seed_worker")
    # Two loaders built alike: the one-epoch run and the first epoch of the two-epoch run.
    (run_a,) = _seed_worker_streams(seed_worker, seed, num_workers, size, epochs=1)
    run_b, _ = _seed_worker_streams(seed_worker, seed, num_workers, size, epochs=2)
    _expect_reproducible(run_a, run_b, seed, "With worker_init_fn=seed_worker",
                         "Derive the worker's seed from what the loader's generator decides (the worker's "
                         "torch.initial_seed()), not from the clock, the process id or fresh OS entropy.")


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _lazy_dataset(LazyNoisyDataset, size: int):
    require_callable(LazyNoisyDataset, "LazyNoisyDataset")
    try:
        dataset = LazyNoisyDataset(size)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"LazyNoisyDataset({size}) raised {_error_text(exc)}") from None
    try:
        length = len(dataset)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"len(LazyNoisyDataset({size})) raised {_error_text(exc)}") from None
    expect(length == size, f"len(LazyNoisyDataset({size})) is {length}, expected {size}.")
    return dataset


_LAZY_HINT = "Create the generators inside the worker, the first time an item is drawn there."


def _lazy_streams(LazyNoisyDataset, dataset, seed: int, num_workers: int, size: int, epochs: int):
    """The shared run of ``epochs`` over a new LazyNoisyDataset: ``dataset``, if it is not remembered yet."""
    return _shared_streams(LazyNoisyDataset, lambda: dataset, None, "LazyNoisyDataset", seed, num_workers,
                           size, epochs)


@graded_check("LazyNoisyDataset: each worker draws its own augmentation stream")
def check_LazyNoisyDataset_workers(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    dataset = _lazy_dataset(LazyNoisyDataset, size)
    (epoch,) = _lazy_streams(LazyNoisyDataset, dataset, seed, num_workers, size, epochs=1)
    _shape_ok([epoch], "LazyNoisyDataset")
    _expect_workers_differ(epoch, f"With LazyNoisyDataset and {num_workers} workers",
                           _LAZY_HINT + " Seed them from something that differs per worker.")


@graded_check("LazyNoisyDataset: a new epoch brings new augmentations")
def check_LazyNoisyDataset_epochs(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    dataset = _lazy_dataset(LazyNoisyDataset, size)
    first, second = _lazy_streams(LazyNoisyDataset, dataset, seed, num_workers, size, epochs=2)
    _shape_ok([first], "LazyNoisyDataset")
    _expect_epochs_differ(first, second, f"With LazyNoisyDataset and {num_workers} workers", _EPOCH_HINT)


@graded_check("LazyNoisyDataset: the same loader seed gives the same augmentations")
def check_LazyNoisyDataset_reproducible(LazyNoisyDataset, seed: int = 0, num_workers: int = 2, size: int = 16) -> None:
    # Two loaders built alike over two new datasets: the one-epoch run and the two-epoch run's first epoch.
    (run_a,) = _lazy_streams(LazyNoisyDataset, _lazy_dataset(LazyNoisyDataset, size), seed, num_workers, size,
                             epochs=1)
    run_b, _ = _lazy_streams(LazyNoisyDataset, _lazy_dataset(LazyNoisyDataset, size), seed, num_workers, size,
                             epochs=2)
    _shape_ok([run_a], "LazyNoisyDataset")
    _expect_reproducible(run_a, run_b, seed, f"With LazyNoisyDataset and {num_workers} workers",
                         "Seed the lazily created generators from the worker's torch.initial_seed() (or "
                         "get_worker_info().seed), not from the clock, the process id or fresh OS entropy.")


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
