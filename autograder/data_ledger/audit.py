"""The checks of notebook 06's ``audit``: replayed and omitted positions as merged spans, compared with the
per-position reference on named restarts and random runs; then its memory (a probe under tracemalloc,
where the audit runs) and its time on a run of a million positions.
"""

from __future__ import annotations

import random
import time
# Bound once, here: the probe that measures the audit's memory uses these even if submitted code replaces
# the tracemalloc module's functions (this module's names are shared code the sandbox puts back).
from tracemalloc import get_traced_memory as _traced_memory
from tracemalloc import is_tracing as _is_tracing
from tracemalloc import reset_peak as _reset_peak
from tracemalloc import start as _start_tracing
from tracemalloc import stop as _stop_tracing

from ..checking import error_text, expect, graded_check, observe
from .worked_example import reference_audit


def _show(spans, limit: int = 4) -> str:
    spans = list(spans)
    shown = ", ".join(f"range({s.start}, {s.stop})" if isinstance(s, range) else repr(s) for s in spans[:limit])
    return f"[{shown}{', ...' if len(spans) > limit else ''}]"


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
        # Omitted means expected and never trained: positions no expected span holds are not omitted.
        ("one rank's share, every other update (the updates between are another rank's), its last one never "
         "trained", by_update[::2], by_update[::2][:-1]),
        # range(b, a) with b > a holds no position, whichever way round it was logged.
        (f"an empty span logged backwards, range({crash}, {older}), which holds no position, in both lists",
         [range(0, total), range(crash, older)], [range(0, total), range(crash, older)]),
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


def _call_audit(audit, expected, trained, inputs_judged: bool = False):
    given = ([range(s.start, s.stop) for s in expected], [range(s.start, s.stop) for s in trained])
    try:
        result = audit(*given)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"audit raised {type(exc).__name__}: {exc}") from None
    for name, logged, after in zip(("expected", "trained"), (expected, trained), given if inputs_judged else ()):
        expect(after == list(logged),
               f"audit changed the list `{name}` it was given: it holds {_show(after)} afterwards instead of the "
               f"spans as they were logged, {_show(list(logged))}. The logs are the record the audit reads; sort or "
               f"merge a copy (sorted(...) makes one).")
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
        _compare_audit(_call_audit(audit, expected, trained, inputs_judged=True),
                       reference_audit(expected=expected, trained=trained), what)
    rng = random.Random(seed)
    for run in range(random_runs):
        expected, trained = _random_scenario(rng, per_update)
        _compare_audit(_call_audit(audit, expected, trained, inputs_judged=True),
                       reference_audit(expected=expected, trained=trained),
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
