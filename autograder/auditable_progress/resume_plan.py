"""Checks for notebook 10's ``resume_plan(saved_states, world_size, num_workers)``: judged by reading, for
every new owner (rank x worker), the records its plan names, and counting every record of every partition.
"""

from __future__ import annotations

import copy
import random

from ..checking import expect, failing_if_raised, first_difference, graded_check


def owners_of(world_size: int, num_workers: int) -> int:
    """Owners of a job: one per rank and DataLoader worker; with num_workers=0 the rank's main process reads."""
    return world_size * max(num_workers, 1)


def _plan_scenarios(seed: int):
    """(partition lengths, old (world, workers), new (world, workers), committed offsets): the number of ranks
    or of workers changed or not, zero workers (main-process loading) on either side, more new owners than
    partitions, and a job that had committed nothing yet."""
    rng = random.Random(seed)
    layouts = [((2, 2), (2, 2)), ((2, 2), (2, 1)), ((2, 2), (1, 3)), ((1, 2), (2, 2)), ((4, 2), (3, 1)),
               ((2, 3), (1, 1)), ((2, 0), (3, 0)), ((1, 0), (2, 2)), ((2, 2), (2, 0)), ((1, 2), (4, 4))]
    out = []
    for i, (old, new) in enumerate(layouts):
        partitions = rng.randint(9, 14)
        lengths = [rng.randint(4, 12) for _ in range(partitions)]
        offsets = {p: rng.choice([0, n, rng.randint(1, n - 1)]) for p, n in enumerate(lengths)}
        if i == 3:
            offsets = dict.fromkeys(offsets, 0)              # nothing committed yet
        out.append((lengths, old, new, offsets))
    return out


def _saved_states(lengths, old, offsets) -> list[dict]:
    world, workers = old
    owners = owners_of(world, workers)
    per_rank = max(workers, 1)
    return [{"rank": k // per_rank, "worker": k % per_rank,
             "offsets": {p: offsets[p] for p in range(len(lengths)) if p % owners == k}}
            for k in range(owners)]


def _read_plan(resume_plan, lengths, old, new, offsets, inputs_judged: bool = False):
    """What every new owner reads: {(partition, offset): [owners]}, and the call's text."""
    saved = _saved_states(lengths, old, offsets)
    given = copy.deepcopy(saved)
    call = f"resume_plan(saved_states, world_size={new[0]}, num_workers={new[1]})"
    with failing_if_raised(call):
        plan = resume_plan(given, new[0], new[1])
    if inputs_judged and given != saved:
        at = first_difference(given, saved)
        changed = (f"saved_states[{at}] reads {given[at]!r:.100} afterwards instead of {saved[at]!r:.100}"
                   if at < min(len(given), len(saved)) else
                   f"the list holds {len(given)} saved states afterwards instead of {len(saved)}")
        raise AssertionError(
            f"{call} changed the saved states it was given: {changed} (a ledger built on one of them, not on a "
            f"copy, writes every other owner's offsets into it). They are the crashed job's record: a second "
            f"resume, or an audit, reads them again.")
    owners = owners_of(*new)
    try:
        plan = [[(int(p), int(o)) for p, o in owner] for owner in plan]
    except (TypeError, ValueError):
        raise AssertionError(f"{call} should return one list of (partition, offset) pairs per owner, "
                             f"not {plan!r:.120}.") from None
    expect(len(plan) == owners,
           f"{call} returned {len(plan)} lists, but the new job has {new[0]} rank(s) x {new[1]} worker(s): "
           f"{owners} owners, and each needs its own list (owner = rank x workers + worker"
           + ("; with num_workers=0 each rank reads in its main process, one owner per rank" if new[1] == 0 else "")
           + ", an owner with nothing left to read gets an empty list).")
    readers: dict[tuple[int, int], list[int]] = {}
    for owner, pairs in enumerate(plan):
        for p, first in pairs:
            expect(0 <= p < len(lengths), f"{call} names partition {p}; there are {len(lengths)}.")
            for o in range(max(first, 0), lengths[p]):
                readers.setdefault((p, o), []).append(owner)
    story = (f"({old[0]} rank(s) x {old[1]} worker(s) saved their states; the new job has {new[0]} x {new[1]})")
    return readers, call, story


@graded_check("resume_plan gives every remaining record one owner, no committed record again, and leaves the saved "
              "states as they were")
def check_resume_plan_no_overlap(resume_plan, seed: int = 0) -> None:
    for lengths, old, new, offsets in _plan_scenarios(seed):
        readers, call, story = _read_plan(resume_plan, lengths, old, new, offsets, inputs_judged=True)
        twice = {k: v for k, v in readers.items() if len(v) > 1}
        if twice:
            (p, o), who = min(twice.items())
            same_rank = len({w // max(new[1], 1) for w in who}) == 1
            raise AssertionError(
                f"{call} {story}: {len(twice)} records are read by more than one owner, e.g. record {o} of "
                f"partition {p} by owners {who}" + (" (workers of the same rank)" if same_rank else "") +
                ". A DataLoader cannot tell whether copies of an IterableDataset overlap: ownership must be "
                "explicit per rank and per worker.")
        again = sorted(k for k in readers if k[1] < offsets[k[0]])
        if again:
            p, o = again[0]
            raise AssertionError(
                f"{call} {story}: {len(again)} committed records are read again, e.g. record {o} of partition {p}, "
                f"whose committed offset is {offsets[p]}. Each partition resumes at its committed offset.")


@graded_check("resume_plan leaves no remaining record unread when the number of ranks or workers changes")
def check_resume_plan_no_gap(resume_plan, seed: int = 0) -> None:
    for lengths, old, new, offsets in _plan_scenarios(seed):
        readers, call, story = _read_plan(resume_plan, lengths, old, new, offsets)
        missing = [(p, o) for p, n in enumerate(lengths) for o in range(offsets[p], n) if (p, o) not in readers]
        if not missing:
            continue
        parts = sorted({p for p, _ in missing})
        owners_by = sorted({p % owners_of(*old) for p in parts})
        raise AssertionError(
            f"{call} {story}: {len(missing)} remaining records are never read, in partitions {parts} (saved by "
            f"old owners {owners_by}). A state saved per owner only fits the same number of owners: merge the "
            f"saved offsets into one global (partition, offset) ledger, then divide it among the new owners.")


RESUME_PLAN_CHECKS = ("check_resume_plan_no_overlap", "check_resume_plan_no_gap")
