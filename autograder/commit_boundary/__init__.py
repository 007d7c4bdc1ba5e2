"""Checks for notebook 08: the commit boundary and resume equivalence.

``AccumulationRun`` is a small but complete training loop: dropout (drawing from
the global RNG), a running mean of the hidden activations (a buffer), a shuffled
data order rebuilt from (seed, epoch), SGD with momentum, a StepLR schedule, a
GradScaler and gradient accumulation. A policy of the notebook picks how it
checkpoints and how it resumes: two correct ways, one way for each trap the
notebook names, and two that test the comparison itself (a resume that differs
in one tensor, one whose last bits differ). The capstone checks drive the
learner's ``resume_equivalent`` with runs of each policy, as a black box: it must
accept both correct resumes and reject every broken one. It runs in a fresh process and
holds handles only: the runs, their checkpoints and the policy stay in the process that
runs the check (see "what the learner's resume_equivalent is handed" below).
"""

from __future__ import annotations

import io
import math
import os

import numpy as np
import torch
from torch import nn

from ..engine import fresh_process
from ..checking import expect, graded_check, max_abs_diff, observe
from ..helpers import regression_data, state_copy

# How a run writes its checkpoint, and how a resume rebuilds it. Each scenario of the notebook (a "policy")
# pairs one of each: two correct ones, one per trap the notebook names, and two that test the comparison
# itself (a resume that differs in one tensor only, and one whose last bits differ).
CHECKPOINTING = ("commit_boundary", "transaction", "claims_uncommitted")
RESUMING = ("complete", "unrestored_rng", "changed_seed", "weights_only", "parameters_only", "last_bits_differ")
POLICY_PARTS = {
    "commit_boundary": ("commit_boundary", "complete"),
    "transaction": ("transaction", "complete"),
    "unrestored_rng": ("commit_boundary", "unrestored_rng"),
    "changed_seed": ("commit_boundary", "changed_seed"),
    "weights_only": ("commit_boundary", "weights_only"),
    "claims_uncommitted": ("claims_uncommitted", "complete"),
    "buffers_not_restored": ("commit_boundary", "parameters_only"),
    "last_bits_differ": ("commit_boundary", "last_bits_differ"),
}
CORRECT_POLICIES = ("commit_boundary", "transaction")
BROKEN_POLICIES = ("unrestored_rng", "changed_seed", "weights_only", "claims_uncommitted", "buffers_not_restored")
POLICIES = tuple(POLICY_PARTS)


def _to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(blob: bytes):
    return torch.load(io.BytesIO(blob), weights_only=True)


