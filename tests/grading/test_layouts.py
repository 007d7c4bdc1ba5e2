"""The same grade in every layout an instructor uses (docs/grading.md, "Where the course and the package lie").

One class (an honest and a hostile student for each notebook that resumes in a fresh process: 02, 03 and 08)
is graded with the real ``nbgrader autograde`` (and, on a cluster, ``workbook-grade --scheduler``) in several
layouts, and every gradebook must hold the same score cell by cell:

- ``elsewhere``: the course folder holds no package; nbgrader imports the one installed in the environment
  (this checkout's editable install): the README's one copy, and a hub's shared environment;
- ``course copy``: the course folder is a clone that holds its own ``autograder/`` while the environment's
  install is another checkout's (the layout whose resume tests once scored zero with ConnectionResetError),
  graded by ``nbgrader autograde`` and by ``workbook-grade --jobs 2``;
- ``student wheel``: the package of the student distribution's wheel, installed outside the course;
- ``dask worker``: judged by a Dask worker that runs from another checkout of the same course.

Where the course's own ``autograder/`` holds other code than the one imported, grading refuses before it
starts, naming both, with ``workbook-grade`` and ``nbgrader autograde`` alike.

The hostile students hand their checkpoint over through a process their save leaves running (its command
line holds the checkpoint) and write a placeholder file: their resume must fail in every layout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import REPO_ROOT
from dask_support import start_scheduler
from notebook_files import fill_answers, nbgrader_in_process, run_nbgrader, solution_answers, submit

pytestmark = [pytest.mark.extended,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")]

NOTEBOOKS = ("02_adam_resume", "03_complete_checkpoint", "08_commit_boundary")
PYTHON = sys.executable

# The save leaves a process whose command line holds the checkpoint, and writes a placeholder; the resume
# looks for it in /proc. Where a fresh process could read another process, this passed the resume tests.
_HAND_OVER = '''
def _hand_over(data):
    import base64, os, sys, time
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)",
                                      "HANDOVER:" + base64.b64encode(data).decode()])
        os._exit(0)
    time.sleep(0.3)


def _handed_over():
    import base64, os
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                for arg in f.read().split(b"\\0"):
                    if arg.startswith(b"HANDOVER:"):
                        return base64.b64decode(arg[len(b"HANDOVER:"):])
        except OSError:
            pass
    raise FileNotFoundError("nothing was handed over")
'''
HOSTILE = {
    "02_adam_resume": {
        "save_checkpoint": _HAND_OVER + '''
def save_checkpoint(path, w, state):
    import io
    buffer = io.BytesIO()
    np.savez(buffer, w=w, m=state["m"], v=state["v"], t=state["t"])
    _hand_over(buffer.getvalue())
    with open(path, "wb") as f:
        f.write(b"placeholder")
''',
        "resume_from_full_checkpoint": '''
def resume_from_full_checkpoint(path):
    import io
    with np.load(io.BytesIO(_handed_over())) as saved:
        return saved["w"].copy(), {"m": saved["m"].copy(), "v": saved["v"].copy(), "t": int(saved["t"])}
'''},
    "03_complete_checkpoint": {
        "save_checkpoint": _HAND_OVER + '''
def save_checkpoint(path, trainer):
    import io
    buffer = io.BytesIO()
    _honest_save(buffer, trainer)
    _hand_over(buffer.getvalue())
    with open(path, "wb") as f:
        f.write(b"placeholder")
''',
        "load_checkpoint": '''
def load_checkpoint(path, trainer):
    with open("handed_over.pt", "wb") as f:
        f.write(_handed_over())
    _honest_load("handed_over.pt", trainer)
'''},
    # A resume judged equivalent whatever it did.
    "08_commit_boundary": {"resume_equivalent": "def resume_equivalent(new_run, resume_run, total, crash_at, "
                                                "atol=0.0):\n    return True\n"},
}


def _answers(name: str, hostile: bool) -> dict:
    answers = solution_answers(REPO_ROOT / "solutions" / name / f"{name}.ipynb")
    if not hostile:
        return answers
    wrong = dict(HOSTILE[name])
    if name == "03_complete_checkpoint":      # the honest save and load, under other names, beside the hostile
        wrong["save_checkpoint"] = answers["save_checkpoint"].replace("def save_checkpoint(", "def _honest_save(") \
            + "\n" + wrong["save_checkpoint"]
        wrong["load_checkpoint"] = answers["load_checkpoint"].replace("def load_checkpoint(", "def _honest_load(") \
            + "\n" + wrong["load_checkpoint"]
    return {**answers, **wrong}


def _course(folder: Path, with_package: Path | None = None) -> Path:
    """A course folder as an instructor's clone holds it (nbgrader_config.py, solutions/, notebooks/, and
    ``with_package`` copied in as its autograder/), the class submitted."""
    folder.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", folder)
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in NOTEBOOKS:
        shutil.copytree(REPO_ROOT / "solutions" / name, folder / "solutions" / name, ignore=ignore)
    if with_package is not None:
        shutil.copytree(with_package, folder / "autograder", ignore=ignore)
    for name in NOTEBOOKS:
        nbgrader_in_process(folder, "generate_assignment", name)
        released = folder / "notebooks" / name / f"{name}.ipynb"
        for student, hostile in (("honest", False), ("hostile", True)):
            submit(folder, student, name, fill_answers(released, _answers(name, hostile)))
    return folder


def _scores(course: Path) -> dict:
    """(student, notebook, test cell) -> score, from the gradebook."""
    scores = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for name in NOTEBOOKS:
            for student in ("honest", "hostile"):
                notebook = gradebook.find_submission_notebook(name, name, student)
                for grade in notebook.grades:
                    if grade.cell.name.startswith("test_"):
                        scores[(student, name, grade.cell.name)] = (grade.score, grade.max_score)
    return scores


def _autograde(course: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = None
    for name in NOTEBOOKS:
        args = ["autograde", name, "--force"] + ([f"--CourseDirectory.root={course}"] if cwd else [])
        result = subprocess.run([str(Path(PYTHON).parent / "nbgrader"), *args], cwd=cwd or course,
                                capture_output=True, text=True, timeout=1200,
                                env={**(env or os.environ), "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"})
        if result.returncode:
            return result
    return result


def _other_checkout(folder: Path) -> Path:
    """A second checkout of the same course (the package and the solutions), as a worker machine holds it."""
    for part in ("autograder", "solutions"):
        shutil.copytree(REPO_ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__", "released"))
    return folder


def _student_wheel(folder: Path) -> Path:
    """The student distribution's wheel, installed (without its dependencies, which this environment has)
    into a folder of its own: what a hub's shared environment or a platform container imports."""
    from autograder.commands.student_package import build_student_package
    wheel = build_student_package(folder / "dist")
    target = folder / "site"
    subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), str(wheel)], check=True, capture_output=True)
    return target


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """Each layout's gradebook (or how it failed)."""
    root = tmp_path_factory.mktemp("layouts")
    results = {}

    course = _course(root / "elsewhere")
    run = _autograde(course)
    results["elsewhere"] = _scores(course) if run.returncode == 0 else run.stderr[-3000:]

    course = _course(root / "course copy", with_package=REPO_ROOT / "autograder")
    run = _autograde(course)
    results["course copy"] = _scores(course) if run.returncode == 0 else run.stderr[-3000:]

    course = _course(root / "course copy, two at a time", with_package=REPO_ROOT / "autograder")
    run = subprocess.run([PYTHON, "-m", "autograder.commands.grade", *NOTEBOOKS, "--course", str(course),
                          "--jobs", "2", "--no-summary"], capture_output=True, text=True, timeout=1800)
    results["workbook-grade --jobs 2"] = _scores(course) if run.returncode == 0 else run.stdout[-3000:] + run.stderr[-3000:]

    site = _student_wheel(root / "wheel")
    course = _course(root / "student wheel")
    run = _autograde(course, env={**os.environ, "PYTHONPATH": str(site)})
    results["student wheel"] = _scores(course) if run.returncode == 0 else run.stderr[-3000:]

    other = _other_checkout(root / "worker checkout")
    course = _course(root / "dask worker")
    scheduler, address = start_scheduler(root, (root / "scheduler.log").open("w"))
    worker = subprocess.Popen([PYTHON, "-m", "autograder.commands.worker", address, "--nworkers", "1"], cwd=other,
                              env={**os.environ, "PYTHONPATH": str(other)}, stdout=(root / "worker.log").open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run = subprocess.run([PYTHON, str(REPO_ROOT / "workbook.py"), "grade", *NOTEBOOKS, "--course", str(course),
                              "--scheduler", address, "--no-summary", "--wait-for-workers", "180"],
                             capture_output=True, text=True, timeout=1800)
        results["dask worker"] = _scores(course) if run.returncode == 0 else run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        for process in (worker, scheduler):
            os.killpg(process.pid, 9)
            process.wait()
    return results


def test_honest_work_scores_full_marks_and_the_hand_over_scores_nothing(graded):
    scores = graded["elsewhere"]
    assert isinstance(scores, dict), scores
    assert all(got == full for (student, _, _), (got, full) in scores.items() if student == "honest"), scores
    lost = sorted(cell for (student, _, cell), (got, full) in scores.items() if student == "hostile" and got < full)
    assert {"test_resume_from_full_checkpoint", "test_load_checkpoint"} <= set(lost), lost


@pytest.mark.parametrize("layout", ["course copy", "workbook-grade --jobs 2", "student wheel", "dask worker"])
def test_every_layout_grades_cell_by_cell_as_the_readme_layout_does(graded, layout):
    assert isinstance(graded[layout], dict), f"grading in the {layout} layout failed:\n{graded[layout]}"
    differ = {cell: (graded[layout].get(cell), score) for cell, score in graded["elsewhere"].items()
              if graded[layout].get(cell) != score}
    assert not differ, f"{layout}: (this layout, the README's) per cell: {differ}"


@pytest.fixture(scope="module")
def stale_course(tmp_path_factory) -> Path:
    """A course whose own autograder/ holds other code than the package this environment imports."""
    package = tmp_path_factory.mktemp("stale") / "autograder"
    shutil.copytree(REPO_ROOT / "autograder", package, ignore=shutil.ignore_patterns("__pycache__", "released"))
    with open(package / "checking.py", "a") as f:
        f.write("\n# an older or newer version of the course\n")
    return _course(tmp_path_factory.mktemp("stale-course") / "course", with_package=package)


def test_workbook_grade_refuses_a_course_whose_package_differs_from_the_one_imported(stale_course):
    run = subprocess.run([PYTHON, "-m", "autograder.commands.grade", NOTEBOOKS[0], "--course", str(stale_course),
                          "--no-summary"], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "grading refused" in run.stderr and str(stale_course / "autograder") in run.stderr
    assert str(REPO_ROOT / "autograder") in run.stderr and "pip install -e" in run.stderr
    assert not (stale_course / "autograded").exists()


def test_nbgrader_refuses_it_too_when_run_from_outside_the_course(stale_course, tmp_path):
    """From the course folder nbgrader imports the course's own copy (it puts its folder first on sys.path);
    from elsewhere it imports the environment's, and the judge refuses before anything is graded."""
    run = _autograde(stale_course, cwd=tmp_path)
    assert run.returncode != 0
    assert "grading refused" in run.stderr and str(stale_course / "autograder") in run.stderr
    with Gradebook(f"sqlite:///{stale_course / 'gradebook.db'}") as gradebook:
        scored = [(n, s) for n in NOTEBOOKS for s in ("honest", "hostile") if _score_or_none(gradebook, n, s)]
    assert not scored, f"graded despite the refusal: {scored}"


def _score_or_none(gradebook, name, student):
    from nbgrader.api import MissingEntry
    try:
        return gradebook.find_submission_notebook(name, name, student).score
    except MissingEntry:
        return None
