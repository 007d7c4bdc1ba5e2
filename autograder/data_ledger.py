"""Checks for notebook 06: the data ledger.

A resume is correct for the data when the model and the input pipeline restart
from the same point: the last optimizer commit. The checks drive the learner's
``samples_per_update``, ``Ledger``, ``audit`` and ``window_digest`` through the
worked example (8 ranks, microbatch 2, 4 accumulation steps, a crash during the
third microbatch after update 1,250) and through random scenarios, comparing
against a per-position reference that is only affordable at small sizes.
"""

from __future__ import annotations

import collections
import random
import time
# Bound once, here: the probe that measures the audit's memory uses these even if submitted code replaces
# the tracemalloc module's functions (this module's names are shared code the sandbox puts back).
from tracemalloc import get_traced_memory as _traced_memory
from tracemalloc import is_tracing as _is_tracing
from tracemalloc import reset_peak as _reset_peak
from tracemalloc import start as _start_tracing
from tracemalloc import stop as _stop_tracing

from .checking import error_text, expect, failing_if_raised, graded_check, observe
from .helpers import serialized_copy, watch

# The worked example: 8 ranks x microbatch 2 x 4 accumulation steps = 64 samples per update.
WORKED_EXAMPLE = (8, 2, 4)
WORKED_UPDATES = 1_250
CRASH_MICROBATCHES = 3  # the crash comes during the third microbatch of update 1,251


# ---- reference arithmetic ---------------------------------------------------------------------

def _per_update(world_size: int, micro_batch: int, accum_steps: int) -> int:
    return world_size * micro_batch * accum_steps


def reference_audit(expected: list[range], trained: list[range]) -> dict[str, list[range]]:
    """Per-position audit: obviously right, affordable only for small runs."""
    times_trained = collections.Counter(p for span in trained for p in span)
    wanted = {p for span in expected for p in span}
    return {"replayed": _spans(sorted(p for p, n in times_trained.items() if n > 1)),
            "omitted": _spans(sorted(wanted - times_trained.keys()))}


def _spans(sorted_positions: list[int]) -> list[range]:
    """Maximal runs of consecutive positions as half-open ranges."""
    spans: list[range] = []
    for p in sorted_positions:
        if spans and spans[-1].stop == p:
            spans[-1] = range(spans[-1].start, p + 1)
        else:
            spans.append(range(p, p + 1))
    return spans


def _show(spans, limit: int = 4) -> str:
    spans = list(spans)
    shown = ", ".join(f"range({s.start}, {s.stop})" if isinstance(s, range) else repr(s) for s in spans[:limit])
    return f"[{shown}{', ...' if len(spans) > limit else ''}]"


# ---- samples_per_update -----------------------------------------------------------------------

@graded_check("samples_per_update counts every rank, microbatch and accumulation step")
def check_samples_per_update(samples_per_update, configs=((8, 2, 4), (1, 32, 1), (4, 8, 2))) -> None:
    for world_size, micro_batch, accum_steps in configs:
        got = samples_per_update(world_size, micro_batch, accum_steps)
        want = _per_update(world_size, micro_batch, accum_steps)
        expect(isinstance(got, int) and not isinstance(got, bool),
               f"samples_per_update({world_size}, {micro_batch}, {accum_steps}) returned "
               f"{type(got).__name__} {got!r}; return a plain int (a count of sample positions).")
        expect(got == want,
               f"samples_per_update({world_size}, {micro_batch}, {accum_steps}) returned {got}, but one "
               f"optimizer update consumes {want} sample positions. An update is committed only after "
               f"every rank has run every microbatch of the accumulation window: which factor is missing?")


# ---- Ledger -----------------------------------------------------------------------------------

def _new_ledger(Ledger, config):
    with failing_if_raised(f"Ledger{config}"):
        return Ledger(*config)


def _counter(ledger, name: str) -> int:
    with failing_if_raised(f"reading ledger.{name}"):
        value = getattr(ledger, name)
    expect(not callable(value), f"ledger.{name} should be a property holding a number, not a method.")
    return value


def _train(ledger, config, updates: int, prefetch: int = 0, partial: int = 0) -> None:
    """Drive a ledger as a data-parallel loop would: per microbatch every rank fetches its
    micro_batch positions; every accum_steps microbatches end in an optimizer commit.
    ``prefetch`` microbatches are fetched ahead, as a DataLoader does; ``partial`` microbatches
    of the next update are fetched before a crash."""
    world_size, micro_batch, accum_steps = config
    per_microbatch = world_size * micro_batch
    if prefetch:
        ledger.fetch(prefetch * per_microbatch)
    for _ in range(updates):
        for _ in range(accum_steps):
            ledger.fetch(per_microbatch)
        ledger.commit()
    for _ in range(partial):
        ledger.fetch(per_microbatch)


