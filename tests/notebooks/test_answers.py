"""Every notebook's fixture answers through every check call of its test cells, as the notebook makes them.

The calls (visible and hidden) are read from the solution notebooks, never copied here: a right answer
must pass all of its exercises' calls, and each plausible wrong answer must lose exactly the checks its
fixture table names, with messages that say what the table says they say (the trap, and its evidence). Which checks an exercise has follows the grading contract (``test_<name>[_aspect]``).
"""

import inspect

import pytest

from autograder.course import NOTEBOOKS, SOLUTIONS_DIR
from notebook_checks import (check_calls, checks_module, checks_of, exercises_of, fixtures_of, label, lost_checks,
                             phrases, right_answers, wrong_answers)

NUMBERS = [n.number for n in NOTEBOOKS]
RIGHT = [(key, answer) for key in NUMBERS for answer in right_answers(key)]
WRONG = [(key, answer, expected) for key in NUMBERS for answer, expected in wrong_answers(key)]


@pytest.mark.parametrize("key, answer", RIGHT, ids=[f"{k}-{label(a)}" for k, a in RIGHT])
def test_a_right_answer_passes_every_check(key, answer):
    assert lost_checks(key, answer) == {}


@pytest.mark.parametrize("key, answer, expected", WRONG, ids=[f"{k}-{label(a)}" for k, a, _ in WRONG])
def test_a_wrong_answer_loses_exactly_its_checks_each_naming_its_trap(key, answer, expected):
    lost = lost_checks(key, answer, expected)
    assert set(lost) == set(expected), lost
    for check, said in phrases(expected).items():
        assert all(phrase in lost[check] for phrase in said), (check, said, lost[check])


def test_every_solution_folder_has_a_registry_entry_and_every_entry_a_folder():
    folders = sorted(p.name for p in SOLUTIONS_DIR.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert folders == [n.folder for n in NOTEBOOKS]
    for notebook in NOTEBOOKS:
        assert notebook.source().exists(), notebook.folder


@pytest.mark.parametrize("key", NUMBERS)
def test_every_check_is_called_by_a_test_cell_and_every_exercise_has_right_answers(key):
    """A check function no test cell calls is dead; a test cell's call that no fixture goes through is
    untested (and would be absent from the judge's faithfulness test too)."""
    module = checks_module(key).__name__        # a package's checks live in its modules (course.check_modules)
    defined = {name for name, f in inspect.getmembers(checks_module(key), inspect.isfunction)
               if name.startswith("check_") and (f.__module__ == module or f.__module__.startswith(module + "."))}
    assert defined == set(checks_of(key))
    exercised = set()
    for answer in right_answers(key):
        exercised |= exercises_of(key, answer)
    assert {call.exercise for call in check_calls(key)} <= exercised


@pytest.mark.parametrize("key", NUMBERS)
def test_each_wrong_answer_names_checks_of_its_notebook(key):
    known = set(checks_of(key))
    for answer, expected in fixtures_of(key).WRONG.items():
        assert expected and set(expected) <= known, (label(answer), set(expected) - known)
