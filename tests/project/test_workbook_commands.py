"""workbook.py, the one entry point: every command answers --help with its usage."""

import importlib.util
import subprocess
import sys

import pytest

from notebook_files import ROOT

_spec = importlib.util.spec_from_file_location("workbook", ROOT / "workbook.py")
workbook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workbook)


def _help(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "workbook.py"), *arguments, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", workbook.COMMANDS)
def test_every_command_prints_its_usage(command):
    answer = _help(command)
    assert answer.returncode == 0 and "usage" in answer.stdout.lower(), \
        f"workbook.py {command} --help (exit {answer.returncode}):\n{answer.stdout[-1500:]}\n{answer.stderr[-1500:]}"


def test_workbook_help_lists_every_command():
    answer = _help()
    assert answer.returncode == 0
    assert all(f"workbook.py {command}" in answer.stdout for command in workbook.COMMANDS), answer.stdout
