"""Notebook 09: checkpoints across ranks. The DCP, FSDP2 and optimizer-state facts the notebook states,
on torch as installed, and the real multi-rank jobs it runs (4 ranks save, one dies, 3 ranks load; two
wrong SIGTERM handlers; async_save's staged copy)."""

import inspect
import logging
import os
import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from autograder import sharded_checkpoints as checks
from autograder.sharded_checkpoints import preemption
from autograder import sharded_demo
from autograder.demos import cross_release
from autograder.engine import forked_ranks
from autograder.atomic_writes import recorded_file_operations
from autograder.helpers import regression_data, tiny_mlp, train_step
from autograder.sharded_checkpoints import quiet_distributed
from check_outcomes import failure_of

quiet_distributed()
# A single-process DCP save or load says that no process group exists, and saving over a checkpoint says
# so: these tests mean both.
pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")]


def _watched_save(folder: Path) -> list[dict]:
    with recorded_file_operations(watch=folder / ".metadata") as events:
        dcp.save({"w": torch.randn(16, 8)}, checkpoint_id=folder)
    return events


def test_dcp_writes_metadata_last_by_a_rename(tmp_path):
    events = _watched_save(tmp_path / "step_1")
    assert [e["op"] for e in events][-1] == "rename"
    assert Path(events[-1]["src"]).name == ".metadata.tmp" and Path(events[-1]["dst"]).name == ".metadata"
    assert not any(e["watched"] for e in events[:-1])      # no marker before the last step


def test_dcp_never_fsyncs_a_folder_and_syncs_the_marker_as_its_release_flushes(tmp_path):
    """The power-cut half of the story: no folder is synced after the rename; whether the marker's bytes are
    synced is the release's flush-before-fsync (2.13: not, 0 bytes covered; 2.14 and 2.15: flushed first)."""
    events = _watched_save(tmp_path / "step_1")
    assert not [e for e in events if e["op"] == "fsync" and e["is_dir"]]
    marker = tmp_path / "step_1" / ".metadata"
    inode = (marker.stat().st_dev, marker.stat().st_ino)
    synced = [e["size"] for e in events if e["op"] == "fsync" and tuple(e["inode"]) == inode]
    flushes_first = "metadata_file.flush()" in inspect.getsource(FileSystemWriter.finish)
    assert synced == ([marker.stat().st_size] if flushes_first else [0])


def test_saving_over_a_checkpoint_keeps_the_old_marker_then_removes_it(tmp_path):
    assert inspect.signature(FileSystemWriter).parameters["overwrite"].default is True
    _watched_save(tmp_path / "step_1")
    events = _watched_save(tmp_path / "step_1")
    ops = [e["op"] for e in events]
    assert ops[-2:] == ["remove", "rename"]
    assert all(e["watched"] for e in events[:-2])           # the old .metadata, beside shards being replaced
    assert events[-2]["watched"] is None                    # the window with no marker at all


