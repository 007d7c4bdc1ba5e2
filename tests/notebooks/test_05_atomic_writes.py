"""Notebook 05: atomic checkpoint writes. The checks, driven on right and wrong implementations."""

import ctypes
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import pytest
import torch

from autograder import atomic_writes as checks
from autograder.atomic_writes import atomic_save as atomic_save_checks
from autograder.engine import crash_trials as trial_engine
from check_outcomes import failing_checks, failure_of
from fixtures import atomic_writes_impls as impls
from notebook_checks import checks_of

ATOMIC_SAVE_CHECKS, LOAD_LATEST_CHECKS = checks_of("05", "atomic_save"), checks_of("05", "load_latest_checkpoint")



# The visible test arguments and the hidden ones the notebook uses.
def test_direct_write_leaves_unloadable_files_under_sigkill():
    records = checks.crash_trials(impls.save_directly, trials=6, layers=8)
    assert any(r["outcome"] == "unloadable" for r in records)
    assert all(r["outcome"] in ("old", "new", "unloadable") for r in records)


def test_atomic_write_killed_mid_write_keeps_the_old_file_and_leaves_its_temp():
    records = checks.crash_trials(impls.atomic_save_mkstemp, trials=4, layers=8)
    assert [r["outcome"] for r in records if r["ended"] == "killed"] == ["old"] * sum(
        r["ended"] == "killed" for r in records)
    assert any(name.endswith(".tmp") for r in records for name in r["leftovers"])


def test_checks_report_a_non_callable_answer():
    assert "should be a function" in failure_of(checks.check_atomic_save_temp_location, None)
    assert "should be a function" in failure_of(checks.check_load_latest_checkpoint_newest, None)


def test_recording_restores_os_functions():
    names = ("fsync", "fdatasync", "replace", "rename", "remove", "unlink", "link", "symlink")
    originals = [getattr(os, name) for name in names]
    with checks.recorded_file_operations(watch="nowhere"):
        assert all(getattr(os, name) is not original for name, original in zip(names, originals))
    assert [getattr(os, name) for name in names] == originals


def test_the_watch_sees_what_path_holds_after_each_operation(tmp_path):
    path, temp = tmp_path / "model.pt", tmp_path / "model.pt.tmp"
    path.write_bytes(b"old")
    temp.write_bytes(b"new")
    with checks.recorded_file_operations(watch=path) as events:
        os.remove(path)
        os.rename(temp, path)
    assert [(e["op"], e["watched"]) for e in events] == [("remove", None),
                                                         ("rename", checks.content_digest(path))]


# What each call of the learner's atomic_save sees, logged by a spy (from the crash trials' writers too).
_SEEN_LOG = None


def _spy_save(obj, path):
    folder = os.path.dirname(os.path.abspath(path))
    scratch = os.path.dirname(folder)
    seen = [os.path.basename(path), os.path.basename(folder), sorted(os.listdir(scratch)),
            os.path.dirname(os.path.abspath(tempfile.gettempdir())) == scratch,
            os.path.basename(tempfile.gettempdir())]
    with open(_SEEN_LOG, "a") as log:
        log.write(json.dumps(seen) + "\n")
    impls.atomic_save_mkstemp(obj, path)


def test_every_call_of_atomic_save_looks_alike_whichever_check_makes_it(tmp_path, monkeypatch):
    """No folder name, file name or tempfile setting tells the answer which check (crash trial, watched
    save, failing save) it is in."""
    monkeypatch.setattr(sys.modules[__name__], "_SEEN_LOG", str(tmp_path / "seen.log"))
    for name in ATOMIC_SAVE_CHECKS:
        fewer_trials = {"trials": 2} if name == "check_atomic_save_crash" else {}
        assert failure_of(getattr(checks, name), _spy_save, **fewer_trials) is None, name
    seen = {line for line in (tmp_path / "seen.log").read_text().splitlines()}
    assert seen == {json.dumps(["model.pt", "checkpoints", ["checkpoints", "system-tmp"], True, "system-tmp"])}


def test_checks_leave_the_global_rngs_as_they_found_them():
    random.seed(5)
    expected = random.random()
    random.seed(5)
    failure_of(checks.check_atomic_save_temp_location, impls.atomic_save_random_name)
    assert random.random() == expected


def test_a_copy_gets_the_time_it_was_copied_and_keeps_the_step(tmp_path):
    """What section 2.3 shows: shutil.copy (like cp without -p) gives a file a new modification time."""
    source, copy = tmp_path / "step_9.pt", tmp_path / "copy" / "step_9.pt"
    torch.save(checks.make_checkpoint(9, layers=1, layer_kib=4), source)
    os.utime(source, (1_700_000_000, 1_700_000_000))
    copy.parent.mkdir()
    shutil.copy(source, copy)
    assert os.path.getmtime(copy) > os.path.getmtime(source) + 1000
    assert torch.load(copy, weights_only=True)["step"] == 9


