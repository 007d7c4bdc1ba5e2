"""Gloo ranks forked by a check, on one machine: joining a group through a file store, leaving it together,
reaping them by a deadline and reading their reports, a scheduler process that SIGTERMs chosen ranks at a
chosen update, a job forked before the probe's own (forked_report), and DCP warmed up before the ranks fork.

Notebook 09's checks fork their ranks (and their scheduler) from a probe, where the learner's code lives;
the ranks' bodies, what they train and report, are the check module's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from ..checking import silence_this_process


def quiet_distributed() -> None:
    """Silence what torch.distributed says on the side (a single-process DCP save warns that no process
    group exists; FSDP2 and DCP log at INFO) in the process that calls it: the learner sees none of it."""
    import logging
    import warnings
    warnings.filterwarnings("ignore", module=r"torch\.distributed.*")
    warnings.filterwarnings("ignore", message=".*torch.distributed.*")
    for name in ("torch.distributed", "torch.distributed.checkpoint"):
        logging.getLogger(name).setLevel(logging.ERROR)


def leave_together(store, world_size: int, wait: float = 1.0) -> None:
    """Count this rank out in the job's store and wait (a second at most) until every rank has: a rank that
    exits first closes its gloo connections while a slower one may still read its last message."""
    store.add("left", 1)
    deadline = time.monotonic() + wait
    while store.add("left", 0) < world_size and time.monotonic() < deadline:
        time.sleep(0.005)


def join(workdir: str, rank: int, world_size: int):
    import torch.distributed as dist
    silence_this_process()
    quiet_distributed()
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = dist.FileStore(os.path.join(workdir, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=10))
    return store


def first_line(exc: BaseException) -> str:
    """How a rank ended, in words that are the same on every run (no ports, no C++ locations): a rank whose
    peer is gone fails inside gloo with a RuntimeError (or a subclass), worded after the socket's fate."""
    if isinstance(exc, NotImplementedError):     # a RuntimeError too: the answer cell's stub
        return "NotImplementedError"
    if isinstance(exc, RuntimeError):
        return "a collective failed: a peer was gone"
    return type(exc).__name__


def fork_ranks(target, world_size: int, args: tuple) -> list[int]:
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            target(*args[:1], rank, *args[1:])    # never returns: the rank ends with os._exit
        pids.append(pid)
    return pids


def reap(pids: list[int], deadline: float) -> dict[int, object]:
    """Wait for each process until the deadline, then SIGKILL the rest; exit codes by index."""
    codes, end = {}, time.monotonic() + deadline
    while len(codes) < len(pids) and time.monotonic() < end:
        for i, pid in enumerate(pids):
            if i not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[i] = os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    for i, pid in enumerate(pids):
        if i not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[i] = "killed at the deadline"
    return codes


def reporting_rank(body, rank: int, world_size: int, workdir: str, report: dict) -> None:
    """A rank that reports however it ends (fork_ranks runs it): joins the job's gloo group and runs
    ``body(rank, world_size, report)``, which fills ``report`` in as it goes; then sets report["done"], or
    report["error"] (first_line) when it raised, writes it to rank<r>.json and leaves with the others."""
    code, store = 1, None
    try:
        store = join(workdir, rank, world_size)
        body(rank, world_size, report)
        report["done"] = True
        code = 0
    except BaseException as exc:
        report["error"] = first_line(exc)
    finally:
        with contextlib.suppress(Exception):
            Path(workdir, f"rank{rank}.json").write_text(json.dumps(report))
        if store is not None:
            with contextlib.suppress(Exception):
                leave_together(store, world_size)
        os._exit(code)


# ---- a scheduler and its ranks ---------------------------------------------------------------------

class Channel:
    """A rank's line to the scheduler: at each update's midpoint it says so and waits for the go-ahead; the
    scheduler may send it a SIGTERM first. The line carries nothing else."""

    def __init__(self, up: int, down: int):
        self.up, self.down = up, down

    def mid_update(self) -> None:
        os.write(self.up, b"u")
        os.read(self.down, 1)     # a SIGTERM sent before the answer runs the handler inside this read


def rank_process(body, rank: int, world_size: int, workdir: str, channel: Channel) -> None:
    """A scheduled rank: joins the job's gloo group, runs ``body(rank, world_size, channel)`` and writes the
    report it returns to rank<r>.json (how it failed, to rank<r>.error); then leaves with the others."""
    code, store = 1, None
    try:
        # SIGTERM is blocked while gloo starts its threads (they inherit the mask), then unblocked here only:
        # the scheduler's signal reaches this thread, and its handler runs inside the channel's read.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        store = join(workdir, rank, world_size)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        report = body(rank, world_size, channel)
        Path(workdir, f"rank{rank}.json").write_text(json.dumps(report))
        code = 0
    except BaseException as exc:
        with contextlib.suppress(Exception):
            Path(workdir, f"rank{rank}.error").write_text(first_line(exc))
    finally:
        with contextlib.suppress(Exception):
            os.close(channel.up)
        if store is not None:
            with contextlib.suppress(Exception):
                leave_together(store, world_size)
        os._exit(code)


def not_dumpable() -> None:
    """The scheduler's memory (the schedule) cannot be read by the ranks through /proc or ptrace."""
    if sys.platform.startswith("linux"):
        import ctypes
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE, 0


