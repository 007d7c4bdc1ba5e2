"""Checks for notebook 07: DistributedSampler and world-size changes.

``epoch_order`` is compared with the real ``torch.utils.data.DistributedSampler``:
rank r of the sampler must yield ``order[r::world_size]``. Each check looks at one
aspect (the permutation, the epoch, the padding, the trimming) and is written so
that a mistake in another aspect does not cost its points: the padding and
trimming checks judge the structure of the learner's own list, and the epoch
check compares the learner's orders with each other through the sampler's rule
``generator seed = seed + epoch``. The permutation check pins the generator to
the sampler's, so all four together mean "identical to DistributedSampler"; it
also makes sure the answer leaves the process's global RNGs alone, as the sampler
does (``torch.manual_seed(seed + epoch)`` gives the right order, and resets the
training loop's RNG every epoch). That side effect shows only in the process
where the answer runs: a probe reports the RNG states there.

``resume_shards`` is judged against the epoch's global order rebuilt from the real
sampler, one property per check: equal per-rank lengths, no committed position
trained again, no remaining position left out, bounded padding, and the
remaining positions kept in global order with the padding after them (so the new
job's first window is the expected suffix of the order, and the cursor still works
after the next crash), drawn without touching the global RNGs.
"""

from __future__ import annotations

from torch.utils.data.distributed import DistributedSampler

from .checking import expect, first_difference, graded_check, observe
from .helpers import changed_global_rngs, describe_rng_change, probe_global_rngs


# ---- the real sampler, seen globally ------------------------------------------------------

def sampler_shards(n: int, seed: int, epoch: int, world_size: int, shuffle: bool = True,
                   drop_last: bool = False) -> list[list[int]]:
    """What each rank's DistributedSampler yields for this epoch (no process group needed)."""
    shards = []
    for rank in range(world_size):
        # The sampler only calls len() on the dataset, so a range stands in for it.
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def interleave(shards: list[list[int]]) -> list[int]:
    """Global order from per-rank lists laid out as rank r = order[r::world_size]."""
    longest = max((len(s) for s in shards), default=0)
    return [shard[i] for i in range(longest) for shard in shards if i < len(shard)]


def sampler_total_size(n: int, world_size: int, drop_last: bool) -> int:
    """How many positions the sampler schedules in one epoch: its len() per rank times the ranks."""
    return len(DistributedSampler(range(n), num_replicas=world_size, rank=0, drop_last=drop_last)) * world_size


# ---- reading the learner's answers --------------------------------------------------------

def _as_indices(value, what: str) -> list[int]:
    try:
        items = list(value)
    except TypeError:
        raise AssertionError(f"{what} should be a list of dataset indices, but it is {type(value).__name__}.") from None
    try:
        return [int(i) for i in items]
    except (TypeError, ValueError):
        raise AssertionError(f"{what} should hold integer dataset indices; it holds {items[:3]!r}...") from None


def _run_learner(function, call: str, *args, **kwargs):
    """Call the learner's code; an exception becomes a failure that names the inputs."""
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise  # the grader reports an untouched answer cell as "not answered yet"
    except Exception as exc:
        raise AssertionError(f"{call} raised {type(exc).__name__}: {exc}") from None


def _call(n, seed, epoch, world_size, shuffle, drop_last) -> str:
    return f"epoch_order(n={n}, seed={seed}, epoch={epoch}, world_size={world_size}, shuffle={shuffle}, drop_last={drop_last})"


def _order(epoch_order, n, seed, epoch, world_size, shuffle=True, drop_last=False) -> list[int]:
    call = _call(n, seed, epoch, world_size, shuffle, drop_last)
    return _as_indices(_run_learner(epoch_order, call, n, seed, epoch, world_size, shuffle=shuffle,
                                    drop_last=drop_last), call)


def _show(indices: list[int], limit: int = 12) -> str:
    return str(indices) if len(indices) <= limit else f"[{', '.join(map(str, indices[:limit]))}, ...]"


# ---- epoch_order --------------------------------------------------------------------------

