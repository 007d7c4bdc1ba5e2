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


def test_the_installed_torch_is_a_build_of_the_declared_range():
    """The notebooks' claims and the grading are tested on the releases pyproject.toml declares, on the CPU
    build and on pip's default CUDA build (README, "Which PyTorch"): an environment that drifted outside the
    range (a newer release pulled in by another package) is caught here, whatever build it is."""
    import importlib.metadata

    import torch
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = next(r for r in project["dependencies"] if _name(r) == "torch")
    assert declared == "torch>=2.13,<2.16"
    installed = Version(importlib.metadata.version("torch"))
    assert installed in SpecifierSet(declared[len("torch"):]), (installed, declared)
    assert installed.public == torch.__version__.split("+")[0]
    build = "CUDA" if torch.version.cuda else "ROCm" if getattr(torch.version, "hip", None) else "CPU"
    assert build in ("CPU", "CUDA"), f"torch {installed} is a {build} build, which the course is not tested on"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 workbook.py test" in readme and "python3 workbook.py test" in ci
    assert "python3 workbook.py lab" in readme


def test_ci_tests_both_ends_of_the_declared_range():
    """README, "Which PyTorch": job 1 runs on the lowest release of the range (workbook.py's fallback, 2.13.0's
    CPU build here), job 2 on the newest, installed from PyPI with no pip configuration file (a machine's may
    cap torch below it), and the README names both."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    import workbook
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = SpecifierSet(next(r for r in project["dependencies"] if _name(r) == "torch")[len("torch"):])
    upper = Version(next(s.version for s in declared if s.operator == "<"))
    lower = Version(next(s.version for s in declared if s.operator == ">="))
    installs = re.findall(r'^(PIP_CONFIG_FILE=/dev/null )?"\$newest/bin/pip" install .*?"torch==([\d.]+)"',
                          (ROOT / ".ci" / "run").read_text(), re.M)
    assert len(installs) == 1 and installs[0][0], "job 2 installs torch once, without the machine's pip configuration"
    newest = Version(installs[0][1])
    assert newest in declared and newest.release[:2] == (upper.major, upper.minor - 1)
    assert Version(workbook.FALLBACK_TORCH.split("==")[1]).release[:2] == lower.release[:2]
    readme = (ROOT / "README.md").read_text()
    assert f"{newest} as pip installs it by default" in readme
    assert f"{workbook.FALLBACK_TORCH.split('==')[1]}'s CPU build" in readme
