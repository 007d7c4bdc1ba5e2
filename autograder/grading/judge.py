"""Trusted grading: a submission's code runs in a sandbox, and the verdicts come from outside it.

``judge_notebook`` takes a notebook as nbgrader's autograde sees it (test cells already
restored from the instructor's source, hidden tests included) and:

1. runs every code cell that is not a test cell in a ``Sandbox`` (confined process, own
   directory, limits), in order. A cell that hangs or ends the process is skipped: the
   sandbox is started again and the cells before it are replayed, so one bad cell costs
   only what depends on it;
2. runs each test cell that calls the check modules in ``JUDGED_OUTSIDE`` here, in the
   grading process. The submission's names are proxies: every call goes into the sandbox
   and only data comes back (``autograder.grading.wire``), so nothing the submission does there
   (patching ``torch.equal``, replacing ``autograder`` modules, overriding builtins, printing
   a fake pass line) can touch the check or its reference. Traps that show only where the
   objects live (live tensors aliasing a model, DataLoader workers, a process killed
   mid-write) are observed by a check's probe, run in the sandbox as it was before any
   submitted code (``autograder.checking.observe``); the verdict is still reached here.
   A test cell that calls no check module (a plain ``assert``) runs in the sandbox.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import dataclasses
import io
import resource
import signal
import threading
import time
import warnings

import nbformat
import torch

from autograder.contract import (DEFAULT_CELL_TIMEOUT, exercise_of, failure_message, is_answer_cell, is_test_cell,
                                 nbgrader_meta)
from autograder.course import CHECK_MODULES
from autograder.grading import protections
from autograder.grading.sandbox import Limits, Sandbox, SandboxDied

# Check modules whose test cells run in the judge, calling into the sandbox: every notebook's.
JUDGED_OUTSIDE = frozenset(CHECK_MODULES)


@dataclasses.dataclass
class Verdict:
    grade_id: str
    passed: bool
    message: str           # why it failed, for the learner ("" when it passed)
    stdout: str            # the check's pass lines
    error: dict | None     # the nbgrader error output (ename, evalue), None when it passed
    outside: bool          # judged in the grading process (True) or inside the sandbox


@dataclasses.dataclass
class Judgement:
    verdicts: list[Verdict]
    cell_errors: dict[int, dict]    # code cell index -> error output of a non-test cell
    confinement: dict
    seconds: float
    unconfined: list[str] = dataclasses.field(default_factory=list)   # protections missing, graded anyway

    @property
    def stopped(self) -> list[str]:
        """What the sandbox had to stop (hangs, exits, crashes), or why the submission could not be judged at
        all, for the instructor's report."""
        cells = [f"cell {i + 1}: {e['evalue']}" for i, e in self.cell_errors.items() if e["ename"] == "SubmissionStopped"]
        checks = [v.error["evalue"] for v in self.verdicts
                  if v.error and (v.error["evalue"].startswith("checking `") or v.error["ename"] == NOT_GRADABLE)]
        return cells + list(dict.fromkeys(checks))


def judged_outside(source: str) -> bool:
    """Judged outside: the cell imports autograder modules, all of them in JUDGED_OUTSIDE."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    ours = {m for m in modules if m.split(".")[0] == "autograder"}
    return bool(ours) and ours <= JUDGED_OUTSIDE


class SubmissionNames(dict):
    """The test cell's local names: its own imports, else the submission's names, as proxies."""

    def __init__(self, sandbox: Sandbox):
        super().__init__()
        self.sandbox = sandbox

    def __missing__(self, name: str):
        if hasattr(builtins, name):
            raise KeyError(name)                    # the judge's own builtins, never the submission's
        try:
            value = self.sandbox.request("lookup", name)
        except NameError:
            raise KeyError(name) from None
        self[name] = value
        return value


def _tampering(changed: list[str]) -> str:
    return (f"it changed code that the notebook and the grader share ({', '.join(changed[:4])}"
            f"{', ...' if len(changed) > 4 else ''}). Graded code may define its own names but not patch "
            f"Python, the libraries or the grader.")


def error_output(ename: str, evalue: str) -> dict:
    return {"output_type": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Where and how a notebook is judged: what its sandboxes must not read, whether others are judged beside
    it on this machine (then each sandbox needs CPU and processes of its own), and whether the instructor
    allowed grading on a machine that lacks a protection (``autograder.grading.protections``)."""
    protected: tuple = ()
    parallel: bool = False
    allow_unconfined: bool = False


