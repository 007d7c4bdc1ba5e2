"""The judge's scratch folder and its copy in the sandbox: files travel as data, never as paths.

A check makes its folders under ``tempfile.gettempdir()``, which during a test cell is the
judge's own scratch folder: private to the grading process. Inside the sandbox, a tmpfs is
mounted on the very same path, so the paths a check hands the learner's code mean the same
on both sides. Before a call or probe, the judge sends what its copy holds (when it changed);
after it, the sandbox sends back what its copy holds (when that changed), read while nothing
else of the sandbox runs. The judge then reads only its own copy, which the sandbox cannot
reach: no link the submission plants is ever followed by the grading process.

Only folders and regular files travel; links, pipes and devices stay behind (a link that
stood where a check looks is, for the check, no file at all). Sizes are bounded.
"""

from __future__ import annotations

import itertools
import os
import stat

HOME, TMP = ".sandbox-home", ".sandbox-tmp"   # the sandbox's own, beside the check's folders: never copied
MAX_BYTES = 256 << 20      # what a sandbox may hand back at once (its tmpfs holds more: it says so)
MAX_ENTRIES = 10_000
MAX_DEPTH = 32             # folders within folders: a deeper tree is not a checkpoint, and costs the grader
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TooLarge(Exception):
    pass


def fingerprint(root: str) -> list:
    """What the tree holds, cheaply: (path, kind, size, mtime) of every entry, links not followed."""
    seen = []
    for rel, st in _walk(root):
        if st is None:
            seen.append((rel, "too deep"))
            break
        seen.append((rel, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino))
        if len(seen) > MAX_ENTRIES:
            break
    return seen


def pack(root: str) -> tuple[list, list[bytes]]:
    """The tree's folders and regular files: ([[path, "dir"|"file", mtime_ns, size], ...], [bytes, ...])."""
    entries, blobs, total = [], [], 0
    for rel, st in _walk(root):
        if len(entries) >= MAX_ENTRIES:
            raise TooLarge(f"more than {MAX_ENTRIES} files")
        if st is None:
            raise TooLarge(f"folders nested deeper than {MAX_DEPTH}")
        if stat.S_ISDIR(st.st_mode):
            entries.append([rel, "dir", st.st_mtime_ns, 0])
        elif stat.S_ISREG(st.st_mode):
            data = _read_beneath(root, rel, MAX_BYTES - total)
            total += len(data)
            entries.append([rel, "file", st.st_mtime_ns, len(data)])
            blobs.append(data)
    return entries, blobs


def unpack(root: str, entries: list, blobs: list[bytes]) -> None:
    """Make the tree under ``root`` exactly ``entries``: what was there goes, links are never followed."""
    clear(root)
    blobs = iter(blobs)
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        dirs = []
        for rel, kind, mtime_ns, _ in entries:
            parent, name = _open_parent(root_fd, rel)
            try:
                if kind == "dir":
                    os.mkdir(name, 0o700, dir_fd=parent)
                    dirs.append((rel, mtime_ns))
                else:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=parent)
                    with os.fdopen(fd, "wb") as f:
                        f.write(next(blobs))
                    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
            finally:
                if parent != root_fd:
                    os.close(parent)
        for rel, mtime_ns in reversed(dirs):     # a folder's time, once its files are in
            parent, name = _open_parent(root_fd, rel)
            try:
                os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent, follow_symlinks=False)
            finally:
                if parent != root_fd:
                    os.close(parent)
    finally:
        os.close(root_fd)


def clear(root: str) -> None:
    """Empty ``root`` (kept itself); links inside are removed, never followed."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        _empty(fd, keep=(HOME, TMP))
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Remove ``path`` and all below it, however deep, following no link; what cannot go stays.

    Not shutil.rmtree: before Python 3.12 it recurses once per folder level, and a tree deep enough (a
    submission can make one) raises RecursionError in the grader's own clean-up."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, _DIR_FLAGS)
    except OSError:
        return
    try:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError:          # not a folder (or gone): a file or a link is simply unlinked
            _unlink(parent_fd, name)
            return
        try:
            _empty(fd)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError:
            pass
    finally:
        os.close(parent_fd)


def _empty(root_fd: int, keep: tuple = ()) -> None:
    """Remove everything inside the folder ``root_fd``, keeping the names in ``keep``.

    However deep the tree, no more than two folders are open at once: each pass moves the folders found
    inside a top-level folder up to the top (a rename, within one file system), deletes that folder's
    other entries and then the folder, until no folder is left."""
    token = os.urandom(6).hex()
    moved = itertools.count()
    while True:
        progress = False
        for name in _names(root_fd, keep):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError:              # a file, a link, a device: unlinked (a link is never followed)
                progress |= _unlink(root_fd, name)
                continue
            try:
                for inner in _names(child):
                    try:
                        is_dir = stat.S_ISDIR(os.stat(inner, dir_fd=child, follow_symlinks=False).st_mode)
                    except OSError:
                        continue
                    if not is_dir:
                        progress |= _unlink(child, inner)
                        continue
                    try:
                        os.rename(inner, f".removing-{token}-{next(moved)}", src_dir_fd=child, dst_dir_fd=root_fd)
                        progress = True
                    except OSError:
                        pass
            finally:
                os.close(child)
            try:
                os.rmdir(name, dir_fd=root_fd)
                progress = True
            except OSError:
                pass
        if not progress:
            return


def _names(fd: int, keep: tuple = ()) -> list[str]:
    try:
        return [n for n in os.listdir(fd) if n not in keep]
    except OSError:
        return []


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _walk(root: str):
    """(relative path, lstat) of every entry below ``root``, parents first, in name order."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in found:
            if not rel_dir and entry.name in (HOME, TMP):
                continue
            if rel_dir.count("/") + 1 > MAX_DEPTH:       # deeper than that is listed as one entry, not walked
                yield os.path.join(rel_dir, entry.name), None
                break
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))


def _open_parent(root_fd: int, rel: str) -> tuple[int, str]:
    """A descriptor of ``rel``'s folder, reached from ``root_fd`` one name at a time, no link followed."""
    *folders, name = rel.split("/")
    if name in ("", ".", "..") or any(part in ("", ".", "..") for part in folders) or len(folders) >= MAX_DEPTH:
        raise ValueError(f"refused path {rel!r}")
    fd = root_fd
    for part in folders:
        next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
        if fd != root_fd:
            os.close(fd)
        fd = next_fd
    return fd, name


def _read_beneath(root: str, rel: str, budget: int) -> bytes:
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        parent, name = _open_parent(root_fd, rel)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        finally:
            if parent != root_fd:
                os.close(parent)
    finally:
        os.close(root_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return b""
        data = f.read(budget + 1)
    if len(data) > budget:
        raise TooLarge(f"more than {MAX_BYTES >> 20} MiB of files")
    return data