@graded_check("only optimizer commits move the committed cursor; fetched counts every position handed out")
def check_ledger_counts(Ledger, config=WORKED_EXAMPLE, updates: int = 30) -> None:
    ledger = _new_ledger(Ledger, config)
    per_update = _per_update(*config)
    per_microbatch = config[0] * config[1]
    expect((_counter(ledger, "fetched"), _counter(ledger, "committed")) == (0, 0),
           f"a new Ledger should start with fetched = committed = 0, not "
           f"{_counter(ledger, 'fetched')} and {_counter(ledger, 'committed')}.")
    # A loader that prefetches two microbatches ahead, then a crash three microbatches into an update.
    prefetch, partial = 2, CRASH_MICROBATCHES
    _train(ledger, config, updates, prefetch=prefetch, partial=partial)
    fetched, committed = _counter(ledger, "fetched"), _counter(ledger, "committed")
    want_fetched = (prefetch + updates * config[2] + partial) * per_microbatch
    want_committed = updates * per_update
    expect(fetched == want_fetched,
           f"After {updates} updates with a loader two microbatches ahead and {partial} microbatches of the "
           f"next update, {want_fetched} positions were handed out, but ledger.fetched is {fetched}. "
           f"fetch(n) hands n more positions to the loop, whether or not they are ever trained.")
    if committed != want_committed:
        extra = committed - want_committed
        hint = (f" That is {extra} positions too many: {extra // per_microbatch} microbatches were fetched but "
                f"never reached an optimizer step. " if extra > 0 and extra % per_microbatch == 0 else " ")
        raise AssertionError(
            f"After {updates} optimizer updates of {per_update} samples, ledger.committed is {committed}, "
            f"expected {want_committed}.{hint}Only commit() means gradients reached the weights, and each "
            f"commit covers exactly one update's worth of positions, however far the loader has read ahead.")


@graded_check("the resume position is the last commit, not the fetched count (the 80,000-sample example)")
def check_ledger_resume(Ledger, config=WORKED_EXAMPLE, updates: int = WORKED_UPDATES,
                        partial: int = CRASH_MICROBATCHES) -> None:
    ledger = _new_ledger(Ledger, config)
    _train(ledger, config, updates, partial=partial)
    want = updates * _per_update(*config)
    fetched = updates * _per_update(*config) + partial * config[0] * config[1]
    got = _counter(ledger, "resume_position")
    expect(got == want,
           f"The run crashed {partial} microbatches into update {updates + 1} with {fetched:,} positions "
           f"fetched; the durable checkpoint holds update {updates} = {want:,} committed positions, but "
           f"resume_position is {got:,}. "
           + (f"Resuming at {got:,} skips {got - want:,} positions whose gradients never reached the weights. "
              if got > want else "")
           + "Where do the model's weights say training stopped?")


def probe_state_saved_later(ledger, config, more: int) -> dict:
    """Take ``ledger.state_dict()``, train ``more`` updates, then save the state (a torch.save/load round
    trip): the saved copy, or what stopped it (the state's type if not a dict, an error as text); with
    ledger.committed after those updates and what state_dict() changed in the ledger (helpers.watch).

    Runs where the ledger lives: a state_dict() that is a live view of the ledger has moved by the time
    it is saved, which a copy taken out of the sandbox at once would hide. A saved state that did not move
    shows nothing unless the ledger did: the ledger's own count after the updates comes back with it (read
    here, since what a probe does to the ledger need not outlast the probe)."""
    changed = watch(lambda: {"ledger": ledger})
    try:
        state = ledger.state_dict()
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"state_dict raised": error_text(exc)}
    tampering = changed()
    if not isinstance(state, dict):
        return {"not a dict": type(state).__name__}
    _train(ledger, config, more)
    try:
        committed = ledger.committed
    except NotImplementedError:
        raise
    except Exception:
        committed = None
    seen = {"committed after": None if callable(committed) else committed, "tampering": tampering}
    try:
        return {"saved": serialized_copy(state), **seen}
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"saving raised": error_text(exc), **seen}