class Judge:
    def __init__(self, nb, cell_seconds: float = DEFAULT_CELL_TIMEOUT, limits: Limits = Limits(),
                 policy: Policy = Policy()):
        self.nb = nb
        self.cell_seconds = cell_seconds
        self.limits = limits
        self.policy = policy
        self.unconfined: list[str] | None = None     # what its first sandbox lacked (checked once)
        self.sandbox: Sandbox | None = None
        self.good: list[tuple[int, str]] = []       # program cells that ran without killing the sandbox
        self.confinement: dict = {}
        self.cell_errors: dict[int, dict] = {}
        self.stopped: dict[str, str] = {}            # answer cell grade_id -> why it was stopped
        self.failed_answers: dict[str, str] = {}     # answer cell grade_id -> the error it raised
        self.answer_names = {nbgrader_meta(c).get("grade_id", "") for c in nb.cells if is_answer_cell(c)}
        # The submission's names as test cells see them, kept from one test cell to the next as a kernel
        # keeps them (so a check's cache keyed on the learner's functions works as it does there); a
        # program cell may redefine any name, and a new sandbox holds new objects: both start afresh.
        self.names: SubmissionNames | None = None

    def run(self) -> Judgement:
        started = time.perf_counter()
        verdicts = []
        threads = torch.get_num_threads()
        with bounded_memory():
            return self._run(started, verdicts, threads)

    def _run(self, started: float, verdicts: list, threads: int) -> Judgement:
        try:
            # The sandbox's torch runs on one thread; references computed here must use the same
            # kernels (a BatchNorm reduction split over 2 threads differs in the last bit).
            torch.set_num_threads(1)
            for index, cell in enumerate(self.nb.cells):
                if cell.get("cell_type") != "code":
                    continue
                if is_test_cell(cell):
                    verdicts.append(self._test(cell))
                else:
                    self._program_cell(index, cell.source)
        finally:
            self._stop()
            torch.set_num_threads(threads)
        return Judgement(verdicts, self.cell_errors, self.confinement, time.perf_counter() - started,
                         self.unconfined or [])

    # the sandbox, kept running across cells
    def _ensure_sandbox(self) -> Sandbox:
        while self.sandbox is None or not self.sandbox.alive:
            self._stop()
            self.sandbox = Sandbox(self.limits, self.cell_seconds, self.policy.protected).start()
            self.confinement = self.sandbox.confinement
            if self.unconfined is None:       # refuses (ConfinementRefused) unless the instructor allowed it
                self.unconfined = protections.enforce(self.confinement, self.policy.parallel,
                                                      self.policy.allow_unconfined)
            for index, source in list(self.good):
                try:
                    self.sandbox.request("exec", source, f"<cell {index}>")
                except SandboxDied as stopped:     # it ran the first time, not on replay: leave it out too
                    self.good.remove((index, source))
                    self._skip(index, str(stopped))
                    break
                except Exception:                  # noqa: BLE001 (its error was recorded the first time)
                    pass
        return self.sandbox

    def _stop(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def _program_cell(self, index: int, source: str) -> None:
        self.names = None
        sandbox = self._ensure_sandbox()
        try:
            answer = sandbox.raw_request("exec", source, f"<cell {index}>")
        except SandboxDied as stopped:
            return self._skip(index, str(stopped))
        if answer.get("tampered"):
            return self._skip(index, _tampering(answer["tampered"]))
        if "raised" in answer:                     # the learner's own error, shown in feedback
            raised = answer["raised"]
            self.cell_errors[index] = error_output(raised["type"], raised["message"])
            if is_answer_cell(self.nb.cells[index]):
                grade_id = nbgrader_meta(self.nb.cells[index]).get("grade_id", "")
                self.failed_answers[grade_id] = f"{raised['type']}: {raised['message']}"
        self.good.append((index, source))

    def _skip(self, index: int, why: str) -> None:
        """Leave this cell out from now on: restart the sandbox and replay the cells before it."""
        self.cell_errors[index] = error_output("SubmissionStopped", f"this cell was stopped: {why}")
        if is_answer_cell(self.nb.cells[index]):
            self.stopped[nbgrader_meta(self.nb.cells[index]).get("grade_id", "")] = why
        self._stop()

    def _test(self, cell) -> Verdict:
        grade_id = nbgrader_meta(cell).get("grade_id", "")
        exercise = exercise_of(grade_id, self.answer_names)
        outside = judged_outside(cell.source)
        stdout, error = "", None
        try:
            sandbox = self._ensure_sandbox()
            sandbox.deadline = time.monotonic() + self.cell_seconds
            sandbox.tampered.clear()
            if outside:
                stdout, error = self._test_outside(cell.source, sandbox, grade_id)
                sandbox.raw_request("integrity")
            else:
                answer = sandbox.raw_request("check", cell.source, f"<test {grade_id}>")
                stdout = answer.get("stdout", "")
                if "raised" in answer:
                    error = error_output(answer["raised"]["type"], answer["raised"]["message"])
            if sandbox.tampered:     # during any call, probe or the check itself
                # Zero for this test, and a clean sandbox for the next: what it patched is gone with it.
                error = error_output("SubmissionStopped", f"checking `{exercise}` was stopped: "
                                                    f"{_tampering(sandbox.tampered)}")
                self._stop()
        except SandboxDied as stopped:
            error = error_output("SubmissionStopped", f"checking `{exercise}` was stopped: {stopped}")
            self._stop()
        finally:
            if self.sandbox is not None:
                self.sandbox.deadline = None
        if error and exercise in self.stopped:
            error = error_output("SubmissionStopped", f"the answer cell for `{exercise}` was stopped: {self.stopped[exercise]}")
        elif error and error["ename"] == "NameError" and exercise in self.failed_answers:
            error = error_output(error["ename"], f"`{exercise}` is not defined because its answer cell raised "
                                           f"{self.failed_answers[exercise]}")
        message = failure_message({"outputs": [error]}, exercise, self.answer_names) if error else ""
        if error and error["ename"] in ("NameError", "NotImplementedError"):
            error = error_output(error["ename"], message)    # the explanation, not Python's bare words
        return Verdict(grade_id, error is None, message, stdout, error, outside)

    def _test_outside(self, source: str, sandbox: Sandbox, grade_id: str) -> tuple[str, dict | None]:
        out = io.StringIO()
        namespace = {"__builtins__": builtins, "__name__": "__judge__"}
        try:
            # Warnings are ignored, as in the learner's kernel, unless a check records them.
            with contextlib.redirect_stdout(out), sandbox.judge_files_here(), warnings.catch_warnings(), \
                    _time_limit(self.cell_seconds * 2):
                warnings.simplefilter("ignore")
                if self.names is None or self.names.sandbox is not sandbox:
                    self.names = SubmissionNames(sandbox)
                exec(compile(source, f"<test {grade_id}>", "exec"), namespace, self.names)
        except SandboxDied:
            raise
        except MemoryError:
            raise SandboxDied(f"what it returned would not fit in the grader's memory (over "
                              f"{GRADER_MEMORY_BYTES >> 30} GiB)") from None
        except Exception as exc:
            return out.getvalue(), error_output(type(exc).__name__, str(exc))
        return out.getvalue(), None


# The grading process takes the submission's replies, files and values apart: however large they claim to
# be, it may grow by this much at most while it judges one notebook (a MemoryError costs that test only).
GRADER_MEMORY_BYTES = 4 << 30


@contextlib.contextmanager
def bounded_memory():
    """An address-space limit of the grading process's current size plus ``GRADER_MEMORY_BYTES``, lifted
    afterwards; a lower limit set by whoever started the grader is kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:
        yield
        return
    limit = size + GRADER_MEMORY_BYTES
    if soft != resource.RLIM_INFINITY and soft <= limit or hard != resource.RLIM_INFINITY and hard < limit:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


NOT_GRADABLE = "NotGradable"     # the error of every test cell of a submission that could not be judged at all


class _CheckTookTooLong(SandboxDied):
    def __init__(self, message: str = "checking it took the grader too long: what it returned is far too large "
                                      "to check"):
        super().__init__(message)


@contextlib.contextmanager
def _time_limit(seconds: float):
    """A check's own work in the grading process is bounded too (a length, a range it loops over...):
    past ``seconds`` the test ends as a stopped one. In the main thread SIGALRM stops it; in another (a Dask
    worker judges in one) a timer raises the same exception in the judging thread."""
    if threading.current_thread() is not threading.main_thread():
        with _time_limit_in_a_thread(seconds):
            yield
        return

    def stop(signum, frame):
        raise _CheckTookTooLong(f"checking it took the grader over {seconds:g} s: what it returned is far too "
                                f"large to check")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _time_limit_in_a_thread(seconds: float):
    """``_time_limit`` off the main thread: the exception is raised asynchronously in this thread (it lands
    at the next Python instruction), and one still pending when the block ends is withdrawn."""
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    target, lock, state = ctypes.c_ulong(threading.get_ident()), threading.Lock(), {"active": True, "fired": False}

    def stop():
        with lock:
            if state["active"]:
                state["fired"] = True
                set_async_exc(target, ctypes.py_object(_CheckTookTooLong))

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["active"] = False
            if state["fired"]:
                set_async_exc(target, None)


def judge_notebook(nb, cell_seconds: float = DEFAULT_CELL_TIMEOUT, limits: Limits = Limits(),
                   policy: Policy = Policy()) -> Judgement:
    return Judge(nb, cell_seconds, limits, policy).run()


def apply_judgement(nb, judgement: Judgement) -> None:
    """Write the verdicts into the notebook's test cells as the outputs nbgrader scores."""
    verdicts = iter(judgement.verdicts)
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        if is_test_cell(cell):
            verdict = next(verdicts)
            outputs = [{"output_type": "stream", "name": "stdout", "text": verdict.stdout}] if verdict.stdout else []
            cell.outputs = [nbformat.from_dict(o) for o in outputs + ([verdict.error] if verdict.error else [])]
        elif index in judgement.cell_errors:
            cell.outputs = [nbformat.from_dict(judgement.cell_errors[index])]
        else:
            cell.outputs = []
        cell.execution_count = None
