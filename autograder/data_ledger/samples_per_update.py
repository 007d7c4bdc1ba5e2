"""The checks of notebook 06's ``samples_per_update``: the sample positions one optimizer update consumes."""

from __future__ import annotations

from ..checking import expect, graded_check


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