class RunningMean(nn.Module):
    """Passes its input through unchanged; while training, keeps a running mean of it per feature.

    A buffer, like BatchNorm's running statistics: part of ``state_dict()``, not a parameter, so an
    optimizer never touches it and nothing else in the model depends on it.
    """

    def __init__(self, features: int, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(x.mean(dim=0), alpha=self.momentum)
        return x


def _seed(seed: int) -> None:
    """torch.manual_seed for a run that lives on the CPU: the same CPU generator state, without queueing a seed
    for each lazy device module (torch.manual_seed formats the caller's stack once per module: about 1 ms a
    call under a notebook's check, and the checks seed runs hundreds of times). Only the CPU generator's
    state travels (_ask)."""
    torch.default_generator.manual_seed(seed)


class AccumulationRun:
    """One training run with gradient accumulation; ``position`` counts microbatches fetched (backward
    passes run), the committed ones and those in flight.

    Every ``accum_steps``-th microbatch ends an optimizer update: optimizer step, scaler update,
    scheduler step, and the data cursor commit. ``checkpoint()`` returns the bytes the loop would
    have on disk if it crashed now (``checkpointing`` says when those bytes were written);
    ``AccumulationRun.resume(blob)`` rebuilds a run from them, as a new process would.
    """

    def __init__(self, seed: int = 0, accum_steps: int = 4, micro_batch: int = 4, dataset_size: int = 24,
                 checkpointing: str = "commit_boundary", fresh_start: bool = True):
        if checkpointing not in CHECKPOINTING:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING}")
        self.config = {"seed": seed, "accum_steps": accum_steps, "micro_batch": micro_batch,
                       "dataset_size": dataset_size}
        self._writes = CHECKPOINTING.index(checkpointing)   # a number: a run names no scenario
        with torch.random.fork_rng(devices=[]):  # initial weights from the seed, global RNG untouched
            _seed(seed)
            self.model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), RunningMean(16), nn.Dropout(0.25),
                                       nn.Linear(16, 1))
        if fresh_start:
            _seed(seed)  # the dropout stream; a resume restores it from the checkpoint instead
        self.X, self.y = regression_data(n=dataset_size, seed=1000 + seed)  # the data itself never changes
        self._build_training_state()
        self.position = 0          # microbatches fetched: the committed ones plus those in flight
        self._durable = self._state(include_gradients=False)  # what is on disk: the last commit

    def _build_training_state(self) -> None:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)

    # -- the loop ------------------------------------------------------------------------------

    def microbatch_ids(self, position: int) -> list[int]:
        """Dataset indices of microbatch ``position``: a fresh permutation per epoch, from (seed, epoch)."""
        per_epoch = self.config["dataset_size"] // self.config["micro_batch"]
        epoch, slot = divmod(position, per_epoch)
        order = torch.randperm(self.config["dataset_size"],
                               generator=torch.Generator().manual_seed(self.config["seed"] + epoch))
        size = self.config["micro_batch"]
        return order[slot * size:(slot + 1) * size].tolist()

    def train(self, microbatches: int) -> None:
        for _ in range(microbatches):
            self.backward_microbatch()
            if self.position % self.config["accum_steps"] == 0:
                self.commit_update()

    def backward_microbatch(self) -> None:
        """One backward pass: its gradient joins the others in .grad; no weight changes yet."""
        ids = self.microbatch_ids(self.position)
        loss = nn.functional.mse_loss(self.model(self.X[ids]), self.y[ids]) / self.config["accum_steps"]
        self.scaler.scale(loss).backward()
        self.position += 1

    def commit_update(self) -> None:
        """The commit boundary: step, scaler update, scheduler step, then the durable checkpoint."""
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.scheduler.step()
        self._durable = self._state(include_gradients=False)

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of every tensor of the model's state_dict(): the parameters and the buffer."""
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}

    # -- checkpoint and resume -----------------------------------------------------------------

    def _state(self, include_gradients: bool) -> dict:
        state = {"config": dict(self.config), "position": self.position,
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                 "rng": torch.get_rng_state()}
        if include_gradients:
            in_flight = self.position % self.config["accum_steps"]
            state["gradients"] = {name: p.grad for name, p in self.model.named_parameters() if p.grad is not None}
            state["in_flight_ids"] = [self.microbatch_ids(p) for p in range(self.position - in_flight, self.position)]
        return state_copy(state)  # state_dict() hands out live tensors: copy them at the commit

    def checkpoint(self) -> bytes:
        writes = CHECKPOINTING[self._writes]
        if writes in ("transaction", "claims_uncommitted"):
            # Written now, mid-update. The transaction also holds the accumulated gradients and the
            # identities of the microbatches they came from; the broken one claims them without gradients.
            return _to_bytes(self._state(include_gradients=writes == "transaction"))
        return _to_bytes(self._durable)  # the last checkpoint written at an optimizer commit

    @classmethod
    def resume(cls, blob: bytes, resuming: str = "complete") -> "AccumulationRun":
        """A run rebuilt from a checkpoint's bytes. ``resuming`` other than "complete" plays one mistake."""
        if resuming not in RESUMING:
            raise ValueError(f"resuming must be one of {RESUMING}")
        state = _from_bytes(blob)
        config = dict(state["config"])
        if resuming == "changed_seed":
            config["seed"] += 1  # e.g. the restart script's default seed, not the run's
        run = cls(**config, fresh_start=False)
        if resuming == "changed_seed":
            _seed(config["seed"])
        if resuming == "parameters_only":        # e.g. a loop over named_parameters(): the buffer stays fresh
            with torch.no_grad():
                for name, p in run.model.named_parameters():
                    p.copy_(state["model"][name])
        else:
            run.model.load_state_dict(state["model"])
        if resuming != "weights_only":
            run.optimizer.load_state_dict(state["optimizer"])
            run.scheduler.load_state_dict(state["scheduler"])
            run.scaler.load_state_dict(state["scaler"])
        run.position = state["position"]
        if "gradients" in state:                 # a transaction: the update in flight goes on
            in_flight = run.position % config["accum_steps"]
            recomputed = [run.microbatch_ids(p) for p in range(run.position - in_flight, run.position)]
            if recomputed != state["in_flight_ids"]:
                raise RuntimeError("the data order changed: these gradients came from other microbatches")
            for name, p in run.model.named_parameters():
                if name in state["gradients"]:
                    p.grad = state["gradients"][name].clone()
        if resuming not in ("unrestored_rng", "changed_seed"):
            torch.set_rng_state(state["rng"])
        if resuming == "last_bits_differ":
            # The complete state, then every parameter one ulp up: what another build or kernel, rounding
            # differently, may do to the last bits. Training on spreads it a little, never far.
            with torch.no_grad():
                for p in run.model.parameters():
                    p.copy_(torch.nextafter(p, torch.full_like(p, math.inf)))
        run._durable = run._state(include_gradients=False)
        return run


