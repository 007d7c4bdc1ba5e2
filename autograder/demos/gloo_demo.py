"""Notebook 07's real multi-process demo: data-parallel training on torch.distributed (gloo, CPU).

The worker lives in this module, not in a notebook cell, because a function defined
in a cell cannot be pickled for ``spawn``. The ranks are started by a ``forkserver``
that imports this module (and torch) once: later ranks fork from it in milliseconds.
Forking the ranks straight from the Jupyter kernel was faster still but unsafe: the
kernel runs threads (ZeroMQ, the rendezvous store), and a child forked while one of
them held a lock hung inside ``init_process_group`` about once in a dozen runs on a
loaded machine. Windows has no ``forkserver`` and falls back to ``spawn``.

A job trains a tiny linear model (plain SGD, so no optimizer state: notebook 07
is about the data position) on a fixed *plan*: for each rank, the list of
``(global position, dataset index)`` pairs it trains, in order, ``micro_batch`` at a
time, ``accum_steps`` microbatches (accumulation slots) per optimizer update. Every
update averages the gradients over all ranks with ``all_reduce`` (what DDP does
during the last backward pass), after which rank 0 writes a checkpoint (notebook
05's recipe) holding the model, the dataset version and the **global cursor**: how
many positions of the epoch's global order are committed.

Every rank keeps an append-only **audit log**: one line per sample it fetches
(update, accumulation slot, global position, sample), and one line once an update's
checkpoint is on disk. ``launch`` reads the logs back as ``Record`` rows, each with
its rank, the job's dataset version and a committed flag, so that an audit can
compare what was fetched, committed and trained. ``kill=(rank, update, slot)``
makes that rank SIGKILL itself right after fetching that microbatch, the way an
out-of-memory kill or a lost node ends a job: no exception, no cleanup, no final
checkpoint.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ..helpers import regression_data
from ..engine.rank_server import start_rank_server

MICRO_BATCH = 2
LEARNING_RATE = 0.3


@dataclasses.dataclass
class Job:
    """Everything a rank needs; plain data, so it also travels to ``spawn``ed ranks."""

    plan: list[list[tuple[int, int]]]      # per rank: (global position, dataset index) pairs
    workdir: str
    n: int                                  # dataset size
    seed: int                               # sampler seed (recorded in the checkpoint)
    epoch: int
    start_cursor: int = 0                   # global positions committed before this job
    resume: bool = False                    # load the checkpoint in workdir first
    kill: tuple[int, int, int] | None = None   # (rank, update, slot), counted in this job: SIGKILL there
    micro_batch: int = MICRO_BATCH          # samples per rank per backward pass
    accum_steps: int = 1                    # backward passes (accumulation slots) per optimizer update
    dataset_version: str = ""               # recorded in the checkpoint and in every audit record
    name: str = "job"                       # names this job's audit logs
    port: int = 0                           # the launcher's rendezvous store (127.0.0.1 only)

    @property
    def world_size(self) -> int:
        return len(self.plan)

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.workdir) / "checkpoint.pt"


@dataclasses.dataclass
class Record:
    """One row of the audit record: one sample of one microbatch, as its rank logged it."""

    update: int            # the run's optimizer update it belongs to (counted across jobs, from 0)
    slot: int              # its accumulation slot in that update
    rank: int
    position: int          # its global position in the epoch's order
    sample: int            # the sample's identifier (the dataset is the numbers 0..n-1: sample i is i)
    dataset_version: str
    committed: bool        # the update's checkpoint reached the disk before the job ended


@dataclasses.dataclass
class JobReport:
    world_size: int
    exit_codes: dict[int, int | None]
    fetched: list[Record]                  # every sample fetched, committed or not, in global order
    checkpoint: dict | None
    seconds: float
    errors: dict[int, str] = dataclasses.field(default_factory=dict)   # rank -> last line of its exception

    @property
    def killed(self) -> list[int]:
        return [rank for rank, code in self.exit_codes.items() if code == -signal.SIGKILL]


def plan_from_shards(shards: list[list[int]], start_cursor: int = 0) -> list[list[tuple[int, int]]]:
    """Attach global positions to per-rank index lists laid out as rank r = order[r::world_size]."""
    world_size = len(shards)
    return [[(start_cursor + i * world_size + rank, index) for i, index in enumerate(shard)]
            for rank, shard in enumerate(shards)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 1)


def _commit_update(job, model: nn.Module, history: list, updates: int, done: int) -> None:
    """Rank 0's checkpoint of an update, written with notebook 05's recipe: a crash at any moment leaves the
    job's checkpoint old or new, never half-written, and once this returns the new file and its name are on
    the disk (so the update it records counts as committed). A temp file of its own in the same folder,
    fsynced before the rename; the folder fsynced after it; the temp file removed if anything fails on the
    way. It writes this job's checkpoint only (built here from the job's state), not any object."""
    path = Path(job.checkpoint_path)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({
                "model": model.state_dict(),
                "loss_history": history,
                "updates": updates,
                # The data position, in units that survive a change of world size, and what it indexes.
                "sampler": {"n": job.n, "seed": job.seed, "epoch": job.epoch, "drop_last": False,
                            "world_size": job.world_size, "committed": job.start_cursor + job.world_size * done},
                "dataset_version": job.dataset_version,
            }, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _silence_this_process(log_path: Path) -> None:
    """Send the rank's stdout/stderr (Python's and the C++ libraries') to a log file."""
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    warnings.simplefilter("ignore")


