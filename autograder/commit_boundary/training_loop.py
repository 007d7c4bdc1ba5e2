"""Notebook 08's training loop and its scenarios: ``AccumulationRun`` (gradient accumulation, dropout, a
buffer, a shuffled data order, momentum, a schedule, a scaler), the policies that pick how it checkpoints and
resumes, the two callables the capstone is handed (``NewRun``, ``ResumeRun``), and the runs the checks
compare (``run_with_a_crash``, ``uninterrupted_run``).
"""

from __future__ import annotations

import io
import math

import torch
from torch import nn

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
        self._orders: dict[int, list[int]] = {}             # epoch -> its permutation of the dataset
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
        order = self._orders.get(epoch)
        if order is None:       # drawn once per epoch: the checks train hundreds of microbatches
            generator = torch.Generator().manual_seed(self.config["seed"] + epoch)
            order = self._orders[epoch] = torch.randperm(self.config["dataset_size"], generator=generator).tolist()
        size = self.config["micro_batch"]
        return order[slot * size:(slot + 1) * size]

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
