"""The course's two nbgrader plug-ins (``nbgrader_config.py`` names them).

``JudgeInSandbox``: nbgrader's autograde step, done by the trusted judge (``autograder.grading.judge``)
instead of a kernel. ``nbgrader_config.py`` puts it where nbgrader's ``Execute`` was, so both
``nbgrader autograde`` and ``workbook-grade`` (which runs nbgrader's Autograde in parallel) score
from verdicts the submission could not write. nbgrader's own ``SaveAutoGrades`` then reads those
verdicts from the test cells' outputs, exactly as it reads a kernel's.

``RedactHiddenTests``: feedback that shows each failure message but never the hidden tests. By
default nbgrader's feedback HTML shows the autograded notebook: the source of hidden test blocks and
the traceback lines that point into them. This preprocessor, added to ``GenerateFeedback.preprocessors``,
replaces each hidden block with a one-line note and reduces every error in a test cell to its
``ExceptionName: message`` line, which is written for the learner.
"""

from __future__ import annotations

import nbformat
from nbconvert.preprocessors import Preprocessor
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Float, Unicode

from autograder.contract import DEFAULT_CELL_TIMEOUT, HIDDEN_BEGIN, HIDDEN_END, is_test_cell, nbgrader_meta
from autograder.grading.judge import apply_judgement, judge_notebook

HIDDEN_NOTE = "# (hidden tests with other seeds and sizes ran here)"


class JudgeInSandbox(NbGraderPreprocessor):
    timeout = Float(DEFAULT_CELL_TIMEOUT, help="Seconds a cell of the submission may run.").tag(config=True)
    scheduler = Unicode("", help="A Dask scheduler's address (tcp://HOST:PORT): judge on its workers of this "
                                 "course instead of here (autograder/grading/cluster.py).").tag(config=True)
    stopped: list[str] = []   # what the last notebook's sandbox had to stop; read by workbook-grade's child

    def preprocess(self, nb, resources):
        restored = restore_deleted_test_cells(nb, resources)
        if restored:
            self.log.warning("Test cells missing from the submission, put back from the gradebook: %s",
                             ", ".join(restored))
        if self.scheduler:
            from autograder.grading.cluster import judge_remotely   # Dask only where a cluster grades
            name = f"{resources.get('nbgrader', {}).get('student', '')}-{resources.get('unique_key', '')}"
            judgement = judge_remotely(self.scheduler, nb, self.timeout, name)
        else:
            judgement = judge_notebook(nb, cell_seconds=self.timeout)
        apply_judgement(nb, judgement)
        JudgeInSandbox.stopped = judgement.stopped
        failed = [v.grade_id for v in judgement.verdicts if not v.passed]
        self.log.info("Judged %d test cells in %.1f s (%s); failed: %s", len(judgement.verdicts),
                      judgement.seconds, ", ".join(f"{k}: {v}" for k, v in judgement.confinement.items()),
                      ", ".join(failed) or "none")
        return nb, resources


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


class RedactHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert registers preprocessors switched off unless they say otherwise

    def preprocess_cell(self, cell, resources, index):
        if is_test_cell(cell):
            cell.source = redact_hidden_blocks(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
