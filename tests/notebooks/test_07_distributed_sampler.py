"""Notebook 07: DistributedSampler and world-size changes. The checks, driven on right and wrong
implementations, the sampler facts the notebook teaches, and the real gloo demo."""

import os
import signal
import subprocess
import sys
import warnings

import pytest
from torch.utils.data.distributed import DistributedSampler

from autograder import distributed_sampler as checks
from autograder import gloo_demo, rank_server
from check_outcomes import failing_checks, failure_of
from fixtures import distributed_sampler_impls as impls
from notebook_checks import checks_of
from autograder.course import REPO_ROOT

# The visible test arguments and the hidden ones the notebook uses.
def test_the_check_modules_lists_are_the_notebooks_checks():
    assert checks.EPOCH_ORDER_CHECKS == checks_of("07", "epoch_order")
    assert checks.RESUME_SHARDS_CHECKS == checks_of("07", "resume_shards")


def sampler_order(n, seed, epoch, world_size, shuffle=True, drop_last=False):
    """The real DistributedSampler's global order for one epoch, padding included (the package keeps no
    function of epoch_order's contract: issue 27)."""
    return checks.interleave(checks.sampler_shards(n, seed, epoch, world_size, shuffle, drop_last))


def test_whole_epoch_restart_reports_every_committed_sample():
    message = failure_of(checks.check_resume_shards_no_replay, impls.shards_whole_epoch_restart)
    assert message.split(" schedules ")[1].startswith("32 samples whose updates were already committed")


def test_answers_hard_coded_for_the_visible_scenarios_fail_the_hidden_ones():
    visible = {tuple(sorted(s.items())): impls.shards_like_the_notebook(**s) for s in checks._resume_scenarios(0)}

    def memorised(**scenario):
        return visible.get(tuple(sorted(scenario.items())), [[] for _ in range(scenario["new_world_size"])])

    def memorised_positional(n, seed, epoch, old_world_size, committed, new_world_size, drop_last=False):
        return memorised(n=n, seed=seed, epoch=epoch, old_world_size=old_world_size, committed=committed,
                         new_world_size=new_world_size, **({"drop_last": True} if drop_last else {}))

    assert failing_checks(checks, checks.RESUME_SHARDS_CHECKS, memorised_positional) == set()
    assert "check_resume_shards_no_omission" in failing_checks(
        checks, checks.RESUME_SHARDS_CHECKS, memorised_positional, seed=7)


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_epoch_order_permutation, None)
    assert "should be a function" in failure_of(checks.check_resume_shards_no_replay, "not a function")


def test_sampler_facts_the_notebook_teaches():
    """DistributedSampler as torch 2.13 to 2.15 have it (the same code), as the notebook and the checks describe it."""
    # seed + epoch, and the same permutation for every world size that divides the dataset
    assert sampler_order(12, 0, 1, 1) == sampler_order(12, 1, 0, 1)
    assert sampler_order(12, 3, 2, 4) == sampler_order(12, 3, 2, 3) == sampler_order(12, 3, 2, 6)
    # a sampler that never hears set_epoch stays at epoch 0
    assert DistributedSampler(range(12), num_replicas=1, rank=0).epoch == 0
    # padding repeats the head, wrapping for small datasets; drop_last trims the tail
    head = sampler_order(3, 0, 0, 1)
    assert sampler_order(3, 0, 0, 8) == [head[i % 3] for i in range(8)]
    full = sampler_order(10, 0, 0, 1)
    assert sampler_order(10, 0, 0, 4, drop_last=True) == full[:8]
    # rank r takes positions r, r + R, ...
    shards = checks.sampler_shards(10, 0, 0, 4)
    assert all(shards[r] == sampler_order(10, 0, 0, 4)[r::4] for r in range(4))


def test_stateful_dataloader_state_is_per_rank_and_exact_only_for_the_same_world_size():
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loaders(world_size):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [StatefulDataLoader(list(range(24)), batch_size=2,
                                       sampler=DistributedSampler(range(24), num_replicas=world_size, rank=r))
                    for r in range(world_size)]

    first = loaders(4)
    iterators = [iter(loader) for loader in first]
    done = [i for _ in range(2) for it in iterators for i in next(it).tolist()]
    states = [loader.state_dict() for loader in first]
    assert states[0]["_sampler_iter_state"] == {"samples_yielded": 4}

    def finish(world_size):
        rest = []
        for rank, loader in enumerate(loaders(world_size)):
            loader.load_state_dict(states[rank])
            rest += [i for batch in loader for i in batch.tolist()]
        return sorted(done + rest)

    assert finish(4) == list(range(24))
    assert finish(3) != list(range(24))  # same saved states, fewer ranks: replay


