"""JupyterLab in headless Chromium, driven the way a learner uses it: for tests/test_browser.py.

Everything runs in a throwaway copy of the course (notebooks/, solutions/,
nbgrader_config.py) with its own Jupyter config, data and runtime folders, so a
test run never saves into the repository or the user's ~/.jupyter.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from autograder.contract import is_answer_cell, is_test_cell
from autograder.course import REPO_ROOT

ROOT = REPO_ROOT
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = Path(os.environ.get("WORKBOOK_CHROMIUM", "/usr/bin/chromium"))
# Headless Chromium as root in a container: no sandbox, no GPU, and nothing that phones home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
VIEWPORT = {"width": 1280, "height": 900}
RUN_TIMEOUT_S = 240      # one notebook, all cells, on a busy 2-core CI machine
START_TIMEOUT_S = 120    # JupyterLab's server up and answering


def chromium_missing_reason() -> str | None:
    if CHROMIUM.exists():
        return None
    return (f"no Chromium at {CHROMIUM}: the browser tests need Debian's chromium "
            f"(apt-get install -y chromium) or WORKBOOK_CHROMIUM=/path/to/chromium")


def _workbook_module():
    """The repository's workbook.py: the browser test starts JupyterLab exactly as `workbook.py lab` does."""
    spec = importlib.util.spec_from_file_location("workbook", ROOT / "workbook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- a course copy ---------------------------------------------------------------------------

def make_course_copy(target: Path) -> Path:
    """notebooks/, solutions/ and nbgrader_config.py copied to ``target``, laid out like the repo."""
    target.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    for name in ("notebooks", "solutions"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    shutil.copy2(ROOT / "nbgrader_config.py", target / "nbgrader_config.py")
    return target


def _filled_in(course: Path, name: str):
    """The student notebook with every answer cell taken from the solution (what the classroom shows)."""
    from autograder.commands.demo import filled_in_notebook

    student = nbformat.read(str(course / "notebooks" / name / f"{name}.ipynb"), as_version=4)
    solution = nbformat.read(str(course / "solutions" / name / f"{name}.ipynb"), as_version=4)
    return filled_in_notebook(student, solution)


def write_filled_in_copy(course: Path, student_path: Path) -> Path:
    """Next to the student notebook, the same notebook with every answer filled in from solutions/."""
    name = student_path.stem
    target = course / "notebooks" / name / f"{name}-solved.ipynb"
    nbformat.write(_filled_in(course, name), str(target))
    return target


def answer_sources(course: Path, name: str) -> dict[int, str]:
    """Cell index -> the solution's source (markers stripped), for each answer cell of the student notebook."""
    return {i: cell.source for i, cell in enumerate(_filled_in(course, name).cells)
            if is_answer_cell(cell)}


# ---- JupyterLab ------------------------------------------------------------------------------

def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_settings(settings_dir: Path) -> None:
    """User settings for the test profile: no 'official Jupyter news?' toast over the screenshots."""
    plugin = settings_dir / "@jupyterlab" / "apputils-extension"
    plugin.mkdir(parents=True, exist_ok=True)
    (plugin / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))


def _own_jupyter_folders(env: dict, state: Path, folders: tuple[tuple[str, str], ...]) -> dict:
    """``env`` with each Jupyter folder variable pointed at its own subfolder of ``state``."""
    for var, sub in folders:
        (state / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(state / sub)
    return env


class _ServerProcess:
    """A server started in a session of its own, its output in a log file; stopped with SIGTERM, then
    SIGKILL. ``stop_whole_group``: signal every process of its session, not the server alone."""

    stop_whole_group = False

    def _start(self, command: list[str], cwd: Path, env: dict, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def _wait_until(self, ready, what: str) -> None:
        """Until ``ready()`` is true; fails (with the log's tail) if the server exits or takes too long."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.process.returncode}:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{what} did not answer within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def python_stacks(self) -> str:
        """Every process the server started (a kernel, its DataLoader workers) prints its threads' stacks
        and ends (faulthandler on SIGABRT: PYTHONFAULTHANDLER is set): what a hang was waiting on."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found += children.get(pid, [])
            todo += children.get(pid, [])
        for pid in reversed(found):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(3)
        return self.log_tail(300)

    def _signal(self, signum: int) -> None:
        if self.stop_whole_group:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log.close()


class JupyterLab(_ServerProcess):
    """`python3 workbook.py lab` (jupyter lab with workbook.lab_arguments: the learner's, on notebooks/) run
    from ``course``, plus --no-browser, a loopback port and a token. ``instructor``: `workbook.py lab
    --instructor`, on the whole course, as an instructor needs for the formgrader."""

    def __init__(self, course: Path, state: Path, instructor: bool = False):
        workbook = _workbook_module()
        self.token = os.urandom(12).hex()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.course = course
        env = _own_jupyter_folders(workbook.tool_env(), state, (
            ("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("IPYTHONDIR", "ipython")))
        command = [str(workbook.BIN / "jupyter"), "lab", *workbook.lab_arguments(instructor),
                   "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
                   "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")  # CI containers run as root
        self._start(command, course, env, state / "jupyterlab.log")
        self._wait_until(self._answers, "JupyterLab")

    def tree_url(self, path: str) -> str:
        # ?reset: a clean workspace, so tabs left from an earlier test do not reopen.
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def _answers(self) -> bool:
        with contextlib.suppress(OSError):
            self.api("/api/status")
            return True
        return False

    def shut_down_kernels(self) -> None:
        """Free each notebook's kernel once its test is done: memory is short on CI machines."""
        for session in self.api("/api/sessions"):
            with contextlib.suppress(OSError):
                self.api(f"/api/sessions/{session['id']}", method="DELETE")


@contextlib.contextmanager
def chromium(profile: Path):
    """Headless Chromium on a fresh profile (``playwright install`` cannot download browsers here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT)
        try:
            yield context
        finally:
            context.close()


# ---- a notebook in JupyterLab ------------------------------------------------------------------

@dataclass
class Output:
    mime: str
    text: str
    images: int        # <img> elements that actually decoded (naturalWidth > 0)
    broken_images: int


@dataclass
class CellView:
    """One cell as a learner sees it in the browser."""
    kind: str          # "code", "markdown" or "raw"
    prompt: str        # "[3]:", "[ ]:" or "[*]:" for code cells
    headings: int      # rendered <h1>..<h6> in a markdown cell
    rendered: bool     # a markdown cell shows HTML, not its source
    outputs: list[Output] = field(default_factory=list)

    @property
    def executed(self) -> bool:
        return bool(re.fullmatch(r"\[\d+\]:", self.prompt.strip()))

    @property
    def stderr_texts(self) -> list[str]:
        """Tracebacks and warnings: JupyterLab renders both as stderr (the pink boxes)."""
        return [o.text for o in self.outputs if o.mime == "application/vnd.jupyter.stderr"]

    @property
    def pass_lines(self) -> list[str]:
        """The checks' "✓ ..." lines, printed to stdout (a traceback may quote the print call)."""
        return [line for o in self.outputs if o.mime == "application/vnd.jupyter.stdout"
                for line in o.text.splitlines() if line.startswith("✓ ")]

    @property
    def text(self) -> str:
        return "\n".join(o.text for o in self.outputs)

    @property
    def images(self) -> int:
        return sum(o.images for o in self.outputs)


_READ_CELLS = """
() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')).map(cell => ({
  kind: cell.classList.contains('jp-CodeCell') ? 'code' : cell.classList.contains('jp-MarkdownCell') ? 'markdown' : 'raw',
  prompt: (cell.querySelector('.jp-InputPrompt') || {textContent: ''}).textContent,
  headings: cell.querySelectorAll('.jp-RenderedMarkdown h1, .jp-RenderedMarkdown h2, .jp-RenderedMarkdown h3, '
                                  + '.jp-RenderedMarkdown h4, .jp-RenderedMarkdown h5, .jp-RenderedMarkdown h6').length,
  rendered: cell.classList.contains('jp-mod-rendered') && !!cell.querySelector('.jp-RenderedMarkdown'),
  outputs: Array.from(cell.querySelectorAll('.jp-OutputArea-output')).map(out => ({
    mime: out.getAttribute('data-mime-type') || '',
    text: out.textContent,
    images: Array.from(out.querySelectorAll('img')).filter(i => i.complete && i.naturalWidth > 0).length,
    broken_images: Array.from(out.querySelectorAll('img')).filter(i => !(i.complete && i.naturalWidth > 0)).length,
  })),
}))
"""


# A cell queued or running shows [*]; the toolbar's execution indicator says whether the kernel is idle.
_BUSY = """
() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return true;
  const running = Array.from(panel.querySelectorAll('.jp-InputPrompt')).some(p => p.textContent.includes('*'));
  return running || !panel.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']");
}
"""

_PROMPT = """
i => {
  const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')[i];
  const prompt = cell && cell.querySelector('.jp-InputPrompt');
  return prompt ? prompt.textContent : '';
}
"""


class LabNotebook:
    """A notebook open in JupyterLab, operated through its menus like a learner would."""

    def __init__(self, page, lab: JupyterLab | None, path: str, cells: int):
        """Opens ``path`` on ``lab`` (anything with a ``tree_url(path)``); with ``lab=None``, the page
        shows it already (a learner opened it from another panel, e.g. nbgrader's Assignments tab)."""
        self.page, self.lab, self.path = page, lab, path
        if lab is not None:
            page.goto(lab.tree_url(path))
        # JupyterLab attaches cells in batches after opening: wait for all ``cells`` of the file.
        page.wait_for_function(
            "n => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell').length >= n",
            arg=cells, timeout=START_TIMEOUT_S * 1000)
        self.wait_until_idle(START_TIMEOUT_S)  # the kernel has started

    # -- driving ------------------------------------------------------------------------------
    def menu(self, menu: str, item: str) -> None:
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).first.click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()

    def wait_until_idle(self, timeout_s: float = RUN_TIMEOUT_S) -> None:
        """Until no cell is running or queued ([*]) and the kernel says idle, three looks in a row 0.1 s
        apart (a run that stops at an error comes back here once per stop: the wait is paid each time)."""
        deadline, calm = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            busy = self.page.evaluate(_BUSY)
            calm = 0 if busy else calm + 1
            if calm >= 3:
                return
            self.page.wait_for_timeout(100)
        raise TimeoutError(f"{self.path}: cells still running after {timeout_s:.0f} s")

    def select(self, index: int) -> None:
        """Click a cell's prompt area: selects the cell without entering its editor. Clicks again
        until the cell is the active one: outputs still rendering above it can move it under the mouse."""
        cell = self.cell(index)
        for _ in range(5):
            cell.scroll_into_view_if_needed()
            cell.locator(".jp-InputPrompt").first.click()
            if "jp-mod-active" in (cell.get_attribute("class") or ""):
                return
            self.page.wait_for_timeout(200)
        raise AssertionError(f"{self.path}: cell {index + 1} cannot be selected by clicking its prompt")

    def _run(self, menu_item: str, watch: int) -> None:
        """Start a run from the Run menu, see it start (cell ``watch``'s prompt changes), see it end."""
        before = self.prompt(watch)
        self.menu("Run", menu_item)
        deadline = time.monotonic() + 30
        while self.prompt(watch) == before and time.monotonic() < deadline:
            self.page.wait_for_timeout(100)
        self.wait_until_idle()

    def prompt(self, index: int) -> str:
        return self.page.evaluate(_PROMPT, index)

    def run_everything(self, start: int | None = None, until: int | None = None) -> int:
        """Run > Run All Cells (or, from cell ``start``, Run Selected Cell and All Below).
        JupyterLab stops at a cell that raises, so carry on from the first code cell not run yet
        until every code cell from the start ran (with ``until``: every code cell up to that one; what
        comes after it may be left unrun). Returns how many times the run stopped at an error."""
        cells = self.cells()
        code = [i for i, c in enumerate(cells) if c.kind == "code"]
        # A cell ran in this pass when its prompt number changed (numbers only grow).
        before = {i: cells[i].prompt for i in code}
        if start is None:
            self._run("Run All Cells", watch=code[0])
            start = code[0]
        else:
            self._run_from(start, last=len(cells) - 1)
        stops, tries = 0, {}
        while True:
            cells = self.cells()
            pending = next((i for i in code if i >= start
                            and not (cells[i].executed and cells[i].prompt != before[i])), None)
            if pending is None or (until is not None and pending > until) or tries.get(pending, 0) == 2:
                return stops  # done, or stuck (a run from there twice did not run it): the caller reports it
            # Run again from the first cell not run. A stop is the cell above it showing an error;
            # otherwise a loaded machine dropped the click or the request, and that is no stop.
            above = max((i for i in code if i < pending), default=None)
            if not tries.get(pending) and above is not None and cells[above].stderr_texts:
                stops += 1
            tries[pending] = tries.get(pending, 0) + 1
            self._run_from(pending, last=len(cells) - 1)

    def run_above(self, index: int) -> None:
        """Run > Run All Above Selected Cell, with cell ``index`` selected (the cells before it run)."""
        self.select(index)
        self._run("Run All Above Selected Cell", watch=max(i for i, c in enumerate(self.cells())
                                                             if c.kind == "code" and i < index))

    def _run_from(self, index: int, last: int) -> None:
        self.select(index)
        # JupyterLab greys out "... and All Below" on the notebook's last cell.
        self._run("Run Selected Cell and All Below" if index < last else "Run Selected Cell and Do not Advance",
                  watch=index)

    def type_into(self, index: int, source: str) -> str:
        """Replace a code cell's text as a learner pasting an answer would; returns what the editor holds."""
        editor = self.cell(index).locator(".jp-InputArea-editor .cm-content")
        editor.scroll_into_view_if_needed()
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(source)  # one text input: no auto-indent on each newline
        self.page.keyboard.press("Escape")      # back to command mode
        return editor.inner_text()

    # -- reading ------------------------------------------------------------------------------
    def cells(self) -> list[CellView]:
        views = []
        for raw in self.page.evaluate(_READ_CELLS):
            outputs = [Output(**o) for o in raw.pop("outputs")]
            views.append(CellView(outputs=outputs, **raw))
        return views

    def cell(self, index: int):
        return self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(index)

    def screenshot(self, index: int, name: str) -> Path:
        """A picture of one cell (scrolled into view) for a person to look at."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        target = SCREENSHOTS / f"{name}.png"
        self.cell(index).scroll_into_view_if_needed()
        self.page.wait_for_timeout(200)
        self.cell(index).screenshot(path=str(target))
        return target

    def screenshot_plot(self, index: int, name: str) -> Path:
        """A picture of the first image a cell shows (a whole cell may be taller than the window)."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        target = SCREENSHOTS / f"{name}.png"
        image = self.cell(index).locator(".jp-OutputArea-output img").first
        image.scroll_into_view_if_needed()
        image.screenshot(path=str(target))
        return target

    def screenshot_page(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        target = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(target))
        return target


def cell_roles(path: Path) -> list[str]:
    """For each cell of a notebook file: "answer", "test", "markdown" or "code"."""
    roles = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        if is_answer_cell(cell):
            roles.append("answer")
        elif is_test_cell(cell):
            roles.append("test")
        else:
            roles.append(cell.cell_type)
    return roles


def markdown_headings(path: Path) -> list[int]:
    """ATX headings (# ...) in each markdown cell's source, outside code fences; -1 for other cells."""
    counts = []
    for cell in nbformat.read(str(path), as_version=4).cells:
        if cell.cell_type != "markdown":
            counts.append(-1)
            continue
        fenced, n = False, 0
        for line in cell.source.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,6}\s", line):
                n += 1
        counts.append(n)
    return counts


def plotting_cells(path: Path) -> list[int]:
    """Indices of code cells that draw a figure with plt.show()."""
    return [i for i, c in enumerate(nbformat.read(str(path), as_version=4).cells)
            if c.cell_type == "code" and "plt.show()" in c.source]


# ---- a live demo (autograder.controls) -------------------------------------------------------------

def direct_calls(notebook: Path, cell_id: str, calls: list[str]) -> list[dict]:
    """Run ``notebook`` with nbclient (no widget frontend) up to and including cell ``cell_id``, then one
    cell per call: for the cell ``cell_id`` and each call, its stdout text, the PNGs it showed and the
    MIME types of its outputs."""
    from nbclient import NotebookClient
    from autograder.contract import KERNEL_EXTRA_ARGUMENTS

    nb = nbformat.read(str(notebook), as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if c.get("id") == cell_id)
    nb.cells = nb.cells[:end + 1] + [nbformat.v4.new_code_cell(call) for call in calls]
    NotebookClient(nb, timeout=RUN_TIMEOUT_S, kernel_name="python3", extra_arguments=KERNEL_EXTRA_ARGUMENTS,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    results = []
    for cell in nb.cells[end:]:
        stdout = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
        pngs = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        errors = [o for o in cell.outputs if o.get("output_type") == "error" or o.get("name") == "stderr"]
        assert not errors, f"{cell.source[:80]!r} under nbclient: {errors}"
        mimes = sorted({m for o in cell.outputs for m in o.get("data", {})})
        results.append({"stdout": stdout, "pngs": pngs, "mimes": mimes})
    return results


_LIVE_STDOUT = """
root => Array.from(root.querySelectorAll('.widget-output .jp-OutputArea-output'))
  .filter(o => o.getAttribute('data-mime-type') === 'application/vnd.jupyter.stdout').map(o => o.textContent).join('')
"""
_LIVE_PNGS = """
root => Array.from(root.querySelectorAll('.widget-output img')).filter(i => i.complete && i.naturalWidth > 0)
  .map(i => i.src.replace(/^data:image\\/png;base64,/, ''))
"""


class LiveDemo:
    """The controls and output area of an ``autograder.controls.live`` cell, in JupyterLab or Voilà."""

    def __init__(self, page, index: int = 0, timeout_s: float = RUN_TIMEOUT_S):
        self.page = page
        self.root = page.locator(".workbook-live").nth(index)
        self.root.wait_for(timeout=timeout_s * 1000)
        self.wait_for(lambda text: text.strip() != "", timeout_s)

    def stdout(self) -> str:
        return self.root.evaluate(_LIVE_STDOUT)

    def pngs(self) -> list[str]:
        return self.root.evaluate(_LIVE_PNGS)

    def wait_for(self, done, timeout_s: float = 60) -> str:
        """Until ``done(stdout)`` holds and a figure has loaded, with no "working…" shown; the stdout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.stdout()
            if done(text) and self.pngs() and "working" not in self.root.locator(".widget-html").first.inner_text():
                return text
            self.page.wait_for_timeout(200)
        raise TimeoutError(f"the live demo still shows {self.stdout()!r} after {timeout_s:.0f} s")

    def set_slider(self, label: str, value: int) -> None:
        """Type ``value`` into the slider's readout, as a teacher can (Enter applies it)."""
        slider = self.root.locator(".widget-slider", has_text=label).first
        readout = slider.locator(".widget-readout")
        readout.scroll_into_view_if_needed()
        readout.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.type(str(value))
        self.page.keyboard.press("Enter")


class Presentation(_ServerProcess):
    """``workbook-present NAME --no-browser --port P`` run from ``course``, with its own Jupyter folders."""

    stop_whole_group = True   # workbook-present, voila and the kernel it started

    def __init__(self, course: Path, state: Path, name: str):
        workbook = _workbook_module()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = _own_jupyter_folders(dict(workbook.tool_env()), state, (
            ("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("IPYTHONDIR", "ipython")))
        env["PYTHONFAULTHANDLER"] = "1"        # python_stacks(), should the page never load
        self._start([str(workbook.BIN / "workbook-present"), name, "--no-browser", "--port", str(self.port)],
                    course, env, state / "present.log")
        self._wait_until(self._listens, "workbook-present")

    def _listens(self) -> bool:
        with contextlib.closing(socket.socket()) as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0
