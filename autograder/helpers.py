"""Toy models, data and small utilities that several notebooks and their checks share.

Kept tiny on purpose: every notebook must run top to bottom in seconds on a
laptop CPU, and the traps show just as clearly on a model with 50 weights.
"""

from __future__ import annotations

import contextlib
import copy
import io
import random

import numpy as np
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
    """Two linear layers; ``batchnorm=True`` adds buffers (running stats), not just parameters. The weights
    come from ``seed``; the caller's global RNG is left as it was (a check that builds a model for the
    learner's code must neither reseed the learner's process nor let it read the scenario's seed)."""
    with torch.random.fork_rng(devices=[]):
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


_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None), complex})


def state_copy(value):
    """A copy of a state dict that shares no storage with it, in memory (copy.deepcopy's result, five times
    faster): tensors detached and cloned, containers rebuilt (an OrderedDict with its _metadata, which
    load_state_dict reads), anything else deep-copied."""
    if type(value) in _IMMUTABLE:      # what deepcopy would hand back itself, without its dispatch
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        copied = type(value)((key, state_copy(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):
            copied._metadata = copy.deepcopy(value._metadata)
        return copied
    if type(value) in (list, tuple):
        return type(value)(state_copy(item) for item in value)
    return copy.deepcopy(value)


def serialized_copy(obj):
    """A deep, storage-independent copy made by a real torch.save / torch.load round trip, loaded as a
    process that allowlisted nothing would load it."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    with nothing_allowlisted():
        return torch.load(buffer, weights_only=True)


@contextlib.contextmanager
def nothing_allowlisted():
    """torch.load as in a process that allowlisted nothing: the globals registered in this one with
    ``torch.serialization.add_safe_globals`` are set aside meanwhile, and put back after (with any that
    torch registered meanwhile).

    An allowlist lives in the memory of the process that registered it, never in the file: the learner's
    kernel may hold one (torch.load's own error message suggests it), the process that resumes after a
    crash has none, nor has the grading process. So a check that loads a checkpoint gives the same verdict
    in the kernel as under grading. (torch registers a few globals of its own, distributed and nested
    tensor types, as their modules are imported: a checkpoint of tensors and plain data needs none.)
    """
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        yield
    finally:
        torch.serialization.add_safe_globals(registered)


# ---- objects a probe hands to learner code --------------------------------------------------------

def _method_on_class(cls: type, name: str) -> bool:
    """``name`` is a method of ``cls``: an instance attribute of that name would be found first."""
    for klass in cls.__mro__:
        if name in vars(klass):
            kind = type(vars(klass)[name])
            if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
                return False        # a property or slot: it wins over the instance's own attributes
            return callable(vars(klass)[name]) or hasattr(kind, "__get__")
    return False


def _parts(label: str, obj, found: dict) -> dict:
    """``obj`` under ``label`` and, for a torch module, every submodule under its own label."""
    found[label] = obj
    own = getattr(obj, "__dict__", None)
    if isinstance(obj, nn.Module) and isinstance(own, dict) and isinstance(own.get("_modules"), dict):
        for name, child in own["_modules"].items():
            if child is not None:
                _parts(f"{label}[{name}]" if str(name).isdigit() else f"{label}.{name}", child, found)
    return found


def _hook_name(attribute: str) -> str:
    return attribute.strip("_").replace("_", " ")[:-1]     # "_forward_pre_hooks" -> "forward pre hook"


def _look(obj) -> tuple:
    """What learner code could change about ``obj`` without touching shared code: its class, the instance
    attributes that shadow its class's methods, the hooks it holds (and its parameters' gradient hooks)."""
    own = getattr(obj, "__dict__", None)
    own = own if isinstance(own, dict) else {}
    shadows = {name: id(value) for name, value in own.items()
               if not name.startswith("__") and _method_on_class(type(obj), name)}
    hooks = {name: tuple(value) for name, value in own.items()
             if name.endswith("_hooks") and isinstance(value, dict)}
    parameters = own.get("_parameters") if isinstance(obj, nn.Module) else None
    gradient_hooks = {name: (len(p._backward_hooks or ()), len(getattr(p, "_post_accumulate_grad_hooks", None) or ()))
                      for name, p in (parameters or {}).items() if isinstance(p, torch.Tensor)}
    return obj, type(obj), shadows, hooks, gradient_hooks


def _global_hooks() -> dict[str, int]:
    """How many hooks torch holds for every module or every optimizer."""
    import torch.nn.modules.module as modules
    import torch.optim.optimizer as optimizers
    return {f"{owner.__name__}.{name}": len(value) for owner in (modules, optimizers)
            for name, value in sorted(vars(owner).items()) if name.endswith("_hooks") and isinstance(value, dict)}


def watch(parts, replaceable: bool = True):
    """Note the objects ``parts()`` names ({label: object}) before learner code holds them; return a function
    that lists, as plain text, what that code changed in them that would change how they behave.

    A probe hands its own model, optimizer or trainer to the learner's code and then relies on them: it
    trains on, reads their state. Code that sets ``optimizer.step = lambda: None`` or ``model.forward = ...``
    on the instance, swaps an object's class, or adds hooks, changes that behaviour without touching any
    shared code (which the sandbox guards). Listed: methods replaced, added or removed on an instance, a
    changed ``__class__``, added hooks (the objects', their parameters' and torch's global ones), submodules
    added or removed, and, unless ``replaceable``, an object ``parts()`` names that is now another one. An
    object that was replaced (where allowed) is compared with the one before it: same class, no methods
    of its own that the other had not.
    """
    before = {label: _look(obj) for label, obj in _parts_of(parts).items()}
    hooks_before = _global_hooks()

    def changes() -> list[str]:
        found = []
        now = _parts_of(parts)
        for label in before.keys() - now.keys():
            found.append(f"{label} removed")
        for label, obj in now.items():
            if label not in before:
                found.append(f"{label} added")
                continue
            was, cls, shadows, hooks, gradient_hooks = before[label]
            obj, new_cls, new_shadows, new_hooks, new_gradient_hooks = _look(obj)
            if obj is not was:
                if not replaceable:
                    found.append(f"{label} replaced by another object")
                elif new_cls is not cls:
                    found.append(f"{label} replaced by a {new_cls.__name__}")
                found += [f"{label}.{name} set on the instance" for name in sorted(new_shadows.keys() - shadows.keys())]
                continue
            if new_cls is not cls:
                found.append(f"{label}.__class__ changed to {new_cls.__name__}")
            found += [f"{label}.{name} replaced on the instance" for name in sorted(new_shadows)
                      if shadows.get(name) != new_shadows[name]]
            found += [f"{label}.{name} removed from the instance" for name in sorted(shadows.keys() - new_shadows.keys())]
            found += [f"{_hook_name(name)} added to {label}" for name in sorted(new_hooks)
                      if not name.endswith(("_with_kwargs", "_always_called")) and set(new_hooks[name]) - set(hooks.get(name, ()))]
            found += [f"gradient hook added to {label}.{name}" for name, counts in sorted(new_gradient_hooks.items())
                      if any(n > m for n, m in zip(counts, gradient_hooks.get(name, (0, 0))))]
        hooks_now = _global_hooks()
        found += [f"global hook added to {name}" for name, count in hooks_now.items() if count > hooks_before.get(name, 0)]
        return found[:8]

    return changes


def _parts_of(parts) -> dict:
    found: dict = {}
    for label, obj in parts().items():
        _parts(label, obj, found)
    return found


# ---- the process's global RNGs: an answer must leave them as it found them ---------------------

def global_rng_states() -> dict:
    """The states of the process's global random number generators: Python's ``random``, NumPy's, torch's
    (CPU), and the seed torch's was last seeded with."""
    return {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "torch_seed": torch.initial_seed()}


_OWN_SEED = 2 ** 40 + 20_231  # no seed + epoch of any check: a reseed always shows


@contextlib.contextmanager
def distinct_global_rngs():
    """For the duration, every global RNG in a state of its own (so a reseed shows even when the process
    happened to be seeded the same way); afterwards each is put back as it was."""
    saved = global_rng_states()
    random.seed(_OWN_SEED)
    np.random.seed(_OWN_SEED % 2 ** 32)
    torch.manual_seed(_OWN_SEED)
    try:
        yield
    finally:
        random.setstate(saved["random"])
        np.random.set_state(saved["numpy"])
        torch.set_rng_state(saved["torch"])


@contextlib.contextmanager
def recording_global_rngs():
    """The global RNGs in states of their own for the duration (distinct_global_rngs), read at the start and
    at the end: yields ``{"before": states}``, to which ``"after"`` is added when the block ends."""
    with distinct_global_rngs():
        seen = {"before": global_rng_states()}
        yield seen
        seen["after"] = global_rng_states()


def probe_global_rngs(function, *args, **kwargs) -> dict:
    """``function(*args, **kwargs)`` where it lives, between two readings of that process's global RNG
    states (see global_rng_states); the RNGs are put back afterwards."""
    with recording_global_rngs() as seen:
        function(*args, **kwargs)
    return seen


def changed_global_rngs(seen: dict) -> list[str]:
    """Which global RNGs (``random``, ``numpy``, ``torch``) a probe_global_rngs call changed."""
    before, after = seen["before"], seen["after"]
    changed = []
    if tuple(before["random"]) != tuple(after["random"]):
        changed.append("random")
    b, a = before["numpy"], after["numpy"]
    if not (b[0] == a[0] and np.array_equal(b[1], a[1]) and tuple(b[2:]) == tuple(a[2:])):
        changed.append("numpy")
    if not torch.equal(before["torch"], after["torch"]):
        changed.append("torch")
    return changed


_RNG_NAMES = {"random": "Python's random (random.seed, random.shuffle, ...)",
              "numpy": "NumPy's global RNG (np.random.seed, np.random.permutation, ...)",
              "torch": "torch's global RNG (torch.manual_seed, or a draw without generator=)"}


def describe_rng_change(seen: dict, changed: list[str], reseed: int | None = None) -> str:
    """What a probe_global_rngs call measured, in words: which global RNGs changed, and, where torch's was
    seeded with ``reseed``, that it was reseeded (not just drawn from)."""
    parts = []
    for name in changed:
        if name == "torch" and reseed is not None and seen["after"]["torch_seed"] == reseed:
            parts.append(f"torch's global RNG, reseeded with torch.manual_seed({reseed})")
        else:
            parts.append(_RNG_NAMES[name])
    return "; ".join(parts)