def test_gloo_demo_survives_a_sigkill_and_resumes_on_fewer_ranks_without_replay_or_omission(tmp_path):
    n, seed, epoch, micro, accum = 24, 0, 1, 1, 2
    first = gloo_demo.launch(gloo_demo.Job(gloo_demo.plan_from_shards(checks.sampler_shards(n, seed, epoch, 4)),
                                           str(tmp_path), n, seed, epoch, kill=(1, 2, 1), micro_batch=micro,
                                           accum_steps=accum, dataset_version="v1", name="first"),
                             say=lambda line: None)
    assert first.exit_codes[1] == -signal.SIGKILL and first.killed == [1]
    cursor = first.checkpoint["sampler"]["committed"]
    assert cursor == 2 * 4 * micro * accum and first.checkpoint["updates"] == 2
    assert len(first.fetched) == cursor + 4 * micro * accum  # the in-flight update was fetched, never committed
    # The audit record: every field, and committed exactly where the checkpoint says.
    order = sampler_order(n, seed, epoch, 4)
    assert [r.position for r in first.fetched] == list(range(len(first.fetched)))
    assert [r.sample for r in first.fetched] == order[:len(first.fetched)]
    assert all(r.rank == r.position % 4 and r.update == r.position // 8 and r.slot == r.position % 8 // 4
               and r.dataset_version == "v1" and r.committed == (r.position < cursor) for r in first.fetched)
    assert first.checkpoint["dataset_version"] == "v1"

    shards = impls.shards_like_the_notebook(n, seed, epoch, 4, cursor, 3)
    second = gloo_demo.launch(gloo_demo.Job(gloo_demo.plan_from_shards(shards, cursor), str(tmp_path), n, seed,
                                            epoch, start_cursor=cursor, resume=True, micro_batch=micro,
                                            accum_steps=accum, dataset_version="v1", name="resumed"),
                              say=lambda line: None)
    assert set(second.exit_codes.values()) == {0}
    positions = list(range(cursor)) + [record.position for record in second.fetched]
    real = [p for p in positions if p < n]
    assert sorted(real) == list(range(n))                     # zero replay, zero omission
    assert len(positions) - n == -(n - cursor) % 3            # padding: exactly what 3 ranks need
    updates = -(-len(shards[0]) // (micro * accum))
    assert len(second.checkpoint["loss_history"]) == 2 + updates == second.checkpoint["updates"]
    assert {r.update for r in second.fetched} == set(range(2, 2 + updates))   # the run's update count goes on
    assert all(r.committed for r in second.fetched)
    # The restart's check: the new job's first window is the expected suffix the audit record kept.
    expected_suffix = [r.sample for r in first.fetched if r.position >= cursor]
    assert [r.sample for r in second.fetched][:len(expected_suffix)] == expected_suffix


def test_the_checkpoint_writer_follows_notebook_05s_recipe(tmp_path, monkeypatch):
    """gloo_demo's checkpoint of an update follows notebook 05's recipe: a unique temp file in the same folder,
    fsynced before the rename onto the checkpoint, the folder fsynced after it, the temp file removed when
    the save fails. It writes the job's own checkpoint only, so it is no atomic_save (issue 27)."""
    import torch

    job = gloo_demo.Job(plan=[[(0, 0)], [(1, 1)]], workdir=str(tmp_path), n=2, seed=0, epoch=0)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append(("replace", str(src), str(dst))),
                                                         real_replace(src, dst))[1])
    gloo_demo._commit_update(job, torch.nn.Linear(4, 1), [0.5], 1, 1)
    (_, synced), (_, temp, target), (_, folder) = events
    assert synced == temp and os.path.dirname(temp) == str(tmp_path) and temp.endswith(".tmp")
    assert target == str(job.checkpoint_path) and folder == str(tmp_path)
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
    assert torch.load(job.checkpoint_path, weights_only=True)["sampler"]["committed"] == 2

    def failing_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        gloo_demo._commit_update(job, torch.nn.Linear(4, 1), [0.5], 2, 1)
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


def test_what_the_launcher_prints_is_the_same_on_every_run(tmp_path):
    """No port, no address, no seconds: the notebook's output does not change between runs (#26)."""
    lines = []
    gloo_demo.launch(gloo_demo.Job(gloo_demo.plan_from_shards([[0, 1], [2, 3]]), str(tmp_path), 4, 0, 0,
                                   name="quiet"), say=lines.append)
    assert lines == ["launching 2 ranks (gloo on the loopback, forkserver start)",
                     "  rank 0: fetched 1 microbatch, finished", "  rank 1: fetched 1 microbatch, finished",
                     "  durable checkpoint: 1 update, global cursor 4"]
    assert gloo_demo._last_line("...\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error "
                                "[127.0.0.1]:17305: Connection reset by peer") == \
        "RuntimeError: Read error: Connection reset by peer"


def test_the_sampler_assumes_a_dataset_of_constant_size_and_order():
    """What notebook 07 prints and runs: the documented assumption, and what a grown or reordered dataset does
    to a resume at the same cursor, seed and epoch."""
    assert "assumed to be of constant size" in " ".join(DistributedSampler.__doc__.split())
    n, cursor = 48, 32
    committed = sampler_order(n, 0, 2, 4)[:cursor]
    for now in (list(range(n + 4)), sorted(range(n), key=str)):
        rest = [now[i] for i in sampler_order(len(now), 0, 2, 3)[cursor:len(now)]]
        assert set(rest) & set(committed)                                   # committed samples again
        assert set(now) - set(rest) - set(committed)                        # and others never
    assert sampler_order(n + 4, 0, 2, 1)[:n] != sampler_order(n, 0, 2, 1)   # another permutation


