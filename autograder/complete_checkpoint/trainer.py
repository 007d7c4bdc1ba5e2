"""Notebook 03's training scenario, which the notebook provides and the checks train with: the augmented
regression data, the trainer (model with dropout, SGD with momentum, StepLR, GradScaler, a StatefulDataLoader),
one step's audit record, and a snapshot of every component's state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import warnings
from typing import Iterator

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from ..helpers import state_copy

FEATURES = 6
DATASET_SIZE = 24
BATCH_SIZE = 4


def stateful_loader(dataset, **options) -> StatefulDataLoader:
    """A StatefulDataLoader, built without the warning torchdata 0.11 triggers on torch 2.13 to 2.15.

    torchdata calls torch.set_vital(), which torch 2.13 to 2.15 deprecate with a UserWarning at
    every construction: harmless, and not the learner's business.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return StatefulDataLoader(dataset, **options)


class AugmentedRegression(torch.utils.data.Dataset):
    """24 fixed samples (the dataset version never changes); every read augments its sample.

    The augmentation draws from Python's ``random`` (a scale jitter) and from NumPy's
    global RNG (additive noise), as many real pipelines do, so both RNGs are part of
    the training state. Each item carries its sample ID for the audit ledger.
    """

    def __init__(self, size: int = DATASET_SIZE, features: int = FEATURES):
        g = torch.Generator().manual_seed(20261130)
        self.x = torch.randn(size, features, generator=g)
        self.y = self.x @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(size, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        scale = 1.0 + 0.2 * (random.random() - 0.5)
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, size=self.x.shape[1]).astype(np.float32))
        return self.x[index] * scale + noise, self.y[index], index


@dataclasses.dataclass
class Trainer:
    """Everything that changes while training, in one place.

    ``batches`` is the live iterator over ``loader`` for the current epoch; it is
    None until the first batch is needed, and replaced at every epoch end.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    loader: StatefulDataLoader
    epoch: int = 0
    step: int = 0
    batches: Iterator | None = None


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def make_trainer(seed: int = 0) -> Trainer:
    """A fresh trainer: model with dropout, SGD with momentum, StepLR, GradScaler, shuffled loader.

    ``seed`` sets the initial weights and every global RNG; the data are the same for every seed.
    """
    seed_everything(seed)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.8)
    # On CPU in float32 nothing overflows; the scale still doubles every 4 clean steps, so the
    # scaler carries state a resume must restore (on a GPU in fp16 it decides which steps are skipped).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=4)
    loader = stateful_loader(AugmentedRegression(), batch_size=BATCH_SIZE, shuffle=True)
    return Trainer(model, optimizer, scheduler, scaler, loader)


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:10]


def rng_fingerprints() -> dict[str, str]:
    """Short digests of the three global RNG states: equal digests, equal future draws."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch_rng": _digest(torch.get_rng_state().numpy().tobytes()),
        "numpy_rng": _digest(keys.tobytes() + repr((pos, has_gauss, gauss)).encode()),
        "python_rng": _digest(repr(random.getstate()).encode()),
    }


def next_batch(trainer: Trainer):
    if trainer.batches is None:
        trainer.batches = iter(trainer.loader)
    try:
        return next(trainer.batches)
    except StopIteration:
        trainer.epoch += 1
        trainer.batches = iter(trainer.loader)
        return next(trainer.batches)


_next_batch = next_batch   # the name notebook 03 showed before it was public


def train_steps(trainer: Trainer, n: int) -> list[dict]:
    """Train ``n`` optimizer steps; return one audit record per step.

    A record holds the step and epoch, the sample IDs of the batch, digests of the
    three RNG states once the batch is read (the dropout draws come after), the loss,
    the learning rate used and the loss scale.
    """
    records = []
    trainer.model.train()
    for _ in range(n):
        x, y, ids = next_batch(trainer)
        record = {"step": trainer.step + 1, "epoch": trainer.epoch, "sample_ids": ids.tolist(),
                  **rng_fingerprints(), "lr": trainer.optimizer.param_groups[0]["lr"],
                  "scale": trainer.scaler.get_scale()}
        trainer.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(trainer.model(x), y)
        trainer.scaler.scale(loss).backward()
        trainer.scaler.step(trainer.optimizer)
        trainer.scaler.update()
        trainer.scheduler.step()
        trainer.step += 1
        record["loss"] = loss.item()
        records.append(record)
    return records


def snapshot(trainer: Trainer) -> dict:
    """Copies of every component's state, to compare two trainers."""
    return {
        "model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": state_copy(trainer.optimizer.state_dict()),
        "scheduler": state_copy(trainer.scheduler.state_dict()),
        "scaler": dict(trainer.scaler.state_dict()),
        "epoch": trainer.epoch,
        "step": trainer.step,
        **rng_fingerprints(),
    }
