"""PrairieLearn's entry point: the question's ``run.sh`` runs ``python -m autograder.platforms.prairielearn``.

PrairieLearn's external grading (https://prairielearn.readthedocs.io/en/latest/externalGrading/): the
grading container sees the question's ``tests/`` folder in /grade/tests (here: the instructor's notebook,
hidden tests in it, and ``grading.json``), the course's ``serverFilesCourse`` folders in
/grade/serverFilesCourse (the autograder package), the learner's files in /grade/student, and must write
/grade/results/results.json (at most 1 MB, read only when the entry point exits 0): ``score`` in [0, 1],
``gradable``, and ``tests`` with ``name``, ``points``, ``max_points``, ``message``, which the
``<pl-external-grader-results>`` element shows. A file that is not a gradable notebook, or a machine that
cannot confine it, is ``"gradable": false``: PrairieLearn then awards nothing and counts no attempt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autograder.platforms.submission import CONFIG, GRADED, NOT_GRADABLE, Outcome, Settings, finish, grade, \
    platform_root

DEFAULT_ROOT = "/grade"
RESULTS_BYTES = 1 << 20       # PrairieLearn refuses larger results


def results(outcome: Outcome, settings: Settings) -> dict:
    """results.json in PrairieLearn's format (docs above, "Grading results")."""
    tests = [{"name": row.grade_id, "description": f"exercise `{row.exercise}`", "points": row.points,
              "max_points": row.max_points, "message": row.text} for row in outcome.rows]
    found = {"gradable": outcome.status == GRADED,
             "score": outcome.score / outcome.max_score if outcome.max_score else 0.0,
             "message": outcome.summary, "output": "\n".join(outcome.notes), "tests": tests}
    if outcome.status == NOT_GRADABLE:
        found["format_errors"] = [outcome.notes[0]]
    return found


def main() -> int:
    root = platform_root(DEFAULT_ROOT)
    settings = Settings.read(root / "tests" / CONFIG)
    notebook = root / "tests" / f"{settings.assignment}.ipynb"
    import autograder
    print(f"[workbook] grading {settings.assignment} with the autograder package at "
          f"{Path(autograder.__file__).parent}", flush=True)

    def write(outcome: Outcome) -> None:
        text = json.dumps(results(outcome, settings), indent=1)
        if len(text.encode()) > RESULTS_BYTES:      # the messages are bounded; this is the last guard
            found = results(outcome, settings)
            for test in found["tests"]:
                test["message"] = test["message"][:200]
            found["output"] = found["output"][:2000]
            text = json.dumps(found)
        (root / "results").mkdir(parents=True, exist_ok=True)     # PrairieLearn does not make it
        (root / "results" / "results.json").write_text(text)

    # The sandbox may read none of /grade: not the hidden tests, the results, nor data.json.
    return finish(write, settings, notebook,
                  lambda: grade(root / "student", notebook, settings, protected=[root]))


if __name__ == "__main__":
    sys.exit(main())
