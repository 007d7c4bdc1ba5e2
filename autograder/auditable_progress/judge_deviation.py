"""Checks for notebook 10's ``judge_deviation(report)``: it gets audit reports per stratum, every one over the
same strata.
"""

from __future__ import annotations

import copy
import random

from ..checking import expect, failing_if_raised, graded_check


STRATA = ("web", "code", "curated")   # every report has the same strata: their names say nothing of the case


def _report(unit: str, global_batch: int, strata: dict) -> dict:
    return {"unit": unit, "global_batch": global_batch,
            "strata": {name: {"expected": e, "replayed": r, "recomputed": c, "omitted": o, "explained": x}
                       for name, (e, r, c, o, x) in strata.items()}}


def _judge(judge_deviation, report, inputs_judged: bool = False, call: str = "judge_deviation(report)") -> dict:
    given = copy.deepcopy(report)
    with failing_if_raised(call):
        verdict = judge_deviation(given)
    if inputs_judged and given != report:
        name = next((n for n in report["strata"] if given.get("strata", {}).get(n) != report["strata"][n]), None)
        raise AssertionError(
            "judge_deviation changed the report it was judging"
            + (f": stratum {name!r} reads {given['strata'].get(name)!r:.120} afterwards instead of "
               f"{report['strata'][name]!r:.120}" if name else "")
            + ". The audit is the evidence the verdict rests on: whoever reads it next (a second look, the "
              "class report) must find the counts that were judged.")
    expect(isinstance(verdict, dict) and {"ok", "violations", "rates"} <= set(verdict),
           f"judge_deviation should return a dict with 'ok', 'violations' and 'rates', not {verdict!r:.120}.")
    expect(isinstance(verdict["ok"], bool), f"verdict['ok'] should be True or False, not {verdict['ok']!r:.40}.")
    return verdict


def _strata_text(report) -> str:
    return "; ".join(f"{name}: {s['expected']:,} expected, {s['replayed']} replayed, {s['recomputed']} recomputed, "
                     f"{s['omitted']} omitted ({s['explained']} explained)" for name, s in report["strata"].items())


def _unit_and_batch(rng) -> tuple[str, int]:
    return rng.choice((("tokens", 2_048), ("tokens", 4_096), ("samples", 64), ("samples", 256)))


SIZES = {"web": 100_000, "code": 10_000, "curated": 2}   # each stratum's expected positions, in global batches


def _audit(unit: str, batch: int, **defects) -> dict:
    """A report of STRATA, each SIZES[name] global batches long; defects[name] = (replayed, recomputed,
    omitted, explained), none where not given."""
    return _report(unit, batch, {name: (size * batch, *defects.get(name, (0, 0, 0, 0)))
                                 for name, size in SIZES.items()})


def _case(seed: int) -> tuple[random.Random, str, int]:
    rng = random.Random(seed)
    return (rng, *_unit_and_batch(rng))


