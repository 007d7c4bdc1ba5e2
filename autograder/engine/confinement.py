"""The confinement of a fresh process (``fresh_process``), where the kernel has it: Landlock lets it read
the Python installation, this package and the files it is given, and write its own folder only; it may not
bind or connect over TCP, reach an abstract socket, or signal processes outside it (Landlock ABI 4 and 6);
a seccomp filter refuses ``socket()`` and any system call of a foreign ABI. What the machine lacks is
skipped, and ``fresh_process.confinement()`` says so.

(The grading sandbox confines a whole submission with more: autograder/grading/confine.py.)
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

from . import portable

_PYTHON = sys.executable      # bound at import, before any submitted code runs
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# Landlock (include/uapi/linux/landlock.h): filesystem rights by ABI, TCP rights (ABI 4), scopes (ABI 6).
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = 1 | 4 | 8          # EXECUTE | READ_FILE | READ_DIR
_FILE_RIGHTS = 1 | 2 | 4 | (1 << 14) | (1 << 15)    # what applies to a file (not a folder)
_READABLE: dict = {}     # the server computes the roots once; its children inherit them
# Of /proc, what describes the machine, not its processes: a fresh process reads its own entries (added in
# ``confine``), never another process's command line, environment, memory maps or memory.
_SYSTEM = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/opt",
           "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys", "/proc/filesystems",
           "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]


def _syscall():
    call = _libc.syscall
    call.restype = ctypes.c_long
    return call


def _landlock_abi() -> int:
    if _libc is None:
        return 0
    return max(0, _syscall()(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def readable_roots() -> list[str]:
    """What a fresh process may read besides the files it is given: the system's libraries, the Python
    installation and this package (not the folder this package lies in)."""
    roots = set(_SYSTEM) | set(portable.trusted_roots())
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(_PYTHON))}
    return sorted(root for root in roots if os.path.exists(root))


def confine(readable: list[str], writable: list[str], listable: list[str] = ()) -> dict:
    """In a fresh process, before its task is unpacked: Landlock and seccomp as described above.
    ``listable`` folders may be listed, not read (where a module of the learner's own lies)."""
    if _libc is not None:
        _prctl(38, 1)                      # PR_SET_NO_NEW_PRIVS, which both require
    roots = (_READABLE.get("roots") or readable_roots()) + [f"/proc/{os.getpid()}"]
    done = {"landlock": _apply_landlock(roots + readable, writable + ["/dev/null"], list(listable)),
            "seccomp": _apply_seccomp()}
    return done


def _apply_landlock(readable: list[str], writable: list[str], listable: list[str] = ()) -> int:
    abi = _landlock_abi()
    if abi < 1:
        return 0
    call = _syscall()
    fs = _FS_RIGHTS[min(abi, 5)]
    net = 3 if abi >= 4 else 0              # BIND_TCP | CONNECT_TCP: none allowed
    scoped = 3 if abi >= 6 else 0           # abstract UNIX sockets and signals of processes outside
    attr = struct.pack("QQQ", fs, net, scoped) if abi >= 6 else struct.pack("QQ", fs, net) if abi >= 4 \
        else struct.pack("Q", fs)
    ruleset = call(444, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    try:
        for paths, rights in ((readable, _READ), (writable, fs), (listable, 8)):     # 8: READ_DIR
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    granted = rights if os.path.isdir(path) else rights & _FILE_RIGHTS
                    rule = struct.pack("=Qi", granted, fd)
                    call(445, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_char_p(rule), ctypes.c_uint32(0))
                finally:
                    os.close(fd)
        if call(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)):
            return 0
    finally:
        os.close(ruleset)
    return abi


def _seccomp_program() -> bytes | None:
    """A BPF filter that makes socket() fail with EPERM (and any syscall of a foreign ABI), else None
    where this machine's numbers are not known here."""
    arch, number = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}.get(platform.machine(), (None, None))
    if arch is None or _libc is None:
        return None
    def op(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)
    deny, allow = 0x00050000 | 1, 0x7FFF0000     # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    foreign = 0x40000000 if arch == 0xC000003E else 0xFFFFFFFF   # x32's numbers on x86_64
    return b"".join([
        op(0x20, 0, 0, 4),              # load the architecture
        op(0x15, 1, 0, arch),           # native: go on
        op(0x06, 0, 0, deny),
        op(0x20, 0, 0, 0),              # load the syscall number
        op(0x15, 2, 0, number),         # socket(): deny
        op(0x35, 1, 0, foreign),        # x32 ABI: deny
        op(0x06, 0, 0, allow),
        op(0x06, 0, 0, deny),
    ])


def _apply_seccomp() -> bool:
    program = _seccomp_program()
    if program is None:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
    prog = ctypes.create_string_buffer(fprog, len(fprog))
    return _prctl(22, 2, ctypes.addressof(prog)) == 0     # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _prctl(option: int, *args: int) -> int:
    values = [ctypes.c_ulong(a) for a in (*args, 0, 0, 0, 0)[:4]]
    return _libc.prctl(ctypes.c_int(option), *values)
