"""A class on JupyterHub, end to end, the way the README's "Teaching a class on JupyterHub" runs it.

Real Linux users (an instructor, alice and bob), the student distribution, deploy/jupyterhub/setup_hub.sh
as the administrator, a real JupyterHub and configurable-http-proxy on loopback, PAM logins. The
instructor releases notebook 00; alice works in headless Chromium through the hub (Assignments tab,
Fetch, Run All, workbook-check in a terminal of the hub, Submit) with an almost-right answer while bob
works on the command line with a right one; the instructor collects, autogrades with the course's trusted judge
(as that ordinary user), generates and releases feedback; both fetch it. Asserted: the grades in the
gradebook, the feedback page as alice sees it (the trap named, the message wrapped, no hidden test),
what no student can read, which nbgrader extensions each one's JupyterLab has, and the formgrader inside
the instructor's JupyterLab.

Needs root (useradd), JupyterHub and configurable-http-proxy (npm); skipped with the reason otherwise.
Screenshots: artifacts/screenshots/hub-*.png.
"""

from __future__ import annotations

import concurrent.futures
import grp
import inspect
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from traitlets.config.loader import PyFileConfigLoader

from browser_support import (SCREENSHOTS, LabNotebook, _lab_settings, answer_sources, cell_roles, chromium,
                             make_course_copy)
from hub_support import (COURSE_ID, DEPLOY, Account, ClassAccounts, Hub, HubUser, can_read, hub_missing_reason,
                         make_hub_folders, overlay_environment, run_as, run_setup_hub, user_env, wait_for)
from notebook_files import ROOT, fill_answers, solution_answers

NB = "00_start_here"                        # one exercise, three test cells: the quickest to grade
RELEASED = ROOT / "notebooks" / NB / f"{NB}.ipynb"
SOLUTION = ROOT / "solutions" / NB / f"{NB}.ipynb"
INSTRUCTOR_ONLY = {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                   "@jupyter/nbgrader:course-list"}
TRAP = "A tolerance (as in torch.allclose)"  # what check_same_weights_exact says to the allclose answer
HIDDEN_NOTE = "hidden tests with other seeds and sizes ran here"


def allclose_answer() -> str:
    """Alice's almost-right answer: equal within a tolerance (start_here_impls.same_weights_allclose)."""
    from fixtures.start_here_impls import same_weights_allclose

    return "import torch\n\n\n" + inspect.getsource(same_weights_allclose).replace(
        "def same_weights_allclose", "def same_weights")


class HubClass:
    """What the test set up (folders, accounts, the hub), the commands its people run, what went wrong."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.folders = make_hub_folders()
        self.accounts = ClassAccounts()
        self.hub: Hub | None = None
        self.course = self.accounts.instructor.home / COURSE_ID
        self.problems: list[str] = []
        self.timings: dict[str, float] = {}

    def timed(self, what: str, started: float) -> None:
        self.timings[what] = round(time.monotonic() - started, 1)

    def env(self, account: Account) -> dict:
        """The instructor runs the course's environment (a clone's .venv: this one), students the hub's."""
        bin_dir = Path(sys.executable).parent if account is self.accounts.instructor else self.folders.env / "bin"
        return user_env(account, [bin_dir], self.folders.jupyter_config)

    def instructor(self, *args: str) -> subprocess.CompletedProcess:
        """``nbgrader ARGS`` in the course folder, as the instructor."""
        account = self.accounts.instructor
        return run_as(account, [sys.executable, "-m", "nbgrader", *args], self.env(account), self.folders.mount_point,
                      cwd=self.course)

    def student(self, account: Account, *args, check: bool = True) -> subprocess.CompletedProcess:
        """A command in the student's home, from the hub's environment (as in a terminal of the hub)."""
        return run_as(account, list(args), self.env(account), self.folders.mount_point, check=check)

    def can_read(self, account: Account, path: Path) -> bool:
        return can_read(account, path, self.env(account), self.folders.mount_point)

    def close(self) -> None:
        if self.hub is not None:
            self.hub.stop()
        self.accounts.remove()
        shutil.rmtree(self.folders.root, ignore_errors=True)


