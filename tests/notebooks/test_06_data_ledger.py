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
    assert impls.audit(expected, trained) == checks.reference_audit(expected, trained)


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
