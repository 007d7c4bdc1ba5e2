"""The sandbox's system-call filter (seccomp), installed by its init before any submitted code exists.

Namespaces and Landlock decide what a submission can reach; a few system calls reach past both, and
none of them is needed to run a notebook of this course:

- sockets of any family but Unix, IPv4, IPv6 and route netlink (gloo finds the loopback device through
  it): no raw, packet, vsock (the hypervisor's host), Bluetooth, crypto or other family, whatever the
  namespace would allow;
- memory that no process's count shows, so that no per-process bound and no watchdog would see it:
  SysV shared memory, message queues and semaphores, POSIX message queues (``mq_open``), memfd,
  ``memfd_secret`` and ``vmsplice`` (pages it pins in a pipe stay after they are unmapped). A shared
  anonymous mapping (``mmap`` with ``MAP_SHARED|MAP_ANONYMOUS``, which notebook 03 shows and its wrong
  answers use) is made only up to ``SHARED_ANONYMOUS_BYTES``: its object keeps every page it was given
  after all but one page of it is unmapped, or after ``MADV_DONTNEED``, where no count of the process
  shows them, so the watchdog charges each such object its largest size. Other shared memory a sandbox
  may make is a file on its own size-bounded tmpfs (``/dev/shm``: what DataLoader workers and
  ``multiprocessing`` use); ``/dev/zero`` opens for reading only (Landlock), and a read-only mapping of
  it allocates nothing;
- kernel objects that every sandbox reaches through the files they may all read (the Python installation):
  record locks (``fcntl`` ``F_SETLK``, ``F_SETLKW``, ``F_GETLK`` and their ``F_OFD_`` forms), leases
  (``F_SETLEASE``), directory notices (``F_NOTIFY``), inotify and fanotify. Locking one of those files,
  or reading one while a classmate watches it, would pass bits from one sandbox to another;
  ``flock`` stays allowed (torch.distributed's ``FileStore`` needs it: docs/grading.md says what it leaves);
- the kernel keyrings (``keyctl``, ``add_key``, ``request_key``): the session keyring is inherited from
  the grader, so one sandbox could hand a key to the next;
- ``setsid``: each sandbox is one session, which is the unit the scheduler shares the CPU by where
  there is no cpu cgroup (autogroup); a process that made more sessions would get more CPU;
- io_uring (its operations bypass this filter), ptrace and ``process_vm_*``, ``pidfd_getfd``, ``bpf``,
  ``perf_event_open`` and ``userfaultfd``: kernel surface no course code uses.

A refused call fails with EPERM (EAFNOSUPPORT for a socket family), as on a machine that lacks it.
Other architectures than x86_64 and aarch64, and calls made through another ABI (32-bit x86, x32),
are refused whole.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from autograder.grading.confine import PR_SET_NO_NEW_PRIVS, _libc

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0

# name -> (x86_64, aarch64); numbers from <asm/unistd_64.h> and <asm-generic/unistd.h>
# (None: the architecture has no such call.)
_REFUSED = {
    "setsid": (112, 157), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "shmget": (29, 194), "msgget": (68, 186), "semget": (64, 190), "memfd_create": (319, 279),
    "mq_open": (240, 180), "memfd_secret": (447, 447), "vmsplice": (278, 75),
    "inotify_init": (253, None), "inotify_init1": (294, 26), "fanotify_init": (300, 262),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
}
_SOCKET = {"socket": (41, 198), "socketpair": (53, 199)}
_FCNTL, _MMAP = (72, 25), (9, 222)
# F_GETLK, F_SETLK, F_SETLKW (the same numbers for their 64-bit forms on 64-bit ABIs), F_OFD_GETLK,
# F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY
FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20            # MAP_SHARED_VALIDATE (0x03) has the shared bit too
SHARED_ANONYMOUS_BYTES = 16 << 20                 # the most one shared anonymous object may hold
_ARCH = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}
REFUSED_CALLS = tuple(_REFUSED)

# classic BPF, as seccomp runs it on struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];}
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH_OFFSET, _ARG0, _ARG1, _ARG2, _ARG3 = 0, 4, 16, 24, 32, 40   # low 32 bits of args[n] (little-endian)
_ARG1_HIGH = 28
_X32_BIT = 0x40000000
_NEXT = None                                          # a jump target: the next instruction


def _program(column: int, audit_arch: int) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k). Written with labels; jumps become the counts they skip."""
    refused = sorted(numbers[column] for numbers in _REFUSED.values() if numbers[column] is not None)
    code = [("ld", _ARCH_OFFSET), ("jeq", audit_arch, _NEXT, "deny"),
            ("ld", _NR), ("jge", _X32_BIT, "deny", _NEXT)]
    code += [("jeq", numbers[column], "family", _NEXT) for numbers in _SOCKET.values()]
    code += [("jeq", _FCNTL[column], "fcntl", _NEXT), ("jeq", _MMAP[column], "mmap", _NEXT)]
    code += [("jeq", nr, "deny", _NEXT) for nr in refused]
    code += [("ret", _ALLOW),
             "fcntl", ("ld", _ARG1)]
    code += [("jeq", command, "deny", _NEXT) for command in FCNTL_REFUSED]
    code += [("ret", _ALLOW),
             "mmap", ("ld", _ARG3), ("jset", MAP_ANONYMOUS, _NEXT, "allow"), ("jset", MAP_SHARED, _NEXT, "allow"),
             ("ld", _ARG1_HIGH), ("jeq", 0, _NEXT, "deny"),
             ("ld", _ARG1), ("jge", SHARED_ANONYMOUS_BYTES + 1, "deny", "allow"),
             "family", ("ld", _ARG0),
             ("jeq", AF_UNIX, "allow", _NEXT), ("jeq", AF_INET, "allow", _NEXT),
             ("jeq", AF_INET6, "allow", _NEXT), ("jeq", AF_NETLINK, _NEXT, "no family"),
             ("ld", _ARG2), ("jeq", NETLINK_ROUTE, "allow", "no family"),
             "allow", ("ret", _ALLOW),
             "no family", ("ret", _ERRNO | errno.EAFNOSUPPORT),
             "deny", ("ret", _ERRNO | errno.EPERM)]
    labels, at = {}, 0
    for item in code:
        if isinstance(item, str):
            labels[item] = at
        else:
            at += 1
    program = []
    for item in code:
        if isinstance(item, str):
            continue
        here = len(program)
        skip = lambda label: 0 if label is _NEXT else labels[label] - here - 1   # noqa: E731
        op, k, *targets = item
        if op == "ld":
            program.append((_LD_ABS, 0, 0, k))
        elif op == "ret":
            program.append((_RET, 0, 0, k))
        else:
            jump = {"jeq": _JEQ, "jge": _JGE, "jset": _JSET}[op]
            program.append((jump, skip(targets[0]), skip(targets[1]), k))
    return program


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> str:
    """Install the filter on this (single-threaded) process and all it starts; what the report says."""
    arch = _ARCH.get(platform.machine())
    if arch is None:
        return f"off (no filter for {platform.machine()})"
    program = _program(*arch)
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if _libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:           # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return "off (" + os.strerror(ctypes.get_errno()) + ")"
    return (f"seccomp ({len(_REFUSED)} calls, fcntl locks, shared anonymous maps over "
            f"{SHARED_ANONYMOUS_BYTES >> 20} MiB and foreign socket families refused)")
