"""The notebooks of the workbook, found on disk so new ones are tested without new code."""

import fcntl
import os
import shutil
import sys
from pathlib import Path

import nbformat

from autograder.contract import is_answer_cell, is_test_cell, nbgrader_meta, with_tools_on_path
from autograder.course import NOTEBOOKS, RELEASE_DIR, REPO_ROOT

ROOT = REPO_ROOT
SOLUTIONS = [notebook.source() for notebook in NOTEBOOKS]
RELEASED = [notebook.source(RELEASE_DIR) for notebook in NOTEBOOKS]


def graded_notebooks(paths):
    """Only notebooks with autograded test cells (an orientation notebook may have none)."""
    return [p for p in paths if any(map(is_test_cell, nbformat.read(p, 4).cells))]


def fill_answers(released_path, answers: dict):
    """A learner's submission: the released notebook with answer cells replaced by ``answers``."""
    nb = nbformat.read(released_path, as_version=4)
    for cell in nb.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def solution_answers(solution_path) -> dict:
    """grade_id -> source of each answer cell of a solution notebook."""
    nb = nbformat.read(solution_path, as_version=4)
    return {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if is_answer_cell(c)}


# ---- a temporary nbgrader course, built in code (nbgrader's own tests do the same) ----------------

def nbgrader_cell(source: str, grade_id: str, *, solution=False, grade=False, points=0, markdown=False):
    """A cell with nbgrader metadata: an answer cell (solution=True) or a locked test cell (grade=True)."""
    make = nbformat.v4.new_markdown_cell if markdown else nbformat.v4.new_code_cell
    cell = make(source)
    cell.metadata["nbgrader"] = {"grade": grade, "solution": solution, "locked": not solution,
                                 "grade_id": grade_id, "schema_version": 3,
                                 **({"points": points} if grade else {})}
    return cell


def source_notebook(cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def run_nbgrader(course: Path, *args: str, timeout: int = 600, env: dict | None = None):
    """``nbgrader ARGS`` in ``course`` with this environment's bin/ first on PATH (for alembic)."""
    import subprocess

    return subprocess.run([str(Path(sys.executable).parent / "nbgrader"), *args], cwd=course, capture_output=True,
                          text=True, timeout=timeout, env=with_tools_on_path(env))


def new_course(folder: Path, assignments: dict) -> Path:
    """A course folder with the workbook's nbgrader_config.py and ``{name: source notebook}``
    generated into notebooks/ and into the course's gradebook, as an instructor would."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", folder)
    for name, nb in assignments.items():
        target = folder / "solutions" / name / f"{name}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(nb, Path):
            shutil.copy(nb, target)
        else:
            nbformat.write(nb, target)
        nbgrader_in_process(folder, "generate_assignment", name)
    return folder


def nbgrader_in_process(course: Path, command: str, *args: str) -> None:
    """``nbgrader COMMAND ARGS`` run by nbgrader's own app class in this process: the same
    code as the command line without a second interpreter importing nbgrader (seconds each)."""
    import importlib

    module = importlib.import_module(f"nbgrader.apps.{command.replace('_', '')}app")
    app_class = next(getattr(module, n) for n in dir(module)
                     if n.lower() == command.replace("_", "") + "app")
    os.environ.update(with_tools_on_path())   # nbgrader shells out to `alembic` for a new gradebook
    here = os.getcwd()
    os.chdir(course)
    try:
        app = app_class()
        app.initialize([*args, f"--CourseDirectory.root={course}", "--log-level=WARN"])
        app.start()
    except SystemExit as exc:
        raise AssertionError(f"nbgrader {command} {' '.join(args)} failed (exit {exc.code})") from None
    finally:
        os.chdir(here)


def submit(course: Path, student: str, name: str, submission) -> Path:
    """Put a submission in submitted/STUDENT/NAME/: a notebook, or raw text (a broken file)."""
    path = course / "submitted" / student / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(submission, str):
        path.write_text(submission)
    else:
        nbformat.write(submission, path)
    return path


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder built by the first pytest-xdist worker that needs it and shared by the others
    (read-only): each course costs dozens of kernel starts, too many to repeat per worker."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the temp folder every worker of this run shares
    folder = root / f"class_grading_{name}"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            (folder / ".built").touch()
    return folder


def own_copy(course: Path, folder: Path) -> Path:
    """A private copy of a shared graded course, for a test that writes into it."""
    return Path(shutil.copytree(course, folder / "course"))