def _updates(shard: list, micro_batch: int, accum_steps: int) -> list[list[list[tuple[int, int]]]]:
    """A rank's plan cut into updates, each a list of microbatches (its accumulation slots). The last
    update of a plan may have fewer slots: the loop steps with what the epoch has left."""
    microbatches = [shard[start:start + micro_batch] for start in range(0, len(shard), micro_batch)]
    return [microbatches[start:start + accum_steps] for start in range(0, len(microbatches), accum_steps)]


def _worker(rank: int, job: Job) -> None:
    workdir = Path(job.workdir)
    _silence_this_process(workdir / f"rank{rank}.log")
    store = join_gloo_group(rank, job.world_size, job.port, timeout_s=30)
    X, y = regression_data(n=job.n, seed=1)
    model = _model()
    history: list[float] = []
    first_update = 0
    if job.resume:
        state = torch.load(job.checkpoint_path, weights_only=True)
        model.load_state_dict(state["model"])
        history = list(state["loss_history"])
        first_update = state["updates"]

    done = 0                                           # positions of this rank's plan trained so far
    with open(workdir / f"audit_{job.name}_rank{rank}.txt", "a") as audit_log:
        for u, update in enumerate(_updates(job.plan[rank], job.micro_batch, job.accum_steps)):
            model.zero_grad()
            losses = []
            for slot, batch in enumerate(update):
                audit_log.write("".join(f"fetch {first_update + u} {slot} {position} {index}\n"
                                        for position, index in batch))
                audit_log.flush()
                # Every rank holds its microbatch before the crash: the demo is the same on every run.
                dist.barrier()
                if job.kill == (rank, u, slot):
                    os.kill(os.getpid(), signal.SIGKILL)
                indices = torch.tensor([index for _, index in batch])
                loss = nn.functional.mse_loss(model(X[indices]), y[indices]) / len(update)
                loss.backward()                        # accumulates in .grad: no weight has changed yet
                losses.append(loss.detach())
                done += len(batch)
            with torch.no_grad():
                for param in model.parameters():
                    dist.all_reduce(param.grad)                  # what DDP does during the last backward pass
                    param -= LEARNING_RATE * param.grad / job.world_size   # plain SGD: no optimizer state
            mean_loss = torch.stack(losses).sum()
            dist.all_reduce(mean_loss)
            history.append(mean_loss.item() / job.world_size)
            if rank == 0:
                _commit_update(job, model, history, first_update + u + 1, done)
            dist.barrier()  # the update counts as committed once its checkpoint is on disk
            audit_log.write(f"commit {first_update + u}\n")
            audit_log.flush()
    if len({len(_updates(shard, job.micro_batch, job.accum_steps)) for shard in job.plan}) == 1:
        leave_together(store, job.world_size)
    else:  # uneven plans are the demo of a collective nobody joins: who runs out leaves, the rank left alone fails
        dist.destroy_process_group()


def join_gloo_group(rank: int, world_size: int, port: int, timeout_s: float):
    """In a rank: one thread, gloo on the loopback, the launcher's store at ``port``; returns the store."""
    torch.set_num_threads(1)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return store


def leave_together(store, world_size: int, key: str = "left") -> None:
    """Tear the process group down only once every rank has finished its last collective. A rank that
    leaves first closes its gloo connections while a slower one may still be reading the last message
    of the final barrier, which then fails with 'Connection closed by peer' (seen on a loaded machine).
    The count goes through the launcher's store, which outlives every rank."""
    store.add(key, 1)
    deadline = time.monotonic() + 30
    while store.add(key, 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.005)
    dist.destroy_process_group()


def _read_audit(workdir: Path, job: Job) -> list[Record]:
    """Every rank's audit log as Record rows, in global order; an update is committed where its rank
    logged the commit (after the checkpoint was on disk)."""
    records = []
    for rank in range(job.world_size):
        path = workdir / f"audit_{job.name}_rank{rank}.txt"
        if not path.exists():
            continue
        lines = [line.split() for line in path.read_text().splitlines()]
        committed = {int(words[1]) for words in lines if words[0] == "commit"}
        for words in lines:
            if words[0] == "fetch":
                update, slot, position, index = map(int, words[1:])
                records.append(Record(update, slot, rank, position, index, job.dataset_version,
                                      update in committed))
    return sorted(records, key=lambda r: r.position)