@graded_check("epoch_order draws DistributedSampler's permutation and rank layout, from a generator of its own")
def check_epoch_order_permutation(epoch_order, seed: int = 0) -> None:
    # n divisible by the world size: no padding or trimming, only the permutation and the layout.
    for n, world_size in ((12, 3), (16, 4), (10, 5), (7, 1), (24, 8), (20, 2)):
        for shuffle in (True, False):
            run_seed = seed + n
            expected = interleave(sampler_shards(n, run_seed, 0, world_size, shuffle=shuffle))
            got = _order(epoch_order, n, run_seed, 0, world_size, shuffle=shuffle)
            if got == expected:
                continue
            call = _call(n, run_seed, 0, world_size, shuffle, False)
            if not shuffle:
                raise AssertionError(
                    f"{call} returned {_show(got)}, but with shuffle=False DistributedSampler keeps the "
                    f"dataset order {_show(expected)}. Does your function look at `shuffle`?")
            if sorted(got) == sorted(expected):
                ranks = [_show(expected[r::world_size], 6) for r in range(min(world_size, 2))]
                raise AssertionError(
                    f"{call} returned a different order than the real DistributedSampler: {_show(got)} "
                    f"instead of {_show(expected)} (rank 0 yields {ranks[0]}). The sampler draws "
                    f"torch.randperm(n, generator=g) from a torch.Generator of its own, seeded with seed + epoch. "
                    f"Another generator (Python's random, NumPy), another seed, or torch's global RNG in whatever "
                    f"state the process left it gives another order, and so does a world-size-dependent layout "
                    f"(rank r takes positions r, r + R, r + 2R, ...).")
            raise AssertionError(
                f"{call} returned {_show(got)}: for {n} samples and {world_size} ranks (no padding needed) "
                f"the order should contain each index 0..{n - 1} exactly once, like {_show(expected)}.")
    # The right order can still come from the wrong generator: torch.manual_seed(seed + epoch) and a draw from
    # the global RNG gives it, and resets the training loop's RNG at every epoch. Only the process the answer
    # runs in shows that: the probe reads its global RNG states around one call.
    n, world_size, run_seed, epoch = 12, 3, seed + 12, 1
    call = _call(n, run_seed, epoch, world_size, True, False)
    seen = _run_learner(observe, call, probe_global_rngs, epoch_order, n, run_seed, epoch, world_size,
                        shuffle=True, drop_last=False)
    changed = changed_global_rngs(seen)
    expect(not changed,
           f"{call} gives DistributedSampler's order, but it changed the process's global random state: "
           f"{describe_rng_change(seen, changed, reseed=run_seed + epoch)}. The training loop draws from those "
           f"(dropout masks, augmentations, initialisations): an epoch_order that reseeds them resets the run's "
           f"randomness at every epoch, and one that draws from them shifts it. DistributedSampler draws from a "
           f"torch.Generator of its own and leaves every global RNG as it was: do the same.")


@graded_check("epoch_order reshuffles each epoch with seed + epoch, as set_epoch does")
def check_epoch_order_epochs(epoch_order, seed: int = 0) -> None:
    n, world_size, base = 20, 4, seed + 3
    orders = {epoch: _order(epoch_order, n, base, epoch, world_size) for epoch in range(5)}
    repeats = [e for e in range(1, 5) if orders[e] == orders[0]]
    expect(not repeats,
           f"epoch_order(n={n}, seed={base}, epoch=e, world_size={world_size}) gives the same order for epochs "
           f"0 and {repeats}: the epoch never reaches the generator, so every epoch (and every resume that "
           f"restores only the seed) replays one permutation. What does set_epoch change in DistributedSampler?")
    for epoch in range(1, 5):
        shifted = _order(epoch_order, n, base + epoch, 0, world_size)
        expect(orders[epoch] == shifted,
               f"epoch_order(seed={base}, epoch={epoch}) = {_show(orders[epoch])} but epoch_order(seed="
               f"{base + epoch}, epoch=0) = {_show(shifted)}. DistributedSampler seeds its generator with "
               f"seed + epoch, so those two calls are the very same shuffle. How does your code combine "
               f"seed and epoch?")


