"""How a sandbox confines itself, in its own process, before any submitted code exists there.

1. joins its own pids, memory and cpu cgroups where the judge could make them
   (``autograder.grading.cgroups``);
2. resource limits: address space (what Python and torch map already, plus the submission's allowance:
   memory bombs get MemoryError), file size, CPU time, open files; it is the first process the kernel
   ends when the machine runs out of memory;
3. new user, network, PID, mount, IPC, UTS and cgroup namespaces: no network but its own loopback,
   private /dev/shm and scratch folders, no SysV IPC object outlives it, and every process it starts dies
   with it. Then the process ceiling: without a pids cgroup, RLIMIT_NPROC, which Linux 5.14 and newer
   count per user namespace, so per sandbox;
4. in the namespace's init: its own /proc, then Landlock: it may read the Python installation and the
   ``autograder`` package, and write only its own folders. The course folder (solutions with hidden
   tests, the gradebook, other students' submissions) is out of reach, and the init checks that it is;
   then the system-call filter (``seccomp``) and no capabilities left.

Each step that the machine does not support is skipped and reported to the judge, which decides whether
grading may go on (``autograder.grading.protections``). Notebook 05's crash trials reuse the namespace
primitives (``map_ids_to_self``, ``exit_code``).
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
CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP = 0x08000000, 0x04000000, 0x02000000
NAMESPACES = "user+net+pid+mount+ipc+uts+cgroup"
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 38, 24
# Landlock filesystem rights, by ABI version (include/uapi/linux/landlock.h).
_LANDLOCK_ABI_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = 1 | 4 | 8  # EXECUTE | READ_FILE | READ_DIR


# ---- confinement (runs before any submitted code) ------------------------------------------------

def _join_cgroups(groups: dict, without: list) -> dict:
    for path in dict.fromkeys(path for key, path in groups.items() if key != "v2"):
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    cpu = "cgroup" if "cpu" in groups else _SKIPPED if "autogroup" in without else _cpu_share()
    return {"processes": "cgroup" if "pids" in groups else "off", "memory": "cgroup" if "memory" in groups else "off",
            "cpu": cpu}


_SKIPPED = "off (switched off by WORKBOOK_SANDBOX_WITHOUT)"
# Files and folders on each of its tmpfs: an empty file costs no size but about 1 KiB of kernel memory, which
# only a memory cgroup counts; the default (half the machine's pages) would let 3 million of them hold 3 GiB.
FILES_PER_TMPFS = 65536


def _cpu_share() -> str:
    """Without a cpu cgroup of its own: does the scheduler share the CPU between sandboxes, not processes?

    Autogroup (``kernel.sched_autogroup_enabled``) gives every session its own group; a sandbox is one
    session (it may not make another: ``setsid`` is refused), so a hundred spinning processes get one
    sandbox's share. It works only where the process is in no cpu cgroup of its own (the root)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            enabled = f.read().strip() == "1"
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return "shared (no cpu cgroup, no autogroup)"
    if not enabled:
        return "shared (no cpu cgroup; autogroup is off: kernel.sched_autogroup_enabled=0)"
    v1 = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
    if v1:
        in_root = v1[0] == "/"
    else:
        v2 = next((path for number, controllers, path in lines if number == "0"), "/")
        try:
            with open(f"/sys/fs/cgroup{v2.rstrip('/')}/cgroup.controllers") as f:
                in_root = v2 == "/" or "cpu" not in f.read().split()
        except OSError:
            in_root = v2 == "/"
    return "autogroup (one session)" if in_root else "shared (no cpu cgroup of its own; autogroup cannot act in one)"


