"""Gradescope's entry point: ``run_autograder`` runs ``python -m autograder.platforms.gradescope``.

Gradescope's autograder specification (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
the zip's contents are in /autograder/source, the learner's files in /autograder/submission, and what
Gradescope records is /autograder/results/results.json; what this process prints goes to the instructor's
"Autograder Output" only (stdout is hidden from learners unless ``stdout_visibility`` says otherwise).
One result per test cell: ``name`` its grade_id, ``score``/``max_score`` its points, ``output`` the check's
one-line message, ``visibility`` as the package was built. A submission that could not be graded, a
machine that cannot confine it, a grader out of time: each is a results.json that says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autograder.platforms.submission import CONFIG, GRADED, Outcome, Settings, finish, grade, platform_root

DEFAULT_ROOT = "/autograder"
SOURCE_NOTEBOOK = "solutions/{0}/{0}.ipynb"      # inside source/: the instructor's notebook, hidden tests in it


def results(outcome: Outcome, settings: Settings) -> dict:
    """results.json in Gradescope's format (specs above, "Output format")."""
    tests = [{"name": row.grade_id, "score": row.points, "max_score": row.max_points,
              "status": "passed" if row.passed else "failed", "output": row.text, "output_format": "text",
              "tags": [row.exercise], "visibility": settings.visibility} for row in outcome.rows]
    return {"score": outcome.score, "execution_time": round(outcome.seconds), "output": outcome.summary,
            "output_format": "text", "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"status": outcome.status, "assignment": settings.assignment, "course": settings.version,
                           "graded": outcome.status == GRADED, "unconfined": outcome.unconfined,
                           "notes": outcome.notes}}


def main() -> int:
    root = platform_root(DEFAULT_ROOT)
    source = root / "source"
    settings = Settings.read(source / CONFIG)
    notebook = source / SOURCE_NOTEBOOK.format(settings.assignment)
    import autograder
    print(f"[workbook] grading {settings.assignment} with the autograder package at "
          f"{Path(autograder.__file__).parent}", flush=True)

    def write(outcome: Outcome) -> None:
        (root / "results").mkdir(parents=True, exist_ok=True)
        (root / "results" / "results.json").write_text(json.dumps(results(outcome, settings), indent=1))

    # The sandbox may read none of /autograder: not the hidden tests, the results, nor submission_metadata.json
    # (names, e-mail addresses, earlier results). It reads the autograder package, which sandboxes are granted.
    return finish(write, settings, notebook,
                  lambda: grade(root / "submission", notebook, settings, protected=[root]))


if __name__ == "__main__":
    sys.exit(main())
