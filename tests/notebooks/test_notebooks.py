"""Every notebook, run top to bottom the way the grader runs it."""

import pytest

from autograder.commands.check import grade_notebook
from autograder.contract import is_test_cell
from notebook_files import RELEASED, SOLUTIONS, graded_notebooks


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_scores_full_marks_with_no_errors_or_warnings(path):
    result = grade_notebook(path)
    failures = [(t.grade_id, t.message) for t in result.tests if not t.passed]
    assert failures == [] and result.error is None
    if path in graded_notebooks([path]):
        assert result.max_score > 0
    noisy = [(i, o.get("ename") or o.get("text", "")[:200])
             for i, cell in enumerate(result.executed.cells) if cell.cell_type == "code"
             for o in cell.outputs
             if o.output_type == "error" or (o.output_type == "stream" and o.name == "stderr")]
    assert noisy == []


@pytest.mark.parametrize("path", graded_notebooks(RELEASED), ids=lambda p: p.stem)
def test_student_notebook_scores_zero_and_only_the_exercises_fail(path):
    result = grade_notebook(path)
    assert result.error is None and result.tests
    assert result.score == 0
    for test in result.tests:
        assert test.message.startswith("not answered yet"), (test.grade_id, test.message)
    # Everything outside the test cells (demos, plots, explanations) still runs.
    broken = [i for i, cell in enumerate(result.executed.cells)
              if cell.cell_type == "code" and not is_test_cell(cell)
              and any(o.output_type == "error" for o in cell.outputs)]
    assert broken == []
