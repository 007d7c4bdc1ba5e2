"""The notebooks of the workbook, found on disk so new ones are tested without new code."""

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*/*.ipynb"))
RELEASED = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


def graded_notebooks(paths):
    """Only notebooks with autograded test cells (an orientation notebook may have none)."""
    return [p for p in paths if any(
        c.get("metadata", {}).get("nbgrader", {}).get("grade") for c in nbformat.read(p, 4).cells)]


def fill_answers(released_path, answers: dict):
    """A learner's submission: the released notebook with answer cells replaced by ``answers``."""
    nb = nbformat.read(released_path, as_version=4)
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def solution_answers(solution_path) -> dict:
    """grade_id -> source of each answer cell of a solution notebook."""
    nb = nbformat.read(solution_path, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
