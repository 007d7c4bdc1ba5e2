"""Grading on a Dask cluster: a real ``dask scheduler`` and workers (``workbook.py worker``) on 127.0.0.1.

The toy class of test_class_grading is graded through ``workbook.py grade --scheduler`` while the test
SIGKILLs workers: the one judging a chosen student once (that submission must be graded again elsewhere
and recorded once), and every one that judges a "poison" submission (it must be given up, with the
reason, and the batch go on). A third worker holds a course with one check module changed: it is refused,
saying so, and never judges anything. Everything started is stopped at the end.

Then a worker that joins after grading started: the first worker holds its submission (a test preload,
``dask_gate.py``, keeps it from judging) until a submission has been graded, which only a worker that joined
meanwhile can do; both must have judged. And a worker ended with SIGTERM leaves no cgroup behind.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.contract import nbgrader_meta
from autograder.course import REPO_ROOT
from autograder.grading import cgroups
from autograder.grading.cluster import course_resource
from dask_support import start_scheduler
from notebook_files import fill_answers, submit
from test_class_grading import (ANSWERS, CELL_TIMEOUT, EXPECTED, NAME, NBGRADER_CAN_GRADE,  # noqa: F401
                                blank_course, by_nbgrader, copy_course, gradebook_rows)

# Real Dask workers (each imports torch and starts its zygote), killed and started again: CI's extended suites.
pytestmark = pytest.mark.extended

PYTHON = sys.executable
WORKBOOK = str(REPO_ROOT / "workbook.py")
GATE_PRELOAD = str(Path(__file__).resolve().parent.parent / "support" / "dask_gate.py")
KILLED_ONCE = "correct"        # its worker is killed in the middle of judging it, once
POISON = "poison"              # every worker that judges it is killed
POISON_DEATHS = 4              # two rounds of Dask's retries with allowed-failures = 1 (cluster.judge_remotely)
OTHER_COURSE_CHANGE = ("autograder/start_here.py", "\n# another version of the course\n")
# A hostile classmate judged on a worker: spinners that outlive its cell and a fork bomb to its ceiling.
HOSTILE = "hostile"
HOSTILE_ADD = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        while True:
            pass
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
def add(a, b):
    return a - b
"""


