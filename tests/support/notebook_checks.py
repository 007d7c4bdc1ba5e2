"""The check calls of the solution notebooks' test cells, and the fixture answers that go through them.

Nothing here is copied by hand from a notebook: each test cell's calls (visible and hidden) are read
from ``solutions/``, and which exercise a test cell grades follows the grading contract
(``contract.exercise_of``). Every notebook's fixture module (``fixtures.<checks>_impls``) has one shape:

    CORRECT = {exercise: [answer, ...]}      right answers, written differently from ours
    WRONG = {answer: {check, ...}}           a plausible wrong answer -> the checks it must lose, or
    WRONG = {answer: {check: phrases}}       ... with what each of their messages must say (its trap)

An answer is an implementation (a function or class named as the learner might), or, where the
notebook's exercises work together (a save and the resume that reads it), a tuple of
``(exercise, implementation)`` pairs. A learner name a check call needs that the answer does not give
(the ``save_checkpoint`` of a resume check) is taken from the first right answer of that exercise.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib

import nbformat

from autograder.contract import HIDDEN_BEGIN, exercise_of, is_answer_cell, is_test_cell, nbgrader_meta
from autograder.course import NOTEBOOKS, Notebook
from check_outcomes import failure_of


@dataclasses.dataclass(frozen=True)
class CheckCall:
    grade_id: str            # the test cell
    exercise: str            # the answer it grades
    check: str               # a function of the notebook's check module
    learner_names: tuple     # positional arguments: the answer first, then other learner names it needs
    kwargs: tuple            # keyword arguments (literals), as (name, value) pairs
    hidden: bool

    @property
    def arguments(self) -> dict:
        return dict(self.kwargs)

    def __str__(self) -> str:
        shown = ", ".join([*self.learner_names, *(f"{k}={v!r}" for k, v in self.kwargs)])
        return f"{self.grade_id}: {self.check}({shown})"


def notebook(key: str) -> Notebook:
    """A notebook of the registry by its number ("01") or folder name."""
    return next(n for n in NOTEBOOKS if key in (n.number, n.folder))


@functools.cache
def check_calls(key: str) -> tuple[CheckCall, ...]:
    nb_entry = notebook(key)
    nb = nbformat.read(str(nb_entry.source()), as_version=4)
    answers = {nbgrader_meta(c)["grade_id"] for c in nb.cells if is_answer_cell(c)}
    calls = []
    for cell in filter(is_test_cell, nb.cells):
        grade_id = nbgrader_meta(cell)["grade_id"]
        hidden_from = _line_of(cell.source, HIDDEN_BEGIN)
        tree = ast.parse(cell.source)
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == nb_entry.check_module for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
                names = [a.id for a in node.args if isinstance(a, ast.Name)]
                if len(names) != len(node.args) or not names:
                    raise ValueError(f"{nb_entry.folder} {grade_id}: a check takes learner names positionally")
                kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
                calls.append(CheckCall(grade_id, exercise_of(grade_id, answers), node.func.id, tuple(names),
                                       kwargs, hidden_from is not None and node.lineno > hidden_from))
    return tuple(calls)


def _line_of(source: str, marker: str) -> int | None:
    return next((i for i, line in enumerate(source.splitlines(), 1) if marker in line), None)


def checks_of(key: str, exercise: str | None = None) -> tuple[str, ...]:
    """The check functions a notebook's test cells call (for one exercise), in notebook order."""
    return tuple(dict.fromkeys(c.check for c in check_calls(key) if exercise in (None, c.exercise)))


def fixtures_of(key: str):
    return importlib.import_module(f"fixtures.{notebook(key).checks}_impls")


def checks_module(key: str):
    return importlib.import_module(notebook(key).check_module)


# ---- answers ---------------------------------------------------------------------------------------

def _pairs(answer) -> tuple:
    return answer if isinstance(answer, tuple) else ()


def exercises_of(key: str, answer, expected: set[str] = frozenset()) -> set[str]:
    """The exercises an answer answers: named in its pairs, or, for a lone wrong implementation, the one
    exercise whose test cells call the checks it must lose (or where it sits in CORRECT)."""
    if isinstance(answer, tuple):
        return {exercise for exercise, _ in answer}
    for exercise, right in fixtures_of(key).CORRECT.items():
        if any(answer is a for a in right):
            return {exercise}
    found = {c.exercise for c in check_calls(key) if c.check in expected}
    if len(found) != 1:
        raise ValueError(f"{getattr(answer, '__name__', answer)}: give the exercise it answers as a pair "
                         f"(its checks belong to {sorted(found) or 'no exercise'})")
    return found


def learner_names(key: str, answer, expected: set[str] = frozenset()) -> dict:
    """Every learner name the answer's check calls use -> an implementation: the answer's own, else the
    first right answer of that exercise."""
    own = dict(_pairs(answer)) or {exercises_of(key, answer, expected).pop(): answer}
    names = {}
    for call in calls_for(key, answer, expected):
        for name in call.learner_names:
            if name in own:
                names[name] = own[name]
            elif name not in names:
                names[name] = _first_right(key, name)
    return names


def _first_right(key: str, exercise: str):
    """The implementation the first right answer gives for ``exercise``."""
    for group, right in fixtures_of(key).CORRECT.items():
        for answer in right:
            given = dict(_pairs(answer)) or {group: answer}
            if exercise in given:
                return given[exercise]
    raise LookupError(f"no right answer in fixtures.{notebook(key).checks}_impls gives {exercise}")


def calls_for(key: str, answer, expected: set[str] = frozenset()) -> list[CheckCall]:
    exercises = exercises_of(key, answer, expected)
    return [c for c in check_calls(key) if c.exercise in exercises]


def label(answer) -> str:
    if isinstance(answer, tuple):
        return "+".join(impl.__name__ for _, impl in answer)
    return answer.__name__


def right_answers(key: str) -> list:
    return [answer for group in fixtures_of(key).CORRECT.values() for answer in group]


def wrong_answers(key: str) -> list[tuple]:
    return list(fixtures_of(key).WRONG.items())


def run_call(call: CheckCall, check, names: dict):
    """A check call as the test cell makes it, with ``names`` bound to the learner names: None when it
    passes, else its message."""
    return failure_of(check, *(names[n] for n in call.learner_names), **call.arguments)


def phrases(expected) -> dict[str, tuple[str, ...]]:
    """check -> what its message must say, from a WRONG entry (a set of checks says nothing of messages)."""
    if isinstance(expected, dict):
        return {check: (said,) if isinstance(said, str) else tuple(said) for check, said in expected.items()}
    return {check: () for check in expected}


def lost_checks(key: str, answer, expected: set[str] = frozenset()) -> dict[str, str]:
    """check name -> the message of its first failing call, over every call (visible and hidden) of the
    answer's exercises."""
    names, module, lost = learner_names(key, answer, expected), checks_module(key), {}
    for call in calls_for(key, answer, expected):
        if call.check not in lost:
            message = run_call(call, getattr(module, call.check), names)
            if message is not None:
                lost[call.check] = message
    return lost
