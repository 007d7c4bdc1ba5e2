"""The course's two nbgrader plug-ins (``nbgrader_config.py`` names them).

``JudgeInSandbox``: nbgrader's autograde step, done by the trusted judge (``autograder.grading.judge``)
instead of a kernel. ``nbgrader_config.py`` puts it where nbgrader's ``Execute`` was, so both
``nbgrader autograde`` and ``workbook-grade`` (which runs nbgrader's Autograde in parallel) score
from verdicts the submission could not write. nbgrader's own ``SaveAutoGrades`` then reads those
verdicts from the test cells' outputs, exactly as it reads a kernel's.

``SubmissionExporter``: autograde's way of reading a submission. A file that is not a notebook is graded
as an empty one: the judge puts every test cell back and scores each zero, saying why, instead of
nbgrader ending with a traceback.

``RecordUnconfined``: after nbgrader's SaveAutoGrades, the gradebook's comment on each answer of a
submission graded with ``--allow-unconfined`` says what its sandbox lacked.

``RedactHiddenTests`` and ``WrapLongOutputs``: feedback that shows each failure message, wrapped at the
page's edge, but never the hidden tests. By
default nbgrader's feedback HTML shows the autograded notebook: the source of hidden test blocks and
the traceback lines that point into them. This preprocessor, added to ``GenerateFeedback.preprocessors``,
replaces each hidden block with a one-line note and reduces every error in a test cell to its
``ExceptionName: message`` line, which is written for the learner.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbconvert.exporters import NotebookExporter
from nbconvert.preprocessors import Preprocessor
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Float, Unicode

from autograder.contract import (DEFAULT_CELL_TIMEOUT, HIDDEN_BEGIN, HIDDEN_END, is_answer_cell, is_test_cell,
                                 nbgrader_meta, read_notebook)
from autograder.grading import protections

# The judge (and with it torch, 2 s) is imported only where a submission is judged: every nbgrader command
# reads this module through nbgrader_config.py.

HIDDEN_NOTE = "# (hidden tests with other seeds and sizes ran here)"


class JudgeInSandbox(NbGraderPreprocessor):
    timeout = Float(DEFAULT_CELL_TIMEOUT, help="Seconds a cell of the submission may run.").tag(config=True)
    scheduler = Unicode("", help="A Dask scheduler's address (tcp://HOST:PORT): judge on its workers of this "
                                 "course instead of here (autograder/grading/cluster.py).").tag(config=True)
    allow_unconfined = Bool(False, help="Grade even where this machine lacks a protection the sandbox needs "
                                        "(docs/grading.md); each grade records what was missing.").tag(config=True)
    parallel = Bool(False, help="Other submissions are judged beside this one on this machine (workbook-grade "
                                "--jobs N sets it): each sandbox then needs CPU and processes of its own."
                    ).tag(config=True)
    stopped: list[str] = []   # what the last notebook's sandbox had to stop; read by workbook-grade's child
    _said: list = []          # the confinement line, said once per process ([summary]) or the refusal

    def preprocess(self, nb, resources):
        if self._said and isinstance(self._said[0], protections.ConfinementRefused):
            raise self._said[0]                    # said once; every other submission is refused alike
        restored = restore_deleted_test_cells(nb, resources)
        if restored:
            self.log.warning("Test cells missing from the submission, put back from the gradebook: %s",
                             ", ".join(restored))
        from autograder.grading.judge import Policy, apply_judgement, judge_notebook
        if not self._said:
            from autograder.grading import layout
            try:          # the course's notebooks are judged by the course's own checks, or not at all
                layout.refuse_disagreement(Path(self._protected(resources)[0]))
            except layout.LayoutRefused as refused:
                self.log.error("%s", refused)
                JudgeInSandbox._said[:] = [refused]
                raise
        unreadable = nb.metadata.get(UNREADABLE)
        if unreadable:
            from autograder.grading.cluster import not_gradable
            self.log.error("Not graded: %s", unreadable)
            apply_judgement(nb, not_gradable(nb, unreadable))
            JudgeInSandbox.stopped = [unreadable]
            return nb, resources
        if self.scheduler:
            from autograder.grading.cluster import judge_remotely   # Dask only where a cluster grades
            name = f"{resources.get('nbgrader', {}).get('student', '')}-{resources.get('unique_key', '')}"
            judgement = judge_remotely(self.scheduler, nb, self.timeout, name)   # the worker's own rule holds there
        else:
            policy = Policy(self._protected(resources), self.parallel, self.allow_unconfined)
            try:
                judgement = judge_notebook(nb, cell_seconds=self.timeout, policy=policy)
            except protections.ConfinementRefused as refused:
                self.log.error("%s", refused)
                JudgeInSandbox._said[:] = [refused]
                raise
            if not self._said:
                self.log.info("%s", protections.summary(judgement.confinement))
                JudgeInSandbox._said[:] = ["said"]
        if judgement.unconfined:
            self.log.warning("%s", protections.unconfined_note(judgement.unconfined))
        resources.setdefault("workbook", {})["unconfined"] = judgement.unconfined
        apply_judgement(nb, judgement)
        JudgeInSandbox.stopped = judgement.stopped
        failed = [v.grade_id for v in judgement.verdicts if not v.passed]
        self.log.info("Judged %d test cells in %.1f s (%s); failed: %s", len(judgement.verdicts),
                      judgement.seconds, ", ".join(f"{k}: {v}" for k, v in judgement.confinement.items()),
                      ", ".join(failed) or "none")
        return nb, resources

    def _protected(self, resources) -> tuple:
        """What the sandbox must not read: the course folder, its gradebook, the submission's folder."""
        course = self.config.get("CourseDirectory", {}).get("root") or os.getcwd()
        paths = [course, resources.get("metadata", {}).get("path") or course]
        db_url = resources.get("nbgrader", {}).get("db_url", "")
        if db_url.startswith("sqlite:///"):
            paths.append(db_url[len("sqlite:///"):].split("?", 1)[0])
        return tuple(dict.fromkeys(str(Path(p).resolve()) for p in paths))


