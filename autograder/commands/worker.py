"""``workbook-worker SCHEDULER``: grade this course's submissions for a Dask cluster.

    workbook-worker tcp://10.0.0.5:8786                  # one grading process per core
    workbook-worker tcp://10.0.0.5:8786 --nworkers 4     # or as many as you say
    workbook-worker tcp://10.0.0.5:8786 --host 10.0.0.7  # further options go to `dask worker`
    workbook-worker tcp://10.0.0.5:8786 --allow-unconfined   # grade even where a protection is missing

Runs Dask's own ``dask worker`` with one thread per process (the judge bounds its memory per
process), offering the Dask resource named after this course's fingerprint
(``autograder.grading.cluster``): only a coordinator with the same course sends it submissions.
Each worker process starts the sandbox zygote at once (``dask_setup``), so the first submission
does not wait for torch to import. With a scheduler on this machine's loopback the worker listens
on loopback too.

A worker process that is ended (SIGTERM, as the nanny or a `kill` sends, or Dask closing it) first ends the
sandboxes it still runs and removes their cgroups (``cgroups.remove_all``); one killed outright (SIGKILL, out
of memory) leaves them to the next grader's sweep on this machine (``cgroups.sweep``: what a process that is
gone made is removed at the first sandbox of the next worker or grading process).

Each worker process says at its start what confines a submission on this machine, and refuses to start
where a protection is missing (``autograder.grading.protections``; several worker processes on one
machine judge side by side, so each sandbox then also needs CPU and processes of its own), unless it was
started with ``--allow-unconfined``: its grades then record what was missing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from autograder.contract import with_tools_on_path

LOOPBACK = ("tcp://127.", "tcp://localhost", "tcp://[::1]")


def dask_worker_command(scheduler: str, nworkers: int, extra: list[str]) -> list[str]:
    from autograder.grading.cluster import course_resource

    command = [str(Path(sys.executable).parent / "dask"), "worker", scheduler, "--nthreads", "1",
               "--nworkers", str(nworkers), "--resources", f"{course_resource()}=1",
               "--preload", "autograder.commands.worker", "--no-dashboard"]
    if scheduler.startswith(LOOPBACK) and not any(a.startswith(("--host", "--listen-address")) for a in extra):
        command += ["--host", "127.0.0.1"]
    return command + extra


def dask_setup(worker) -> None:
    """Dask's preload hook, in each worker process: the course it holds is the one it starts with (the
    fingerprint is remembered now, as the resource it offers was made from it), and the sandbox zygote
    starts now, not at the first submission."""
    from autograder.grading import cluster, protections, sandbox

    offered = cluster.course_resource()
    if offered not in worker.state.total_resources:
        raise RuntimeError(f"the course changed while this worker started (it now holds {offered}): start it again")
    policy = cluster.worker_policy()
    confinement = sandbox.warm_up()
    print(f"workbook-worker {worker.address}: {protections.summary(confinement)}", file=sys.stderr, flush=True)
    lacking = protections.enforce(confinement, policy.parallel, policy.allow_unconfined)   # refuses to start
    if lacking:
        print(f"workbook-worker: {protections.unconfined_note(lacking)}", file=sys.stderr, flush=True)
    if threading.current_thread() is threading.main_thread():   # a worker process of its own (not in-process)
        _end_sandboxes_on(signal.SIGTERM)


def dask_teardown(worker) -> None:
    """Dask's preload hook when the worker closes: a submission still being judged (its thread is abandoned,
    and a Dask worker process skips atexit) loses its sandboxes now, not to the next sweep."""
    from autograder.grading import cgroups

    cgroups.remove_all()


def _end_sandboxes_on(signum: int) -> None:
    """On ``signum``, end this process's sandboxes and remove their cgroups, then do what the signal did before
    (for SIGTERM: end the process)."""
    before = signal.getsignal(signum)

    def handler(number, frame):
        from autograder.grading import cgroups

        cgroups.remove_all()
        if callable(before):
            before(number, frame)
        else:
            signal.signal(number, signal.SIG_DFL if before is None else before)
            os.kill(os.getpid(), number)

    signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    from autograder.commands.grade import default_workers   # here, not at import: every worker process
    # imports this module as its preload, and grade imports nbgrader, which a worker never needs
    parser = argparse.ArgumentParser(prog="workbook-worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("scheduler", help="the Dask scheduler's address, tcp://HOST:PORT")
    parser.add_argument("--nworkers", type=int, default=default_workers(),
                        help="grading processes on this machine (default: one per core, here %(default)s)")
    parser.add_argument("--allow-unconfined", action="store_true",
                        help="grade even where this machine lacks a protection of the sandbox (it says which); "
                             "each grade records what was missing")
    args, extra = parser.parse_known_args(argv)
    from autograder.grading import protections, sandbox, zygote
    from autograder.grading.cluster import WORKER_ALLOW_UNCONFINED, WORKER_PARALLEL
    # Said and checked here, once, before Dask starts anything (each worker process checks again).
    confinement = sandbox.warm_up()
    zygote.stop()
    print(f"workbook-worker: {protections.summary(confinement)}", file=sys.stderr, flush=True)
    try:
        protections.enforce(confinement, args.nworkers > 1, args.allow_unconfined)
    except protections.ConfinementRefused as refused:
        print(f"workbook-worker: {refused}", file=sys.stderr)
        return 2
    command = dask_worker_command(args.scheduler, args.nworkers, extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", **{WORKER_PARALLEL: "1" if args.nworkers > 1 else "0",
                                                  WORKER_ALLOW_UNCONFINED: "1" if args.allow_unconfined else "0"})
    worker = subprocess.Popen(command, env=with_tools_on_path(env))
    # A SIGTERM to this command alone reaches Dask's worker command too, which closes its workers.
    signal.signal(signal.SIGTERM, lambda number, frame: worker.send_signal(number))
    try:
        return worker.wait()
    except KeyboardInterrupt:    # the terminal's Ctrl-C reached Dask's command as well: let it close its workers
        try:
            worker.wait(timeout=30)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            worker.kill()
        return 130


if __name__ == "__main__":
    sys.exit(main())
