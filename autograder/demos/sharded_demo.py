"""Notebook 09's real multi-rank jobs: FSDP2 (``fully_shard``) and ``torch.distributed.checkpoint`` on gloo, CPU.

The ranks fork from notebook 07's rank server (``rank_server.start_rank_server``), which
imports this module (and with it torch, FSDP2 and DCP) once, so the kernel never forks
itself. A job is one call of :func:`run_ranks`: ``world_size`` processes that join a gloo
process group and run one *task* of this module, each returning plain data.

Every job trains the same tiny model (``helpers.tiny_mlp(8, 16)``: its first weight is 16x8,
so 4 ranks hold 4 rows each, 3 ranks 6, 6 and 4) with Adam, on a **constant global batch**:
the update at global cursor ``c`` trains positions ``c .. c + GLOBAL_BATCH - 1`` of the run's
global order, rank r taking positions ``c + r, c + r + R, ...`` (notebook 07's layout), so the
update is the same whatever the number of ranks, up to the order in which the gradient sums.

What the jobs show is the bug and the mechanism. They save with ``dcp.save`` alone (enough
against the SIGKILLs they suffer: the point of the commit marker), resume from a folder the
notebook names, and stop on a SIGTERM only in the two ways the notebook shows to be wrong.
The exercises' answers (the loader, the durable save with its pointer, the resume plan, the guard
that stops every rank at one commit) are nowhere in this module, nor parts of them a learner could
wrap: the rank's share of a global batch is a method of the job's own state (dataset indices, at
this module's global batch), and the two wrong SIGTERM handlers live inside the job's task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  (torch.optim imports it at the first step: once, in the rank server)
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from . import gloo_demo
from .gloo_demo import (_silence_this_process, host_store, join_gloo_group, leave_together,  # the same ranks as 07's
                        run_to_the_end)
from ..helpers import regression_data, tiny_mlp
from ..engine.forked_ranks import quiet_distributed
from ..engine.rank_server import start_rank_server

N = 48                 # dataset size: 4 global batches per epoch
GLOBAL_BATCH = 12      # divisible by 4, 3 and 2 ranks
LEARNING_RATE = 0.05
METADATA = ".metadata"  # DCP's coordinator writes it last: the commit marker


quiet_distributed()


# ---- the APIs the notebook relies on, as this build has them -----------------------------------

def api_notes() -> list[tuple[str, str, str]]:
    """(API, since which release, what this build says about it): each read from the installed torch."""
    import inspect
    async_source = inspect.getsource(dcp.async_save)
    return [
        ("torch.distributed.fsdp.fully_shard", "public since 2.6 (2.4-2.5: torch.distributed._composable.fsdp)",
         f"here from {fully_shard.__module__}"),
        ("dcp.save / dcp.load", "since 2.2 (before: save_state_dict / load_state_dict)",
         f"here: {callable(dcp.save) and callable(dcp.load)}"),
        ("get/set_model_state_dict, get/set_optimizer_state_dict", "since 2.2",
         f"here from {get_optimizer_state_dict.__module__}"),
        ("dcp.async_save", "since 2.3",
         f"here: {'experimental' if 'experimental' in (dcp.async_save.__doc__ or '') else 'not marked experimental'}"
         f", {'needs a CPU backend' if 'A CPU backend must be enabled' in async_source else 'no CPU-backend check'}"),
    ]


# ---- the data: a global order and a global cursor ---------------------------------------------

def global_order(position: int, n: int = N, seed: int = 0) -> int:
    """Dataset index at a global position: epoch = position // n, a fresh permutation per epoch."""
    epoch, offset = divmod(position, n)
    return int(torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))[offset])


