"""Checks judged outside the sandbox give the verdicts they give in the learner's kernel.

For every notebook of the registry, every fixture answer (right and wrong) is defined inside a real
sandbox, and each check call of the notebook's test cells (visible and hidden, read from the solution
notebook) runs here on the proxy. The pass/fail verdict and the failure
message must equal those of the same check run in this process on the real function:
the proxy (data in, data out, changes to arguments copied back) changes nothing a check
can see. A check whose trap shows only where the objects live (a live view copied out of
the sandbox becomes a snapshot; an ``atomic_save`` is watched and killed in its own process)
sends a probe there instead, as the live state_dict test below shows.
"""

import functools
import inspect
import re

import pytest
import torch

from autograder import data_ledger
from autograder.course import NOTEBOOKS
from autograder.grading.judge import JUDGED_OUTSIDE, judged_outside
from autograder.grading.sandbox import Sandbox
from check_outcomes import failure_of
from fixtures import data_ledger_impls
from notebook_checks import (calls_for, check_calls, checks_module, fixtures_of, label, learner_names, right_answers,
                             run_call, wrong_answers)

# Their messages quote what differs from run to run: measured times; draws seeded from process ids.
TIMING_CHECKS = {"check_audit_scale", "check_seed_worker_reproducible", "check_LazyNoisyDataset_reproducible"}
# Their messages quote folders and file names that tempfile made up: compared without them. (A crash trial's
# kill lands at its byte on every run, so check_atomic_save_crash says the same but for those names.)
TEMP_NAME_CHECKS = {"check_atomic_save_temp_location", "check_atomic_save_cleanup", "check_atomic_save_crash"}


def _without_temp_names(message):
    """The message with its paths and tempfile's names ("tmp" and 8 random characters) blanked out."""
    return message and re.sub(r"/\S*|\S*tmp[a-z0-9_]{8}\S*", "<name>", message)


# Every answer of every notebook, right and wrong, with every check call of its exercises.
CASES = [(notebook.number, answer, expected) for notebook in NOTEBOOKS
         for answer, expected in [(a, frozenset()) for a in right_answers(notebook.number)]
         + wrong_answers(notebook.number)]


def test_every_check_module_is_judged_outside_and_every_call_goes_through_here():
    assert {m for n in NOTEBOOKS for m in n.check_modules} == JUDGED_OUTSIDE
    for notebook in NOTEBOOKS:
        exercised = {call for key, answer, expected in CASES if key == notebook.number
                     for call in calls_for(key, answer, expected)}
        assert set(check_calls(notebook.number)) <= exercised, notebook.folder


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As in graded mode: the judge computes its references on one thread, like the sandbox."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sandboxes():
    """One sandbox per suite, holding every fixture implementation of that notebook."""
    opened = {}
    yield opened
    for sandbox in opened.values():
        sandbox.close()


def _sandbox_for(key, sandboxes):
    if key not in sandboxes:
        impls = fixtures_of(key)
        sandboxes[key] = Sandbox(cell_seconds=120).start()
        sandboxes[key].request("exec", inspect.getsource(impls), f"<{impls.__name__}>")
    return sandboxes[key]


@functools.cache
def _proxy(sandbox, name):
    """One proxy per fixture and sandbox, as the judge keeps one across consecutive test cells (so notebook
    03's checks share a resume experiment per save, load and argument set, as they do in a kernel)."""
    return sandbox.request("lookup", name)


# The right answers run in the README's test command; the wrong ones, the full sweep, in CI's extended suites.
@pytest.mark.parametrize("key, answer, expected", [
    pytest.param(k, a, e, id=f"{k}-{label(a)}", marks=[pytest.mark.extended] if e else []) for k, a, e in CASES])
def test_the_proxy_gets_the_verdict_the_kernel_gets(key, answer, expected, sandboxes):
    sandbox = _sandbox_for(key, sandboxes)
    names = learner_names(key, answer, expected)
    proxies = {name: _proxy(sandbox, impl.__name__) for name, impl in names.items()}
    module = checks_module(key)
    for call in calls_for(key, answer, expected):
        check = getattr(module, call.check)
        here = run_call(call, check, names)
        with sandbox.judge_files_here():
            there = run_call(call, check, proxies)
        if call.check in TIMING_CHECKS:
            assert (here is None) == (there is None), (str(call), here, there)
        elif call.check in TEMP_NAME_CHECKS:
            assert _without_temp_names(here) == _without_temp_names(there), str(call)
        else:
            assert here == there, str(call)


def test_a_live_state_dict_is_caught_through_the_proxy(sandboxes):
    """A live view copied out of the sandbox would look like a snapshot: the probe saves it there, after training."""
    proxy = _sandbox_for("06", sandboxes).request("lookup", "LedgerLiveStateDict")
    here = failure_of(data_ledger.check_ledger_state_dict, data_ledger_impls.LedgerLiveStateDict)
    assert "it is a live view of the ledger, not a snapshot" in here
    assert failure_of(data_ledger.check_ledger_state_dict, proxy) == here


@pytest.mark.parametrize("source, outside", [
    ("from autograder.distributed_sampler import check_epoch_order_padding\ncheck_epoch_order_padding(f)", True),
    ("from autograder.data_ledger import check_audit\nimport autograder.start_here\ncheck_audit(audit)", True),
    ("from autograder.state_dict_aliasing import check_snapshot_state\ncheck_snapshot_state(f)", True),
    ("from autograder.data_ledger import check_audit\nfrom autograder.helpers import tiny_mlp\n", False),
    ("from autograder.worker_seeding import check_LazyNoisyDataset_peek\ncheck_LazyNoisyDataset_peek(LazyNoisyDataset)", True),
    ("from autograder.atomic_writes import check_load_latest_checkpoint_newest\ncheck_load_latest_checkpoint_newest(f)", True),
    ("from autograder.atomic_writes import check_atomic_save_crash\ncheck_atomic_save_crash(atomic_save)", True),
    ("from autograder.data_ledger import check_ledger_state_dict\ncheck_ledger_state_dict(Ledger)", True),
    ("assert add(1, 2) == 3", False),           # no check module: the cell runs in the sandbox
    ("this is not python", False),
])
def test_which_test_cells_are_judged_outside(source, outside):
    assert judged_outside(source) is outside