@pytest.fixture(scope="module")
def hub_class(tmp_path_factory):
    """The administrator's part: the student distribution, the hub's environment, setup_hub.sh, the hub."""
    from autograder.commands.student_package import build_student_package

    started = time.monotonic()
    klass = HubClass(tmp_path_factory.mktemp("hub"))
    try:
        dist = klass.folders.root / "student-dist"
        build_student_package(dist)
        overlay_environment(klass.folders.env)
        run_setup_hub(klass.folders, klass.accounts, dist)
        for account in klass.accounts.all:   # no "Jupyter news?" toast over the screenshots (each user's setting)
            _lab_settings(account.home / ".jupyter" / "lab" / "user-settings")
            subprocess.run(["chown", "-R", f"{account.name}:", str(account.home / ".jupyter")], check=True)
        # A home made after setup_hub.sh with Debian's default mode: the hub makes it private at login.
        klass.accounts.alice.home.chmod(0o755)
        klass.timed("administrator: student distribution, hub environment, setup_hub.sh", started)
        started = time.monotonic()
        klass.hub = Hub(klass.folders, klass.folders.root)
        klass.timed("hub up", started)
        yield klass
    finally:
        klass.close()


# ---- the people ---------------------------------------------------------------------------------

def instructor_releases(klass: HubClass) -> None:
    """The instructor's course: the repository (a copy stands for `git clone`), private, notebook 00 released."""
    started = time.monotonic()
    make_course_copy(klass.course)
    subprocess.run(["chown", "-R", f"{klass.accounts.instructor.name}:", str(klass.course)], check=True)
    run_as(klass.accounts.instructor, ["chmod", "700", klass.course], klass.env(klass.accounts.instructor),
           klass.folders.mount_point)
    klass.instructor("generate_assignment", NB, "--force")
    klass.instructor("release_assignment", NB)
    klass.timed("instructor: generate_assignment, release_assignment", started)


def _open_assignments(page) -> list[str]:
    """Nbgrader > Assignment List; returns what the Nbgrader menu offered."""
    offered = _menu(page, "Nbgrader", "Assignment List")
    page.locator("#released_assignments_list").wait_for(timeout=60_000)
    return offered


def _menu(page, menu: str, item: str) -> list[str]:
    """Open ``menu`` in JupyterLab's menu bar and click ``item``; returns the menu's items. A click that a
    busy page dropped is repeated."""
    wanted = page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$"))
    for attempt in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
        try:
            wanted.first.wait_for(timeout=10_000)
            break
        except Exception:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    offered = [label for label in page.locator(".lm-Menu-itemLabel").all_inner_texts() if label.strip()]
    wanted.first.click()
    return offered


def _terminal(page, command: str) -> None:
    """File > New > Terminal, then type ``command`` and Enter (the shell starts in the user's home)."""
    _menu(page, "File", "New")          # a submenu: clicking opens it
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Terminal$")).click()
    terminal = page.locator(".jp-Terminal:not(.lm-mod-hidden) .xterm-helper-textarea").last
    terminal.wait_for(state="attached", timeout=60_000)
    page.wait_for_timeout(1000)   # the shell's prompt
    terminal.focus()
    page.keyboard.type(command)
    page.keyboard.press("Enter")


def _disabled_extensions(page) -> set[str]:
    """What JupyterLab was told to leave off (its page's config data)."""
    return set(json.loads(page.locator("#jupyter-config-data").text_content()).get("disabledExtensions", []))


