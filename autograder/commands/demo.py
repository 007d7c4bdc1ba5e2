"""``workbook-demo``: render notebooks for a classroom, solutions filled in, every output shown.

    workbook-demo 01                     # HTML of notebook 01 in artifacts/classroom/
    workbook-demo                        # every notebook
    workbook-demo 04 05 --out ~/lecture  # a folder of your choice
    workbook-demo 01 --demo              # only the title and the "What goes wrong" block
    workbook-demo 01 --slides            # also a reveal.js slide deck, one slide per section

A teacher shows each trap live without typing: the student version of the notebook
(no hidden tests, no solution markers) gets the answers from ``solutions/``, runs in
a fresh kernel with the grader's settings (no warnings), and is written to HTML with
its plots embedded, so the file opens in any browser, offline. The slide deck loads
reveal.js from the web; for an offline room, pass ``--reveal-prefix`` pointing at a
local copy of reveal.js.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter, SlidesExporter

from autograder.contract import DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS, nbgrader_meta
from autograder.course import RELEASE_DIR, REPO_ROOT, SOLUTIONS_DIR, matching

DEFAULT_OUT = REPO_ROOT / "artifacts" / "classroom"
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
DEMO_HEADING = re.compile(r"^#{1,2}\s.*what goes wrong", re.IGNORECASE | re.MULTILINE)
SECTION_HEADING = re.compile(r"^##\s", re.MULTILINE)


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


# ---- which notebooks --------------------------------------------------------------------------

def find_assignments(selectors: list[str], root: Path = SOLUTIONS_DIR) -> list[str]:
    """Assignment names (``01_state_dict_aliasing``) for prefixes such as ``01``; all when none."""
    known = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / f"{p.name}.ipynb").exists())
    return matching(selectors, known, "workbook-demo")


# ---- the notebook a teacher shows --------------------------------------------------------------

def strip_solution_markers(source: str) -> str:
    return "\n".join(line for line in source.split("\n") if line.strip() not in SOLUTION_MARKERS)


def filled_in_notebook(student, solution):
    """The student version with every answer cell replaced by its solution: what a learner has
    after solving everything. Test cells stay as released (visible tests only)."""
    nb = copy.deepcopy(student)
    answers = {nbgrader_meta(c)["grade_id"]: c.source for c in solution.cells
               if nbgrader_meta(c).get("solution") and "grade_id" in nbgrader_meta(c)}
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("solution"):
            if meta.get("grade_id") not in answers:
                raise ValueError(f"answer cell {meta.get('grade_id')!r} has no solution in solutions/")
            cell.source = strip_solution_markers(answers[meta["grade_id"]])
    return nb


def load_filled_in(assignment: str):
    """Filled-in notebook for an assignment; the solution itself if no student version exists yet."""
    solution = nbformat.read(str(SOLUTIONS_DIR / assignment / f"{assignment}.ipynb"), as_version=4)
    released = RELEASE_DIR / assignment / f"{assignment}.ipynb"
    if not released.exists():
        say(f"{assignment}: no student version in notebooks/ (run `workbook.py release`); showing the solution")
        return solution
    return filled_in_notebook(nbformat.read(str(released), as_version=4), solution)


def demo_block(nb):
    """Title, setup and the "What goes wrong" section: the cells before the next ``## `` heading."""
    cells = nb.cells
    start = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and DEMO_HEADING.search(c.source)), None)
    if start is None:
        raise ValueError("this notebook has no 'What goes wrong' heading, so there is no demo block to show")
    end = next((i for i in range(start + 1, len(cells))
                if cells[i].cell_type == "markdown" and SECTION_HEADING.search(cells[i].source)), len(cells))
    short = copy.deepcopy(nb)
    short.cells = short.cells[:end]
    return short


def mark_slides(nb) -> None:
    """One slide per ``#``/``##`` section, a sub-slide per ``###``, the rest flows on the slide."""
    for cell in nb.cells:
        kind = "-"
        if cell.cell_type == "markdown":
            first = cell.source.lstrip().split("\n", 1)[0]
            if re.match(r"#{1,2}\s", first):
                kind = "slide"
            elif first.startswith("### "):
                kind = "subslide"
        cell.metadata["slideshow"] = {"slide_type": kind}


# ---- run and render ----------------------------------------------------------------------------

def execute(nb, timeout: int = DEFAULT_CELL_TIMEOUT) -> list[str]:
    """Run every cell in a fresh kernel, in a scratch folder. Returns the errors nobody asked for."""
    workdir = Path(tempfile.mkdtemp(prefix="classroom-"))
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                       extra_arguments=KERNEL_EXTRA_ARGUMENTS,
                       resources={"metadata": {"path": str(workdir)}}).execute()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    problems = []
    for index, cell in enumerate(nb.cells):
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue  # a demo that fails on purpose
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(f"cell {index + 1}: {output.get('ename')}: {output.get('evalue', '')[:200]}")
    return problems


def _export(exporter, nb, resources) -> str:
    """nbconvert warns once per plot without alt text: noise for a teacher, nothing to act on."""
    level = exporter.log.level
    exporter.log.setLevel(logging.ERROR)
    try:
        return exporter.from_notebook_node(nb, resources=dict(resources))[0]
    finally:
        exporter.log.setLevel(level)


def render(assignment: str, out_dir: Path, demo_only: bool = False, slides: bool = False,
           reveal_prefix: str | None = None, timeout: int = DEFAULT_CELL_TIMEOUT) -> tuple[list[Path], list[str]]:
    """Execute one notebook with its solutions and write HTML (and slides). Returns (files, problems)."""
    nb = load_filled_in(assignment)
    if demo_only:
        nb = demo_block(nb)
    problems = execute(nb, timeout=timeout)
    stem = f"{assignment}-demo" if demo_only else assignment
    resources = {"metadata": {"name": stem}}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{stem}.html"]
    written[0].write_text(_export(HTMLExporter(template_name="lab"), nb, resources), encoding="utf-8")
    if slides:
        mark_slides(nb)
        exporter = SlidesExporter()
        if reveal_prefix:
            exporter.reveal_url_prefix = reveal_prefix
        written.append(out_dir / f"{stem}.slides.html")
        written[-1].write_text(_export(exporter, nb, resources), encoding="utf-8")
    return written, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="name prefixes such as 01 (default: all notebooks)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for the HTML (default: {DEFAULT_OUT})")
    parser.add_argument("--demo", action="store_true", help="only the title and the 'What goes wrong' block")
    parser.add_argument("--slides", action="store_true", help="also write a reveal.js slide deck (*.slides.html)")
    parser.add_argument("--reveal-prefix", help="where the slides load reveal.js from (default: the unpkg CDN)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    failed = False
    for assignment in find_assignments(args.notebooks):
        say(f"{assignment}: running with solutions filled in ...")
        started = time.perf_counter()
        try:
            files, problems = render(assignment, args.out.expanduser(), demo_only=args.demo, slides=args.slides,
                                     reveal_prefix=args.reveal_prefix, timeout=args.timeout)
        except ValueError as exc:
            say(f"{assignment}: {exc}")
            failed = True
            continue
        for problem in problems:
            say(f"{assignment}: unexpected error in {problem}")
        failed |= bool(problems)
        shown = ", ".join(str(f) for f in files)
        say(f"{assignment}: done in {time.perf_counter() - started:.1f} s -> {shown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
