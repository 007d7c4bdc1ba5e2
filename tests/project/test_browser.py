"""JupyterLab in a real browser: what a learner and an instructor actually see.

Starts JupyterLab the way `python3 workbook.py lab` does (on a throwaway copy of the
course), opens every released notebook in headless Chromium, runs it through the Run
menu and reads the page: explanations render, plots appear as images, the first
unanswered exercise shows the stub's NotImplementedError and nothing else breaks,
no library warning reaches the screen, and with the answers filled in every cell
runs and every test cell shows its ✓ line. Then nbgrader's Validate button and the formgrader.

Screenshots go to artifacts/screenshots/ (look at them after a change to a notebook).
Skipped only where no Chromium is installed (.ci/run installs Debian's chromium).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import nbformat
import pytest

from browser_support import (ROOT, RUN_TIMEOUT_S, SCREENSHOTS, JupyterLab, LabNotebook, LiveDemo, Presentation,
                             answer_sources, cell_roles, chromium, chromium_missing_reason, direct_calls,
                             make_course_copy, markdown_headings, plotting_cells, write_filled_in_copy)

pytestmark = [
    pytest.mark.extended,       # a real browser: CI's extended suites (tests/conftest.py)
    pytest.mark.skipif(chromium_missing_reason() is not None, reason=chromium_missing_reason() or ""),
]

# Whatever notebooks are released when the suite is collected.
RELEASED = sorted(p for p in (ROOT / "notebooks").glob("*/*.ipynb") if p.stem == p.parent.name)


def released_id(path):
    return path.stem


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return make_course_copy(tmp_path_factory.mktemp("course"))


@pytest.fixture(scope="module")
def learner_lab(course, tmp_path_factory):
    lab = JupyterLab(course, tmp_path_factory.mktemp("learner-lab"))
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as context:
        yield context


@pytest.fixture
def page(browser, learner_lab):
    page = browser.new_page()
    yield page
    page.close()
    learner_lab.shut_down_kernels()


def look_at_the_page(notebook: LabNotebook, path, *, solved: bool, upto: int | None = None) -> list[str]:
    """Everything a learner would notice is wrong, as sentences; empty when all is well. With ``upto``,
    the cells after that one are not looked at (they were not run)."""
    roles = cell_roles(path)
    cells = notebook.cells()
    if len(cells) != len(roles):
        return [f"the browser shows {len(cells)} cells, the notebook file has {len(roles)}"]
    problems = []
    for index, (cell, role, headings) in enumerate(zip(cells, roles, markdown_headings(path))):
        if upto is not None and index > upto:
            break
        where = f"cell {index + 1} ({role})"
        if role == "markdown":
            if not cell.rendered:
                problems.append(f"{where} shows its markdown source instead of rendered text")
            elif cell.headings != headings:
                problems.append(f"{where} renders {cell.headings} headings, its source has {headings}")
            continue
        if not cell.executed:
            problems.append(f"{where} did not run (prompt {cell.prompt.strip()!r})")
        for output in cell.outputs:
            if output.broken_images:
                problems.append(f"{where} shows {output.broken_images} image(s) that do not load")
        stderr = cell.stderr_texts
        if role == "test" and not solved:
            if len(stderr) != 1 or "NotImplementedError" not in stderr[0]:
                last = (stderr[0] if stderr else cell.text).strip().splitlines()[-1:] or ["(no output)"]
                problems.append(f"{where} should show only the stub's NotImplementedError, shows: {last[0][:200]}")
            if cell.pass_lines:
                problems.append(f"{where} shows a pass message for an unanswered exercise")
        elif stderr:
            lines = [line for text in stderr for line in text.strip().splitlines()]
            problems.append(f"{where} shows stderr (a warning or an error): {' | '.join(lines[-3:])[:300]}")
        if role == "test" and solved and not cell.pass_lines:
            problems.append(f"{where} shows no ✓ pass message with the answer filled in")
    # Before the exercises every plot must show; after them, some plots wait for the learner's answers.
    first_answer = roles.index("answer") if "answer" in roles else len(roles)
    for index in plotting_cells(path):
        if (solved or index < first_answer) and cells[index].images < 1:
            problems.append(f"cell {index + 1} calls plt.show() but no image appears")
    return problems


def first(cells, predicate):
    return next((i for i, c in enumerate(cells) if predicate(c)), None)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("released", RELEASED, ids=released_id)
def test_learner_runs_the_notebook_then_answers_every_exercise(released, course, learner_lab, page):
    name = released.stem
    student = course / "notebooks" / name / released.name
    notebook = LabNotebook(page, learner_lab, f"{name}/{released.name}", cells=len(cell_roles(student)))

    # 1. Open it and run all cells, exercises unanswered, as far as the first test cell: it shows the stub's
    #    NotImplementedError and nothing else. (Every unanswered test cell, and the cells after them, are
    #    run in the student version by test_notebooks.py; a stop here costs a restart through the menus.)
    roles = cell_roles(student)
    first_test = roles.index("test") if "test" in roles else None
    notebook.run_everything(until=first_test)
    notebook.screenshot_page(f"{name}-opened-and-run")
    cells = notebook.cells()
    plot = first(cells, lambda c: c.images > 0)
    if plot is not None:
        notebook.screenshot_plot(plot, f"{name}-first-plot")
    stub = first(cells, lambda c: any("NotImplementedError" in t for t in c.stderr_texts))
    if stub is not None:
        notebook.screenshot(stub, f"{name}-unanswered-exercise")
    problems = [f"unanswered: {p}" for p in look_at_the_page(notebook, student, solved=False, upto=first_test)]

    # 2. Paste each answer from solutions/ into its cell and run from the first answer down.
    answers = answer_sources(course, name)
    if answers:
        for index, source in answers.items():
            if _lines(notebook.type_into(index, source)) != _lines(source):
                problems.append(f"answered: cell {index + 1} does not hold the pasted answer")
        stops = notebook.run_everything(start=min(answers))
        passed = first(notebook.cells(), lambda c: c.pass_lines)
        if passed is not None:
            notebook.screenshot(passed, f"{name}-answered-test-cell")
        problems += [f"answered: {p}" for p in look_at_the_page(notebook, student, solved=True)]
        if stops:
            problems.append(f"answered: the run stopped {stops} time(s) at an error")
    assert not problems, f"{name} in JupyterLab (screenshots in {SCREENSHOTS}):\n" + "\n".join(problems)


def _graded(path) -> bool:
    return "test" in cell_roles(path)


def _validate(notebook: LabNotebook) -> str:
    """Click nbgrader's Validate button and return the text of the dialog it opens."""
    page = notebook.page
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=240_000)
    return dialog.inner_text()


