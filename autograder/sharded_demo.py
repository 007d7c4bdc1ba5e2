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

This module also holds the reference versions of the notebook's fixes (``save_checkpoint``,
``latest_checkpoint``, ``PreemptionGuard``), which the ranks run.
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
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from . import gloo_demo
from .gloo_demo import (_silence_this_process, host_store, join_gloo_group, leave_together,  # the same ranks as 07's
                        run_to_the_end)
from .helpers import regression_data, tiny_mlp
from .sharded_checkpoints import quiet_distributed
from .rank_server import start_rank_server

N = 48                 # dataset size: 4 global batches per epoch
GLOBAL_BATCH = 12      # divisible by 4, 3 and 2 ranks
LEARNING_RATE = 0.05
POINTER = "latest"
METADATA = ".metadata"  # DCP's coordinator writes it last: the commit marker


quiet_distributed()


# ---- the data: a global order and a global cursor ---------------------------------------------

def global_order(position: int, n: int = N, seed: int = 0) -> int:
    """Dataset index at a global position: epoch = position // n, a fresh permutation per epoch."""
    epoch, offset = divmod(position, n)
    return int(torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))[offset])


def rank_positions(cursor: int, global_batch: int, world_size: int, rank: int) -> list[int]:
    """The global positions rank ``rank`` trains in the global batch that starts at ``cursor``."""
    return list(range(cursor + rank, cursor + global_batch, world_size))


# ---- the fixes: a step folder per commit, a pointer moved atomically, a loader that takes committed folders

@contextlib.contextmanager
def quiet_logs():
    """DCP logs its failures through the *root* logger, with tracebacks: keep them out of a demo that
    shows the failure itself."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def step_of(name: str) -> int | None:
    match = re.fullmatch(r"step_(\d+)", name)
    return int(match.group(1)) if match else None


def is_committed(folder) -> bool:
    return (Path(folder) / METADATA).is_file()


def latest_checkpoint(run_dir) -> str | None:
    """The newest committed step folder of ``run_dir`` (largest n of step_<n> holding .metadata), or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    steps = [(step_of(p.name), p) for p in run_dir.iterdir() if p.is_dir() and step_of(p.name) is not None]
    committed = [(n, p) for n, p in steps if is_committed(p)]
    return str(max(committed)[1]) if committed else None


def write_pointer(run_dir, name: str) -> None:
    """Replace run_dir/latest atomically with ``name`` (notebook 05's rule: temp file, fsync, rename, fsync)."""
    run_dir = Path(run_dir)
    tmp = run_dir / (POINTER + ".tmp")
    with open(tmp, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / POINTER)
    folder = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def save_checkpoint(state: dict, run_dir, step: int, storage_writer=None) -> str:
    """Every rank calls it: DCP writes step_<step>/ (.metadata last), then rank 0 moves the pointer."""
    folder = Path(run_dir) / f"step_{step}"
    dcp.save(state, checkpoint_id=folder, storage_writer=storage_writer)
    if not dist.is_initialized() or dist.get_rank() == 0:
        write_pointer(run_dir, folder.name)
    return str(folder)


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


