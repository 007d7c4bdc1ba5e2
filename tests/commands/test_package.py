"""The Gradescope and PrairieLearn packages (``workbook.py package``), run here as each platform runs them.

Every notebook's packages are built (not run). For notebooks 01 and 05, each package is laid out as its
platform lays it out, under a temp folder standing for /autograder or /grade (``WORKBOOK_PLATFORM_ROOT``),
and its entry point is run as the platform runs it: a process of its own, in that layout, with the packaged
autograder. Its results.json must follow the platform's documented format (the schemas below, written from
that documentation) and give, cell by cell, the points ``nbgrader autograde`` gives the same submissions
(honest, blank, traps from the fixtures, hostile, not a notebook) in one course graded once.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.commands import package
from autograder.contract import HIDDEN_BEGIN, HIDDEN_END, is_test_cell, nbgrader_meta
from autograder.course import NOTEBOOKS, RELEASE_DIR
from autograder.grading.sandbox import WITHOUT
from autograder.platforms.submission import CONFIG, ROOT_VARIABLE, find_submission
from fixtures import atomic_writes_impls, hostile_submissions, state_dict_aliasing_impls
from notebook_checks import check_calls
from notebook_files import built_once, fill_answers, new_course, run_nbgrader, solution_answers, submit

PLATFORMS = ("gradescope", "prairielearn")
BY_NUMBER = {n.number: n for n in NOTEBOOKS}
PL_QUESTION = f"questions/{package.PL_FOLDER}"

# ---- the platforms' formats, from their documentation ----------------------------------------------

# Gradescope, "Autograder Specifications", Output format, Controlling Test Case Visibility, Test case status,
# Output String Formatting: https://gradescope-autograders.readthedocs.io/en/latest/specs/ (the page's source:
# github.com/gradescope/autograder_samples, docs/specs.md, commit af5dee4 of January 2025).
_GS_VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_GS_FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
_NUMBER, _STRING = {"type": "number"}, {"type": "string"}
GRADESCOPE_RESULTS = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "score": _NUMBER, "execution_time": _NUMBER, "output": _STRING, "output_format": _GS_FORMAT,
        "test_output_format": _GS_FORMAT, "test_name_format": _GS_FORMAT, "visibility": _GS_VISIBILITY,
        "stdout_visibility": _GS_VISIBILITY, "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"score": _NUMBER, "max_score": _NUMBER, "status": {"enum": ["passed", "failed"]},
                           "name": _STRING, "name_format": _GS_FORMAT, "number": _STRING, "output": _STRING,
                           "output_format": _GS_FORMAT, "tags": {"type": "array", "items": _STRING},
                           "visibility": _GS_VISIBILITY, "extra_data": {"type": "object"}}}},
        "leaderboard": {"type": "array"}},
    # "score: optional, but required if not on each test case below"
    "anyOf": [{"required": ["score"]},
              {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}}]}

# PrairieLearn, "External Grading", Grading results: https://prairielearn.readthedocs.io/en/latest/externalGrading/
# (github.com/PrairieLearn/PrairieLearn, docs/externalGrading.md): "score" in [0.0, 1.0], required unless
# "gradable" is false; "format_errors" a string or a list of them; tests as <pl-external-grader-results>
# renders them; at most 1 MB (the grader host refuses larger ones: apps/grader-host/src/index.ts).
_PL_IMAGES = {"type": "array", "items": {"anyOf": [_STRING, {"type": "object", "required": ["url"],
                                                             "properties": {"url": _STRING, "label": _STRING}}]}}
PRAIRIELEARN_RESULTS = {
    "type": "object",
    "properties": {
        "gradable": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
        "message": _STRING, "output": _STRING, "images": _PL_IMAGES,
        "format_errors": {"anyOf": [_STRING, {"type": "array", "items": _STRING}]},
        "tests": {"type": "array", "items": {
            "type": "object", "required": ["name", "points", "max_points"],
            "properties": {"name": _STRING, "description": _STRING, "points": _NUMBER, "max_points": _NUMBER,
                           "message": _STRING, "output": _STRING, "images": _PL_IMAGES}}}},
    "if": {"required": ["gradable"], "properties": {"gradable": {"const": False}}},
    "else": {"required": ["score"]}}
PRAIRIELEARN_BYTES = 1 << 20


def valid_results(platform: str, text: str) -> dict:
    if platform == "prairielearn":
        assert len(text.encode()) <= PRAIRIELEARN_BYTES
    found = json.loads(text)
    jsonschema.Draft7Validator(GRADESCOPE_RESULTS if platform == "gradescope" else PRAIRIELEARN_RESULTS).validate(found)
    return found


def points_of(platform: str, found: dict) -> dict:
    key = "score" if platform == "gradescope" else "points"
    return {t["name"]: t[key] for t in found["tests"]}


def message_of(platform: str, test: dict) -> str:
    return test["output"] if platform == "gradescope" else test["message"]


# ---- building --------------------------------------------------------------------------------------

def test_the_builder_packages_every_notebook_for_both_platforms(tmp_path):
    for notebook in NOTEBOOKS:
        zipped = package.build("gradescope", notebook, tmp_path)
        with zipfile.ZipFile(zipped) as archive:
            names = set(archive.namelist())
            modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
            settings = json.loads(archive.read(CONFIG))
        # Only what grading needs: the package without its commands, this notebook's instructor source.
        assert {"setup.sh", "run_autograder", "requirements.txt", CONFIG,
                f"solutions/{notebook.folder}/{notebook.folder}.ipynb"} <= names
        assert not [n for n in names if n.startswith("autograder/commands/") or "__pycache__" in n]
        assert [n for n in names if n.endswith(".ipynb")] == [f"solutions/{notebook.folder}/{notebook.folder}.ipynb"]
        assert {n.split("/")[0] for n in names} == {"setup.sh", "run_autograder", "requirements.txt", CONFIG,
                                                    "solutions", "autograder"}
        assert "autograder/platforms/gradescope.py" in names and "autograder/grading/judge.py" in names
        assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
        assert settings["assignment"] == notebook.folder and settings["allow_unconfined"] is False

        tree = package.build("prairielearn", notebook, tmp_path)
        info = json.loads((tree / PL_QUESTION / notebook.folder / "info.json").read_text())
        options = info["externalGradingOptions"]
        assert info["gradingMethod"] == "External" and options["enabled"] and options["image"]
        entry = tree / options["entrypoint"].replace("/grade/", "", 1)
        assert entry == tree / "serverFilesCourse" / package.PL_FOLDER / "run.sh" and os.access(entry, os.X_OK)
        assert 0 < options["timeout"] <= 600 and options["enableNetworking"] is False
        notebooks = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.ipynb"))
        assert notebooks == [f"{PL_QUESTION}/{notebook.folder}/tests/{notebook.folder}.ipynb"]
        assert f'file-names="{notebook.folder}.ipynb"' in (tree / PL_QUESTION / notebook.folder / "question.html").read_text()
        assert "FROM python:3.11" in (tree / "grader-image" / "Dockerfile").read_text()


def test_requirements_are_pinned_to_what_is_installed_here():
    import importlib.metadata
    lines = [line for line in package.pinned_requirements().splitlines() if not line.startswith("#")]
    assert {line.split("==")[0] for line in lines} == set(package.GRADING_REQUIREMENTS)
    assert f"torch=={importlib.metadata.version('torch').split('+')[0]}" in lines


def test_the_same_sources_build_the_same_zip(tmp_path):
    first = package.build("gradescope", BY_NUMBER["01"], tmp_path / "a").read_bytes()
    assert package.build("gradescope", BY_NUMBER["01"], tmp_path / "b").read_bytes() == first


def test_a_submitted_link_is_never_followed(tmp_path):
    """A link named as the notebook, pointing at the instructor's notebook, would be graded as the learner's."""
    (tmp_path / "submission").mkdir()
    os.symlink(BY_NUMBER["01"].source(), tmp_path / "submission" / f"{BY_NUMBER['01'].folder}.ipynb")
    os.symlink(BY_NUMBER["01"].source().parent, tmp_path / "submission" / "folder")
    found, why = find_submission(tmp_path / "submission", BY_NUMBER["01"].folder)
    assert found is None and "no notebook was submitted" in why


# ---- run as the platforms run them -------------------------------------------------------------------

def lay_out(platform: str, built: Path, root: Path, assignment: str, submission) -> list[str]:
    """The platform's folder for one submission, from the built package; the entry point's command."""
    if platform == "gradescope":
        with zipfile.ZipFile(built) as archive:       # Gradescope: /autograder/source holds the zip's contents
            archive.extractall(root / "source")
            for info in archive.infolist():
                (root / "source" / info.filename).chmod(info.external_attr >> 16 & 0o777)
        shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
        (root / "submission_metadata.json").write_text('{"users": [{"email": "learner@example.org"}]}')
        folder, entry = root / "submission", [str(root / "run_autograder")]
    else:                                             # PrairieLearn: the question's tests/, serverFilesCourse
        question = next((built / PL_QUESTION).iterdir())
        shutil.copytree(question / "tests", root / "tests")
        shutil.copytree(built / "serverFilesCourse", root / "serverFilesCourse")
        (root / "data").mkdir()
        (root / "data" / "data.json").write_text("{}")
        folder, entry = root / "student", [str(root / "serverFilesCourse" / package.PL_FOLDER / "run.sh")]
    folder.mkdir(parents=True)
    target = folder / f"{assignment}.ipynb"
    if isinstance(submission, str):
        target.write_text(submission)
    else:
        nbformat.write(submission, target)
    return entry


def run_entry(entry: list[str], root: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in (WITHOUT, "PYTHONPATH")}
    environment.update({ROOT_VARIABLE: str(root), "WORKBOOK_PLATFORM_PYTHON": sys.executable, **(env or {})})
    return subprocess.run(entry, cwd=root, env=environment, capture_output=True, text=True, timeout=900)


def graded_run(platform: str, notebook, submission, root: Path, build_options: dict | None = None,
               env: dict | None = None) -> tuple[dict, str]:
    """(results.json, what the entry point printed) of one submission, graded as the platform does it."""
    built = package.build(platform, notebook, root.parent / f"{root.name}-package", **(build_options or {}))
    run = run_entry(lay_out(platform, built, root, notebook.folder, submission), root, env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    text = (root / "results" / "results.json").read_text()
    return valid_results(platform, text), run.stdout


# ---- the submissions, and nbgrader's grades of them ----------------------------------------------------

def fixture_answer(module, implementation, exercise: str) -> str:
    """An answer cell holding a fixture implementation under the exercise's name."""
    return inspect.getsource(module) + f"\n{exercise} = {implementation.__name__}\n"


