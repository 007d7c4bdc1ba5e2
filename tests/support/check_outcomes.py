"""Run a check on an implementation and report pass or the failure message."""

import contextlib
import io


def failure_of(check, implementation, *others, **kwargs):
    """None when the check passes, else its AssertionError message. Other errors propagate."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check(implementation, *others, **kwargs)
    except AssertionError as exc:
        return str(exc) or "(empty message)"
    return None


def failing_checks(module, check_names, implementation, **kwargs):
    """The subset of ``check_names`` that fail on ``implementation``."""
    return {name for name in check_names if failure_of(getattr(module, name), implementation, **kwargs)}