@graded_check("state_dict / load_state_dict resume from the committed cursor")
def check_ledger_state_dict(Ledger, config=WORKED_EXAMPLE, updates: int = 5,
                            partial: int = CRASH_MICROBATCHES) -> None:
    # Compared with the ledger's own committed count, so that this check is about saving and
    # loading only (whether that count is right is check_ledger_counts' business).
    per_update = _per_update(*config)
    ledger = _new_ledger(Ledger, config)
    _train(ledger, config, updates, partial=partial)
    committed = _counter(ledger, "committed")
    # Training goes on while the checkpoint is written: the saved state must not move with it.
    seen = observe(probe_state_saved_later, ledger, config, more=2)
    if "state_dict raised" in seen:
        raise AssertionError(f"ledger.state_dict() raised {seen['state_dict raised']}")
    expect("not a dict" not in seen, f"state_dict() should return a dict, not {seen.get('not a dict')}.")
    moved_to = seen["committed after"]
    if "saving raised" in seen:
        raise AssertionError(f"the ledger's state_dict() does not survive torch.save/torch.load(weights_only=True) "
                             f"({seen['saving raised']}); keep it to plain numbers, strings and dicts.")
    saved = seen["saved"]
    resumed = _new_ledger(Ledger, config)
    try:
        resumed.load_state_dict(saved)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"load_state_dict raised {type(exc).__name__}: {exc}") from None
    got = {name: _counter(resumed, name) for name in ("committed", "resume_position", "fetched")}
    if got["committed"] != committed and got["committed"] == moved_to:
        raise AssertionError(
            f"The state_dict() taken at {committed:,} committed positions reads {got['committed']:,} after two "
            f"more updates: it is a live view of the ledger, not a snapshot. What does your state_dict() return?")
    if got["committed"] == committed and moved_to == committed:
        # A saved state that did not move counts only if the ledger did.
        raise AssertionError(
            (f"Your state_dict() changed the ledger it was called on ({'; '.join(seen['tampering'])}): "
             if seen["tampering"] else "")
            + f"two more updates after state_dict() left ledger.committed at {committed:,}, so whether the saved "
            f"state is a snapshot or a live view of the ledger could not be observed. "
            + ("state_dict() must only read the ledger." if seen["tampering"] else
               "Only commit() moves the committed count, by one update's worth of positions."))
    expect(got["committed"] == committed and got["resume_position"] == committed,
           f"A ledger saved with committed = {committed:,} (and {partial} uncommitted microbatches fetched) "
           f"comes back with committed = {got['committed']:,} and resume_position = "
           f"{got['resume_position']:,}; both should be {committed:,}.")
    expect(got["fetched"] == committed,
           f"After load_state_dict the ledger says {got['fetched']:,} positions were fetched, so the next "
           f"fetch continues there; but the new process's loader restarts at the resume position "
           f"{committed:,}. Resuming the fetch cursor beyond it omits the {got['fetched'] - committed:,} "
           f"positions that were fetched before the crash but never committed.")
    for _ in range(config[2]):
        resumed.fetch(config[0] * config[1])
    resumed.commit()
    expect(_counter(resumed, "committed") == committed + per_update,
           f"After load_state_dict, one more update should bring committed to {committed + per_update:,}, "
           f"but it is {_counter(resumed, 'committed'):,}.")


# ---- audit ------------------------------------------------------------------------------------

def _worked_scenarios(per_update: int = 64) -> list[tuple[str, list[range], list[range]]]:
    """Named restarts of a 100-update run: (what happened, expected, trained)."""
    total = 100 * per_update
    crash = 60 * per_update
    fetched = crash + 3 * per_update // 4
    older = 55 * per_update
    by_update = [range(u * per_update, (u + 1) * per_update) for u in range(100)]
    return [
        ("a clean resume at the commit boundary, logged one span per update", by_update, list(by_update)),
        ("a clean resume that replays the abandoned microbatches of the crashed update",
         [range(0, total)], [range(0, crash), range(crash, total)]),
        ("a resume at the fetched count", [range(0, total)], [range(0, crash), range(fetched, total)]),
        ("a resume from an older checkpoint", [range(0, total)], [range(0, crash), range(older, total)]),
        ("a resume from an older checkpoint after two later segments",
         [range(0, total)], [range(0, crash), range(crash, total), range(older, older + 5)]),
        ("the same stretch trained three times",
         [range(0, total)], [range(0, crash), range(older, crash), range(older, total)]),
        ("two crashes, one replay and one omission, with empty spans logged",
         [range(0, total)], [range(0, crash), range(crash, crash), range(older, fetched), range(fetched + 10, total)]),
        ("training that stopped early", [range(0, total)], [range(0, crash)]),
    ]