def _last_line(traceback_text: str) -> str:
    """The exception line of a rank's traceback, without the C++ source location gloo prefixes."""
    line = traceback_text.strip().splitlines()[-1]
    line = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ", "", line)
    line = re.sub(r" ?\[[0-9a-f.:]+\]:\d+", "", line)   # the peer's address and port: new on every run
    return line.split(". This is")[0][:160]


def host_store():
    """The launcher's rendezvous store, on a port the OS picks while binding it: asking for a free port
    first and binding it later can race with any other process doing the same (a Jupyter kernel)."""
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


def run_to_the_end(entry, args: tuple, world_size: int, method: str) -> tuple[dict[int, int | None], dict[int, str]]:
    """Start ``world_size`` processes running ``entry(rank, *args)`` and wait until all ended or one failed
    (torch then stops the others). Returns each rank's exit code, and for a rank that raised, the last line
    of its exception."""
    # The launcher logs a warning for each rank it stops after a crash; the caller's report says it.
    launcher_log = logging.getLogger("torch.multiprocessing.spawn")
    previous_level = launcher_log.level
    launcher_log.setLevel(logging.ERROR)
    errors: dict[int, str] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            context = mp.start_processes(entry, args=args, nprocs=world_size, join=False, start_method=method)
            try:
                while not context.join():
                    pass
            except mp.ProcessRaisedException as failure:
                # join() has already stopped the surviving ranks; keep the last line of the traceback.
                errors[failure.error_index] = _last_line(str(failure))
            except mp.ProcessExitedException:
                pass  # a rank died without a Python exception (SIGKILL): its exit code tells the story
    finally:
        launcher_log.setLevel(previous_level)
    return {rank: process.exitcode for rank, process in enumerate(context.processes)}, errors


def _lost_a_peer(message: str) -> bool:
    return any(words in message for words in ("Connection reset by peer", "Connection closed by peer",
                                             "Broken pipe"))


def launch(job: Job, say=print, allow_errors: bool = False) -> JobReport:
    """Run one job of ``job.world_size`` processes to the end, or until a rank dies.

    A rank killed by ``job.kill`` is part of the demo. A rank that raises is not, unless
    ``allow_errors`` says the demo is about that failure: everything after it would be wrong.
    """
    store = host_store()
    job = dataclasses.replace(job, port=store.port)
    method = start_rank_server()   # the first launch waits for its import, if it is still on
    # Only what is the same on every run: not the store's port, not the seconds (JobReport has them).
    say(f"launching {job.world_size} ranks (gloo on the loopback, {method} start)"
        + (f", resuming at global position {job.start_cursor}" if job.resume else ""))
    started = time.perf_counter()
    exit_codes, errors = run_to_the_end(_worker, (job,), job.world_size, method)
    del store
    if job.kill is not None and exit_codes.get(job.kill[0]) == -signal.SIGKILL:
        # A rank that lost its connection to the killed one failed because of the crash, not on its own: on a
        # loaded machine its error can reach the launcher before the killed rank's end does.
        errors = {rank: message for rank, message in errors.items() if not _lost_a_peer(message)}
    seconds = time.perf_counter() - started
    workdir = Path(job.workdir)
    checkpoint = torch.load(job.checkpoint_path, weights_only=True) if job.checkpoint_path.exists() else None
    report = JobReport(job.world_size, exit_codes, _read_audit(workdir, job), checkpoint, seconds, errors)
    for rank, code in exit_codes.items():
        microbatches = len({(r.update, r.slot) for r in report.fetched if r.rank == rank})
        planned = sum(map(len, _updates(job.plan[rank], job.micro_batch, job.accum_steps)))
        # A rank that trained its whole plan has finished, whether it had exited or was still tearing down
        # when the launcher stopped the others after a crash: that race must not change what is printed.
        how = ("killed by SIGKILL" if code == -signal.SIGKILL else f"failed: {errors[rank]}" if rank in errors
               else "finished" if code == 0 or microbatches == planned
               else "stopped by the launcher after the crash" if code in (-signal.SIGTERM, 1) else f"exit {code}")
        say(f"  rank {rank}: fetched {microbatches} microbatch{'es' if microbatches != 1 else ''}, {how}")
    cursor = checkpoint["sampler"]["committed"] if checkpoint else 0
    updates = checkpoint["updates"] if checkpoint else 0
    say(f"  durable checkpoint: {updates} update{'s' if updates != 1 else ''}, global cursor {cursor}")
    if errors and not allow_errors:
        rank, message = next(iter(errors.items()))
        raise RuntimeError(f"the gloo job did not run: rank {rank} failed with {message}")
    return report


def new_workdir(prefix: str = "gloo_demo_") -> str:
    """A scratch folder for one demo's logs and checkpoint, removed when the Python process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
