"""The file operations a call makes, recorded from inside the process that makes them: os.fsync and the
renames, removals and links it calls, each with what a watched path held right after it (notebook 05's
recorder; notebook 09's RenameWatch, which also sees failed renames and can fail one), and the snapshots of a
folder the checks compare before and after a call."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def content_digest(path) -> str | None:
    """A digest of the regular file at ``path``; None when there is none (a link counts as none)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    digest = hashlib.sha1()
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def recorded_file_operations(watch=None):
    """Wrap os.fsync / os.fdatasync / os.replace / os.rename / os.remove / os.unlink / os.link / os.symlink
    (and fcntl F_FULLFSYNC on macOS).

    Yields the list of events they record, in call order: for a sync, whether it was a
    directory, which file (device, inode) and its size at that moment; for a rename,
    source and target; for a removal, the path; for a link, source and target. With
    ``watch`` (a path), each event also holds ``watched``: content_digest(watch) right
    after the call, what a crash at that moment would leave there.
    """
    events: list[dict] = []
    names = ("fsync", "fdatasync", "replace", "rename", "remove", "unlink", "link", "symlink")
    patched = [(os, name) for name in names if hasattr(os, name)]
    if fcntl is not None and hasattr(fcntl, "F_FULLFSYNC"):
        patched.append((fcntl, "fcntl"))  # macOS: fsync does not flush the drive's cache, F_FULLFSYNC does
    originals = {(module, name): getattr(module, name) for module, name in patched}

    def record(event: dict) -> None:
        if watch is not None:
            event["watched"] = content_digest(watch)
        events.append(event)

    def sync_event(call: str, fd) -> dict:
        st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
        return {"op": "fsync", "call": call, "is_dir": stat.S_ISDIR(st.st_mode),
                "inode": (st.st_dev, st.st_ino), "size": st.st_size}

    def syncing(original, name):
        def wrapper(fd):
            event = sync_event(name, fd)   # the size the file has when the sync starts
            result = original(fd)
            record(event)
            return result
        return wrapper

    def full_syncing(original):
        def wrapper(fd, cmd, *args):
            event = sync_event("F_FULLFSYNC", fd) if cmd == fcntl.F_FULLFSYNC else None
            result = original(fd, cmd, *args)
            if event is not None:
                record(event)
            return result
        return wrapper

    def two_paths(original, op, name):
        def wrapper(src, dst, *args, **kwargs):
            result = original(src, dst, *args, **kwargs)
            record({"op": op, "call": name, "src": os.path.abspath(os.fspath(src)),
                    "dst": os.path.abspath(os.fspath(dst))})
            return result
        return wrapper

    def removing(original, name):
        def wrapper(path, *args, **kwargs):
            result = original(path, *args, **kwargs)
            record({"op": "remove", "call": name, "path": os.path.abspath(os.fspath(path))})
            return result
        return wrapper

    for (module, name), original in originals.items():
        if module is not os:
            setattr(module, name, full_syncing(original))
        elif name in ("fsync", "fdatasync"):
            setattr(module, name, syncing(original, name))
        elif name in ("replace", "rename"):
            setattr(module, name, two_paths(original, "rename", name))
        elif name in ("link", "symlink"):
            setattr(module, name, two_paths(original, "link", name))
        else:
            setattr(module, name, removing(original, name))
    try:
        yield events
    finally:
        for (module, name), original in originals.items():
            setattr(module, name, original)


