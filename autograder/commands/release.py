"""notebooks/ = nbgrader generate_assignment(solutions/), for the named notebooks or all of them.

Run as ``python3 workbook.py release [NN ...]``; with ``--student-package DIR`` it then also writes
the student distribution into DIR (``autograder.commands.student_package``: every released notebook and
a wheel without solutions or hidden tests). It is nbgrader's own generate_assignment, driven
through nbgrader's Python API with the course's nbgrader_config.py, so all notebooks are released in
one process: the command line would start nbgrader (and import its configuration) once per notebook.
A throwaway gradebook is used: releasing must not touch an instructor's grades.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autograder.course import NOTEBOOKS, REPO_ROOT, matching


def generate_assignments(course: Path, assignments: list[str]) -> list[str]:
    """Run generate_assignment for each assignment of the course folder ``course`` (its solutions/ and
    nbgrader_config.py) into its notebooks/; return the error logs of those that failed."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    config.CourseDirectory.root = str(course)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        config.CourseDirectory.db_url = f"sqlite:///{Path(tmp) / 'release.db'}"
        api = NbGraderAPI(config=config)
        for name in assignments:
            result = api.generate_assignment(name, force=True)
            if not result["success"]:
                failed.append(f"{name}: {result.get('error') or result.get('log')}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook.py release", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to release: names or prefixes such as 04 (default: all)")
    parser.add_argument("--student-package", metavar="DIR", nargs="?", const="",
                        help="then write the student distribution into DIR")
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if args.student_package == "":
        raise SystemExit("workbook.py release: --student-package needs a folder (--student-package DIR)")
    package_dir = Path(args.student_package).expanduser().resolve() if args.student_package else None
    names = args.names
    assignments = matching(names, [notebook.folder for notebook in NOTEBOOKS], "workbook.py release")
    failed = generate_assignments(REPO_ROOT, assignments)
    for name in assignments:
        if not any(f.startswith(f"{name}:") for f in failed):
            print(f"released notebooks/{name}/")
    for failure in failed:
        print(f"release failed: {failure}", file=sys.stderr)
    if failed:
        return 1
    if package_dir is not None:
        from autograder.commands.student_package import build_student_package

        wheel = build_student_package(package_dir)
        print(f"student distribution in {package_dir}/: {wheel.name}, notebooks/, README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