def alice_works_in_the_browser(klass: HubClass, page) -> HubUser:
    """Log in, Assignments tab, Fetch, open the notebook from the tab, paste the answer, Run All, save, Submit."""
    started, alice, problems = time.monotonic(), klass.accounts.alice, klass.problems
    user = HubUser(klass.hub, alice, page)
    user.log_in()
    if stat.S_IMODE(alice.home.stat().st_mode) != 0o700:
        problems.append(f"alice's home is still mode {stat.S_IMODE(alice.home.stat().st_mode):o} after her login")
    if not INSTRUCTOR_ONLY <= _disabled_extensions(page):
        problems.append(f"alice's JupyterLab has instructor extensions: {INSTRUCTOR_ONLY - _disabled_extensions(page)}")
    menu = _open_assignments(page)
    if menu != ["Assignment List"]:
        problems.append(f"alice's Nbgrader menu shows {menu}, not only the Assignment List")
    released = page.locator("#released_assignments_list .list_item", has_text=NB)
    released.wait_for(timeout=60_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "hub-assignments-tab-released.png"))
    released.locator("button", has_text="Fetch").click()
    fetched = page.locator("#fetched_assignments_list > .list_item", has_text=NB)
    fetched.wait_for(timeout=60_000)
    fetched.locator("a.assignment-notebooks-link").click()
    fetched.locator(".nested_list_item a", has_text=NB).click()
    roles = cell_roles(RELEASED)
    notebook = LabNotebook(page, None, f"{NB}/{NB}.ipynb", cells=len(roles))
    (answer_cell,) = answer_sources(ROOT, NB)
    notebook.type_into(answer_cell, allclose_answer())
    notebook.run_everything()
    tests = {i: cell for i, cell in enumerate(notebook.cells()) if roles[i] == "test"}
    trapped = [i for i, cell in tests.items() if any(TRAP in text for text in cell.stderr_texts)]
    passed = [i for i, cell in tests.items() if cell.pass_lines]
    if len(trapped) != 1 or len(passed) != 2:
        problems.append(f"after Run All alice's test cells show the trap in cells {trapped}, ✓ in {passed}")
    notebook.menu("File", "Save Notebook")
    wait_for(lambda: "allclose" in (alice.home / NB / f"{NB}.ipynb").read_text(), "alice's notebook saved")
    # The notebooks' advice: the whole notebook, the way the grader runs it, from a terminal of the hub.
    report = alice.home / "workbook-check.txt"
    _terminal(page, f"workbook-check 00 > {report.name} 2>&1; echo exit $? >> {report.name}")
    said = wait_for(lambda: report.exists() and "exit " in report.read_text() and report.read_text(),
                    "workbook-check in alice's terminal", timeout_s=240)
    if "00_start_here: 2 / 3 points" not in said or TRAP not in said or "exit 1" not in said:
        problems.append(f"`workbook-check 00` in alice's terminal said:\n{said[-2000:]}")
    page.locator(".lm-TabBar-tab", has_text="Assignments").click()
    fetched.locator("button", has_text="Submit").click()
    page.locator("#submitted_assignments_list .list_item", has_text=NB).wait_for(timeout=60_000)
    page.screenshot(path=str(SCREENSHOTS / "hub-assignments-tab-submitted.png"))
    klass.timed("alice: log in, fetch, answer, Run All, workbook-check in a terminal, submit (browser)", started)
    return user


def bob_works_on_the_command_line(klass: HubClass) -> None:
    """nbgrader fetch_assignment, the right answer, nbgrader submit."""
    started, bob, python = time.monotonic(), klass.accounts.bob, klass.folders.env / "bin" / "python"
    klass.student(bob, python, "-m", "nbgrader", "fetch_assignment", NB)
    his = bob.home / NB / f"{NB}.ipynb"
    nbformat.write(fill_answers(his, solution_answers(SOLUTION)), str(his))
    shutil.chown(his, bob.name, bob.name)
    klass.student(bob, python, "-m", "nbgrader", "submit", NB)
    klass.timed("bob: fetch, answer, submit (command line; beside alice)", started)


def no_student_can_read_what_is_not_theirs(klass: HubClass, page) -> None:
    accounts, exchange = klass.accounts, klass.folders.exchange / COURSE_ID
    private = {"the course folder": klass.course, "solutions/ (the hidden tests)": klass.course / "solutions" / NB /
               f"{NB}.ipynb", "the gradebook": klass.course / "gradebook.db",
               "alice's notebook": accounts.alice.home / NB / f"{NB}.ipynb", "alice's home": accounts.alice.home,
               "the exchange's submissions": exchange / "inbound"}
    for what, path in private.items():
        if not path.exists():
            klass.problems.append(f"{what} ({path}) does not exist: the check below would prove nothing")
        elif klass.can_read(accounts.bob, path):
            klass.problems.append(f"bob can read {what}: {path}")
    # The same probe reads what is his: so a refusal above is the permissions, not a broken probe.
    for what, path in {"his notebook": accounts.bob.home / NB / f"{NB}.ipynb",
                       "the released assignment": exchange / "outbound" / NB / f"{NB}.ipynb"}.items():
        if not klass.can_read(accounts.bob, path):
            klass.problems.append(f"bob cannot read {what} ({path}): the probe of what he cannot read is broken")
    # Through the hub, to the instructor's running server: alice's session, redirected as far as the hub
    # lets it go, ends refused.
    response = page.request.get(f"{klass.hub.url}/user/{accounts.instructor.name}/api/contents/{COURSE_ID}")
    print(f"alice asking for the instructor's server: {response.status} at {response.url}")
    if response.status < 400:
        klass.problems.append(f"alice's browser session reached the instructor's server: {response.status} "
                              f"{response.url}\n{response.text()[:300]}")


