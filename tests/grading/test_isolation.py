"""Sandboxes side by side: what one submission does cannot reach the next, nor starve it or the grader.

Each test attacks one principle of docs/grading.md ("Trusted grading, what it holds") with real
processes, as root (cgroups per sandbox) and as an ordinary user (RLIMIT_NPROC per user namespace, the
judge's memory watchdog, autogroup), whichever runs the suite: the protections that give it differ, the
outcome must not.
"""

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autograder.grading import protections, scratch
from autograder.grading.sandbox import Limits, Sandbox, SandboxDied, readable_paths
from notebook_files import ROOT


def run(box: Sandbox, source: str):
    """Run a cell; the exception it raised, or None."""
    try:
        box.request("exec", source, "<test>")
    except Exception as exc:          # noqa: BLE001 (the submission's error, rebuilt here)
        return exc
    return None


def value(box: Sandbox, source: str, name: str = "RESULT"):
    error = run(box, source)
    assert error is None, error
    return box.request("lookup", name)


@pytest.fixture()
def two():
    """Two sandboxes graded side by side, with a small ceiling of processes."""
    with Sandbox(Limits(processes=48), cell_seconds=30) as a, Sandbox(Limits(processes=48), cell_seconds=30) as b:
        yield a, b


# ---- 1. no submission changes a classmate's grade or starves the grader ---------------------------------

def test_a_fork_bomb_fills_its_own_ceiling_and_the_classmate_can_still_fork(two):
    a, b = two
    started = value(a, "import os, time\nkids = 0\nwhile True:\n    try:\n        if os.fork() == 0:\n"
                       "            time.sleep(60)\n            os._exit(0)\n        kids += 1\n    except OSError:\n"
                       "        break\nRESULT = kids")
    assert 10 < started < 48, a.confinement["processes"]
    forked = value(b, "import os\nkids = []\nfor _ in range(20):\n    pid = os.fork()\n    if pid == 0:\n"
                      "        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)\nRESULT = len(kids)")
    assert forked == 20


def test_memory_held_by_many_processes_together_is_bounded_per_sandbox(two):
    """Four processes of 700 MB each pass no per-process limit; together they pass this sandbox's bound (1.5
    GiB here, files included): the memory cgroup or the judge's watchdog ends them, and the classmate's
    sandbox runs on."""
    limits = Limits(memory_total_bytes=3 << 29, disk_bytes=128 << 20, shm_bytes=64 << 20, processes=48)
    with Sandbox(limits, cell_seconds=30) as hog:
        hoard = ("import os, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
                 "        block = bytearray(700 << 20)\n        for i in range(0, len(block), 4096):\n"
                 "            block[i] = 1\n        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\n"
                 "ended = [os.waitpid(pid, 0)[1] for pid in kids]\nRESULT = ended")
        try:
            ended = value(hog, hoard)
        except SandboxDied as died:           # the watchdog ends the whole sandbox, and says why
            assert "memory" in str(died) and "GiB" in str(died), died
        else:                                 # the memory cgroup's OOM killer ended some of them
            assert hog.confinement["memory"] == "cgroup"
            assert any(os.WIFSIGNALED(status) for status in ended), ended
    a, b = two
    assert value(b, "RESULT = sum(bytearray(64 << 20))") == 0


def test_a_cpu_spinner_takes_only_its_own_sandboxes_share(two):
    """Eight spinning processes in one sandbox; one in the other. Shared by process, the lone one would get
    an eighth of what the eight get together; shared by sandbox (cpu cgroup or autogroup), about as much."""
    a, b = two
    spin = ("import os, time\nt0 = time.time()\nwhile time.time() - t0 < {seconds}:\n    pass\n")
    run(a, "import os\nSPINNERS = []\nfor _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n"
           + "        " + spin.format(seconds=6).replace("\n", "\n        ") + "os._exit(0)\n    SPINNERS.append(pid)")
    time.sleep(0.5)
    lone = value(b, spin.format(seconds=3) + "RESULT = os.times()[0] + os.times()[1]")
    spinners = value(a, "import os\nwith open(f'/proc/{SPINNERS[0]}/stat') as f:\n    fields = f.read().rsplit(')', 1)[1].split()\n"
                        "RESULT = (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')")
    # One of the eight spun for 3.5 s by now; the lone process spun for 3 s.
    assert lone > 2 * spinners, (lone, spinners, a.confinement["cpu"])


def test_what_a_cell_leaves_running_yields_the_cpu_to_the_checks_after_it(two):
    """Spinners an answer cell forked go on at nice 19; the server, which runs the next exercise's checks,
    stays at 0 (so the spinners cannot cost that exercise its time limit), and so do its probes' forks."""
    a, _ = two
    run(a, "import os, time\nSPINNERS = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
           "        while True:\n            pass\n    SPINNERS.append(pid)")
    nice = value(a, "import os\nRESULT = ([os.getpriority(os.PRIO_PROCESS, pid) for pid in SPINNERS],"
                    " os.getpriority(os.PRIO_PROCESS, 0))")
    assert nice == ([19, 19, 19], 0), nice


