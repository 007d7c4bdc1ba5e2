"""The sandbox's side: confine this process, then run what the judge asks, and nothing else.

Started by ``autograder.grading.sandbox.Sandbox`` as ``python -m autograder.grading.server REQ RESP
CONFIG``, or forked by the zygote (``autograder.grading.zygote``) and then run the same way. It confines
itself first (``autograder.grading.confine``); then a tiny init (PID 1 of the namespace) starts the
server process, which runs cells and calls in a fresh ``__main__`` module and answers in
``autograder.grading.wire`` JSON.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import pickle
import signal
import struct
import sys
import time
import types
import warnings

from autograder.course import CHECK_MODULES, CHECK_SUPPORT
from autograder.grading.confine import PR_SET_PDEATHSIG, _libc, confine, confine_init, exit_code


# ---- the two small parents: this process and the namespace's init -----------------------------------

def _exit_like(status: int) -> None:
    os._exit(exit_code(status))


def _init(serve, config: dict, report: dict) -> None:
    """PID 1 of the namespace: confine the rest, start the server, reap orphans, and end (taking all with
    it) when it ends."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    confine_init(config, report)
    server = os.fork()
    if server == 0:
        serve()
        os._exit(0)
    while True:
        pid, status = os.wait()
        if pid == server:
            _exit_like(status)


# ---- the server ------------------------------------------------------------------------------------

# Shared code a submission may use but must not change. Around everything the submission runs, the
# server compares these modules (and a few classes) with how they were before any submitted code ran,
# puts back whatever was replaced, patched or re-coded, and reports it.
GUARDED_MODULES = ("builtins", "math", "random", "operator", "functools", "itertools", "collections", "io", "json",
                   "base64", "struct", "os", "hashlib", "pickle", "contextlib", "warnings", "numpy", "numpy.random",
                   "numpy.testing", "torch", "torch.nn", "torch.nn.functional", "torch.optim", "torch.utils.data",
                   "torch.testing", *CHECK_SUPPORT, *CHECK_MODULES,
                   # the engine's own code that runs here
                   "autograder.grading.wire", "autograder.grading.scratch", "autograder.grading.server",
                   "autograder.grading.confine")
GUARDED_CLASSES = (("torch", "Tensor"), ("numpy", "ndarray"))
# ... and every class these modules hold: the models, optimizers and loaders a probe trains with, and
# the check modules' own helpers (a probe that trains a model must not find Adam.step made a no-op).
CLASSES_OF = ("torch.nn", "torch.optim", "torch.optim.lr_scheduler", "torch.utils.data", "torch.amp",
              *(name for name in GUARDED_MODULES if name.startswith("autograder.")))
_SKIPPED = {"environ", "__warningregistry__", "_onceregistry", "filters", "_filters_mutated_lock_held"}


