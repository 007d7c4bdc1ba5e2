"""Notebook 10: progress beyond fixed samples. The library facts the notebook states (IterableDataset
copies per worker; StatefulDataLoader's state, and where it refuses another worker count), and the
packing loaders the checks resume."""

import collections
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from autograder import auditable_progress as checks
from autograder.auditable_progress import judge_deviation
from autograder.token_streams import (PackedStream, ShardedStream, budget_batches, chunked_batches, collate_blocks,
                                      document_lengths, pack_spans, packed_batches, trained_spans)
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


def test_stateful_dataloader_snapshots_what_was_handed_out_and_its_first_iteration_refuses_another_worker_count():
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
        assert {w: s["dataset_state"]["offsets"] for w, s in snapshots.items()} == {"worker_0": {0: 2, 2: 0},
                                                                                   "worker_1": {1: 1, 3: 0}}
        same = StatefulDataLoader(ShardedStream(stream), batch_size=None, num_workers=2)
        same.load_state_dict(state)
        assert sorted(handed + [tuple(r) for r in same]) == [(p, o) for p in range(4) for o in range(4)]
        for workers, message in ((1, ""), (3, ""), (0, "State doesn't contain key '_num_yielded' expected for single "
                                                       "process dataloader")):
            other = StatefulDataLoader(ShardedStream(stream), batch_size=None, num_workers=workers)
            other.load_state_dict(state)                      # only keeps the state
            with pytest.raises(AssertionError) as raised:
                next(iter(other))                             # the first iteration restores it, and refuses
            assert str(raised.value) == message


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


def test_concatenate_and_chunk_packing_puts_a_token_in_every_slot_but_the_last_blocks():
    lengths = document_lengths(30, seed=2, longest=40)
    batches = chunked_batches(lengths, 16, 4)
    assert all(b["valid"].all() for b in batches[:-1])
    doc, _, offset = batches[3]["spans"][-1][-1]
    resumed = chunked_batches(lengths, 16, 4, start=(doc, offset))
    assert [b["spans"] for b in resumed] == [b["spans"] for b in batches[4:]]
    assert sum(map(len, trained_spans(lengths, batches))) == sum(lengths)


def test_a_stream_owner_lists_every_partition_it_owns_once_iteration_starts():
    stream = ShardedStream([3, 3, 3, 3], rank=1, world_size=2)
    iterator = iter(stream)
    next(iterator)
    assert stream.state_dict() == {"offsets": {1: 1, 3: 0}}


def test_the_checks_hand_the_learner_no_scenario_label():
    """Issue 24, principle 4: every judge_deviation report has the same strata, whatever the case."""
    reports = [judge_deviation._sound_reports(s) for s in (0, 2)]
    assert all(set(r["strata"]) == set(judge_deviation.STRATA) for pair in reports for r in pair)


def test_checks_report_a_non_callable_answer_and_an_unanswered_one():
    assert "should be a function" in failure_of(checks.check_token_cursor_resume, None)

    def stub(*args):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_resume_plan_no_gap(stub)