@pytest.mark.skipif(not any(_graded(p) for p in RELEASED), reason="no released notebook has test cells yet")
def test_validate_button_reports_the_stub_and_then_success(course, learner_lab, page):
    # The smallest graded notebook: Validate runs the whole notebook on the server.
    copies = [course / "notebooks" / p.stem / p.name for p in RELEASED]
    released = min((p for p in copies if _graded(p)), key=lambda p: p.stat().st_size)
    name = released.stem
    notebook = LabNotebook(page, learner_lab, f"{name}/{released.name}", cells=len(cell_roles(released)))
    text = _validate(notebook)
    notebook.screenshot_page(f"{name}-validate-unanswered")
    assert "NotImplementedError" in text, f"Validate on the unanswered {name} said:\n{text[:1500]}"
    page.keyboard.press("Escape")

    solved = write_filled_in_copy(course, released)
    notebook = LabNotebook(page, learner_lab, f"{name}/{solved.name}", cells=len(cell_roles(solved)))
    text = _validate(notebook)
    notebook.screenshot_page(f"{name}-validate-solved")
    assert "Success" in text and "passes all the tests" in text, f"Validate on the solved {name} said:\n{text[:1500]}"


@pytest.fixture(scope="module")
def instructor_lab(course, tmp_path_factory):
    # The formgrader finds the course (solutions/, gradebook) from the server's root folder, so an
    # instructor serves the course root (`jupyter lab` in the repository's folder). With the
    # learner's root_dir=notebooks its links point outside the server ("../solutions/...").
    lab = JupyterLab(course, tmp_path_factory.mktemp("instructor-lab"), instructor=True)
    yield lab
    lab.stop()


