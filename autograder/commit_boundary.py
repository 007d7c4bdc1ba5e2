"""Checks for notebook 08: the commit boundary and resume equivalence.

``AccumulationRun`` is a small but complete training loop: dropout (drawing from
the global RNG), a shuffled data order rebuilt from (seed, epoch), SGD with
momentum, a StepLR schedule, a GradScaler and gradient accumulation. Its
``policy`` picks how it checkpoints and resumes: two correct ways, and one way
for each trap the notebook names. The capstone check drives the learner's
``resume_equivalent`` with runs of each policy, as a black box: it must accept
both correct resumes and reject every broken one.
"""

from __future__ import annotations

import copy
import functools
import io

import torch
from torch import nn

from .checking import expect, failing_if_raised, graded_check
from .helpers import regression_data

CORRECT_POLICIES = ("commit_boundary", "transaction")
BROKEN_POLICIES = ("unrestored_rng", "changed_seed", "weights_only", "claims_uncommitted")
POLICIES = CORRECT_POLICIES + BROKEN_POLICIES


def _to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(blob: bytes):
    return torch.load(io.BytesIO(blob), weights_only=True)


class AccumulationRun:
    """One training run with gradient accumulation; ``position`` counts microbatches (backward passes).

    Every ``accum_steps``-th microbatch ends an optimizer update: optimizer step, scaler update,
    scheduler step, and the data cursor commit. ``checkpoint()`` returns the bytes the loop would
    have on disk if it crashed now; ``AccumulationRun.resume(blob)`` rebuilds a run from them, as a
    new process would.
    """

    def __init__(self, seed: int = 0, accum_steps: int = 4, micro_batch: int = 4, dataset_size: int = 24,
                 policy: str = "commit_boundary", fresh_start: bool = True):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.config = {"seed": seed, "accum_steps": accum_steps, "micro_batch": micro_batch,
                       "dataset_size": dataset_size}
        self.policy = policy
        with torch.random.fork_rng(devices=[]):  # initial weights from the seed, global RNG untouched
            torch.manual_seed(seed)
            self.model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.25), nn.Linear(16, 1))
        if fresh_start:
            torch.manual_seed(seed)  # the dropout stream; a resume restores it from the checkpoint instead
        self.X, self.y = regression_data(n=dataset_size, seed=1000 + seed)  # the data itself never changes
        self._build_training_state()
        self.position = 0          # microbatches consumed: the committed ones plus those in flight
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
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}

    # -- checkpoint and resume -----------------------------------------------------------------

    def _state(self, include_gradients: bool) -> dict:
        state = {"config": dict(self.config), "policy": self.policy, "position": self.position,
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                 "rng": torch.get_rng_state()}
        if include_gradients:
            in_flight = self.position % self.config["accum_steps"]
            state["gradients"] = {name: p.grad for name, p in self.model.named_parameters() if p.grad is not None}
            state["in_flight_ids"] = [self.microbatch_ids(p) for p in range(self.position - in_flight, self.position)]
        return copy.deepcopy(state)  # state_dict() hands out live tensors: copy them at the commit

    def checkpoint(self) -> bytes:
        if self.policy in ("transaction", "claims_uncommitted"):
            # Written now, mid-update. The transaction also holds the accumulated gradients and the
            # identities of the microbatches they came from; the broken one claims them without gradients.
            return _to_bytes(self._state(include_gradients=self.policy == "transaction"))
        return _to_bytes(self._durable)  # the last checkpoint written at an optimizer commit

    @classmethod
    def resume(cls, blob: bytes, policy: str | None = None) -> "AccumulationRun":
        state = _from_bytes(blob)
        policy = policy or state["policy"]
        config = dict(state["config"])
        if policy == "changed_seed":
            config["seed"] += 1  # e.g. the restart script's default seed, not the run's
        run = cls(**config, policy=policy, fresh_start=False)
        if policy == "changed_seed":
            torch.manual_seed(config["seed"])
        run.model.load_state_dict(state["model"])
        if policy != "weights_only":
            run.optimizer.load_state_dict(state["optimizer"])
            run.scheduler.load_state_dict(state["scheduler"])
            run.scaler.load_state_dict(state["scaler"])
        run.position = state["position"]
        if policy == "transaction" and "gradients" in state:
            in_flight = run.position % config["accum_steps"]
            recomputed = [run.microbatch_ids(p) for p in range(run.position - in_flight, run.position)]
            if recomputed != state["in_flight_ids"]:
                raise RuntimeError("the data order changed: these gradients came from other microbatches")
            for name, p in run.model.named_parameters():
                if name in state["gradients"]:
                    p.grad = state["gradients"][name].clone()
        if policy not in ("unrestored_rng", "changed_seed"):
            torch.set_rng_state(state["rng"])
        run._durable = run._state(include_gradients=False)
        return run


