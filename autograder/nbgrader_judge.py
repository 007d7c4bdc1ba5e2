"""nbgrader's autograde step, done by the trusted judge (``autograder.judge``) instead of a kernel.

``nbgrader_config.py`` puts ``JudgeInSandbox`` where nbgrader's ``Execute`` was, so both
``nbgrader autograde`` and ``workbook-grade`` (which runs nbgrader's Autograde in parallel)
score from verdicts the submission could not write. nbgrader's own ``SaveAutoGrades`` then
reads those verdicts from the test cells' outputs, exactly as it reads a kernel's.
"""

from __future__ import annotations

import nbformat
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Float

from autograder.judge import apply_judgement, judge_notebook
from autograder.notebook_runner import DEFAULT_CELL_TIMEOUT


class JudgeInSandbox(NbGraderPreprocessor):
    timeout = Float(DEFAULT_CELL_TIMEOUT, help="Seconds a cell of the submission may run.").tag(config=True)
    stopped: list[str] = []   # what the last notebook's sandbox had to stop; read by workbook-grade's child

    def preprocess(self, nb, resources):
        restored = restore_deleted_test_cells(nb, resources)
        if restored:
            self.log.warning("Test cells missing from the submission, put back from the gradebook: %s",
                             ", ".join(restored))
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
    present = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in nb.cells}
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
