"""Notebook 10: progress beyond fixed samples. The library facts the notebook states (IterableDataset
copies per worker, StatefulDataLoader's state and worker count, what a state_dict does not hold), and
the packing loader the checks resume."""

import collections
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from autograder import auditable_progress as checks
from autograder.token_streams import (PackedStream, ShardedStream, budget_batches, collate_blocks, document_lengths,
                                      pack_spans, packed_batches, trained_spans)
from check_outcomes import failure_of
from notebook_checks import checks_of


def test_the_check_modules_lists_are_the_notebooks_checks():
    assert checks.TOKEN_CURSOR_CHECKS == checks_of("10", "token_cursor")
    assert checks.RESUME_PLAN_CHECKS == checks_of("10", "resume_plan")
    assert checks.VERIFY_RESUME_CHECKS == checks_of("10", "verify_resume")
    assert checks.JUDGE_DEVIATION_CHECKS == checks_of("10", "judge_deviation")


def test_an_iterable_dataset_without_ownership_is_read_once_per_worker():
    parts = [3, 3]
    unsharded = DataLoader(ShardedStream(parts, sharded=False), batch_size=None, num_workers=2)
    sharded = DataLoader(ShardedStream(parts), batch_size=None, num_workers=2)
    assert set(collections.Counter(map(tuple, unsharded)).values()) == {2}
    assert collections.Counter(map(tuple, sharded)) == {(p, o): 1 for p in range(2) for o in range(3)}


def test_stateful_dataloader_snapshots_what_was_handed_out_and_refuses_another_worker_count():
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stream = [4, 4, 4, 4]
        loader = StatefulDataLoader(ShardedStream(stream), batch_size=None, num_workers=2)
        records = iter(loader)
        handed = [tuple(next(records)) for _ in range(3)]
        state = loader.state_dict()
        del records
        snapshots = state["_snapshot"]["_worker_snapshots"]
        assert {w: s["dataset_state"]["offsets"] for w, s in snapshots.items()} == {"worker_0": {0: 2},
                                                                                   "worker_1": {1: 1}}
        same = StatefulDataLoader(ShardedStream(stream), batch_size=None, num_workers=2)
        same.load_state_dict(state)
        assert sorted(handed + [tuple(r) for r in same]) == [(p, o) for p in range(4) for o in range(4)]
        fewer = StatefulDataLoader(ShardedStream(stream), batch_size=None, num_workers=1)
        with pytest.raises(AssertionError):
            fewer.load_state_dict(state)
            list(fewer)


def test_the_packing_loader_resumes_exactly_at_a_block_boundary_and_matches_the_dataloader():
    lengths = document_lengths(30, seed=2, longest=40)
    whole = packed_batches(lengths, 16, 4)
    through_loader = list(DataLoader(PackedStream(lengths, 16), batch_size=4, collate_fn=collate_blocks))
    assert [b["spans"] for b in whole] == [b["spans"] for b in through_loader]
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(whole, through_loader))
    doc, _, offset = whole[5]["spans"][-1][-1]
    assert [b["spans"] for b in packed_batches(lengths, 16, 4, start=(doc, offset))][0] == whole[6]["spans"]
    spans = [s for block in pack_spans(lengths, 16) for s in block]
    assert sum(b - a for _, a, b in spans) == sum(lengths)
    budget = budget_batches(lengths, 64)
    assert len({len(b["spans"]) for b in budget}) > 1                           # variable batch sizes
    assert all(b["tokens"].numel() <= 64 for b in budget)
    assert sum(map(len, trained_spans(lengths, budget))) == sum(lengths)


def test_the_training_mode_is_not_in_the_state_dict_and_adam_keeps_two_tensors_per_parameter():
    net = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Dropout(0.5))
    net.eval()
    fresh = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Dropout(0.5))
    fresh.load_state_dict(net.state_dict())
    assert fresh.training and not net.training
    adam = torch.optim.Adam(net.parameters())
    net.train()
    net(torch.randn(4, 64)).sum().backward()
    adam.step()
    state = adam.state_dict()["state"]
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in state.values())


def test_manual_seed_seeds_every_cuda_device_too():
    import inspect
    assert "torch.cuda.manual_seed_all(seed)" in inspect.getsource(torch.random._manual_seed_impl)


def test_checks_report_a_non_callable_answer_and_an_unanswered_one():
    assert "should be a function" in failure_of(checks.check_token_cursor_resume, None)

    def stub(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_resume_plan_no_gap(stub)
