"""notebooks/ is exactly what nbgrader generate_assignment makes of solutions/."""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from notebook_files import RELEASED, ROOT, SOLUTIONS

NBGRADER = str(Path(sys.executable).parent / "nbgrader")


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
    for solution in SOLUTIONS:
        subprocess.run([NBGRADER, "generate_assignment", solution.parent.name, "--force"],
                       cwd=tmp_path, check=True, capture_output=True)
    drifted = []
    for released in RELEASED:
        fresh = tmp_path / "notebooks" / released.parent.name / released.name
        if nbformat.read(fresh, 4) != nbformat.read(released, 4):
            drifted.append(released.parent.name)
    assert drifted == [], f"run `python3 workbook.py release {' '.join(drifted)}` and commit the result"
