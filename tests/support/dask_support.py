"""A Dask scheduler of a test's own on 127.0.0.1, in a session of its own: started, and its address read from
the scheduler file it writes once it listens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DASK = str(Path(sys.executable).parent / "dask")


def start_scheduler(folder: Path, log=subprocess.DEVNULL, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """(the scheduler's process, its address); ended again if it never says its address (30 s)."""
    scheduler_file = folder / "scheduler.json"
    process = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                "--scheduler-file", str(scheduler_file)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        for _ in range(300):
            if scheduler_file.exists() and scheduler_file.stat().st_size:
                break
            time.sleep(0.1)
        return process, json.loads(scheduler_file.read_text())["address"]
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
