"""The classroom path: one command renders a notebook with its solutions, outputs and plots."""

import re

import nbformat
import pytest

from autograder import classroom
from autograder.contract import nbgrader_meta
from autograder.course import SOLUTIONS_DIR

ASSIGNMENTS = sorted(p.name for p in SOLUTIONS_DIR.iterdir() if (p / f"{p.name}.ipynb").exists())
EMBEDDED_PNG = re.compile(r'<img[^>]*src="data:image/png;base64,')


def solution(assignment):
    return nbformat.read(str(SOLUTIONS_DIR / assignment / f"{assignment}.ipynb"), as_version=4)


def plots_in(nb) -> int:
    return sum("plt.show()" in c.source for c in nb.cells if c.cell_type == "code")


@pytest.mark.skipif("01_state_dict_aliasing" not in ASSIGNMENTS, reason="notebook 01 is not written yet")
def test_notebook_01_renders_to_html_and_slides_with_its_plots_and_pass_messages(tmp_path, capsys):
    assert classroom.main(["01", "--out", str(tmp_path), "--slides"]) == 0
    assert "-> " in capsys.readouterr().out  # the teacher is told where the files are
    html = (tmp_path / "01_state_dict_aliasing.html").read_text(encoding="utf-8")
    assert len(EMBEDDED_PNG.findall(html)) >= plots_in(solution("01_state_dict_aliasing")) >= 1
    assert "What goes wrong" in html
    assert "✓" in html and "NotImplementedError" not in html
    # The room sees the student version, answered: no solution markers, no hidden tests.
    assert "BEGIN SOLUTION" not in html and "HIDDEN TESTS" not in html
    slides = (tmp_path / "01_state_dict_aliasing.slides.html").read_text(encoding="utf-8")
    assert "reveal" in slides and EMBEDDED_PNG.search(slides)
    assert slides.count("<section") >= 5  # a slide per section, not one long page


@pytest.mark.skipif("00_start_here" not in ASSIGNMENTS, reason="notebook 00 is not written yet")
def test_demo_option_renders_only_the_opening_block(tmp_path):
    assert classroom.main(["00", "--demo", "--out", str(tmp_path)]) == 0
    html = (tmp_path / "00_start_here-demo.html").read_text(encoding="utf-8")
    assert "What goes wrong" in html and EMBEDDED_PNG.search(html)
    headings = re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", html, flags=re.S)
    assert any("What goes wrong" in h for h in headings)
    assert not [h for h in headings if "Exercise" in h or "Summary" in h or "map of the workbook" in h]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_notebook_opens_with_a_what_goes_wrong_block_a_teacher_can_show(assignment):
    block = classroom.demo_block(solution(assignment)).cells
    assert any(c.cell_type == "code" for c in block), "the demo block has no code to run"
    assert not [nbgrader_meta(c)["grade_id"] for c in block if nbgrader_meta(c).get("grade_id")], \
        "the demo block must come before the exercises"


def test_filled_in_notebook_takes_each_answer_from_the_solution():
    student = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()",
                                  metadata={"nbgrader": {"solution": True, "grade": False, "grade_id": "f"}}),
        nbformat.v4.new_code_cell("check(f)", metadata={"nbgrader": {"grade": True, "grade_id": "test_f"}}),
    ])
    answer = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"
    source = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(answer, metadata={"nbgrader": {"solution": True, "grade": False, "grade_id": "f"}}),
        nbformat.v4.new_code_cell("check(f)\n### BEGIN HIDDEN TESTS\ncheck(f, 2)\n### END HIDDEN TESTS",
                                  metadata={"nbgrader": {"grade": True, "grade_id": "test_f"}}),
    ])
    filled = classroom.filled_in_notebook(student, source)
    assert filled.cells[0].source == "def f():\n    return 1"
    assert filled.cells[1].source == "check(f)"
    assert "NotImplementedError" in student.cells[0].source  # the input is left alone


def test_unknown_notebook_is_reported_with_the_known_names():
    with pytest.raises(SystemExit, match="no notebook matches '99'.*01_state_dict_aliasing"):
        classroom.find_assignments(["99"])