def _start(command, log: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, **kwargs)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def _other_course(folder: Path) -> Path:
    """This course with one check module changed: what a machine with a stale copy holds."""
    for part in ("autograder", "solutions"):
        shutil.copytree(REPO_ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    changed = folder / OTHER_COURSE_CHANGE[0]
    changed.write_text(changed.read_text() + OTHER_COURSE_CHANGE[1])
    return folder


class WorkerKiller(threading.Thread):
    """Watches what the workers are judging and SIGKILLs a worker while it judges a victim (the nanny
    starts another), as a submission that crashes its worker would.

    It asks only the workers it has not killed: the scheduler may still list one just killed, and a
    message to it waits out Dask's 30 s connect timeout, long enough for the next attempt at a victim
    to finish unseen (seen once as an ordinary user: the poison tried once, then graded)."""

    def __init__(self, address: str, victims: dict[str, int]):
        super().__init__(daemon=True)
        from distributed import Client
        self.client = Client(address, timeout=10, set_as_default=False)
        self.victims, self.killed, self.seen = dict(victims), [], set()
        self.done = threading.Event()

    def run(self) -> None:
        dead = set()
        while not self.done.is_set():
            try:
                alive = [w for w in self.client.scheduler_info(n_workers=-1)["workers"] if w not in dead]
                # What each worker is running now (not what is queued on it): a lambda travels by value.
                running = self.client.run(lambda dask_worker: [str(ts.key) for ts in dask_worker.state.executing],
                                          workers=alive, on_error="ignore") if alive else {}
                for worker, keys in running.items():
                    for key in keys:
                        self.seen.add(worker)
                        victim = next((s for s, left in self.victims.items() if left and key.startswith(f"judge-{s}-")), None)
                        if victim:
                            pid = self.client.run(os.getpid, workers=[worker])[worker]
                            os.kill(pid, signal.SIGKILL)
                            dead.add(worker)
                            self.victims[victim] -= 1
                            self.killed.append((victim, worker))
            except Exception:      # a worker that just died: look again
                pass
            self.done.wait(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.client.close()


def _slow_down(path: Path) -> None:
    """The poison's answer cell sleeps 2 s: every attempt at it is still running when the killer, which
    polls what the workers execute, looks (on a loaded machine a fast one could finish unseen)."""
    nb = nbformat.read(path, as_version=4)
    answer = next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "add")
    answer.source = "import time\ntime.sleep(2)\n" + answer.source
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def cluster_graded(blank_course, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("cluster")
    # A task whose worker died twice is given up (Dask's default allows 3 deaths: the test waits less).
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1")
    scheduler, address = start_scheduler(folder, (folder / "scheduler.log").open("w"), env=env)
    started = [scheduler]
    try:
        started.append(_start([PYTHON, str(REPO_ROOT / "workbook.py"), "worker", address, "--nworkers", "2"],
                              folder / "workers.log"))
        other = _other_course(folder / "other")
        started.append(_start([PYTHON, "-m", "autograder.commands.worker", address, "--nworkers", "1"],
                              folder / "other_worker.log", cwd=other, env=dict(os.environ, PYTHONPATH=str(other))))
        from distributed import Client
        with Client(address, timeout=10, set_as_default=False) as client:
            client.wait_for_workers(3, timeout=120)
            other_worker = next(a for a, w in client.scheduler_info()["workers"].items()
                                if course_resource() not in w["resources"])
        course = copy_course(blank_course, folder, NBGRADER_CAN_GRADE)
        shutil.copytree(course / "submitted" / "correct", course / "submitted" / POISON)
        submit(course, HOSTILE, NAME, fill_answers(course / "notebooks" / NAME / f"{NAME}.ipynb",
                                                  {"add": HOSTILE_ADD, "double": ANSWERS["correct"]["double"]}))
        _slow_down(course / "submitted" / POISON / NAME / f"{NAME}.ipynb")
        killer = WorkerKiller(address, {KILLED_ONCE: 1, POISON: POISON_DEATHS})
        killer.start()
        try:
            run = subprocess.run([PYTHON, str(REPO_ROOT / "workbook.py"), "grade", NAME, "--course", str(course),
                                  "--scheduler", address, "--timeout", str(CELL_TIMEOUT)],
                                 capture_output=True, text=True, timeout=600)
        finally:
            killer.stop()
        yield course, run, killer, other_worker
    finally:
        for process in reversed(started):
            _stop(process)


def test_the_cluster_grades_the_class_as_nbgrader_autograde_does(cluster_graded, by_nbgrader):  # noqa: F811
    course, run, killer, _ = cluster_graded
    record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    failed = {student for student, outcome in record.items() if outcome["status"] == "failed"}
    assert failed == {"malformed"}, run.stderr[-3000:]       # not a notebook: zero in every cell, and said
    assert run.returncode == 1       # the exit status reports them
    assert gradebook_rows(course, NBGRADER_CAN_GRADE) == gradebook_rows(by_nbgrader, NBGRADER_CAN_GRADE)


def test_a_submission_whose_worker_was_killed_is_graded_again_and_recorded_once(cluster_graded):
    course, run, killer, _ = cluster_graded
    assert [victim for victim, _ in killer.killed].count(KILLED_ONCE) == 1
    record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    assert record[KILLED_ONCE]["status"] == "graded" and record[KILLED_ONCE]["error"] is None
    assert len(list((course / "autograded" / KILLED_ONCE / NAME).glob("*.ipynb"))) == 1


def test_a_submission_that_kills_every_worker_is_given_up_with_the_reason(cluster_graded):
    course, run, killer, _ = cluster_graded
    assert [victim for victim, _ in killer.killed].count(POISON) == POISON_DEATHS
    record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    assert "not gradable" in record[POISON]["error"]
    rows = gradebook_rows(course, [POISON])
    assert rows[POISON, "total"] == 0


def test_a_hostile_submission_judged_on_a_worker_loses_only_its_own_points(cluster_graded, by_nbgrader):  # noqa: F811
    course, run, _, _ = cluster_graded
    rows = gradebook_rows(course, [HOSTILE])
    assert (rows[HOSTILE, "test_add"][0], rows[HOSTILE, "test_double"][0], rows[HOSTILE, "test_double_negative"][0]) \
        == (0, 2, 1)
    assert gradebook_rows(course, NBGRADER_CAN_GRADE) == gradebook_rows(by_nbgrader, NBGRADER_CAN_GRADE)


def test_each_worker_says_what_confines_a_submission_on_its_machine(cluster_graded):
    log = (cluster_graded[0].parent / "workers.log").read_text()
    assert log.count("trusted grading confines each submission with") >= 2     # the command, and each worker
    assert "trusted grading refused" not in log


def test_a_worker_of_another_course_is_refused_and_judges_nothing(cluster_graded):
    course, run, killer, other_worker = cluster_graded
    assert f"refused worker {other_worker}: another course: check modules and grader" in run.stderr
    assert other_worker not in killer.seen


def test_an_unreachable_scheduler_gets_a_message_not_a_traceback(blank_course, tmp_path):  # noqa: F811
    run = subprocess.run([PYTHON, str(REPO_ROOT / "workbook.py"), "grade", NAME, "--course", str(blank_course),
                          "--scheduler", "tcp://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "no Dask scheduler answers at tcp://127.0.0.1:9" in run.stderr and "Traceback" not in run.stderr


# ---- workers that join late; workers ended with SIGTERM ----------------------------------------------------

LATE_CLASS = ["correct", "wrong", "wrong2", "untouched"]


def _wait_for(condition, seconds: float):
    """``condition()``'s first true value within ``seconds``, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    return None


def _graded(course: Path) -> list[str]:
    try:
        record = json.loads((course / "class_reports" / NAME / "grading.json").read_text())["students"]
    except (OSError, ValueError, KeyError):
        return []
    return [student for student, outcome in record.items() if outcome["status"] == "graded"]


def test_a_worker_that_joins_after_grading_started_is_used(blank_course, tmp_path):  # noqa: F811
    from distributed import Client

    gate = tmp_path / "gate"
    scheduler, address = start_scheduler(tmp_path, (tmp_path / "scheduler.log").open("w"))
    started = [scheduler]
    grade_log = tmp_path / "grade.log"
    try:
        started.append(_start([PYTHON, WORKBOOK, "worker", address, "--nworkers", "1", "--preload", GATE_PRELOAD],
                              tmp_path / "first.log", env=dict(os.environ, WORKBOOK_TEST_GATE=str(gate))))
        course = copy_course(blank_course, tmp_path, LATE_CLASS)
        grade = [PYTHON, WORKBOOK, "grade", NAME, "--course", str(course), "--scheduler", address,
                 "--timeout", str(CELL_TIMEOUT), "--no-summary"]
        with Client(address, timeout=10, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
            (first,) = client.scheduler_info()["workers"]
            # --workers N waits for N, and says what is missing when they do not come.
            short = subprocess.run(grade + ["--workers", "2", "--wait-for-workers", "3"], capture_output=True,
                                   text=True, timeout=120)
            assert short.returncode != 0 and not _graded(course), short.stderr[-2000:]
            assert (f"waiting up to 3 s (--wait-for-workers) for 2 workers of this course at {address}: "
                    "1 there so far") in short.stderr
            assert "1 of the 2 workers asked for (--workers 2)" in short.stderr and "1 missing" in short.stderr
            client.get_task_stream()          # from now on the scheduler records where each task runs
            grading = _start(grade + ["--workers", "1"], grade_log)
            try:
                held = _wait_for(lambda: client.processing(workers=[first])[first], 120)
                assert held, "the first worker never took a submission: " + grade_log.read_text()[-2000:]
                started.append(_start([PYTHON, WORKBOOK, "worker", address, "--nworkers", "1"],
                                      tmp_path / "second.log"))
                # Only a worker that joined after grading started can grade while the first holds its own.
                graded_while_held = _wait_for(lambda: _graded(course), 300)
                gate.touch()
                assert grading.wait(timeout=600) == 0, grade_log.read_text()[-3000:]
            finally:
                gate.touch()
                _stop(grading)
            (second,) = set(client.scheduler_info()["workers"]) - {first}
            judged = [(task["key"], task["worker"]) for task in client.get_task_stream()
                      if str(task["key"]).startswith("judge-")]
    finally:
        for process in reversed(started):
            _stop(process)
    log = grade_log.read_text()
    assert graded_while_held, f"no submission was graded while the first worker held one: the worker that " \
                              f"joined was not used\n{log[-3000:]}"
    graded_on = {student: {worker for key, worker in judged if key.startswith(f"judge-{student}-")}
                 for student in LATE_CLASS}
    assert all(len(workers) == 1 for workers in graded_on.values()), graded_on     # each judged once
    assert set().union(*graded_on.values()) == {first, second}, graded_on
    assert graded_on[graded_while_held[0]] == {second}
    assert f"{second} joined: 2 workers of {address} grade" in log
    assert sorted(_graded(course)) == sorted(LATE_CLASS)
    rows = gradebook_rows(course, LATE_CLASS)
    assert {s: rows[s, "total"] for s in LATE_CLASS} == {s: sum(EXPECTED[s].values()) for s in LATE_CLASS}


def _cgroups_here() -> bool:
    made = subprocess.run([PYTHON, "-c", "from autograder.grading import cgroups\ngroups = cgroups.make(64, 2**30)\n"
                                         "print(bool(groups))\ncgroups.remove(groups)"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    return made.stdout.strip() == "True"


def _groups_of(tag: str) -> list[Path]:
    """The sandboxes' groups the process ``tag`` names made (``cgroups.owner_tag``: its pid and start time)."""
    return [group for group in Path("/sys/fs/cgroup").rglob(f"{cgroups.PREFIX}{tag}-*") if group.is_dir()]


@pytest.mark.parametrize("ended", ["the worker process", "the worker command alone"])
def test_a_worker_ended_with_sigterm_leaves_no_cgroup(blank_course, tmp_path, ended):  # noqa: F811
    """SIGTERM to a Dask worker process (as `kill` or a process group's end sends it) runs its handler, and
    SIGTERM to the worker command alone (`workbook.py worker`, `workbook-worker`) closes its workers through
    Dask (its teardown): either way the sandboxes of the submission being judged end and their cgroups are
    removed. (A worker killed with SIGKILL leaves them to the next grader's sweep: test_isolation's test of a
    grader that died.)"""
    if not _cgroups_here():
        pytest.skip("this user cannot make a sandbox's cgroups here (an ordinary user without a delegated "
                    "cgroup v2): a worker has none to leave behind")
    from distributed import Client

    course = copy_course(blank_course, tmp_path, [])
    submit(course, "sleeper", NAME, fill_answers(course / "notebooks" / NAME / f"{NAME}.ipynb",
                                                 {"add": "import time\ntime.sleep(300)"}))
    scheduler, address = start_scheduler(tmp_path)
    started = [scheduler]
    try:
        worker = _start([PYTHON, WORKBOOK, "worker", address, "--nworkers", "1"], tmp_path / "worker.log")
        started.append(worker)
        with Client(address, timeout=10, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=120)
            pid = next(iter(client.run(os.getpid).values()))
        tag = cgroups.owner_tag(pid)       # not the pid alone: on a busy machine another process may get it soon
        started.append(_start([PYTHON, WORKBOOK, "grade", NAME, "--course", str(course), "--scheduler", address,
                               "--timeout", "200", "--no-summary"], tmp_path / "grade.log"))
        groups = _wait_for(lambda: _groups_of(tag), 180)
        assert groups, "the worker never judged the submission: " + (tmp_path / "worker.log").read_text()[-2000:]
        if ended == "the worker process":
            os.kill(pid, signal.SIGTERM)
        else:
            worker.send_signal(signal.SIGTERM)
        assert _wait_for(lambda: not cgroups.owner_alive(tag), 60), "the worker process did not end"
        left = [group for group in groups if group.exists()]
        assert not left, f"left behind: {left}\n" + (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        for process in reversed(started):
            _stop(process)
