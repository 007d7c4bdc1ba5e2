"""Trusted grading against the catalog of hostile and broken submissions.

A course with notebook 07 (its exercises, without the demos), one student per entry of
``tests/fixtures/hostile_submissions.py`` and a correct classmate, graded as an
instructor would: ``workbook-grade`` two at a time (nbgrader's Autograde with the judge),
and one attack also by ``nbgrader autograde`` itself.
"""

import json
import sqlite3
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.commands import grade as class_grading
from autograder.commands.check import grade_notebook
from autograder.contract import nbgrader_meta
from fixtures import hostile_submissions as catalog
from notebook_files import (ROOT, built_once, fill_answers, new_course, own_copy, nbgrader_in_process, run_nbgrader,
                            solution_answers, submit)

NAME = catalog.NOTEBOOK
SOURCE = ROOT / "solutions" / NAME / f"{NAME}.ipynb"
CELL_TIMEOUT = 5
ESCAPE = Path("/tmp/hostile_was_here")
STUDENTS = ["correct", *catalog.ANSWER_ATTACKS, *catalog.TEST_CELL_ATTACKS]

# What each attack's failure message says (the first test cell of the attacked exercise).
SAYS = {
    "monkeypatch_comparisons": "changed code that the notebook and the grader share (",
    "patch_autograder_modules": "changed code that the notebook and the grader share",
    "override_builtins": "changed code that the notebook and the grader share (builtins.",
    "forged_output": "NotImplementedError: not answered yet",
    "os_exit_in_the_cell": "ended the process running it (exit code 0)",
    "sys_exit_when_called": "SystemExit",
    "kill_the_kernel_when_called": "killed by SIGKILL",
    # The kills do nothing: the init of the sandbox's PID namespace ignores them. Judged as the wrong answer it is.
    "kill_the_parent": "returned a different order than the real DistributedSampler",
    "infinite_loop_when_called": f"time limit ({CELL_TIMEOUT} s for a cell)",
    "memory_bomb": "can't allocate memory",
    "fork_bomb": f"time limit ({CELL_TIMEOUT} s for a cell)",
    "read_the_hidden_tests": "PermissionError",
    "write_outside_its_folder": "PermissionError",
    "network": "Network is unreachable",
    "swelling_reply": "something unreadable into the grader's channel",
    "snoop_on_classmates": "processes and [] in /dev/shm",
    "shadow_a_method_and_silence_the_report": "changed code that the notebook and the grader share",
    "deep_tree_for_the_judge": "nested deeper than",
    "syntax_error": "because its answer cell raised SyntaxError",
    "renamed_function": "the answer cell must define a function or class named exactly `epoch_order`",
}


def _test_cells_of(nb, exercise):
    return [c for c in nb.cells if nbgrader_meta(c).get("grade_id", "").startswith(f"test_{exercise}")]


def exercises_only(path: Path):
    """Notebook 07 without its demos (set-up cell, prose and the graded cells kept): what is judged is
    the same, and a class of 21 grades in a third of the time."""
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    # Nor the rank server the demos fork their ranks from: it starts a process that imports torch (2-4 s, more on
    # a loaded machine), which the test's short cell limit is not for.
    setup.source = "\n".join(line for line in setup.source.splitlines() if "start_rank_server" not in line)
    nb.cells = [c for c in nb.cells if c.cell_type == "markdown" or c is setup or nbgrader_meta(c).get("grade_id")]
    return nb


def build_course(folder: Path) -> None:
    ESCAPE.unlink(missing_ok=True)
    course = new_course(folder / "course", {NAME: exercises_only(SOURCE)})
    released = course / "notebooks" / NAME / f"{NAME}.ipynb"
    submit(course, "correct", NAME, fill_answers(released, solution_answers(SOURCE)))
    correct = {**solution_answers(SOURCE), catalog.UNTOUCHED: catalog.RESUME_SHARDS_ALONE}
    for attack, source in catalog.ANSWER_ATTACKS.items():
        answer = source.replace("@COURSE@", str(course))
        submit(course, attack, NAME, fill_answers(released, {**correct, catalog.ATTACKED: answer}))
    for attack, replacement in catalog.TEST_CELL_ATTACKS.items():
        nb = fill_answers(released, {**correct, catalog.ATTACKED: catalog.WRONG_ANSWER})
        for cell in _test_cells_of(nb, catalog.ATTACKED):
            if replacement is None:
                nb.cells.remove(cell)
            else:
                cell.source = replacement
        submit(course, attack, NAME, nb)
    code = class_grading.main([NAME, "--course", str(course), "--jobs", "2", "--timeout", str(CELL_TIMEOUT)])
    (folder / "exit_status").write_text(str(code))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = built_once(tmp_path_factory, "hostile", build_course)
    return folder / "course", int((folder / "exit_status").read_text())


def scores(course: Path, student: str) -> dict:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {g.name: (g.auto_score, g.max_score) for g in gb.find_submission_notebook(NAME, NAME, student).grades}


def messages(course: Path, student: str) -> dict:
    nb = nbformat.read(course / "autograded" / student / NAME / f"{NAME}.ipynb", as_version=4)
    return {nbgrader_meta(c)["grade_id"]: " ".join(f"{o.ename}: {o.evalue}" for o in c.outputs if o.output_type == "error")
            for c in nb.cells if nbgrader_meta(c).get("grade")}