class PreemptionGuard:
    """The handler only sets a flag; at each commit every rank joins one all_reduce(MAX) of the flags."""

    def __init__(self, save):
        self.save = save
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.requested = True          # no I/O here: the update may be half done

    def at_commit(self) -> bool:
        flag = torch.tensor([1 if self.requested else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)   # one rank's notice stops every rank, here
        if flag.item():
            self.save()
            return True
        return False


class SavesInTheHandler:
    """The handler a deadline suggests: save right now, on the rank that got the notice (training then goes
    on until the scheduler's SIGKILL)."""

    def __init__(self, save):
        self.save = save
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.save()

    def at_commit(self) -> bool:
        return False


GUARDS = {"flag_then_agree": PreemptionGuard, "save_in_handler": SavesInTheHandler}


# ---- one rank's training ----------------------------------------------------------------------

@dataclasses.dataclass
class Training:
    """One rank's live training state: the sharded model, Adam, and the global cursor."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    cursor: int = 0
    losses: list = dataclasses.field(default_factory=list)

    def state(self) -> dict:
        return {"model": get_model_state_dict(self.model),
                "optim": get_optimizer_state_dict(self.model, self.optimizer),   # moments included, even when fresh
                "train": {"cursor": self.cursor, "losses": list(self.losses)}}

    def load(self, folder) -> None:
        state = self.state()
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        self.cursor, self.losses = state["train"]["cursor"], list(state["train"]["losses"])


def _build(world_size: int, shard: bool = True) -> Training:
    model = tiny_mlp(in_features=8, hidden=16, seed=0)
    if shard:
        fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
    return Training(model, torch.optim.Adam(model.parameters(), lr=LEARNING_RATE))


_DATA = regression_data(n=N, in_features=8, seed=1)


def _update(run: Training, world_size: int, rank: int) -> None:
    """One optimizer update on the global batch at the cursor; FSDP2 averages the gradient over ranks."""
    X, y = _DATA
    indices = [global_order(p) for p in rank_positions(run.cursor, GLOBAL_BATCH, world_size, rank)]
    loss = torch.nn.functional.mse_loss(run.model(X[indices]), y[indices])
    run.optimizer.zero_grad()
    loss.backward()
    run.optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    run.losses.append(total.item() / world_size)


def _commit(run: Training) -> None:
    run.cursor += GLOBAL_BATCH


def _shard_rows(run: Training) -> dict[str, list[int]]:
    """Which rows of each parameter this rank holds (FSDP2 shards dim 0)."""
    rows = {}
    for name, param in run.model.named_parameters():
        local = param.to_local()
        offset = param.placements[0].dim == 0 and _dim0_offset(param)
        rows[name] = [offset, offset + local.shape[0]] if local.numel() else [0, 0]
    return rows


def _dim0_offset(param) -> int:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return int(offset[0])


def _full_weights(run: Training) -> dict[str, torch.Tensor]:
    """The unsharded parameters (a collective: every rank calls it)."""
    return {name: param.full_tensor().detach().clone() for name, param in run.model.named_parameters()}


def task_train(rank: int, world_size: int, *, run_dir: str, steps: int, save_every: int = 0,
               resume: bool = False, die: tuple | None = None) -> dict:
    """Train to ``steps`` updates in all (resuming first from the newest committed checkpoint, if asked),
    saving every ``save_every`` updates; ``die=(rank, step)`` kills that rank while it saves that step."""
    run = _build(world_size)
    resumed_from = None
    if resume:
        resumed_from = latest_checkpoint(run_dir)
        run.load(resumed_from)
    loaded = {"cursor": run.cursor, "weights": _full_weights(run)}
    saved_weights = {}
    while run.cursor < steps * GLOBAL_BATCH:
        _update(run, world_size, rank)
        _commit(run)
        step = run.cursor // GLOBAL_BATCH
        if save_every and step % save_every == 0:
            saved_weights[step] = _full_weights(run)
            writer = DiesWhileSaving(Path(run_dir) / f"step_{step}", die[0]) if die and die[1] == step else None
            save_checkpoint(run.state(), run_dir, step, storage_writer=writer)
    return {"losses": run.losses, "cursor": run.cursor, "resumed_from": resumed_from, "loaded": loaded,
            "shard_rows": _shard_rows(run), "weights": _full_weights(run), "saved_weights": saved_weights,
            "moments": sorted({key for v in run.optimizer.state.values() for key in v})}


def task_preempt(rank: int, world_size: int, *, run_dir: str, steps: int, guard: str,
                 notice: tuple[int, int]) -> dict:
    """Train with a preemption guard; the scheduler's SIGTERM reaches rank notice[0] in the middle of update
    notice[1], after the weights moved and before the cursor did. The guard's ``save`` writes this rank's
    state with torch.save (rank<r>.pt): which step, which cursor, which weights."""
    run = _build(world_size, shard=False)
    for param in run.model.parameters():     # plain data parallel: every rank holds every weight
        dist.broadcast(param.data, 0)
    saved: list[dict] = []

    def save() -> None:
        record = {"cursor": run.cursor, "updates": len(run.losses),
                  "weights": {k: v.detach().clone() for k, v in run.model.state_dict().items()}}
        saved.append(record)
        torch.save(saved, Path(run_dir) / f"rank{rank}.pt")

    stopper = GUARDS[guard](save)
    stopped_at = None
    for step in range(1, steps + 1):
        X, y = _DATA
        indices = [global_order(p) for p in rank_positions(run.cursor, GLOBAL_BATCH, world_size, rank)]
        loss = torch.nn.functional.mse_loss(run.model(X[indices]), y[indices])
        run.optimizer.zero_grad()
        loss.backward()
        for param in run.model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        run.optimizer.step()
        run.losses.append(loss.item())
        if (rank, step) == notice:
            os.kill(os.getpid(), signal.SIGTERM)     # the notice lands mid-update
        _commit(run)
        if stopper.at_commit():
            stopped_at = step
            break
    return {"stopped_at": stopped_at, "updates": len(run.losses), "saved": len(saved)}


def task_async_save(rank: int, world_size: int, *, run_dir: str) -> dict:
    """dcp.async_save captures the state at the call: change the weights right after, then load."""
    run = _build(world_size)
    _update(run, world_size, rank)
    before = _full_weights(run)
    started = time.perf_counter()
    future = dcp.async_save({"model": get_model_state_dict(run.model)}, checkpoint_id=Path(run_dir) / "step_1")
    returned_after = time.perf_counter() - started
    with torch.no_grad():
        for param in run.model.parameters():
            param.add_(1.0)                       # training goes on while the save is written
    future.result()
    committed_after_wait = is_committed(Path(run_dir) / "step_1")
    state = {"model": get_model_state_dict(run.model)}
    dcp.load(state, checkpoint_id=Path(run_dir) / "step_1")
    set_model_state_dict(run.model, state["model"])
    loaded = _full_weights(run)
    shard_bytes = sum(p.to_local().numel() * p.element_size() for p in run.model.parameters())
    return {"returned_after": returned_after, "committed_after_wait": committed_after_wait, "shard_bytes": shard_bytes,
            "max_diff_before_change": max(float((loaded[k] - before[k]).abs().max()) for k in before)}


TASKS = {"train": task_train, "preempt": task_preempt, "async_save": task_async_save}


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
    results: dict[int, dict]          # rank -> what its task returned (ranks that finished)
    errors: dict[int, str]
    seconds: float

    def how(self, rank: int) -> str:
        code = self.exit_codes[rank]
        return ("finished" if code == 0 and rank in self.results else "exited 0 early" if code == 0
                else "killed by SIGKILL" if code == -signal.SIGKILL
                else f"failed: {_without_address(self.errors[rank])}" if rank in self.errors
                else "stopped by the launcher after a rank died" if code in (-signal.SIGTERM, 1) else f"exit {code}")


def _without_address(error: str) -> str:
    """gloo's error text without the peer's address and port, which change from run to run."""
    return re.sub(r" ?\[?[0-9.]+\]?:[0-9]+", "", error)


def _entry(rank: int, task: str, world_size: int, port: int, workdir: str, kwargs: dict) -> None:
    _silence_this_process(Path(workdir) / f"{task}_rank{rank}.log")
    quiet_distributed()
    store = join_gloo_group(rank, world_size, port, timeout_s=20)
    result = TASKS[task](rank, world_size, **kwargs)
    torch.save(result, Path(workdir) / f"{task}_result{rank}.pt")
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
