"""What notebook 06's worked examples use and the exercises' checks share: the worked example's figures
(8 ranks, microbatch 2, 4 accumulation steps, a crash during the third microbatch after update 1,250), the
demo's dataset (``SlowWorkerSamples``, importable, so that it also loads in spawned workers) and the
per-position reference audit the audit checks, and notebook 10's, compare against.
"""

from __future__ import annotations

import collections
import time

import torch
from torch.utils.data import Dataset, get_worker_info

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
