"""The sandbox trusted grading runs submissions in: each confinement, tried for real.

These tests run on Linux with user namespaces and Landlock (this project's CI machines);
where the machine lacks one, the sandbox reports it off and the test that needs it is
skipped with that reason.
"""

import os
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from autograder.grading import wire
from autograder.grading.sandbox import Limits, RemoteObject, Sandbox, SandboxDied
from notebook_files import ROOT


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(cell_seconds=20) as box:
        yield box


def needs(sandbox, part: str):
    state = sandbox.confinement.get(part, "off")
    if state.startswith("off"):
        pytest.skip(f"this machine gives the sandbox no {part} confinement: {state}")


def run(sandbox, source: str):
    """Run a cell in the sandbox; return the exception it raised (None if none)."""
    try:
        sandbox.request("exec", source, "<test>")
    except Exception as exc:       # noqa: BLE001 (the submission's error, rebuilt here)
        return exc
    return None


def test_values_come_back_as_data_and_objects_as_proxies(sandbox):
    run(sandbox, "import numpy as np, torch\n"
                 "def f(w, state):\n    state['t'] += 1\n    state['m'] += 1.0\n"
                 "    return {'w': w * 2, 'spans': [range(0, 4)], 't': torch.arange(3), 'f': f}")
    f = sandbox.request("lookup", "f")
    state = {"t": 0, "m": np.zeros(2)}
    result = f(np.ones(2), state)
    assert np.array_equal(result["w"], [2.0, 2.0]) and result["spans"] == [range(0, 4)]
    assert torch.equal(result["t"], torch.arange(3)) and isinstance(result["f"], RemoteObject)
    assert callable(result["f"]) and not callable(sandbox.request("lookup", "np"))   # as the objects are
    assert state["t"] == 1 and np.array_equal(state["m"], [1.0, 1.0])   # changed in place, as in a kernel


def test_paths_come_back_as_paths_and_warnings_as_warnings(sandbox):
    run(sandbox, "import pathlib, warnings\n"
                 "def g(name):\n    warnings.warn(f'skipped {name}')\n    return pathlib.Path('/x') / name")
    g = sandbox.request("lookup", "g")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert g("a.pt") == Path("/x/a.pt")
    assert [str(w.message) for w in caught] == ["skipped a.pt"]
    with pytest.raises(ValueError):
        wire.decode({"$path": ["not", "text"]}, lambda ref: None)


def test_numpy_scalars_and_zero_d_arrays_keep_their_shape():
    for value in (np.int64(7), np.float32(0.5), np.array(3.0), np.zeros((2, 0))):
        back = wire.decode(wire.encode(value, lambda obj: None), lambda ref: None)
        assert type(back) is type(value) and np.shape(back) == np.shape(value) and back.dtype == value.dtype
    assert f"{wire.decode(wire.encode(np.int64(7), None), None):d}" == "7"     # formats like the number it is


def test_the_wire_refuses_anything_but_data():
    with pytest.raises(ValueError):
        wire.decode({"$ndarray": {"dtype": "O", "shape": [1], "data": ""}}, lambda ref: None)
    with pytest.raises(ValueError):
        wire.decode({"__reduce__": "os.system"}, lambda ref: None)


def test_learner_exceptions_come_back_with_their_type_and_message(sandbox):
    assert isinstance(run(sandbox, "raise NotImplementedError('stub')"), NotImplementedError)
    custom = run(sandbox, "class Oops(Exception):\n    pass\nraise Oops('custom')")
    assert type(custom).__name__ == "Oops" and str(custom) == "custom"


def test_no_network(sandbox):
    needs(sandbox, "namespaces")
    error = run(sandbox, "import socket\nsocket.create_connection(('151.101.0.223', 443), timeout=3)")
    assert isinstance(error, OSError) and "unreachable" in str(error)


def test_loopback_works_inside_for_the_gloo_demos(sandbox):
    needs(sandbox, "namespaces")
    assert run(sandbox, "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
                        "socket.create_connection(s.getsockname(), timeout=3).close()") is None


def test_the_course_folder_is_out_of_reach(sandbox):
    needs(sandbox, "filesystem")
    for path in (ROOT / "solutions", ROOT / "README.md", ROOT / "tests"):
        assert isinstance(run(sandbox, f"open({str(path)!r}).read() if {path.is_file()} else "
                                       f"__import__('os').listdir({str(path)!r})"), PermissionError), path
    assert isinstance(run(sandbox, f"open({str(ROOT / 'escaped.txt')!r}, 'w')"), PermissionError)
    assert isinstance(run(sandbox, "open('/tmp/escaped_from_sandbox.txt', 'w')"), PermissionError)
    assert run(sandbox, "open('mine.txt', 'w').write('its own folder is writable')") is None
    assert run(sandbox, "open('mine.txt').read()") is None
    if sandbox.confinement.get("folders") == "private tmpfs":    # its own tmpfs: nothing of it lands outside
        assert not list(sandbox.scratch.rglob("mine.txt"))


