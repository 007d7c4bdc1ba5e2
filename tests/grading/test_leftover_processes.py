"""Nothing a call of the learner's code starts outlives the call, and a fresh process sees no other process.

docs/grading.md, principle 5 ("a fresh process is fresh"): the learner's save runs in a forked child
(``fresh_process.in_a_fork``) and the resume in a fresh process. A save could leave a process running that
holds what it should have written (in its memory, its command line or its environment) and write a
placeholder; a resume that read that process would pass without a checkpoint. These tests attack both
halves with real processes: what the save leaves is gone when the call returns, however it detached, and a
fresh process can read no other process's entries in /proc. They hold as root and as an ordinary user.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from autograder.engine import fresh_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's subreaper and /proc")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _leave_a_process(how: str, pid_file: str) -> str:
    """A 'save' that leaves a process running (detached ``how``) and returns at once."""
    import os
    import time
    if os.fork() == 0:
        if how == "own group":
            os.setpgid(0, 0)
        if how in ("double fork", "own group") and os.fork() != 0:
            os._exit(0)
        for fd in range(3, 256):          # closed descriptors: nothing of the caller's pipe left open
            try:
                os.close(fd)
            except OSError:
                pass
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)     # whole or not at all: it may be ended at any moment
        time.sleep(120)
        os._exit(0)
    deadline = time.monotonic() + 60
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "saved"


@pytest.mark.parametrize("how", ["child", "double fork", "own group"])
def test_nothing_a_save_leaves_running_outlives_the_call(tmp_path, how):
    pid_file = str(tmp_path / "left.pid")
    started = time.monotonic()
    assert fresh_process.in_a_fork(_leave_a_process, how, pid_file) == "saved"
    # What the save left sleeps 120 s: a call that waited for it instead of ending it would take that long.
    assert time.monotonic() - started < 100, "the call waited for what the save left instead of ending it"
    left = int(Path(pid_file).read_text())
    assert not _alive(left), f"the process the save left ({how}) still runs after the call"


def _hand_over(secret: str) -> str:
    """A 'save' that leaves a process holding ``secret`` in its command line and environment."""
    import os
    import sys
    import time
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", secret],
                      {"CHECKPOINT": secret})
        os._exit(0)
    time.sleep(0.3)
    return "saved"


def _look_for(secret: str) -> list[str]:
    """In a fresh process: every place in /proc where ``secret`` can be read."""
    import os
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = [str(pid) for pid in range(1, 1 << 16)]      # cannot list: guess, as an attacker would
    for pid in pids:
        for entry in ("cmdline", "environ", "maps"):
            try:
                with open(f"/proc/{pid}/{entry}", "rb") as f:
                    if secret.encode() in f.read():
                        found.append(f"/proc/{pid}/{entry}")
            except OSError:
                pass
    return found


def test_a_fresh_process_cannot_read_what_a_save_left_running():
    secret = f"checkpoint-{os.urandom(8).hex()}"
    assert fresh_process.in_a_fork(_hand_over, secret) == "saved"
    assert fresh_process.packed(_look_for, secret).run() == []


@pytest.mark.skipif(not fresh_process.files_are_private(), reason="needs Landlock (Linux 5.13 or newer)")
def test_a_fresh_process_reads_its_own_proc_entries_and_no_other_processes():
    def reads(paths):
        import os
        seen = {}
        for path in paths:
            try:
                with open(path.replace("SELF", str(os.getpid())), "rb") as f:
                    f.read(1)
                seen[path] = True
            except OSError:
                seen[path] = False
        return seen

    mine = os.getpid()
    seen = fresh_process.packed(reads, ["/proc/self/status", "/proc/SELF/maps", "/proc/cpuinfo",
                                        f"/proc/{mine}/cmdline", f"/proc/{mine}/environ", f"/proc/{mine}/maps",
                                        "/proc/1/cmdline"]).run()
    assert seen == {"/proc/self/status": True, "/proc/SELF/maps": True, "/proc/cpuinfo": True,
                    f"/proc/{mine}/cmdline": False, f"/proc/{mine}/environ": False, f"/proc/{mine}/maps": False,
                    "/proc/1/cmdline": False}


def _orphan_in_fresh_process(pid_file: str) -> str:
    import os
    import time
    if os.fork() == 0:
        os.setpgid(0, 0)               # out of the group the server ends with the task
        if os.fork() == 0:
            with open("left.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename("left.tmp", "left.pid")
            time.sleep(120)
        os._exit(0)
    deadline = time.monotonic() + 60
    while not os.path.exists("left.pid") and time.monotonic() < deadline:
        time.sleep(0.01)
    with open("left.pid") as f:
        return f.read()


def test_the_server_of_fresh_processes_ends_what_a_task_left_out_of_its_group():
    left = int(fresh_process.packed(_orphan_in_fresh_process, "").run())
    deadline = time.monotonic() + 60
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(left), "a process a fresh process left in a group of its own outlived the task"


def test_a_server_that_cannot_start_says_why(tmp_path, monkeypatch):
    """Not a bare ConnectionResetError: the task's error names what the server ended with."""
    broken = tmp_path / "autograder"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('this autograder cannot be imported here')\n")
    monkeypatch.setattr(fresh_process, "_PACKAGE_ROOT", str(tmp_path))
    monkeypatch.setattr(fresh_process, "_SERVER", {})
    try:
        with pytest.raises(fresh_process.FreshProcessError) as raised:
            fresh_process.packed(os.getpid).run(timeout=30)
    finally:
        fresh_process._SERVER.clear()
    message = str(raised.value)
    assert "server of fresh processes has ended" in message
    assert "this autograder cannot be imported here" in message and str(tmp_path) in message


