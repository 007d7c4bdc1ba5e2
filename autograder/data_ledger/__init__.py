"""Checks for notebook 06: the data ledger.

A resume is correct for the data when the model and the input pipeline restart
from the same point: the last optimizer commit. The checks drive the learner's
``samples_per_update``, ``Ledger``, ``audit`` and ``window_digest`` through the
worked example (8 ranks, microbatch 2, 4 accumulation steps, a crash during the
third microbatch after update 1,250), through loaders that read an update and more
ahead of the loop, and through random scenarios, comparing against a per-position
reference that is only affordable at small sizes.

"Fetched" means taken from the run's data order by the loader: handed to the loop or
read ahead into its prefetch queue. ``window_digest`` is also computed in new Python
interpreters (started with different PYTHONHASHSEED values), where the learner's
function lives: a digest built on the salted ``hash()`` of a str differs there.
"""

from __future__ import annotations

import collections
import math
import os
import random
import time
# Bound once, here: the probe that measures the audit's memory uses these even if submitted code replaces
# the tracemalloc module's functions (this module's names are shared code the sandbox puts back).
from tracemalloc import get_traced_memory as _traced_memory
from tracemalloc import is_tracing as _is_tracing
from tracemalloc import reset_peak as _reset_peak
from tracemalloc import start as _start_tracing
from tracemalloc import stop as _stop_tracing

import torch
from torch.utils.data import Dataset, get_worker_info

from .checking import error_text, expect, failing_if_raised, graded_check, observe
from .helpers import serialized_copy, watch

# The worked example: 8 ranks x microbatch 2 x 4 accumulation steps = 64 samples per update.
WORKED_EXAMPLE = (8, 2, 4)
WORKED_UPDATES = 1_250
CRASH_MICROBATCHES = 3  # the crash comes during the third microbatch of update 1,251


# ---- the demo's dataset (importable, so that it also loads in spawned workers) -----------------------

class SlowWorkerSamples(Dataset):
    """Sample i is the number i. In DataLoader worker ``slow_worker`` every sample takes ``delay`` seconds
    more, and that worker starts only once another worker has loaded a sample: a cold disk, a large file or a
    busy core, made to happen on every run (the other workers count their samples in shared memory)."""

    def __init__(self, size: int, slow_worker: int, delay: float = 0.02):
        self.size, self.slow_worker, self.delay = size, slow_worker, delay
        self.loaded_elsewhere = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        info = get_worker_info()
        if info is not None and info.id == self.slow_worker:
            deadline = time.monotonic() + 5
            while int(self.loaded_elsewhere) == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(self.delay)
        elif info is not None:
            self.loaded_elsewhere += 1
        return index


# ---- reference arithmetic ---------------------------------------------------------------------