def instructor_grades(klass: HubClass) -> None:
    """collect, autograde (the trusted judge), generate_feedback, release_feedback; then the gradebook."""
    for step in ("collect", "autograde", "generate_feedback", "release_feedback"):
        started = time.monotonic()
        done = klass.instructor(step, NB, *(["--create"] if step == "autograde" else []))
        klass.timed(f"instructor: {step}", started)
        if step == "autograde" and len([line for line in done.stderr.splitlines() if "Judged" in line]) != 2:
            klass.problems.append("autograde did not judge both submissions in the sandbox:\n" + done.stderr[-3000:])
    from nbgrader.api import Gradebook

    alice, bob = klass.accounts.alice.name, klass.accounts.bob.name
    with Gradebook(f"sqlite:///{klass.course / 'gradebook.db'}") as gradebook:
        scores = {s: gradebook.find_submission(NB, s).score for s in (alice, bob)}
        cells = {s: {g.name: g.score for g in gradebook.find_submission_notebook(NB, NB, s).grades if g.max_score}
                 for s in (alice, bob)}
    if scores != {alice: 2.0, bob: 3.0}:
        klass.problems.append(f"gradebook: {scores}, expected alice 2.0 and bob 3.0; per cell: {cells}")
    elif cells[alice]["test_same_weights_exact"] != 0.0:
        klass.problems.append(f"alice lost another test cell than test_same_weights_exact: {cells[alice]}")


def both_fetch_feedback(klass: HubClass, user: HubUser) -> None:
    """bob on the command line; alice from the Assignments tab, then her feedback page in JupyterLab."""
    started, page, problems = time.monotonic(), user.page, klass.problems
    bob, python = klass.accounts.bob, klass.folders.env / "bin" / "python"
    klass.student(bob, python, "-m", "nbgrader", "fetch_feedback", NB)
    his = list((bob.home / NB / "feedback").glob(f"*/{NB}.html"))
    if len(his) != 1 or "Score: 3.0 / 3.0" not in his[0].read_text():
        problems.append(f"bob's feedback: {his}")
    page.reload()
    page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=120_000)
    _open_assignments(page)
    submitted = page.locator("#submitted_assignments_list > .list_item", has_text=NB)
    submitted.locator("button", has_text="Fetch Feedback").click()
    view = submitted.locator("a", has_text="view feedback")
    view.wait_for(timeout=60_000)
    page.screenshot(path=str(SCREENSHOTS / "hub-assignments-tab-feedback.png"))
    view.click()                                  # the file browser goes to the feedback's folder
    listed = page.locator(".jp-DirListing-item", has_text=f"{NB}.html")
    listed.wait_for(timeout=30_000)
    listed.dblclick()
    frame = page.frame_locator(".jp-HTMLViewer iframe")
    message = frame.locator("pre", has_text=TRAP).first   # the failure message, once the page has loaded
    try:
        message.wait_for(timeout=60_000)
    except Exception:
        problems.append(f"alice's feedback page does not show the failure message {TRAP!r}")
        return
    text = frame.locator("body").inner_text()
    for shown in ("Score: 2.0 / 3.0", TRAP, HIDDEN_NOTE):
        if shown not in text:
            problems.append(f"alice's feedback page does not show {shown!r}")
    hidden = [line.strip() for cell in nbformat.read(str(SOLUTION), as_version=4).cells
              for line in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)]
    if not hidden or any(line in text for line in hidden):
        problems.append(f"alice's feedback page shows hidden test code (or there was none to look for): {hidden}")
    message.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "hub-feedback-page.png"))
    box = message.evaluate("p => ({width: p.clientWidth, content: p.scrollWidth, height: p.clientHeight, "
                           "line: parseFloat(getComputedStyle(p).lineHeight) || 17})")
    if box["content"] > box["width"] + 1 or box["height"] < 2 * box["line"]:
        problems.append(f"the failure message does not wrap in the feedback page: {box}")
    klass.timed("feedback: bob (command line), alice (Assignments tab, feedback page)", started)


