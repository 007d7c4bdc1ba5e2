"""The checks of notebook 06's ``window_digest``: deterministic, also in new Python interpreters started
with other PYTHONHASHSEED values (a probe, where the learner's function lives), and changed by any change of
the identifiers, their order or the boundaries between them.
"""

from __future__ import annotations

import os
import random

from ..checking import expect, graded_check, observe


def _digest(window_digest, ids) -> str:
    try:
        value = window_digest(list(ids))
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"window_digest raised {type(exc).__name__}: {exc}") from None
    expect(isinstance(value, str), f"window_digest should return a str, not {type(value).__name__}.")
    return value


# A new interpreter that rebuilds the learner's function from its compiled code (portable._Unpacker, whose
# source is sent along, so that the new process need not import torch) and digests the windows. Its own
# output goes nowhere; the result comes back pickled on the original stdout.
_NEW_INTERPRETER = """
import os, pickle, sys
result_out = os.fdopen(os.dup(1), "wb")
nowhere = os.open(os.devnull, os.O_WRONLY)
os.dup2(nowhere, 1)
os.dup2(nowhere, 2)
sys.stdout = sys.stderr = open(os.devnull, "w")
paths, unpacker_source, shipped, windows = pickle.load(sys.stdin.buffer)
sys.path[:0] = [p for p in paths if p not in sys.path]
try:
    if shipped[0] == "function":
        import builtins, marshal, types
        namespace = {"builtins": builtins, "marshal": marshal, "pickle": pickle, "types": types}
        exec(unpacker_source, namespace)
        digest = namespace["_Unpacker"](shipped[1]).function(shipped[2])[0]
    else:
        digest = pickle.loads(shipped[1])
    result = {"digests": [(lambda d: d if isinstance(d, str) else ("not a str", type(d).__name__))(digest(list(w)))
                          for w in windows]}
except BaseException as exc:
    result = {"error": f"{type(exc).__name__}: {exc}".strip()}
result_out.write(pickle.dumps(result))
result_out.close()
"""

HASH_SEEDS = (1, 2)   # PYTHONHASHSEED of the two new interpreters: str and bytes hash differently in each


