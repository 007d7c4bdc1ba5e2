"""Live controls on a notebook's demo, for a teacher asking the room "and if ...?".

    from autograder.controls import live, slider, toggle

    def ledger_demo(crash_in_microbatch=3, prefetch=0):
        ...                       # computes, prints its numbers, shows its figure with plt.show()

    live(ledger_demo, crash_in_microbatch=slider(3, 1, 4, "crash in microbatch"),
         prefetch=slider(0, 0, 16, "prefetch"))

With a widget frontend (JupyterLab, Voilà: ``workbook.py present``) the cell shows the controls and
an output area; moving a control runs ``demo`` again with the new values (the real computation, not
a table) and replaces its numbers and figure. A run that takes a while shows "working…" and greys the
controls out until it is done; the page itself stays responsive (the kernel is the one that is busy).

Without one (nbclient: nbgrader's autograde and Validate, ``workbook-check``, the static HTML of
``workbook.py demo``, the tests) the cell calls ``demo`` once with the defaults, exactly as if the
notebook called it itself: its output is the demo's output, and ipywidgets is not even imported, so
grading neither depends on widgets nor gets slower.

How a kernel tells (nothing a grader or runner has to set): widgets are shown only in an IPython
kernel, and only when the cell was sent by JupyterLab or Jupyter Notebook 7 (their execute requests
carry the cell's id in the message metadata; nbclient's carry none), or the kernel was started by
Voilà (which sets the CGI-style ``SERVER_SOFTWARE=voila/<version>`` in the kernel's environment), or a
widget frontend has already opened ipywidgets' control channel (``jupyter.widget.control``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

SLOW_S = 0.5   # a redraw slower than this keeps "working…" visible long enough to read


# ---- controls, described without importing ipywidgets ---------------------------------------------

@dataclass(frozen=True)
class Control:
    """A control's default and how to build its widget (only when a widget frontend shows it)."""
    kind: str                 # "int", "float", "log", "toggle", "dropdown"
    default: Any
    label: str = ""
    options: dict = field(default_factory=dict)

    def widget(self):
        import ipywidgets as widgets

        common = {"value": self.default, "description": self.label,
                  "style": {"description_width": "initial"}, "layout": {"width": "28em"}}
        if self.kind == "int":
            return widgets.IntSlider(continuous_update=False, **self.options, **common)
        if self.kind == "float":
            return widgets.FloatSlider(continuous_update=False, **self.options, **common)
        if self.kind == "log":
            return widgets.FloatLogSlider(continuous_update=False, **self.options, **common)
        if self.kind == "toggle":
            common.pop("layout")
            return widgets.Checkbox(indent=False, **common)
        if self.kind == "dropdown":
            return widgets.Dropdown(options=self.options["choices"], **common)
        raise ValueError(f"unknown control kind {self.kind!r}")


def slider(default: int, low: int, high: int, label: str = "", step: int = 1) -> Control:
    """An integer slider from ``low`` to ``high``."""
    return Control("int", default, label, {"min": low, "max": high, "step": step})


def float_slider(default: float, low: float, high: float, label: str = "", step: float = 0.01) -> Control:
    return Control("float", default, label, {"min": low, "max": high, "step": step})


def log_slider(default: float, low_exponent: float, high_exponent: float, label: str = "",
               step: float = 0.1, base: float = 10) -> Control:
    """A slider over ``base ** exponent``, for a learning rate and other scales."""
    return Control("log", default, label, {"min": low_exponent, "max": high_exponent, "step": step, "base": base})


def toggle(default: bool, label: str = "") -> Control:
    return Control("toggle", bool(default), label)


def dropdown(default: Any, choices, label: str = "") -> Control:
    """``choices``: a list of values, or of (label, value) pairs."""
    return Control("dropdown", default, label, {"choices": list(choices)})


def default_of(control) -> Any:
    """A Control's default, or an ipywidgets widget's current value."""
    return control.default if isinstance(control, Control) else control.value


# ---- is there a widget frontend? -------------------------------------------------------------------

def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


def _control_channel_open() -> bool:
    """Has a widget frontend opened ipywidgets' control comm with this kernel?"""
    try:
        from comm import get_comm_manager
        comms = get_comm_manager().comms.values()
    except Exception:  # no comm package, or a kernel without a comm manager
        return False
    return any(getattr(c, "target_name", None) == "jupyter.widget.control" for c in comms)


def widget_frontend() -> bool:
    """True where the controls can be shown and moved (see the module's docstring)."""
    kernel = _kernel()
    if kernel is None:
        return False                       # plain Python, IPython in a terminal
    if os.environ.get("SERVER_SOFTWARE", "").startswith("voila/"):
        return True                        # a kernel Voilà started for a page
    try:
        parent = kernel.get_parent()       # the execute request of the cell that is running
    except Exception:
        parent = {}
    if "cellId" in (parent or {}).get("metadata", {}):
        return True                        # JupyterLab / Notebook 7 sent this cell
    return _control_channel_open()


# ---- the live demo ---------------------------------------------------------------------------------

def live(demo: Callable[..., None], **controls) -> None:
    """Show ``demo``'s controls and its output, re-run on every change; without a widget frontend,
    call ``demo`` once with the defaults. ``controls``: keyword -> Control (or an ipywidgets widget)."""
    defaults = {name: default_of(control) for name, control in controls.items()}
    if not widget_frontend():
        demo(**defaults)
        return None
    _show(demo, controls)
    return None


def _show(demo, controls) -> None:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    built = {name: c.widget() if isinstance(c, Control) else c for name, c in controls.items()}
    status = widgets.HTML(value="", layout={"min_height": "1.6em"})
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox(list(built.values()), layout={"flex_flow": "row wrap"}), status, out])
    box.add_class("workbook-live")

    def redraw(_change=None) -> None:
        values = {name: w.value for name, w in built.items()}
        for w in built.values():
            w.disabled = True
        status.value = "<i>working…</i>"
        started = time.perf_counter()
        try:
            with out:
                out.clear_output(wait=True)
                demo(**values)
                plt.close("all")           # a figure the demo made but did not show must not pile up
        finally:
            for w in built.values():
                w.disabled = False
            took = time.perf_counter() - started
            status.value = f"<small>ran in {took:.2f} s</small>" if took >= SLOW_S else ""

    for w in built.values():
        w.observe(redraw, names="value")
    display(box)
    redraw()
