"""No callable the learner's kernel can import from the package answers an exercise (issue 27).

For every exercise of every notebook (the answers its test cells' calls name, read from ``solutions/``),
each function, class and method found in any module of the installed ``autograder`` package, private
names included, whose signature takes the exercise's call is tried as the learner's answer, through
every check call (visible and hidden) of that exercise's test cells; none may pass them all. Other
learner names a call needs (the resume of a save) are the fixtures' first right answers, so a package
save that would pair with a right resume counts as an answer too.

By default a candidate must also look like the contract (a parameter of the same name, a word of the
exercise's name in its own); WORKBOOK_FULL_ANSWER_SCAN=1 drops that filter. Each candidate runs in a
forked child (the package holds machinery that ends or blocks the process it runs in), and first takes
the call the first check makes of a right answer: most fail there, before any check's set-up.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import io
import os
import pickle
import pkgutil
import re
import select
import signal
import time

import pytest
import torch

import autograder
from autograder.course import NOTEBOOKS
from check_outcomes import failure_of
from notebook_checks import _first_right, check_calls, checks_module

NUMBERS = [n.number for n in NOTEBOOKS]
EXERCISES = [(key, exercise) for key in NUMBERS
             for exercise in dict.fromkeys(c.exercise for c in check_calls(key))]

# The tooling: console commands, the trusted-grading engine and the platforms' adapters compute nothing
# of training, and called with an exercise's arguments they build wheels and start servers. The graded
# checks (check_*) only judge and return nothing. Everything else of the package is tried.
_TOOLING = ("autograder.commands", "autograder.grading", "autograder.platforms")


def _package_modules():
    modules = [autograder]
    for info in pkgutil.walk_packages(autograder.__path__, "autograder."):
        if not info.name.endswith("__main__") and not info.name.startswith(_TOOLING):
            modules.append(importlib.import_module(info.name))
    return modules


def _candidates() -> list:
    """Every function and class defined in the package, with the static and class methods of its classes,
    once each. (A plain method needs an instance first: a class whose instance answers is tried as the
    class, where the exercise is one, and a method of another is no drop-in answer.)"""
    seen, found = set(), []

    def add(obj):
        if id(obj) not in seen and callable(obj):
            seen.add(id(obj))
            found.append(obj)

    for module in _package_modules():
        for name, obj in inspect.getmembers(module):
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or name.startswith("check_"):
                continue
            if not getattr(obj, "__module__", "").startswith("autograder") or obj.__module__.startswith(_TOOLING):
                continue
            add(obj)
            if inspect.isclass(obj):
                for name, member in vars(obj).items():
                    if isinstance(member, (staticmethod, classmethod)):
                        add(getattr(obj, name))
    return found


CANDIDATES = _candidates()


def _required_positional(obj) -> int:
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(obj):
        params = params[1:]      # self
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty)


def _takes(candidate, arity: int, as_class: bool) -> bool:
    """Whether a call as the exercise's (its required arguments, positionally) binds, to a callable that
    asks for no more: one that needs other arguments too is no drop-in answer."""
    if inspect.isclass(candidate) != as_class:
        return False
    try:
        inspect.signature(candidate).bind(*range(arity))
        return _required_positional(candidate) == arity
    except (TypeError, ValueError):
        return False


class _Recorded(BaseException):
    """Ends a check at its first call of the answer, with that call's arguments."""


@functools.cache
def _first_call(key: str, exercise: str):
    """(args, kwargs) of the first call the exercise's first check makes of a right answer, or None where
    the check makes it elsewhere (a fresh process, a rank), the arguments do not pickle, or the answer is a
    class. Recorded in a child: a check stopped half-way (its DataLoader workers, its servers) must leave
    nothing in this process, which forks every candidate's child."""
    if inspect.isclass(_first_right(key, exercise)):
        return None

    def record() -> bytes:
        here = os.getpid()

        def recorder(*args, **kwargs):
            if os.getpid() != here:      # called in a process the check forked: nothing recorded
                os._exit(1)
            raise _Recorded(args, kwargs)

        call = next(c for c in check_calls(key) if c.exercise == exercise)
        names = {n: recorder if n == exercise else _first_right(key, n) for n in call.learner_names}
        try:
            getattr(checks_module(key), call.check)(*(names[n] for n in call.learner_names), **call.arguments)
        except _Recorded as recorded:
            return pickle.dumps(recorded.args)
        return b""

    said = _in_child(record, timeout=15)
    with contextlib.suppress(Exception):
        return pickle.loads(said) if said else None
    return None