def reference_audit(*, expected: list[range], trained: list[range]) -> dict[str, list[range]]:
    """Per-position audit: obviously right, affordable only for small runs. Its arguments are named
    (reference_audit(expected=..., trained=...)): it is the notebooks' worked examples' audit, not a
    function of the exercise's contract (issue 27)."""
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
        # Counted as one update consumes them, not multiplied as the exercise does: every rank, every
        # accumulation step, every sample of its microbatch.
        want = sum(1 for _rank in range(world_size) for _step in range(accum_steps) for _sample in range(micro_batch))
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
    ``prefetch`` microbatches are fetched ahead (one fetch each), as a DataLoader's workers read ahead
    of the loop, and the loader stays that far ahead; ``partial`` microbatches of the next update are
    fetched before a crash."""
    world_size, micro_batch, accum_steps = config
    per_microbatch = world_size * micro_batch
    for _ in range(prefetch):
        ledger.fetch(per_microbatch)
    for _ in range(updates):
        for _ in range(accum_steps):
            ledger.fetch(per_microbatch)
        ledger.commit()
    for _ in range(partial):
        ledger.fetch(per_microbatch)


@graded_check("only optimizer commits move the committed cursor; fetched counts every position the loader took")
def check_ledger_counts(Ledger, config=WORKED_EXAMPLE, updates: int = 30) -> None:
    ledger = _new_ledger(Ledger, config)
    per_update = math.prod(config)
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
           f"next update, the loader took {want_fetched} positions, but ledger.fetched is {fetched}. "
           f"fetch(n) records n more positions the loader took (read ahead or handed to the loop), whether "
           f"or not they are ever trained.")
    if committed != want_committed:
        extra = committed - want_committed
        if extra > 0 and extra % per_microbatch == 0:
            hint = (f" That is {extra} positions too many: {extra // per_microbatch} microbatches were fetched but "
                    f"never reached an optimizer step. ")
        elif committed > 0 and committed * config[2] == want_committed:
            hint = (f" Each commit counted {per_microbatch} positions, one microbatch of every rank; an update is "
                    f"{config[2]} microbatches (the accumulation steps). ")
        else:
            hint = " "
        raise AssertionError(
            f"After {updates} optimizer updates of {per_update} samples, ledger.committed is {committed}, "
            f"expected {want_committed}.{hint}Only commit() means gradients reached the weights, and each "
            f"commit covers exactly one update's worth of positions, however far the loader has read ahead.")


def _resume_scenarios(config, updates: int, partial: int) -> list[tuple[int, int, int]]:
    """(updates, prefetch, partial) of each crash the resume check replays: the worked example (a loader
    that does not read ahead), then loaders an update and more ahead of the loop, crashing mid-update and
    right after a commit. Deep prefetch puts the fetched count a whole update or more past the commit; the
    first of them leaves it off a whole update, so that rounding it down is told apart from taking it."""
    accum_steps = config[2]
    deep = max(1, min(updates, 25))
    return [(updates, 0, partial), (deep, accum_steps, 1), (deep, accum_steps, 0),
            (deep, 2 * accum_steps + 1, max(1, accum_steps - 1))]


@graded_check("the resume position is the last commit, not the fetched count (the 80,000-sample example)")
def check_ledger_resume(Ledger, config=WORKED_EXAMPLE, updates: int = WORKED_UPDATES,
                        partial: int = CRASH_MICROBATCHES) -> None:
    per_update, per_microbatch = math.prod(config), config[0] * config[1]
    for done, prefetch, in_flight in _resume_scenarios(config, updates, partial):
        ledger = _new_ledger(Ledger, config)
        _train(ledger, config, done, prefetch=prefetch, partial=in_flight)
        want = done * per_update
        fetched = want + (prefetch + in_flight) * per_microbatch
        got = _counter(ledger, "resume_position")
        if got == want:
            continue
        ahead = (f"a loader {prefetch} microbatches ahead of the loop ({prefetch * per_microbatch:,} positions; "
                 f"an update is {per_update:,})" if prefetch else "a loader that does not read ahead")
        crash = (f"{in_flight} microbatch{'es' if in_flight > 1 else ''} into update {done + 1}" if in_flight
                 else f"right after the commit of update {done}")
        rounded = fetched // per_update * per_update
        if _counter(ledger, "committed") == got:
            cause = (f"resume_position is ledger.committed, and that count is already wrong ({got:,}): only commit() "
                     f"may move it, by exactly one update's worth of positions per optimizer step "
                     f"(test_Ledger_counts shows what it counted). ")
        elif got > want:
            derived = ("the fetched count, here also a whole number of updates" if got == fetched == rounded
                       else "the fetched count" if got == fetched
                       else "the fetched count rounded down to a whole update" if got == rounded else f"{got:,}")
            cause = (f"resume_position is {derived}. Anything derived from the fetched count, even rounded down "
                     f"to a whole update, runs ahead of the weights by what the loader read ahead. ")
        else:
            cause = f"resume_position is {got:,}. "
        effect = (f"Resuming at {got:,} skips {got - want:,} positions whose gradients never reached the weights."
                  if got > want else
                  f"Resuming at {got:,} replays {want - got:,} positions the weights already contain.")
        raise AssertionError(
            f"With {ahead}, the run crashed {crash}: {fetched:,} positions fetched, and the durable checkpoint "
            f"holds update {done} = {want:,} committed positions. {cause}{effect} "
            "Where do the model's weights say training stopped?")


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
    per_update = math.prod(config)
    ledger = _new_ledger(Ledger, config)
    prefetch = config[2] + 1          # the loader reads more than an update ahead of the loop
    _train(ledger, config, updates, prefetch=prefetch, partial=partial)
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
           f"A ledger saved with committed = {committed:,} (and {prefetch + partial} uncommitted microbatches "
           f"fetched, {prefetch} of them read ahead by the loader) "
           f"comes back with committed = {got['committed']:,} and resume_position = "
           f"{got['resume_position']:,}; both should be {committed:,}.")
    expect(got["fetched"] == committed,
           f"After load_state_dict the ledger says {got['fetched']:,} positions were fetched, so the next "
           f"fetch continues there; but the new process's loader restarts at the resume position "
           f"{committed:,}. "
           + (f"Resuming the fetch cursor beyond it omits the {got['fetched'] - committed:,} positions that were "
              f"fetched before the crash but never committed." if got["fetched"] > committed else
              f"A fetch cursor behind it would hand out again the {committed - got['fetched']:,} positions "
              f"from {got['fetched']:,} on, which the weights already contain."))
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
        _compare_audit(_call_audit(audit, expected, trained), reference_audit(expected=expected, trained=trained), what)
    rng = random.Random(seed)
    for run in range(random_runs):
        expected, trained = _random_scenario(rng, per_update)
        _compare_audit(_call_audit(audit, expected, trained), reference_audit(expected=expected, trained=trained),
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

    from .engine.portable import _Packer, _Unpacker
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