def schedule_job(body, draw, world_size: int, workdir: str, **record) -> None:
    """One job's scheduler, in a forked process of its own: fork ``world_size`` ranks running ``body`` (see
    rank_process), then, only then and only here, draw the schedule, ``draw(world_size, rng)`` ->
    ``{"ranks": [...], "update": n}``, and SIGTERM those ranks at their n-th update's midpoint (Channel).
    Writes ``record``, the schedule, the signals sent and each rank's ending to job.json; never returns."""
    code = 1
    try:
        silence_this_process()
        ups = [os.pipe() for _ in range(world_size)]
        downs = [os.pipe() for _ in range(world_size)]
        pids = []
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                for other in range(world_size):
                    os.close(ups[other][0])
                    os.close(downs[other][1])
                    if other != rank:
                        os.close(ups[other][1])
                        os.close(downs[other][0])
                rank_process(body, rank, world_size, workdir, Channel(ups[rank][1], downs[rank][0]))
            pids.append(pid)
        for rank in range(world_size):
            os.close(ups[rank][1])
            os.close(downs[rank][0])
        not_dumpable()
        schedule = draw(world_size, random.SystemRandom())   # only now, only here
        counts, sent = [0] * world_size, []
        listening = {ups[rank][0]: rank for rank in range(world_size)}
        end = time.monotonic() + 20
        while listening and time.monotonic() < end:
            ready, _, _ = select.select(list(listening), [], [], max(0.0, end - time.monotonic()))
            for fd in ready:
                rank = listening[fd]
                data = os.read(fd, 64)
                if not data:
                    del listening[fd]
                    continue
                for _ in data:
                    counts[rank] += 1
                    if rank in schedule["ranks"] and counts[rank] == schedule["update"]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pids[rank], signal.SIGTERM)
                        sent.append([rank, counts[rank]])
                    with contextlib.suppress(OSError):
                        os.write(downs[rank][1], b"g")
        codes = reap(pids, deadline=max(1.0, end - time.monotonic()))
        ranks = []
        for rank in range(world_size):
            report_path, error_path = Path(workdir, f"rank{rank}.json"), Path(workdir, f"rank{rank}.error")
            ranks.append({"exit": codes[rank],
                          "report": json.loads(report_path.read_text()) if report_path.exists() else None,
                          "error": error_path.read_text() if error_path.exists() else None})
        Path(workdir, "job.json").write_text(json.dumps({**record, "schedule": schedule, "sent": sent,
                                                         "ranks": ranks}))
        code = 0
    finally:
        os._exit(code)


def scheduled_jobs(jobs: dict, world_size: int, deadline: float, prefix: str = "scheduled-") -> list[dict]:
    """Every job of ``jobs`` ({name: (body, draw)}) at once, each under a scheduler process of its own (see
    schedule_job) in a folder of its own, removed afterwards; the schedulers are reaped by ``deadline`` seconds.
    Per job, in order, what its job.json holds (``{"job": name, ...}``), or, when its scheduler wrote none,
    ``{"job": name, "schedule": None, "sent": [], "ranks": []}``."""
    roots = [tempfile.mkdtemp(prefix=prefix) for _ in jobs]
    try:
        leaders = []
        for (job, (body, draw)), workdir in zip(jobs.items(), roots):
            pid = os.fork()
            if pid == 0:
                schedule_job(body, draw, world_size, workdir, job=job)
            leaders.append(pid)
        reap(leaders, deadline=deadline)
        reports = []
        for job, workdir in zip(jobs, roots):
            path = Path(workdir, "job.json")
            reports.append(json.loads(path.read_text()) if path.exists() else
                           {"job": job, "schedule": None, "sent": [], "ranks": []})
        return reports
    finally:
        for workdir in roots:
            shutil.rmtree(workdir, ignore_errors=True)


def rank_reports(workdir: str, codes: dict, missing: dict) -> list[dict]:
    """Per rank of ``codes`` (reap's exit codes): its exit code and the report it wrote to rank<r>.json, or
    ``missing`` when it wrote none."""
    reports = []
    for rank in range(len(codes)):
        path = Path(workdir, f"rank{rank}.json")
        reports.append({"exit": codes[rank], **(json.loads(path.read_text()) if path.exists() else missing)})
    return reports


def forked_report(task, *args, **kwargs) -> tuple[object | None, int]:
    """``task(*args, **kwargs)`` in a forked, silenced process (a job that ran before this one: nothing it
    leaves in memory stays here); what it returned, through JSON, or None when it returned nothing (it raised
    or was killed), and its exit code."""
    handle, report_path = tempfile.mkstemp(prefix="forked-report-", suffix=".json")
    os.close(handle)
    report_path = Path(report_path)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                silence_this_process()
                report_path.write_text(json.dumps(task(*args, **kwargs)))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        text = report_path.read_text()
        return (json.loads(text) if text else None), os.waitstatus_to_exitcode(status)
    finally:
        report_path.unlink(missing_ok=True)


_warmed: list = []


def warm_dcp(state: dict) -> None:
    """One single-process DCP save and load of ``state`` in this process, once: what DCP imports and sets up at
    its first save (fsspec, its planners) and DTensor at its first use (torch._dynamo) is then paid here, before
    the ranks fork, and not in each of them."""
    if not _warmed:
        import torch._dynamo  # noqa: F401  (DTensor.from_local imports it at its first call)
        import torch.distributed.checkpoint as dcp
        import torch.distributed.tensor  # noqa: F401
        with tempfile.TemporaryDirectory() as folder:
            dcp.save(state, checkpoint_id=os.path.join(folder, "step_0"))
            dcp.load(state, checkpoint_id=os.path.join(folder, "step_0"))
        _warmed.append(True)
