"""Run a notebook the way the grader does and score its test cells.

Used by the self-check command and the test suite. It mirrors ``nbgrader
autograde``: test cells are restored from the released notebook, each cell runs
with a time limit in a fresh kernel, and every test cell is scored by nbgrader's
own rule (``determine_grade``). On top of that it survives what a learner's code can do
to a kernel: a cell that loops forever or kills the kernel costs that cell, the
kernel is restarted, earlier good cells are replayed, and grading goes on.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

REPO_ROOT = Path(__file__).resolve().parent.parent
RELEASE_DIR = REPO_ROOT / "notebooks"
SOLUTIONS_DIR = REPO_ROOT / "solutions"

DEFAULT_CELL_TIMEOUT = 60  # seconds; the slowest cell of any notebook is far below this

# Library warnings are not errors: keep them out of graded output (nbgrader
# scores any stderr in a test cell as zero). nbgrader_config.py uses the same list.
KERNEL_EXTRA_ARGUMENTS = [
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.log_level=ERROR",  # no start-up chatter on the terminal
    "--InteractiveShellApp.exec_lines=import warnings; warnings.simplefilter('ignore')",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class TestResult:
    grade_id: str
    exercise: str
    points: float
    max_points: float
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points


@dataclasses.dataclass
class NotebookResult:
    path: str
    assignment: str
    tests: list[TestResult]
    error: str | None = None  # a problem with the notebook as a whole
    executed: object = dataclasses.field(default=None, repr=False)  # the run notebook, for tests

    @property
    def score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_points for t in self.tests)

    @property
    def passed(self) -> bool:
        return self.error is None and all(t.passed for t in self.tests)

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "assignment": self.assignment,
            "score": self.score,
            "max_score": self.max_score,
            "passed": self.passed,
            "error": self.error,
            "tests": [dict(dataclasses.asdict(t), passed=t.passed) for t in self.tests],
        }


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


def reference_notebook(path: Path) -> Path | None:
    """The released notebook a submission was made from, found by its file name."""
    for root in (RELEASE_DIR, SOLUTIONS_DIR):
        candidate = root / path.stem / path.name
        if candidate.exists() and candidate.resolve() != path.resolve():
            return candidate
    return None


def _read_notebook(path: Path):
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # not JSON, not a notebook, unreadable
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"{path.name} could not be read as a notebook ({first_line[:200]})"
    if not isinstance(nb.get("cells"), list):
        return None, f"{path.name} is not a notebook: it has no list of cells"
    return nb, None


def _zero_all(reference, path: Path, message: str) -> NotebookResult:
    names = {nbgrader_meta(c)["grade_id"] for c in reference.cells if is_answer_cell(c)}
    tests = [
        TestResult(
            nbgrader_meta(c)["grade_id"],
            exercise_of(nbgrader_meta(c)["grade_id"], names),
            0.0,
            float(nbgrader_meta(c).get("points", 0)),
            message,
        )
        for c in reference.cells
        if is_test_cell(c)
    ]
    return NotebookResult(str(path), path.stem, tests, error=message)


def _restore_test_cells(nb, reference) -> list[str]:
    """Put back the released source of every test cell, as nbgrader's autograde does.

    Returns the grade_ids of test cells missing from the submission.
    """
    released = {nbgrader_meta(c)["grade_id"]: c for c in reference.cells if is_test_cell(c)}
    present = set()
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id")
        if gid in released:
            cell.source = released[gid].source
            cell.metadata["nbgrader"] = dict(released[gid].metadata["nbgrader"])
            present.add(gid)
    return [gid for gid in released if gid not in present]


class CellRunner:
    """Executes cells one by one; on a hang or a dead kernel, restarts and replays."""

    def __init__(self, nb, workdir: Path, timeout: int):
        self.nb = nb
        self.client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=True,
            interrupt_on_timeout=False,
            extra_arguments=KERNEL_EXTRA_ARGUMENTS,
            resources={"metadata": {"path": str(workdir)}},
        )
        self.timeout = timeout
        self.good_cells: list[int] = []  # ran without error: replayed after a restart

    def run_all(self) -> dict[int, str]:
        """Execute every code cell; return {cell index: why it could not finish}."""
        problems: dict[int, str] = {}
        self._start()
        try:
            for index, cell in enumerate(self.nb.cells):
                if cell.cell_type != "code":
                    continue
                problem = self._execute(index, cell)
                if problem:
                    problems[index] = problem
                    self._restart_and_replay()
                elif not any(o.get("output_type") == "error" for o in cell.outputs):
                    self.good_cells.append(index)
        finally:
            self._stop()
        return problems

    def _execute(self, index: int, cell) -> str | None:
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            return f"this cell was stopped after {self.timeout} s: is there a loop that never ends?"
        except DeadKernelError:
            return "the kernel died while running this cell (a crash, os._exit or running out of memory)"
        return None

    def _start(self, attempts: int = 3):
        # A kernel can die before it answers when a port it was given is taken meanwhile by
        # another process (on a busy machine running many kernels): try again on new ports.
        for attempt in range(1, attempts + 1):
            try:
                self.client.km = self.client.create_kernel_manager()
                # The kernel's own stderr (start-up notices, a dying kernel's last words) is not
                # the learner's output: cell output reaches us over the kernel protocol instead.
                self.client.start_new_kernel(stderr=subprocess.DEVNULL)
                self.client.start_new_kernel_client()
                return
            except Exception:
                self._stop()
                if attempt == attempts:
                    raise

    def _stop(self):
        try:
            self.client._cleanup_kernel()
        except Exception:
            pass

    def _restart_and_replay(self):
        self._stop()
        self._start()
        for index in self.good_cells:
            cell = nbformat.from_dict(json.loads(json.dumps(self.nb.cells[index])))
            try:
                self.client.execute_cell(cell, index, store_history=False)
            except (CellTimeoutError, DeadKernelError):
                break


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


def grade_notebook(path: str | Path, timeout: int = DEFAULT_CELL_TIMEOUT,
                   reference: str | Path | None = None) -> NotebookResult:
    """Execute ``path`` in a fresh kernel and score its test cells. Never raises for bad input."""
    path = Path(path)
    ref_path = Path(reference) if reference else reference_notebook(path)
    ref_nb = _read_notebook(ref_path)[0] if ref_path else None

    nb, problem = _read_notebook(path)
    if nb is None:
        if ref_nb is None:
            return NotebookResult(str(path), path.stem, [], error=problem)
        return _zero_all(ref_nb, path, problem)

    missing_tests = _restore_test_cells(nb, ref_nb) if ref_nb is not None else []
    answer_names = {nbgrader_meta(c).get("grade_id") for c in nb.cells if is_answer_cell(c)}
    expected_names = answer_names | (
        {nbgrader_meta(c)["grade_id"] for c in ref_nb.cells if is_answer_cell(c)} if ref_nb else set()
    )

    workdir = Path(tempfile.mkdtemp(prefix="selfcheck-"))
    try:
        problems = CellRunner(nb, workdir, timeout).run_all()
    except Exception as exc:  # the kernel could not even start
        shutil.rmtree(workdir, ignore_errors=True)
        message = f"the notebook could not be run: {type(exc).__name__}: {exc}"
        return _zero_all(ref_nb or nb, path, message)
    shutil.rmtree(workdir, ignore_errors=True)

    answer_problems = {
        nbgrader_meta(nb.cells[i]).get("grade_id"): why for i, why in problems.items() if is_answer_cell(nb.cells[i])
    }
    tests: list[TestResult] = []
    for index, cell in enumerate(nb.cells):
        if not is_test_cell(cell):
            continue
        meta = nbgrader_meta(cell)
        exercise = exercise_of(meta["grade_id"], expected_names)
        points, max_points = score_test_cell(cell)
        message = problems.get(index) or failure_message(cell, exercise, answer_names)
        if index in problems:
            points = 0.0
        elif points < max_points and exercise in answer_problems:
            message = f"the answer cell for `{exercise}` did not finish: {answer_problems[exercise]}"
        tests.append(TestResult(meta["grade_id"], exercise, float(points or 0), float(max_points), message))
    if ref_nb is not None:
        for gid in missing_tests:
            cell = next(c for c in ref_nb.cells if nbgrader_meta(c).get("grade_id") == gid)
            tests.append(TestResult(gid, exercise_of(gid, expected_names), 0.0,
                                    float(nbgrader_meta(cell).get("points", 0)),
                                    "this test cell is missing from the notebook: get a fresh copy of it "
                                    "from the released notebook"))
    return NotebookResult(str(path), path.stem, tests, executed=nb)