class Pristine:
    """What the guarded modules held before any submitted code ran."""

    def __init__(self, server):
        import importlib
        import operator
        self.modules = {name: importlib.import_module(name) for name in GUARDED_MODULES}
        owners = list(self.modules.items()) + [(f"{m}.{c}", getattr(self.modules[m], c)) for m, c in GUARDED_CLASSES]
        for name in CLASSES_OF:
            module = importlib.import_module(name)
            owners += [(f"{name}.{attr}", value) for attr, value in sorted(vars(module).items())
                       if isinstance(value, type) and not attr.startswith("__")]
        owners += [("server", server), ("Server", type(server))]
        self.names = {label: (owner, dict(vars(owner))) for label, owner in owners}
        self.code = {(label, attr): (value, value.__code__) for label, (_, names) in self.names.items()
                     for attr, value in names.items() if isinstance(getattr(value, "__code__", None), types.CodeType)}
        # The quick test runs after every request, so it uses no name a submission could replace.
        self._list, self._map, self._id, self._vars = list, map, id, vars
        self._code_of = operator.attrgetter("__code__")
        self._dicts = [vars(owner) for owner, _ in self.names.values()]
        self._ids = [list(map(id, d.values())) for d in self._dicts]
        self._functions = [function for function, _ in self.code.values()]
        self._codes = [code for _, code in self.code.values()]
        self._module_list = list(self.modules.items())
        # Importing torch._dynamo (the first optimizer does) wraps a few torch functions in this wrapper.
        self._dynamo_wrapper = self.modules["torch"]._disable_dynamo(lambda: None).__code__
        # The first optimizer of a class wraps its class's step in this profiling hook.
        self._step_hook = self.modules["torch.optim"].Optimizer.profile_hook_step(lambda: None).__code__

    def unchanged(self) -> bool:
        listed, mapped, ident = self._list, self._map, self._id
        return ([sys.modules.get(name) is module for name, module in self._module_list].count(False) == 0
                and [listed(mapped(ident, d.values())) for d in self._dicts] == self._ids
                and listed(mapped(self._code_of, self._functions)) == self._codes)

    def restore(self) -> list[str]:
        """Put back every guarded name that changed; return what changed."""
        if self.unchanged():
            return []
        changed = []
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(f"sys.modules[{name!r}]")
        for label, (owner, names) in self.names.items():
            now = self._vars(owner)
            for attr, value in names.items():
                current = now.get(attr, _MISSING)
                if attr in _SKIPPED or current is value:
                    continue
                if self._torch_wrapped(current, value):
                    names[attr] = current      # torch's own doing: the wrapped original is the new normal
                    continue
                changed.append(f"{label}.{attr}")
                try:
                    setattr(owner, attr, value)
                except (AttributeError, TypeError):
                    pass
            if isinstance(owner, type):
                # A name added to a class can shadow one it inherits (Adam.zero_grad over Optimizer's):
                # classes gain none of their own, so every addition goes. Modules do (imports add them).
                # Python caches a few plain values on a class when asked (__slotnames__, __annotations__).
                added = [a for a, v in now.items() if a not in names and a not in _SKIPPED
                         and not (a.startswith("__") and a.endswith("__") and not callable(v))]
                for attr in added:
                    changed.append(f"{label}.{attr}")
                    try:
                        delattr(owner, attr)
                    except (AttributeError, TypeError):
                        pass
        for (label, attr), (function, code) in self.code.items():
            if function.__code__ is not code:
                function.__code__ = code
                changed.append(f"{label}.{attr}.__code__")
        self._ids = [list(map(id, d.values())) for d in self._dicts]   # additions to modules are allowed
        return changed

    def _torch_wrapped(self, current, original) -> bool:
        """``current`` is torch's own wrapper (dynamo's or the step hook) around exactly ``original``."""
        return (getattr(current, "__code__", None) in (self._dynamo_wrapper, self._step_hook)
                and any(cell.cell_contents is original for cell in current.__closure__ or ()))

    def probe(self, module: str, name: str):
        """A probe as it was before any submitted code ran (only probes of the check modules)."""
        probe = self.names.get(module, (None, {}))[1].get(name)
        if not (module.startswith("autograder.") and name.startswith("probe_") and isinstance(probe, types.FunctionType)):
            raise LookupError(f"no probe {module}.{name}")
        return probe


