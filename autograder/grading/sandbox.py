"""A confined process for a submission's code, driven from the judge (the grading process).

The judge sends requests (pickled: the judge is trusted, so the sandbox may unpickle what
it sends) and reads answers in ``autograder.grading.wire`` JSON (it never unpickles what the
sandbox wrote). Every request has a deadline; past it, or when the sandbox dies, the
whole sandbox (every process it started) is killed and the caller gets ``SandboxDied``
with a message for the learner. How the sandbox confines itself: ``confine``; its side of the conversation: ``server``.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import io
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import autograder
from autograder.grading import cgroups, layout, scratch, server, wire
from autograder.grading import zygote as sandbox_zygote
from autograder.grading.watchdog import Watchdog

PACKAGE_DIR = Path(autograder.__file__).resolve().parent
MAX_ANSWER_BYTES = 64 << 20     # a reply's JSON (the files a call hands back come apart: autograder.grading.scratch)
# What a sandbox may read besides the Python installation and the autograder package: the system's
# libraries and settings, its own /proc, the devices, and of /sys what describes the hardware (torch and
# OpenBLAS read the CPU topology, gloo the PCI devices) but not /sys/fs, where every sandbox's cgroup
# figures (one sandbox could read what another does) or /sys/kernel.
_SYSTEM_READABLE = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc",
                    "/sys/devices", "/sys/bus", "/sys/class", "/dev"]


@dataclasses.dataclass(frozen=True)
class Limits:
    memory_bytes: int = 3 << 30       # address space a process may map beyond what Python and torch map at start
    processes: int = 128              # a fork bomb stops here
    file_bytes: int = 1 << 30         # largest file it may write
    cpu_seconds: int = 900
    open_files: int = 1024
    memory_total_bytes: int = 6 << 30  # all its processes together, its tmpfs files included (memory cgroup;
                                       # without one, the judge's watchdog bounds what its processes hold)
    disk_bytes: int = 1 << 30         # its tmpfs: home, temp folder and the check's scratch folders
    shm_bytes: int = 512 << 20        # its own /dev/shm (DataLoader workers pass tensors through it)


class SandboxDied(BaseException):
    """The sandbox ended or was stopped; the message is for the learner.

    A BaseException, like KeyboardInterrupt, so that a check's ``except Exception`` around a
    call into the submission does not take it for the submission's own error and go on."""


class LearnerError(Exception):
    """An exception raised by submitted code, of a type the judge does not rebuild."""


def learner_exception(described: dict) -> BaseException:
    name, message = described.get("type", "Exception"), described.get("message", "")
    cls = getattr(builtins, name, None) if described.get("builtin") else None
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not StopIteration:
        try:
            return cls(message)
        except Exception:          # noqa: BLE001 (e.g. UnicodeDecodeError needs more arguments)
            pass
    return type(name, (LearnerError,), {})(message)


class RemoteObject:
    """Stands for an object that lives in the sandbox: attribute reads, calls and a few builtins go there."""

    def __init__(self, sandbox: "Sandbox", ref: int, type_name: str):
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type_name", type_name)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = self._sandbox.request("getattr", self._ref, name)
        if isinstance(value, RemoteObject) and value._type_name == "method":
            object.__setattr__(self, name, value)     # a bound method stays the same: ask once
        return value

    def __setattr__(self, name: str, value) -> None:
        self._sandbox.request("setattr", self._ref, name, self._sandbox.pickle(value))

    def __len__(self) -> int:
        n = self._sandbox.request("builtin", self._ref, "len")
        if not (type(n) is int and 0 <= n <= wire.MAX_ITEMS):     # a check may loop over it
            raise ValueError(f"the submission's {self._type_name} claims a length of {n!r:.40}")
        return n

    def __bool__(self) -> bool:
        return self._sandbox.request("builtin", self._ref, "bool")

    def __iter__(self):
        return iter(self._sandbox.request("builtin", self._ref, "list"))

    def __repr__(self) -> str:
        return self._sandbox.request("builtin", self._ref, "repr")

    def __reduce__(self):
        raise TypeError(f"a {self._type_name} from the submission cannot leave its sandbox")

    def _remote_type_name(self) -> str:
        return self._type_name