def _random_scenario(rng: random.Random, per_update: int) -> tuple[list[range], list[range]]:
    """A run with random crashes: each restart goes back a little, forward a little, or exactly right."""
    updates = rng.randint(20, 60)
    total = updates * per_update
    expected = [range(u * per_update, (u + 1) * per_update) for u in range(updates)]
    trained, cursor = [], 0
    while cursor < total:
        stop = min(total, cursor + rng.randint(1, 8) * per_update + rng.choice([0, 0, rng.randint(1, per_update)]))
        trained.append(range(cursor, stop))
        cursor = max(0, stop + rng.choice([0, 0, -rng.randint(1, 3 * per_update), rng.randint(1, per_update)]))
    if rng.random() < 0.3:  # spans logged by several writers arrive out of order
        rng.shuffle(trained)
    return expected, trained


def _call_audit(audit, expected, trained):
    try:
        result = audit([range(s.start, s.stop) for s in expected], [range(s.start, s.stop) for s in trained])
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"audit raised {type(exc).__name__}: {exc}") from None
    return _audit_result(result)


def _audit_result(result):
    expect(isinstance(result, dict) and {"replayed", "omitted"} <= set(result),
           f"audit should return a dict with keys 'replayed' and 'omitted', not {result!r:.200}.")
    return result


def _compare_audit(result, want, what: str) -> None:
    for key, meaning in (("replayed", "trained more than once"), ("omitted", "expected but never trained")):
        got = result[key]
        expect(isinstance(got, list) and all(isinstance(s, range) for s in got),
               f"audit(...)[{key!r}] should be a list of range objects, not {_show(got) if isinstance(got, list) else repr(got)}.")
        if got == want[key]:
            continue
        got_positions = sorted(p for s in got for p in s)
        want_positions = sorted(p for s in want[key] for p in s)
        if got_positions == want_positions:
            raise AssertionError(
                f"For {what}, audit found the right {key} positions but returned them as {_show(got)} instead "
                f"of {_show(want[key])}: spans must be sorted, non-overlapping and merged (touching spans "
                f"become one).")
        missing = set(want_positions) - set(got_positions)
        if key == "replayed" and not missing and all(len(s) == 1 for s in got):
            hint = " Single positions where spans touch: a range's stop is not part of it (spans are half-open)."
        elif key == "replayed" and missing:
            hint = " A span can repeat positions of any earlier span, not only of the one just before it."
        else:
            hint = ""
        raise AssertionError(
            f"For {what}, audit reports {key} = {_show(got)} ({len(got_positions):,} positions), but the "
            f"positions {meaning} are {_show(want[key])} ({len(want_positions):,} positions).{hint}")


@graded_check("audit finds replayed and omitted positions as merged spans")
def check_audit(audit, seed: int = 0, per_update: int = 64, random_runs: int = 20) -> None:
    for what, expected, trained in _worked_scenarios(per_update):
        _compare_audit(_call_audit(audit, expected, trained), reference_audit(expected, trained), what)
    rng = random.Random(seed)
    for run in range(random_runs):
        expected, trained = _random_scenario(rng, per_update)
        _compare_audit(_call_audit(audit, expected, trained), reference_audit(expected, trained),
                       f"random run {run} (trained spans {_show(trained, 6)})")