def instructor_in_the_hub(klass: HubClass, page) -> None:
    """The instructor's JupyterLab has the instructor extensions, and the formgrader shows the released
    assignment inside it."""
    started = time.monotonic()
    instructor = HubUser(klass.hub, klass.accounts.instructor, page)
    instructor.log_in()
    if INSTRUCTOR_ONLY & _disabled_extensions(page):
        klass.problems.append(f"the instructor's JupyterLab lacks {INSTRUCTOR_ONLY & _disabled_extensions(page)}")
    _menu(page, "Nbgrader", "Formgrader")
    try:
        page.frame_locator("iframe[src*='formgrader']").locator("#main-table", has_text=NB).wait_for(timeout=60_000)
    except Exception as exc:
        klass.problems.append(f"the formgrader does not show inside the hub ({type(exc).__name__})")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "hub-formgrader.png"))
    instructor.log_out()
    klass.timed("instructor: log in, formgrader in the hub, log out", started)


@pytest.mark.extended          # a real hub: CI's extended suites (tests/conftest.py)
@pytest.mark.skipif(hub_missing_reason() is not None, reason=hub_missing_reason() or "")
def test_a_class_on_the_hub_from_release_to_feedback(hub_class):
    klass = hub_class
    try:
        instructor_releases(klass)
        with chromium(klass.tmp / "chromium") as browser, concurrent.futures.ThreadPoolExecutor(1) as pool:
            page = browser.new_page()
            instructor_in_the_hub(klass, page)    # their server keeps running after they log out
            bob = pool.submit(bob_works_on_the_command_line, klass)
            alice = alice_works_in_the_browser(klass, page)
            bob.result()
            no_student_can_read_what_is_not_theirs(klass, page)
            instructor_grades(klass)
            both_fetch_feedback(klass, alice)
    finally:
        print("\n".join(f"{seconds:6.1f} s  {what}" for what, seconds in klass.timings.items()))
    assert not klass.problems, (f"(screenshots in {SCREENSHOTS}; the hub's log: {klass.hub.log_path})\n"
                                + "\n".join(klass.problems))


# ---- the hub's configuration, read as JupyterHub reads it (no root needed) --------------------------

def _hub_config(monkeypatch, **settings) -> object:
    for name, value in settings.items():
        monkeypatch.setenv(f"WORKBOOK_HUB_{name}", value)
    return PyFileConfigLoader("jupyterhub_config.py", path=str(DEPLOY)).load_config()


def test_the_hub_lets_in_the_class_by_its_unix_group_or_by_name_with_the_dummy_authenticator(monkeypatch):
    group = grp.getgrgid(os.getgid())
    config = _hub_config(monkeypatch, GROUP=group.gr_name, INSTRUCTORS="teacher", ENV="/opt/hub-env")
    assert config.JupyterHub.authenticator_class == "pam"
    assert config.PAMAuthenticator.allowed_groups == {group.gr_name} and config.Authenticator.allowed_users == {"teacher"}
    assert config.JupyterHub.ip == "127.0.0.1" and config.JupyterHub.spawner_class == "localprocess"
    assert config.Spawner.cmd == ["/opt/hub-env/bin/python", "-m", "jupyterhub.singleuser"]
    assert config.Spawner.environment["PATH"].startswith("/opt/hub-env/bin:")
    dummy = _hub_config(monkeypatch, GROUP=group.gr_name, INSTRUCTORS="teacher", AUTHENTICATOR="dummy")
    assert dummy.JupyterHub.authenticator_class == "dummy"
    assert dummy.Authenticator.allowed_users == {"teacher", *group.gr_mem}   # never anyone at all


def test_the_instructors_config_folder_turns_on_what_students_lack():
    page = json.loads((DEPLOY / "instructor" / "labconfig" / "page_config.json").read_text())
    assert {name for name, off in page["disabledExtensions"].items() if not off} == INSTRUCTOR_ONLY
    server = json.loads((DEPLOY / "instructor" / "jupyter_server_config.json").read_text())
    assert server["ServerApp"]["jpserver_extensions"] == {"nbgrader.server_extensions.formgrader": True,
                                                          "nbgrader.server_extensions.course_list": True}
    setup = (DEPLOY / "setup_hub.sh").read_text()
    assert all(name in setup for name in INSTRUCTOR_ONLY) and "disable --sys-prefix" in setup