class NewRun:
    """``new_run()``: a fresh run. What a check hands to the learner's resume_equivalent: it holds numbers
    only, so nothing it carries (a keyword, an attribute, a name) says which scenario is being tested."""

    __slots__ = ("_args",)

    def __init__(self, seed: int, accum_steps: int, writes: int):
        self._args = (seed, accum_steps, writes)

    def __call__(self) -> AccumulationRun:
        seed, accum_steps, writes = self._args
        return AccumulationRun(seed, accum_steps, checkpointing=CHECKPOINTING[writes])

    def __reduce__(self):
        return type(self), self._args

    def __repr__(self) -> str:
        return "new_run"


class ResumeRun:
    """``resume_run(blob)``: a run rebuilt from a checkpoint's bytes, as a new process would; numbers only."""

    __slots__ = ("_how",)

    def __init__(self, how: int):
        self._how = how

    def __call__(self, blob: bytes) -> AccumulationRun:
        return AccumulationRun.resume(blob, RESUMING[self._how])

    def __reduce__(self):
        return type(self), (self._how,)

    def __repr__(self) -> str:
        return "resume_run"


def new_run_factory(seed: int = 0, accum_steps: int = 4, policy: str = "commit_boundary"):
    """The two callables the capstone takes: start a run, resume one from a checkpoint's bytes.

    Plain objects of this module that pickle (the trusted grader sends them into a sandbox) and hold
    numbers only: the policy's name stays here.
    """
    writes, resuming = POLICY_PARTS[policy]
    return NewRun(seed, accum_steps, CHECKPOINTING.index(writes)), ResumeRun(RESUMING.index(resuming))


def run_with_a_crash(policy: str, seed: int = 0, accum_steps: int = 4, total: int = 12, crash_at: int = 8,
                     new_process_seed: int = 2024) -> dict[str, torch.Tensor]:
    """The final weights() of a run that crashes after ``crash_at`` microbatches and resumes under ``policy``
    with the RNG of a new process; the caller's global RNG is left as it was."""
    new_run, resume_run = new_run_factory(seed, accum_steps, policy)
    with torch.random.fork_rng(devices=[]):
        crashed = new_run()
        crashed.train(crash_at)
        blob = crashed.checkpoint()
        torch.manual_seed(new_process_seed)
        resumed = resume_run(blob)
        resumed.train(total - resumed.position)
    return resumed.weights()


def uninterrupted_run(seed: int = 0, accum_steps: int = 4, total: int = 12) -> dict[str, torch.Tensor]:
    """The final weights() of the run that never stopped; the caller's global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        run = new_run_factory(seed, accum_steps)[0]()
        run.train(total)
    return run.weights()


# ---- what the learner's resume_equivalent is handed: handles on runs that live elsewhere -------------------
#
# resume_equivalent runs in a fresh process (autograder.fresh_process): a new interpreter that never held the
# memory of the process that runs the check, reading no file, opening no socket. What it is handed are
# handles: new_run(), resume_run(blob) and each run's train(n), position, checkpoint() and weights() ask the
# process that runs the check, where the runs live, with the scenario they play. So nothing the learner's
# code can read (an attribute, __reduce__, the pickled bytes, vars(), gc, the calling frame) tells which
# scenario it is: only running the runs and comparing them does. A checkpoint is a receipt for the bytes
# kept there. torch's global RNG travels with every call, both ways, so the runs draw from the RNG of the
# learner's process, as if they ran there: a new_run() reseeds it, a torch.manual_seed() between the crash and
# resume_run() disturbs what the resumed run draws, exactly as in this notebook's own loop.

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
    """In the server of fresh processes (fresh_process._warm): what a learner's check calls first imports
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
        try:
            return task.run(timeout=timeout, serve=runs.answer, preload=__name__)
        except fresh_process.FreshProcessError as exc:
            return {"raised": exc.described() or {"type": "RuntimeError", "builtin": True, "message": str(exc)}}


# ---- the capstone's checks ------------------------------------------------------------------------

