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
    # What a learner sees under each test cell: one line, not a traceback through the checks' frames.
    for cell in filter(is_test_cell, result.executed.cells):
        shown = [line for o in cell.outputs if o.output_type == "error" for line in o.traceback]
        assert len(shown) == 1 and "is not answered yet" in shown[0], shown


def test_a_failing_check_shows_its_message_and_the_learners_own_frames_only(tmp_path):
    """In the learner's kernel a wrong answer shows the trap's message, an exception from the learner's
    code shows where in that code it came from, and the cell still ends in the same error."""
    import nbformat

    from autograder.commands.check import CellRunner

    check = "from autograder.start_here import check_same_weights_buffers\ncheck_same_weights_buffers(same_weights)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        "import torch\ndef same_weights(a, b):\n    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))",
        check,
        "def same_weights(a, b):\n    pairs = dict(zip(a.state_dict(), b.state_dict()))\n    return pairs['nothing']",
        check)])
    CellRunner(nb, tmp_path, timeout=60).run_all()
    (wrong,), (crashed,) = (nb.cells[1].outputs, nb.cells[3].outputs)
    assert wrong.ename == "AssertionError" and wrong.traceback == [wrong.traceback[0]]
    assert "running_mean" in wrong.traceback[0] and "buffers, not parameters" in wrong.traceback[0]
    assert crashed.ename == "KeyError" and len(crashed.traceback) == 2
    assert "in your code, line 3, in same_weights: return pairs['nothing']" in crashed.traceback[0]
