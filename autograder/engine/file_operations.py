"""The file operations a call makes, recorded from inside the process that makes them: os.fsync and the
renames, removals and links it calls, each with what a watched path held right after it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat

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