TRAPS = {  # each submission falls into one trap per exercise (fixture -> the checks it must lose)
    "01": {"trap_shared_references": (state_dict_aliasing_impls, {
               "snapshot_state": state_dict_aliasing_impls.snapshot_live_references,
               "restore_state": state_dict_aliasing_impls.restore_aliasing}),
           "trap_parts_missing": (state_dict_aliasing_impls, {
               "snapshot_state": state_dict_aliasing_impls.snapshot_parameters_only,
               "restore_state": state_dict_aliasing_impls.restore_model_only})},
    "05": {"trap_no_fsync_latest_by_name": (atomic_writes_impls, {
               "atomic_save": atomic_writes_impls.atomic_save_no_fsync,
               "load_latest_checkpoint": atomic_writes_impls.load_latest_by_name})},
}
NOT_A_NOTEBOOK = '{"cells": [ this is not JSON'


def hostile_01(released, answers) -> nbformat.NotebookNode:
    """The catalog's monkeypatched comparisons and os._exit in the answer cells; a test cell edited to print a
    pass line (and its points raised), another deleted. (Not a test cell copied under the same grade_id:
    nbgrader's DeduplicateIds leaves the first copy with empty metadata, which its CheckCellMetadata then
    refuses, and autograde fails.)"""
    attacks = hostile_submissions.ANSWER_ATTACKS
    patch = attacks["monkeypatch_comparisons"].removesuffix(hostile_submissions.WRONG_ANSWER)
    leave = attacks["os_exit_in_the_cell"].removesuffix(hostile_submissions.WRONG_ANSWER)
    nb = fill_answers(released, {
        "snapshot_state": patch + fixture_answer(state_dict_aliasing_impls,
                                                 state_dict_aliasing_impls.snapshot_live_references, "snapshot_state"),
        "restore_state": leave + answers["restore_state"]})
    cells = {nbgrader_meta(c).get("grade_id"): c for c in nb.cells}
    cells["test_snapshot_state"].source = hostile_submissions.TEST_CELL_ATTACKS["edited_test_cells"]
    cells["test_snapshot_state"].metadata["nbgrader"]["points"] = 100
    nb.cells.remove(cells["test_restore_state"])
    return nb


