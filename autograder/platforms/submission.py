"""One submission on a grading platform: found, prepared as nbgrader's autograde prepares it, judged, scored.

nbgrader's autograde prepares a submission from its gradebook before the judge sees it: outputs cleared,
a grade_id used twice kept only on its last cell (DeduplicateIds), cells the gradebook knows given back
their type, lock, points and, where locked, their source (OverwriteCells), and test cells the submission
deleted put back at the end (``nbgrader_plugins.restore_deleted_test_cells``). A platform has no gradebook:
its package holds the instructor's source notebook instead (hidden tests included), and ``prepare`` does
the same from it, so whatever a submission put in a test cell is never what runs.

Then the same judge as nbgrader's (``autograder.grading.judge``) runs it, under the same refusal rule
(``autograder.grading.protections``): where the platform's container lacks a protection, nothing is graded
unless the package was built to allow it, and then every result records what was missing. Each test cell
is scored by nbgrader's rule (``contract.score_test_cell``) and becomes one ``Row``; ``finish`` makes sure a
platform gets its results file exactly once, also when the grader runs out of time or fails itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import traceback
from pathlib import Path

import nbformat

from autograder.contract import DEFAULT_CELL_TIMEOUT, Scored, exercise_of, is_answer_cell, is_test_cell, \
    nbgrader_meta, read_notebook, score_test_cell

CONFIG = "grading.json"                  # the package's settings, written by autograder.commands.package
ROOT_VARIABLE = "WORKBOOK_PLATFORM_ROOT"   # where the platform's folder is: /autograder, /grade (tests: a temp folder)
MESSAGE_CHARS = 2000                     # a message quotes learner text (an exception's words): bounded
SUBMISSION_BYTES = 64 << 20              # a notebook larger than this is not read

GRADED, NOT_GRADABLE, REFUSED, OUT_OF_TIME, FAILED = "graded", "not gradable", "refused", "out of time", "failed"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the instructor chose when building the package (``workbook.py package``)."""
    assignment: str                         # the notebook's folder name, e.g. 01_state_dict_aliasing
    cell_timeout: float = DEFAULT_CELL_TIMEOUT   # seconds a cell may run, as nbgrader's JudgeInSandbox.timeout
    total_seconds: float = 540              # the whole grading, below the platform's own limit
    allow_unconfined: bool = False          # grade where the container lacks a protection (recorded)
    visibility: str = "visible"             # Gradescope: when learners see each test
    version: str = ""                       # the course version the package was built from

    @classmethod
    def read(cls, path: Path) -> "Settings":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(path.read_text()).items() if k in fields})

    def dumps(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"


def platform_root(default: str) -> Path:
    return Path(os.environ.get(ROOT_VARIABLE, default)).resolve()


@dataclasses.dataclass
class Row:
    """One test cell's result."""
    grade_id: str
    exercise: str
    points: float
    max_points: float
    message: str = ""       # why it failed, for the learner
    passed_line: str = ""   # the check's ✓ line

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points

    @property
    def text(self) -> str:
        return self.passed_line if self.passed else self.message


@dataclasses.dataclass
class Outcome(Scored):
    PARTS = "rows"

    status: str                 # GRADED, NOT_GRADABLE, REFUSED, OUT_OF_TIME or FAILED
    rows: list[Row]
    summary: str                # for the learner
    notes: list[str]            # for the instructor: what confined it, what was missing, what was stopped
    confinement: dict = dataclasses.field(default_factory=dict)
    unconfined: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


# ---- the submission: found and prepared --------------------------------------------------------------

def find_submission(folder: Path, assignment: str) -> tuple[Path | None, str | None]:
    """(the submitted notebook, None), or (None, why there is none to grade). A link is never followed: it
    could point at the instructor's own notebook."""
    wanted = f"{assignment}.ipynb"
    files = []
    for here, folders, names in os.walk(folder):          # never into a linked folder
        folders[:] = sorted(f for f in folders if f != ".ipynb_checkpoints")
        files += [Path(here, n) for n in sorted(names) if not os.path.islink(os.path.join(here, n))
                  and os.path.isfile(os.path.join(here, n))]
    files.sort(key=lambda p: (len(p.parts), str(p)))
    notebooks = [p for p in files if p.suffix == ".ipynb"]
    exact = [p for p in notebooks if p.name == wanted]
    if exact or len(notebooks) == 1:
        chosen = (exact or notebooks)[0]
        if chosen.stat().st_size > SUBMISSION_BYTES:
            return None, f"{chosen.name} is over {SUBMISSION_BYTES >> 20} MB: submit the notebook without its outputs"
        return chosen, None
    if notebooks:
        return None, (f"{len(notebooks)} notebooks were submitted ({', '.join(p.name for p in notebooks[:5])}) and "
                      f"none is named {wanted}: submit only {wanted}")
    received = f" (received: {', '.join(p.name for p in files[:5])})" if files else ""
    return None, f"no notebook was submitted{received}: submit {wanted}"


def _set_cell_type(cell, cell_type: str) -> None:
    if cell.get("cell_type") == cell_type:
        return
    cell["cell_type"] = cell_type
    if cell_type == "code":
        cell["outputs"], cell["execution_count"] = [], None
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def prepare(nb, source) -> list[str]:
    """Make ``nb`` what nbgrader's autograde hands the judge, from the instructor's ``source`` notebook;
    return the grade_ids of the test cells put back because the submission had deleted them."""
    known = {nbgrader_meta(c)["grade_id"]: c for c in source.cells if nbgrader_meta(c).get("grade_id")}
    for cell in nb.cells:                                       # ClearOutput
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    seen = set()
    for cell in reversed(nb.cells):                             # DeduplicateIds: the last one keeps the id
        meta = nbgrader_meta(cell)
        if meta.get("grade") or meta.get("solution") or meta.get("locked"):
            if meta.get("grade_id") in seen:
                cell["metadata"]["nbgrader"] = {}
            else:
                seen.add(meta.get("grade_id"))
    for cell in nb.cells:                                       # OverwriteCells, and a test cell whole
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if grade_id is None:
            continue
        if grade_id not in known:                               # nbgrader: "does not exist in the database"
            del meta["grade_id"]
            continue
        original = known[grade_id]
        _set_cell_type(cell, original.cell_type)
        if is_test_cell(original):
            cell["metadata"]["nbgrader"] = dict(nbgrader_meta(original))
        else:
            meta["locked"] = bool(nbgrader_meta(original).get("locked"))
            if "points" in nbgrader_meta(original):
                meta["points"] = nbgrader_meta(original)["points"]
        if nbgrader_meta(original).get("locked"):
            cell["source"] = original.source
    present = {nbgrader_meta(c).get("grade_id") for c in nb.cells}
    restored = [c for c in source.cells if is_test_cell(c) and nbgrader_meta(c)["grade_id"] not in present]
    for original in restored:
        nb.cells.append(nbformat.v4.new_code_cell(original.source, metadata={"nbgrader": dict(nbgrader_meta(original))}))
    return [nbgrader_meta(c)["grade_id"] for c in restored]


# ---- judged and scored -----------------------------------------------------------------------------

def _bounded(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ... (cut)"


def _answers(source) -> set[str]:
    return {nbgrader_meta(c).get("grade_id", "") for c in source.cells if is_answer_cell(c)}


def _rows(nb, judgement, answers: set[str]) -> list[Row]:
    """Each test cell scored by nbgrader's rule from the outputs the judge wrote into it."""
    from autograder.grading.judge import apply_judgement

    apply_judgement(nb, judgement)
    rows = []
    for cell, verdict in zip(filter(is_test_cell, nb.cells), judgement.verdicts):
        points, max_points = score_test_cell(cell)
        lines = [line for line in verdict.stdout.splitlines() if line.strip()]
        rows.append(Row(verdict.grade_id, exercise_of(verdict.grade_id, answers), points, max_points,
                        _bounded(verdict.message or (verdict.error or {}).get("evalue", "")) if points < max_points
                        else "", _bounded(lines[0]) if lines else ""))
    return rows


def _zero_rows(source, message: str) -> list[Row]:
    answers = _answers(source)
    return [Row(nbgrader_meta(c)["grade_id"], exercise_of(nbgrader_meta(c)["grade_id"], answers), 0.0,
                float(nbgrader_meta(c).get("points", 0)), message) for c in source.cells if is_test_cell(c)]


def _summary(rows: list[Row]) -> str:
    passed = sum(r.passed for r in rows)
    return (f"{sum(r.points for r in rows):g} / {sum(r.max_points for r in rows):g} points: {passed} of "
            f"{len(rows)} test cells passed.")


NOT_GRADED = ("Not graded: the grading machine cannot confine a submission as this course requires. This is "
              "not a problem with your notebook; your instructor has been told.")


def grade(submission_dir: Path, source_path: Path, settings: Settings, protected: list[Path]) -> Outcome:
    """Judge the submission in ``submission_dir`` against the instructor's notebook at ``source_path``; the
    sandboxes may read none of ``protected`` (the platform's folders: the source, the results, the others)."""
    from autograder.grading import protections
    from autograder.grading.cluster import not_gradable
    from autograder.grading.judge import Policy, judge_notebook

    started = time.perf_counter()
    source = nbformat.read(str(source_path), as_version=4)
    path, why = find_submission(submission_dir, settings.assignment)
    nb = None
    if path is not None:
        nb, why = read_notebook(path)
    if nb is None:                                    # as nbgrader's SubmissionExporter: zero in every cell, why
        nb = nbformat.v4.new_notebook()
        prepare(nb, source)
        rows = _rows(nb, not_gradable(nb, why), _answers(source))
        return Outcome(NOT_GRADABLE, rows, f"Not graded: {why}.", [why], seconds=time.perf_counter() - started)
    restored = prepare(nb, source)
    policy = Policy(protected=tuple(str(p) for p in protected), allow_unconfined=settings.allow_unconfined)
    try:
        judgement = judge_notebook(nb, cell_seconds=settings.cell_timeout, policy=policy)
    except protections.ConfinementRefused as refused:
        return Outcome(REFUSED, _zero_rows(source, NOT_GRADED), NOT_GRADED,
                       [str(refused), "On a grading platform, --allow-unconfined is a choice made when building the "
                        "package: `python3 workbook.py package PLATFORM NN --allow-unconfined`."],
                       seconds=time.perf_counter() - started)
    order = [nbgrader_meta(c)["grade_id"] for c in source.cells if is_test_cell(c)]
    rows = sorted(_rows(nb, judgement, _answers(source)), key=lambda row: order.index(row.grade_id))
    stopped = judgement.stopped
    notes = [protections.summary(judgement.confinement)]
    if restored:
        notes.append(f"test cells missing from the submission, put back from the instructor's notebook: "
                     f"{', '.join(restored)}")
    if judgement.unconfined:
        notes.append(protections.unconfined_note(judgement.unconfined))
    notes += [f"stopped: {s}" for s in stopped]
    summary = " ".join([_summary(rows)] + [f"Stopped: {_bounded(s).rstrip('.')}." for s in stopped[:5]]
                       + ([protections.unconfined_note(judgement.unconfined)] if judgement.unconfined else []))
    return Outcome(GRADED, rows, summary, notes, judgement.confinement, judgement.unconfined,
                   time.perf_counter() - started)


def finish(write, settings: Settings, source_path: Path, work) -> int:
    """Run ``work`` (returning an Outcome) and hand its Outcome to ``write`` exactly once: also when it runs
    past ``settings.total_seconds`` (then this process ends, with every sandbox it started) or raises (the
    grader's own failure, shown as such, never a crash without results). Returns the exit status."""
    lock, written = threading.Lock(), []

    def once(outcome: Outcome) -> None:
        with lock:
            if not written:
                write(outcome)
                written.append(outcome)

    def fallback(status: str, message: str) -> Outcome:
        try:
            rows = _zero_rows(nbformat.read(str(source_path), as_version=4), message)
        except Exception:      # noqa: BLE001 (the instructor's notebook itself unreadable: no rows to give)
            rows = []
        return Outcome(status, rows, message, [message])

    def out_of_time() -> None:
        once(fallback(OUT_OF_TIME, f"Not graded: grading took over {settings.total_seconds:g} s (each cell may "
                                   f"run {settings.cell_timeout:g} s; is there a loop that never ends in several "
                                   f"cells?)."))
        print(f"[workbook] out of time after {settings.total_seconds:g} s", flush=True)
        os._exit(0)

    timer = threading.Timer(settings.total_seconds, out_of_time)
    timer.daemon = True
    timer.start()
    try:
        outcome = work()
    except Exception as exc:   # noqa: BLE001 (the grader's own failure: still a result for the platform)
        traceback.print_exc()
        outcome = fallback(FAILED, f"Not graded: the grader failed ({type(exc).__name__}: {_bounded(str(exc))}). "
                                   f"This is not a problem with your notebook; your instructor has been told.")
    finally:
        timer.cancel()
    once(outcome)
    for note in outcome.notes:
        print(f"[workbook] {note}", flush=True)
    return 0