def test_what_a_sandbox_prints_or_writes_fills_no_disk_of_the_grader(two):
    _, b = two
    started = time.time()
    with Sandbox(Limits(disk_bytes=64 << 20), cell_seconds=30) as filler:
        if filler.confinement["folders"] != "private tmpfs":
            pytest.skip(f"no tmpfs of its own here: {filler.confinement['folders']}")
        error = run(filler, "import os, sys\nfor _ in range(200):\n    sys.stdout.write('x' * (1 << 20))\n"
                            "with open('filler', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))")
        assert isinstance(error, OSError) and "No space left" in str(error), error
        assert len(filler.watchdog.tail()) <= 64 << 10        # its output: a bounded tail in memory, not a file
        # Neither its 200 MiB of output nor its file landed on the grader's disk. (What else runs here
        # writes to the same disks, so the test looks for the submission's bytes, not at free space.)
        assert not _files_of_x([os.environ.get("TMPDIR", "/tmp"), "/dev/shm", "/var/tmp"], started)
    assert value(b, "open('mine', 'w').write('x')\nRESULT = open('mine').read()") == "x"


def _files_of_x(folders: list, since: float) -> list:
    """Files of 16 MiB or more, changed since ``since``, that begin as the filler's bytes do."""
    found = []
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) and st.st_size >= 16 << 20 and st.st_mtime >= since:
                        with open(path, "rb") as f:
                            if f.read(4096) == b"x" * 4096:
                                found.append(path)
                except OSError:       # another test's file, gone or not ours to read
                    continue
    return found


# ---- 2. nothing of a sandbox outlives it or is shared between sandboxes ----------------------------------

def test_no_channel_between_sandboxes_through_ipc_keyrings_or_sockets(two):
    a, b = two
    refused = value(a, "import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\nRESULT = {}\n"
                       "RESULT['shmget'] = (libc.shmget(0, 1 << 26, 0o1600), ctypes.get_errno())\n"
                       "RESULT['msgget'] = (libc.msgget(0, 0o1600), ctypes.get_errno())\n"
                       "RESULT['add_key'] = (libc.syscall(248 if __import__('platform').machine() == 'x86_64' else 217,"
                       " b'user', b'answer', b'42', 2, -3), ctypes.get_errno())\n"
                       "s = socket.socket(socket.AF_UNIX)\ns.bind(b'\\0handed-to-the-next')\ns.listen()\nKEEP = s")
    assert all(result == -1 and errno == 1 for result, errno in refused.values()), refused   # EPERM each
    reached = run(b, "import socket\nsocket.socket(socket.AF_UNIX).connect(b'\\0handed-to-the-next')")
    assert isinstance(reached, ConnectionRefusedError), reached


def test_only_the_socket_families_grading_needs_can_be_made(two):
    a, _ = two
    made = value(a, "import socket\nRESULT = {}\n"
                    "for name, args in {'unix': (1, 1), 'inet': (2, 1), 'inet6': (10, 1), 'route netlink': (16, 3, 0),"
                    " 'packet': (17, 3, 0), 'vsock': (40, 1), 'bluetooth': (31, 5), 'crypto': (38, 5),"
                    " 'audit netlink': (16, 3, 9), 'raw inet': (2, 3, 1)}.items():\n"
                    "    try:\n        socket.socket(*args).close()\n        RESULT[name] = 'made'\n"
                    "    except OSError as exc:\n        RESULT[name] = exc.errno\n")
    assert [k for k, v in made.items() if v == "made"] == ["unix", "inet", "inet6", "route netlink"], made


def test_a_grader_that_died_leaves_nothing_the_next_run_does_not_remove(tmp_path):
    """A grading process killed with SIGKILL (the OOM killer's way) leaves its sandbox's folder and cgroups;
    the next grading process removes them at its first sandbox, and leaves a live grader's alone."""
    script = ("import os, signal\nfrom autograder.grading.sandbox import Sandbox\n"
              "box = Sandbox().start()\nprint(box.scratch, flush=True)\n"
              "print(' '.join(box._cgroup.values()), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    folder, *groups = ran.stdout.split("\n")[:2]
    groups = groups[0].split() if groups else []
    assert Path(folder).is_dir()
    live = Sandbox().start()            # a live grader's sandbox, in this process
    other = Path(tempfile.mkdtemp(prefix="workbook-judge-"))   # named as another version names it: not ours to judge
    try:
        script = "from autograder.grading.sandbox import Sandbox\nSandbox().start().close()"
        subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)
        assert not Path(folder).exists() and not any(Path(g).exists() for g in groups)
        assert live.scratch.is_dir() and live.alive and other.is_dir()
    finally:
        live.close()
        other.rmdir()