def test_formgrader_lists_every_assignment_for_an_instructor(course, instructor_lab, browser):
    page = browser.new_page()
    try:
        page.goto(f"{instructor_lab.url}/lab?token={instructor_lab.token}&reset")
        page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=120_000)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Nbgrader$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Formgrader$")).click()
        frame = page.frame_locator("iframe[src*='formgrader']")
        frame.locator("#main-table tr td a").first.wait_for(timeout=60_000)
        listed = frame.locator("#main-table").inner_text()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        frame.locator("#main-table").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "formgrader-manage-assignments.png"))
        expected = sorted(p.name for p in (course / "solutions").iterdir() if p.is_dir())
        missing = [name for name in expected if name not in listed]
        assert not missing, f"the formgrader does not list {missing}; it shows:\n{listed}"
        # The assignment's name opens its source folder in JupyterLab's file browser.
        frame.locator("#main-table a", has_text=expected[0]).first.click()
        page.wait_for_function(f"() => document.querySelector('.jp-FileBrowser .jp-BreadCrumbs')"
                               f"?.textContent.includes('{expected[0]}')", timeout=30_000)
        crumbs = page.inner_text(".jp-FileBrowser .jp-BreadCrumbs")
        page.screenshot(path=str(SCREENSHOTS / "formgrader-opened-source-folder.png"))
        assert "solutions" in crumbs, f"the assignment link opened {crumbs!r}, not solutions/{expected[0]}"
    finally:
        page.close()


# ---- what a learner's JupyterLab shows, and what an instructor's adds -------------------------------------

INSTRUCTOR_ITEMS = ("Course List", "Formgrader", "Create assignment")   # nbgrader's menu, instructor only