def submissions(number: str) -> dict:
    notebook = BY_NUMBER[number]
    released, answers = notebook.source(RELEASE_DIR), solution_answers(notebook.source())
    made = {"honest": fill_answers(released, answers), "blank": nbformat.read(str(released), as_version=4)}
    for student, (module, traps) in TRAPS.get(number, {}).items():
        made[student] = fill_answers(released, {ex: fixture_answer(module, impl, ex) for ex, impl in traps.items()})
    if number == "01":
        made["hostile"] = hostile_01(released, answers)
    made["not_a_notebook"] = NOT_A_NOTEBOOK
    return made


GRADED = ("01", "02", "05")
# Gradescope grades every submission of 01, the right answer of 02 (its resume runs in a fresh process, a new
# interpreter that must import the packaged autograder from inside the sandbox) and the right and the trapped
# answer of 05 (blank and unreadable submissions grade alike in every notebook); PrairieLearn, whose entry
# point differs only in its layout and format, grades 01's passing, hostile and ungradable ones (each run
# starts torch, a zygote and a sandbox).
ON_GRADESCOPE = {"02": ("honest",), "05": ("honest", "trap_no_fsync_latest_by_name")}
ON_PRAIRIELEARN = {"01": ("honest", "hostile", "not_a_notebook")}
CASES = [(platform, number, student) for number in GRADED for student in submissions(number) for platform in PLATFORMS
         if student in {"gradescope": ON_GRADESCOPE, "prairielearn": ON_PRAIRIELEARN}[platform].get(
             number, () if platform == "prairielearn" else (student,))]


