"""Notebook 06, the data ledger: every check passes the right answers and catches its trap.

The arguments below are the ones the notebook's test cells use (visible, then hidden),
so a wrong implementation is shown to fail for both.
"""

import functools
import os
import random
import subprocess
import sys

import pytest

from autograder import data_ledger as checks
from check_outcomes import failure_of
from fixtures import data_ledger_impls as impls

def test_worked_example_numbers():
    """The figures the notebook prints: 64 samples per update, 80,000 committed, 80,048 fetched."""
    ledger = impls.Ledger(*checks.WORKED_EXAMPLE)
    checks._train(ledger, checks.WORKED_EXAMPLE, checks.WORKED_UPDATES, partial=checks.CRASH_MICROBATCHES)
    assert impls.samples_per_update(*checks.WORKED_EXAMPLE) == 64
    assert (ledger.fetched, ledger.committed, ledger.resume_position) == (80_048, 80_000, 80_000)


@pytest.mark.parametrize("seed", range(30))
def test_reference_audit_agrees_with_the_solution_on_random_runs(seed):
    expected, trained = checks._random_scenario(random.Random(seed), per_update=16)
    assert impls.audit(expected, trained) == checks.reference_audit(expected=expected, trained=trained)


def test_resume_at_fetched_count_is_named_with_the_48_skipped_positions():
    assert "skips 48 positions" in failure_of(checks.check_ledger_resume, impls.LedgerResumesAtFetched)


@pytest.mark.parametrize("implementation, named", [
    (impls.LedgerLiveStateDict, "it is a live view of the ledger, not a snapshot"),
    (impls.LedgerNumpyCursors, "does not survive torch.save/torch.load(weights_only=True) (UnpicklingError"),
    (impls.LedgerStateDictAsJson, "state_dict() should return a dict, not str."),
    (impls.LedgerStateDictTypo, "ledger.state_dict() raised AttributeError"),
], ids=lambda value: getattr(value, "__name__", None))
def test_each_state_dict_trap_is_named(implementation, named):
    assert named in failure_of(checks.check_ledger_state_dict, implementation)


def test_per_sample_audit_is_named_by_its_memory_per_position():
    assert "bytes per position" in failure_of(checks.check_audit_scale, impls.audit_per_sample_sets)


def test_a_per_position_array_is_named_by_its_memory():
    """Fast enough to pass the timing, so only the memory, measured where the audit runs, catches it."""
    assert "bytes per position" in failure_of(checks.check_audit_scale, impls.audit_per_position_counts)


def test_the_memory_probe_leaves_tracemalloc_as_it_found_it():
    import tracemalloc
    assert not tracemalloc.is_tracing()
    seen = checks.probe_audit_memory(impls.audit, 20_000, 64)
    assert seen["traced"] and 0 <= seen["peak"] < 20_000 and not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        assert checks.probe_audit_memory(impls.audit_per_sample_sets, 20_000, 64)["peak"] > 20 * 20_000
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


def test_replacing_tracemalloc_does_not_hide_an_audits_memory(monkeypatch):
    import tracemalloc
    monkeypatch.setattr(tracemalloc, "get_traced_memory", lambda: (0, 0))
    assert "bytes per position" in failure_of(checks.check_audit_scale, impls.audit_per_sample_sets)

    def audit_stopping_tracemalloc(expected, trained):
        tracemalloc.stop()
        return impls.audit_per_sample_sets(expected, trained)
    assert "stopped tracemalloc" in failure_of(checks.check_audit_scale, audit_stopping_tracemalloc)


def test_inclusive_stops_are_named_as_a_half_open_mistake():
    assert "half-open" in failure_of(checks.check_audit, impls.audit_inclusive_stops)


def test_order_insensitive_digest_is_named():
    assert "wrong order" in failure_of(checks.check_window_digest_order, impls.window_digest_sorted)


def test_padding_repeats_source_ids_but_not_positions():
    """What the notebook shows: DistributedSampler pads by repeating indices; the positions the ranks log as
    they train cover the run once."""
    from torch.utils.data import DistributedSampler
    log = []
    for epoch in range(2):
        for rank in range(4):
            sampler = DistributedSampler(range(10), num_replicas=4, rank=rank, shuffle=False)
            sampler.set_epoch(epoch)
            log += [((epoch * len(sampler) + step) * 4 + rank, index) for step, index in enumerate(sampler)]
    indices = [index for _, index in log]
    assert len(log) == 24 and indices.count(0) == 4 and indices.count(9) == 2   # padding: 0 and 1 twice an epoch
    trained = [range(position, position + 1) for position, _ in log]
    assert impls.audit([range(0, 24)], trained) == {"replayed": [], "omitted": []}
    assert impls.audit([range(0, 24)], trained + trained[:1]) == {"replayed": [range(0, 1)], "omitted": []}