class RemoteCallable(RemoteObject):
    """A proxy for a callable object: only these answer ``callable()`` as the object itself would."""

    def __call__(self, *args, **kwargs):
        return self._sandbox.call(self._ref, args, kwargs)


class Sandbox:
    """One confined Python process (and everything it starts) with its own working directory."""

    def __init__(self, limits: Limits = Limits(), cell_seconds: float = 60, protected: list[str] = ()):
        self.limits = limits
        self.cell_seconds = cell_seconds
        self.protected = list(dict.fromkeys([str(Path(p).resolve()) for p in protected] + default_protected()))
        self.scratch: Path | None = None   # the judge's own folder for a check's files (see autograder.grading.scratch)
        self._synced: list = []            # the scratch folder as the sandbox last saw it
        self.process: subprocess.Popen | sandbox_zygote.Child | None = None
        self.confinement: dict = {}
        self._cgroup: dict[str, str] | None = None
        self.deadline: float | None = None
        self.tampered: list[str] = []    # shared code the submission changed (and the sandbox put back)
        self.watchdog: Watchdog | None = None
        self.ended_by: str | None = None  # why the judge ended it (the watchdog's reason), for its report
        self._lock = threading.Lock()     # the watchdog and the judge both may end the process

    # life cycle
    def start(self, timeout: float = 60) -> "Sandbox":
        try:
            return self._start(timeout)
        except BaseException:          # nothing of a sandbox that did not start is left: process, thread, folders
            self.close()
            raise

    def _start(self, timeout: float) -> "Sandbox":
        _sweep_once()
        self.scratch = Path(tempfile.mkdtemp(prefix=f"workbook-judge-{cgroups.owner_tag()}-")).resolve()
        self._synced = []
        self.ended_by = None
        # The sandbox's home and temp folder lie beside the check's folders, on the one tmpfs it gets there:
        # a temp file renamed into a check's folder stays on one file system, as /tmp is in a kernel.
        home, tmp = self.scratch / scratch.HOME, self.scratch / scratch.TMP
        for folder in (home, home / "mpl", tmp):
            folder.mkdir()
        without = without_protections()
        self._cgroup = {} if "cgroups" in without else cgroups.make(self.limits.processes, self.limits.memory_total_bytes)
        request_r, self._request_w = os.pipe()
        self._response_r, response_w = os.pipe()
        log_r, log_w = os.pipe()       # its output: drained into a bounded tail by the watchdog, never a file
        watched = None if "memory" in self._cgroup or "watchdog" in without else (
            self.limits.memory_total_bytes - self.limits.disk_bytes - self.limits.shm_bytes)
        self.watchdog = Watchdog(log_r, self._end, watched)
        self.watchdog.start()
        config = {"limits": dataclasses.asdict(self.limits), "cgroup": self._cgroup,
                  "scratch": str(self.scratch), "protected": self.protected, "without": sorted(without),
                  "readable": readable_paths(tuple(self.protected)) + [layout.import_root()],
                  "writable": ["/dev/shm", "/dev/null"]}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
               "TMPDIR": str(tmp), "MPLCONFIGDIR": str(home / "mpl"), "MPLBACKEND": "Agg",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": layout.import_root(), "PYTHONWARNINGS": "ignore"}
        try:
            if sandbox_zygote.available():     # forked from a process that imported torch: 2 s sooner
                self.process = sandbox_zygote.spawn(config, env, home, request_r, response_w, log_w)
            else:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "autograder.grading.server", str(request_r), str(response_w),
                     json.dumps(config)], cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=log_w,
                    stderr=subprocess.STDOUT, pass_fds=(request_r, response_w), start_new_session=True)
        finally:
            for fd in (request_r, response_w, log_w):
                os.close(fd)
        self.watchdog.root = self.process.pid
        try:
            ready = self._receive(time.monotonic() + timeout)["ready"]
        except SandboxDied as exc:
            tail = self.watchdog.tail().strip().splitlines()[-3:]
            raise SandboxDied(f"the sandbox did not start: {exc}" + (f" (it printed: {' / '.join(tail)})"[:600]
                                                                     if tail else "")) from None
        self.confinement = dict(ready)
        if watched is not None and self.confinement.get("memory") != "cgroup":
            self.confinement["memory"] = (f"watchdog (the judge ends it past {watched / 2**30:.1f} GiB; "
                                          f"no memory cgroup)")
        return self

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.process is not None:
            with self._lock:
                if self.process.poll() is None:
                    self.process.kill()      # its init dies with it (PDEATHSIG), and the namespace with the init
            self.process.wait()
            for fd in (self._request_w, self._response_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.process = None
        if self.watchdog is not None:
            self.watchdog.join()
            self.watchdog = None
        if self._cgroup:
            cgroups.remove(self._cgroup)
            self._cgroup = None
        if self.scratch is not None:
            scratch.remove_tree(str(self.scratch))
        self.scratch = None

    def _end(self, why: str) -> None:
        """The watchdog's way to end the sandbox (from its thread): the reason goes in the report."""
        with self._lock:
            if self.process is not None and self.process.poll() is None:
                self.ended_by = why
                self.process.kill()

    def __enter__(self) -> "Sandbox":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def judge_files_here(self):
        """Temporary folders the judge makes during a check go in its scratch folder, which calls and probes
        hand over to the sandbox (and back) as copies."""
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            # torch's first optimizer step here makes its compiler cache folder under the temp folder of the
            # moment: fix it where it would be anyway, so it never lands among the check's files.
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = default_cache_dir()
        saved = tempfile.tempdir
        tempfile.tempdir = str(self.scratch)
        try:
            yield
        finally:
            tempfile.tempdir = saved

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # requests
    def pickle(self, value) -> bytes:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = lambda obj: ("ref", obj._ref) if isinstance(obj, RemoteObject) else None
        pickler.dump(value)
        return buffer.getvalue()

    def request(self, op: str, *args, timeout: float | None = None):
        """Send one request; return its decoded value or raise the learner's exception."""
        answer = self.raw_request(op, *args, timeout=timeout)
        if "raised" in answer:
            raise learner_exception(answer["raised"]) from None
        return self.decode(answer.get("value"))

    def raw_request(self, op: str, *args, timeout: float | None = None) -> dict:
        if not self.alive:
            raise SandboxDied("the sandbox is not running")
        handing = op in ("call", "probe")
        if handing:      # the check's files, as the sandbox must see them, when they changed here
            now = scratch.fingerprint(str(self.scratch))
            args = (*args, scratch.pack(str(self.scratch)) if now != self._synced else None)
        blob = pickle.dumps((op, *args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            os.write(self._request_w, struct.pack(">Q", len(blob)))
            view = memoryview(blob)
            while view:
                view = view[os.write(self._request_w, view):]
        except OSError:
            raise self._died() from None
        if timeout is None:
            timeout = self.cell_seconds if self.deadline is None else self.deadline - time.monotonic()
        answer = self._receive(time.monotonic() + max(timeout, 0.1))
        self.tampered += answer.get("tampered", [])
        if handing:      # the sandbox holds our copy now, or it handed back its own
            if "scratch" in answer:
                scratch.unpack(str(self.scratch), answer.pop("scratch"), answer.pop("$blobs"))
                now = scratch.fingerprint(str(self.scratch))
            self._synced = now
        return answer

    def call(self, ref: int, args: tuple, kwargs: dict):
        """Call a sandbox object; arguments it changed in place (dicts, lists, arrays, tensors) change here too."""
        answer = self.raw_request("call", ref, self.pickle((args, kwargs)))
        if "raised" not in answer:
            for key, encoded in answer.get("changed", []):
                target = args[key] if isinstance(key, int) else kwargs[key]
                _update_in_place(target, self.decode(encoded))
        return self._returned(answer)

    def probe(self, probe, args: tuple, kwargs: dict):
        """Run a check module's ``probe_...`` function in the sandbox on these arguments; return what it
        returned, as data. The sandbox runs its own copy of the probe, as it was before any submitted code."""
        return self._returned(self.raw_request("probe", probe.__module__, probe.__name__, self.pickle((args, kwargs))))

    def _returned(self, answer: dict):
        """What a call or a probe returned; the learner's exception raised, and its warnings given, here."""
        if "died" in answer:      # the probe's own process ended; the sandbox is still there
            raise SandboxDied(str(answer["died"]))
        if "raised" in answer:
            raise learner_exception(answer["raised"]) from None
        for message in answer.get("warnings", []):
            warnings.warn(str(message), UserWarning, stacklevel=3)   # as if the call had warned here
        return self.decode(answer.get("value"))

    def decode(self, data):
        def proxy(ref: dict) -> RemoteObject:
            kind = RemoteCallable if ref.get("callable") is True else RemoteObject
            return kind(self, int(ref["$ref"]), str(ref.get("type", "object")))

        try:
            return wire.decode(data, proxy)
        except (ValueError, TypeError, KeyError, RecursionError, MemoryError) as exc:
            self.close_process()
            raise SandboxDied(f"it answered with something the grader will not read ({exc})"[:300]) from None

    def _receive(self, deadline: float) -> dict:
        header = self._read(8, deadline)
        (size,) = struct.unpack(">Q", header)
        if size > MAX_ANSWER_BYTES:
            self.close_process()
            raise SandboxDied(f"the submission's answer was too large ({size / 2**20:.0f} MiB)")
        try:
            answer = wire.loads(self._read(size, deadline))
            if not isinstance(answer, dict):
                raise ValueError("not an answer")
            files = answer.get("scratch")
            if files is not None:
                if (not isinstance(files, list) or len(files) > scratch.MAX_ENTRIES
                        or not all(isinstance(e, list) and len(e) == 4 and e[1] in ("dir", "file")
                                   and isinstance(e[0], str) and e[0].count("/") < scratch.MAX_DEPTH for e in files)):
                    raise ValueError("not a folder listing")
                answer["$blobs"], total = [], 0
                for _ in [e for e in files if e[1] == "file"]:
                    (size,) = struct.unpack(">Q", self._read(8, deadline))
                    total += size
                    if total > scratch.MAX_BYTES:
                        self.close_process()
                        raise SandboxDied(f"the files it handed back were too large (over "
                                          f"{scratch.MAX_BYTES >> 20} MiB)")
                    answer["$blobs"].append(self._read(size, deadline))
            return answer
        except (ValueError, RecursionError, MemoryError):
            self.close_process()
            raise SandboxDied("the submission wrote something unreadable into the grader's channel") from None

    def _read(self, n: int, deadline: float) -> bytes:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._response_r], [], [], left)[0]:
                self.close_process()
                raise SandboxDied(f"it ran past its time limit ({self.cell_seconds:g} s for a cell) and was "
                                  f"stopped: an endless loop, or far too much work?")
            chunk = os.read(self._response_r, min(n, 1 << 20))
            if not chunk:
                raise self._died()
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close_process(self) -> None:
        if self.process is not None:
            with self._lock:
                if self.process.poll() is None:
                    self.process.kill()
            self.process.wait()

    def _died(self) -> SandboxDied:
        if self.process is None:
            return SandboxDied("the sandbox is not running")
        ending = server.ending(self.process.wait())
        return SandboxDied(f"{self.ended_by}, so the grader ended it" if self.ended_by else ending)


def warm_up(protected: list[str] = ()) -> dict:
    """Start a sandbox once (and with it the zygote, which grading processes forked after this share);
    what confines it here, as its report says (``autograder.grading.protections`` reads it)."""
    box = Sandbox(protected=protected).start()
    try:
        return box.confinement
    finally:
        box.close()


def _update_in_place(target, value) -> None:
    if isinstance(target, dict) and isinstance(value, dict):
        target.clear()
        target.update(value)
    elif isinstance(target, list) and isinstance(value, list):
        target[:] = value
    elif isinstance(target, np.ndarray) and isinstance(value, np.ndarray) and target.shape == value.shape:
        target[...] = value
    elif isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor) and target.shape == value.shape:
        with torch.no_grad():
            target.copy_(value)


