"""Checks judged outside the sandbox give the verdicts they give in the learner's kernel.

For every check module in ``judge.JUDGED_OUTSIDE``, every fixture implementation (right
and wrong) is defined inside a real sandbox, and each check runs here on the proxy with
the notebook's visible and hidden arguments. The pass/fail verdict and the failure
message must equal those of the same check run in this process on the real function:
the proxy (data in, data out, changes to arguments copied back) changes nothing a check
can see. Checks that would see a difference (``judge.JUDGED_INSIDE``: a live view copied
out of the sandbox becomes a snapshot; an ``atomic_save`` must be watched and killed in its
own process) are judged inside; the test below that drops one exception shows why.
"""

import inspect

import pytest
import torch

import test_00_start_here as t00
import test_01_state_dict_aliasing as t01
import test_02_adam_resume as t02
import test_05_atomic_writes as t05
import test_06_data_ledger as t06
import test_07_distributed_sampler as t07
import test_08_commit_boundary as t08
from autograder import (adam_resume, atomic_writes, commit_boundary, data_ledger, distributed_sampler, start_here,
                        state_dict_aliasing)
from autograder.judge import JUDGED_INSIDE, JUDGED_OUTSIDE, judged_outside
from autograder.sandbox import Sandbox
from check_outcomes import failure_of
from fixtures import (adam_resume_impls, atomic_writes_impls, commit_boundary_impls, data_ledger_impls,
                      distributed_sampler_impls, start_here_impls, state_dict_aliasing_impls)

TIMING_CHECKS = {"check_audit_scale"}  # its message quotes measured times


def _cases_00():
    for impl in start_here_impls.CORRECT + list(start_here_impls.WRONG):
        yield impl, [(name, kwargs) for name in start_here_impls.CHECKS for kwargs in t00.ARGUMENTS[name]]


def _cases_01():
    impls = state_dict_aliasing_impls
    for impl in impls.CORRECT_SNAPSHOTS + impls.CORRECT_RESTORES + list(impls.WRONG):
        names = impls.SNAPSHOT_CHECKS if impl.__name__.startswith("snapshot") else impls.RESTORE_CHECKS
        yield impl, [(name, kwargs) for name in names for kwargs in t01.ARGUMENTS]


def _cases_02():
    impls = adam_resume_impls
    for impl in impls.CORRECT_ADAM_STEPS + list(impls.WRONG_ADAM_STEPS):
        yield impl, [(name, kwargs) for name in impls.ADAM_STEP_CHECKS for kwargs in t02.ADAM_STEP_ARGUMENTS]
    for impl in impls.CORRECT_TRAINS + list(impls.WRONG_TRAINS):
        yield impl, [(name, kwargs) for name in impls.TRAIN_CHECKS for kwargs in t02.TRAIN_ARGUMENTS]
    saves = {triple[0] for triple in impls.CORRECT_FORMATS + list(impls.WRONG_FORMATS)}
    for impl in sorted(saves, key=lambda f: f.__name__):
        yield impl, [("check_save_checkpoint", {k: v for k, v in kwargs.items() if k != "n"})
                     for kwargs in t02.CHECKPOINT_ARGUMENTS]


def _cases_05():
    # Only the loader: atomic_save's checks are all judged inside (see judge.JUDGED_INSIDE).
    impls = atomic_writes_impls
    for impl in impls.CORRECT_LOADERS + [w for w in impls.WRONG if w.__name__.startswith("load")]:
        yield impl, [(name, t05.LOAD_ARGUMENTS["hidden_newest" if name.endswith("newest") and which == "hidden"
                                               else which])
                     for name in impls.LOAD_LATEST_CHECKS for which in ("visible", "hidden")]


def _cases_06():
    impls = [i for group in data_ledger_impls.CORRECT.values() for i in group] + list(data_ledger_impls.WRONG)
    for impl in impls:
        exercise = t06.exercise_of(impl)
        yield impl, [(name, kwargs) for name, (for_exercise, argument_sets) in t06.CHECKS.items()
                     if for_exercise == exercise for kwargs in argument_sets]


