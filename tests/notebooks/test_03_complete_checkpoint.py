"""Notebook 03: the complete checkpoint. The checks, driven on right and wrong save/load pairs."""

import os
import random
import re

import nbformat
import numpy as np
import pytest
import torch

from autograder import complete_checkpoint as checks
from autograder.complete_checkpoint import experiment
from autograder.engine import fresh_process
from autograder.helpers import nothing_allowlisted
from autograder.course import NOTEBOOKS
from check_outcomes import failure_of
from fixtures import complete_checkpoint_impls as impls

@pytest.mark.parametrize("component, named", [
    ("model", "model state"), ("optimizer", "momentum"), ("scheduler", "scheduler"), ("scaler", "GradScaler"),
    ("counters", "counters"), ("torch_rng", "torch's RNG"), ("numpy_rng", "NumPy's global RNG"),
    ("python_rng", "Python's random"), ("loader", "StatefulDataLoader"),
])
def test_the_equivalence_failure_names_the_missing_component(component, named):
    save = impls.make_save(omit=(component,))
    message = failure_of(lambda _: checks.check_load_checkpoint(impls.make_load(), save), None)
    assert "not the uninterrupted one" in message and named in message


def test_restoring_rng_before_the_iterator_exists_is_named():
    load = impls.make_load(rng_before_iterator=True)
    message = failure_of(lambda _: checks.check_load_checkpoint_rng(load, impls.make_save()), None)
    assert "matched right after load_checkpoint" in message and "iterator" in message


def test_changing_the_trainers_objects_is_named():
    """The probes read the run through the trainer's objects: methods replaced there are named, not trusted."""
    message = failure_of(checks.check_save_checkpoint, impls.save_resets_loss_scale_and_hides_it)
    assert "trainer.scaler.get_scale replaced on the instance" in message and "must only read" in message
    message = failure_of(lambda _: checks.check_load_checkpoint_training_state(
        impls.load_hides_missing_optimizer, impls.save_complete), None)
    assert "trainer.optimizer.state_dict replaced on the instance" in message


def test_checks_leave_the_callers_rngs_alone():
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    before = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    failure_of(lambda _: checks.check_load_checkpoint(impls.make_load(), impls.make_save()), None)
    assert torch.equal(before[0], torch.get_rng_state())
    assert np.array_equal(before[1], np.random.get_state()[1]) and before[2] == random.getstate()


def test_an_error_in_the_fresh_process_is_reported():
    def load_raises(path, trainer):
        raise KeyError("optimizer")
    message = failure_of(lambda _: checks.check_load_checkpoint(load_raises, impls.make_save()), None)
    assert "fresh process failed: KeyError" in message


def test_a_fresh_process_does_not_inherit_the_rng_state():
    torch.manual_seed(0)
    parent = torch.get_rng_state()
    child = checks.run_in_fresh_process(torch.get_rng_state)
    assert not torch.equal(parent, child)


def test_torch_behaviour_the_notebook_teaches():
    """The facts notebook 03 is built on, against the installed torch and torchdata."""
    trainer = checks.make_trainer(0)
    checks.train_steps(trainer, 3)
    # Creating a loader iterator draws from torch's global RNG, also for a resumed StatefulDataLoader.
    state = trainer.loader.state_dict()
    fresh = checks.make_trainer(1)
    fresh.loader.load_state_dict(state)
    before = torch.get_rng_state()
    iter(fresh.loader)
    assert not torch.equal(before, torch.get_rng_state())
    # torch.load's safe default refuses NumPy's RNG state as it is, and accepts it as tensors.
    import io
    buffer = io.BytesIO()
    torch.save({"numpy": np.random.get_state()}, buffer)
    buffer.seek(0)
    with pytest.raises(Exception, match="Weights only load failed"), nothing_allowlisted():
        torch.load(buffer)
    buffer = io.BytesIO()
    torch.save({"numpy": impls.numpy_rng_as_tensors(), "python": random.getstate()}, buffer)
    buffer.seek(0)
    assert torch.load(buffer)["python"] == random.getstate()
    # The CPU GradScaler is enabled and its scale grows while training.
    assert trainer.scaler.is_enabled() and trainer.scaler.get_scale() == 2.0 ** 10
    checks.train_steps(trainer, 1)
    assert trainer.scaler.get_scale() == 2.0 ** 11


