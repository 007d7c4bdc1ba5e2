"""``workbook-present``: one notebook served for a classroom, code hidden, its controls live (Voilà).

    workbook-present 06                          # opens http://127.0.0.1:8866/ in the browser
    workbook-present 06 --no-browser --port 8870 # other arguments go to voila

The notebook shown is the one ``workbook-demo`` renders: the student version with the answers from
``solutions/`` pasted in (so no hidden test reaches the screen), in a scratch folder. Voilà runs it top to
bottom in a fresh kernel when the page is opened, shows the outputs and plots without the code, and keeps
the kernel running, so the demos' sliders and toggles (``autograder.demos.controls``) compute again when a
teacher moves them. The server listens on loopback only, and its root URL is the notebook itself.
Stop it with Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.commands.demo import find_assignments, load_filled_in
from autograder.course import matching


def say(message: str) -> None:
    print(f"[present] {message}", flush=True)


def write_presented(assignment: str, folder: Path) -> Path:
    """The filled-in notebook of ``assignment``, written to ``folder``; its path."""
    target = folder / f"{assignment}.ipynb"
    nbformat.write(load_filled_in(assignment), str(target))
    return target


def voila_command(notebook: Path, extra: list[str]) -> list[str]:
    """voila on one notebook (served at the root URL), on 127.0.0.1 unless ``extra`` names an address."""
    voila = Path(sys.executable).parent / "voila"
    command = [str(voila) if voila.exists() else "voila", str(notebook), "--show_tracebacks=True"]
    if not any(arg.split("=")[0] in ("--ip", "--Voila.ip") for arg in extra):
        command.append("--Voila.ip=127.0.0.1")
    return command + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook-present", description=__doc__.split("\n\n")[0],
                                     epilog="Any other argument goes to voila (--no-browser, --port 8866, ...).")
    parser.add_argument("notebook", help="a name prefix such as 06")
    args, extra = parser.parse_known_args(argv)
    assignments = matching([args.notebook], find_assignments([]), "workbook-present")
    if len(assignments) != 1:
        parser.error(f"{args.notebook!r} names {len(assignments)} notebooks; name one")
    assignment = assignments[0]
    folder = Path(tempfile.mkdtemp(prefix=f"present-{assignment}-"))
    try:
        notebook = write_presented(assignment, folder)
        say(f"{assignment}: serving it with the answers filled in, code hidden (Ctrl-C stops)")
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")   # as workbook.py sets it: tiny models, a busy machine
        try:
            return subprocess.call(voila_command(notebook, extra), cwd=folder, env=env)
        except KeyboardInterrupt:
            return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
