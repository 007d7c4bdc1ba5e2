"""How a sandbox confines itself, in its own process, before any submitted code exists there.

1. joins its own pids and memory cgroups (or lowers RLIMIT_NPROC): a fork bomb hits a ceiling;
2. resource limits: address space (memory bombs get MemoryError), file size, CPU time, open files;
3. new user, network, PID and mount namespaces: no network but its own loopback, private /dev/shm
   and scratch folders, and every process it starts dies with it;
4. in the namespace's init: its own /proc, then Landlock: it may read the Python installation and
   the ``autograder`` package, and write only its own folders. The course folder (solutions with
   hidden tests, the gradebook, other students' submissions) is out of reach.

Each step that the machine does not support is skipped and reported to the judge. Notebook 05's
crash trials reuse the namespace primitives (``map_ids_to_self``, ``exit_code``).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import socket
import struct

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS = 0x10000000, 0x40000000, 0x20000000, 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# Landlock filesystem rights, by ABI version (include/uapi/linux/landlock.h).
_LANDLOCK_ABI_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR



# ---- confinement (runs before any submitted code) ------------------------------------------------

def _join_cgroups(groups: dict) -> dict:
    for path in groups.values():
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    return {"processes": "cgroup" if "pids" in groups else "off", "memory": "cgroup" if "memory" in groups else "off"}


def _set_limits(limits: dict, cgroup: str) -> None:
    for name, value in (("RLIMIT_AS", limits["memory_bytes"]), ("RLIMIT_FSIZE", limits["file_bytes"]),
                        ("RLIMIT_CPU", limits["cpu_seconds"]), ("RLIMIT_NOFILE", limits["open_files"]),
                        ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if cgroup == "off" and os.geteuid() != 0:
        # Without a cgroup the cap counts all of this user's processes, so leave room for the ones running.
        mine = sum(1 for entry in os.listdir("/proc") if entry.isdigit() and _owner(entry) == os.getuid())
        cap = mine + limits["processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))


def _owner(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def map_ids_to_self(uid: int, gid: int) -> None:
    """In a new user namespace: this user and group are themselves there (and no other group)."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _namespaces() -> str:
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS) != 0:
        return "off (" + os.strerror(ctypes.get_errno()) + ")"
    map_ids_to_self(uid, gid)
    # The new network namespace has only a loopback device, down: bring it up (gloo demos use it).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request))[1]          # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))              # SIOCSIFFLAGS |= IFF_UP
    return "user+net+pid+mount"


def _mount(source: str, target: str, fstype: str | None, flags: int, options: str | None) -> bool:
    mount = _libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                 options.encode() if options else None) == 0


def _private_folders(config: dict) -> str:
    """Its own size-bounded tmpfs on /dev/shm and on the judge's scratch path, which holds its home and
    temp folder too (``autograder.grading.scratch``).

    Sandboxes graded side by side then share no folder one of them could fill, or leave a file in for
    the next; files it writes live in memory it is charged for; and the judge's own scratch folder (the
    same path outside) is hidden: the judge only ever sees copies of what the submission wrote there."""
    if not _mount("none", "/", None, MS_REC | MS_PRIVATE, None):
        return "shared (" + os.strerror(ctypes.get_errno()) + ")"
    limits = config["limits"]
    for target, size, mode in (("/dev/shm", limits["shm_bytes"], "1777"), (config["scratch"], limits["disk_bytes"], "700")):
        if not _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}"):
            return "shared (" + os.strerror(ctypes.get_errno()) + f" on {target})"
    from autograder.grading.scratch import HOME, TMP
    home = os.path.join(config["scratch"], HOME)
    for folder in (home, os.path.join(home, "mpl"), os.path.join(config["scratch"], TMP)):
        os.mkdir(folder)
    os.chdir(home)     # the cwd still named the folder under the new mount
    return "private tmpfs"


def _own_proc() -> str:
    """In the namespace's init: a /proc that shows this sandbox's processes only (no other command lines)."""
    if not _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
        return "shared (" + os.strerror(ctypes.get_errno()) + ")"
    return "own"


def _landlock(readable: list[str], writable: list[str]) -> str:
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))               # landlock_create_ruleset: ABI
    if abi < 1:
        return "off (Landlock unavailable)"
    handled = _LANDLOCK_ABI_RIGHTS[min(abi, 5)]
    attr = struct.pack("Q", handled)
    ruleset = syscall(444, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return "off (" + os.strerror(ctypes.get_errno()) + ")"
    for paths, rights in ((readable, _READ), (writable, handled)):
        for path in paths:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                granted = rights     # a file takes only the rights that apply to files (this one, not the next)
                if not os.path.isdir(path):
                    granted &= 1 | 2 | 4 | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
                rule = struct.pack("=Qi", granted, fd)
                if syscall(445, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_char_p(rule), ctypes.c_uint32(0)):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)):
        return "off (" + os.strerror(ctypes.get_errno()) + ")"
    os.close(ruleset)
    return f"Landlock ABI {abi}"


def confine(config: dict) -> dict:
    """Everything but Landlock and /proc, which the namespace's init sets up (``_init``)."""
    report = _join_cgroups(config.get("cgroup") or {})
    _set_limits(config["limits"], report["processes"])
    if report["processes"] == "off" and os.geteuid() != 0:
        report["processes"] = "RLIMIT_NPROC"
    report["namespaces"] = _namespaces()
    report["folders"] = _private_folders(config) if report["namespaces"].startswith("user") else "shared"
    return report


def confine_init(config: dict, report: dict) -> None:
    """In PID 1 of the new namespace: its own /proc, then Landlock (after which nothing can be mounted)."""
    report["proc"] = _own_proc() if report["namespaces"].startswith("user") else "shared"
    # The scratch path holds its own tmpfs here; without one it is the judge's folder itself (weaker).
    report["filesystem"] = _landlock(config["readable"], config["writable"] + [config["scratch"]])


def exit_code(status: int) -> int:
    """A child's exit code as a parent passes it on: a death by signal N becomes 128 + N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
