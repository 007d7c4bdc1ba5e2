"""The process that notebook 07's ranks fork from, started as early as a notebook likes.

A ``forkserver`` imports torch and ``autograder.gloo_demo`` once (about a second); every rank
then forks from it in milliseconds. This module imports neither, so a notebook can start the
server before its own imports: the server's import and the kernel's then run side by side on
two cores instead of one after the other.
"""

from __future__ import annotations

import multiprocessing
import sys

RANK_MODULE = "autograder.gloo_demo"   # where the ranks' entry point lives


def start_rank_server() -> str:
    """Start the rank server if it is not running yet; return the start method ranks use.

    'forkserver' on Linux and macOS. Windows has no forkserver: 'spawn' (nothing to start).
    """
    if sys.platform == "win32":
        return "spawn"
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([RANK_MODULE])  # no-op once running
    forkserver.ensure_running()
    return "forkserver"