@contextlib.contextmanager
def quiet_logs():
    """DCP logs its failures through the *root* logger, with tracebacks: keep them out of a demo that
    shows the failure itself."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def has_marker(folder) -> bool:
    return (Path(folder) / METADATA).is_file()


class DiesWhileSaving(FileSystemWriter):
    """A FileSystemWriter on which rank ``rank`` SIGKILLs itself right after it wrote its shard, once every
    other rank has written its own: an out-of-memory kill, a lost node, before the coordinator hears back."""

    def __init__(self, path, rank: int):
        super().__init__(path)
        self.dying_rank = rank

    def write_data(self, plan, planner):
        result = super().write_data(plan, planner)
        result.wait()
        dist.barrier()                              # every shard is on disk
        if dist.get_rank() == self.dying_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


# ---- one rank's training ----------------------------------------------------------------------

@dataclasses.dataclass
class Training:
    """One rank's live training state: the sharded model, Adam, and the global cursor."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    cursor: int = 0
    losses: list = dataclasses.field(default_factory=list)

    def batch_indices(self, world_size: int, rank: int) -> list[int]:
        """The dataset indices this rank trains in the global batch at the cursor: positions cursor + rank,
        cursor + rank + world_size, ... of the global order (notebook 07's layout)."""
        return [global_order(p) for p in range(self.cursor + rank, self.cursor + GLOBAL_BATCH, world_size)]

    def state(self) -> dict:
        return {"model": get_model_state_dict(self.model),
                "optim": get_optimizer_state_dict(self.model, self.optimizer),
                "train": {"cursor": self.cursor, "losses": list(self.losses)}}

    def load(self, folder) -> None:
        # The template is built right before the load, on an optimizer that has no gradients yet:
        # get_optimizer_state_dict then gives it Adam's state (moments included) for DCP to fill in.
        state = self.state()
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        self.cursor, self.losses = state["train"]["cursor"], list(state["train"]["losses"])


GUARDS = ("save_and_exit", "own_flag_only")     # the two wrong SIGTERM handlers task_preempt runs


def _build(world_size: int, shard: bool = True) -> Training:
    model = tiny_mlp(in_features=8, hidden=16, seed=0)
    if shard:
        fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
    return Training(model, torch.optim.Adam(model.parameters(), lr=LEARNING_RATE))


_DATA = regression_data(n=N, in_features=8, seed=1)


def _update(run: Training, world_size: int, rank: int) -> None:
    """One optimizer update on the global batch at the cursor; FSDP2 averages the gradient over ranks.
    The loss logged is the mean of the ranks' mean losses (what a training log prints)."""
    X, y = _DATA
    indices = run.batch_indices(world_size, rank)
    loss = torch.nn.functional.mse_loss(run.model(X[indices]), y[indices])
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    run.losses.append(total.item() / world_size)


def _commit(run: Training) -> None:
    run.cursor += GLOBAL_BATCH


def _shards(run: Training, world_size: int) -> dict[str, list]:
    """Per parameter, the [first, end) rows of dim 0 that each rank holds (FSDP2 shards dim 0): every rank's
    local row count, gathered (a collective), then laid end to end in rank order."""
    out = {}
    for name, param in run.model.named_parameters():
        count = torch.tensor([param.to_local().shape[0]])
        counts = [torch.zeros_like(count) for _ in range(world_size)]
        dist.all_gather(counts, count)
        ends = torch.cumsum(torch.cat(counts), 0).tolist()
        out[name] = {"shape": list(param.shape), "rows": [[end - int(c), end] for end, c in zip(ends, counts)]}
    return out


def _full_weights(run: Training) -> dict[str, torch.Tensor]:
    """The unsharded parameters (a collective: every rank calls it)."""
    return {name: param.full_tensor().detach().clone() for name, param in run.model.named_parameters()}


def task_train(rank: int, world_size: int, *, run_dir: str, steps: int, save_every: int = 0,
               resume_from: str | None = None, die: tuple | None = None) -> dict:
    """Train to ``steps`` updates in all (loading ``resume_from`` first, if given), saving every
    ``save_every`` updates into run_dir/step_<n> with dcp.save; ``die=(rank, step)`` kills that rank while it
    saves that step. Rank 0 also returns the full weights after every update (the others return None)."""
    run = _build(world_size)
    if resume_from:
        run.load(resume_from)
    loaded = {"cursor": run.cursor, "weights": _full_weights(run)}
    weights_after, shards = {}, _shards(run, world_size)

    def so_far() -> dict:
        return {"losses": list(run.losses), "cursor": run.cursor, "loaded": loaded, "shards": shards,
                "weights_after": dict(weights_after) if rank == 0 else None,
                "moments": sorted({key for v in run.optimizer.state.values() for key in v})}

    while run.cursor < steps * GLOBAL_BATCH:
        _update(run, world_size, rank)
        _commit(run)
        step = run.cursor // GLOBAL_BATCH
        weights_after[step] = _full_weights(run)
        if save_every and step % save_every == 0:
            _report_so_far(so_far())          # what this rank has trained, should the save kill the job
            folder = Path(run_dir) / f"step_{step}"
            writer = DiesWhileSaving(folder, die[0]) if die and die[1] == step else None
            dcp.save(run.state(), checkpoint_id=folder, storage_writer=writer)
    return so_far()