def test_a_hanging_fresh_process_is_stopped_and_reported():
    import time
    with pytest.raises(RuntimeError, match="did not finish within 0.5 s"):
        checks.run_in_fresh_process(lambda: time.sleep(30), timeout=0.5)


def test_without_fork_the_checks_still_grade(monkeypatch):
    """Windows has no fork: the resume then runs in this process, RNGs scrambled, and is still judged."""
    monkeypatch.setattr(fresh_process, "AVAILABLE", False)
    experiment._RECENT_EXPERIMENTS.clear()
    assert failure_of(lambda _: checks.check_load_checkpoint(impls.make_load(), impls.make_save()), None) is None
    message = failure_of(lambda _: checks.check_load_checkpoint_rng(
        impls.make_load(), impls.make_save(omit=("numpy_rng",))), None)
    assert "NumPy's global RNG" in message
    experiment._RECENT_EXPERIMENTS.clear()


def test_an_allowlist_registered_here_does_not_make_the_checkpoint_loadable():
    """torch.load's own message suggests add_safe_globals; the allowlist stays in the process that made it.
    The save check loads as a process that allowlisted nothing (the grader, the resume after a crash) does,
    so it fails in the kernel as it does under grading, and leaves the kernel's allowlist as it found it."""
    def allowlist():
        return {getattr(g, "__qualname__", g) for g in torch.serialization.get_safe_globals()}

    before = torch.serialization.get_safe_globals()
    try:
        torch.serialization.add_safe_globals(impls.NUMPY_RNG_GLOBALS)
        registered = allowlist()
        message = failure_of(checks.check_save_checkpoint, impls.save_numpy_allowlisted)
        assert "nothing allowlisted" in message and "add_safe_globals" in message and "NumPy" in message
        assert registered <= allowlist() and "_reconstruct" in allowlist()
        with nothing_allowlisted():
            assert torch.serialization.get_safe_globals() == []
    finally:   # this test process's allowlist as it was
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


def _solution_cells():
    notebook = next(n for n in NOTEBOOKS if n.number == "03")
    return nbformat.read(str(notebook.source()), as_version=4).cells


def test_prose_is_markdown_not_comments_at_the_end_of_a_code_cell():
    for cell in _solution_cells():
        if cell.cell_type == "code":
            assert not re.search(r"^# #+ ", cell.source, re.MULTILINE), cell.source[-300:]
    headings = [line for cell in _solution_cells() if cell.cell_type == "markdown" for line in cell.source.splitlines()]
    assert "### Three random number generators" in headings


def test_the_notebook_shows_no_atomic_save_of_its_own_and_points_to_05():
    """Notebook 05's checks define an atomic save (a .tmp file next to the checkpoint, file and folder synced,
    cleaned up on failure); 03 shows the trap only and points there, rather than a helper that fails them."""
    sources = [cell.source for cell in _solution_cells()]
    assert not any("def atomic_save" in source or "atomic_save(" in source for source in sources)
    assert any("05_atomic_writes.ipynb" in source for source in sources)
    assert any("notebook 05's subject" in source for source in sources)


def test_the_save_cannot_tell_which_check_calls_it(tmp_path):
    """The save check and the resume experiments hand save_checkpoint the same file name in a folder of
    tempfile's making, and the resume reads it under that name too: no path says what is being tested.
    (The saves run in forked children and the load in a fresh process: they note the paths in a file.)"""
    log = tmp_path / "paths.txt"

    def save(path, trainer):
        with open(log, "a") as f:
            f.write(path + "\n")
        impls.save_complete(path, trainer)

    assert failure_of(checks.check_save_checkpoint, save) is None
    experiment._RECENT_EXPERIMENTS.clear()
    assert failure_of(lambda _: checks.check_load_checkpoint_rng(impls.load_complete, save), None) is None
    experiment._RECENT_EXPERIMENTS.clear()
    paths = log.read_text().split()
    assert len(paths) == 2 and {os.path.basename(p) for p in paths} == {"checkpoint.pt"}
    assert all(os.path.basename(os.path.dirname(p)).startswith("tmp") for p in paths)


