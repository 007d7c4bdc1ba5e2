"""autograder.controls without a widget frontend: a live demo is a plain call of the demo with the defaults.

The browser side (a control moved in JupyterLab and in workbook-present) is in test_browser.py.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from autograder import controls
from browser_support import ROOT, direct_calls


def demo(steps=3, lr=0.05, flag=False, mode="a"):
    print(f"steps={steps} lr={lr} flag={flag} mode={mode}")


CONTROLS = {"steps": controls.slider(7, 1, 10, "steps"), "lr": controls.log_slider(0.01, -3, -1, "lr"),
            "flag": controls.toggle(True, "flag"), "mode": controls.dropdown("b", ["a", "b"], "mode")}


def _stdout(function, *args, **kwargs) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        function(*args, **kwargs)
    return out.getvalue()


def test_without_a_frontend_live_calls_the_demo_once_with_the_defaults():
    assert not controls.widget_frontend()
    shown = _stdout(controls.live, demo, **CONTROLS)
    assert shown == _stdout(demo, steps=7, lr=0.01, flag=True, mode="b")


def test_without_a_frontend_ipywidgets_is_not_even_imported():
    code = ("import sys; from autograder.controls import live, slider; "
            "live(lambda n: print(n), n=slider(4, 0, 9)); print('ipywidgets' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert shown.stdout.split() == ["4", "False"] and not shown.stderr


# Each notebook's control cell, and a direct call of its demo function with the controls' defaults.
CONTROL_CELLS = [("02_adam_resume", "code-03a", "resume_jump_demo(stop=150, lr=0.05)"),
                 ("05_atomic_writes", "code-09a", "crash_demo(kill_at=50, temp_file_and_replace=False, "
                                                  "fsync_file=False, fsync_directory=False)"),
                 ("06_data_ledger", "code-03a", "ledger_demo(crash_in_microbatch=3, prefetch=0)"),
                 ("07_distributed_sampler", "code-04a", "rank_local_demo(old_world_size=4, new_world_size=3, "
                                                        "drop_last=False)")]


@pytest.mark.parametrize("name, cell_id, call", CONTROL_CELLS, ids=[c[0] for c in CONTROL_CELLS])
def test_a_control_cell_under_nbclient_prints_and_draws_what_a_direct_call_does(name, cell_id, call):
    notebook = ROOT / "notebooks" / name / f"{name}.ipynb"
    cell, direct = direct_calls(notebook, cell_id, [call])
    assert cell["stdout"] and cell["stdout"] == direct["stdout"]
    assert len(cell["pngs"]) == 1 and cell["pngs"] == direct["pngs"]
    assert not any("widget" in mime for mime in cell["mimes"]), cell["mimes"]
