"""Tests are grouped as the course reads: notebooks/ (each notebook's checks and fixtures run, the
notebooks themselves), grading/ (the trusted-grading engine), commands/ (workbook-check, -grade, -demo),
project/ (release, packaging, authoring tools, JupyterLab in a browser). support/ holds what they share:
the fixture answers, the notebook's check calls, course and browser set-up."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from autograder.contract import with_tools_on_path  # noqa: E402

# nbgrader shells out to `alembic`: the environment's bin/ must be on PATH.
os.environ.update(with_tools_on_path())


@pytest.fixture(autouse=True)
def torch_load_allowlist_left_as_it_was():
    """A fixture may allowlist globals for torch.load (as a learner following torch's hint does): that
    setting of the process must not leak into the next test."""
    import torch
    registered = torch.serialization.get_safe_globals()
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(registered)