def _what_the_lab_shows(lab, browser, who: str) -> dict:
    """What the file browser lists, the Nbgrader menu's visible items, whether the Create Assignment panel and the news question exist,
    the news setting's default, and whether the server answers on /formgrader."""
    page = browser.new_page()
    try:
        page.goto(f"{lab.url}/lab?token={lab.token}&reset")
        page.wait_for_selector(".jp-DirListing-item", timeout=120_000)
        files = page.locator(".jp-DirListing-itemText").all_inner_texts()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Nbgrader$")).click()
        page.wait_for_selector(".lm-Menu .lm-Menu-itemLabel", timeout=30_000)
        items = [t.strip() for t in page.locator(".lm-Menu .lm-Menu-item:visible .lm-Menu-itemLabel").all_inner_texts()]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"lab-{who}-nbgrader-menu.png"))
        shown = {"files": [t.strip() for t in files], "menu": [t for t in items if t],
                 "create assignment panel": page.locator("#nbgrader-create_assignemnt").count() > 0,
                 "news question": page.get_by_text("official Jupyter news").count() > 0}
    finally:
        page.close()
    notification = lab.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")
    shown["fetch news by default"] = notification["schema"]["properties"]["fetchNews"]["default"]
    request = urllib.request.Request(f"{lab.url}/formgrader", headers={"Authorization": f"token {lab.token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            shown["formgrader page"] = response.status == 200
    except urllib.error.HTTPError:
        shown["formgrader page"] = False
    return shown


def test_a_learner_sees_validate_and_assignments_an_instructor_the_instructor_tools(learner_lab, instructor_lab,
                                                                                     browser):
    learner = _what_the_lab_shows(learner_lab, browser, "learner")
    assert "00_start_here" in learner["files"] and "solutions" not in learner["files"], learner
    assert "Assignment List" in learner["menu"], learner
    assert not set(INSTRUCTOR_ITEMS) & set(learner["menu"]), learner
    assert not learner["create assignment panel"] and not learner["formgrader page"], learner
    instructor = _what_the_lab_shows(instructor_lab, browser, "instructor")
    assert {"notebooks", "solutions"} <= set(instructor["files"]), instructor
    assert {"Assignment List", *INSTRUCTOR_ITEMS} <= set(instructor["menu"]), instructor
    assert instructor["create assignment panel"] and instructor["formgrader page"], instructor
    for shown in (learner, instructor):  # nobody is asked to fetch news from the web
        assert shown["fetch news by default"] == "false" and not shown["news question"], shown


# ---- live controls (autograder.controls) ---------------------------------------------------------------

LIVE_NOTEBOOK, LIVE_CELL = "06_data_ledger", "code-03a"     # the crash microbatch and the read-ahead
MOVED = ("crash in microbatch", 4)
DIRECT_CALL = "ledger_demo(crash_in_microbatch=4, prefetch=0)"


@pytest.fixture(scope="module")
def live_expected(course):
    """The control cell's output without a frontend (the defaults), and a direct call with the moved value."""
    student = course / "notebooks" / LIVE_NOTEBOOK / f"{LIVE_NOTEBOOK}.ipynb"
    defaults, moved = direct_calls(student, LIVE_CELL, [DIRECT_CALL])
    assert defaults["stdout"] and defaults["pngs"], "without a frontend the control cell printed or drew nothing"
    assert moved["stdout"] != defaults["stdout"]
    return defaults, moved


def _move_and_compare(demo: LiveDemo, defaults, moved, where: str) -> None:
    shown = demo.wait_for(lambda text: text == defaults["stdout"])
    before = demo.pngs()
    demo.set_slider(*MOVED)
    after = demo.wait_for(lambda text: text != shown)
    assert after == moved["stdout"], f"{where}: after moving {MOVED[0]!r} to {MOVED[1]} the demo prints\n{after}\n" \
                                     f"a direct call {DIRECT_CALL} prints\n{moved['stdout']}"
    figure = demo.pngs()
    assert len(figure) == 1 and figure != before, f"{where}: the figure was not redrawn ({len(figure)} image(s))"


def test_a_control_in_jupyterlab_reruns_the_demo(course, learner_lab, page, live_expected):
    path = course / "notebooks" / LIVE_NOTEBOOK / f"{LIVE_NOTEBOOK}.ipynb"
    notebook = LabNotebook(page, learner_lab, f"{LIVE_NOTEBOOK}/{path.name}", cells=len(cell_roles(path)))
    index = [c.get("id") for c in nbformat.read(str(path), as_version=4).cells].index(LIVE_CELL)
    notebook.run_above(index + 1)
    demo = LiveDemo(page)
    defaults, moved = live_expected
    _move_and_compare(demo, defaults, moved, "JupyterLab")
    notebook.screenshot(index, f"{LIVE_NOTEBOOK}-live-control")


def test_a_control_in_the_presentation_reruns_the_demo(course, browser, live_expected, tmp_path):
    presentation = Presentation(course, tmp_path, LIVE_NOTEBOOK[:2])
    page = browser.new_page()
    try:
        try:
            page.goto(presentation.url, timeout=RUN_TIMEOUT_S * 1000)
        except Exception as exc:       # seen once in CI under load: the kernel's stacks say where it waited
            raise AssertionError(f"{exc}\nthe stacks of what workbook-present started:\n{presentation.python_stacks()}")
        assert not page.locator(".jp-InputArea-editor").count(), "the presentation shows code"
        demo = LiveDemo(page)
        defaults, moved = live_expected
        _move_and_compare(demo, defaults, moved, "workbook-present")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        demo.root.screenshot(path=str(SCREENSHOTS / f"{LIVE_NOTEBOOK}-present-live-control.png"))
    except Exception as exc:
        raise AssertionError(f"{exc}\nworkbook-present's log:\n{presentation.log_tail()}") from exc
    finally:
        page.close()
        presentation.stop()
