"""Notebook 04: generators copied into DataLoader workers. The checks, driven on right and wrong implementations.

Workers are real processes. Most tests fork them (Linux's default); the spawn tests
force the start method that macOS and Windows use, with implementations defined
the way a notebook cell defines them (in module ``__main__``).
"""

import multiprocessing
import pickle
import subprocess
import sys

import numpy as np
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


def test_a_generator_seeded_with_the_global_seed_repeats_the_global_stream():
    """What the notebook shows before Exercise 1: inside a worker the global torch RNG is seeded with
    torch.initial_seed(), so a torch.Generator seeded with that same number draws the same numbers; child
    seeds from a SeedSequence do not."""
    seed = 1234
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    assert torch.equal(torch.rand(5, generator=generator), torch.rand(5))
    child = int(np.random.SeedSequence(seed).spawn(2)[0].generate_state(1, np.uint64)[0])
    torch.manual_seed(seed)
    assert not torch.equal(torch.rand(5, generator=torch.Generator().manual_seed(child)), torch.rand(5))
    (epoch,) = checks.worker_streams(NoisyWithGlobalTransform(8), impls.seed_worker_generator_seeded_like_global)
    assert all(torch.equal(rows[:, 0], rows[:, 2]) for rows in epoch.values())   # noise == transform
    (epoch,) = checks.worker_streams(NoisyWithGlobalTransform(8), impls.seed_worker_child_seeds)
    assert not any(torch.equal(rows[:, 0], rows[:, 2]) for rows in epoch.values())


def test_torch_and_numpys_legacy_global_rng_seeded_alike_give_the_same_words():
    """What section 3.1 shows and check_seed_worker_independent reads: torch's MT19937 and NumPy's legacy one
    take a seed's low 32 bits the same way, so they give the same raw words (torch's int32 random_() and
    NumPy's randint(2**31) show one word a draw, top bit dropped); a draw among 4 keeps its low bits in
    both. In real workers the documented recipe makes a torch and a NumPy transform one choice."""
    seed = 2**40 + 1234
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    assert torch.empty(64, dtype=torch.int32).random_().tolist() == np.random.randint(2**31, size=64).tolist()
    generator = torch.Generator().manual_seed(seed)
    legacy = np.random.RandomState(seed % 2**32)
    assert [torch.randint(4, (), generator=generator).item() for _ in range(16)] == legacy.randint(4, size=16).tolist()
    (recipe,) = checks.worker_streams(checks.TorchAndNumpyAugmentations(16), checks.documented_seed_worker)
    assert all(torch.equal(rows[:, 0], rows[:, 1]) for rows in recipe.values())
    (own,) = checks.worker_streams(checks.TorchAndNumpyAugmentations(16), None)
    assert not any(torch.equal(rows[:, 0], rows[:, 1]) for rows in own.values())
    words = checks.loaders._words_of
    assert words(torch.Generator().manual_seed(7))[1] == words(np.random.RandomState(7))[1]
    assert words(torch.Generator().manual_seed(7))[1] != words(np.random.default_rng(7))[1]


def test_a_resume_mid_epoch_with_workers_keeps_the_samples_not_the_augmentations():
    """Section 5: a StatefulDataLoader resumed mid-epoch with 2 workers gives the same sample ids, other
    draws from the worker's RNG (the epoch's base_seed is put back, so each worker starts over), and the
    same per-sample draws, seeded from (seed, epoch, index), which also hold without workers."""
    from autograder.complete_checkpoint import stateful_loader

    def loader():
        return stateful_loader(checks.AugmentedSamples(12, seed=0), batch_size=2, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(0), multiprocessing_context="fork")

    uninterrupted = torch.cat(list(loader()))
    stopped = loader()
    batches = iter(stopped)
    trained = torch.cat([next(batches) for _ in range(3)])
    state = stopped.state_dict()
    del batches
    resumed_loader = loader()
    resumed_loader.load_state_dict(state)
    resumed, after_stop = torch.cat(list(resumed_loader)), uninterrupted[len(trained):]
    assert torch.equal(resumed[:, 0], after_stop[:, 0])
    assert not (resumed[:, 1] == after_stop[:, 1]).any() and torch.isin(resumed[:, 1], trained[:, 1]).any()
    assert torch.equal(resumed[:, 2], after_stop[:, 2])
    alone = checks.AugmentedSamples(12, seed=0)
    assert torch.equal(torch.stack([alone[i] for i in resumed[:, 0].long().tolist()])[:, 2], after_stop[:, 2])
    alone.set_epoch(1)
    assert not torch.equal(alone[0][2:], checks.AugmentedSamples(12, seed=0)[0][2:])


