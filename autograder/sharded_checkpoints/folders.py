"""Notebook 09's run folders, as the checks write and read them.

A run folder holds one folder per checkpoint, ``step_<n>`` (n the number of committed updates), each
written by ``torch.distributed.checkpoint`` (DCP), whose coordinator writes ``.metadata`` last: a step
folder is *durable* when it holds a readable ``.metadata``. Next to them, the file ``latest`` names the
newest durable folder. The scenarios are real single-process DCP saves, left as crashes leave them;
reading a folder loads it with DCP here (``.metadata`` is a pickle: the grading process never loads one
the learner's code wrote, so only probes call these on the learner's folders).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import torch

from ..engine.forked_ranks import quiet_distributed

METADATA = ".metadata"
POINTER = "latest"


def _state(seed: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return {"model": {"0.weight": torch.randn(16, 8, generator=g), "0.bias": torch.randn(16, generator=g)},
            "train": {"cursor": 12 * step}}


def _write_step(run_dir: Path, step: int, seed: int, how: str = "committed") -> Path:
    """A real single-process DCP save of step_<step>, then left as a crash leaves it: 'no_marker' (a rank
    died before the coordinator wrote .metadata), 'tmp_marker' (the coordinator died writing it: only
    .metadata.tmp), 'empty_marker' (the marker's name survived a power cut, its bytes did not),
    'truncated_marker' (half of its bytes did)."""
    import torch.distributed.checkpoint as dcp
    quiet_distributed()
    folder = run_dir / f"step_{step}"
    dcp.save(_state(seed, step), checkpoint_id=folder)
    marker = folder / METADATA
    if how == "no_marker":
        marker.unlink()
    elif how == "tmp_marker":
        marker.rename(folder / (METADATA + ".tmp"))
    elif how == "empty_marker":
        marker.write_bytes(b"")
    elif how == "truncated_marker":
        marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    return folder


def _write_pointer(run_dir: Path, name: str) -> None:
    (run_dir / POINTER).write_text(name)


@contextlib.contextmanager
def _scratch():
    root = tempfile.mkdtemp(prefix="sharded-check-")
    try:
        run_dir = Path(root) / "run"
        run_dir.mkdir()
        yield run_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _read_pointer(run_dir: Path) -> str | None:
    path = run_dir / POINTER
    if path.is_symlink() or not path.is_file():
        return None
    return path.read_bytes()[:200].decode("utf-8", "replace").strip()


def _committed_folder(run_dir: Path, name: str) -> bool:
    """Whether run_dir/<name> holds a non-empty .metadata; only a plain folder name of run_dir is looked up."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return False
    marker = run_dir / name / METADATA
    return marker.is_file() and marker.stat().st_size > 0


def _load_folder(folder: Path, like: dict) -> dict | None:
    import torch.distributed.checkpoint as dcp
    if not (folder / METADATA).is_file():
        return None
    template = {"model": {k: torch.zeros_like(v) for k, v in like["model"].items()}, "train": {"cursor": -1}}
    dcp.load(template, checkpoint_id=folder)
    return template


def _loaded(run_dir: Path, like: dict) -> dict:
    out = {}
    for entry in sorted(run_dir.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        try:
            out[entry.name] = _load_folder(entry, like)
        except BaseException as exc:  # a folder DCP cannot read (CheckpointException is a BaseException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            out[entry.name] = type(exc).__name__
    return out


def _same_state(loaded, expected: dict) -> bool:
    return (isinstance(loaded, dict) and loaded.get("train", {}).get("cursor") == expected["train"]["cursor"]
            and all(torch.is_tensor(loaded["model"].get(k)) and torch.equal(loaded["model"][k], v)
                    for k, v in expected["model"].items()))


def _folders(tree: dict) -> dict:
    return {name: files for name, files in tree.items() if isinstance(files, dict)}
