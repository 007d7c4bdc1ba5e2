"""The gradebook-overwrite attack, on the checks that use files: notebook 05's.

Notebook 05's checks make and read files (checkpoints, crash-trial folders, temp files). A submission
whose answer cell starts a thread that keeps planting links, under every name those checks use, in
every folder the sandbox can write, pointing at the course's gradebook (through ``/proc/self/cwd``, so
no path need be known) and at a canary file, is graded by ``nbgrader autograde`` itself beside a correct
classmate. Nothing the judge does may follow them: the gradebook stays whole and holds both students,
the classmate gets full marks, the canary is untouched, and no link reaches the course folder.

Built only on nbgrader's command line and the gradebook, so the same test runs against any version of
the grader (how the closing note of the trusted-grading issue showed it failing before the fix).
"""

import sqlite3
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook

from notebook_files import ROOT, fill_answers, new_course, run_nbgrader, solution_answers, submit

NAME = "05_atomic_writes"
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
CANARY = "the canary was not touched"
NAMES = ("gradebook.db", "checkpoint.pt", "old.pt", "model.pt", "step_1.pt", "step_2.pt", "checkpoints",
         "trial00", "system-tmp", "result.pt")

PLANT = '''
import os, tempfile, threading, time

def _plant_links():
    targets = ("/proc/self/cwd/gradebook.db", "/proc/1/cwd/gradebook.db", "@CANARY@")
    while True:
        roots = {tempfile.gettempdir(), os.path.dirname(tempfile.gettempdir()), os.getcwd(), os.path.expanduser("~")}
        for root in roots:
            for folder, subfolders, _ in os.walk(root):
                for i, name in enumerate(@NAMES@):
                    try:
                        os.symlink(targets[i % len(targets)], os.path.join(folder, name))
                    except OSError:
                        pass
        time.sleep(0.002)

threading.Thread(target=_plant_links, daemon=True).start()
'''


def exercises_only(path: Path):
    """Notebook 05 without its demos: set-up cell, prose and the graded cells."""
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or c is setup
                or c.get("metadata", {}).get("nbgrader", {}).get("grade_id")]
    return nb


def test_links_planted_for_the_judge_reach_neither_the_gradebook_nor_anything_else(tmp_path):
    course = new_course(tmp_path / "course", {NAME: exercises_only(SOURCE)})
    canary = course / "canary.txt"
    canary.write_text(CANARY)
    answers = solution_answers(SOURCE)
    plant = PLANT.replace("@CANARY@", str(canary)).replace("@NAMES@", repr(NAMES))
    released = course / "notebooks" / NAME / f"{NAME}.ipynb"
    submit(course, "correct", NAME, fill_answers(released, answers))
    submit(course, "planter", NAME, fill_answers(released, {**answers, "atomic_save": plant + answers["atomic_save"]}))
    before = (course / "gradebook.db").stat().st_ino

    run = run_nbgrader(course, "autograde", NAME, "--JudgeInSandbox.timeout=30")

    assert run.returncode == 0, run.stderr[-3000:]
    assert canary.read_text() == CANARY
    assert not any(p.is_symlink() for p in course.rglob("*"))
    assert (course / "gradebook.db").stat().st_ino == before
    with sqlite3.connect(course / "gradebook.db") as db:
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        correct = gb.find_submission(NAME, "correct")
        assert correct.score == correct.max_score > 0
        gb.find_submission(NAME, "planter")   # graded and recorded, whatever it scored
