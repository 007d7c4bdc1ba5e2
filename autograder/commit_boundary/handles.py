"""What the learner's resume_equivalent is handed: handles on runs that live elsewhere.

resume_equivalent runs in a fresh process (autograder.fresh_process): a new interpreter that never held the
memory of the process that runs the check, reading no file, opening no socket. What it is handed are
handles: new_run(), resume_run(blob) and each run's train(n), position, checkpoint() and weights() ask the
process that runs the check, where the runs live, with the scenario they play. So nothing the learner's
code can read (an attribute, __reduce__, the pickled bytes, vars(), gc, the calling frame) tells which
scenario it is: only running the runs and comparing them does. A checkpoint is a receipt for the bytes
kept there. torch's global RNG travels with every call, both ways, so the runs draw from the RNG of the
learner's process, as if they ran there: a new_run() reseeds it, a torch.manual_seed() between the crash and
resume_run() disturbs what the resumed run draws, exactly as in this notebook's own loop.

In the fresh process: the handles, ``_ask`` and ``_judged``; here: ``_Runs`` (the answers) and
``probe_resume_equivalent``, which starts the one and serves it with the other.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..engine import fresh_process
from .training_loop import AccumulationRun, NewRun, ResumeRun


class _RunHandle:
    """One run of the check's training loop, as the learner's code holds it: ``train(n)``, ``position``,
    ``checkpoint()``, ``weights()``, each a question to where the run lives."""

    __slots__ = ("_number",)

    def __init__(self, number: int):
        self._number = number

    def train(self, microbatches: int) -> None:
        _ask("train", self._number, microbatches)

    @property
    def position(self) -> int:
        return _ask("position", self._number)

    def checkpoint(self) -> bytes:
        return _ask("checkpoint", self._number)

    def weights(self) -> dict:
        return _ask("weights", self._number)

    def __getattr__(self, name):
        raise AttributeError(f"a run offers train(n), position, checkpoint() and weights() only, not {name!r}")

    def __repr__(self) -> str:
        return "run"


class _NewRunHandle:
    __slots__ = ()

    def __call__(self) -> _RunHandle:
        return _RunHandle(_ask("new"))

    def __repr__(self) -> str:
        return "new_run"


class _ResumeRunHandle:
    __slots__ = ()

    def __call__(self, blob: bytes) -> _RunHandle:
        return _RunHandle(_ask("resume", blob=blob))

    def __repr__(self) -> str:
        return "resume_run"


_RNG_SEEN: dict = {}     # in the fresh process: torch's RNG state as it last travelled


def _ask(what: str, number: int | None = None, microbatches=None, blob=None):
    state = torch.get_rng_state()
    changed = not ("last" in _RNG_SEEN and torch.equal(state, _RNG_SEEN["last"]))    # (5 KB: sent when changed)
    reply = fresh_process.ask({"what": what, "run": number, "microbatches": microbatches, "blob": blob,
                               "rng": state if changed else None})
    if reply["rng"] is not None:
        torch.set_rng_state(reply["rng"])
    _RNG_SEEN["last"] = torch.get_rng_state()
    return reply["value"]


class _Runs:
    """Where the runs live: the answers to what _ask asks, for one scenario."""

    MAX_RUNS, MAX_MICROBATCHES = 64, 4096

    def __init__(self, seed: int, accum_steps: int, writes: int, how: int):
        self.new_run, self.resume_run = NewRun(seed, accum_steps, writes), ResumeRun(how)
        self.runs: list[AccumulationRun] = []
        self.checkpoints: dict[bytes, bytes] = {}
        self.rng = torch.get_rng_state()    # the learner process's, as it last travelled

    def answer(self, question: dict) -> dict:
        if question["rng"] is not None:
            torch.set_rng_state(question["rng"])
            self.rng = question["rng"]
        torch.set_rng_state(self.rng)
        before = self.rng
        reply = self._answer(question)
        self.rng = torch.get_rng_state()
        return {"value": reply, "rng": None if torch.equal(self.rng, before) else self.rng}

    def _answer(self, question: dict):
        what = question["what"]
        if what == "new":
            value = self._kept(self.new_run())
        elif what == "resume":
            blob = question["blob"]
            if not isinstance(blob, bytes) or blob not in self.checkpoints:
                raise ValueError("resume_run takes the bytes a run's checkpoint() returned")
            value = self._kept(self.resume_run(self.checkpoints[blob]))
        else:
            run = self.runs[int(question["run"])]
            if what == "train":
                n = int(question["microbatches"])
                if not 0 <= n <= self.MAX_MICROBATCHES:
                    raise ValueError(f"train(n) takes a number of microbatches from 0 to {self.MAX_MICROBATCHES}")
                value = run.train(n)
            elif what == "position":
                value = run.position
            elif what == "weights":
                value = run.weights()
            elif what == "checkpoint":
                receipt = os.urandom(16)
                self.checkpoints[receipt] = run.checkpoint()
                value = receipt
            else:
                raise ValueError(f"no such question: {what!r}")
        return value

    def _kept(self, run: AccumulationRun) -> int:
        if len(self.runs) >= self.MAX_RUNS:
            raise ValueError(f"more than {self.MAX_RUNS} runs")
        self.runs.append(run)
        return len(self.runs) - 1


def warm_up_fresh_processes() -> None:
    """In the server of fresh processes (engine/fresh_server._warm): what a learner's check calls first imports
    (torch.manual_seed imports torch.cuda and the other device modules), imported once there."""
    torch.manual_seed(torch.initial_seed())


def _judged(resume_equivalent, total: int, crash_at: int, atol) -> dict:
    """In the fresh process: the learner's verdict on handles to the check's runs."""
    new_run, resume_run = _NewRunHandle(), _ResumeRunHandle()
    if atol is None:
        result = resume_equivalent(new_run, resume_run, total, crash_at)
    else:
        result = resume_equivalent(new_run, resume_run, total, crash_at, atol=atol)
    if isinstance(result, (bool, np.bool_)) or (torch.is_tensor(result) and result.numel() == 1):
        return {"verdict": bool(result)}
    return {"not_a_verdict": f"{type(result).__name__} {result!r:.80}"}


def probe_resume_equivalent(resume_equivalent, seed: int, accum_steps: int, writes: int, how: int, total: int,
                            crash_at: int, atol=None, timeout: float = 60.0) -> dict:
    """The learner's resume_equivalent in a fresh process, on handles to runs of the scenario (``writes``,
    ``how``) that live here: {"verdict": bool}, {"not_a_verdict": what it returned} or {"raised": what it
    raised, as grading.server.describe_exception gives it}."""
    task = fresh_process.packed(_judged, resume_equivalent, total, crash_at, atol)
    runs = _Runs(seed, accum_steps, writes, how)
    with torch.random.fork_rng(devices=[]):       # this process's RNG stays as it was
        try:     # preloads autograder.commit_boundary, the module the notebook starts the server with
            return task.run(timeout=timeout, serve=runs.answer, preload=__package__)
        except fresh_process.FreshProcessError as exc:
            return {"raised": exc.described() or {"type": "RuntimeError", "builtin": True, "message": str(exc)}}
