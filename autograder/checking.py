"""What every check shares: a quiet run, a failure that names the trap, a pass line.

nbgrader scores a test cell zero if it writes anything to stderr, so checks run
the learner's code with warnings and stray stderr swallowed, and end by printing
one line to stdout (never by returning a number, which nbgrader would take as a
partial score).
"""

from __future__ import annotations

import contextlib
import functools
import io
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
        f"but it is {type(obj).__name__}.",
    )


def graded_check(what: str) -> Callable:
    """Turn a function that raises on failure into a check for a test cell.

    The wrapped check runs quietly, prints ``✓ <what>`` when it passes and returns
    None, so the cell's last line never becomes nbgrader's partial score.
    """

    def decorate(check: Callable) -> Callable:
        @functools.wraps(check)
        def run(*args, **kwargs) -> None:
            with quiet():
                check(*args, **kwargs)
            print(f"✓ {what}")

        return run

    return decorate


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two same-shaped tensors, as a float."""
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
