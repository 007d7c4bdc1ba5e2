"""The student distribution (``workbook.py release --student-package DIR``): what students get, and
that it works without the repository.

It is built into a temporary folder and its wheel installed into a fresh venv (``--no-deps``: torch and
the rest come from this environment through a .pth file, which does not run this environment's editable
install of the course), where ``workbook-check`` grades solution notebooks to full marks against the
released test cells packaged inside it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.commands.release import main as release_main
from autograder.commands.student_package import build_student_package
from autograder.course import NOTEBOOKS
from notebook_files import RELEASED, ROOT, SOLUTIONS, fill_answers, solution_answers

MARKER_LINE = re.compile(r"^\s*#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)\s*$", re.M)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("student-dist")
    return folder, build_student_package(folder)


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed and this environment's packages visible: its bin/."""
    venv = tmp_path_factory.mktemp("student-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_course_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--disable-pip-version-check", str(dist[1])], check=True, capture_output=True)
    return venv / "bin"


def _files(dist) -> dict[str, str]:
    """Every file students get, by name (wheel members as wheel:NAME), with its text."""
    folder, wheel = dist
    files = {str(p.relative_to(folder)): p.read_text(errors="replace")
             for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".whl"}
    with zipfile.ZipFile(wheel) as archive:
        files.update({f"wheel:{name}": archive.read(name).decode(errors="replace") for name in archive.namelist()})
    return files


def _blocks(begin: str, end: str) -> list[str]:
    """The bodies between ``### BEGIN ...`` and ``### END ...`` in every solution notebook's cells."""
    found = []
    for path in SOLUTIONS:
        for cell in nbformat.read(str(path), as_version=4).cells:
            found += re.findall(rf"^\s*### {begin}\s*\n(.*?)^\s*### {end}\s*$", cell.source, re.M | re.S)
    return [block.strip() for block in found if block.strip()]


def test_it_holds_every_released_notebook_a_wheel_and_a_readme(dist):
    folder, wheel = dist
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert names == {"README.md", wheel.name, *(f"notebooks/{p.parent.name}/{p.name}" for p in RELEASED)}
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        for released in RELEASED:
            packaged = f"autograder/released/{released.parent.name}/{released.name}"
            assert archive.read(packaged) == released.read_bytes(), f"{packaged} differs from notebooks/"
        entry_points = next(archive.read(m).decode() for m in members if m.endswith("entry_points.txt"))
    commands = {m for m in members if m.startswith("autograder/commands/")}
    assert commands == {"autograder/commands/__init__.py", "autograder/commands/check.py"}
    assert re.findall(r"^(\S+) =", entry_points, re.M) == ["workbook-check"]
    assert not [m for m in members if m.startswith(("solutions/", "tests/")) or "nbgrader_config" in m]
    assert {n.folder for n in NOTEBOOKS} == {m.split("/")[2] for m in members if m.startswith("autograder/released/")}


def test_no_file_holds_a_solution_or_a_hidden_test(dist):
    files = _files(dist)
    hidden, solutions = _blocks("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"), _blocks("BEGIN SOLUTION", "END SOLUTION")
    assert len(hidden) >= len(NOTEBOOKS) and len(solutions) >= len(NOTEBOOKS), "the solutions' blocks were not found"
    problems = []
    for name, text in files.items():
        sources = ([cell.source for cell in nbformat.reads(text, as_version=4).cells] if name.endswith(".ipynb")
                   else [text])
        for source in sources:
            problems += [f"{name}: a marker line {m.group(0).strip()!r}" for m in MARKER_LINE.finditer(source)]
            problems += [f"{name}: a hidden-test block of solutions/ ({block.splitlines()[0]!r}...)"
                         for block in hidden if block in source]
            problems += [f"{name}: a solution body of solutions/ ({block.splitlines()[0]!r}...)"
                         for block in solutions if len(block.splitlines()) > 1 and block in source]
    assert not problems, "\n".join(problems)


def test_workbook_check_grades_solutions_to_full_marks_against_the_packaged_release(installed, tmp_path):
    probe = ("import json, autograder.course as c; print(json.dumps([c.__file__, c.STUDENT_DISTRIBUTION, "
             "c.SOLUTIONS_DIR.exists()]))")
    where, student, solutions_here = json.loads(subprocess.run(
        [str(installed / "python"), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    assert where.startswith(str(installed.parent)) and student and not solutions_here
    # A learner's solved copy where nbgrader's fetch puts it (NAME/NAME.ipynb in the folder workbook-check runs
    # in), and the instructor's solution notebook itself, whose test cells carry the hidden tests: both are
    # graded against the released test cells packaged in the wheel.
    name = "00_start_here"
    solution = ROOT / "solutions" / name / f"{name}.ipynb"
    mine = tmp_path / name / f"{name}.ipynb"
    mine.parent.mkdir()
    nbformat.write(fill_answers(ROOT / "notebooks" / name / f"{name}.ipynb", solution_answers(solution)), str(mine))
    run = subprocess.run([str(installed / "workbook-check"), "--json", "00", str(solution)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600)
    report = json.loads(run.stdout)
    assert run.returncode == 0 and report["passed"], run.stdout + run.stderr[-2000:]
    assert [Path(nb["path"]).resolve() for nb in report["notebooks"]] == [mine.resolve(), solution]
    released_tests = [nbformat_grade_id(c) for c in nbformat.read(str(ROOT / "notebooks" / name / f"{name}.ipynb"),
                                                                  as_version=4).cells if nbformat_grade_id(c)]
    for notebook in report["notebooks"]:
        assert notebook["score"] == notebook["max_score"] > 0
        assert [t["grade_id"] for t in notebook["tests"]] == released_tests


def nbformat_grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta.get("grade_id") if meta.get("grade") else None


def test_workbook_check_says_where_it_looked_when_no_assignment_is_there(installed, tmp_path):
    run = subprocess.run([str(installed / "workbook-check"), "00"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert run.returncode != 0 and f"in {tmp_path}" in run.stderr
    assert "looks for NAME/NAME.ipynb in the folder it runs in" in run.stderr


def test_release_asks_for_the_folder_of_the_student_package():
    with pytest.raises(SystemExit, match="--student-package needs a folder"):
        release_main(["--student-package"])