def new_run_factory(seed: int = 0, accum_steps: int = 4, policy: str = "commit_boundary"):
    """The two callables the capstone takes: start a run, resume one from a checkpoint's bytes.

    Partials, not closures, so that the trusted grader can send them into a sandbox (pickle).
    """
    new_run = functools.partial(AccumulationRun, seed=seed, accum_steps=accum_steps, policy=policy)
    resume_run = functools.partial(AccumulationRun.resume, policy=policy)
    return new_run, resume_run


# ---- the capstone's checks ------------------------------------------------------------------------

def _verdict(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int) -> bool:
    new_run, resume_run = new_run_factory(seed, accum_steps, policy)
    with torch.random.fork_rng(devices=[]), failing_if_raised(   # the learner's global RNG left as it was
            f"resume_equivalent(new_run, resume_run, {total}, {crash_at})"):
        result = resume_equivalent(new_run, resume_run, total, crash_at)
    expect(isinstance(result, bool) or (torch.is_tensor(result) and result.numel() == 1),
           f"resume_equivalent should return True or False, not {type(result).__name__} {result!r:.80}.")
    return bool(result)


def _catches(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int,
             trap: str) -> None:
    verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
    expect(not verdict,
           f"With a crash after microbatch {crash_at} of {total} ({accum_steps} per update), a resume that "
           f"{trap} ends with different weights than the uninterrupted run, yet resume_equivalent returned "
           f"True.")


@graded_check("resume_equivalent accepts a correct resume (at the commit boundary and mid-update)")
def check_resume_equivalent_accepts_correct_resume(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_points=(8, 11)) -> None:
    for policy in CORRECT_POLICIES:
        for crash_at in crash_points:
            verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
            if verdict:
                continue
            mid = crash_at % accum_steps
            extra = (f" The crash came {mid} microbatches into an update, and this checkpoint was written "
                     f"at the last commit: the resumed run's position is {crash_at - mid}, not {crash_at}, "
                     f"and it must redo those {mid} microbatches. How many does your check train after the "
                     f"resume?" if mid and policy == "commit_boundary" else "")
            raise AssertionError(
                f"A resume that restores the complete state ({policy.replace('_', ' ')} checkpoint, crash after "
                f"microbatch {crash_at} of {total}) matches the uninterrupted run bitwise on this CPU, but "
                f"resume_equivalent returned False.{extra}")


@graded_check("resume_equivalent catches a resume that does not restore the RNG")
def check_resume_equivalent_catches_unrestored_rng(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_at: int = 8) -> None:
    # A crash at an update boundary on purpose: after a mid-update crash the recomputed microbatches
    # draw from a generator that has moved on, which shows the bug even to a check in one process.
    if crash_at % accum_steps:
        raise ValueError("crash_at must be at an update boundary for this check")
    verdict = _verdict(resume_equivalent, "unrestored_rng", seed, accum_steps, total, crash_at)
    expect(not verdict,
           f"A resume that never restores torch's global RNG (so dropout draws different masks after a real "
           f"restart) passed resume_equivalent (crash after microbatch {crash_at} of {total}). Inside one "
           f"process the global generator simply carries on where the crashed run left it, and hides the "
           f"bug. A new process would not: what does your check do to the RNG between the crash and the "
           f"resume?")


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
             f"counts the {crash_at % accum_steps} uncommitted microbatches as consumed without saving "
             f"their gradients")
