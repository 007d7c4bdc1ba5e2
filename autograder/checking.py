"""What every check shares: a quiet run, a failure that names the trap, a pass line.

nbgrader scores a test cell zero if it writes anything to stderr, so checks run
the learner's code with warnings and stray stderr swallowed, and end by printing
one line to stdout (never by returning a number, which nbgrader would take as a
partial score).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import traceback
import warnings
from typing import Any, Callable


@contextlib.contextmanager
def quiet():
    """Silence Python warnings and stderr writes for the duration of a check."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()):
            yield


def expect(condition: Any, message: str) -> None:
    """Fail the check with a message that names the trap when ``condition`` is false."""
    if not condition:
        raise AssertionError(message)


def require_callable(obj: Any, name: str) -> None:
    expect(
        callable(obj),
        f"`{name}` should be a function (or class) you define in the answer cell, "
        f"but it is {type_name(obj)}.",
    )


def type_name(value: Any) -> str:
    """The name of a value's type, also for a proxy of a value that stays in the sandbox."""
    remote = getattr(type(value), "_remote_type_name", None)
    return remote(value) if remote else type(value).__name__


def graded_check(what: str) -> Callable:
    """Turn a function that raises on failure into a check for a test cell.

    The check's leading parameters without a default are the learner's names (``restore_state``, then a
    ``save_checkpoint`` it needs): each must be callable, or the check fails saying so. The wrapped check
    runs quietly, prints ``✓ <what>`` when it passes and returns None, so the cell's last line never
    becomes nbgrader's partial score.
    """

    def decorate(check: Callable) -> Callable:
        learner_names = []
        for parameter in inspect.signature(check).parameters.values():
            if parameter.default is not parameter.empty or parameter.kind is not parameter.POSITIONAL_OR_KEYWORD:
                break
            learner_names.append(parameter.name)

        @functools.wraps(check)
        def run(*args, **kwargs) -> None:
            try:
                with quiet():
                    for name, value in zip(learner_names, args):
                        require_callable(value, name)
                    check(*args, **kwargs)
            except Exception as exc:
                _show_briefly(exc, learner_names[0] if learner_names else "the answer")
                raise
            print(f"✓ {what}")

        return run

    return decorate


