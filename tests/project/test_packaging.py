"""The two ways to install (pip with pyproject.toml, conda with environment.yml) agree."""

import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from notebook_files import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _environment_yml_pip_requirements() -> list[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    found = []
    for line in lines[start + 1:]:
        stripped = line.strip()
        if not stripped.startswith("- "):
            break
        found.append(stripped[2:])
    return found


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from_conda = [r for r in _environment_yml_pip_requirements() if not r.startswith("-e")]
    assert sorted(from_conda) == sorted(project["dependencies"])


def test_environment_yml_installs_the_project_on_python_3_11():
    text = (ROOT / "environment.yml").read_text()
    assert "-e ." in _environment_yml_pip_requirements()
    assert re.search(r"^\s*- python=3\.11\s*$", text, re.M)


def test_the_installed_torch_is_the_pinned_release_the_notebooks_were_checked_against():
    """The notebooks' claims about PyTorch were run on the pinned release; an environment that drifted
    from it (a looser pin, a CUDA build pulled in by another package) is caught here."""
    import importlib.metadata
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = next(r for r in project["dependencies"] if _name(r) == "torch")
    assert pin == "torch==2.13.0"
    assert importlib.metadata.version("torch").split("+")[0] == pin.split("==")[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 workbook.py test" in readme and "python3 workbook.py test" in ci
    assert "python3 workbook.py lab" in readme