def test_python_salts_str_hashes_per_process_but_not_int_tuples():
    """What the notebook shows before Exercise 4, and why the digest check starts new interpreters."""
    script = "print(hash('80000,80001'), hash((80000, 80001)))"
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.split() for seed in (1, 2)]
    assert runs[0][0] != runs[1][0] and runs[0][1] == runs[1][1]


def _as_notebook_cells(source):
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<notebook cell>", "exec"), namespace)
    return namespace


def test_a_window_digest_defined_in_notebook_cells_is_rebuilt_in_the_new_interpreters():
    """The learner's function lives in __main__ and may call helpers of other cells: it travels by value."""
    cells = _as_notebook_cells("import hashlib\n"
                               "def as_text(ids):\n    return ';'.join(str(i) for i in ids)\n"
                               "def window_digest(ids):\n    return hashlib.sha1(as_text(ids).encode()).hexdigest()\n"
                               "def salted(ids):\n    return str(hash(as_text(ids)))\n")
    assert failure_of(checks.check_window_digest_order, cells["window_digest"]) is None
    assert "PYTHONHASHSEED=1" in failure_of(checks.check_window_digest_order, cells["salted"])
    seen = checks.probe_digests_in_new_interpreters(functools.partial(impls.window_digest), [[1, 2, 3]])
    assert seen == {"digests": {1: [impls.window_digest([1, 2, 3])], 2: [impls.window_digest([1, 2, 3])]}}


def test_a_window_digest_that_cannot_run_in_a_new_interpreter_is_named():
    cells = _as_notebook_cells("import threading\nLOCK = threading.Lock()\n"
                               "def window_digest(ids):\n    with LOCK:\n        return ','.join(map(str, ids))\n")
    assert "could not be computed in a new Python process" in failure_of(checks.check_window_digest_order,
                                                                          cells["window_digest"])


def _one_epoch(slow_worker, in_order):
    """Notebook 06's timing demo: 16 samples, batches of 2 from 2 workers, the sampler seeded with 0, SGD."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from autograder.helpers import regression_data

    features, targets = regression_data(n=16, seed=1)
    loader = DataLoader(checks.SlowWorkerSamples(16, slow_worker), batch_size=2, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0), in_order=in_order)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    order = []
    for batch in loader:
        model.zero_grad()
        nn.functional.mse_loss(model(features[batch]), targets[batch]).backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.1 * param.grad
        order += batch.tolist()
    return order, torch.cat([param.detach().flatten() for param in model.parameters()])


def test_worker_timing_reorders_the_same_samples_only_with_in_order_false():
    """What the notebook shows (#30 item 4): with in_order=False the worker that is slow decides the order, so
    two runs with one seed train the same samples once each, in another order, to other weights; with the
    default in_order=True the order and the weights are the same whichever worker is slow."""
    import inspect

    import torch
    from torch.utils.data import DataLoader

    assert inspect.signature(DataLoader).parameters["in_order"].default is True
    (order_a, weights_a), (order_b, weights_b) = _one_epoch(0, False), _one_epoch(1, False)
    assert sorted(order_a) == sorted(order_b) == list(range(16)) and order_a != order_b
    assert not torch.equal(weights_a, weights_b)
    for order in (order_a, order_b):
        assert checks.reference_audit(expected=[range(0, 16)], trained=[range(i, i + 1) for i in order]) == \
            {"replayed": [], "omitted": []}
    (in_order_a, in_weights_a), (in_order_b, in_weights_b) = _one_epoch(0, True), _one_epoch(1, True)
    assert in_order_a == in_order_b and torch.equal(in_weights_a, in_weights_b)
    # The slow worker's first batch comes last: the first window differs, which a window digest sees.
    assert order_a[:2] != in_order_a[:2] and order_b[:2] == in_order_b[:2]


def test_the_slow_worker_dataset_is_plain_in_the_main_process():
    dataset = checks.SlowWorkerSamples(5, slow_worker=0)
    assert len(dataset) == 5 and [dataset[i] for i in range(5)] == list(range(5))
    assert int(dataset.loaded_elsewhere) == 0


def test_a_checksum_weighted_by_place_misses_two_swapped_microbatches_with_equal_sums():
    assert impls.window_digest_weighted_sum([1, 9, 2, 8]) == impls.window_digest_weighted_sum([2, 8, 1, 9])
    assert impls.window_digest([1, 9, 2, 8]) != impls.window_digest([2, 8, 1, 9])
