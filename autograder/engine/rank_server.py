"""The process that notebook 07's ranks fork from, started as early as a notebook likes.

A ``forkserver`` imports torch and ``autograder.demos.gloo_demo`` once (about a second); every rank
then forks from it in milliseconds. This module imports neither, so a notebook can start the
server before its own imports: the server's import and the kernel's then run side by side on
two cores instead of one after the other.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys

RANK_MODULE = "autograder.demos.gloo_demo"   # where the ranks' entry point lives


def start_rank_server(preload: str = RANK_MODULE) -> str:
    """Start the rank server if it is not running yet; return the start method ranks use.

    'forkserver' on Linux and macOS. Windows has no forkserver: 'spawn' (nothing to start).
    ``preload`` is the module the ranks' entry point lives in (notebook 09's is another one); only
    the first call in a process chooses it.
    """
    if sys.platform == "win32":
        return "spawn"
    return start_forkserver(preload)


def start_forkserver(preload: str) -> str:
    """Start multiprocessing's forkserver, importing ``preload`` once, if it is not running yet, and
    stop it with the kernel (notebook 04's DataLoader workers use it too). Returns 'forkserver'."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([preload])  # no-op once running
    forkserver.ensure_running()
    _stop_with_the_kernel()
    return "forkserver"


def _stop_with_the_kernel() -> None:
    """In a Jupyter kernel, stop the rank server as soon as the kernel is told to shut down or restart.

    ipykernel then ends every child process in its process group and waits until none is left.
    multiprocessing's resource tracker (started with the server) ignores SIGTERM, and a dead
    server stays a zombie that nobody reaps, so the kernel would wait until its manager kills
    it, 2.5 s later. Closing their pipes ends both at once, as a normal exit would.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    if shell is None or getattr(shell, "_rank_server_stops_with_it", False):
        return
    shell._rank_server_stops_with_it = True
    shell.observe(_stop_servers, names="exit_now")   # ipykernel's shutdown sets it first thing


def _stop_servers(change) -> None:
    if not change["new"]:
        return
    from multiprocessing import forkserver, resource_tracker   # POSIX only, like this hook

    # The rank server holds nothing to save, and a process with torch loaded takes up to a second to
    # tear itself down (with notebook 09's DCP and torch._dynamo, most of the kernel's shutdown): end it
    # at once. _stop then reaps it. Both come back by themselves if asked for again (ensure_running).
    with contextlib.suppress(TypeError, OSError):   # TypeError: no server (its pid is None)
        os.kill(forkserver._forkserver._forkserver_pid, signal.SIGKILL)
    for server in (forkserver._forkserver, resource_tracker._resource_tracker):
        try:
            server._stop()
        except (AttributeError, OSError):
            pass