def test_the_rank_server_starts_before_torch_is_imported_and_preloads_the_rank_module():
    # Notebook 07 starts it first thing so that its import of torch overlaps the kernel's.
    assert rank_server.RANK_MODULE == gloo_demo.__name__
    code = ("import sys\nfrom autograder.rank_server import start_rank_server\n"
            "print(start_rank_server(), 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["forkserver", "False"]


def test_a_kernel_that_started_the_rank_server_shuts_down_by_itself():
    # ipykernel waits at shutdown until its children are gone; multiprocessing's resource tracker
    # ignores SIGTERM, so without rank_server's hook the kernel was SIGTERMed by its manager 2.5 s later.
    from jupyter_client.manager import start_new_kernel

    from autograder.contract import KERNEL_EXTRA_ARGUMENTS
    manager, client = start_new_kernel(kernel_name="python3", extra_arguments=KERNEL_EXTRA_ARGUMENTS,
                                       cwd=str(REPO_ROOT))
    try:
        reply = client.execute_interactive("from autograder.rank_server import start_rank_server\n"
                                           "start_rank_server()\nimport torch", timeout=60)
        assert reply["content"]["status"] == "ok"
        kernel = manager.provisioner.process
    finally:
        client.stop_channels()
        # A kernel that never ends by itself is SIGTERMed after this wait, however long it is (the bug this
        # test catches); one that ends may take a while: the CUDA build's interpreter exits seconds slower.
        manager.shutdown_wait_time = 30
        manager.shutdown_kernel(now=False)
    assert kernel.returncode == 0, f"the kernel was stopped by signal {-kernel.returncode}"


def test_an_exception_in_the_answer_names_the_inputs_that_caused_it():
    def crashes_when_nothing_remains(n, seed, epoch, old_world_size, committed, new_world_size, drop_last=False):
        if committed >= n:
            return [[] for _ in range(new_world_size)][len([]) // (n - committed)]
        return impls.shards_like_the_notebook(n, seed, epoch, old_world_size, committed, new_world_size, drop_last)

    message = failure_of(checks.check_resume_shards_no_replay, crashes_when_nothing_remains)
    assert "committed=45" in message and "raised ZeroDivisionError" in message


def test_the_permutation_message_no_longer_says_the_global_rng_gives_another_order():
    """Reseeded with seed + epoch, torch's global RNG gives the sampler's order: the message for another order
    names the global RNG only in whatever state the process left it; the reseed has a message of its own."""
    message = failure_of(checks.check_epoch_order_permutation, impls.order_python_random)
    assert "or the global one, gives another order" not in message
    assert "torch's global RNG in whatever state the process left it" in message
    reseeded = failure_of(checks.check_epoch_order_permutation, impls.order_torch_manual_seed)
    assert "gives DistributedSampler's order" in reseeded and "torch.manual_seed(13)" in reseeded


def test_the_rng_probe_puts_the_learners_global_rngs_back():
    """It sets every global RNG to a state of its own for the call (a reseed shows even when the process
    was seeded alike), then puts back what the learner's process had."""
    import random

    import numpy as np
    import torch

    def draws():
        return random.random(), float(np.random.rand()), torch.rand(1).item()

    def seed_all():
        random.seed(3)
        np.random.seed(3)
        torch.manual_seed(3)

    seed_all()
    expected = draws()
    seed_all()
    seen = checks.probe_global_rngs(impls.order_seeds_every_global_rng, 12, 0, 1, 3)
    assert checks.changed_global_rngs(seen) == ["random", "numpy", "torch"]
    assert draws() == expected


def test_a_rank_left_alone_at_a_collective_fails_at_once_and_even_jobs_end_together(tmp_path):
    """Ranks of an even plan wait for each other before tearing gloo down (a fast leaver used to break a
    slow rank's final barrier); those of the notebook's uneven plan leave at once, so the rank left alone
    fails when they go, not after gloo's 30 s timeout."""
    uneven = gloo_demo.launch(gloo_demo.Job(gloo_demo.plan_from_shards([[0, 1, 2, 3], [4, 5], [6, 7]]),
                                            str(tmp_path), 8, 0, 0, name="uneven"),
                              say=lambda line: None, allow_errors=True)
    assert list(uneven.errors) == [0] and uneven.seconds < 15, (uneven.errors, uneven.seconds)
    for run in range(3):
        even = gloo_demo.launch(gloo_demo.Job(gloo_demo.plan_from_shards([[0, 1], [2, 3], [4, 5]]), str(tmp_path),
                                              6, 0, 0, name=f"even{run}"), say=lambda line: None)
        assert set(even.exit_codes.values()) == {0} and not even.errors
