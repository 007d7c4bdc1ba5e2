"""``workbook.py package gradescope|prairielearn [NN ...]``: what to upload to a grading platform.

    workbook.py package gradescope 01          # artifacts/platforms/gradescope/01_state_dict_aliasing.zip
    workbook.py package prairielearn 01 --image you/torch-resume-grader:0.1.0
                                               # artifacts/platforms/prairielearn/01_state_dict_aliasing/
    workbook.py package gradescope             # every notebook

Each package grades one notebook with the same judge, sandbox and hidden tests as nbgrader autograde
(``autograder.platforms``). It is instructor material, built from this repository: it holds the
instructor's notebook (hidden tests in it), so it is uploaded to the platform, never given to learners.
What it holds, and nothing else: the ``autograder`` package (without its console commands), that one
notebook's instructor source, the entry point, ``grading.json`` (the choices below) and the requirements
pinned to the versions installed here, torch from PyTorch's CPU index. README: "Grading on Gradescope",
"Grading on PrairieLearn".
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import nbformat

import autograder
from autograder.contract import DEFAULT_CELL_TIMEOUT
from autograder.course import NOTEBOOKS, REPO_ROOT, Notebook, matching
from autograder.platforms.submission import CONFIG, Settings

DEFAULT_OUT = REPO_ROOT / "artifacts" / "platforms"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What grading imports, in the judge or in a sandbox running the learner's cells: the check modules (torch,
# numpy, torchdata's StatefulDataLoader), the notebooks' own cells (matplotlib, IPython.display, the demos'
# ipywidgets controls) and nbformat. Not nbgrader, JupyterLab, Dask or Voila: nothing on a platform uses them.
GRADING_REQUIREMENTS = ("torch", "numpy", "matplotlib", "nbformat", "torchdata", "ipython", "ipywidgets")
LEFT_OUT = ("commands",)             # the console commands: they need nbgrader and JupyterLab
PL_FOLDER = "torch_resume_workbook"  # the question group and the serverFilesCourse folder on PrairieLearn
PL_UUID_NAMESPACE = uuid.UUID("7b0e5c1e-2f6a-4d4f-9a57-3f0c9d1f6a10")   # a question keeps its uuid across builds
FIXED_TIME = (2024, 1, 1, 0, 0, 0)   # zip entries' time: the same sources make the same zip
MARGIN_SECONDS = 30                  # the grader's own deadline comes this much before the platform's


def pinned_requirements() -> str:
    lines = []
    for name in GRADING_REQUIREMENTS:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"workbook.py package: {name} is not installed here, so its version cannot be pinned "
                             f"(run `python3 workbook.py test` once to make the environment)") from None
        lines.append(f"{name}=={version.split('+')[0]}")     # 2.13.0+cpu -> 2.13.0, from the CPU index
    return ("# The versions the course was built and tested with (workbook.py package); torch from " + CPU_INDEX
            + "\n" + "\n".join(lines) + "\n")


def course_version() -> str:
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"torch-resume-workbook {autograder.__version__}" + (f" ({commit})" if commit else "")


def package_files() -> dict[str, bytes]:
    """The autograder package as it is here, without the console commands and compiled files."""
    root = Path(autograder.__file__).resolve().parent
    files = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in LEFT_OUT or "__pycache__" in relative.parts:
            continue
        files[f"autograder/{relative.as_posix()}"] = path.read_bytes()
    return files


def _script(text: str) -> bytes:
    return text.lstrip("\n").encode()


# ---- Gradescope ------------------------------------------------------------------------------------

_NOT_STARTED = ("Not graded: the autograder could not start (exit status %s). This is not a problem with your "
                "notebook; your instructor has been told.")


def _judge_or_say_so(module: str, results: str) -> str:
    """The end of both platforms' entry scripts: run ``module``; where it left no results.json, write
    ``results`` (the platform's JSON, its message at %s) saying so. Exit 0 whatever happened."""
    return f"""cd "$ROOT"
"$PYTHON" -m {module}
status=$?
if [ ! -s "$ROOT/results/results.json" ]; then
    mkdir -p "$ROOT/results"
    printf '{results % _NOT_STARTED}\\n' "$status" > "$ROOT/results/results.json"
fi
exit 0
"""

GRADESCOPE_SETUP = r"""
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04 by default):
# Python and the course's pinned requirements, the CPU build of torch.
set -euo pipefail
cd /autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update
# Python 3.11, as the course is tested on (Ubuntu 22.04's own python3 is 3.10, too old for the pinned IPython).
apt-get install -y --no-install-recommends python3.11 python3.11-venv
python3.11 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir --upgrade pip
/autograder/venv/bin/pip install --no-cache-dir --index-url {cpu_index} "$(grep '^torch==' requirements.txt)"
/autograder/venv/bin/pip install --no-cache-dir -r requirements.txt
# Compile once here, so that a submission does not wait for it.
/autograder/venv/bin/python -m compileall -q /autograder/source/autograder
PYTHONPATH=/autograder/source /autograder/venv/bin/python -c "import autograder.platforms.gradescope, autograder.grading.judge"
"""

GRADESCOPE_RUN = r"""
#!/usr/bin/env bash
# Gradescope runs this for every submission, as root, in /autograder: the trusted judge grades
# /autograder/submission and writes /autograder/results/results.json. Whatever happens, a results.json
# exists when it ends. (WORKBOOK_PLATFORM_ROOT and WORKBOOK_PLATFORM_PYTHON: for a test outside Gradescope.)
ROOT="${WORKBOOK_PLATFORM_ROOT:-/autograder}"
PYTHON="${WORKBOOK_PLATFORM_PYTHON:-$ROOT/venv/bin/python}"
export WORKBOOK_PLATFORM_ROOT="$ROOT" PYTHONPATH="$ROOT/source" OMP_NUM_THREADS=1
""" + _judge_or_say_so("autograder.platforms.gradescope", '{"score": 0.0, "output": "%s", "tests": []}')


def gradescope_files(notebook: Notebook, settings: Settings) -> dict[str, bytes]:
    return {"setup.sh": _script(GRADESCOPE_SETUP.replace("{cpu_index}", CPU_INDEX)),
            "run_autograder": _script(GRADESCOPE_RUN),
            "requirements.txt": pinned_requirements().encode(),
            CONFIG: settings.dumps().encode(),
            f"solutions/{notebook.folder}/{notebook.folder}.ipynb": notebook.source().read_bytes(),
            **package_files()}


EXECUTABLE = {"setup.sh", "run_autograder", "run.sh"}


def write_zip(files: dict[str, bytes], target: Path) -> Path:
    """The files at the root of the archive (Gradescope looks for setup.sh and run_autograder there)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.external_attr = (0o100755 if Path(name).name in EXECUTABLE else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name])
    target.write_bytes(buffer.getvalue())
    return target


# ---- PrairieLearn ----------------------------------------------------------------------------------

PRAIRIELEARN_RUN = r"""
#!/usr/bin/env bash
# PrairieLearn's external grader runs this for every submission (the question's info.json names it): the
# trusted judge grades /grade/student and writes /grade/results/results.json. Whatever happens, a results.json
# exists and the exit status is 0 (PrairieLearn reads the results only then).
ROOT="${WORKBOOK_PLATFORM_ROOT:-/grade}"
PYTHON="${WORKBOOK_PLATFORM_PYTHON:-python3}"        # the grader image's Python (grader-image/Dockerfile)
HERE="$(cd "$(dirname "$0")" && pwd)"
export WORKBOOK_PLATFORM_ROOT="$ROOT" PYTHONPATH="$HERE" OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
""" + _judge_or_say_so("autograder.platforms.prairielearn", '{"gradable": false, "message": "%s"}')

PRAIRIELEARN_DOCKERFILE = """
# The grading image for PrairieLearn: Python and the course's pinned requirements, the CPU build of torch.
# Nothing of the course is in it: the autograder package comes from serverFilesCourse/{folder}/, the
# hidden tests from the question's tests/ folder. Build and push it where PrairieLearn pulls images from:
#   docker build -t {image} . && docker push {image}
FROM python:3.11-slim-bookworm
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --index-url {cpu_index} "$(grep '^torch==' /tmp/requirements.txt)" \\
 && pip install --no-cache-dir -r /tmp/requirements.txt \\
 && rm /tmp/requirements.txt
"""

PRAIRIELEARN_QUESTION = """
<pl-question-panel>
  <p>{title}</p>
  <p>Upload your notebook <code>{assignment}.ipynb</code>. Each test cell is graded as in the workbook's own
  check (<code>python3 workbook.py check {number}</code>): run that first.</p>
</pl-question-panel>
<pl-file-upload file-names="{assignment}.ipynb"></pl-file-upload>
<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""


def notebook_title(notebook: Notebook) -> str:
    nb = nbformat.read(str(notebook.source()), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            return cell.source.lstrip().splitlines()[0].lstrip("#").strip()
    return notebook.folder


def prairielearn_files(notebook: Notebook, settings: Settings, image: str, timeout: int) -> dict[str, bytes]:
    question = f"questions/{PL_FOLDER}/{notebook.folder}"
    info = {"uuid": str(uuid.uuid5(PL_UUID_NAMESPACE, notebook.folder)), "title": notebook_title(notebook),
            "topic": "Resuming PyTorch training", "tags": ["torch-resume-workbook"], "type": "v3",
            "singleVariant": True, "gradingMethod": "External",
            "externalGradingOptions": {"enabled": True, "image": image, "serverFilesCourse": [f"{PL_FOLDER}/"],
                                       "entrypoint": f"/grade/serverFilesCourse/{PL_FOLDER}/run.sh",
                                       "timeout": timeout, "enableNetworking": False}}
    requirements = pinned_requirements().encode()
    files = {f"{question}/info.json": (json.dumps(info, indent=2) + "\n").encode(),
             f"{question}/question.html": _script(PRAIRIELEARN_QUESTION.format(
                 title=notebook_title(notebook), assignment=notebook.folder, number=notebook.number)),
             f"{question}/tests/{notebook.folder}.ipynb": notebook.source().read_bytes(),
             f"{question}/tests/{CONFIG}": settings.dumps().encode(),
             f"serverFilesCourse/{PL_FOLDER}/run.sh": _script(PRAIRIELEARN_RUN),
             "grader-image/Dockerfile": _script(PRAIRIELEARN_DOCKERFILE.format(folder=PL_FOLDER, image=image,
                                                                               cpu_index=CPU_INDEX)),
             "grader-image/requirements.txt": requirements}
    files.update({f"serverFilesCourse/{PL_FOLDER}/{name}": data for name, data in package_files().items()})
    return files


def write_tree(files: dict[str, bytes], target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    for name, data in files.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if path.name in EXECUTABLE else 0o644)
    return target


# ---- the command -----------------------------------------------------------------------------------

PLATFORM_TIMEOUT = {"gradescope": 600, "prairielearn": 300}   # Gradescope's default; PrairieLearn allows 600
DEFAULT_IMAGE = "torch-resume-workbook/grader:" + autograder.__version__


def build(platform: str, notebook: Notebook, out: Path, *, cell_timeout: float = DEFAULT_CELL_TIMEOUT,
          platform_timeout: int | None = None, allow_unconfined: bool = False, visibility: str = "visible",
          image: str = DEFAULT_IMAGE) -> Path:
    """Write one package; return its path (the zip, or the folder to copy into a PrairieLearn course)."""
    timeout = platform_timeout or PLATFORM_TIMEOUT[platform]
    settings = Settings(notebook.folder, cell_timeout, max(timeout - MARGIN_SECONDS, 1), allow_unconfined,
                        visibility, course_version())
    if platform == "gradescope":
        return write_zip(gradescope_files(notebook, settings), out / "gradescope" / f"{notebook.folder}.zip")
    return write_tree(prairielearn_files(notebook, settings, image, timeout), out / "prairielearn" / notebook.folder)


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook.py package", description=__doc__.split("\n\n")[0])
    parser.add_argument("platform", choices=("gradescope", "prairielearn"))
    parser.add_argument("notebooks", nargs="*", help="name prefixes such as 01 (default: every notebook)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where to write (default: {DEFAULT_OUT})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_CELL_TIMEOUT,
                        help=f"seconds a cell may run (default {DEFAULT_CELL_TIMEOUT}, as nbgrader autograde)")
    parser.add_argument("--platform-timeout", type=int,
                        help="the platform's limit for grading one submission, in seconds (default: Gradescope "
                             "600, its default; PrairieLearn 300, written into info.json, at most 600)")
    parser.add_argument("--allow-unconfined", action="store_true",
                        help="grade even where the platform's container lacks a protection the sandbox needs "
                             "(docs/grading.md); every result then records what was missing")
    parser.add_argument("--visibility", default="visible",
                        choices=("visible", "after_due_date", "after_published", "hidden"),
                        help="Gradescope: when learners see each test cell's result (default: visible)")
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help=f"PrairieLearn: the grader image info.json names (default: {DEFAULT_IMAGE}; build "
                             f"and push grader-image/ under the name you give)")
    args = parser.parse_args(argv)
    if args.platform == "prairielearn" and (args.platform_timeout or 0) > 600:
        parser.error("PrairieLearn allows at most 600 s (--platform-timeout)")
    folders = matching(args.notebooks, [n.folder for n in NOTEBOOKS], "workbook.py package")
    for notebook in (n for n in NOTEBOOKS if n.folder in folders):
        path = build(args.platform, notebook, args.out.expanduser().resolve(), cell_timeout=args.timeout,
                     platform_timeout=args.platform_timeout, allow_unconfined=args.allow_unconfined,
                     visibility=args.visibility, image=args.image)
        print(f"{args.platform} {notebook.folder}: {path} ({size_of(path) / 1e6:.2f} MB)")
    if args.platform == "prairielearn":
        print(f"PrairieLearn grades in the image {args.image}: build and push grader-image/ under that name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