def _takes_the_call(right, first) -> bool:
    """Whether a right answer takes the recorded call, replayed on copies of its arguments (a folder the
    check made may be gone by now): only then does a candidate that raises on it answer nothing."""
    try:
        args, kwargs = copy.deepcopy(first)
        with contextlib.redirect_stdout(io.StringIO()):
            right(*args, **kwargs)
    except Exception:
        return False
    return True


def _answers(key: str, exercise: str, candidate) -> bool:
    """Whether ``candidate`` passes every check call of the exercise's test cells. Where the first check's
    first call of the answer is known, the candidate takes that call first: one that raises there (most
    of the package, given another function's arguments) is done without a check's set-up."""
    module, calls = checks_module(key), [c for c in check_calls(key) if c.exercise == exercise]
    first = _first_call(key, exercise)
    if first is not None and _takes_the_call(_first_right(key, exercise), first):   # replayed, it still works
        try:
            candidate(*first[0], **first[1])
        except Exception:
            return False
    names = {}
    for call in calls:
        for name in call.learner_names:
            names.setdefault(name, candidate if name == exercise else _first_right(key, name))
    for call in calls:
        try:
            if failure_of(getattr(module, call.check), *(names[n] for n in call.learner_names),
                          **call.arguments) is not None:
                return False
        except Exception:       # a check that errors on it is a check it does not pass
            return False
    return True


def _become_subreaper() -> None:
    """What the candidate starts and leaves (a server in a session of its own) comes back to this child
    as its parent, to be ended with it, not to init (PR_SET_CHILD_SUBREAPER, Linux)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def _end_descendants(me: int) -> None:
    for _ in range(20):
        children = []
        with contextlib.suppress(OSError):
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    with contextlib.suppress(OSError, IndexError, ValueError):
                        with open(f"/proc/{entry}/stat") as stat:
                            if int(stat.read().rsplit(")", 1)[1].split()[1]) == me:
                                children.append(int(entry))
        if not children:
            return
        for child in children:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(OSError):
                os.waitpid(child, 0)


def _in_child(work, timeout: float) -> bytes:
    """What ``work()`` returns, run in a forked child of its own process group, its output to /dev/null;
    b"" where it raised, ended the process or took longer than ``timeout`` seconds. What it started is
    ended with it. The reply goes length first: a process the work left may hold the pipe open."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        me = os.getpid()
        try:
            os.setpgid(0, 0)
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            _become_subreaper()
            # A fork of a process whose OpenMP pool has run (an earlier test's training) hangs in its first
            # parallel region (libgomp is not fork-safe): one thread here, as DataLoader workers do.
            torch.set_num_threads(1)
            reply = work()
            if os.getpid() == me:        # not a process the work forked, come back here
                reply = len(reply).to_bytes(8, "big") + reply
                while reply:
                    reply = reply[os.write(write_end, reply):]
        finally:
            if os.getpid() == me:
                _end_descendants(me)
            os._exit(0)
    os.close(write_end)
    said, deadline = b"", time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([read_end], [], [], left)[0]:
            chunk = os.read(read_end, 1 << 20)
            said += chunk
            if not chunk or (len(said) >= 8 and len(said) >= 8 + int.from_bytes(said[:8], "big")):
                break
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    complete = len(said) >= 8 and len(said) == 8 + int.from_bytes(said[:8], "big")
    return said[8:] if complete else b""


CONTROL_TIMEOUT = 300.0     # a right answer's checks: long enough for any machine, however loaded


def _answers_apart(key: str, exercise: str, candidate, timeout: float) -> bool:
    """``_answers`` in a child: a candidate that is machinery (a namespace's init, a server's loop) may end,
    silence or block the process it is called in; such a one answers nothing."""
    return _in_child(lambda: b"1" if _answers(key, exercise, candidate) else b"0", timeout) == b"1"