def _sound_reports(seed: int) -> list[dict]:
    rng = random.Random(seed)
    reports = []
    for _ in range(2):
        unit, batch = _unit_and_batch(rng)
        split = rng.randint(batch // 4, 3 * batch // 4)
        tail = rng.randint(1, 7)                           # a drop_last tail the policy explains
        reports.append(_audit(unit, batch, web=(0, split, tail, tail), code=(0, batch - split, 0, 0)))
    return reports


@graded_check("judge_deviation accepts what the rule allows: recomputed uncommitted work, explained omissions")
def check_judge_deviation_accepts(judge_deviation, seed: int = 0) -> None:
    for report in _sound_reports(seed):
        verdict = _judge(judge_deviation, report, inputs_judged=True)
        expect(verdict["ok"],
               f"judge_deviation rejected an audit the rule allows ({_strata_text(report)}; one global batch = "
               f"{report['global_batch']:,} {report['unit']}), with violations {verdict['violations']!r:.200}. "
               f"Recomputing one uncommitted global batch after a crash is abandoned work done again, not a "
               f"duplicate, and an omission the documented policy explains (a drop_last tail) is not a defect.")


@graded_check("judge_deviation rejects any replay of committed positions, in every stratum however small")
def check_judge_deviation_replay(judge_deviation, seed: int = 0) -> None:
    rng, unit, batch = _case(seed)
    replayed, small = rng.randint(8, 40), SIZES["curated"] * batch
    report = _audit(unit, batch, web=(0, batch // 2, 0, 0), curated=(replayed, 0, 0, 0))
    verdict = _judge(judge_deviation, report)
    total = sum(s["expected"] for s in report["strata"].values())
    expect(not verdict["ok"],
           f"judge_deviation accepted an audit in which the small high-weight stratum 'curated' trained {replayed} "
           f"committed {unit} again ({_strata_text(report)}): {replayed / small:.1%} of that stratum, "
           f"{replayed / total:.4%} of the run. The rule allows zero replay of committed positions, and it "
           f"holds per stratum: a rate over the whole run hides a small stratum.")


@graded_check("judge_deviation rejects omissions that the documented policy does not explain")
def check_judge_deviation_omission(judge_deviation, seed: int = 0) -> None:
    rng, unit, batch = _case(seed)
    omitted, explained = rng.randint(2, min(30, batch - 8)), rng.randint(1, 7)
    report = _audit(unit, batch, web=(0, 0, omitted + explained, explained))
    verdict = _judge(judge_deviation, report)
    expect(not verdict["ok"],
           f"judge_deviation accepted an audit with {omitted} unexplained omissions ({_strata_text(report)}): a gap "
           f"larger than the padding policy explains ({explained}). The rule allows zero unexplained omissions: "
           f"only what the documented policy explains may be left out. (The allowance of one global batch, "
           f"{batch:,} {unit}, is for uncommitted work recomputed after the restart, which is trained again; omitted "
           f"positions are never trained.)")


@graded_check("judge_deviation allows at most one uncommitted global batch recomputed, summed over strata")
def check_judge_deviation_recompute(judge_deviation, seed: int = 0) -> None:
    _, unit, batch = _case(seed)
    for recomputed in ((batch, batch // 2, 0), (batch // 2 + 1, batch // 4, batch // 4)):
        report = _audit(unit, batch, **{name: (0, r, 0, 0) for name, r in zip(SIZES, recomputed)})
        verdict = _judge(judge_deviation, report)
        expect(not verdict["ok"],
               f"judge_deviation accepted {sum(recomputed):,} recomputed {report['unit']} after a crash "
               f"({_strata_text(report)}), but one global batch is {batch:,}: the bound is one uncommitted global "
               f"batch for the whole run, whichever strata it falls in.")


@graded_check("judge_deviation measures duplicate and omission rates per stratum")
def check_judge_deviation_rates(judge_deviation, seed: int = 0) -> None:
    rng, unit, batch = _case(seed)
    report = _audit(unit, batch, web=(rng.randint(1, 50), batch // 3, rng.randint(10, 90), 5),
                    code=(0, batch // 3, 0, 0), curated=(rng.randint(1, 20), batch // 4, 0, 0))
    strata = {name: tuple(s.values()) for name, s in report["strata"].items()}
    verdict = _judge(judge_deviation, report)
    rates = verdict["rates"]
    expect(isinstance(rates, dict) and set(rates) == set(strata),
           f"verdict['rates'] should have one entry per stratum {sorted(strata)}, not {rates!r:.120}.")
    for name, (expected, replayed, recomputed, omitted, explained) in strata.items():
        want = {"duplicate": replayed / expected, "omission": (omitted - explained) / expected}
        got = rates[name]
        expect(isinstance(got, dict) and set(want) <= set(got),
               f"verdict['rates'][{name!r}] should be a dict with 'duplicate' and 'omission', not {got!r:.80}.")
        for kind, value in want.items():
            if abs(float(got[kind]) - value) <= 1e-12 + 1e-9 * value:
                continue
            cause = (" It counts the recomputed uncommitted positions as duplicates; they are abandoned work done "
                     "again, not a training duplicate." if kind == "duplicate" and
                     abs(float(got[kind]) - (replayed + recomputed) / expected) < 1e-9 else
                     " It counts the explained omissions too." if kind == "omission" and
                     abs(float(got[kind]) - omitted / expected) < 1e-9 else
                     " That is a percentage: return the fraction (0.02, not 2)." if value and
                     abs(float(got[kind]) - 100 * value) <= 1e-9 * 100 * value else "")
            raise AssertionError(
                f"verdict['rates'][{name!r}][{kind!r}] is {float(got[kind]):.6g}, expected {value:.6g} "
                f"({_strata_text(report)}): the {kind} rate of a stratum is its defective positions over its "
                f"expected positions.{cause}")
    # A stratum of the mixture can expect nothing this time (its share rounds to zero): nothing to replay or
    # omit there, so both of its rates are 0.0.
    empty = _report(unit, batch, {**strata, "curated": (0, 0, 0, 0, 0)})
    verdict = _judge(judge_deviation, empty, call="judge_deviation(report) with a stratum ('curated') that expects "
                                                  "nothing this time, whose rates are 0.0")
    got = verdict["rates"].get("curated") if isinstance(verdict["rates"], dict) else None
    expect(isinstance(got, dict) and all(float(got.get(kind, -1)) == 0.0 for kind in ("duplicate", "omission")),
           f"verdict['rates']['curated'] is {got!r:.80} for a stratum that expects nothing this time "
           f"({_strata_text(empty)}): nothing can be replayed or omitted there, so both rates are 0.0.")


JUDGE_DEVIATION_CHECKS = ("check_judge_deviation_accepts", "check_judge_deviation_replay",
                          "check_judge_deviation_omission", "check_judge_deviation_recompute",
                          "check_judge_deviation_rates")