class RecordUnconfined(NbGraderPreprocessor):
    """After SaveAutoGrades: where the submission was graded with --allow-unconfined, the gradebook's comment
    on each of its answers says what the sandbox lacked (the formgrader and the feedback show it)."""

    enabled = Bool(True)

    def preprocess(self, nb, resources):
        lacking = resources.get("workbook", {}).get("unconfined")
        if not lacking:
            return nb, resources
        info = resources["nbgrader"]
        note = protections.unconfined_note(lacking)
        with Gradebook(info["db_url"]) as gb:
            for cell in filter(is_answer_cell, nb.cells):
                comment = gb.find_comment(nbgrader_meta(cell)["grade_id"], info["notebook"], info["assignment"],
                                          info["student"])
                comment.auto_comment = " ".join(filter(None, [comment.auto_comment, note]))
            gb.db.commit()
        return nb, resources


UNREADABLE = "workbook_unreadable"    # notebook metadata: why the submitted file could not be read


class SubmissionExporter(NotebookExporter):
    """Autograde's exporter (``c.Autograde.exporter_class``): a submitted file that nbformat cannot read (not
    JSON, not a notebook) becomes an empty notebook saying why, which JudgeInSandbox scores zero cell by cell."""

    def from_filename(self, filename, resources=None, **kw):
        _, why = read_notebook(Path(filename))
        if why is None:
            return super().from_filename(filename, resources, **kw)
        resources = resources if resources is not None else {}
        if not resources.get("metadata"):
            resources["metadata"] = {}
        resources["metadata"].update(name=Path(filename).stem, path=str(Path(filename).parent))
        empty = nbformat.v4.new_notebook()
        empty.metadata[UNREADABLE] = why
        return self.from_notebook_node(empty, resources, **kw)


def restore_deleted_test_cells(nb, resources) -> list[str]:
    """Put back, at the end, every test cell the submission deleted (nbgrader restores only edited ones).

    The restored cell is judged like any other, so deleting a test neither scores nor loses points.
    """
    info = resources.get("nbgrader", {})
    present = {nbgrader_meta(cell).get("grade_id") for cell in nb.cells}
    restored = []
    with Gradebook(info["db_url"]) as gb:
        notebook = gb.find_notebook(info["notebook"], info["assignment"])
        answers = {cell.name for cell in notebook.solution_cells}
        for grade_cell in notebook.grade_cells:
            if grade_cell.cell_type != "code" or grade_cell.name in answers or grade_cell.name in present:
                continue
            source = gb.find_source_cell(grade_cell.name, info["notebook"], info["assignment"])
            nb.cells.append(nbformat.v4.new_code_cell(source.source, metadata={"nbgrader": {
                "grade": True, "solution": False, "locked": True, "grade_id": grade_cell.name,
                "points": grade_cell.max_score, "schema_version": 3}}))
            restored.append(grade_cell.name)
    return restored


def redact_hidden_blocks(source: str) -> str:
    kept, hidden = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            hidden = True
            kept.append(line[: len(line) - len(line.lstrip())] + HIDDEN_NOTE)
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept)


class WrapLongOutputs(NbGraderPreprocessor):
    """Feedback: a failure message (one long line) wraps at the page's edge. nbconvert's page keeps every
    output line as it is, so a message ran off sideways, most of it out of sight."""

    def preprocess(self, nb, resources):
        resources.setdefault("inlining", {}).setdefault("css", []).append(
            "div.output_area pre { white-space: pre-wrap; overflow-wrap: anywhere; }")
        return nb, resources


class RedactHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert registers preprocessors switched off unless they say otherwise

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell):
            cell.source = redact_hidden_blocks(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