def task_preempt(rank: int, world_size: int, *, run_dir: str, steps: int, guard: str,
                 notice: tuple[int, int]) -> dict:
    """Train (plain data parallel: every rank holds every weight) with one of the two wrong guards. Rank
    notice[0] gets a SIGTERM in the middle of update notice[1], after the weights moved and before the cursor
    did: it sends it to itself there, so that the demo is the same on every run. The guard's ``save`` writes
    this rank's state with torch.save (rank<r>.pt): which update, which cursor, which weights. A rank whose
    collective fails (a peer is gone) says so and ends."""
    run = _build(world_size, shard=False)
    for param in run.model.parameters():
        dist.broadcast(param.data, 0)
    saved: list[dict] = []

    def save() -> None:
        record = {"cursor": run.cursor, "updates": len(run.losses),
                  "weights": {k: v.detach().clone() for k, v in run.model.state_dict().items()}}
        saved.append(record)
        torch.save(saved, Path(run_dir) / f"rank{rank}.pt")

    # The two wrong handlers (the notebook shows why each fails), as plain code of this task, with no
    # object to wrap: "save_and_exit" saves and exits inside the handler, wherever the rank happened to be;
    # "own_flag_only" records the notice, which this rank alone reads at its next commit.
    if guard not in GUARDS:
        raise ValueError(f"guard {guard!r}: one of {GUARDS}")
    notices: list[int] = []

    def on_sigterm(signum, frame) -> None:
        if guard == "save_and_exit":
            save()
            sys.exit(0)              # SystemExit, raised wherever this rank happened to be
        notices.append(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    stopped_at = failed_at = None
    for step in range(1, steps + 1):
        X, y = _DATA
        indices = run.batch_indices(world_size, rank)
        loss = torch.nn.functional.mse_loss(run.model(X[indices]), y[indices])
        run.optimizer.zero_grad()
        loss.backward()
        try:
            for param in run.model.parameters():
                dist.all_reduce(param.grad)
        except RuntimeError:                 # gloo: a peer closed its connection
            failed_at = step
            break
        for param in run.model.parameters():
            param.grad /= world_size
        run.optimizer.step()
        run.losses.append(loss.item())
        if (rank, step) == tuple(notice):
            os.kill(os.getpid(), signal.SIGTERM)     # the notice lands mid-update
        _commit(run)
        if notices:
            save()
            stopped_at = step
            break
    return {"stopped_at": stopped_at, "failed_at": failed_at, "updates": len(run.losses), "saved": len(saved)}


@contextlib.contextmanager
def _watched_staging():
    """Record what DefaultStager.stage returns: the copy async_save writes from, when no stager is given."""
    staged = []
    original = DefaultStager.stage

    def stage(self, state_dict, **kwargs):
        result = original(self, state_dict, **kwargs)
        staged.append(result)
        return result

    DefaultStager.stage = stage
    try:
        yield staged
    finally:
        DefaultStager.stage = original


def _storages(state: dict) -> set[int]:
    local = (t.to_local() if hasattr(t, "to_local") else t for t in state.values())
    return {t.untyped_storage().data_ptr() for t in local if torch.is_tensor(t) and t.numel()}


def task_async_save(rank: int, world_size: int, *, run_dir: str) -> dict:
    """dcp.async_save captures the state at the call: change the weights right after, then load. The staged
    copy (what DefaultStager returned) is compared with the live shards: shared storage would be no copy."""
    run = _build(world_size)
    _update(run, world_size, rank)
    before = _full_weights(run)
    state = {"model": get_model_state_dict(run.model)}
    started = time.perf_counter()
    with _watched_staging() as staged:
        future = dcp.async_save(state, checkpoint_id=Path(run_dir) / "step_1")
    returned_after = time.perf_counter() - started
    shares_storage = [bool(_storages(copy["model"]) & _storages(state["model"])) for copy in staged]
    with torch.no_grad():
        for param in run.model.parameters():
            param.add_(1.0)                       # training goes on while the save is written
    future.result()
    committed_after_wait = has_marker(Path(run_dir) / "step_1")
    state = {"model": get_model_state_dict(run.model)}
    dcp.load(state, checkpoint_id=Path(run_dir) / "step_1")
    set_model_state_dict(run.model, state["model"])
    loaded = _full_weights(run)
    shard_bytes = sum(p.to_local().numel() * p.element_size() for p in run.model.parameters())
    return {"returned_after": returned_after, "committed_after_wait": committed_after_wait, "shard_bytes": shard_bytes,
            "staged_by_default_stager": len(staged), "staged_shares_storage": shares_storage,
            "backends": str(dist.get_backend()),
            "max_diff_before_change": max(float((loaded[k] - before[k]).abs().max()) for k in before)}


TASKS = {"train": task_train, "preempt": task_preempt, "async_save": task_async_save}
TOGETHER = {"train", "async_save"}     # tasks whose ranks all reach the end; preempt's ranks part ways on purpose


# ---- the launcher -------------------------------------------------------------------------------

def _warm_up() -> None:
    """Pay, once in the rank server, what every rank would pay at its first update and first save
    (torch.optim's and DCP's lazy setup, about half a second each): the ranks fork with it done."""
    with tempfile.TemporaryDirectory() as folder:
        model = tiny_mlp(in_features=8, hidden=16, seed=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        model(_DATA[0][:2]).sum().backward()
        optimizer.step()
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.save(state, checkpoint_id=Path(folder) / "step_0")
        dcp.load(state, checkpoint_id=Path(folder) / "step_0")


def _in_the_rank_server() -> bool:
    # multiprocessing starts its forkserver as `python -c "from multiprocessing.forkserver import main; ..."`
    return sys.argv == ["-c"] and "multiprocessing.forkserver" in sys.modules


if _in_the_rank_server():
    with warnings.catch_warnings(), contextlib.redirect_stderr(open(os.devnull, "w")):
        warnings.simplefilter("ignore")
        _warm_up()


@dataclasses.dataclass
class RanksReport:
    world_size: int
    exit_codes: dict[int, int | None]
    results: dict[int, dict]          # rank -> what its task returned, or had reported when it was stopped
    errors: dict[int, str]
    seconds: float

    def how(self, rank: int) -> str:
        code = self.exit_codes[rank]
        return ("finished" if code == 0 and rank in self.results else "exited early, without a result" if code == 0
                else "killed by SIGKILL" if code == -signal.SIGKILL
                else f"failed: {_without_address(self.errors[rank])}" if rank in self.errors
                else "stopped by the launcher after a rank died" if code in (-signal.SIGTERM, 1) else f"exit {code}")


def _without_address(error: str) -> str:
    """gloo's error text without the peer's address and port, which change from run to run."""
    return re.sub(r" ?\[?[0-9.]+\]?:[0-9]+", "", error)


_RESULT: list[Path] = []     # in a rank: where its task's result goes


def _report_so_far(result: dict) -> None:
    """Write a task's result before a step that may end the job: a rank killed there still reports."""
    torch.save(result, _RESULT[0])


def _entry(rank: int, task: str, world_size: int, port: int, workdir: str, kwargs: dict) -> None:
    _RESULT[:] = [Path(workdir) / f"{task}_result{rank}.pt"]
    _silence_this_process(Path(workdir) / f"{task}_rank{rank}.log")
    quiet_distributed()
    store = join_gloo_group(rank, world_size, port, timeout_s=20)
    result = TASKS[task](rank, world_size, **kwargs)
    torch.save(result, _RESULT[0])
    if task in TOGETHER:
        dist.barrier()   # every rank reaches it, so none is left waiting below
        leave_together(store, world_size)


def run_ranks(task: str, world_size: int, workdir: str | None = None, **kwargs) -> RanksReport:
    """Run one job of ``world_size`` ranks to its end (or until a rank dies) and collect their results."""
    workdir = workdir or new_workdir()
    store = host_store()
    method = start_rank_server(preload=__name__)
    started = time.perf_counter()
    exit_codes, errors = run_to_the_end(_entry, (task, world_size, store.port, workdir, kwargs), world_size, method)
    del store
    results = {}
    for rank in range(world_size):
        path = Path(workdir) / f"{task}_result{rank}.pt"
        if path.exists():
            results[rank] = torch.load(path, weights_only=True)
            path.unlink()
    return RanksReport(world_size, exit_codes, results, errors, time.perf_counter() - started)


def new_workdir() -> str:
    """A scratch folder for one demo, removed when the Python process exits."""
    return gloo_demo.new_workdir(prefix="sharded_demo_")


def listing(folder) -> list[str]:
    """The files of a checkpoint folder, in the order they were finished (modification time)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    files = sorted(folder.iterdir(), key=lambda p: (p.stat().st_mtime_ns, p.name))
    return [p.name for p in files]
