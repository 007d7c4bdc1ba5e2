"""Checks judged outside the sandbox give the verdicts they give in the learner's kernel.

For every check module in ``judge.JUDGED_OUTSIDE``, every fixture implementation (right
and wrong) is defined inside a real sandbox, and each check runs here on the proxy with
the notebook's visible and hidden arguments. The pass/fail verdict and the failure
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

import test_00_start_here as t00
import test_01_state_dict_aliasing as t01
import test_02_adam_resume as t02
import test_03_complete_checkpoint as t03
import test_04_worker_generators as t04
import test_05_atomic_writes as t05
import test_06_data_ledger as t06
import test_07_distributed_sampler as t07
import test_08_commit_boundary as t08
from autograder import (adam_resume, atomic_writes, commit_boundary, complete_checkpoint, data_ledger,
                        distributed_sampler, start_here, state_dict_aliasing, worker_seeding)
from autograder.grading.judge import JUDGED_OUTSIDE, judged_outside
from autograder.grading.sandbox import Sandbox
from check_outcomes import failure_of
from fixtures import (adam_resume_impls, atomic_writes_impls, commit_boundary_impls, complete_checkpoint_impls,
                      data_ledger_impls, distributed_sampler_impls, start_here_impls, state_dict_aliasing_impls,
                      worker_seeding_impls)

# Their messages quote what differs from run to run: measured times; draws seeded from process ids; which
# crash trials' writers a SIGKILL caught before they finished (the killer races the writer).
TIMING_CHECKS = {"check_audit_scale", "check_seed_worker_reproducible", "check_LazyNoisyDataset_reproducible",
                 "check_atomic_save_crash"}
# Their messages quote folders and file names that tempfile made up: compared without them.
TEMP_NAME_CHECKS = {"check_atomic_save_temp_location", "check_atomic_save_cleanup"}


def _without_temp_names(message):
    """The message with its paths and tempfile's names ("tmp" and 8 random characters) blanked out."""
    return message and re.sub(r"/\S*|\S*tmp[a-z0-9_]{8}\S*", "<name>", message)


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
    # A resume reads what its own save wrote: each resume, with every save it comes with in a triple.
    triples = impls.CORRECT_FORMATS + list(impls.WRONG_FORMATS)
    for position, name in ((1, "check_resume_from_full_checkpoint"), (2, "check_resume_from_weights_only")):
        for impl in dict.fromkeys(triple[position] for triple in triples):
            saves = dict.fromkeys(triple[0] for triple in triples if triple[position] is impl)
            yield impl, [(name, dict(kwargs, save_checkpoint=save))
                         for save in saves for kwargs in t02.CHECKPOINT_ARGUMENTS]


def _cases_03():
    impls = complete_checkpoint_impls
    pairs = impls.CORRECT_PAIRS + list(impls.WRONG)
    for impl in dict.fromkeys(save for save, _ in pairs):
        yield impl, [("check_save_checkpoint", {k: v for k, v in kwargs.items() if k != "n"})
                     for kwargs in t03.ARGUMENTS]
    # A load reads what its own save wrote: each load, with every save it comes with in a pair.
    for impl in dict.fromkeys(load for _, load in pairs):
        yield impl, [(name, dict(kwargs, save_checkpoint=save)) for save, load in pairs if load is impl
                     for kwargs in t03.ARGUMENTS for name in impls.LOAD_CHECKS]


def _cases_04():
    impls = worker_seeding_impls
    for impl in impls.CORRECT_SEED_WORKERS + impls.CORRECT_LAZY_DATASETS + list(impls.WRONG):
        yield impl, [(name, kwargs) for name in t04._names_for(impl) for kwargs in t04.ARGUMENTS.values()]


def _cases_05():
    impls = atomic_writes_impls
    for impl in impls.CORRECT_ATOMIC_SAVES + impls.CORRECT_LOADERS + list(impls.WRONG):
        yield impl, [(name, t05._arguments_for(name, which)) for name in t05._names_for(impl)
                     for which in ("visible", "hidden")]


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
          "complete_checkpoint": (complete_checkpoint, complete_checkpoint_impls, _cases_03),
          "worker_seeding": (worker_seeding, worker_seeding_impls, _cases_04),
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


@functools.cache
def _proxy(sandbox, name):
    """One proxy per fixture and sandbox, as the judge keeps one across consecutive test cells (so notebook
    03's checks share a resume experiment per save, load and argument set, as they do in a kernel)."""
    return sandbox.request("lookup", name)


def _proxies_for(kwargs, sandbox):
    """The arguments for the proxy run: another fixture implementation a check takes (the save_checkpoint of
    a resume check) is the sandbox's too."""
    return {key: _proxy(sandbox, value.__name__) if getattr(value, "__module__", "").startswith("fixtures.")
            else value for key, value in kwargs.items()}


@pytest.mark.parametrize("suite, impl, calls", CASES, ids=[f"{s}-{i.__name__}" for s, i, _ in CASES])
def test_the_proxy_gets_the_verdict_the_kernel_gets(suite, impl, calls, sandboxes):
    checks, _, _ = SUITES[suite]
    sandbox = _sandbox_for(suite, sandboxes)
    proxy = _proxy(sandbox, impl.__name__)
    for name, kwargs in calls:
        check = getattr(checks, name)
        here = failure_of(check, impl, **kwargs)
        with sandbox.judge_files_here():
            there = failure_of(check, proxy, **_proxies_for(kwargs, sandbox))
        if name in TIMING_CHECKS:
            assert (here is None) == (there is None), (name, kwargs, here, there)
        elif name in TEMP_NAME_CHECKS:
            assert _without_temp_names(here) == _without_temp_names(there), (name, kwargs)
        else:
            assert here == there, (name, kwargs)


def test_a_live_state_dict_is_caught_through_the_proxy(sandboxes):
    """A live view copied out of the sandbox would look like a snapshot: the probe saves it there, after training."""
    proxy = _sandbox_for("data_ledger", sandboxes).request("lookup", "LedgerLiveStateDict")
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
