#!/usr/bin/env python3
"""How fast can two sandboxes graded side by side pass bits through what they still share? (not a test)

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kernel_channels.py [--bits 2000] [--slots 50 20 10]

docs/grading.md ("What is not defended") lists what two sandboxes running at the same time still share:
``flock`` locks on files both may read (torch.distributed's FileStore needs ``flock``), shared futexes on
pages of such files, and the machine itself (CPU time, global counters). This runs two real sandboxes
(``autograder.grading.sandbox``) and measures three of those channels on this machine:

- flock: a sender in one sandbox and a receiver in the other, with a handshake over three files of the
  Python installation (data, clock, acknowledgement), so no bit is lost: bits per second, no errors;
- futex: the sender waits on one of two words of a read-only page of such a file, the receiver wakes
  either and learns which from the count woken (the wake also ends the wait: a handshake); bits per second;
- CPU contention: the sender spins (1) or sleeps (0) for a slot, the receiver counts how far it gets in
  each slot; bits per second and error rate per slot length, and the capacity (1 - H(error)) / slot.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autograder.grading.sandbox import Sandbox  # noqa: E402

_FLOCK_COMMON = """
import fcntl, os, time, abc, stat, types
FILES = [os.__file__, abc.__file__, stat.__file__]          # data, clock, acknowledgement
held = {}
def hold(path, on):
    if on and path not in held:
        held[path] = open(path, 'rb')
        fcntl.flock(held[path], fcntl.LOCK_SH)
    elif not on and path in held:
        held.pop(path).close()
def is_held(path):
    with open(path, 'rb') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
def wait_for(path, state, deadline):
    while is_held(path) != state:
        if time.monotonic() > deadline:
            raise TimeoutError(path)
"""

_SENDER = _FLOCK_COMMON + """
data, clock, ack = FILES
t0 = time.monotonic()
for i, bit in enumerate(BITS):
    hold(data, bit)
    hold(clock, i % 2 == 0)
    wait_for(ack, i % 2 == 0, t0 + 120)
RESULT = time.monotonic() - t0
"""

_RECEIVER = _FLOCK_COMMON + """
data, clock, ack = FILES
got = []
t0 = time.monotonic()
for i in range(COUNT):
    wait_for(clock, i % 2 == 0, t0 + 120)
    got.append(int(is_held(data)))
    hold(ack, i % 2 == 0)
RESULT = got
"""

_FUTEX_COMMON = """
import ctypes, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.syscall.restype = ctypes.c_long
FUTEX = 202 if platform.machine() == 'x86_64' else 98
# A read-only page of a file every sandbox may read: a shared futex on it is keyed by the file, not the process.
fd = os.open(os.__file__, os.O_RDONLY)
page = libc.mmap(None, 4096, 1, 2, fd, 0)                      # PROT_READ, MAP_PRIVATE
word = lambda bit: page + 64 * bit
value = lambda bit: ctypes.c_int.from_address(word(bit)).value
"""

_FUTEX_SENDER = _FUTEX_COMMON + """
class Timespec(ctypes.Structure):
    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]
t0, missed = time.monotonic(), 0
for bit in BITS:                  # wait on word 0 or word 1; the receiver's wake tells which, and ends the wait
    if libc.syscall(FUTEX, ctypes.c_void_p(word(bit)), 0, value(bit), ctypes.byref(Timespec(1, 0)), 0, 0) != 0:
        missed += ctypes.get_errno() == 110        # ETIMEDOUT: nobody woke it
RESULT = (time.monotonic() - t0, missed)
"""

_FUTEX_RECEIVER = _FUTEX_COMMON + """
got, t0 = [], time.monotonic()
while len(got) < COUNT and time.monotonic() - t0 < 60:
    for bit in (0, 1):
        if libc.syscall(FUTEX, ctypes.c_void_p(word(bit)), 1, 1, None, 0, 0) == 1:   # FUTEX_WAKE one
            got.append(bit)
RESULT = got
"""

_CPU_SENDER = """
import time
for i, bit in enumerate(BITS):
    end = START + (i + 1) * SLOT
    if bit:
        while time.monotonic() < end:
            pass
    else:
        time.sleep(max(0.0, end - time.monotonic()))
RESULT = 0
"""

_CPU_RECEIVER = """
import time
counts = []
for i in range(COUNT):
    end, n = START + (i + 1) * SLOT, 0
    while time.monotonic() < end:
        n += 1
    counts.append(n)
RESULT = counts
"""


def _both(a: Sandbox, b: Sandbox, sender: str, receiver: str):
    """Run the sender cell in ``a`` and the receiver cell in ``b`` at the same time; their RESULTs."""
    results = {}

    def go(box, source, key):
        box.request("exec", source, f"<{key}>")
        results[key] = box.request("lookup", "RESULT")

    threads = [threading.Thread(target=go, args=(a, sender, "sender")),
               threading.Thread(target=go, args=(b, receiver, "receiver"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["sender"], results["receiver"]


def _entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bits", type=int, default=2000)
    parser.add_argument("--slots", type=float, nargs="+", default=[50, 20, 10], help="CPU slot lengths, ms")
    args = parser.parse_args()
    bits = [b & 1 for b in os.urandom(args.bits)]
    with Sandbox(cell_seconds=300) as a, Sandbox(cell_seconds=300) as b:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; memory: {a.confinement['memory']}; "
              f"CPU: {a.confinement['cpu']}")
        setup = f"BITS = {bits!r}\nCOUNT = {len(bits)}\n"
        a.request("exec", setup, "<bits>")
        b.request("exec", setup, "<bits>")
        seconds, got = _both(a, b, _SENDER, _RECEIVER)
        errors = sum(x != y for x, y in zip(bits, got))
        print(f"flock channel: {len(bits)} bits in {seconds:.2f} s = {len(bits) / seconds:,.0f} bits/s, {errors} errors")
        (seconds, missed), got = _both(a, b, _FUTEX_SENDER, _FUTEX_RECEIVER)
        errors = sum(x != y for x, y in zip(bits, got)) + len(bits) - len(got)
        print(f"futex channel: {len(bits)} bits in {seconds:.2f} s = {len(bits) / seconds:,.0f} bits/s, "
              f"{errors} errors, {missed} waits nobody woke")
        for slot_ms in args.slots:
            n = max(20, min(len(bits), int(4000 / slot_ms)))
            start = time.monotonic() + 1.0
            setup = f"BITS = {bits[:n]!r}\nCOUNT = {n}\nSLOT = {slot_ms / 1000}\nSTART = {start}\n"
            a.request("exec", setup, "<slots>")
            b.request("exec", setup, "<slots>")
            _, counts = _both(a, b, _CPU_SENDER, _CPU_RECEIVER)
            threshold = sorted(counts)[len(counts) // 2]
            decoded = [int(c < threshold) for c in counts]          # fewer loops: the sender was spinning
            p = sum(x != y for x, y in zip(bits[:n], decoded)) / n
            raw = 1000 / slot_ms
            print(f"CPU contention, {slot_ms:g} ms slots: {raw:.0f} bits/s raw, error rate {p:.2f}, "
                  f"capacity ~{raw * (1 - _entropy(p)):.1f} bits/s")


if __name__ == "__main__":
    main()