def _show_briefly(exc: BaseException, answer: str) -> None:
    """How a failing check looks in the learner's notebook: the trap's message, and the frames of the
    learner's own code an exception came through, not a traceback through the checks' frames. IPython
    shows an exception that has ``_render_traceback_`` as the lines it returns; the cell still ends in
    the same error (same type and message), so nbgrader scores it as before. An error that did not pass
    through the learner's code, nor is a check's verdict, keeps its full traceback: it is a bug to report."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _in_a_notebook_cell(f.filename)]
    if isinstance(exc, NotImplementedError) and not isinstance(exc, AssertionError):
        where = frames[-1].name if frames else answer
        lines = [f"{_RED}NotImplementedError{_RESET}: `{where}` is not answered yet: its answer cell still "
                 f"raises NotImplementedError. Write your answer there, run that cell, then this one."]
    elif isinstance(exc, AssertionError) or frames:
        shown = [f"  in your code, line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames]
        lines = [*shown, f"{_RED}{type(exc).__name__}{_RESET}: {exc}"]
    else:
        return
    try:
        exc._render_traceback_ = lambda: lines
    except AttributeError:   # an exception type without instance attributes keeps its traceback
        pass


_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


def _in_a_notebook_cell(filename: str) -> bool:
    return "ipykernel_" in filename or filename.startswith("<ipython-input")


def observe(probe: Callable, *args, **kwargs):
    """Run ``probe(*args, **kwargs)`` where the learner's code lives, and return what it saw.

    A probe (a ``probe_...`` function of a check module) exercises the learner's objects where
    they must be exercised (live tensors, DataLoader workers, a process killed mid-write) and
    returns plain data; the check then judges that data. In the learner's kernel the probe runs
    right here. In graded mode the learner's names are proxies for a sandbox: the probe runs
    there, the sandbox's untouched copy of it, and the check judges what comes back in the
    grading process, against references computed there.
    """
    from autograder.grading.sandbox import RemoteObject   # only graded mode has proxies; imported late
    remote = [v for v in (*args, *kwargs.values()) if isinstance(v, RemoteObject)]
    if not remote:
        return probe(*args, **kwargs)
    return remote[0]._sandbox.probe(probe, args, kwargs)


class Remembered:
    """The last few outcomes of an experiment that several checks read, by key.

    A failed experiment is kept as the AssertionError it raised, raised again for every check that
    reads it. Keys hold the answers themselves, so a redefined answer runs afresh (in graded mode,
    the proxies the judge keeps from one test cell to the next until a program cell runs).
    """

    def __init__(self, keep: int):
        self.keep, self._outcomes = keep, {}

    def __call__(self, key: tuple, run: Callable[[], Any]):
        if key not in self._outcomes:
            try:
                outcome = run()
            except AssertionError as failure:
                outcome = failure
            self._outcomes[key] = outcome
            while len(self._outcomes) > self.keep:
                del self._outcomes[next(iter(self._outcomes))]
        outcome = self._outcomes[key]
        if isinstance(outcome, AssertionError):
            raise AssertionError(str(outcome))
        return outcome

    def clear(self) -> None:
        self._outcomes.clear()


def load_written(path):
    """``torch.load(path, weights_only=True)`` of a file the learner's code wrote, bounded in memory, and
    as a process that allowlisted nothing loads it (a learner's kernel may hold an allowlist; the process
    that resumes after a crash, and the grader, hold none).

    torch.save writes a zip archive of *stored* records. torch.load also inflates compressed ones, so
    a few KiB could unpack into gigabytes in the grading process: such a file, or one whose records
    claim more bytes than it holds, is refused before torch.load sees it. Legacy (non-zip) files can
    only fill a storage from the bytes they hold.
    """
    import zipfile

    import torch
    size = os.path.getsize(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
        packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
        if packed or len(records) > 100_000 or sum(r.file_size for r in records) > size:
            raise RuntimeError(f"refused to load {os.path.basename(path)!r}: its zip records are compressed "
                               f"or claim more bytes than the file holds; torch.save never writes such a file")
    from .helpers import nothing_allowlisted
    with nothing_allowlisted():     # as the process that resumes after a crash: it allowlisted nothing
        return torch.load(path, weights_only=True)


def placed_path(returned, folder: str) -> tuple[str, str]:
    """Where a path the learner's code returned points, judged as text and never looked up: ("not a path",
    type name) for neither a str nor an os.PathLike of one, ("relative", it) for a relative path (never
    resolved against this process's working folder: in the grader, the course folder), ("inside", it
    relative to ``folder``) for an absolute path inside ``folder`` (spelled as given or resolved), and
    ("outside", it) for any other absolute path. So a verdict made from it says nothing about what exists
    anywhere else."""
    try:
        given = os.fspath(returned)
    except TypeError:
        return "not a path", type_name(returned)
    if not isinstance(given, str):
        return "not a path", type_name(given)
    if not os.path.isabs(given):
        return "relative", given
    path = os.path.normpath(given)
    for root in dict.fromkeys((os.path.normpath(folder), os.path.realpath(folder))):
        if os.path.commonpath([root, path]) == root:
            return "inside", os.path.relpath(path, root)
    return "outside", given


def returned_path(returned, expected: str, folder: str) -> tuple[str, str]:
    """How a path the learner's code returned compares with ``expected``, a file in the check's own
    ``folder``: judged as text (``placed_path``), and looked up on disk only inside ``folder``. Returns
    (verdict, shown):

    * ("same", name): it is ``expected`` (lexically, or the same file inside ``folder``);
    * ("name", shown): a relative path that is ``expected``'s file name: the name, not the path;
    * ("relative", shown): another relative path;
    * ("inside", name): an absolute path to another entry of ``folder``, named relative to it;
    * ("outside", shown): an absolute path outside ``folder``;
    * ("not a path", type name): neither a str nor an os.PathLike of one.
    """
    verdict, shown = placed_path(returned, folder)
    if verdict == "relative" and os.path.normpath(shown) == os.path.basename(expected):
        return "name", shown
    if verdict != "inside":
        return verdict, shown
    if shown == os.path.relpath(os.path.normpath(expected), os.path.normpath(folder)):
        return "same", shown
    try:
        same = os.path.samefile(os.fspath(returned), expected)      # a link inside the folder, say
    except (OSError, ValueError):
        same = False
    return ("same" if same else "inside"), shown


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.contextmanager
def failing_if_raised(call: str):
    """Learner code run inside fails the check if it raises, with a message naming ``call``
    (``Ledger(2, 16, 8) raised ValueError: ...``). NotImplementedError goes through as it is: the exercise
    is not answered yet, and the runner says so."""
    try:
        yield
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"{call} raised {error_text(exc)}") from None


def silence_this_process() -> None:
    """In a forked child: its output goes nowhere. It shares the parent's stdout and stderr (a notebook's
    kernel pipes, too), and nbgrader scores any stderr in a test cell as zero. Nothing it logs is handled
    either: a handler's stream may be locked by a thread of the parent that was writing when the fork came
    (torch.distributed.checkpoint logs from an async save's thread), and the child would wait for it forever."""
    import logging
    import sys
    logging.disable(logging.CRITICAL)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two same-shaped tensors, as a float."""
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def first_difference(a, b) -> int | None:
    """The first index at which two sequences differ (the shorter one's length where one is a prefix of the
    other), or None where they are equal: where a message points."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if at == len(a) == len(b) else at
