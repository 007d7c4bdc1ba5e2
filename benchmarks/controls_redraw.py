#!/usr/bin/env python3
"""How long a live control takes to redraw (autograder.controls; target: under 0.5 s on a laptop CPU).

    .venv/bin/python benchmarks/controls_redraw.py              # every control, 5 moves each
    .venv/bin/python benchmarks/controls_redraw.py --repeats 9

For each notebook with a control cell: its code cells up to that cell run in this process (matplotlib's
Agg backend), then each control is moved through a few values, one at a time, the others at their
defaults, and each call of the demo function is timed: the computation, its printing, and the figure
rendered to PNG as the inline backend does (what a frontend then receives). Not timed: the widget
messages between the kernel and the page (a few milliseconds on loopback). The first move to a value
whose cached part (02's uninterrupted run per learning rate) is not yet computed is reported apart.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402

# notebook, control cell, demo function, {control: values to move it through}
CONTROLS = [
    ("02_adam_resume", "code-03a", "resume_jump_demo", {"stop": [50, 100, 200, 250], "lr": [0.01, 0.02, 0.1, 0.2]}),
    ("05_atomic_writes", "code-09a", "crash_demo",
     {"kill_at": [10, 90], "temp_file_and_replace": [True], "fsync_file": [True], "fsync_directory": [True]}),
    ("06_data_ledger", "code-03a", "ledger_demo", {"crash_in_microbatch": [1, 2, 4], "prefetch": [1, 4, 8, 16]}),
    ("07_distributed_sampler", "code-04a", "rank_local_demo",
     {"old_world_size": [2, 5, 6, 8], "new_world_size": [1, 5, 6, 8], "drop_last": [True]}),
]


def _show_as_inline() -> None:
    """plt.show() as matplotlib-inline does it: the figure rendered to PNG, then closed."""
    for number in plt.get_fignums():
        plt.figure(number).canvas.print_figure(io.BytesIO(), format="png", bbox_inches="tight")
    plt.close("all")


def notebook_namespace(name: str, upto: str) -> dict:
    nb = nbformat.read(str(ROOT / "solutions" / name / f"{name}.ipynb"), as_version=4)
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(cell.source, f"<{name}:{cell.get('id')}>", "exec"), namespace)
        if cell.get("id") == upto:
            break
    plt.show = _show_as_inline
    namespace["plt"].show = _show_as_inline
    plt.close("all")
    return namespace


def timed(function, **values) -> float:
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        function(**values)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per value (median)")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; median of {args.repeats} per value")
    print(f"{'notebook':24s} {'control':16s} {'first move':>10s} {'median':>8s} {'worst':>8s}")
    worst_overall = 0.0
    for name, cell, function_name, moves in CONTROLS:
        namespace = notebook_namespace(name, cell)
        demo = namespace[function_name]
        for control, values in moves.items():
            firsts, medians = [], []
            for value in values:
                firsts.append(timed(demo, **{control: value}))
                medians.append(statistics.median(timed(demo, **{control: value}) for _ in range(args.repeats)))
            worst_overall = max(worst_overall, max(medians))
            print(f"{name:24s} {control:16s} {max(firsts):9.3f}s {statistics.median(medians):7.3f}s "
                  f"{max(medians):7.3f}s")
    print(f"slowest redraw (median per value): {worst_overall:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