def probe_digests_in_new_interpreters(window_digest, windows: list, timeout: float = 60.0) -> dict:
    """``window_digest`` of each window, computed in new Python interpreters started with PYTHONHASHSEED
    1 and 2: {"digests": {hash seed: [digest or ("not a str", type name), ...]}} or {"error": ...}.

    Runs where the learner's function lives (the sandbox, in graded mode): a fork would keep that
    process's hash salt, so these are new interpreters (fork and exec) with a salt of their own. A
    function travels by value, as ``portable`` sends a notebook-defined function to a spawned worker;
    another callable (a functools.partial, say) travels pickled."""
    import inspect
    import pickle
    import subprocess
    import sys
    import types

    from ..engine.portable import _Packer, _Unpacker
    try:
        if isinstance(window_digest, types.FunctionType):
            packer = _Packer(window_digest.__globals__)
            packed = packer.function(window_digest)
            shipped = ("function", packer.globals, packed)
        else:
            shipped = ("pickled", pickle.dumps(window_digest))
        payload = pickle.dumps(([p for p in sys.path if p], inspect.getsource(_Unpacker), shipped,
                                [list(map(int, w)) for w in windows]))
    except Exception as exc:   # noqa: BLE001 (reported as data)
        return {"error": f"it could not be sent there ({type(exc).__name__}: {exc})"}
    started = {}
    for hash_seed in HASH_SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
        try:
            started[hash_seed] = subprocess.Popen([sys.executable, "-c", _NEW_INTERPRETER], stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError as exc:
            for process in started.values():
                process.kill()
                process.communicate()
            return {"error": f"no new Python process could be started here ({type(exc).__name__}: {exc})"}
    digests, error = {}, None
    for hash_seed, process in started.items():
        try:
            out, _ = process.communicate(payload, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            error = error or f"it did not finish within {timeout:g} s"
            continue
        try:
            seen = pickle.loads(out)
        except Exception:   # noqa: BLE001 (the process died before it could answer)
            error = error or f"the new interpreter ended with exit status {process.returncode} before answering"
            continue
        if "error" in seen:
            error = error or seen["error"]
        else:
            digests[hash_seed] = seen["digests"]
    return {"error": error} if error else {"digests": digests}


def _expect_same_in_new_interpreters(window_digest, window, here: str) -> None:
    seen = observe(probe_digests_in_new_interpreters, window_digest, [window])
    if "error" in seen:
        raise AssertionError(
            f"window_digest could not be computed in a new Python process: {seen['error']}. A restart compares "
            f"the digest with one an earlier process wrote, so it must come from the identifiers alone (the "
            f"standard library's hashlib, or modules imported at the top of the cell).")
    (first,), (second,) = (seen["digests"][seed] for seed in HASH_SEEDS)
    for value in (first, second):
        expect(isinstance(value, str), f"window_digest should return a str, not {value[1]}.")
    expect(first == second,
           f"The same window gave one digest in a new Python process started with PYTHONHASHSEED="
           f"{HASH_SEEDS[0]} ({first[:16]}...) and another with PYTHONHASHSEED={HASH_SEEDS[1]} "
           f"({second[:16]}...): Python salts hash() of str and bytes with a random key chosen at every start, "
           f"so a digest built on hash() changes from process to process, and a restarted job never matches "
           f"the digest the crashed one wrote. Use hashlib.")
    expect(first == here,
           f"The same window gave one digest in this process ({here[:16]}...) and another in new Python "
           f"processes ({first[:16]}...): the digest depends on something besides the identifiers.")


@graded_check("window_digest is deterministic and changes when the order changes")
def check_window_digest_order(window_digest, seed: int = 0, size: int = 64) -> None:
    rng = random.Random(seed)
    window = rng.sample(range(10 * size), size)
    first = _digest(window_digest, window)
    expect(_digest(window_digest, list(window)) == first,
           "window_digest gave two different answers for the same window: a restart compares today's digest "
           "with one written before the crash, so it must depend only on the identifiers.")
    _expect_same_in_new_interpreters(window_digest, window, first)
    swapped = list(window)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    expect(_digest(window_digest, swapped) != first,
           f"Swapping the first two identifiers of a {size}-identifier window left the digest unchanged: it "
           f"ignores order, so a restart that trains the right samples in the wrong order passes the audit.")
    shifted = window[1:] + [window[0]]
    expect(_digest(window_digest, shifted) != first,
           "Rotating the window by one identifier left the digest unchanged: an off-by-one resume would pass.")
    # Two neighbouring microbatches swapped, as a loader with in_order=False or a slower worker hands them over;
    # here two whose identifiers add up to the same total, which a sum weighted by position cannot tell apart.
    x, y = 10 * size + 2 * rng.randrange(size), 12 * size + 2 * rng.randrange(size)   # outside the window's range
    batches = window[:8] + [x, y, x + 1, y - 1] + window[8:]
    swapped_batches = window[:8] + [x + 1, y - 1, x, y] + window[8:]
    expect(_digest(window_digest, swapped_batches) != _digest(window_digest, batches),
           f"Swapping two neighbouring microbatches, [{x}, {y}] and [{x + 1}, {y - 1}], left the digest unchanged. "
           f"Their identifiers add up to the same total, and a sum of identifiers weighted by their position is a "
           f"checksum that cannot tell such stretches apart: exactly what a loader with in_order=False, or a "
           f"worker slower than usual, hands over. Hash the ordered identifiers (hashlib).")
    other = [i + 1 for i in window]
    expect(_digest(window_digest, other) != first, "Two different windows gave the same digest.")
    # Positions of a long run: one identifier one larger must change the digest.
    large = [2**40 + 3 * size * i + rng.randrange(3 * size) for i in range(8)]
    nudged = list(large)
    nudged[3] += 1
    expect(_digest(window_digest, nudged) != _digest(window_digest, large),
           f"window_digest({large[:4]}, ...) equals the digest of the same window with {large[3]:,} replaced "
           f"by {nudged[3]:,}: large identifiers lose their last digits on the way (a float32 holds integers "
           f"exactly only up to 2**24, a float64 up to 2**53). Digest the integers themselves.")
    # A long window: one identifier changed in the middle must change the digest.
    long_window = [rng.randrange(10**9) for _ in range(5_000)]
    changed = list(long_window)
    changed[len(changed) // 2] += 1
    expect(_digest(window_digest, changed) != _digest(window_digest, long_window),
           f"Changing one identifier in the middle of a {len(long_window):,}-identifier window left the digest "
           f"unchanged: the digest does not read every identifier. (Printing a tensor or a NumPy array of more "
           f"than 1,000 numbers shows only its ends, with '...' in between.)")


@graded_check("window_digest keeps identifiers apart: [1, 23] and [12, 3] differ")
def check_window_digest_boundaries(window_digest, seed: int = 0) -> None:
    rng = random.Random(seed)
    a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
    pairs = [([1, 23], [12, 3]), ([a, 10 * b + c], [10 * a + b, c]),
             ([100 * a + 10 * b + c, 5], [10 * a + b, 10 * c + 5])]
    for left, right in pairs:
        expect(_digest(window_digest, left) != _digest(window_digest, right),
               f"window_digest({left}) == window_digest({right}): the identifiers run together, so two different "
               f"windows look the same. Where does one identifier end and the next begin?")