# By default the candidates that look like the exercise's contract: a parameter of the same name, or a word of
# the exercise's name in theirs (samples_per_update ~ _per_update, epoch_order ~ sampler_order). That is a
# few hundred forks for the whole course. WORKBOOK_FULL_ANSWER_SCAN=1 tries every candidate whose signature
# takes the call (some 2,000 forks, minutes): run it when the package gains modules.
FULL_SCAN = os.environ.get("WORKBOOK_FULL_ANSWER_SCAN") == "1"


def _parameter_names(obj) -> set[str]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return {p for p in inspect.signature(target).parameters if p not in ("self", "cls")}
    except (TypeError, ValueError):
        return set()


def _words(name: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name) if len(w) > 2}


def _looks_like(candidate, right, exercise: str) -> bool:
    return FULL_SCAN or bool(_parameter_names(candidate) & _parameter_names(right)) or bool(
        _words(getattr(candidate, "__name__", "")) & _words(exercise))


@pytest.mark.parametrize("key, exercise", EXERCISES, ids=[f"{k}-{e}" for k, e in EXERCISES])
def test_no_callable_of_the_package_answers_the_exercise(key, exercise):
    right = _first_right(key, exercise)
    arity, as_class = _required_positional(right), inspect.isclass(right)
    _first_call(key, exercise)       # recorded here, once, not in each child
    # The control: tried the same way, a right answer answers. Otherwise a harness that cannot see an answer
    # here (a child that hangs, a check that cannot finish) passes every candidate. Its time, measured on this
    # machine as loaded as it is now, sets each candidate's: one that delegates to a working answer runs the
    # same checks in about the same time, so four times as long (8 s at least) sees it on a busy machine too.
    started = time.monotonic()
    assert _answers_apart(key, exercise, right, timeout=CONTROL_TIMEOUT), \
        f"{key} {exercise}: the search does not see even a right answer"
    timeout = max(8.0, 4 * (time.monotonic() - started))
    tried = [c for c in CANDIDATES if _takes(c, arity, as_class) and _looks_like(c, right, exercise)]
    answering = [f"{getattr(c, '__module__', '?')}.{getattr(c, '__qualname__', c)}"
                 for c in tried if _answers_apart(key, exercise, c, timeout)]
    assert answering == [], f"{key} {exercise}: answered by {answering}"


def test_the_search_sees_the_package():
    """The candidates include what the issue named (moved or not), so an empty result means something."""
    names = {getattr(c, "__qualname__", "") for c in CANDIDATES}
    assert {"make_checkpoint", "Notebook", "run_in_fresh_process"} <= names
    assert len(CANDIDATES) > 200


def test_the_search_tells_an_answer_from_another_exercises():
    """The harness itself (each exercise's test tries its right answer first): the right answer to another
    exercise, tried as a candidate is, answers nothing here."""
    assert not _answers_apart("06", "samples_per_update", _first_right("06", "window_digest"),
                               CONTROL_TIMEOUT)


# ---- wrapped forms: what an importable reference gives when adapted to the exercise's contract -----------

def _reference_adam_step(w, g, state, **hp):
    """notebook 02's adam_step, adapted from the checks' torch.optim.Adam reference: it starts only at the
    seed's problem with a fresh state, so the adaptation can take neither these weights nor this state."""
    from autograder.adam_resume.problem import _TorchReference
    reference = _TorchReference(0, hp)
    w = reference.advance(1, g)
    state.update(reference.state)
    return w


def _reference_train_n_steps(w, state, n, grad_fn, **hp):
    from autograder.adam_resume.problem import _TorchReference
    reference = _TorchReference(0, hp)
    w = reference.advance(n)
    state.update(reference.state)
    return w


@pytest.mark.parametrize("exercise, wrapper", [("adam_step", _reference_adam_step),
                                               ("train_n_steps", _reference_train_n_steps)])
def test_the_adam_reference_wrapped_answers_nothing(exercise, wrapper):
    assert _answers_apart("02", exercise, _first_right("02", exercise), CONTROL_TIMEOUT), \
        "the search does not see a right answer"
    assert not _answers_apart("02", exercise, wrapper, CONTROL_TIMEOUT)


def test_no_torch_adam_to_wrap_is_left():
    """The checks' reference once took any (w, state) and stepped it: a thin wrapper answered adam_step."""
    import autograder.adam_resume as module
    from autograder.adam_resume.problem import _TorchReference
    assert not hasattr(module, "TorchAdam")
    assert list(inspect.signature(_TorchReference).parameters) == ["seed", "hp"]