class RenameWatch:
    """Patches os.fsync, os.fdatasync, os.replace, os.rename and os.symlink for one call and records each call,
    in order, in ``events``. Unlike recorded_file_operations, a rename is recorded before it runs, so a failed one
    is seen too (``"ok": False``); right after one succeeds, ``after_rename(dst)`` may add to its event what the
    folders hold then. ``fail_onto``: a rename onto that path raises EIO instead (a failing disk). ``slow``: an
    fsync called off the main thread waits first (a disk slower than the training loop; only a save running in
    the background, such as dcp.async_save's, notices)."""

    def __init__(self, after_rename=None, fail_onto: str | None = None, slow: float = 0.0):
        self.after_rename, self.fail_onto, self.slow = after_rename, fail_onto, slow
        self.events: list[dict] = []
        self._originals = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "rename", "symlink")
                           if hasattr(os, name)}

    def _sync(self, original):
        def wrapper(fd):
            if self.slow and threading.current_thread() is not threading.main_thread():
                time.sleep(self.slow)
            st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
            event = {"op": "fsync", "is_dir": stat.S_ISDIR(st.st_mode), "inode": [st.st_dev, st.st_ino],
                     "size": st.st_size}
            result = original(fd)
            self.events.append(event)
            return result
        return wrapper

    def _rename(self, original, call):
        def wrapper(src, dst, *args, **kwargs):
            event = {"op": "rename", "call": call, "src": os.path.abspath(os.fspath(src)),
                     "dst": os.path.abspath(os.fspath(dst)), "ok": False}
            self.events.append(event)
            if self.fail_onto is not None and event["dst"] == self.fail_onto:
                raise OSError(errno.EIO, "Input/output error (raised by the check's disk)", os.fspath(dst))
            result = original(src, dst, *args, **kwargs)
            event["ok"] = True
            if self.after_rename is not None:
                event.update(self.after_rename(event["dst"]))
            return result
        return wrapper

    def _symlink(self, original):
        def wrapper(src, dst, *args, **kwargs):
            self.events.append({"op": "symlink", "src": os.fspath(src), "dst": os.path.abspath(os.fspath(dst))})
            return original(src, dst, *args, **kwargs)
        return wrapper

    def __enter__(self):
        for name, original in self._originals.items():
            wrap = (self._sync(original) if name in ("fsync", "fdatasync") else
                    self._symlink(original) if name == "symlink" else self._rename(original, name))
            setattr(os, name, wrap)
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(os, name, original)


@contextlib.contextmanager
def noting_renames_onto(target: str, note):
    """While it lasts, os.replace, os.rename and os.symlink call ``note()`` first whenever their destination is
    ``target`` (an absolute path): how many times a process moved a pointer, counted inside that process."""
    originals = {name: getattr(os, name) for name in ("replace", "rename", "symlink")}

    def noting(original):
        def wrapper(src, dst, *args, **kwargs):
            if os.path.abspath(os.fspath(dst)) == target:
                note()
            return original(src, dst, *args, **kwargs)
        return wrapper

    for name, original in originals.items():
        setattr(os, name, noting(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(os, name, original)


def inode_of(path) -> list[int] | None:
    """[device, inode] of the entry at ``path`` itself (a link's own), as JSON carries it; None when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _digest(path: Path) -> str | None:
    """A file's digest, or None where it is gone: a learner's save that raised may leave a write running
    in the background (an async save whose future nobody waits for), renaming files while they are read."""
    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()
    except (FileNotFoundError, IsADirectoryError):
        return None


def file_digests(folder: Path) -> dict[str, str]:
    """The digest of every regular file below ``folder`` (links skipped), by its path relative to it."""
    out = {}
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink() and (digest := _digest(path)) is not None:
                out[str(path.relative_to(folder))] = digest
    return out


def folder_tree(folder: Path) -> dict[str, object]:
    """Every entry of ``folder``: a subfolder as its files' digests (file_digests), a link as "symlink", a file as
    its digest. Two of them compared tell what a call deleted or changed there. An entry gone while it is read
    (see _digest) is left out, as if it had gone just before."""
    tree = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink():
            tree[entry.name] = "symlink"
        elif entry.is_dir():
            tree[entry.name] = file_digests(entry)
        elif (digest := _digest(entry)) is not None:
            tree[entry.name] = digest
    return tree
