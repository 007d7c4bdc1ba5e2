#!/usr/bin/env python3
"""How long does auditing a 10^9-position run take? (notebook 06; not part of the test run)

    .venv/bin/python benchmarks/ledger_audit.py          # prints a table, writes JSON

Audits a run of 10^9 sample positions with one replay and one omission, in three
representations of the same run:
  * spans per restart segment (what a ledger that merges touching commits stores),
  * one span per optimizer update (about 10^7 spans; measured at 10^6 and scaled,
    since building 10^7 Python range objects alone takes seconds),
  * one entry per position (a per-sample set; measured at 10^6 and scaled).
Times are the best of up to three calls. Writes artifacts/benchmarks/ledger_audit.json.
"""

from __future__ import annotations

import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))   # the fixtures, imported as the tests import them

import numpy as np  # noqa: E402
import torch  # noqa: E402

from autograder.data_ledger import _scale_case  # noqa: E402
from fixtures.data_ledger_impls import audit, audit_numpy, audit_per_sample_sets  # noqa: E402

TARGET = 10**9


def per_update_case(positions: int, per_update: int) -> tuple[list[range], list[range]]:
    """One trained span per optimizer update, one replayed update and one missing update."""
    updates = positions // per_update
    trained = [range(u * per_update, (u + 1) * per_update) for u in range(updates)]
    trained.insert(updates // 2, trained[updates // 2 - 1])          # a replayed update
    del trained[updates // 4]                                        # an omitted update
    return [range(0, updates * per_update)], trained


def measure(function, expected, trained, memory: bool = False, repeats: int = 3) -> dict:
    """Best of ``repeats`` timed calls (a shared machine adds noise, never speed), stopping early
    once the calls add up to 5 s; then one call under tracemalloc for the peak memory."""
    seconds, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        result = function(expected, trained)
        took = time.perf_counter() - start
        seconds, spent = min(seconds, took), spent + took
        if spent > 5:
            break
    peak = None
    if memory:
        tracemalloc.start()
        function(expected, trained)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return {"seconds": seconds, "peak_bytes": peak,
            "replayed": sum(map(len, result["replayed"])), "omitted": sum(map(len, result["omitted"]))}


def main() -> None:
    rows = []

    def row(representation, implementation, positions, spans, m, scaled_to=None):
        factor = (scaled_to or positions) / positions
        rows.append({"representation": representation, "implementation": implementation,
                     "positions": positions, "spans": spans, "measured_seconds": m["seconds"],
                     "seconds_at_1e9": m["seconds"] * factor, "scaled": scaled_to is not None,
                     "peak_bytes": m["peak_bytes"],
                     "peak_bytes_at_1e9": None if m["peak_bytes"] is None else m["peak_bytes"] * factor,
                     "replayed": m["replayed"], "omitted": m["omitted"]})
        print(f"  measured {representation:<28} {implementation:<22} {m['seconds']:.3f} s", flush=True)

    for name, function in (("sweep (notebook)", audit), ("numpy", audit_numpy)):
        for spans in (100, 10_000):
            expected, trained = _scale_case(TARGET, spans)
            row("spans per segment", name, TARGET, spans, measure(function, expected, trained))
    for name, function in (("sweep (notebook)", audit), ("numpy", audit_numpy)):
        expected, trained = per_update_case(10**8, 100)  # 10^6 spans of 100 positions
        row("one span per update", name, 10**8, len(trained), measure(function, expected, trained), scaled_to=TARGET)
    expected, trained = _scale_case(10**6, 100)
    row("one entry per position", "per-sample set", 10**6, 100,
        measure(audit_per_sample_sets, expected, trained, memory=True), scaled_to=TARGET)

    print(f"\nAuditing {TARGET:,} positions (scaled rows extrapolate linearly from the measured size)\n")
    print(f"{'representation':<24} {'implementation':<18} {'spans at 10^9':>14} {'seconds':>9} {'memory':>10}  note")
    for r in rows:
        spans_at_target = int(r["spans"] * (TARGET / r["positions"]))
        memory = "" if r["peak_bytes_at_1e9"] is None else f"{r['peak_bytes_at_1e9'] / 1e9:.0f} GB"
        note = f"scaled from {r['positions']:,} positions" if r["scaled"] else "measured"
        print(f"{r['representation']:<24} {r['implementation']:<18} {spans_at_target:>14,} "
              f"{r['seconds_at_1e9']:>9.3f} {memory:>10}  {note}")

    out = ROOT / "artifacts" / "benchmarks" / "ledger_audit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "ledger_audit", "target_positions": TARGET, "rows": rows,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                    "platform": platform.platform(), "cpus": torch.get_num_threads()},
    }, indent=2))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
