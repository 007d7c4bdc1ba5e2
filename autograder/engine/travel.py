"""What travels to a fresh process, and what did not, for the checks' messages: the regular files of the
checkpoint's folder (never a link), the files a save wrote elsewhere (an audit hook in the forked child that
runs it), and the learner's globals that could not travel, in words."""

from __future__ import annotations

import os
import sys
import tempfile

def copy_regular_files(source: str, target: str) -> list[str]:
    """Copy the bytes of every regular file in the folder ``source`` (not its links, wherever they point,
    nor its subfolders) into the folder ``target``; their names. What the check moves to a fresh process is
    what the save left on disk where it was told to write: no link to follow, no hard link through which
    another process could change the bytes."""
    copied = []
    for name in sorted(os.listdir(source)):
        try:
            fd = os.open(os.path.join(source, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat_is_regular(os.fstat(fd)):
                continue
            with open(os.path.join(target, name), "wb") as out:
                while chunk := os.read(fd, 1 << 20):
                    out.write(chunk)
            copied.append(name)
        finally:
            os.close(fd)
    return copied


def stat_is_regular(st) -> bool:
    import stat
    return stat.S_ISREG(st.st_mode)


def recording_writes_outside(folder: str) -> list:
    """In a forked child that is about to run the learner's save: a list that fills with (place, name) for
    each file the save opens for writing, or renames or links to, outside ``folder`` (an audit hook, which
    lives as long as the child does)."""
    inside, opened = os.path.realpath(folder) + os.sep, []
    places = [(os.path.realpath("/dev/shm"), "/dev/shm"), (os.path.realpath(tempfile.gettempdir()), "the temp folder"),
              (os.path.realpath(os.path.expanduser("~")), "the home folder")]

    def note(path) -> None:
        try:
            where = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return
        if where.startswith(inside) or where == os.devnull or len(opened) >= 8:
            return
        place = next((name for root, name in places if where.startswith(root + os.sep)), "elsewhere")
        opened.append([place, os.path.basename(where)])

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) == 3 and not isinstance(args[0], int):
            path, mode, flags = args
            writing = (any(c in (mode or "") for c in "wax+") if mode is not None
                       else bool((flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)))
            if writing:
                note(path)
        elif event in ("os.rename", "os.link", "os.symlink") and len(args) >= 2:
            note(args[1])
        elif event == "shutil.copyfile" and len(args) >= 2:
            note(args[1])
    sys.addaudithook(hook)
    return opened


def what_did_not_travel(seen: dict, save: str, load: str) -> str:
    """In words: the learner's globals and closure variables that could not be handed to the fresh process,
    and where the save wrote files outside the checkpoint's folder ("" when neither)."""
    parts = [f"{load} uses {name}, {what}: nothing of it reaches a process that starts afresh."
             for name, what in list(seen.get("left_out", {}).items())[:3]]
    places = list(dict.fromkeys(place for place, _ in seen.get("written_outside", [])))
    if places:
        parts.append(f"{save} also wrote files in {' and '.join(places)}, which that process cannot read.")
    return " ".join(parts) + (" " if parts else "")
