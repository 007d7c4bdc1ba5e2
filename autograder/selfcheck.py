"""``workbook-check``: grade my notebook, the way the grader will.

    workbook-check                      # every notebook in notebooks/
    workbook-check 01                   # notebooks whose name starts with 01
    workbook-check path/to/mine.ipynb   # one file
    workbook-check --json 01            # machine-readable, schema below

Exit status 0 only when every test cell of every notebook checked passed.

JSON schema (``"schema": "workbook-check/1"``)::

    {"schema": "workbook-check/1", "passed": bool, "score": float, "max_score": float,
     "notebooks": [{"path": str, "assignment": str, "score": float, "max_score": float,
                    "passed": bool, "error": str | null,
                    "tests": [{"grade_id": str, "exercise": str, "points": float,
                               "max_points": float, "passed": bool, "message": str}]}]}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .notebook_runner import DEFAULT_CELL_TIMEOUT, RELEASE_DIR, NotebookResult, grade_notebook

SCHEMA = "workbook-check/1"


def find_notebooks(selectors: list[str], root: Path = RELEASE_DIR) -> list[Path]:
    """Files named on the command line, or released notebooks whose name starts with a selector."""
    released = sorted(root.glob("*/*.ipynb"))
    if not selectors:
        return released
    found: list[Path] = []
    for selector in selectors:
        path = Path(selector)
        if path.suffix == ".ipynb" or path.exists():
            found.append(path)
            continue
        matches = [nb for nb in released if nb.stem.startswith(selector)]
        if not matches:
            raise SystemExit(f"workbook-check: no notebook matches {selector!r} "
                             f"(known: {', '.join(nb.stem for nb in released)})")
        found.extend(matches)
    return found


def format_table(result: NotebookResult) -> str:
    lines = [f"{result.assignment}: {result.score:g} / {result.max_score:g} points"]
    if result.error:
        lines.append(f"  problem: {result.error}")
    width = max([len(t.grade_id) for t in result.tests] + [7])
    lines.append(f"  {'grade_id':<{width}}  points  message")
    for t in result.tests:
        mark = "ok" if t.passed else "FAILED"
        score = f"{t.points:g}/{t.max_points:g}"
        message = t.message if not t.passed else ""
        lines.append(f"  {t.grade_id:<{width}}  {score:>6}  {mark}{'  ' + message if message else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbook-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files, or name prefixes such as 01 (default: all)")
    parser.add_argument("--json", action="store_true", help="print results as JSON (schema workbook-check/1)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT, help="seconds allowed per cell")
    args = parser.parse_args(argv)

    results = []
    for path in find_notebooks(args.notebooks):
        result = grade_notebook(path, timeout=args.timeout)
        results.append(result)
        if not args.json:
            print(format_table(result), flush=True)
            print()
    passed = bool(results) and all(r.passed for r in results)
    if args.json:
        print(json.dumps({
            "schema": SCHEMA,
            "passed": passed,
            "score": sum(r.score for r in results),
            "max_score": sum(r.max_score for r in results),
            "notebooks": [r.to_json() for r in results],
        }, indent=2))
    else:
        total = sum(r.score for r in results), sum(r.max_score for r in results)
        print(f"{'all passed' if passed else 'not all passed'}: {total[0]:g} / {total[1]:g} points")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