def test_a_memory_bomb_gets_an_error_not_the_machine(sandbox):
    error = run(sandbox, "import torch\nhoard = [torch.empty(1 << 28) for _ in range(100)]")
    assert isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def test_a_fork_bomb_hits_the_ceiling_and_everything_it_started_dies_with_the_sandbox():
    box = Sandbox(Limits(processes=32), cell_seconds=4).start()
    try:
        needs(box, "processes")
        before = time.monotonic()
        with pytest.raises(SandboxDied, match="time limit"):
            box.request("exec", "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                "        time.sleep(0.01)", "<bomb>")
        assert time.monotonic() - before < 15
    finally:
        scratch = str(box.scratch)       # named in a sandbox's command line (its config)
        box.close()
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "autograder.grading"], capture_output=True, text=True).stdout.split()
    survivors = [pid for pid in left if scratch in _command_line(pid)]
    assert survivors == []


def _command_line(pid: str) -> str:
    """A process's command line; empty for one that ended since it was listed (it is no survivor)."""
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pytest.mark.parametrize("source, says", [
    ("import os\nos._exit(3)", "exit code 3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ("while True:\n    pass", "time limit"),
])
def test_ending_or_hanging_the_process_is_reported_and_a_new_sandbox_starts_clean(source, says):
    box = Sandbox(cell_seconds=3).start()
    try:
        with pytest.raises(SandboxDied, match=says):
            box.request("exec", source, "<attack>")
        assert not box.alive
    finally:
        box.close()


def test_patching_shared_code_is_undone_and_reported(sandbox):
    answer = sandbox.raw_request("exec", "import torch, builtins\ntorch.equal = lambda *a: True\n"
                                         "builtins.len = lambda x: 0", "<patch>")
    assert set(answer["tampered"]) == {"torch.equal", "builtins.len"}
    assert run(sandbox, "import torch\nassert not torch.equal(torch.zeros(1), torch.ones(1))\n"
                        "assert len([1, 2]) == 2") is None
    assert sandbox.raw_request("exec", "x = 1", "<clean>")["tampered"] == []


def test_a_probe_runs_as_it_was_before_any_submitted_code(sandbox):
    """A probe trains with Adam and the check module's own helpers: patching either is undone and reported."""
    from autograder import state_dict_aliasing
    from check_outcomes import failure_of
    answer = sandbox.raw_request("exec", "import torch, autograder.state_dict_aliasing as m\n"
                                         "torch.optim.Adam.step = lambda self, closure=None: None\n"
                                         "m._Run.train = lambda self, steps: []\n"
                                         "def snapshot(model, optimizer):\n"
                                         "    return {'model': model.state_dict(), 'optimizer': optimizer.state_dict()}",
                                 "<patch>")
    assert set(answer["tampered"]) == {"torch.optim.Adam.step", "autograder.state_dict_aliasing._Run.train"}
    sandbox.tampered.clear()
    proxy = sandbox.request("lookup", "snapshot")
    assert "changed too" in failure_of(state_dict_aliasing.check_snapshot_state_model, proxy)   # it trained
    assert sandbox.tampered == []


def test_only_probes_of_the_check_modules_run_as_probes(sandbox):
    for module, name in (("autograder.grading.zygote", "zygote"), ("autograder.state_dict_aliasing", "_Run"),
                         ("os", "system")):
        with pytest.raises(LookupError):
            sandbox.request("probe", module, name, sandbox.pickle(((), {})))


def test_the_sandbox_sees_a_scrubbed_environment(sandbox):
    os.environ["WORKBOOK_SECRET_FOR_TEST"] = "hidden"
    box = Sandbox().start()
    try:
        box.request("exec", "import os\nenv = dict(os.environ)", "<env>")
        env = box.request("lookup", "env")
    finally:
        box.close()
        del os.environ["WORKBOOK_SECRET_FOR_TEST"]
    assert "WORKBOOK_SECRET_FOR_TEST" not in env and env["HOME"].rsplit("/", 1)[0] == env["TMPDIR"].rsplit("/", 1)[0]


def test_a_sandbox_forked_by_the_zygote_is_confined_like_one_started_afresh(sandbox, monkeypatch):
    from autograder.grading import zygote as sandbox_zygote
    if not sandbox_zygote.available():
        pytest.skip("no zygote on this platform: every sandbox starts afresh")
    assert isinstance(sandbox.process, sandbox_zygote.Child)
    monkeypatch.setattr(sandbox_zygote, "available", lambda: False)
    with Sandbox(cell_seconds=20) as fresh:
        assert not isinstance(fresh.process, sandbox_zygote.Child)
        # The same protections; what Python and torch map at start differs by a few pages between the two.
        assert {k: v for k, v in fresh.confinement.items() if k != "mapped"} == \
            {k: v for k, v in sandbox.confinement.items() if k != "mapped"}
        assert all(256 << 20 < box.confinement["mapped"] < 8 << 30 for box in (fresh, sandbox))
        assert run(fresh, "import os\nos.getcwd()") is None
        assert fresh.request("lookup", "os").__class__ is RemoteObject


def test_graders_forked_later_share_the_zygote_and_see_their_sandbox_end():
    from autograder.grading import sandbox, zygote as sandbox_zygote
    if not sandbox_zygote.available():
        pytest.skip("no zygote on this platform")
    sandbox.warm_up()
    parent = sandbox_zygote._zygote["pid"]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            box = Sandbox(cell_seconds=20).start()
            shared = sandbox_zygote._zygote.get("pid") == parent
            try:
                box.request("exec", "import os\nos._exit(3)", "<ends>")
            except SandboxDied as died:
                os.write(write, f"{shared} {died}".encode())
            box.close()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as said:
        message = said.read()
    assert message.startswith("True ") and "exit code 3" in message, message


def test_a_submission_cannot_reach_the_zygote():
    # The zygote forks unconfined processes on request: a sandbox must have no way to send it one.
    # It has no path to connect to; its sockets cannot be opened through /proc or taken with pidfd_getfd.
    with Sandbox(cell_seconds=20) as fresh:        # fresh: no socket that an earlier test's code opened
        _try_to_reach_the_zygote(fresh)


def _try_to_reach_the_zygote(sandbox):
    run(sandbox, """
import ctypes, os
found, reached = [], []
libc = ctypes.CDLL(None, use_errno=True)
for fd in os.listdir('/proc/self/fd'):             # nothing of the zygote's was left open in here
    try:
        if os.readlink(f'/proc/self/fd/{fd}').startswith('socket:'):
            reached.append(f'inherited {fd}')
    except OSError:
        pass
mine = {os.getpid(), os.getppid(), 1}               # itself, and the init it sees: not the zygote
for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine]:
    try:
        if b'--zygote' not in open(f'/proc/{pid}/cmdline', 'rb').read():
            continue
    except OSError:
        continue
    found.append(pid)
    for fd in range(64):
        try:
            os.close(os.open(f'/proc/{pid}/fd/{fd}', os.O_RDWR))
            if os.readlink(f'/proc/{pid}/fd/{fd}').startswith('socket:'):
                reached.append(f'open {fd}')
        except OSError:
            pass
        try:
            pidfd = os.pidfd_open(int(pid))
        except OSError:
            continue
        got = libc.syscall(438, pidfd, fd, 0)          # pidfd_getfd
        if got >= 0:
            reached.append(f'pidfd_getfd {fd}')
        os.close(pidfd)
""")
    from autograder.grading import zygote as sandbox_zygote
    if not isinstance(sandbox.process, sandbox_zygote.Child):
        pytest.skip("no zygote on this platform")
    if sandbox.confinement.get("proc") == "own":     # its own /proc: no other process is even listed
        assert sandbox.request("lookup", "found") == []
    else:
        assert sandbox.request("lookup", "found"), "the attack did not even find the zygote: it tests nothing"
    assert sandbox.request("lookup", "reached") == []


def test_sandboxes_forked_once_the_zygote_idled_have_torch_dynamo_imported_already(sandbox):
    # torch.optim imports torch._dynamo on an optimizer's first step (1.3 s). The zygote imports it once,
    # while no request waits, so that every later sandbox of a class grading skips it.
    from autograder.grading import zygote as sandbox_zygote
    if not sandbox_zygote.available():
        pytest.skip("no zygote on this platform")
    deadline = time.monotonic() + 60
    while True:
        with Sandbox(cell_seconds=20) as box:
            assert run(box, "import sys\nwarm = 'torch._dynamo' in sys.modules") is None
            if box.request("lookup", "warm") is True:
                break
        assert time.monotonic() < deadline, "no sandbox found torch._dynamo imported within a minute"
        time.sleep(0.5)


def test_sandboxes_share_no_dev_shm_and_see_no_other_process():
    """A file one sandbox leaves in /dev/shm is not there for the next (no channel between students, no
    memory outside its limits), and /proc lists its own processes only (no other command line)."""
    with Sandbox(cell_seconds=20) as first, Sandbox(cell_seconds=20) as second:
        needs(first, "namespaces")
        assert run(first, "open('/dev/shm/left_for_the_next', 'w').write('answers')") is None
        assert run(second, "import os\nshm = os.listdir('/dev/shm')\n"
                           "cmdlines = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]") is None
        assert second.request("lookup", "shm") == []
        assert not Path("/dev/shm/left_for_the_next").exists()
        seen = second.request("lookup", "cmdlines")
        assert seen and all(b"pytest" not in c and b"--zygote" not in c.split(b"\0")[1:2] for c in seen), seen
        assert len(seen) <= 3      # its init, its server, and the process reading


def test_a_reply_built_to_swell_in_the_grader_is_refused_before_it_is_built(sandbox):
    """32 MiB of nested empty lists decoded to 1.5 GiB in the grading process; now it is refused at once."""
    import tracemalloc
    run(sandbox, "import gc, os, struct\n"     # its reply written by hand
                 "def swell():\n"
                 "    server = next(o for o in gc.get_objects() if type(o).__name__ == 'Server' and hasattr(o, 'response_fd'))\n"
                 "    blob = b'{\"value\":[' + b'[],' * 11_000_000 + b'[]]}'\n"
                 "    os.write(server.response_fd, struct.pack('>Q', len(blob)) + blob)\n")
    tracemalloc.start()
    try:
        with pytest.raises(SandboxDied, match="unreadable"):
            sandbox.request("lookup", "swell")()
        grew = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert grew < 200 << 20, f"the grader grew by {grew >> 20} MiB"
    with Sandbox(cell_seconds=20) as box:
        run(box, "def endless():\n    return range(10 ** 15)\nclass Huge:\n    def __len__(self):\n        return 10 ** 15\n"
                 "huge = Huge()")
        with pytest.raises(SandboxDied, match="will not read"):
            box.request("lookup", "endless")()
    with Sandbox(cell_seconds=20) as box:
        run(box, "class Huge:\n    def __len__(self):\n        return 10 ** 15\nhuge = Huge()")
        with pytest.raises(ValueError, match="claims a length"):
            len(box.request("lookup", "huge"))


LINKS = """
import os, threading, time
targets = ['/proc/self/cwd/gradebook.db', '/proc/self/cwd', '/proc/1/cwd', {canary!r}, '/proc/self/root/tmp']
def plant(folder):
    for name in ['checkpoint.pt', 'model.pt', 'notes.txt', 'result.pt', 'moved', 'written', 'x.tmp']:
        for i, target in enumerate(targets):
            try:
                os.symlink(target, os.path.join(folder, name if i == 0 else f'{{name}}{{i}}'))
            except OSError:
                pass
def keep_planting(root):
    while True:
        for folder, dirs, files in os.walk(root):
            plant(folder)
        time.sleep(0.001)
def save(path, data):
    plant(os.path.dirname(path))
    with open(path + '.real', 'wb') as f:
        f.write(data)
    return sorted(os.listdir(os.path.dirname(path)))
"""


def test_the_judge_never_follows_a_link_the_sandbox_plants(tmp_path):
    """Links planted at every name a check uses (and by a thread that keeps planting) point at the course's
    gradebook, the grader's own folders and a canary outside: the judge's copy of the check's folder holds
    none of them, and what the judge writes there and reads back touches nothing outside."""
    canary = tmp_path / "canary"
    canary.write_text("untouched")
    with Sandbox(cell_seconds=20) as box:
        run(box, LINKS.format(canary=str(canary)) + f"threading.Thread(target=keep_planting, args=({str(box.scratch)!r},), "
                                                    f"daemon=True).start()")
        save = box.request("lookup", "save")
        with box.judge_files_here():
            import tempfile
            folder = tempfile.mkdtemp()
            path = os.path.join(folder, "checkpoint.pt")
            Path(folder, "notes.txt").write_text("the judge's own file")
            listed = save(path, b"written in the sandbox")
            # What the sandbox listed had the links; the judge's copy has only folders and regular files.
            assert "checkpoint.pt" in listed and "model.pt1" in listed or box.confinement.get("folders") != "private tmpfs"
            for dirpath, dirs, files in os.walk(box.scratch):
                for name in dirs + files:
                    assert not os.path.islink(os.path.join(dirpath, name)), name
            assert Path(folder, "checkpoint.pt.real").read_bytes() == b"written in the sandbox"
            assert not Path(path).exists()          # the link that stood there is no file for the check
            # The judge writes where a link stood, and the sandbox's next copy brings none back. (The copy
            # into the sandbox never replaces an entry: when the planting thread wins the race for the
            # name there, the call fails with FileExistsError, the submission's own doing, and follows
            # nothing.)
            Path(path).write_text("the judge writes its own file")
            try:
                save(path, b"again")
            except FileExistsError:
                pass
            assert Path(path).read_text() != "" and not os.path.islink(path)
    assert canary.read_text() == "untouched"
