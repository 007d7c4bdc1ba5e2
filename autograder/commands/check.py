"""``workbook-check``: grade my notebook, the way the grader will.

It mirrors ``nbgrader autograde``: test cells are restored from the released notebook, each cell
runs with a time limit in a fresh kernel, and every test cell is scored by nbgrader's own rule. On
top of that it survives what a learner's code can do to a kernel: a cell that loops forever or
kills the kernel costs that cell, the kernel is restarted, earlier good cells are replayed, and
grading goes on.

    workbook-check                      # every notebook in notebooks/
    workbook-check 01                   # notebooks whose name starts with 01
    workbook-check path/to/mine.ipynb   # one file
    workbook-check --json 01            # machine-readable, schema below

Exit status 0 only when every test cell of every notebook checked passed.

JSON schema (``"schema": "workbook-check/1"``)::

    {"schema": "workbook-check/1", "passed": bool, "score": float, "max_score": float,
     "notebooks": [{"path": str, "assignment": str, "score": float, "max_score": float,
                    "passed": bool, "error": str | null,
                    "tests": [{"grade_id": str, "exercise": str, "points": float,
                               "max_points": float, "passed": bool, "message": str}]}]}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from autograder.contract import (DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS, Scored, exercise_of, failure_message,
                                 is_answer_cell, is_test_cell, nbgrader_meta, read_notebook, score_test_cell)
from autograder.course import RELEASE_DIR, SOLUTIONS_DIR, STUDENT_DISTRIBUTION, matching

SCHEMA = "workbook-check/1"


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
class NotebookResult(Scored):
    PARTS = "tests"

    path: str
    assignment: str
    tests: list[TestResult]
    error: str | None = None  # a problem with the notebook as a whole
    executed: object = dataclasses.field(default=None, repr=False)  # the run notebook, for tests

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


def reference_notebook(path: Path) -> Path | None:
    """The released notebook a submission was made from, found by its file name."""
    for root in (RELEASE_DIR, SOLUTIONS_DIR):
        candidate = root / path.stem / path.name
        if candidate.exists() and candidate.resolve() != path.resolve():
            return candidate
    return None


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


def grade_notebook(path: str | Path, timeout: int = DEFAULT_CELL_TIMEOUT,
                   reference: str | Path | None = None) -> NotebookResult:
    """Execute ``path`` in a fresh kernel and score its test cells. Never raises for bad input."""
    path = Path(path)
    ref_path = Path(reference) if reference else reference_notebook(path)
    ref_nb = read_notebook(ref_path)[0] if ref_path else None

    nb, problem = read_notebook(path)
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


# ---- the command ---------------------------------------------------------------------------------

def find_notebooks(selectors: list[str], root: Path | None = None) -> list[Path]:
    """Files named on the command line, or the learner's notebooks whose name starts with a selector: in a
    clone of the repository those in notebooks/; with the student distribution (no repository), the
    assignments NAME/NAME.ipynb in the current folder, where nbgrader's fetch (the hub's Assignments tab
    too) puts them."""
    where = ""
    if root is None and STUDENT_DISTRIBUTION:
        root, assignments = Path.cwd(), {nb.stem for nb in RELEASE_DIR.glob("*/*.ipynb")}
        released = {nb.stem: nb for nb in sorted(root.glob("*/*.ipynb")) if nb.stem in assignments}
        where = (f" in {root} (workbook-check looks for NAME/NAME.ipynb in the folder it runs in: run it in "
                 f"the folder that holds your assignment folders, or give the notebook's path)")
        if not released and not selectors:
            raise SystemExit(f"workbook-check: no assignment notebook{where}")
    else:
        released = {nb.stem: nb for nb in sorted((root or RELEASE_DIR).glob("*/*.ipynb"))}
    found: list[Path] = []
    for selector in selectors or [None]:
        if selector is not None and (selector.endswith(".ipynb") or Path(selector).exists()):
            found.append(Path(selector))
        else:
            found += [released[name] for name in matching([selector] if selector else [], list(released),
                                                          "workbook-check", where)]
    return found


def format_table(result: NotebookResult) -> str:
    lines = [f"{result.assignment}: {result.score:g} / {result.max_score:g} points"]
    if result.error:
        lines.append(f"  problem: {result.error}")
    width = max([len(t.grade_id) for t in result.tests] + [7])
    lines.append(f"  {'grade_id':<{width}}  points  message")
    for t in result.tests:
        mark = "ok" if t.passed else "FAILED"
        score = f"{t.points:g}/{t.max_points:g}"
        message = t.message if not t.passed else ""
        lines.append(f"  {t.grade_id:<{width}}  {score:>6}  {mark}{'  ' + message if message else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files, or name prefixes such as 01 (default: all)")
    parser.add_argument("--json", action="store_true", help="print results as JSON (schema workbook-check/1)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    results = []
    for path in find_notebooks(args.notebooks):
        result = grade_notebook(path, timeout=args.timeout)
        results.append(result)
        if not args.json:
            print(format_table(result), flush=True)
            print()
    passed = bool(results) and all(r.passed for r in results)
    if args.json:
        print(json.dumps({
            "schema": SCHEMA,
            "passed": passed,
            "score": sum(r.score for r in results),
            "max_score": sum(r.max_score for r in results),
            "notebooks": [r.to_json() for r in results],
        }, indent=2))
    else:
        total = sum(r.score for r in results), sum(r.max_score for r in results)
        print(f"{'all passed' if passed else 'not all passed'}: {total[0]:g} / {total[1]:g} points")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
