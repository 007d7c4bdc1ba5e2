"""The per-trap class summary: for each test cell, how many students lost it, and why.

By the grading contract each test cell checks one trap, and a failing check's message
names the trap. So counting, per test cell, the students who lost its points, grouped by
the kind of failure message, tells an instructor what the class actually got wrong:

    test_snapshot_state_model   3 pt   12 / 40 lost   9 x the snapshot moved with training ...
                                                       3 x not answered

Scores come from nbgrader's gradebook; messages from the test cells' outputs in the
autograded notebooks (what the feedback shows); a submission that could not be graded
at all counts with its grading error.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import textwrap
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from autograder.contract import exercise_of, failure_message, is_answer_cell, is_test_cell, nbgrader_meta

NOT_ANSWERED = "not answered (the answer cell still raises NotImplementedError)"
MISSING = "answer cell missing or its name changed"
CRASHED = "hung or crashed the kernel"
UNGRADABLE = "submission could not be graded"
NO_MESSAGE = "lost points without an error message"

# Kinds that are not a trap of the notebook: plotted apart from failed checks.
CATEGORIES = {NOT_ANSWERED: "not answered", MISSING: "error or crash", CRASHED: "error or crash",
              UNGRADABLE: "error or crash", NO_MESSAGE: "error or crash"}
TRAP_CATEGORY = "fell into the trap (check failed)"
OTHER_ERROR = "error or crash"
CATEGORY_COLOURS = {TRAP_CATEGORY: "#d62728", "not answered": "#bbbbbb", OTHER_ERROR: "#ff7f0e"}


@dataclasses.dataclass
class TrapRow:
    grade_id: str
    exercise: str
    max_points: float
    students: int
    lost: int
    kinds: dict[str, int]  # failure kind -> students, most common first

    def category_counts(self) -> dict[str, int]:
        counts = collections.Counter()
        for kind, n in self.kinds.items():
            counts[category_of(kind)] += n
        return dict(counts)


@dataclasses.dataclass
class ClassSummary:
    assignment: str
    students: int
    rows: list[TrapRow]


def category_of(kind: str) -> str:
    if kind in CATEGORIES:
        return CATEGORIES[kind]
    return TRAP_CATEGORY if not kind.startswith("error: ") else OTHER_ERROR


def failure_kind(message: str) -> str:
    """Group failure messages that name the same trap: the first sentence, numbers masked."""
    message = (message or "").strip()
    if not message:
        return NO_MESSAGE
    if message.startswith("not answered yet"):
        return NOT_ANSWERED
    if message.startswith("NotGradable"):
        return UNGRADABLE
    if "is not defined: the answer cell" in message or "is missing from the notebook" in message:
        return MISSING
    if message.startswith(("GradingError", "SubmissionStopped", "this cell was stopped after", "the kernel died",
                           "CellTimeoutError")):
        return CRASHED
    if message.startswith("AssertionError: "):
        return _first_sentence(message.removeprefix("AssertionError: "))
    if message.startswith("AssertionError"):
        return NO_MESSAGE
    return "error: " + message.split(":")[0][:60]


def _first_sentence(text: str, limit: int = 90) -> str:
    sentence = re.split(r"(?<=[.!?])\s|\n", text, maxsplit=1)[0]
    head, colon, _ = sentence.partition(": ")
    if colon and len(head.split()) >= 4:  # "<the trap>: <measured evidence>"
        sentence = head
    # The evidence differs from student to student: numbers, quoted names, bracketed measurements.
    sentence = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", sentence)
    sentence = re.sub(r"(?<![A-Za-z])'[^']*'|\"[^\"]*\"", "'…'", sentence)  # not the one in "snapshot's"
    while re.search(r"\([^()]*#[^()]*\)", sentence):  # innermost first: "(double(#) gave #)"
        sentence = re.sub(r"\s*\([^()]*#[^()]*\)", "", sentence)
    sentence = re.sub(r"\s+", " ", sentence).strip().rstrip(".:")
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rstrip() + "..."


def _messages(autograded: Path) -> dict[str, str]:
    """grade_id -> the failure message shown in that test cell of an autograded notebook."""
    try:
        nb = nbformat.read(str(autograded), as_version=4)
    except Exception:
        return {}
    answers = {nbgrader_meta(c).get("grade_id") for c in nb.cells if is_answer_cell(c)}
    # An answer cell that was stopped (timeout) or lost with its kernel leaves its name undefined.
    stopped = {nbgrader_meta(c).get("grade_id") for c in nb.cells if is_answer_cell(c)
               and any(o.get("ename") in ("CellTimeoutError", "GradingError") for o in c.get("outputs", []))}
    found = {}
    for cell in nb.cells:
        if is_test_cell(cell):
            gid = nbgrader_meta(cell)["grade_id"]
            exercise = exercise_of(gid, answers)
            message = failure_message(cell, exercise, answers)
            if exercise in stopped and failure_kind(message) == MISSING:
                message = f"CellTimeoutError: the answer cell for `{exercise}` never finished"
            found[gid] = message
    return found


def summarize(course: Path, assignment: str, db_url: str, outcomes=()) -> ClassSummary:
    """Count, per test cell, the students who lost it, by failure kind."""
    errors = {o.student: o.error for o in outcomes if o.status == "failed"}
    lost: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    meta: dict[str, tuple[str, float]] = {}
    order: list[str] = []
    students = 0
    with Gradebook(db_url) as gb:
        notebooks = [nb.name for nb in gb.find_assignment(assignment).notebooks]
        exercise_names = {c.name for nb in gb.find_assignment(assignment).notebooks for c in nb.solution_cells}
        for submission in gb.assignment_submissions(assignment):
            student = submission.student.id
            students += 1
            for name in notebooks:
                try:
                    graded = gb.find_submission_notebook(name, assignment, student)
                except MissingEntry:
                    continue
                messages = _messages(course / "autograded" / student / assignment / f"{name}.ipynb")
                for grade in sorted(graded.grades, key=lambda g: g.cell.id):
                    if grade.name not in meta:
                        meta[grade.name] = (exercise_of(grade.name, exercise_names), float(grade.max_score))
                        order.append(grade.name)
                    if (grade.score or 0) < grade.max_score:
                        kind = UNGRADABLE if student in errors and not messages else failure_kind(messages.get(grade.name, ""))
                        lost[grade.name][kind] += 1
    order = _notebook_order(course, assignment, order)
    rows = [TrapRow(gid, meta[gid][0], meta[gid][1], students, sum(lost[gid].values()),
                    dict(lost[gid].most_common())) for gid in order]
    return ClassSummary(assignment, students, rows)


def _notebook_order(course: Path, assignment: str, grade_ids: list[str]) -> list[str]:
    """Test cells in the order the notebook shows them (the gradebook's order is by insertion)."""
    position = {}
    for path in sorted((course / "autograded").glob(f"*/{assignment}/*.ipynb"))[:1]:
        try:
            cells = nbformat.read(str(path), as_version=4).cells
        except Exception:
            break
        position = {nbgrader_meta(c).get("grade_id"): i for i, c in enumerate(cells)}
    return sorted(grade_ids, key=lambda g: (position.get(g, len(position)), grade_ids.index(g)))


def format_summary(summary: ClassSummary) -> str:
    lines = [f"{summary.assignment}: what {summary.students} students lost, test cell by test cell "
             "(one trap each)"]
    width = max([len(r.grade_id) for r in summary.rows] + [9])
    lines.append(f"  {'test cell':<{width}}  points  lost by   why (students)")
    for row in summary.rows:
        lost = f"{row.lost}/{row.students}"
        kinds = list(row.kinds.items()) or [("", 0)]
        first, n = kinds[0]
        lines.append(f"  {row.grade_id:<{width}}  {row.max_points:>6g}  {lost:>7}   "
                     + (f"{n} x {first}" if n else "-"))
        for kind, n in kinds[1:]:
            lines.append(f"  {'':<{width}}  {'':>6}  {'':>7}   {n} x {kind}")
    return "\n".join(lines)


def plot_summary(summary: ClassSummary, path: Path) -> Path:
    """A horizontal bar per test cell: students who lost it, coloured by kind of failure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(reversed(summary.rows))  # first test cell on top
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 2.2))
    labels = [f"{r.grade_id} ({r.max_points:g} pt)" for r in rows]
    left = [0] * len(rows)
    for category, colour in CATEGORY_COLOURS.items():
        counts = [r.category_counts().get(category, 0) for r in rows]
        ax.barh(labels, counts, left=left, color=colour, label=category)
        left = [a + b for a, b in zip(left, counts)]
    for y, row in enumerate(rows):
        traps = [k for k in row.kinds if category_of(k) == TRAP_CATEGORY]
        if traps:  # the most common trap message, beside its bar
            label = textwrap.shorten(traps[0], 110, placeholder="...")
            ax.text(left[y] + 0.05 * max(summary.students, 1), y, textwrap.fill(label, 55),
                    va="center", fontsize=7)
    ax.set_xlim(0, max(summary.students, 1) * 2.2)
    ax.set_xlabel(f"students who lost the test cell (of {summary.students})")
    ax.set_title(f"{summary.assignment}: which traps the class fell into")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (len(rows) + 3)), ncol=3, fontsize=8,
              frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_summary(summary: ClassSummary, folder: Path) -> str:
    """Write summary.txt, summary.json and summary.png into ``folder``; return the table and where."""
    folder.mkdir(parents=True, exist_ok=True)
    table = format_summary(summary)
    (folder / "summary.txt").write_text(table + "\n")
    (folder / "summary.json").write_text(json.dumps({
        "schema": "workbook-class-summary/1", "assignment": summary.assignment, "students": summary.students,
        "test_cells": [dataclasses.asdict(r) for r in summary.rows]}, indent=2))
    chart = plot_summary(summary, folder / "summary.png")
    return f"{table}\n  table and chart: {folder / 'summary.txt'}, {chart}"
