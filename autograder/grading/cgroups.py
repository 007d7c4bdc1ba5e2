"""A cgroup per sandbox (processes, memory, CPU), where this machine lets the grader make one.

Two ways to get one:

- **cgroup v1** (the hierarchies under ``/sys/fs/cgroup/<controller>``): a group next to the grader's own
  in each controller it may write to; in practice only as root.
- **cgroup v2**, from a subtree delegated to the grading user: a systemd scope or service with
  ``Delegate=yes`` (``systemd-run --user --scope -p Delegate=yes python3 workbook.py grade ...``), or the
  cgroup a container gives. v2 lets a cgroup with processes hand no controller to its children, so the
  grader's own processes move into a leaf (``workbook-grader``) of the delegated cgroup first; the
  sandboxes' groups are its siblings.

Each group is named after the grading process (pid and start time), so a later run can tell the groups
and folders of a grader that died (killed, out of memory) from those of one still running, and remove
them (``sweep``). A group whose processes are still being reaped when its sandbox closes is removed later
instead of being waited for (at the next group made, or at exit). ``remove_all`` ends every sandbox this
process still has and removes its groups: a process that is ended (a Dask worker's SIGTERM) calls it first,
as nothing else would remove them until another grader's sweep.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import tempfile
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "workbook-sandbox-"
V1_CONTROLLERS = ("pids", "memory", "cpu")
_counter = itertools.count()
_pending: list[Path] = []          # groups whose removal has to wait for their processes to be reaped
_live: dict[Path, None] = {}       # groups made and not yet removed (in order), for remove_all
_v2_base: dict = {}                # "path": the delegated v2 cgroup the sandboxes' groups go in (cached)


def owner_tag(pid: int | None = None) -> str:
    """``<pid>-<start time>`` of a process: it names what that process made, and stays unique across pid reuse."""
    pid = os.getpid() if pid is None else pid
    with open(f"/proc/{pid}/stat", "rb") as f:
        start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    return f"{pid}-{start}"


def owner_alive(tag: str | None) -> bool:
    """Whether the process ``tag`` names still runs; an unknown tag (another version's name) counts as alive,
    so what another grader made is never touched on a guess."""
    if tag is None:
        return True
    try:
        return owner_tag(int(tag.split("-")[0])) == tag
    except (OSError, ValueError, IndexError):
        return False


# ---- making and removing a sandbox's groups -------------------------------------------------------

def make(processes: int, memory_bytes: int) -> dict[str, str]:
    """The sandbox's groups, {controller: path}, set to these limits; {} where none can be made."""
    _retry_pending()           # a long-lived grader (a Dask worker) does not pile them up
    name = f"{PREFIX}{owner_tag()}-{next(_counter)}"
    base = _delegated_v2()
    if base is not None:
        group = base / name
        try:
            group.mkdir()
            _write(group / "pids.max", processes)
            _write(group / "memory.max", memory_bytes)
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", 0)
        except OSError:
            remove({"v2": str(group)})
            return {}
        made = {"v2": str(group), "pids": str(group), "memory": str(group)}
        if "cpu" in (group / "cgroup.controllers").read_text().split():
            made["cpu"] = str(group)
        _live[group] = None
        return made
    made = {}
    for controller, settings in (("pids", {"pids.max": processes}),
                                 ("memory", {"memory.limit_in_bytes": memory_bytes}), ("cpu", {})):
        parent = _v1_parent(controller)
        if parent is None:
            continue
        group = parent / name
        try:
            group.mkdir()
            for key, value in settings.items():
                _write(group / key, value)
        except OSError:
            _remove_now(group)
            continue
        made[controller] = str(group)
        _live[group] = None
    return made


def remove(groups: dict[str, str]) -> None:
    """Remove a sandbox's groups, killing what is left in them; a group still busy is removed later."""
    for path in dict.fromkeys(groups.values()):
        group = Path(path)
        _live.pop(group, None)
        if not _remove_now(group):
            _pending.append(group)


def remove_all(wait: float = 5.0) -> list[Path]:
    """Kill what runs in every group this process made and remove them all, waiting up to ``wait`` seconds for
    their processes to be reaped (by the zygote, or by init once their parent is gone); the groups left. Only
    its own: a child forked from a grader (a check's rank) inherits the lists, not the sandboxes."""
    mine = f"{PREFIX}{owner_tag()}-"
    groups = [group for group in dict.fromkeys([*_live, *_pending]) if group.name.startswith(mine)]
    for group in groups:
        _kill_members(group)
    deadline = time.monotonic() + wait
    while True:
        left = [group for group in groups if not _remove_now(group, tries=1)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for group in groups:
        _live.pop(group, None)
        if group in _pending and group not in left:
            _pending.remove(group)
    _pending.extend(group for group in left if group not in _pending)
    return left


def _retry_pending() -> None:
    for group in list(_pending):
        if _remove_now(group, tries=1):
            _pending.remove(group)


def _remove_now(group: Path, tries: int = 5) -> bool:
    for _ in range(tries):
        if not group.exists():
            return True
        try:
            group.rmdir()
            return True
        except OSError:
            _kill_members(group)
            time.sleep(0.01)
    return not group.exists()


def _kill_members(group: Path) -> None:
    if (group / "cgroup.kill").exists():       # cgroup v2, Linux 5.14+: the kernel kills them all at once
        try:
            _write(group / "cgroup.kill", 1)
            return
        except OSError:
            pass
    try:
        members = (group / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in members:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass


# ---- what a grader that died left behind ------------------------------------------------------------

def sweep() -> None:
    """Remove the groups this process could not remove at once, and the sandboxes' groups and folders of
    graders that are no longer running (killed, out of memory)."""
    _retry_pending()
    parents = [_v1_parent(controller) for controller in V1_CONTROLLERS] + [_delegated_v2(setup=False)]
    for parent in filter(None, parents):
        try:
            groups = [p for p in parent.iterdir() if p.name.startswith(PREFIX)]
        except OSError:
            continue
        for group in groups:
            if not owner_alive(_tag_of(group.name, PREFIX)):
                _remove_now(group, tries=1)
    from autograder.grading.scratch import remove_tree
    temp = Path(tempfile.gettempdir())
    try:
        folders = [p for p in temp.iterdir() if p.name.startswith(FOLDER_PREFIXES)]
    except OSError:
        return
    for folder in folders:
        try:
            mine = folder.lstat().st_uid == os.getuid() and folder.is_dir() and not folder.is_symlink()
        except OSError:
            continue
        prefix = next(p for p in FOLDER_PREFIXES if folder.name.startswith(p))
        if mine and not owner_alive(_tag_of(folder.name, prefix)):
            remove_tree(str(folder))


FOLDER_PREFIXES = ("workbook-judge-", "workbook-import-")     # scratch folders; layout.import_root()


def _tag_of(name: str, prefix: str) -> str | None:
    """``<pid>-<start>`` from ``<prefix><pid>-<start>-<anything>``; None for a name of any other shape."""
    parts = name[len(prefix):].split("-")
    if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit() and parts[2]:
        return f"{parts[0]}-{parts[1]}"
    return None


atexit.register(remove_all)     # a sandbox still open at exit has its processes ended with it


# ---- where groups can be made ------------------------------------------------------------------------

def _write(path: Path, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _own_path(hierarchy: str) -> str | None:
    """This process's cgroup in a v1 controller's hierarchy, or in v2 (``hierarchy`` = "")."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if (hierarchy == "" and number == "0" and controllers == "") or hierarchy in controllers.split(","):
            return path
    return None


def _v1_parent(controller: str) -> Path | None:
    hierarchy = ROOT / controller
    own = _own_path(controller)
    if own is None or not hierarchy.is_dir():
        return None
    parent = hierarchy / own.lstrip("/")
    return parent if os.access(parent, os.W_OK) else None


def _v2_mount() -> Path | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] == "cgroup2":
            return Path(fields[0].split()[4])
    return None


def _delegated_v2(setup: bool = True) -> Path | None:
    """The v2 cgroup the sandboxes' groups go in: this process's own, if it was delegated to this user and
    offers memory and pids. With ``setup``, the controllers are handed down to its children (moving this
    cgroup's processes into a leaf first, as v2 requires)."""
    if "path" in _v2_base:
        return _v2_base["path"]
    mount, own = _v2_mount(), _own_path("")
    if mount is None or own is None:
        return None
    base = mount / own.lstrip("/")
    if base.name == "workbook-grader":          # a grader forked from one that set this up already
        base = base.parent
    try:
        offered = set((base / "cgroup.controllers").read_text().split())
        enabled = set((base / "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    if not {"memory", "pids"} <= offered or not os.access(base / "cgroup.subtree_control", os.W_OK) \
            or not os.access(base / "cgroup.procs", os.W_OK):
        return None
    if not setup:
        return base
    wanted = {"memory", "pids", "cpu"} & offered
    try:
        if not wanted <= enabled:
            leaf = base / "workbook-grader"
            leaf.mkdir(exist_ok=True)
            for pid in (base / "cgroup.procs").read_text().split():
                try:
                    _write(leaf / "cgroup.procs", pid)
                except ProcessLookupError:
                    pass
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted - enabled)))
    except OSError:
        return None
    _v2_base["path"] = base
    return base