@graded_check("epoch_order pads with the head of the list, wrapping when the dataset is small")
def check_epoch_order_padding(epoch_order, seed: int = 0) -> None:
    # n not divisible by the world size; the last three need more than one copy of the list.
    for n, world_size in ((10, 4), (7, 3), (13, 6), (3, 8), (2, 7), (1, 5)):
        total = sampler_total_size(n, world_size, drop_last=False)
        for shuffle in (True, False):
            call = _call(n, seed, seed % 3, world_size, shuffle, False)
            got = _order(epoch_order, n, seed, seed % 3, world_size, shuffle=shuffle)
            if len(got) != total:
                hint = ("it must wrap around the list more than once when padding exceeds n"
                        if n < total - n else "every rank needs the same number of samples")
                raise AssertionError(
                    f"{call} returned {len(got)} positions, but DistributedSampler schedules {total} "
                    f"({total // world_size} per rank): with drop_last=False it pads {total - n} positions "
                    f"and {hint}. Without that padding the ranks get unequal lengths and DDP waits forever "
                    f"at the last collective.")
            head = got[:n]
            expect(sorted(head) == list(range(n)),
                   f"{call}: the first {n} positions should be each dataset index once, got {_show(head)}.")
            padding = [head[i % n] for i in range(total - n)]
            expect(got[n:] == padding,
                   f"{call}: the padding is {_show(got[n:])}, but DistributedSampler fills it with the head of "
                   f"its own shuffled list, {_show(padding)}, starting over from the top as often as needed.")


@graded_check("epoch_order with drop_last=True trims the tail of the same list")
def check_epoch_order_drop_last(epoch_order, seed: int = 0) -> None:
    for n, world_size in ((10, 4), (7, 3), (13, 6), (9, 2), (3, 8)):
        total = sampler_total_size(n, world_size, drop_last=True)
        for shuffle in (True, False):
            call = _call(n, seed, seed % 3, world_size, shuffle, True)
            got = _order(epoch_order, n, seed, seed % 3, world_size, shuffle=shuffle, drop_last=True)
            expect(len(got) == total,
                   f"{call} returned {len(got)} positions, but with drop_last=True DistributedSampler keeps "
                   f"only {total} ({total // world_size} per rank) and drops the other {n - total}: it never "
                   f"pads, it trims.")
            full = _order(epoch_order, n, seed, seed % 3, world_size, shuffle=shuffle)
            expect(got == full[:total],
                   f"{call} = {_show(got)}, but drop_last=True keeps the first {total} positions of the very same "
                   f"shuffled list ({_show(full[:total])}) and drops its tail.")


# ---- resume_shards ------------------------------------------------------------------------

def _resume_scenarios(seed: int) -> list[dict]:
    """Shrinking, growing, small datasets whose padding wraps, drop_last, nothing left."""
    return [
        dict(n=48, seed=seed, epoch=2, old_world_size=4, committed=32, new_world_size=3),
        dict(n=50, seed=seed + 1, epoch=0, old_world_size=4, committed=24, new_world_size=6),
        dict(n=30, seed=seed + 2, epoch=1, old_world_size=3, committed=12, new_world_size=4),
        dict(n=9, seed=seed + 3, epoch=3, old_world_size=3, committed=6, new_world_size=8),
        dict(n=60, seed=seed + 4, epoch=0, old_world_size=6, committed=36, new_world_size=6),
        dict(n=41, seed=seed + 5, epoch=1, old_world_size=4, committed=16, new_world_size=5, drop_last=True),
        dict(n=26, seed=seed + 6, epoch=4, old_world_size=2, committed=10, new_world_size=3, drop_last=True),
        dict(n=45, seed=seed + 7, epoch=1, old_world_size=5, committed=45, new_world_size=3),
    ]