WITHOUT = "WORKBOOK_SANDBOX_WITHOUT"
KNOWN_WITHOUT = ("cgroups", "watchdog", "autogroup", "namespaces", "landlock", "seccomp")


def without_protections() -> set[str]:
    """Protections the grader's environment switches off (``WORKBOOK_SANDBOX_WITHOUT=landlock,seccomp``), so
    an instructor can see what grading does on a machine that lacks them (it refuses, or with
    --allow-unconfined records it): the tests use it too. A submission cannot set the grader's environment."""
    asked = {part.strip() for part in os.environ.get(WITHOUT, "").split(",") if part.strip()}
    unknown = asked - set(KNOWN_WITHOUT)
    if unknown:
        raise ValueError(f"{WITHOUT}: unknown protections {sorted(unknown)} (known: {', '.join(KNOWN_WITHOUT)})")
    return asked


def default_protected() -> list[str]:
    """What no sandbox may read, whatever else the caller names: this course's sources (with the hidden
    tests), and the folder grading runs in (nbgrader's course folder: the gradebook, the submissions)."""
    from autograder.course import SOLUTIONS_DIR
    return [str(p) for p in dict.fromkeys((SOLUTIONS_DIR.resolve(), Path.cwd().resolve()))]


@functools.lru_cache(maxsize=16)     # the same course is graded many times over; /etc does not change meanwhile
def readable_paths(protected: tuple = ()) -> list[str]:
    """The folders a sandbox may read: the system's, the Python installation's and the autograder package,
    none of which may hold a protected path. Where one does (a course kept under /opt, or inside the Python
    installation's folder), that folder is granted child by child, leaving out each branch that leads to a
    protected path."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                str(Path(sys.executable).resolve().parent.parent)}
    # What the grader imports from may lie outside its prefixes: a user's site-packages, a folder a .pth
    # file adds. The sandbox imports the same, so it reads the same (still never a protected path).
    imported = [entry for entry in sys.path if os.path.isabs(entry) and os.path.isdir(entry)
                and Path(entry).name in ("site-packages", "dist-packages")]
    wanted = _SYSTEM_READABLE + sorted(prefixes) + [str(PACKAGE_DIR)] + imported
    guarded = [Path(p) for p in protected]
    granted: list[str] = []
    for path in dict.fromkeys(wanted):
        for folder in _around(Path(path), guarded):
            # As root a sandbox is root in its namespace (without capabilities): it owns root's files. Of the
            # folders any machine keeps secrets in, it gets what every user may read, not /etc/shadow.
            granted += _world_readable(Path(folder)) if os.geteuid() == 0 and path in _SETTINGS else [folder]
    return list(dict.fromkeys(granted))


_SETTINGS = ("/etc", "/opt")


def _world_readable(path: Path, depth: int = 0) -> list[str]:
    """``path`` if every user may read it and all below it; else the parts below that every user may read."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    if not path.is_dir():
        return [str(path)] if mode & 0o004 else []
    if mode & 0o005 != 0o005 or depth > 8:
        return []
    try:
        children = sorted(path.iterdir())
    except OSError:
        return []
    parts = [_world_readable(child, depth + 1) for child in children]
    if all(part == [str(child)] for part, child in zip(parts, children)):
        return [str(path)]
    return [p for part in parts for p in part]


def _around(folder: Path, guarded: list[Path]) -> list[str]:
    """``folder``, or, where a guarded path lies in it (or is it), its children but that branch, recursively."""
    inside = [g for g in guarded if g == folder or folder in g.parents]
    if not inside:
        return [str(folder)]
    if any(g == folder for g in inside) or not folder.is_dir() or folder.is_symlink():
        return []
    granted = []
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return []
    for child in children:
        granted += _around(child, inside)
    return granted


_swept: list[int] = []


def _sweep_once() -> None:
    """Once per grading process: remove what graders that died left behind (and groups still pending)."""
    if os.getpid() not in _swept:
        _swept.append(os.getpid())
        cgroups.sweep()