def build_nbgrader_course(folder: Path) -> None:
    """One course with both notebooks, every submission graded by nbgrader autograde (with the judge)."""
    course = new_course(folder / "course", {BY_NUMBER[n].folder: BY_NUMBER[n].source() for n in GRADED})
    for number in GRADED:
        name = BY_NUMBER[number].folder
        for student, submission in submissions(number).items():
            if any(case[1:] == (number, student) for case in CASES):
                submit(course, student, name, submission)
        run = run_nbgrader(course, "autograde", name, "--create")
        assert run.returncode == 0, run.stderr[-3000:]


@pytest.fixture(scope="module")
def nbgrader_course(tmp_path_factory):
    return built_once(tmp_path_factory, "platform_nbgrader", build_nbgrader_course) / "course"


def nbgrader_grades(course: Path, number: str, student: str) -> tuple[dict, dict]:
    """(points per test cell, the error each failed test cell shows) as nbgrader autograde left them."""
    name = BY_NUMBER[number].folder
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        points = {g.name: g.auto_score for g in gb.find_submission_notebook(name, name, student).grades}
    autograded = nbformat.read(str(course / "autograded" / student / name / f"{name}.ipynb"), as_version=4)
    errors = {nbgrader_meta(c)["grade_id"]: o["evalue"] for c in autograded.cells if is_test_cell(c)
              for o in c.get("outputs", []) if o.get("output_type") == "error"}
    return points, errors


def hidden_lines(number: str) -> list[str]:
    """Every line of the notebook's hidden test blocks."""
    nb = nbformat.read(str(BY_NUMBER[number].source()), as_version=4)
    lines = []
    for cell in filter(is_test_cell, nb.cells):
        source = cell.source
        if HIDDEN_BEGIN in source:
            block = source.split(HIDDEN_BEGIN, 1)[1].split(HIDDEN_END, 1)[0]
            lines += [line.strip() for line in block.splitlines()[1:] if len(line.strip()) > 10]
    return lines


def lost_by_fixtures(number: str, student: str) -> set[str]:
    """The test cells a trap submission must lose: those calling a check its fixtures' WRONG entries name."""
    if student not in TRAPS.get(number, {}):
        return set()
    module, traps = TRAPS[number][student]
    checks = {check for impl in traps.values() for check in module.WRONG[impl]}
    return {call.grade_id for call in check_calls(number) if call.check in checks}