# ---- near-answers: what a learner completes rather than calls (issue 38, item 5) -------------------------

def _methods(cls) -> set[str]:
    """The non-dunder methods a class defines (its own and its package bases'), names without leading
    underscores: a private `_on_sigterm` is the same contract as `on_sigterm` to a learner who subclasses."""
    names = set()
    for klass in cls.__mro__:
        if klass is not cls and not getattr(klass, "__module__", "").startswith("autograder"):
            continue
        names |= {n.lstrip("_") for n, v in vars(klass).items()
                  if callable(v) and not (n.startswith("__") and n.endswith("__"))}
    return names


def _twins(right) -> list[str]:
    """The package's classes that take the exercise's constructor call and define every method of its
    contract: a subclass that fills in one body (09's flag read at the commit, without the all-reduce
    that makes every rank agree) is the exercise done."""
    contract = _methods(right)
    arity = _required_positional(right)
    return [f"{c.__module__}.{c.__qualname__}" for c in CANDIDATES
            if inspect.isclass(c) and contract and contract <= _methods(c) and _takes(c, arity, True)]


CLASS_EXERCISES = [(key, exercise) for key, exercise in EXERCISES if inspect.isclass(_first_right(key, exercise))]


@pytest.mark.parametrize("key, exercise", CLASS_EXERCISES, ids=[f"{k}-{e}" for k, e in CLASS_EXERCISES])
def test_no_class_of_the_package_is_a_twin_of_the_exercise(key, exercise):
    assert _twins(_first_right(key, exercise)) == [], f"{key} {exercise}: a subclass away"


def test_the_twin_scan_sees_a_guard_without_its_all_reduce():
    """The control: the demo's old half-cure (a flag read at the commit, each rank its own) is a twin."""
    class StopsOnItsOwnFlag:
        __module__ = "autograder.demos.sharded_demo"

        def __init__(self, save):
            self.save, self.requested = save, False

        def _on_sigterm(self, signum, frame):
            self.requested = True

        def at_commit(self):
            return self.requested

    right = _first_right("09", "PreemptionGuard")
    assert _methods(right) == {"on_sigterm", "at_commit"}
    assert _methods(StopsOnItsOwnFlag) >= _methods(right) and _takes(StopsOnItsOwnFlag, 1, True)


def _positions_resume_plan(rank_positions):
    """notebook 09's resume_plan, wrapped around a function that gives a rank's positions of one global batch
    (cursor, global_batch, world_size, rank): the demo once held one."""
    def resume_plan(saved, new_world_size, steps):
        cursor, batch = sum(saved["samples_seen"]), saved["global_batch"]
        return [[list(rank_positions(cursor + u * batch, batch, new_world_size, r)) for u in range(steps)]
                for r in range(new_world_size)]
    return resume_plan


def _demo_layout_resume_plan(saved, new_world_size, steps):
    """The same plan from what the demo holds now: the job's own state gives its batch's dataset indices,
    at the demo's global batch."""
    from autograder.demos.sharded_demo import Training
    run = Training(model=None, optimizer=None)

    def rank_positions(cursor, global_batch, world_size, rank):
        run.cursor = cursor
        return run.batch_indices(world_size, rank)
    return _positions_resume_plan(rank_positions)(saved, new_world_size, steps)


def test_no_function_of_the_package_wrapped_as_a_ranks_share_answers_resume_plan():
    """09's exercise 3 is one line around a rank's share of a global batch: no function of the package taking
    (cursor, global_batch, world_size, rank) may give it, and the demo's layout, adapted, gives none either."""
    started = time.monotonic()
    control = _positions_resume_plan(lambda cursor, batch, world, rank: range(cursor + rank, cursor + batch, world))
    assert _answers_apart("09", "resume_plan", control, CONTROL_TIMEOUT), "the wrapped form is not seen"
    timeout = max(8.0, 4 * (time.monotonic() - started))
    tried = [c for c in CANDIDATES if _takes(c, 4, False)]
    answering = [f"{c.__module__}.{c.__qualname__}" for c in tried
                 if _answers_apart("09", "resume_plan", _positions_resume_plan(c), timeout)]
    assert tried and answering == []
    assert not _answers_apart("09", "resume_plan", _demo_layout_resume_plan, timeout)
