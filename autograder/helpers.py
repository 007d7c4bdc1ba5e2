"""Toy models, data and small utilities that several notebooks and their checks share.

Kept tiny on purpose: every notebook must run top to bottom in seconds on a
laptop CPU, and the traps show just as clearly on a model with 50 weights.
"""

from __future__ import annotations

import io

import torch
from torch import nn


def regression_data(n: int = 64, in_features: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy linear target: enough signal that the loss visibly falls."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, in_features, generator=g)
    true_w = torch.randn(in_features, 1, generator=g)
    y = X @ true_w + 0.1 * torch.randn(n, 1, generator=g)
    return X, y


def tiny_mlp(in_features: int = 4, hidden: int = 8, seed: int = 0, batchnorm: bool = False) -> nn.Module:
    """Two linear layers; ``batchnorm=True`` adds buffers (running stats), not just parameters."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(in_features, hidden)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(hidden))
    layers += [nn.Tanh(), nn.Linear(hidden, 1)]
    return nn.Sequential(*layers)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, X: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer update on mean squared error; returns the loss before the update."""
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def storage_pointer(tensor: torch.Tensor) -> int:
    """Address of the memory block behind a tensor: equal pointers mean shared storage."""
    return tensor.untyped_storage().data_ptr()


def live_tensors(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[int, str]:
    """Storage pointer -> readable name, for every tensor a training step writes to."""
    names = {storage_pointer(t): f"model {name}" for name, t in model.state_dict(keep_vars=True).items()}
    if optimizer is not None:
        param_names = {id(p): n for n, p in model.named_parameters()}
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value):
                    names[storage_pointer(value)] = f"optimizer {key} of {param_names.get(id(param), 'a parameter')}"
    return names


def serialized_copy(obj):
    """A deep, storage-independent copy made by a real torch.save / torch.load round trip."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