# ---- a fresh process is fresh: it shares no memory and no temp storage with the process that saved -------

def test_a_fresh_process_shares_no_memory_with_the_process_that_packed_its_task():
    import mmap
    from autograder import fresh_process
    kept, shared = {}, mmap.mmap(-1, 16)
    shared_tensor = torch.zeros(4).share_memory_()

    def read_back():
        return dict(kept), shared[:1], float(shared_tensor[0])

    task = fresh_process.packed(read_back)
    assert set(task.left_out) == {"read_back's closure variable shared", "read_back's closure variable shared_tensor"}
    kept["checkpoint"] = "in memory"           # changed after the task was packed: the copy does not see it
    shared[:1], shared_tensor[0] = b"x", 1.0
    with pytest.raises(fresh_process.FreshProcessError, match="NameError|referenced before assignment"):
        task.run()
    assert fresh_process.packed(lambda: dict(kept)).run() == {"checkpoint": "in memory"}   # packed now: a copy
    assert fresh_process.packed(os.getpid).run() != os.getpid()


def test_each_task_gets_a_process_of_its_own_and_one_after_a_preload_holds_the_module():
    """The server forks each task's child ahead of the task (a spare): still one new process per task, and
    a preload ends the spare forked before the module was imported, so the next task has the module."""
    from autograder.course import CHECK_MODULES

    def loaded(names):
        import sys
        return [name for name in names if name in sys.modules]
    fresh_process.start()
    pids = [fresh_process.packed(os.getpid).run() for _ in range(3)]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    missing = [name for name in CHECK_MODULES if name not in fresh_process.packed(loaded, CHECK_MODULES).run()]
    assert missing, "every check module is in the server already: nothing left to preload"
    fresh_process.start(missing[-1])
    assert fresh_process.packed(loaded, [missing[-1]]).run() == [missing[-1]]


@pytest.mark.skipif(not __import__("autograder.fresh_process").fresh_process.files_are_private(),
                    reason="needs Landlock (Linux 5.13 or later)")
def test_a_fresh_process_reads_only_the_files_it_is_given_and_opens_no_socket(tmp_path):
    from autograder import fresh_process
    given, other = tmp_path / "given.pt", tmp_path / "other.pt"
    given.write_bytes(b"checkpoint")
    other.write_bytes(b"state")
    stash = f"/dev/shm/h3-test-{os.getpid()}"
    open(stash, "w").write("state")
    try:
        def reads(path):
            with open(path, "rb") as f:
                return f.read()
        assert fresh_process.packed(reads, str(given)).run(readable=[str(given)]) == b"checkpoint"
        for refused in (str(other), stash):
            with pytest.raises(fresh_process.FreshProcessError, match="PermissionError"):
                fresh_process.packed(reads, refused).run(readable=[str(given)])

        def home_and_temp():
            import tempfile
            return os.path.expanduser("~"), tempfile.gettempdir(), os.getcwd()
        home, temp, cwd = fresh_process.packed(home_and_temp).run()
        assert home == temp == cwd and os.path.basename(home).startswith("fresh-process-")

        def connects():
            import socket
            socket.socket(socket.AF_UNIX)
        with pytest.raises(fresh_process.FreshProcessError, match="PermissionError"):
            fresh_process.packed(connects).run()
    finally:
        os.remove(stash)


def test_a_save_in_a_fork_leaves_nothing_in_this_process():
    from autograder import fresh_process
    kept = {}
    assert fresh_process.in_a_fork(lambda: kept.setdefault("state", 1)) == 1
    assert kept == {}
