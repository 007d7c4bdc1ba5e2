#!/usr/bin/env python3
"""One entry point for learners, instructors and CI. Needs only Python >= 3.10 and pip.

    python3 workbook.py lab       create or reuse .venv, then open JupyterLab on notebooks/ with
                                  nbgrader's Validate button and assignment list (--instructor: on
                                  the course root, with the formgrader and Create Assignment too)
    python3 workbook.py test      create or reuse .venv, then run the test suite
    python3 workbook.py check     grade my notebooks (workbook-check; add 01 or a path)
    python3 workbook.py demo 01   render a notebook with solutions and outputs to HTML (classroom)
    python3 workbook.py present 06   serve one notebook with solutions, code hidden, its demos'
                                  controls live (Voila, on 127.0.0.1; --no-browser --port 8866)
    python3 workbook.py grade 01  grade a class in parallel into nbgrader's gradebook, then a
                                  per-trap summary of what the class got wrong (instructors;
                                  --scheduler tcp://HOST:PORT grades on a Dask cluster)
    python3 workbook.py worker tcp://HOST:PORT   a grading worker of that cluster, on this machine
    python3 workbook.py release   regenerate notebooks/ from solutions/ with nbgrader (authors;
                                  add names or prefixes such as 04 to release only those;
                                  --student-package DIR: then write what students get into DIR)
    python3 workbook.py package gradescope 01   what to upload to Gradescope (or prairielearn) to grade
                                  notebook 01 with the same judge and hidden tests (instructors)

Extra arguments go to the tool underneath (jupyter lab, pytest, workbook-check).
The environment is reinstalled only when pyproject.toml has changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".workbook-installed"


def say(message: str) -> None:
    print(f"[workbook] {message}", flush=True)


def ensure_environment() -> None:
    """Create .venv and install the project into it, unless it is already current."""
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        say(f"creating a virtual environment in {VENV.relative_to(ROOT)}/")
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except subprocess.CalledProcessError:
            raise SystemExit("[workbook] could not create a virtual environment with pip in it. On Debian "
                             "or Ubuntu, install the python3-venv package first.") from None
    say("installing the workbook and its dependencies (first run only; torch is the big one)")
    install_cpu_torch()
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(wanted)


# The release the notebooks were written on: where the PyTorch CPU index cannot be reached, pip takes it
# from the machine's own wheels or from PyPI (on Linux that is the CUDA build, several GB).
FALLBACK_TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_cpu_torch() -> None:
    """Put the small CPU build of torch in .venv before the project (which then finds it there), unless a
    torch of the declared range is there already. pip's default wheel on Linux bundles CUDA: several GB
    that nothing in this course uses."""
    declared = re.search(r'^\s*"(torch[<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    present = subprocess.run([str(PYTHON), "-c", "import importlib.metadata as m, sys; from pip._vendor.packaging"
                              f".specifiers import SpecifierSet; sys.exit(m.version('torch') not in "
                              f"SpecifierSet('{declared[len('torch'):]}'))"], capture_output=True)
    if present.returncode == 0:
        return
    pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if _reachable(CPU_INDEX):
        say(f"installing the CPU build of torch from {CPU_INDEX}")
        if subprocess.run(pip + ["--index-url", CPU_INDEX, declared]).returncode == 0:
            return
    say(f"the PyTorch CPU index is out of reach: installing {FALLBACK_TORCH} as pip finds it")
    subprocess.run(pip + [FALLBACK_TORCH], check=True)


def _reachable(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url + "/torch/", timeout=5):
            return True
    except Exception:        # noqa: BLE001 (no network, a proxy, a firewall: any of them means no)
        return False


def tool_env() -> dict:
    # nbgrader shells out to `alembic`, so the environment's bin/ must come first on PATH.
    env = dict(os.environ, VIRTUAL_ENV=str(VENV))
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    # The workbook's models are tiny: a second BLAS/OpenMP thread only adds synchronisation,
    # and on a busy 2-core machine it makes each step many times slower. Users may override.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run(args: list[str]) -> int:
    """The tool's exit status. A SIGTERM to this command is passed on to the tool (which would run on alone
    otherwise); the terminal's Ctrl-C reaches both, and this waits for the tool to stop in its own way."""
    tool = subprocess.Popen(args, cwd=ROOT, env=tool_env())
    signal.signal(signal.SIGTERM, lambda number, frame: tool.send_signal(number))
    while True:
        try:
            return tool.wait()
        except KeyboardInterrupt:
            continue


def release(names: list[str]) -> int:
    """notebooks/ = nbgrader generate_assignment(solutions/), for the named or all assignments."""
    return run([str(PYTHON), "-m", "autograder.commands.release", *names])


COMMANDS = ("lab", "test", "check", "demo", "present", "grade", "worker", "release", "package")

# nbgrader's instructor tools: a learner's JupyterLab leaves them out (they work on the course's solutions/
# and gradebook, which a learner does not have), as deploy/jupyterhub/setup_hub.sh does for students.
INSTRUCTOR_LAB_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                          "@jupyter/nbgrader:course-list")
INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list")
# For everyone: no "fetch official Jupyter news?" pop-up, no news or update check over the network.
LAB_SETTING_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def lab_arguments(instructor: bool) -> list[str]:
    """jupyter lab's arguments: a learner's lab on notebooks/, or an instructor's on the course root.

    Its settings folder (written into .venv) holds the page config that disables the instructor's plugins
    for a learner, and the settings' defaults."""
    settings = VENV / "lab-settings" / ("instructor" if instructor else "learner")
    settings.mkdir(parents=True, exist_ok=True)
    hidden = {} if instructor else dict.fromkeys(INSTRUCTOR_LAB_PLUGINS, True)
    (settings / "page_config.json").write_text(json.dumps({"disabledExtensions": hidden, "lockedExtensions": hidden}))
    (settings / "overrides.json").write_text(json.dumps(LAB_SETTING_OVERRIDES))
    arguments = [f"--ServerApp.root_dir={'.' if instructor else 'notebooks'}", f"--LabApp.app_settings_dir={settings}",
                 "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if not instructor:
        arguments.append(f"--ServerApp.jpserver_extensions={dict.fromkeys(INSTRUCTOR_SERVER_EXTENSIONS, False)}")
    return arguments


def main(argv: list[str]) -> int:
    if argv and argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    command, extra = argv[0], argv[1:]
    ensure_environment()
    if command == "lab":
        instructor = "--instructor" in extra  # the formgrader links into solutions/: serve the course root
        extra = [a for a in extra if a != "--instructor"]
        if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
            say("running as root (a container?): passing --allow-root to JupyterLab")
            extra = ["--allow-root", *extra]
        return run([str(BIN / "jupyter"), "lab", *lab_arguments(instructor), *extra])
    if command == "test":
        return run([str(PYTHON), "-m", "pytest", *extra])
    if command == "check":
        return run([str(BIN / "workbook-check"), *extra])
    if command == "demo":
        return run([str(BIN / "workbook-demo"), *extra])
    if command == "present":
        return run([str(BIN / "workbook-present"), *extra])
    if command == "grade":
        return run([str(BIN / "workbook-grade"), *extra])
    if command == "worker":
        return run([str(BIN / "workbook-worker"), *extra])
    if command == "package":
        return run([str(PYTHON), "-m", "autograder.commands.package", *extra])
    return release(extra)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