class NoisyWithGlobalTransform(checks.NoisyDataset):
    """NoisyDataset's two draws, then a transform's draw from the worker's global torch RNG."""

    def __getitem__(self, index):
        transform = torch.rand((), dtype=torch.float64).reshape(1)
        return torch.cat([super().__getitem__(index), transform])


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_under_forkserver_workers_still_copy_the_generator_and_the_fix_still_works():
    """Python 3.14's default on Linux: the dataset reaches each worker pickled, generators included."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(["autograder.worker_seeding"])
    bug = checks.worker_streams(checks.NoisyDataset(8), seed=0, epochs=2, start_method="forkserver")
    assert torch.equal(bug[0][0], bug[0][1]) and torch.equal(bug[0][0], bug[1][0])
    cells = _as_notebook_cells()          # the fix as a notebook cell defines it: it travels by value
    fixed = checks.worker_streams(checks.NoisyDataset(8), cells["seed_worker_child_seeds"], seed=0, epochs=2,
                                  start_method="forkserver")
    assert not torch.equal(fixed[0][0], fixed[0][1]) and not torch.equal(fixed[0][0], fixed[1][0])
    assert torch.equal(fixed[0][0], checks.worker_streams(checks.NoisyDataset(8), impls.seed_worker_child_seeds,
                                                          seed=0, epochs=2, start_method="fork")[0][0])


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
    assert failure_of(checks.check_seed_worker_workers, cells["seed_worker_child_seeds"]) is None
    assert failure_of(checks.check_seed_worker_independent, cells["seed_worker_child_seeds"]) is None
    assert "are one stream" in failure_of(checks.check_seed_worker_independent,
                                          cells["seed_worker_documented_recipe_on_top"])


def test_spawn_sends_a_notebook_defined_dataset_as_a_pickled_copy(monkeypatch):
    """Under spawn, a generator made in the main process reaches every worker as a copy, as under fork."""
    monkeypatch.setenv("WORKBOOK_WORKER_START", "spawn")
    cells = _as_notebook_cells()
    message = failure_of(checks.check_LazyNoisyDataset_peek, cells["LazyOnceInWhicheverProcess"])
    assert message and "drew exactly the same" in message
    message = failure_of(checks.check_LazyNoisyDataset_workers, cells["LazySeededLikeGlobal"])
    assert message and "the dataset's generator (torch.Generator) and the global torch RNG" in message


def test_the_worker_seeds_read_through_public_api():
    """What section 2.2 shows without torch's private worker loop: get_worker_info().seed is base_seed +
    worker_id, Python's and torch's global RNGs start from it, NumPy's from a number of its own, and an epoch
    draws base_seed from the loader's generator (the same generator seed: the same seeds)."""
    def first_items(seed):
        generator = torch.Generator().manual_seed(seed)
        before = generator.get_state()
        loader = torch.utils.data.DataLoader(checks.GlobalRngDataset(4), batch_size=2, num_workers=2,
                                             collate_fn=checks.tag_with_worker_id, generator=generator,
                                             multiprocessing_context="fork")
        rows = {worker: {key: values[0].item() for key, values in batch.items()} for worker, batch in loader}
        assert not torch.equal(before, generator.get_state())
        return rows

    rows = first_items(0)
    assert rows[1]["get_worker_info().seed"] - rows[0]["get_worker_info().seed"] == 1
    assert all(row["torch.initial_seed()"] == row["get_worker_info().seed"] and row["random seeded with it"]
               and row["torch seeded with it"] and not row["NumPy seeded with it"] for row in rows.values())
    seeds = [row["get_worker_info().seed"] for row in rows.values()]
    assert [row["get_worker_info().seed"] for row in first_items(0).values()] == seeds
    assert [row["get_worker_info().seed"] for row in first_items(1).values()] != seeds


def test_the_notebook_calls_and_prints_no_private_torch_function():
    """#25: notebook 04 printed torch's private _worker_loop, whose argument torch 2.14 renamed."""
    import re

    import nbformat

    from autograder.course import REPO_ROOT

    for folder in ("solutions", "notebooks"):
        nb = nbformat.read(REPO_ROOT / folder / "04_worker_generators" / "04_worker_generators.ipynb", 4)
        code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
        assert not re.search(r"torch[\w.]*\._(?!_)\w|_utils|_worker_loop", code), folder
