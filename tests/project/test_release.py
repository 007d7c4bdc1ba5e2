"""notebooks/ is exactly what nbgrader generate_assignment makes of solutions/."""

import shutil

import nbformat
import pytest

from autograder.commands.release import generate_assignments, main as release_main

from notebook_files import RELEASED, ROOT, SOLUTIONS



def test_every_solution_has_a_released_student_version():
    assert [p.relative_to(ROOT / "solutions") for p in SOLUTIONS] == \
           [p.relative_to(ROOT / "notebooks") for p in RELEASED]


@pytest.mark.parametrize("path", SOLUTIONS + RELEASED, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_committed_notebooks_carry_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)] == []


def test_released_notebooks_match_a_fresh_generate_assignment(tmp_path):
    shutil.copy(ROOT / "nbgrader_config.py", tmp_path)
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    assert generate_assignments(tmp_path, [solution.parent.name for solution in SOLUTIONS]) == []
    drifted = []
    for released in RELEASED:
        fresh = tmp_path / "notebooks" / released.parent.name / released.name
        if nbformat.read(fresh, 4) != nbformat.read(released, 4):
            drifted.append(released.parent.name)
    assert drifted == [], f"run `python3 workbook.py release {' '.join(drifted)}` and commit the result"


def test_workbook_release_names_the_notebooks_it_knows_when_a_selector_matches_none():
    with pytest.raises(SystemExit, match="no notebook matches '99'.*known: 00_start_here"):
        release_main(["99"])