def _verdict(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int,
             atol: float | None = None) -> bool:
    writes, resuming = POLICY_PARTS[policy]
    shown = f"resume_equivalent(new_run, resume_run, {total}, {crash_at}" + (
        ")" if atol is None else f", atol={atol!r})")
    seen = observe(probe_resume_equivalent, resume_equivalent, seed, accum_steps, CHECKPOINTING.index(writes),
                   RESUMING.index(resuming), total, crash_at, atol)
    if "raised" in seen:
        if seen["raised"]["type"] == "NotImplementedError":
            raise NotImplementedError
        raise AssertionError(f"{shown} raised {fresh_process.raised_text(seen['raised'])}")
    expect("verdict" in seen, f"resume_equivalent should return True or False, not {seen.get('not_a_verdict')}.")
    return seen["verdict"]


def _catches(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int,
             trap: str, hint: str = "") -> None:
    verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
    expect(not verdict,
           f"With a crash after microbatch {crash_at} of {total} ({accum_steps} per update), a resume that "
           f"{trap} ends with different weights than the uninterrupted run, yet resume_equivalent returned "
           f"True.{hint}")


@graded_check("resume_equivalent accepts a correct resume (at the commit boundary and mid-update)")
def check_resume_equivalent_accepts_correct_resume(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_points=(8, 11)) -> None:
    for policy in CORRECT_POLICIES:
        for crash_at in crash_points:
            verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
            if verdict:
                continue
            mid = crash_at % accum_steps
            if mid and policy == "commit_boundary":
                why = (f" The crash came {mid} microbatches into an update, and this checkpoint was written at "
                       f"the last commit: the resumed run's position is {crash_at - mid}, not {crash_at}, and it "
                       f"must redo those {mid} microbatches. How many does your check train after the resume?")
            else:
                why = (f" The resumed run continues from position {crash_at}, exactly where the crash left it, so "
                       f"the number of microbatches trained after the resume is not the question here. Either "
                       f"something changes torch's global RNG after resume_run (the resumed run must draw from "
                       f"the state its checkpoint restored: disturb the RNG before resume_run, never after), or "
                       f"the comparison rejects equal weights (at atol=0, |difference| <= atol, not < atol).")
            raise AssertionError(
                f"A resume that restores the complete state ({policy.replace('_', ' ')} checkpoint, crash after "
                f"microbatch {crash_at} of {total}) matches the uninterrupted run bitwise on this CPU, but "
                f"resume_equivalent returned False.{why}")


@graded_check("resume_equivalent catches a resume that does not restore the RNG")
def check_resume_equivalent_catches_unrestored_rng(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_at: int = 8) -> None:
    # A crash at an update boundary on purpose: after a mid-update crash the recomputed microbatches
    # draw from a generator that has moved on, which shows the bug even to a check in one process.
    if crash_at % accum_steps:
        raise ValueError("crash_at must be at an update boundary for this check")
    _catches(resume_equivalent, "unrestored_rng", seed, accum_steps, total, crash_at,
             "never restores torch's global RNG (so dropout draws different masks after a real restart)",
             " Inside one process the global generator simply carries on where the crashed run left it, and "
             "hides the bug. A new process would not: what does your check do to the RNG between the crash and "
             "the resume?")


@graded_check("resume_equivalent catches a resume with a changed seed")
def check_resume_equivalent_catches_changed_seed(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                 total: int = 12, crash_at: int = 8) -> None:
    _catches(resume_equivalent, "changed_seed", seed, accum_steps, total, crash_at,
             "restarts with a different seed (new data order and dropout stream)")


@graded_check("resume_equivalent catches a weights-only resume")
def check_resume_equivalent_catches_weights_only(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                 total: int = 12, crash_at: int = 8) -> None:
    _catches(resume_equivalent, "weights_only", seed, accum_steps, total, crash_at,
             "loads only the model weights (fresh momentum, learning-rate schedule and scaler)")


@graded_check("resume_equivalent catches a mid-update checkpoint that claims uncommitted microbatches")
def check_resume_equivalent_catches_claimed_microbatches(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                         total: int = 12, crash_at: int = 11) -> None:
    if crash_at % accum_steps == 0:
        raise ValueError("crash_at must fall inside an update for this check")
    _catches(resume_equivalent, "claims_uncommitted", seed, accum_steps, total, crash_at,
             f"counts the {crash_at % accum_steps} uncommitted microbatches as committed without saving "
             f"their gradients")