@pytest.mark.extended          # every notebook's class through nbgrader and both platforms: CI's extended suites
@pytest.mark.parametrize("platform, number, student", CASES, ids=["-".join(c) for c in CASES])
def test_each_platform_gives_the_points_nbgrader_gives_cell_by_cell(platform, number, student, tmp_path_factory,
                                                                   request):
    notebook = BY_NUMBER[number]

    def build(folder):
        found, printed = graded_run(platform, notebook, submissions(number)[student], folder / "autograder")
        (folder / "found.json").write_text(json.dumps(found))
        (folder / "printed.txt").write_text(printed)
    folder = built_once(tmp_path_factory, f"platform_{platform}_{number}_{student}", build)
    found = json.loads((folder / "found.json").read_text())
    printed = (folder / "printed.txt").read_text()
    # The packaged autograder graded it, not this checkout's.
    assert f"autograder package at {folder / 'autograder'}" in printed

    # Only now the course graded by nbgrader (one worker grades it while the others run platforms).
    theirs, errors = nbgrader_grades(request.getfixturevalue("nbgrader_course"), number, student)
    ours = points_of(platform, found)
    assert ours == theirs
    total = sum(t["max_score" if platform == "gradescope" else "max_points"] for t in found["tests"])
    if platform == "gradescope":
        assert found["score"] == sum(ours.values())
    else:
        assert found["score"] == pytest.approx(sum(ours.values()) / total)
        assert found["gradable"] is (student != "not_a_notebook")
    # Each failure says what nbgrader's autograded notebook shows for it (01: its messages are deterministic).
    for test in found["tests"]:
        if test["name"] in errors:
            assert message_of(platform, test), test
            if number == "01":
                assert errors[test["name"]].strip() in message_of(platform, test), (test, errors[test["name"]])
    # What each submission is, whatever nbgrader makes of it.
    if student == "honest":
        assert sum(ours.values()) == total
    elif student in ("blank", "not_a_notebook", "hostile"):
        assert sum(ours.values()) == 0
    if student.startswith("trap"):
        lost = lost_by_fixtures(number, student)
        assert lost and all(ours[grade_id] == 0 for grade_id in lost), (lost, ours)
    if student == "not_a_notebook":
        assert all("could not be read as a notebook" in message_of(platform, t) for t in found["tests"])
    # Hidden tests are never shown, nor what a submission put in a test cell.
    text = json.dumps(found, ensure_ascii=False)
    assert "HIDDEN TESTS" not in text and not [line for line in hidden_lines(number) if line in text]
    assert "all good" not in text


# ---- refusal, limits and reach on a platform ---------------------------------------------------------

def test_a_container_without_a_protection_is_refused_unless_the_package_allows_it(tmp_path):
    notebook = BY_NUMBER["01"]
    blank = nbformat.read(str(notebook.source(RELEASE_DIR)), as_version=4)
    without = {WITHOUT: "landlock"}
    for platform in PLATFORMS:
        found, printed = graded_run(platform, notebook, blank, tmp_path / f"{platform}-refused", env=without)
        assert "trusted grading refused" in printed and "files: off" in printed
        says = found["output"] if platform == "gradescope" else found["message"]
        assert "Not graded: the grading machine cannot confine a submission" in says
        assert all(t.get("score", t.get("points")) == 0 for t in found["tests"])
        if platform == "gradescope":
            assert found["extra_data"]["status"] == "refused"
            assert any("Landlock needs Linux 5.13" in note for note in found["extra_data"]["notes"])
        else:
            assert found["gradable"] is False and "Landlock needs Linux 5.13" in found["output"]
    found, printed = graded_run("gradescope", notebook, blank, tmp_path / "allowed", {"allow_unconfined": True},
                                env=without)
    assert found["extra_data"]["status"] == "graded" and found["extra_data"]["unconfined"]
    assert "Graded with --allow-unconfined; this sandbox lacked files: off" in found["output"]
    assert {t["name"] for t in found["tests"]} == {nbgrader_meta(c)["grade_id"] for c in
                                                   nbformat.read(str(notebook.source()), 4).cells if is_test_cell(c)}


HIDDEN_TESTS_AT = {"gradescope": "source/solutions/{0}/{0}.ipynb", "prairielearn": "tests/{0}.ipynb"}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_looping_cell_costs_its_exercise_and_the_hidden_tests_stay_unreadable(platform, tmp_path):
    notebook = BY_NUMBER["01"]
    root = tmp_path / "autograder"
    hidden = root / HIDDEN_TESTS_AT[platform].format(notebook.folder)
    answers = solution_answers(notebook.source())
    submission = fill_answers(notebook.source(RELEASE_DIR), {
        "snapshot_state": f"hidden = open({str(hidden)!r}).read()\n" + answers["snapshot_state"],
        "restore_state": "while True:\n    pass\n" + answers["restore_state"]})
    # 10 s: the notebook's own cells run under that limit too, on a loaded machine
    found, _ = graded_run(platform, notebook, submission, root, {"cell_timeout": 10})
    said = {t["name"]: message_of(platform, t) for t in found["tests"]}
    assert "because its answer cell raised PermissionError" in said["test_snapshot_state"]
    assert "time limit (10 s for a cell)" in said["test_restore_state"]


def test_a_grader_out_of_time_still_leaves_a_result(tmp_path):
    notebook = BY_NUMBER["01"]
    submission = fill_answers(notebook.source(RELEASE_DIR), {"snapshot_state": "import time\ntime.sleep(60)\n"})
    found, printed = graded_run("prairielearn", notebook, submission, tmp_path / "grade",
                                {"platform_timeout": package.MARGIN_SECONDS + 2})
    assert found["gradable"] is False and "Not graded: grading took over 2 s" in found["message"]
    assert "out of time" in printed