class _Resume:
    """One resume scenario: the learner's shards next to the epoch's true remaining positions."""

    def __init__(self, resume_shards, scenario: dict):
        self.s = {**scenario, "drop_last": scenario.get("drop_last", False)}
        self.new_world_size = self.s["new_world_size"]
        self.drop_last = self.s["drop_last"]
        old_order = interleave(sampler_shards(self.s["n"], self.s["seed"], self.s["epoch"], self.s["old_world_size"],
                                              drop_last=self.drop_last))
        self.committed_indices = set(old_order[:self.s["committed"]])
        # The epoch's real (non-padding) positions after the committed cursor: padding positions (>= n)
        # belong to the old partition only.
        self.remaining = old_order[self.s["committed"]:min(self.s["n"], len(old_order))]
        # drop_last=True may trim fewer than new_world_size positions, from the tail only.
        may_trim = self.new_world_size - 1 if self.drop_last else 0
        self.must_train = self.remaining[:max(0, len(self.remaining) - may_trim)]
        self.call = ("resume_shards(" + ", ".join(f"{k}={v}" for k, v in self.s.items()) + ")")
        result = _run_learner(resume_shards, self.call, **self.s)
        try:
            ranks = list(result)
        except TypeError:
            raise AssertionError(f"{self.call} should return a list of per-rank index lists, "
                                 f"not {type(result).__name__}.") from None
        self.shards = [_as_indices(rank, f"{self.call}[{r}]") for r, rank in enumerate(ranks)]
        self.trained = [i for shard in self.shards for i in shard]
        self.schedule = interleave(self.shards)

    @property
    def story(self) -> str:
        s = self.s
        return (f"({s['old_world_size']} ranks committed {s['committed']} of {s['n']} positions, "
                f"resuming on {s['new_world_size']})")


def _check_each_scenario(resume_shards, seed: int, judge) -> None:
    for scenario in _resume_scenarios(seed):
        judge(_Resume(resume_shards, scenario))


@graded_check("resume_shards gives every new rank the same number of samples")
def check_resume_shards_equal_lengths(resume_shards, seed: int = 0) -> None:
    def judge(r: _Resume) -> None:
        expect(len(r.shards) == r.new_world_size,
               f"{r.call} returned {len(r.shards)} lists, one per rank of which world size? The resumed job has "
               f"{r.new_world_size} ranks, and each needs its own list.")
        lengths = [len(shard) for shard in r.shards]
        expect(len(set(lengths)) <= 1,
               f"{r.call} gives the ranks {lengths} samples {r.story}. DDP all-reduces gradients at every step, so "
               f"a rank with more batches waits forever for partners that have finished: every rank needs the "
               f"same length. What does DistributedSampler do when the count does not divide evenly?")
    _check_each_scenario(resume_shards, seed, judge)


@graded_check("resume_shards trains no committed position again")
def check_resume_shards_no_replay(resume_shards, seed: int = 0) -> None:
    def judge(r: _Resume) -> None:
        replayed = [i for i in r.trained if i in r.committed_indices]
        if not replayed:
            return
        raise AssertionError(
            f"{r.call} schedules {len(replayed)} samples whose updates were already committed {r.story}, "
            f"e.g. indices {_show(sorted(set(replayed)), 8)}. Those gradients are already in the checkpointed "
            f"weights, so training them again biases the model toward them. Skip exactly `committed` positions "
            f"of the epoch's global order, whatever the world size was; a per-rank count means something "
            f"different once the ranks change, and padding should repeat positions that remain, not old ones.")
    _check_each_scenario(resume_shards, seed, judge)


@graded_check("resume_shards leaves out no remaining position")
def check_resume_shards_no_omission(resume_shards, seed: int = 0) -> None:
    def judge(r: _Resume) -> None:
        present = set(r.trained)
        omitted = [i for i in r.must_train if i not in present]
        trimmed = [i for i in r.remaining if i not in present]
        if not omitted and len(trimmed) < r.new_world_size:
            return
        omitted = omitted or trimmed
        rule = ("with drop_last=True you may trim fewer than new_world_size positions from the tail, no more"
                if r.drop_last else "with drop_last=False nothing may be dropped: pad instead")
        raise AssertionError(
            f"{r.call} never schedules {len(omitted)} of the {len(r.remaining)} positions that remain after the "
            f"cursor {r.story}, e.g. indices {_show(omitted, 8)}: this epoch never trains them ({rule}). "
            f"Check where your continuation starts, and that every remaining position lands on some new rank.")
    _check_each_scenario(resume_shards, seed, judge)