def _differences(policy: str, seed: int, accum_steps: int, total: int, crash_at: int) -> tuple[dict, int]:
    """What the check knows before it asks the learner's code: tensor name -> the largest |difference| between
    the final weights of a run resumed under ``policy`` and the uninterrupted run's, and the largest of them
    in units in the last place (ulps) of float32."""
    expected = uninterrupted_run(seed, accum_steps, total)
    got = run_with_a_crash(policy, seed, accum_steps, total, crash_at)
    ulps = 0
    for name, value in expected.items():
        magnitude = torch.maximum(value.abs(), got[name].abs())
        spacing = torch.nextafter(magnitude, torch.full_like(magnitude, math.inf)) - magnitude
        ulps = max(ulps, int(((got[name] - value).abs() / spacing).max()))
    return {name: max_abs_diff(got[name], value) for name, value in expected.items()}, ulps


@graded_check("resume_equivalent compares every tensor: bitwise at atol=0, |difference| <= atol otherwise")
def check_resume_equivalent_comparison(resume_equivalent, seed: int = 0, accum_steps: int = 4, total: int = 12,
                                       crash_at: int = 8) -> None:
    # 1. A resume whose last bits differ: every state restored, then each parameter one ulp up (what
    #    another build's rounding may do). It ends `largest` away from the uninterrupted run.
    differences, ulps = _differences("last_bits_differ", seed, accum_steps, total, crash_at)
    largest = max(differences.values())
    if largest == 0:
        raise ValueError("these arguments give a resume that ends bitwise equal: choose others")
    call = (resume_equivalent, "last_bits_differ", seed, accum_steps, total, crash_at)
    measured = (f"a resume whose final weights differ from the uninterrupted run's by at most {largest:.2e} "
                f"({ulps} units in the last place of float32 at most)")
    expect(not _verdict(*call, atol=0.0),
           f"At atol=0.0 (bitwise), {measured} must give False, but resume_equivalent returned True. A tolerance "
           f"crept in where none was declared: torch.allclose and torch.isclose add their defaults "
           f"(rtol=1e-05, atol=1e-08) unless told otherwise, and rounding or printing the weights hides the "
           f"last bits. At atol == 0 compare with torch.equal.")
    above = 2 * largest
    # Held only against an answer that accepts a correct resume at this atol: one that rejects even that one
    # loses check_resume_equivalent_accepts_correct_resume, for its experiment, not for its tolerance.
    expect(_verdict(*call, atol=above) or not _verdict(resume_equivalent, "commit_boundary", seed, accum_steps,
                                                        total, crash_at, atol=above),
           f"At atol={above:.2e}, {measured} is within the tolerance and must give True, but resume_equivalent "
           f"returned False. Does your check use atol, or does it always compare bitwise?")
    below = 0.9 * largest
    expect(not _verdict(*call, atol=below),
           f"At atol={below:.2e}, {measured} must give False (the largest difference is above atol), but "
           f"resume_equivalent returned True. atol bounds the largest |difference| of every entry: "
           f"torch.allclose and torch.isclose add rtol * |expected| (default rtol=1e-05) on top of it unless you "
           f"pass rtol=0, and a mean or sum of the differences hides the largest one.")
    # 2. A resume that restores the parameters but not the buffer (model.2.running_mean, a running mean):
    #    the final weights differ in that one tensor only, which is neither the first nor the last.
    differences, _ = _differences("buffers_not_restored", seed, accum_steps, total, crash_at)
    differing = [name for name, value in differences.items() if value]
    if len(differing) != 1:
        raise ValueError(f"expected one differing tensor, found {differing}")
    names = list(differences)
    call = (resume_equivalent, "buffers_not_restored", seed, accum_steps, total, crash_at)
    only = (f"a resume whose final tensors all equal the uninterrupted run's bitwise except one, "
            f"{', '.join(map(repr, differing))} (tensor {names.index(differing[0]) + 1} of {len(names)} in "
            f"weights(): a buffer, not a parameter), which differs by up to {differences[differing[0]]:.2e}")
    expect(not _verdict(*call, atol=0.0),
           f"At atol=0.0, {only}, must give False, but resume_equivalent returned True. Compare every tensor "
           f"weights() returns, {names}: not only the first or the last, not only those named weight or "
           f"bias, not only the parameters.")
    below = 0.9 * differences[differing[0]]
    expect(not _verdict(*call, atol=below),
           f"At atol={below:.2e}, {only}, must give False, but resume_equivalent returned True. atol bounds the "
           f"largest |difference| of every entry of every tensor; a mean or sum of the differences hides the "
           f"largest one.")
