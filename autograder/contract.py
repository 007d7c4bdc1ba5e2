"""The grading contract: what a notebook's cells are, how a test cell scores, what a learner is told.

Shared by the judge, the nbgrader plug-ins, the commands and the tests, so each reads a notebook the
same way. The contract itself (an answer cell's ``grade_id`` is the name it defines; its test cells
are ``test_<name>[_aspect]``) must never change: instructors' gradebooks hold released test cells.
Imports nothing heavy: the learner's kernel imports check modules that may import this.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

DEFAULT_CELL_TIMEOUT = 60  # seconds; the slowest cell of any notebook is far below this

# Library warnings are not errors: keep them out of graded output (nbgrader
# scores any stderr in a test cell as zero). nbgrader_config.py uses the same list.
KERNEL_EXTRA_ARGUMENTS = [
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.log_level=ERROR",  # no start-up chatter on the terminal
    "--InteractiveShellApp.exec_lines=import warnings; warnings.simplefilter('ignore')",
]

# Hidden tests sit between these markers in a test cell (nbgrader's own convention).
HIDDEN_BEGIN = "BEGIN HIDDEN TESTS"
HIDDEN_END = "END HIDDEN TESTS"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    meta = nbgrader_meta(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell.get("cell_type") == "code"


def is_answer_cell(cell) -> bool:
    meta = nbgrader_meta(cell)
    return bool(meta.get("solution")) and cell.get("cell_type") == "code"


def exercise_of(test_grade_id: str, exercise_names: set[str]) -> str:
    """``test_restore_state_twice`` belongs to ``restore_state``: the longest matching name."""
    stem = test_grade_id.removeprefix("test_")
    matches = [n for n in exercise_names if stem == n or stem.startswith(n + "_")]
    return max(matches, key=len) if matches else stem


def read_notebook(path: Path):
    """(notebook, None), or (None, why it is not a readable notebook) for a learner to read."""
    import nbformat
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"{path.name} could not be read as a notebook ({first_line[:200]})"
    if not isinstance(nb.get("cells"), list):
        return None, f"{path.name} is not a notebook: it has no list of cells"
    return nb, None


class Scored:
    """A graded whole's totals: the sums over its parts (each with ``points`` and ``max_points``), the
    attribute ``PARTS`` names (a notebook's test cells, a platform result's rows)."""

    PARTS = ""

    @property
    def score(self) -> float:
        return sum(part.points for part in getattr(self, self.PARTS))

    @property
    def max_score(self) -> float:
        return sum(part.max_points for part in getattr(self, self.PARTS))


def score_test_cell(cell) -> tuple[float, float]:
    """(points, max points) of a test cell by nbgrader's rule (``nbgrader.utils.determine_grade``):
    zero when it shows an error or writes to stderr, else full marks. Importing nbgrader takes
    over a second, so it is imported only for a cell with a result that could be a partial grade."""
    max_points = float(nbgrader_meta(cell)["points"])
    for output in cell.outputs:
        if output.output_type == "error" or (output.output_type == "stream" and output.get("name") == "stderr"):
            return 0.0, max_points
        if output.output_type == "execute_result":
            from nbgrader.utils import determine_grade
            points, max_points = determine_grade(cell)
            return float(points or 0), float(max_points)
    return max_points, max_points


def failure_message(cell, exercise: str, answer_names: set[str]) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            ename, evalue = output.get("ename", "Error"), _ANSI.sub("", output.get("evalue", ""))
            if ename == "NotImplementedError":
                return f"not answered yet: the answer cell for `{exercise}` still raises NotImplementedError"
            if ename == "NameError" and f"'{exercise}'" in evalue:
                if exercise in answer_names:
                    return (f"`{exercise}` is not defined: the answer cell must define a function "
                            f"or class named exactly `{exercise}` (was it renamed, or did the cell fail?)")
                return f"the answer cell for `{exercise}` is missing from the notebook (was it deleted?)"
            if ename == "CellTimeoutError":
                return evalue or "this cell ran out of time"
            return f"{ename}: {evalue}" if evalue else ename
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            text = _ANSI.sub("", output.get("text", "")).strip().splitlines()
            return "the cell wrote to stderr, which the grader scores as zero: " + (text[0] if text else "")
    return ""


def with_tools_on_path(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with this environment's bin/ first on PATH: nbgrader shells
    out to ``alembic`` when it makes a gradebook."""
    env = dict(os.environ if env is None else env)
    bin_dir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env