def mapped_bytes() -> int:
    """What this process maps now (its address space's size)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _set_limits(limits: dict) -> int:
    """The rlimits that need no namespace; the address space is what is mapped now (Python, torch: 0.7 GiB
    for torch's CPU build, 3.8 GiB for its CUDA build) plus the submission's allowance. Returns the former."""
    base = mapped_bytes()
    for name, value in (("RLIMIT_AS", base + limits["memory_bytes"]), ("RLIMIT_FSIZE", limits["file_bytes"]),
                        ("RLIMIT_CPU", limits["cpu_seconds"]), ("RLIMIT_NOFILE", limits["open_files"]),
                        ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    try:
        with open("/proc/self/oom_score_adj", "w") as f:     # out of memory: the kernel ends a sandbox first
            f.write("1000")
    except OSError:
        pass
    return base


def _process_ceiling(limits: dict, report: dict) -> str:
    """Without a pids cgroup: RLIMIT_NPROC, set after the user namespace is made. Linux 5.14 and newer count
    it per user namespace (the ucounts), so it bounds this sandbox alone; older kernels count the user's
    processes everywhere, so the cap leaves room for those already running and is shared with them."""
    if report["processes"] == "cgroup":
        return "cgroup"
    if os.geteuid() == 0:
        return "off (no pids cgroup, and root is exempt from RLIMIT_NPROC)"
    if report["namespaces"] == NAMESPACES and _kernel_at_least(5, 14):
        cap = limits["processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
        return "RLIMIT_NPROC per sandbox (counted in its user namespace)"
    mine = sum(1 for entry in os.listdir("/proc") if entry.isdigit() and _owner(entry) == os.getuid())
    cap = mine + limits["processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
    return "RLIMIT_NPROC per user (shared with the grading user's other processes)"


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


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
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
                     | CLONE_NEWCGROUP) != 0:
        return "off (" + os.strerror(ctypes.get_errno()) + ")"
    map_ids_to_self(uid, gid)
    # The new network namespace has only a loopback device, down: bring it up (gloo demos use it).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request))[1]          # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))              # SIOCSIFFLAGS |= IFF_UP
    return NAMESPACES


def _mount(source: str, target: str, fstype: str | None, flags: int, options: str | None) -> bool:
    mount = _libc.mount
    mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                 options.encode() if options else None) == 0


def _private_folders(config: dict) -> str:
    """Its own size-bounded tmpfs on /dev/shm and on the judge's scratch path, which holds its home and
    temp folder too (``autograder.grading.scratch``).

    Sandboxes graded side by side then share no folder one of them could fill, or leave a file in for
    the next; files it writes live in memory it is charged for (their size and their number bounded); and
    the judge's own scratch folder (the same path outside) is hidden: the judge only ever sees copies of
    what the submission wrote there."""
    if not _mount("none", "/", None, MS_REC | MS_PRIVATE, None):
        return "shared (" + os.strerror(ctypes.get_errno()) + ")"
    limits = config["limits"]
    for target, size, mode in (("/dev/shm", limits["shm_bytes"], "1777"), (config["scratch"], limits["disk_bytes"], "700")):
        options = f"size={size},nr_inodes={FILES_PER_TMPFS},mode={mode}"
        if not _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options):
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
    """Everything but /proc, Landlock, the course check and the system-call filter, which the namespace's
    init sets up (``confine_init``)."""
    without = config.get("without", [])
    report = _join_cgroups(config.get("cgroup") or {}, without)
    report["mapped"] = _set_limits(config["limits"])
    report["namespaces"] = _SKIPPED if "namespaces" in without else _namespaces()
    report["processes"] = _process_ceiling(config["limits"], report)
    report["folders"] = _private_folders(config) if report["namespaces"] == NAMESPACES else "shared"
    return report


def confine_init(config: dict, report: dict) -> None:
    """In PID 1 of the new namespace: its own /proc, then Landlock (after which nothing can be mounted),
    then whether the course can be read (it must not), the system-call filter and no capabilities."""
    report["proc"] = _own_proc() if report["namespaces"] == NAMESPACES else "shared"
    # The scratch path holds its own tmpfs here; without one it is the judge's folder itself (weaker).
    without = config.get("without", [])
    report["filesystem"] = _SKIPPED if "landlock" in without else \
        _landlock(config["readable"], config["writable"] + [config["scratch"]])
    report["course"] = _course_unreadable(config.get("protected", []))
    from autograder.grading import seccomp
    report["syscalls"] = _SKIPPED if "seccomp" in without else seccomp.install()
    report["capabilities"] = _drop_capabilities()


def _course_unreadable(protected: list[str]) -> str:
    """Try to open each of the judge's protected paths (the course folder, the gradebook, the submissions)
    from in here: Landlock should refuse every one. A path that opens is named in the report."""
    tried = 0
    for path in protected:
        if not os.path.lexists(path):
            continue
        tried += 1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        os.close(fd)
        return f"READABLE ({path})"
    return f"unreadable (checked {tried} paths from inside)"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> str:
    """Its user namespace gave it every capability there (reading root-owned files it maps, ptrace, raw
    sockets): once the mounts are made, none is needed. The bounding set goes too, so nothing regains one."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:   # EINVAL: no such cap
            break
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data) != 0:     # _LINUX_CAPABILITY_VERSION_3
        return "kept (" + os.strerror(ctypes.get_errno()) + ")"
    return "none"


def exit_code(status: int) -> int:
    """A child's exit code as a parent passes it on: a death by signal N becomes 128 + N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