def test_an_empty_or_truncated_marker_does_not_read(tmp_path):
    folder = tmp_path / "step_1"
    dcp.save({"w": torch.randn(4)}, checkpoint_id=folder)
    FileSystemReader(str(folder)).read_metadata()
    data = (folder / ".metadata").read_bytes()
    for broken in (b"", data[: len(data) // 2]):
        (folder / ".metadata").write_bytes(broken)
        with pytest.raises(Exception):
            FileSystemReader(str(folder)).read_metadata()


def test_a_fresh_optimizers_raw_template_loads_no_moments_but_the_state_dict_api_does(tmp_path):
    X, y = regression_data(n=16, in_features=8, seed=1)
    model = tiny_mlp(8, 16, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    train_step(model, optimizer, X, y)
    dcp.save({"optim": optimizer.state_dict()}, checkpoint_id=tmp_path / "raw")
    dcp.save({"optim": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=tmp_path / "api")

    fresh = tiny_mlp(8, 16, seed=0)
    raw = torch.optim.Adam(fresh.parameters(), lr=0.05)
    template = {"optim": raw.state_dict()}
    dcp.load(template, checkpoint_id=tmp_path / "raw")     # no error
    raw.load_state_dict(template["optim"])
    assert dict(raw.state) == {}

    api = torch.optim.Adam(fresh.parameters(), lr=0.05)
    template = {"optim": get_optimizer_state_dict(fresh, api)}
    dcp.load(template, checkpoint_id=tmp_path / "api")
    set_optimizer_state_dict(fresh, api, template["optim"])
    for param, state in api.state.items():
        assert int(state["step"]) == 1 and state["exp_avg"].abs().sum() > 0


def test_building_the_template_steps_a_fresh_adam_at_lr_0_unless_gradients_are_set():
    X, y = regression_data(n=32, in_features=8, seed=1)

    def first_update(template_first):
        model = tiny_mlp(8, 16, seed=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        if template_first:
            get_optimizer_state_dict(model, optimizer)
            state = optimizer.state[next(iter(model.parameters()))]
            assert int(state["step"]) == 1 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
            assert optimizer.param_groups[0]["lr"] == 0.1           # put back
        train_step(model, optimizer, X, y)
        return model

    gap = max((a - b).abs().max().item() for a, b in zip(first_update(True).parameters(),
                                                         first_update(False).parameters()))
    assert gap == pytest.approx(0.1 * (1 - (0.1 / 0.19) / (0.001 / 0.001999) ** 0.5), rel=0.05)   # ~2.6e-2
    model = tiny_mlp(8, 16, seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(model(X), y).backward()
    assert get_optimizer_state_dict(model, optimizer)["state"] == {} and not optimizer.state


def test_async_save_captures_the_state_at_the_call_and_its_default_stager_copies(tmp_path):
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    assert "DefaultStager(" in inspect.getsource(dcp.async_save)
    weights = torch.zeros(4)
    staged = DefaultStager(StagingOptions(False, False, False, False)).stage({"w": weights})
    assert staged["w"].untyped_storage().data_ptr() != weights.untyped_storage().data_ptr()
    future = dcp.async_save({"w": weights}, checkpoint_id=tmp_path / "step_1")
    weights.add_(1.0)
    future.result()
    loaded = {"w": torch.empty(4)}
    dcp.load(loaded, checkpoint_id=tmp_path / "step_1")
    assert torch.equal(loaded["w"], torch.zeros(4))


def test_checkpoint_exception_is_not_an_exception():
    # The notebook catches it by name: `except Exception` lets a failed dcp.load through.
    assert not issubclass(dcp.api.CheckpointException, Exception)


def test_a_rank_killed_after_its_shard_leaves_no_marker_and_4_shards_reshard_to_3(tmp_path):
    run_dir = str(tmp_path)
    crashed = sharded_demo.run_ranks("train", 4, run_dir=run_dir, steps=2, save_every=1, die=(3, 2))
    assert crashed.exit_codes[3] == -9
    assert sorted(p.name for p in Path(run_dir, "step_2").iterdir()) == [f"__{r}_0.distcp" for r in range(4)]
    assert sorted(os.listdir(run_dir)) == ["step_1", "step_2"]                  # the demo moves no pointer
    assert len(crashed.results[0]["losses"]) == 2                                # reported before the fatal save
    shards = crashed.results[0]["shards"]
    assert shards["0.weight"]["rows"] == [[0, 4], [4, 8], [8, 12], [12, 16]]
    assert shards["2.weight"]["rows"] == [[0, 1], [1, 1], [1, 1], [1, 1]]      # torch.chunk on dim 0: empty pieces
    logging.disable(logging.CRITICAL)
    try:
        resumed = sharded_demo.run_ranks("train", 3, run_dir=run_dir, steps=3, resume_from=str(Path(run_dir, "step_1")))
    finally:
        logging.disable(logging.NOTSET)
    assert [resumed.results[0]["shards"]["0.weight"]["rows"]] == [[[0, 6], [6, 12], [12, 16]]]
    assert resumed.results[0]["loaded"]["cursor"] == sharded_demo.GLOBAL_BATCH
    assert resumed.results[0]["moments"] == ["exp_avg", "exp_avg_sq", "step"]
    loaded = resumed.results[0]["loaded"]["weights"]
    assert all(torch.equal(loaded[k], crashed.results[0]["weights_after"][1][k]) for k in loaded)


@pytest.mark.parametrize("guard, signalled, others", [
    ("save_and_exit", "exited", "failed_at"),
    ("own_flag_only", "stopped_at", "failed_at"),
])
def test_the_two_wrong_handlers_leave_one_rank_and_the_others_fail(tmp_path, guard, signalled, others):
    job = sharded_demo.run_ranks("preempt", 4, run_dir=str(tmp_path), steps=6, guard=guard, notice=(2, 3))
    saved = torch.load(tmp_path / "rank2.pt", weights_only=True)
    assert len(saved) == 1 and saved[0]["updates"] == 3
    assert saved[0]["cursor"] == (2 if guard == "save_and_exit" else 3) * sharded_demo.GLOBAL_BATCH
    assert (2 not in job.results) if signalled == "exited" else job.results[2]["stopped_at"] == 3
    assert [job.results[r][others] for r in (0, 1, 3)] == [4, 4, 4]
    assert not any(Path(tmp_path, f"rank{r}.pt").exists() for r in (0, 1, 3))


def test_async_saves_staged_copy_shares_no_storage_with_the_live_shards(tmp_path):
    job = sharded_demo.run_ranks("async_save", 2, run_dir=str(tmp_path))
    for result in job.results.values():
        assert result["staged_by_default_stager"] == 1 and result["staged_shares_storage"] == [False]
        assert result["committed_after_wait"] and result["max_diff_before_change"] == 0.0


def test_the_demo_module_holds_no_answer():
    """The notebook imports sharded_demo: no loader, durable save, pointer or guard that agrees may live there."""
    names = set(vars(sharded_demo))
    assert not names & {"latest_checkpoint", "save_checkpoint", "write_pointer", "PreemptionGuard"}
    assert set(sharded_demo.GUARDS) == {"save_and_exit", "own_flag_only"}
    source = inspect.getsource(sharded_demo)
    assert "all_reduce(flag" not in source and "os.replace" not in source


def test_a_returned_path_is_judged_as_text(tmp_path):
    run_dir = tmp_path / "run"
    assert checks.judged_path(None, run_dir) == ("none", None)
    assert checks.judged_path(3, run_dir)[0] == "not_a_path"
    assert checks.judged_path("step_4", run_dir)[0] == "name"            # relative: never resolved
    assert checks.judged_path("/etc/passwd", run_dir)[0] == "outside"    # absolute, elsewhere: never stat'ed
    assert checks.judged_path(str(run_dir / "x" / ".." / "step_4"), run_dir) == ("inside", run_dir / "step_4")


def test_a_guard_reading_the_schedule_from_the_frames_finds_none():
    """Issue 24, principle 4: the scheduler draws when the SIGTERM comes, in its own process, after the ranks
    exist; a guard that looks for it in its caller's frames instead of handling the signal never stops."""
    from fixtures.sharded_checkpoints_impls import GuardReadsTheSchedule
    message = failure_of(checks.check_preemption_guard_same_boundary, GuardReadsTheSchedule)
    assert "No rank stopped" in message
    source = inspect.getsource(preemption._guarded_rank) + inspect.getsource(forked_ranks.rank_process)
    assert not re.search(r"\bnotice\b|\bschedule\b", source)


def test_checks_report_a_non_callable_answer_and_an_unanswered_one():
    assert "should be a function" in failure_of(checks.check_latest_checkpoint_newest, None)

    class Stub:
        def __init__(self, save):
            raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        checks.check_preemption_guard_saves(Stub)


# ---- across releases: what the notebook's "A checkpoint from a newer PyTorch" and Optimizer(set) notes say ----

def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


INSTALLED = _release(torch.__version__)


@pytest.mark.parametrize("written", sorted(cross_release.WRITTEN))
def test_a_release_reads_older_checkpoints_and_2_15s_do_not_load_on_2_13_or_2_14(tmp_path, written):
    folder = cross_release.written_by(written, tmp_path)
    assert (folder / cross_release.RELEASE_FILE).read_text() == written
    state = {"model": {"weight": torch.zeros(2, 3)}}
    if _release(written) <= INSTALLED:
        assert FileSystemReader(str(folder)).read_metadata().version == "1.0.0"   # DCP's format: no release in it
        dcp.load(state, checkpoint_id=folder)
        assert torch.equal(state["model"]["weight"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    else:
        assert written == "2.15.0" and INSTALLED < (2, 15)
        with pytest.raises(ValueError, match=re.escape("too many values to unpack (expected 5)")):
            FileSystemReader(str(folder)).read_metadata()
        with sharded_demo.quiet_logs(), pytest.raises(dcp.api.CheckpointException,
                                                       match=re.escape("too many values to unpack (expected 5)")):
            dcp.load(state, checkpoint_id=folder)


def test_the_shipped_checkpoint_is_what_its_release_writes(tmp_path, monkeypatch):
    """The files in cross_release are the installed release's own, where it is one of the two (2.13 or 2.15):
    the same save here writes the same shard and a marker of the same content, bar its save id. (Not of the
    same length: the marker is a pickle, and Python 3.11.2 pickles an enum member longer than 3.11.7 does.)"""
    shipped = next((r for r in cross_release.WRITTEN if _release(r) == INSTALLED), None)
    if shipped is None:
        pytest.skip(f"torch {torch.__version__} wrote none of the shipped checkpoints")
    monkeypatch.chdir(tmp_path)
    dcp.save({"model": {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}}, checkpoint_id="step_8")
    theirs = cross_release.written_by(shipped, tmp_path / "shipped")
    ours = tmp_path / "step_8"
    assert (ours / "__0_0.distcp").read_bytes() == (theirs / "__0_0.distcp").read_bytes()
    read = [FileSystemReader(str(f)).read_metadata() for f in (ours, theirs)]
    assert read[0].state_dict_metadata == read[1].state_dict_metadata
    assert read[0].storage_data == read[1].storage_data


def test_an_optimizer_given_a_set_warns_since_2_15():
    """The raw state_dict keys Adam's state by position; a set of parameters has no stable order."""
    model = tiny_mlp(8, 16, seed=0)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(2, 8)).sum().backward()
    optimizer.step()
    assert list(optimizer.state_dict()["state"]) == [0, 1, 2, 3]
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.optim.Adam(set(model.parameters()))
    expected = [FutureWarning] if INSTALLED >= (2, 15) else []
    assert [w.category for w in caught] == expected
    assert all("ordering of tensors in sets will change between runs" in str(w.message) for w in caught)