def test_unreadable_check_sees_warnings_although_graded_checks_silence_them():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning escaping the check would raise here
        assert failure_of(checks.check_load_latest_checkpoint_unreadable, impls.load_latest_by_step_in_name) is None


def test_torch_behaviour_the_notebook_teaches(tmp_path):
    """The facts notebook 05 is built on, against the installed torch."""
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1000)}, path)
    with pytest.raises(Exception):
        torch.save({"w": torch.zeros(1000), "bad": atomic_save_checks._FailsToSerialize()}, path)
    with pytest.raises(RuntimeError):  # the failed save already destroyed the old checkpoint
        torch.load(path, weights_only=True)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(EOFError):
        torch.load(tmp_path / "empty.pt", weights_only=True)


def test_an_unanswered_exercise_reaches_the_grader_as_not_implemented():
    """The grader says "not answered yet" only for NotImplementedError, so the checks let it through."""
    def stub(*args):
        raise NotImplementedError()

    for check in (checks.check_atomic_save_crash, checks.check_atomic_save_cleanup,
                  checks.check_load_latest_checkpoint_unreadable):
        with pytest.raises(NotImplementedError):
            check(stub)


def test_doing_nothing_passes_no_check():
    def do_nothing(*args):
        return None

    assert failing_checks(checks, ATOMIC_SAVE_CHECKS, do_nothing) == set(ATOMIC_SAVE_CHECKS)
    assert failing_checks(checks, LOAD_LATEST_CHECKS, do_nothing) == set(LOAD_LATEST_CHECKS)


def test_each_checkpoint_made_is_its_own_copy():
    # make_checkpoint draws each checkpoint's tensors once per process and hands out copies: a save that
    # changes what it is given must not change the checkpoint the next check compares against.
    first = checks.make_checkpoint(2, layers=2, layer_kib=4, seed=9)
    first["model"]["layer0.weight"].zero_()
    second = checks.make_checkpoint(2, layers=2, layer_kib=4, seed=9)
    assert second["model"]["layer0.weight"].abs().sum() > 0
    assert not checks.holds_drawn(first, 2, layers=2, layer_kib=4, seed=9)
    assert checks.holds_drawn(second, 2, layers=2, layer_kib=4, seed=9)
    assert not checks.holds_drawn(second, 3, layers=2, layer_kib=4, seed=9)


# ---- the notebook's crash tables: each kill lands where its label says, on every run and under load ---

def _save_via_temp_and_replace(obj, path):
    """Notebook 05's section 3 fix: a temp file next to the checkpoint, then os.replace."""
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def _crash_tables() -> dict:
    """The rows of notebook 05's two tables (sections 1 and 3): where each kill landed, what it left."""
    return {save.__name__: [(r["fraction"], r["ended"], r["outcome"], r["leftovers"])
                            for r in checks.crash_trials(save, trials=5)]
            for save in (checks.save_directly, _save_via_temp_and_replace)}


@pytest.fixture
def busy_cpus():
    """A busy loop per core: the load under which a kill that polls the file's size lands late."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)  # every spinner running before the trials start
        yield len(spinners)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_the_crash_tables_are_the_same_on_every_run_under_load(busy_cpus):
    first, second = _crash_tables(), _crash_tables()
    assert first == second
    fractions = [0.1, 0.3, 0.5, 0.7, 0.9]
    # The lesson: any kill part-way through a bare torch.save leaves an unloadable file...
    assert first["save_directly"] == [(f, "killed", "unloadable", []) for f in fractions]
    # ... and with a temp file and os.replace, the old checkpoint (every kill lands before the rename).
    assert first["_save_via_temp_and_replace"] == [(f, "killed", "old", ["model.pt.tmp"]) for f in fractions]


# ---- crash trials end every process a save starts ----------------------------------------------

ISOLATIONS = {"pid namespace": (trial_engine.CLONE_NEWPID,),
              "user and pid namespaces": (trial_engine.CLONE_NEWUSER | trial_engine.CLONE_NEWPID,),
              "process group (fallback)": ()}


def _can_unshare(flags: int) -> bool:
    """Whether a process of this user may make these namespaces here (tried in a child)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(flags) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.fixture(params=list(ISOLATIONS))
