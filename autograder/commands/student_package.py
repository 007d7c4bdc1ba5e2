"""``workbook.py release --student-package DIR``: what students get, and nothing else.

    DIR/notebooks/NN_topic/NN_topic.ipynb    the released notebooks (a learner on their own opens these)
    DIR/torch_resume_workbook-VERSION+student-py3-none-any.whl
                                             ``pip install`` it: the checks every test cell imports, the
                                             sandbox they use, ``workbook-check``, and the released
                                             notebooks inside (what workbook-check grades against)
    DIR/README.md                            how to install and use it

Left out: ``solutions/`` (the instructor versions, with the solutions and the hidden tests), ``tests/``
(the fixtures hold right answers), ``nbgrader_config.py`` and the instructor's commands (grade, worker,
demo, present, release: they read solutions/ or a gradebook). The instructor's repository stays the one
source: the wheel is built from its ``autograder/`` and ``notebooks/`` as they are. A released notebook
that still carries a solution or a hidden-test block, or an output, stops the build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.contract import HIDDEN_BEGIN, HIDDEN_END
from autograder.course import NOTEBOOKS, PACKAGED_RELEASE_DIR, REPO_ROOT

# The only command a learner needs; the other console scripts are the instructor's.
STUDENT_COMMANDS = {"check.py"}
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", HIDDEN_BEGIN, HIDDEN_END)

README = """\
# {name} {version}: the student distribution

The course's notebooks and the package their test cells import, without solutions or hidden tests.

**A learner on your own** (Python 3.10 or newer):

    python3 -m venv .venv
    .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # small CPU build (Linux)
    .venv/bin/pip install {wheel}
    cd notebooks && ../.venv/bin/jupyter lab

Run the test cell under each exercise. To grade a whole notebook the way the grader will, run
`workbook-check 01` (or `../.venv/bin/workbook-check 01`) in the folder that holds the notebook's folder,
here `notebooks/`, or give the notebook's path.

**A course hub**: the administrator installs the wheel into the environment the hub's users run
(the repository's `deploy/jupyterhub/`); students get the notebooks through nbgrader (the Assignments
tab) and run `workbook-check 01` in a terminal, in their home folder.
"""


def _project() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def _released(course: Path) -> list[Path]:
    """The registry's released notebooks, each refused if it carries a marker block or an output."""
    notebooks, problems = [], []
    for notebook in NOTEBOOKS:
        path = notebook.source(course / "notebooks")
        if not path.exists():
            problems.append(f"{path.relative_to(course)} is missing: run `python3 workbook.py release`")
            continue
        for index, cell in enumerate(nbformat.read(str(path), as_version=4).cells):
            if any(marker in line for line in cell.source.splitlines() for marker in MARKERS
                   if line.lstrip().startswith("#")):
                problems.append(f"{path.relative_to(course)}, cell {index + 1}: a solution or hidden-test marker")
            if cell.cell_type == "code" and cell.outputs:
                problems.append(f"{path.relative_to(course)}, cell {index + 1}: has outputs")
        notebooks.append(path)
    if problems:
        raise SystemExit("student package: not built, the released notebooks are not what students may get:\n  "
                         + "\n  ".join(problems))
    return notebooks


def _pyproject(project: dict, version: str, packages: list[str]) -> str:
    """The wheel's pyproject.toml: the course's name, version and dependencies, only workbook-check."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    return "\n".join([
        "[build-system]", 'requires = ["setuptools>=64"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", f"name = {q(project['name'])}", f"version = {q(version)}",
        f"description = {q(project['description'] + ' (student distribution: no solutions, no hidden tests)')}",
        f"requires-python = {q(project['requires-python'])}", f"dependencies = {q(project['dependencies'])}", "",
        "[project.scripts]", f"workbook-check = {q(project['scripts']['workbook-check'])}", "",
        "[tool.setuptools]", f"packages = {q(packages)}", "",
        "[tool.setuptools.package-data]", f"autograder = {q([PACKAGED_RELEASE_DIR.name + '/*/*.ipynb'])}", ""])


def _stage(course: Path, staging: Path, notebooks: list[Path]) -> list[str]:
    """The package's sources and the released notebooks under ``staging``; returns the package names."""
    source = course / "autograder"
    packages = []
    for init in sorted(source.rglob("__init__.py")):
        package = init.parent
        packages.append(".".join(package.relative_to(course).parts))
        for module in sorted(package.glob("*.py")):
            if package.name == "commands" and module.name not in STUDENT_COMMANDS | {"__init__.py"}:
                continue
            target = staging / module.relative_to(course)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(module, target)
    for path in notebooks:
        target = staging / "autograder" / PACKAGED_RELEASE_DIR.name / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return packages


def _build_wheel(staging: Path, out: Path) -> Path:
    """pip's own wheel build; without build isolation when setuptools is here (no download needed)."""
    try:
        import setuptools  # noqa: F401
        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                             "--no-deps", *isolation, "--wheel-dir", str(out), str(staging)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"student package: pip could not build the wheel:\n{result.stderr[-3000:]}")
    return next(out.glob("*.whl"))


def build_student_package(target: Path, course: Path = REPO_ROOT) -> Path:
    """Write the student distribution into ``target`` (its old wheel and notebooks/ replaced); return
    the wheel."""
    project = _project()
    version = f"{project['version']}+student"
    notebooks = _released(course)
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("torch_resume_workbook-*.whl"):
        old.unlink()
    shutil.rmtree(target / "notebooks", ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="student-package-") as tmp:
        staging, out = Path(tmp) / "src", Path(tmp) / "dist"
        packages = _stage(course, staging, notebooks)
        (staging / "pyproject.toml").write_text(_pyproject(project, version, packages))
        wheel = shutil.copy2(_build_wheel(staging, out), target)
    for path in notebooks:
        (target / "notebooks" / path.parent.name).mkdir(parents=True)
        shutil.copy2(path, target / "notebooks" / path.parent.name / path.name)
    (target / "README.md").write_text(README.format(name=project["name"], version=version,
                                                    wheel=Path(wheel).name))
    return Path(wheel)