def test_a_fresh_process_killed_mid_task_is_an_error_naming_it():
    def die():
        import os
        import signal
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(fresh_process.FreshProcessError, match="died before reporting back"):
        fresh_process.packed(die).run()
    assert fresh_process.packed(os.getpid).run() != os.getpid()      # the server still serves


def test_a_save_killed_by_its_time_limit_leaves_nothing(tmp_path):
    pid_file = str(tmp_path / "left.pid")

    def leave_and_hang(pid_file):
        _leave_a_process("double fork", pid_file)
        import time
        time.sleep(60)

    with pytest.raises(fresh_process.FreshProcessError, match="did not finish within"):
        fresh_process.in_a_fork(leave_and_hang, pid_file, timeout=3)
    assert not _alive(int(Path(pid_file).read_text())), "what a save left outlived the save's time limit"


_IN_THE_SANDBOX = '''
import os, time

def leave():
    """Leaves a grandchild in a group of its own, and returns its pid."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            os.write(write_end, str(os.getpid()).encode())
            time.sleep(120)
        os._exit(0)
    os.close(write_end)
    return int(os.read(read_end, 32))

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False

def kept_alive():
    return alive(kept)
'''


def test_in_the_sandbox_a_call_leaves_nothing_running_and_a_cell_may():
    """A check's call of the learner's code: what it started is ended before the next operation. A cell
    (the learner's own notebook) may leave a process running, as in a kernel."""
    from autograder.grading.sandbox import Sandbox
    sandbox = Sandbox(cell_seconds=30).start()
    try:
        if sandbox.confinement.get("proc") != "own":
            pytest.skip("the sandbox has no /proc of its own here (no PID namespace)")
        sandbox.request("exec", _IN_THE_SANDBOX, "<answer cell>")
        leave, alive = sandbox.request("lookup", "leave"), sandbox.request("lookup", "alive")
        left = leave()
        assert alive(left) is False, "a process a check's call started outlived the call"
        sandbox.request("exec", "kept = leave()", "<a cell that leaves a process>")
        assert sandbox.request("lookup", "kept_alive")() is True
    finally:
        sandbox.close()