def isolation(request, monkeypatch):
    """Each way a trial's writer is set apart: the forked trial leader reads PID_NAMESPACE_FLAGS. A way the
    machine does not give this user is skipped, saying so (a PID namespace alone needs root; the checks then
    take the next way)."""
    flags = ISOLATIONS[request.param]
    if flags and not _can_unshare(flags[0]):
        pytest.skip(f"{request.param}: unshare() is refused to this user here (uid {os.getuid()}); "
                    "the checks use the next way on the list")
    monkeypatch.setattr(trial_engine, "PID_NAMESPACE_FLAGS", flags)
    return request.param


def _reports_who_it_is(obj, path):
    with open(path, "w") as f:
        f.write(f"{os.getpid()} {os.getuid()}")


def test_each_way_of_isolating_a_writer_works_here(isolation, tmp_path):
    """Where the machine allows namespaces, the writer really is in one (PID 2, under the init), as itself."""
    path = tmp_path / "who.pt"
    assert checks.run_and_kill(_reports_who_it_is, None, str(path), kill_at_bytes=None) == "finished"
    pid, uid = map(int, path.read_text().split())
    assert uid == os.getuid()
    assert (pid == 2) == (isolation != "process group (fallback)")


def test_a_grandchild_writer_dies_with_its_trial(isolation):
    """The writer's grandchild, no longer its descendant once its parent exits, writes the final name in place:
    it is killed with the trial, so its partial file is what the check finds."""
    records = checks.crash_trials(impls.atomic_save_grandchild_writer, trials=6, layers=8)
    assert any(r["outcome"] == "unloadable" for r in records), records


def _leaves_a_sleeper(escape):
    def save(obj, path):
        torch.save(obj, path)
        if os.fork() == 0:  # outlives the save, holding the write end of the test's pipe
            if escape:
                os.setsid()
            time.sleep(30)
            os._exit(0)
    return save


@pytest.mark.parametrize("escape", [False, True], ids=["in the group", "setsid"])
def test_nothing_a_save_started_outlives_its_trial(isolation, escape, tmp_path):
    if escape and isolation == "process group (fallback)":
        pytest.skip("the fallback's known gap: a process that leaves the group escapes it")
    read_end, write_end = os.pipe()
    try:
        save = _leaves_a_sleeper(escape)
        ended = checks.run_and_kill(save, {"w": torch.zeros(4)}, str(tmp_path / "c.pt"), kill_at_bytes=None)
        assert ended == "finished"
        os.close(write_end)
        write_end = None
        # End of file at once: no process holds the write end any more, so the sleeper is gone.
        assert select.select([read_end], [], [], 2.0)[0] and os.read(read_end, 1) == b""
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


# ---- a path the learner's code returns is judged as data, never looked up in the grader's folders -----

@pytest.mark.parametrize("answer", [impls.load_latest_returns_the_gradebook, impls.load_latest_returns_the_solutions,
                                    impls.load_latest_returns_a_course_path], ids=lambda a: a.__name__)
def test_a_returned_path_is_judged_the_same_whatever_exists_where_the_grader_runs(answer, tmp_path, monkeypatch):
    """The grader's working folder is the course folder: a relative path resolved there, or an absolute path
    looked up there, would answer "does this file exist in the course folder" in the feedback."""
    messages = []
    for populated in (False, True):
        course = tmp_path / f"course-{populated}" / "inside"
        course.mkdir(parents=True)
        if populated:
            (course / "gradebook.db").write_text("grades")
            (course.parent / "solutions").mkdir()
        monkeypatch.chdir(course)
        messages.append(failure_of(checks.check_load_latest_checkpoint_newest, answer))
    assert messages[0] is not None and messages[0] == messages[1]


def test_returned_path_looks_at_the_disk_only_inside_the_checks_folder(tmp_path, monkeypatch):
    from autograder.checking import returned_path
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    expected = str(folder / "step_3.pt")
    (folder / "step_3.pt").write_bytes(b"x")
    os.symlink(expected, folder / "latest.pt")
    looked = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: looked.append(os.fspath(p)) or real_stat(p, *a, **k))
    assert returned_path(expected, expected, str(folder)) == ("same", "step_3.pt")
    assert returned_path(str(folder / "sub" / ".." / "step_3.pt"), expected, str(folder))[0] == "same"
    assert returned_path(str(folder / "latest.pt"), expected, str(folder)) == ("same", "latest.pt")
    assert returned_path("step_3.pt", expected, str(folder)) == ("name", "step_3.pt")
    assert returned_path("gradebook.db", expected, str(folder)) == ("relative", "gradebook.db")
    assert returned_path("/etc/passwd", expected, str(folder)) == ("outside", "/etc/passwd")
    assert returned_path(str(folder) + "-other/step_3.pt", expected, str(folder))[0] == "outside"
    assert returned_path(42, expected, str(folder)) == ("not a path", "int")
    assert all(p.startswith(str(folder)) for p in looked), looked
