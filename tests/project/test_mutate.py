"""tools/mutate.py on a small, fast subset: the mutants it makes, its verdicts, and the equivalents file."""

import importlib.util
import sys
import tomllib

import pytest

from autograder.course import REPO_ROOT

spec = importlib.util.spec_from_file_location("mutate", REPO_ROOT / "tools" / "mutate.py")
mutate = sys.modules["mutate"] = importlib.util.module_from_spec(spec)   # dataclasses look it up
spec.loader.exec_module(mutate)

EXERCISES = {e.label: e for e in mutate.exercises()}


def test_every_answer_cell_is_an_exercise_with_a_solution_region():
    assert len(EXERCISES) == 29
    assert all(e.spans for e in EXERCISES.values())


def test_the_operators_the_issue_names_make_mutants():
    made = {m.operator: m for m in mutate.mutants(EXERCISES["02/adam_step"])}
    assert {"arithmetic", "constant_plus_one", "statement_dropped", "statements_swapped",
            "in_place", "hyperparameter_hard_coded"} <= set(made)
    assert "w -= " in made["in_place"].source
    hard_coded = [m.source for m in mutate.mutants(EXERCISES["02/adam_step"]) if m.operator == "hyperparameter_hard_coded"]
    assert any("+ 1e-08)" in source for source in hard_coded)       # eps
    assert "copy.copy(" in next(m.source for m in mutate.mutants(EXERCISES["01/snapshot_state"])
                                if m.operator == "deepcopy_to_copy")
    assert any(m.operator == "comparison" and "!=" in m.source for m in mutate.mutants(EXERCISES["00/same_weights"]))
    defaults = [m for m in mutate.mutants(EXERCISES["05/load_latest_checkpoint"]) if m.operator == "mutable_default"]
    assert defaults and "_steps_kept={}" in defaults[0].source


def test_a_mutant_changes_only_the_solution_region():
    """Ledger's given parts (its signature, __len__-like members outside the markers) stay as they are."""
    exercise = EXERCISES["06/Ledger"]
    for mutant in mutate.mutants(exercise):
        assert "def __init__(self, world_size, micro_batch, accum_steps):" in mutant.source
        assert mutant.source.count("def ") == exercise.source.count("def ")


@pytest.mark.parametrize("label", ["06/samples_per_update", "01/snapshot_state"])
def test_the_reference_survives_and_its_mutants_are_killed(label):
    exercise = EXERCISES[label]
    assert mutate.verdict(exercise, exercise.source) == ("survived", "")
    made = mutate.mutants(exercise)
    results = mutate.run_all(made, jobs=1, timeout=120, progress=lambda *_: None)
    assert {key: outcome for key, (outcome, _) in results.items()} == {m.key: "killed" for m in made}


def test_every_listed_equivalent_names_an_exercise_and_gives_a_reason():
    listed = tomllib.loads(mutate.EQUIVALENTS.read_text())
    for key, entry in listed.items():
        label, operator, digest = key.split(":")
        assert label in EXERCISES and len(digest) == 12, key
        assert entry["reason"].strip(), key
