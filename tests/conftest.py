"""Tests are grouped as the course reads: notebooks/ (each notebook's checks and fixtures run, the
notebooks themselves), grading/ (the trusted-grading engine), commands/ (workbook-check, -grade, -demo),
project/ (release, packaging, authoring tools, JupyterLab in a browser). support/ holds what they share:
the fixture answers, the notebook's check calls, course and browser set-up."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from autograder.contract import with_tools_on_path  # noqa: E402

# nbgrader shells out to `alembic`: the environment's bin/ must be on PATH.
os.environ.update(with_tools_on_path())