_MISSING = object()


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class Server:
    def __init__(self, request_fd: int, response_fd: int, report: dict, scratch: str):
        self.request_fd, self.response_fd = request_fd, response_fd
        self.report = report
        self.scratch = scratch
        self.pid = os.getpid()
        self.handles: dict[int, object] = {}
        self.tampered: list[str] = []
        main = types.ModuleType("__main__")   # like a notebook kernel: cells define __main__'s names
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__

    # references for values with no data form
    def reference(self, obj) -> dict:
        key = len(self.handles) + 1
        self.handles[key] = obj
        return {"$ref": key, "type": type(obj).__qualname__[:100], "callable": callable(obj)}

    def encode(self, value):
        from autograder.grading import wire
        return wire.encode(value, self.reference)

    def unpickle(self, blob: bytes):
        server = self

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                return server.handles[pid[1]]

        return Unpickler(io.BytesIO(blob)).load()

    def send(self, message: dict, blobs: list[bytes] = ()) -> None:
        """One answer: its JSON, then the raw bytes of the files it lists. Only what was bound when this
        module was imported is used, so code the submission patched cannot rewrite or drop the report."""
        _send(self.response_fd, message, blobs)

    def serve(self) -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # an oversized write fails instead of killing us
        self.send({"ready": self.report})
        self.pristine = Pristine(self)
        while True:
            (size,) = struct.unpack(">Q", _read_exactly(self.request_fd, 8))
            op, *args = self.unpickle(_read_exactly(self.request_fd, size))
            self.tampered.clear()        # in place: the server's own names must keep their ids
            try:
                answer = getattr(self, "op_" + op)(*args)
            except BaseException as exc:          # noqa: BLE001 (the submission's exception is the answer)
                answer = {"raised": describe_exception(exc)}
            finally:
                self._end_what_calls_started(op)
            if answer is None:                    # a fork has answered, with the files it read
                continue
            answer["tampered"] = _list(self.tampered[:12])
            self.send(answer)

    def _end_what_calls_started(self, op: str) -> None:
        """A check's call or probe of the submission's code leaves nothing running after it: every process
        of this sandbox that was not there after the previous operation is SIGKILLed, however it detached
        (a double fork, a group of its own: the sandbox's own /proc lists them all), round after round
        until none is left. What a cell leaves running stays (at the lowest priority: ``submitted``)."""
        own = self.report.get("proc") == "own"
        if own and op in ("call", "probe"):
            for _ in range(100):
                running = _processes()
                kept = _below(running, _machinery())
                started = [pid for pid, start, _ in running if (pid, start) not in self._running and pid not in kept]
                if not started:
                    break
                for pid in started:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                for pid in started:          # this process's own children: reaped, not left as zombies
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                time.sleep(0.001)
        self._running = {(pid, start) for pid, start, _ in _processes()} if own else set()

    _running: set = set()      # (pid, start time) of this sandbox's processes after the last operation

    def submitted(self, run):
        """Run a submitted cell, then undo any change it made to shared code (and note it)."""
        try:
            return run()
        finally:
            self.tampered += self.pristine.restore()
            _lower_the_rest(self.report.get("proc") == "own", {1, self.pid, os.getpid()})

    def op_integrity(self) -> dict:
        """After a test judged outside: did the calls into the submission patch shared code?

        (Checked once per test cell, not per call: a judged-outside check makes thousands of calls,
        and what they patch cannot change its verdict, only what later tests would run on.)"""
        self.tampered += self.pristine.restore()
        return {"value": None}

    # operations
    def op_exec(self, source: str, label: str) -> dict:
        code = compile(source, label, "exec")
        try:
            self.submitted(lambda: exec(code, self.namespace))
        finally:
            pyplot = sys.modules.get("matplotlib.pyplot")
            if pyplot is not None:
                pyplot.close("all")
        return {"value": None}

    def op_check(self, source: str, label: str) -> dict:
        """A test cell run in here: only for checks whose objects cannot leave this process."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                self.submitted(lambda: exec(compile(source, label, "exec"), self.namespace))
            except BaseException as exc:     # noqa: BLE001
                return {"raised": describe_exception(exc), "stdout": out.getvalue()[-4000:]}
        return {"value": None, "stdout": out.getvalue()[-4000:]}

    def op_probe(self, module: str, name: str, blob: bytes, scratch=None):
        """Run a check's probe where the submission's objects live: it exercises them and returns what it
        saw, as data; the check judges that in the grading process. Shared code is put back as it was
        before the probe starts (a patch left behind cannot shape what it sees, and is reported).

        Where nothing else of the sandbox runs (this one thread, no other process) the probe runs here, as
        in a kernel. Otherwise it runs in a fork: there only this thread exists (no thread an answer cell
        started runs on), and the fork answers the judge itself while the rest of the sandbox is stopped."""
        probe = self.pristine.probe(module, name)
        args, kwargs = self.unpickle(blob)
        if self._alone():
            self.tampered += self.pristine.restore()
            before = self._take_scratch(scratch)
            return self._answer_with_files(self._probed(probe, args, kwargs), before)
        pid = os.fork()       # a fork costs 20-40 ms with torch loaded: only when something else runs
        if pid == 0:
            try:
                self.tampered[:] = self.pristine.restore()
                before = self._take_scratch(scratch)
                self._send_with_files(self._probed(probe, args, kwargs), before)
            finally:
                os._exit(0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return None if code == 0 else {"died": ending(code)}

    def _probed(self, probe, args, kwargs) -> dict:
        try:
            result, given = self.submitted(lambda: _recording_warnings(lambda: probe(*args, **kwargs)))
            return {"value": _detached(self.encode, result), "warnings": given}
        except BaseException as exc:          # noqa: BLE001
            return {"raised": describe_exception(exc)}

    def _alone(self) -> bool:
        """Nothing of the sandbox runs but this thread: no other thread here, no other process but init."""
        if self.report.get("proc") != "own":     # other processes cannot be listed: assume some
            return False
        return (len(os.listdir("/proc/self/task")) == 1
                and all(int(p) in (1, os.getpid()) for p in os.listdir("/proc") if p.isdigit()))

    def _send_with_files(self, answer: dict, before: list) -> None:
        """In a fork: send ``answer`` with the scratch folder's changes since ``before``, read while every
        other process of the sandbox (the server and its threads included) is stopped."""
        stopped = _stop_the_others(self.report.get("proc") == "own")
        try:
            self._send_files(answer, before)
        finally:
            _continue(stopped)

    def _send_files(self, answer: dict, before: list) -> None:
        answer, blobs = self._give_scratch(answer, before)
        answer["tampered"] = _list(self.tampered[:12])
        self.send(answer, blobs)

    def _take_scratch(self, scratch) -> list:
        """Make the scratch folder hold what the judge's copy holds (when it changed); its fingerprint."""
        from autograder.grading import scratch as files
        if scratch is not None:
            files.unpack(self.scratch, *scratch)
        return files.fingerprint(self.scratch)

    def _give_scratch(self, answer: dict, before: list) -> tuple[dict, list[bytes]]:
        """``answer`` with the scratch folder's contents when they changed since ``before``."""
        from autograder.grading import scratch as files
        if files.fingerprint(self.scratch) == before:
            return answer, []
        try:
            entries, blobs = files.pack(self.scratch)
        except files.TooLarge as exc:
            entries, blobs = [], []
            answer = {"raised": {"type": "OSError", "builtin": True,
                                 "message": f"the check's folder holds too much to hand to the grader ({exc})"}}
        return dict(answer, scratch=entries), blobs

    def op_lookup(self, name: str) -> dict:
        if name not in self.namespace:
            raise NameError(f"name '{name}' is not defined")
        return {"value": self.encode(self.namespace[name])}

    def op_getattr(self, ref: int, name: str) -> dict:
        return {"value": self.encode(getattr(self.handles[ref], name))}

    def op_setattr(self, ref: int, name: str, blob: bytes) -> dict:
        setattr(self.handles[ref], name, self.unpickle(blob))
        return {"value": None}

    def op_builtin(self, ref: int, name: str) -> dict:
        function = {"len": len, "bool": bool, "list": list, "repr": repr}[name]
        return {"value": self.encode(function(self.handles[ref]))}

    def op_call(self, ref: int, blob: bytes, scratch=None):
        args, kwargs = self.unpickle(blob)
        before_files = self._take_scratch(scratch)
        mutable = [(key, value) for key, value in list(enumerate(args)) + list(kwargs.items())
                   if _is_mutable_data(value)]
        before = {key: json.dumps(self.encode(value)) for key, value in mutable}
        try:
            result, given = _recording_warnings(lambda: self.handles[ref](*args, **kwargs))
            answer = {"value": self.encode(result), "warnings": given}
        except BaseException as exc:              # noqa: BLE001 (its files may still have changed)
            answer = {"raised": describe_exception(exc)}
        if "raised" not in answer:
            answer["changed"] = []
            for key, value in mutable:
                after = self.encode(value)
                if json.dumps(after) != before[key]:
                    answer["changed"].append([key, after])
        return self._answer_with_files(answer, before_files)

    def _answer_with_files(self, answer: dict, before: list):
        """``answer`` as it is when the scratch folder did not change since ``before``; otherwise it is sent
        here with the files (None: sent), from a fork while the rest of the sandbox is stopped where
        anything else of it runs."""
        from autograder.grading import scratch as files
        if files.fingerprint(self.scratch) == before:
            return answer
        if self._alone():          # nothing else runs that could change them while they are read
            self._send_files(answer, before)
            return None
        pid = os.fork()
        if pid == 0:
            try:
                self._send_with_files(answer, before)
            finally:
                os._exit(0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return None if code == 0 else {"died": ending(code)}


# Bound at import, before any submitted code: the answer's way out uses nothing a submission can patch
# from Python (the C encoder, str.join, os.write).
_list, _pack_size, _os_write, _join = list, struct.Struct(">Q").pack, os.write, "".join
_c_encoder = json.encoder.c_make_encoder
_json_encode = _c_encoder(None, None, json.encoder.c_encode_basestring_ascii, None, ":", ",", False, False, True) \
    if _c_encoder is not None else json.JSONEncoder(separators=(",", ":")).encode


def _send(fd: int, message: dict, blobs=()) -> None:
    text = _json_encode(message, 0) if _c_encoder is not None else _json_encode(message)
    blob = (_join(text) if not isinstance(text, str) else text).encode()
    for part in (_pack_size(len(blob)), blob, *[b for data in blobs for b in (_pack_size(len(data)), data)]):
        view = memoryview(part)
        while view:
            view = view[_os_write(fd, view):]


def _detached(encode, value):
    """A probe's result as data: what it made dies with its process, so no reference may leave."""
    def refuse(obj):
        raise TypeError(f"a probe returned a {type(obj).__name__}, which is not data")
    from autograder.grading import wire
    return wire.encode(value, refuse)


def ending(code: int) -> str:
    """How the process running submitted code ended, for the learner: ``code`` as subprocess gives it
    (-N for a death by signal N) or as our parents pass it on (128 + N, see _exit_like)."""
    if code < 0 or code > 128:
        signum = -code if code < 0 else code - 128
        name = signal.Signals(signum).name if signum in signal.valid_signals() else signum
        return f"the process running it was killed by {name}"
    return f"it ended the process running it (exit code {code}), as os._exit or a crash does"


def _stop_the_others(own_proc: bool) -> list[int]:
    """SIGSTOP every other process of this sandbox (its own /proc lists only them); the stopped pids.
    Without a /proc of its own nothing is stopped (it would list the machine's processes).

    Scanned until a pass finds none left running: a process may fork before its stop lands."""
    if not own_proc:
        return []
    me, stopped = os.getpid(), []
    for _ in range(200):
        fresh = [pid for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
                 if pid not in (me, 1) and pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except OSError:
                pass
    for pid in stopped:                      # a stop lands on the process's way back to user space
        for _ in range(500):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                break
            if state in (b"T", b"t", b"Z", b"X"):
                break
            os.sched_yield()
    return stopped


def _processes() -> list[tuple[int, bytes, int]]:
    """This sandbox's processes (its own /proc), each as (pid, start time, parent); zombies left out."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != b"Z":
                found.append((int(name), fields[19], int(fields[1])))
    return found


def _machinery() -> set[int]:
    """The processes the course's own code started to serve many calls: the server of fresh processes and
    multiprocessing's forkserver and resource tracker (notebooks 04, 07 and 09 start their workers and
    ranks from it). Ending them after a call would only make the next call start them again."""
    import multiprocessing.resource_tracker as tracker
    from autograder.engine import fresh_process
    pids = {fresh_process.server_pid(), getattr(tracker._resource_tracker, "_pid", None)}
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        pids.add(getattr(forkserver._forkserver, "_forkserver_pid", None))
    return {pid for pid in pids if pid}


def _below(processes: list, roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, _, parent in processes:
        children.setdefault(parent, []).append(pid)
    found, stack = set(), [pid for pid in roots]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack += children.get(pid, [])
    return found


def _lower_the_rest(own_proc: bool, keep: set) -> None:
    """Give every process of this sandbox but ``keep`` the lowest CPU priority (nice 19): what a submitted
    cell leaves running (spinners, a server of its own) goes on, but the checks of the exercises after it
    run at the server's priority, so it cannot cost them their time limits. Its children inherit it."""
    if not own_proc:
        return
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid not in keep:
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            except OSError:         # it has ended
                pass


def _continue(stopped: list[int]) -> None:
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


def _recording_warnings(run) -> tuple:
    """``run()``'s result and the warnings it gave, as text: they travel back and are given again in the
    judge, since a check may ask for one ("skipped with a warning")."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message)[:2000] for w in caught[:50]]


def _is_mutable_data(value) -> bool:
    import numpy as np
    import torch
    return type(value) in (dict, list) or isinstance(value, (np.ndarray, torch.Tensor))


def describe_exception(exc: BaseException) -> dict:
    """An exception as data (``autograder.grading.sandbox.learner_exception`` makes it again on the other side)."""
    try:
        message = str(exc)[:4000]
    except BaseException:      # noqa: BLE001 (a submission's exception may fail even to print)
        message = "(the exception's message could not be read)"
    return {"type": str(type(exc).__name__)[:100], "builtin": type(exc).__module__ == "builtins", "message": message}


def run(request_fd: int, response_fd: int, config: dict) -> None:
    # torch and numpy first (the zygote has them already): the address-space limit is what they map plus
    # the submission's allowance, and an import that starts a process (the CUDA build's runs `ldconfig -p`)
    # must do so before the PID namespace exists, whose first child becomes its init.
    import autograder.grading.wire  # noqa: F401
    report = confine(config)
    server = Server(request_fd, response_fd, report, config["scratch"])
    init = os.fork()
    if init == 0:
        _init(server.serve, config, report)
    os.close(request_fd)
    os.close(response_fd)
    _exit_like(os.waitpid(init, 0)[1])


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