@pytest.mark.parametrize("attack", [*catalog.ANSWER_ATTACKS, *catalog.TEST_CELL_ATTACKS])
def test_each_attack_scores_zero_on_what_it_attacks_and_nothing_else(graded, attack):
    course, _ = graded
    got = scores(course, attack)
    attacked = {k: v for k, v in got.items() if k.startswith(f"test_{catalog.ATTACKED}")}
    untouched = {k: v for k, v in got.items() if k.startswith(f"test_{catalog.UNTOUCHED}")}
    assert len(attacked) == 4 and all(score == 0 for score, _ in attacked.values()), attacked
    assert len(untouched) == 5 and all(score == points for score, points in untouched.values()), untouched


@pytest.mark.parametrize("attack", list(SAYS))
def test_the_failure_message_says_what_happened(graded, attack):
    course, _ = graded
    said = messages(course, attack)[f"test_{catalog.ATTACKED}_permutation"]
    assert SAYS[attack] in said, said


def test_a_classmate_in_the_same_batch_gets_full_marks(graded):
    course, code = graded
    assert all(score == points for score, points in scores(course, "correct").values())
    assert code == 0   # every submission was graded, hostile or not


def test_nothing_was_written_outside_the_sandbox_and_the_gradebook_is_whole(graded):
    course, _ = graded
    assert not ESCAPE.exists() and not (course / "hostile_was_here").exists()
    assert not Path("/dev/shm/for_the_next_student").exists()
    # What the round-3 attacks tried to leave behind: SysV memory and a message queue (key 0x5EED).
    assert not [line for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:] if line.split()[0] == str(0x5EED)]
    assert not [line for line in Path("/proc/sysvipc/msg").read_text().splitlines()[1:] if line.split()[0] == str(0x5EED)]
    assert not any(p.is_symlink() for p in course.rglob("*"))
    with sqlite3.connect(course / "gradebook.db") as db:
        assert db.execute("pragma integrity_check").fetchone() == ("ok",)
        graded_students = {row[0] for row in db.execute("select student_id from submitted_assignment")}
    assert graded_students == set(STUDENTS)


def test_the_report_names_what_the_sandbox_stopped(graded):
    course, _ = graded
    record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    assert "ended the process" in record["os_exit_in_the_cell"]["error"]
    assert "time limit" in record["infinite_loop_when_called"]["error"]
    assert "changed code" in record["patch_autograder_modules"]["error"]
    assert record["correct"]["error"] is None


def test_feedback_shows_the_messages_but_never_the_hidden_tests(graded, tmp_path):
    course = own_copy(graded[0], tmp_path)
    nbgrader_in_process(course, "generate_feedback", NAME)
    html = (course / "feedback" / "monkeypatch_comparisons" / NAME / f"{NAME}.html").read_text()
    assert "changed code that the notebook and the grader share" in html
    assert "seed=7" not in html and "BEGIN HIDDEN TESTS" not in html


def test_nbgrader_autograde_itself_takes_the_judges_verdict(graded, tmp_path):
    course = own_copy(graded[0], tmp_path)
    run = run_nbgrader(course, "autograde", NAME, "--student", "patch_autograder_modules", "--force",
                       f"--JudgeInSandbox.timeout={CELL_TIMEOUT}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert scores(course, "patch_autograder_modules") == scores(graded[0], "patch_autograder_modules")


def test_the_learners_own_self_check_can_be_fooled_which_is_why_grading_does_not_use_it(graded):
    """The self-check runs in the learner's kernel, by design (instant feedback); a patched check
    module fools it. The gradebook above gave the same submission zero."""
    course, _ = graded
    result = grade_notebook(course / "submitted" / "patch_autograder_modules" / NAME / f"{NAME}.ipynb")
    fooled = [t.grade_id for t in result.tests if t.grade_id.startswith(f"test_{catalog.ATTACKED}") and t.passed]
    assert fooled


def test_the_class_gets_the_same_gradebook_on_every_torch_build(graded):
    """CI grades this class on two torch builds (.ci/run): the CPU build records its gradebook, pip's default
    CUDA build must give the same score in every cell. Run alone, the test records or compares as asked."""
    import os
    course, _ = graded
    book = {student: {cell: score for cell, (score, _) in scores(course, student).items()} for student in STUDENTS}
    record, compare = os.environ.get("WORKBOOK_GRADEBOOK_RECORD"), os.environ.get("WORKBOOK_GRADEBOOK_COMPARE")
    if not record and not compare:
        pytest.skip("set WORKBOOK_GRADEBOOK_RECORD=FILE on one build and WORKBOOK_GRADEBOOK_COMPARE=FILE on another")
    import torch
    if record:
        Path(record).write_text(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gradebook": book},
                                           indent=1, sort_keys=True))
    if compare:
        other = json.loads(Path(compare).read_text())
        differ = {f"{student}/{cell}": (other["gradebook"].get(student, {}).get(cell), score)
                  for student, cells in book.items() for cell, score in cells.items()
                  if other["gradebook"].get(student, {}).get(cell) != score}
        assert not differ, f"torch {other['torch']} (CUDA {other['cuda']}) vs {torch.__version__}: {differ}"
        assert set(other["gradebook"]) == set(book)