def _scale_case(positions: int, spans: int = 64) -> tuple[list[range], list[range]]:
    """A run of ``positions`` positions in ``spans`` trained segments, with one replay and one omission."""
    size = positions // spans
    trained = [range(i * size, (i + 1) * size) for i in range(spans)]
    trained[spans // 2] = range(trained[spans // 2].start - size // 3, trained[spans // 2].stop)  # a replay
    trained[spans // 4] = range(trained[spans // 4].start + size // 5, trained[spans // 4].stop)  # an omission
    return [range(0, spans * size)], trained


def probe_audit_memory(audit, positions: int, spans: int) -> dict:
    """The learner's audit of ``_scale_case(positions, spans)`` under tracemalloc: {"peak": the most bytes it
    held at once during the call, "result": what it returned, "traced": whether tracing was still on when
    it returned}, or {"raised": its error as text}.

    Measured where the audit runs (the sandbox, in graded mode): memory measured around a call from the
    grading process would be the grading process's, and a per-position audit would pass there."""
    expected, trained = _scale_case(positions, spans)
    expected, trained = [range(s.start, s.stop) for s in expected], [range(s.start, s.stop) for s in trained]
    already = _is_tracing()       # the learner's own kernel may be tracing: leave it so
    if not already:
        _start_tracing()
    try:
        _reset_peak()
        base = _traced_memory()[0]
        try:
            result = audit(expected, trained)
        except NotImplementedError:
            raise
        except Exception as exc:
            return {"raised": error_text(exc)}
        traced = _is_tracing()
        peak = _traced_memory()[1] - base
    finally:
        if not already and _is_tracing():
            _stop_tracing()
    return {"peak": max(peak, 0), "result": result, "traced": traced}


def _seconds(audit, expected, trained, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        _call_audit(audit, expected, trained)
        best = min(best, time.perf_counter() - start)
    return best


@graded_check("audit works on span boundaries: its cost does not grow with the number of positions")
def check_audit_scale(audit, positions: int = 1_000_000, spans: int = 64) -> None:
    # Memory first, on a fifth of the run: deterministic on a loaded machine, cheap under
    # tracemalloc, and it stops a per-position answer before the timed calls.
    # Measured by a probe, where the audit runs: in graded mode that is the sandbox, not this process.
    sample = positions // 5
    seen = observe(probe_audit_memory, audit, sample, spans)
    if "raised" in seen:
        raise AssertionError(f"audit raised {seen['raised']}")
    _audit_result(seen["result"])
    expect(seen["traced"], "audit stopped tracemalloc, which measures the memory it uses: leave it running.")
    peak = seen["peak"]
    per_position = peak / sample
    expect(per_position < 4,
           f"audit allocated {peak / 1e6:.0f} MB to audit {sample:,} positions held in {spans} spans "
           f"(about {per_position:.0f} bytes per position): at 10^9 positions that is "
           f"{per_position:.0f} GB. It stores every position; the spans' starts and stops carry the same "
           f"information.")
    # Then time, for per-position work that stores nothing (a loop over every position): 20 times
    # more positions in as many spans must not cost 8 times more. Span work takes microseconds at
    # either size, so a 20 ms floor keeps scheduler noise on a loaded machine from failing it, and
    # the best of several runs keeps a stall from hiding a per-position loop.
    budget = 0.25
    small = _seconds(audit, *_scale_case(positions // 20, spans), repeats=5)
    large = small if small > budget else _seconds(audit, *_scale_case(positions, spans), repeats=3)
    expect(small <= budget and (large <= 0.02 or large <= 8 * small),
           f"audit took {small * 1e3:.0f} ms for {positions // 20:,} positions in {spans} spans"
           + ("" if small > budget else f" and {large * 1e3:.0f} ms for {positions:,} positions in as many spans")
           + f": its time grows with the number of positions, so 10^9 positions would take about "
           f"{max(small * 20, large) * 1e9 / positions / 60:.0f} min. Work with the spans' boundaries "
           f"instead of their positions.")


# ---- window_digest ----------------------------------------------------------------------------

def _digest(window_digest, ids) -> str:
    try:
        value = window_digest(list(ids))
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"window_digest raised {type(exc).__name__}: {exc}") from None
    expect(isinstance(value, str), f"window_digest should return a str, not {type(value).__name__}.")
    return value


@graded_check("window_digest is deterministic and changes when the order changes")
def check_window_digest_order(window_digest, seed: int = 0, size: int = 64) -> None:
    rng = random.Random(seed)
    window = rng.sample(range(10 * size), size)
    first = _digest(window_digest, window)
    expect(_digest(window_digest, list(window)) == first,
           "window_digest gave two different answers for the same window: a restart compares today's digest "
           "with one written before the crash, so it must depend only on the identifiers.")
    swapped = list(window)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    expect(_digest(window_digest, swapped) != first,
           f"Swapping the first two identifiers of a {size}-identifier window left the digest unchanged: it "
           f"ignores order, so a restart that trains the right samples in the wrong order passes the audit.")
    shifted = window[1:] + [window[0]]
    expect(_digest(window_digest, shifted) != first,
           "Rotating the window by one identifier left the digest unchanged: an off-by-one resume would pass.")
    other = [i + 1 for i in window]
    expect(_digest(window_digest, other) != first, "Two different windows gave the same digest.")


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