@graded_check("resume_shards pads only as much as the new world size needs")
def check_resume_shards_padding(resume_shards, seed: int = 0) -> None:
    def judge(r: _Resume) -> None:
        repeats = len(r.trained) - len(set(r.trained))
        if r.drop_last:
            expect(repeats == 0,
                   f"{r.call} repeats {repeats} samples, but drop_last=True means no padding: trim the "
                   f"remainder to a multiple of the world size instead {r.story}.")
            return
        needed = -len(r.remaining) % r.new_world_size
        expect(repeats < r.new_world_size,
               f"{r.call} repeats {repeats} samples {r.story}; {len(r.remaining)} remaining positions on "
               f"{r.new_world_size} ranks need {needed} padding entries (always fewer than the world size). "
               f"Is your padding rounding up when the count already divides evenly, or carrying over padding "
               f"built for the old world size?")
    _check_each_scenario(resume_shards, seed, judge)


@graded_check("resume_shards keeps the epoch's global order, rank r taking positions r, r + R, ..., "
              "padding after it, and leaves the global RNGs alone")
def check_resume_shards_global_order(resume_shards, seed: int = 0) -> None:
    def judge(r: _Resume) -> None:
        remaining = set(r.remaining)
        seen, first_time = set(), []
        for i in r.schedule:
            if i in remaining and i not in seen:
                seen.add(i)
                first_time.append(i)
        expected = [i for i in r.remaining if i in seen]
        if first_time != expected:
            at = first_difference(first_time, expected)
            raise AssertionError(
                f"{r.call}: read globally (rank 0's first, rank 1's first, ..., then everyone's second), the "
                f"remaining positions come in another order than the epoch's: continuation position {at} is index "
                f"{first_time[at]}, expected {expected[at]}. Rank r should take the continuation's positions "
                f"r, r + R, r + 2R, ... (R = {r.new_world_size}), as DistributedSampler lays them out; a block "
                f"split or a reshuffle of the remainder means that after the next crash, 'k updates done' no "
                f"longer names a prefix of the global order, and the global cursor is lost.")
        # The restart's audit compares the first window the new job trains with the expected suffix of the
        # global order: padding (a remaining position repeated) must come after every remaining position.
        ahead = [i for i in r.schedule if i in remaining]
        distinct = len(set(ahead))
        if len(set(ahead[:distinct])) == distinct:
            return
        at = next(k for k in range(distinct) if ahead[k] in ahead[:k])
        raise AssertionError(
            f"{r.call}: read globally, the continuation repeats index {ahead[at]} at position {at}, before "
            f"{distinct - len(set(ahead[:at]))} remaining positions have been trained once: the padding comes "
            f"first. The new job's first window, {_show(r.schedule[:r.new_world_size * 2], 8)}, is then not the "
            f"expected suffix of the global order, {_show(r.remaining[:r.new_world_size * 2], 8)}, so a restart "
            f"that checks its first window against the audit record refuses it; and after k updates the cursor "
            f"counts the repeats as progress and names positions never trained. Pad after the remaining "
            f"positions, as DistributedSampler pads after its list.")
    _check_each_scenario(resume_shards, seed, judge)
    # Rebuilding the epoch's order must not touch the training loop's RNGs either (see
    # check_epoch_order_permutation): the probe reads them around one call, where the answer runs.
    scenario = _resume_scenarios(seed)[0]
    call = "resume_shards(" + ", ".join(f"{k}={v}" for k, v in scenario.items()) + ")"
    seen = _run_learner(observe, call, probe_global_rngs, resume_shards, **scenario)
    changed = changed_global_rngs(seen)
    expect(not changed,
           f"{call} deals the right positions, but it changed the process's global random state: "
           f"{describe_rng_change(seen, changed, reseed=scenario['seed'] + scenario['epoch'])}. A resume that "
           f"reseeds or draws from them changes the training loop's randomness from the resume on (if "
           f"resume_shards calls your epoch_order, the change may come from there). Leave them alone: rebuild "
           f"the order from a torch.Generator of your own, as DistributedSampler does.")


EPOCH_ORDER_CHECKS = ("check_epoch_order_permutation", "check_epoch_order_epochs",
                      "check_epoch_order_padding", "check_epoch_order_drop_last")
RESUME_SHARDS_CHECKS = ("check_resume_shards_equal_lengths", "check_resume_shards_no_replay",
                        "check_resume_shards_no_omission", "check_resume_shards_padding",
                        "check_resume_shards_global_order")