# ---- 6. what comes back is hostile data: bounded, and handled without recursion -------------------------

def test_a_tree_too_deep_is_refused_and_cleaned_up_without_harm():
    with Sandbox(cell_seconds=30) as box:
        run(box, "import os, tempfile\ndef deepen(n):\n    here = os.path.dirname(tempfile.gettempdir())\n"
                 "    os.chdir(here)\n    for _ in range(n):\n        os.mkdir('d')\n        os.chdir('d')\n"
                 "    open('f', 'w').write('x')\n    return n")
        deepen = box.request("lookup", "deepen")
        with box.judge_files_here(), pytest.raises(OSError, match="nested deeper than"):
            deepen(400)
        judge_copy = box.scratch
    assert not judge_copy.exists()


def test_the_judges_own_clean_up_removes_any_depth(tmp_path):
    here = tmp_path / "deep"
    here.mkdir()
    folder = os.open(here, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):           # deeper than os.makedirs (or shutil.rmtree before 3.12) can recurse
        os.mkdir("d", dir_fd=folder)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = inner
    os.close(folder)
    (tmp_path / "outside").write_text("kept")
    os.symlink(tmp_path / "outside", here / "link")
    scratch.remove_tree(str(here))
    assert not here.exists() and (tmp_path / "outside").read_text() == "kept"


# ---- 7. the course folder is never readable from a sandbox, wherever it lies -----------------------------

@pytest.mark.parametrize("where", ["inside the Python installation", "under /opt (root only)"])
def test_a_course_kept_under_a_folder_sandboxes_may_read_stays_unreadable(where):
    base = Path(sys.prefix) if where.startswith("inside") else Path("/opt")
    if not os.access(base, os.W_OK):
        pytest.skip(f"this user cannot make a course folder in {base}")
    course = base / f"workbook-test-course-{os.getpid()}"
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "hidden.py").write_text("# hidden tests")
    try:
        granted = [Path(p) for p in readable_paths((str(course),))]
        assert not any(course == p or course.is_relative_to(p) for p in granted)
        assert any(p.parent == base for p in granted)      # its neighbours are still granted
        with Sandbox(cell_seconds=30, protected=[str(course)]) as box:
            assert box.confinement["course"].startswith("unreadable"), box.confinement["course"]
            error = run(box, f"open({str(course / 'solutions' / 'hidden.py')!r}).read()")
            assert isinstance(error, PermissionError), error
            assert run(box, "import torch, numpy") is None       # the rest of the installation is still there
    finally:
        scratch.remove_tree(str(course))


# ---- 3. a missing protection is never silent ------------------------------------------------------------

def test_the_confinement_line_names_every_protection():
    with Sandbox(cell_seconds=30) as box:
        line = protections.summary(box.confinement)
    for protection in protections.PROTECTIONS:
        assert f"{protection.label}: " in line
    assert protections.missing(box.confinement, parallel=True) == [], line


def test_without_cgroups_or_autogroup_grading_side_by_side_is_refused(monkeypatch):
    """No CPU share per sandbox: refused when submissions are judged side by side. As root without cgroups
    nothing bounds the processes either (root is exempt from RLIMIT_NPROC): refused even one at a time."""
    monkeypatch.setenv("WORKBOOK_SANDBOX_WITHOUT", "cgroups,autogroup")
    with Sandbox(cell_seconds=30) as box:
        confinement = box.confinement
    with pytest.raises(protections.ConfinementRefused, match="CPU: off"):
        protections.enforce(confinement, parallel=True, allow_unconfined=False)
    if os.geteuid() == 0:
        with pytest.raises(protections.ConfinementRefused, match="processes: off"):
            protections.enforce(confinement, parallel=False, allow_unconfined=False)
    else:
        assert protections.enforce(confinement, parallel=False, allow_unconfined=False) == []


@pytest.mark.parametrize("switched_off, named", [("landlock", "files"), ("seccomp", "system calls"),
                                                 ("namespaces", "namespaces")])
def test_a_machine_without_a_protection_is_refused_naming_it(monkeypatch, switched_off, named):
    monkeypatch.setenv("WORKBOOK_SANDBOX_WITHOUT", switched_off)
    with Sandbox(cell_seconds=30) as box:
        confinement = box.confinement
    with pytest.raises(protections.ConfinementRefused, match=f"{named}: off") as refused:
        protections.enforce(confinement, parallel=False, allow_unconfined=False)
    assert "Fix:" in str(refused.value) and "--allow-unconfined" in str(refused.value)
    lacking = protections.enforce(confinement, parallel=False, allow_unconfined=True)
    assert lacking and lacking[0].startswith(f"{named}: off")
