"""nbgrader's autograde step, done by the trusted judge (``autograder.judge``) instead of a kernel.

``nbgrader_config.py`` puts ``JudgeInSandbox`` where nbgrader's ``Execute`` was, so both
``nbgrader autograde`` and ``workbook-grade`` (which runs nbgrader's Autograde in parallel)
score from verdicts the submission could not write. nbgrader's own ``SaveAutoGrades`` then
reads those verdicts from the test cells' outputs, exactly as it reads a kernel's.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Float

from autograder.judge import apply_judgement, judge_notebook
from autograder.notebook_runner import DEFAULT_CELL_TIMEOUT


class JudgeInSandbox(NbGraderPreprocessor):
    timeout = Float(DEFAULT_CELL_TIMEOUT, help="Seconds a cell of the submission may run.").tag(config=True)
    stopped: list[str] = []   # what the last notebook's sandbox had to stop; read by workbook-grade's child

    def preprocess(self, nb, resources):
        judgement = judge_notebook(nb, cell_seconds=self.timeout)
        apply_judgement(nb, judgement)
        JudgeInSandbox.stopped = judgement.stopped
        failed = [v.grade_id for v in judgement.verdicts if not v.passed]
        self.log.info("Judged %d test cells in %.1f s (%s); failed: %s", len(judgement.verdicts),
                      judgement.seconds, ", ".join(f"{k}: {v}" for k, v in judgement.confinement.items()),
                      ", ".join(failed) or "none")
        return nb, resources