def _cases_07():
    impls = (distributed_sampler_impls.CORRECT_ORDERS + distributed_sampler_impls.CORRECT_SHARDS
             + list(distributed_sampler_impls.WRONG))
    for impl in impls:
        yield impl, [(name, kwargs) for name in t07._checks_for(impl) for kwargs in t07.ARGUMENTS]


def _cases_08():
    for impl in commit_boundary_impls.CORRECT + list(commit_boundary_impls.WRONG):
        yield impl, [(name, kwargs) for name, argument_sets in t08.ARGUMENTS.items() for kwargs in argument_sets]


SUITES = {"start_here": (start_here, start_here_impls, _cases_00),
          "state_dict_aliasing": (state_dict_aliasing, state_dict_aliasing_impls, _cases_01),
          "adam_resume": (adam_resume, adam_resume_impls, _cases_02),
          "atomic_writes": (atomic_writes, atomic_writes_impls, _cases_05),
          "commit_boundary": (commit_boundary, commit_boundary_impls, _cases_08),
          "data_ledger": (data_ledger, data_ledger_impls, _cases_06),
          "distributed_sampler": (distributed_sampler, distributed_sampler_impls, _cases_07)}
CASES = [(suite, impl, calls) for suite, (_, _, cases) in SUITES.items() for impl, calls in cases()]


def test_every_module_judged_outside_is_covered_here():
    assert {f"autograder.{suite}" for suite in SUITES} == JUDGED_OUTSIDE


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


def _sandbox_for(suite, sandboxes):
    if suite not in sandboxes:
        _, impls, _ = SUITES[suite]
        sandboxes[suite] = Sandbox(cell_seconds=120).start()
        sandboxes[suite].request("exec", inspect.getsource(impls), f"<{impls.__name__}>")
    return sandboxes[suite]


@pytest.mark.parametrize("suite, impl, calls", CASES, ids=[f"{s}-{i.__name__}" for s, i, _ in CASES])
def test_the_proxy_gets_the_verdict_the_kernel_gets(suite, impl, calls, sandboxes):
    checks, _, _ = SUITES[suite]
    sandbox = _sandbox_for(suite, sandboxes)
    proxy = sandbox.request("lookup", impl.__name__)
    for name, kwargs in calls:
        if name in JUDGED_INSIDE:
            continue
        check = getattr(checks, name)
        here = failure_of(check, impl, **kwargs)
        with sandbox.judge_files_here():
            there = failure_of(check, proxy, **kwargs)
        if name in TIMING_CHECKS:
            assert (here is None) == (there is None), (name, kwargs, here, there)
        else:
            assert here == there, (name, kwargs)


def test_a_live_state_dict_is_invisible_from_outside(sandboxes):
    """Why check_ledger_state_dict stays inside: its trap is caught here, not through the proxy."""
    proxy = _sandbox_for("data_ledger", sandboxes).request("lookup", "LedgerLiveStateDict")
    assert "live view" in failure_of(data_ledger.check_ledger_state_dict, data_ledger_impls.LedgerLiveStateDict)
    assert failure_of(data_ledger.check_ledger_state_dict, proxy) is None


@pytest.mark.parametrize("source, outside", [
    ("from autograder.distributed_sampler import check_epoch_order_padding\ncheck_epoch_order_padding(f)", True),
    ("from autograder.data_ledger import check_audit\nimport autograder.start_here\ncheck_audit(audit)", True),
    ("from autograder.state_dict_aliasing import check_snapshot_state\ncheck_snapshot_state(f)", True),
    ("from autograder.data_ledger import check_audit\nfrom autograder.worker_seeding import x\n", False),
    ("from autograder.atomic_writes import check_load_latest_checkpoint_newest\ncheck_load_latest_checkpoint_newest(f)", True),
    ("from autograder.atomic_writes import check_atomic_save_crash\ncheck_atomic_save_crash(atomic_save)", False),
    ("from autograder.data_ledger import check_ledger_state_dict\ncheck_ledger_state_dict(Ledger)", False),
    ("assert add(1, 2) == 3", False),           # no check module: the cell runs in the sandbox
    ("this is not python", False),
])
def test_which_test_cells_are_judged_outside(source, outside):
    assert judged_outside(source) is outside
