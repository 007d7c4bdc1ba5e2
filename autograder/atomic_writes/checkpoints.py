"""The checkpoints notebook 05's checks write, and telling them apart after a crash; where every call of
``atomic_save`` writes (alike for every check: ``<scratch>/checkpoints/model.pt``, tempfile's default folder
``<scratch>/system-tmp`` meanwhile).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import weakref
from pathlib import Path

import torch

from ..checking import load_written


CHECKPOINT_SUFFIX = ".pt"
TEMP_SUFFIX = ".tmp"
CHECKPOINT_NAME = "model.pt"       # every call of atomic_save the checks make writes <scratch>/checkpoints/model.pt
PRIVATE_TMP = "system-tmp"         # tempfile's default folder meanwhile: <scratch>/system-tmp


def make_checkpoint(step: int, layers: int = 8, layer_kib: int = 1024, seed: int = 0) -> dict:
    """A checkpoint-shaped dict: a step count and ``layers`` tensors of ``layer_kib`` KiB each.

    Many mid-sized tensors, not one big one: torch.save writes one record per
    tensor, so the file grows in steps that a crash can land between. Each call
    returns its own copies, so a save that changes what it is given changes nothing else.
    """
    ckpt = {"step": step, "model": {f"layer{i}.weight": t.clone()
                                    for i, t in enumerate(_checkpoint_tensors(step, layers, layer_kib, seed))}}
    first = next(iter(ckpt["model"].values()))
    _DRAWN[id(first)] = (step, layers, layer_kib, seed)
    weakref.finalize(first, _DRAWN.pop, id(first), None)
    return ckpt


# make_checkpoint's checkpoints -> the numbers that drew them (keyed by their first tensor, which a dict
# cannot be): what classify is given is told by those, so it compares no other checkpoints than these.
_DRAWN: dict[int, tuple] = {}


def _drawn_of(checkpoint) -> tuple | None:
    """(step, layers, layer_kib, seed) of a checkpoint make_checkpoint made, given as itself or as those numbers."""
    if checkpoint is None or isinstance(checkpoint, tuple):
        return checkpoint
    first = next(iter(checkpoint.get("model", {}).values()), None) if isinstance(checkpoint, dict) else None
    drawn = _DRAWN.get(id(first)) if torch.is_tensor(first) else None
    if drawn is None:
        raise TypeError("classify tells apart checkpoints that make_checkpoint made, not others")
    return drawn


@functools.lru_cache(maxsize=16)
def _checkpoint_tensors(step: int, layers: int, layer_kib: int, seed: int) -> tuple:
    # Drawing 8 MiB of normals takes 10 ms, copying them 0.5 ms; the checks ask for the same ones often.
    g = torch.Generator().manual_seed(seed * 1000 + step)
    numel = layer_kib * 1024 // 4
    return tuple(torch.randn(numel, generator=g) for _ in range(layers))


def holds_drawn(loaded, step: int, layers: int = 8, layer_kib: int = 1024, seed: int = 0) -> bool:
    """Whether ``loaded`` is the checkpoint ``make_checkpoint(step, layers, layer_kib, seed)`` makes: told from
    the numbers it was drawn from, not from another checkpoint, so it compares nothing a learner holds."""
    if not (isinstance(loaded, dict) and loaded.get("step") == step and isinstance(loaded.get("model"), dict)):
        return False
    drawn = _checkpoint_tensors(step, layers, layer_kib, seed)
    model = loaded["model"]
    return list(model) == [f"layer{i}.weight" for i in range(layers)] and all(
        torch.is_tensor(t) and t.dtype == d.dtype and t.shape == d.shape and bool((t == d).all())
        for t, d in zip(model.values(), drawn))


def _first_sentence(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(path, old, new, known_bytes: dict | None = None) -> tuple[str, str]:
    """('old' | 'new' | 'unloadable' | 'missing' | 'other', detail) for the file at ``path``; ``old`` and
    ``new`` are checkpoints make_checkpoint made, or the arguments (step, layers, layer_kib, seed) that drew
    them, or None.

    ``known_bytes`` ({'old': bytes, 'new': bytes}) is a shortcut: a byte-identical file
    needs no torch.load.
    """
    if not os.path.exists(path):
        return "missing", "no file"
    if known_bytes:
        data = Path(path).read_bytes()
        for label, expected in known_bytes.items():
            if data == expected:
                return label, ""
    try:
        loaded = load_written(path)
    except Exception as exc:
        return "unloadable", _first_sentence(exc)
    old, new = _drawn_of(old), _drawn_of(new)
    if old is not None and holds_drawn(loaded, *old):
        return "old", ""
    if new is not None and holds_drawn(loaded, *new):
        return "new", ""
    return "other", "it loads, but holds neither the old nor the new checkpoint"


def _new_scratch(workdir=None) -> str:
    """A fresh ``<scratch>`` with ``checkpoints/`` (the checkpoint's folder) and ``system-tmp/`` (tempfile's
    default folder during the call: a temp file made with tempfile's defaults lands where the checks look)."""
    root = tempfile.mkdtemp(prefix="atomic-check-", dir=workdir)
    for folder in ("checkpoints", PRIVATE_TMP):
        os.mkdir(os.path.join(root, folder))
    return root


@contextlib.contextmanager
def _tempfile_folder_of(path):
    """tempfile's default folder is the scratch's ``system-tmp`` while atomic_save(obj, path) runs (where path
    is in a scratch of _new_scratch; elsewhere, as in the notebook's demos, it stays what it is)."""
    private = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), PRIVATE_TMP)
    saved = tempfile.tempdir
    if os.path.isdir(private):
        tempfile.tempdir = private
    try:
        yield
    finally:
        tempfile.tempdir = saved
