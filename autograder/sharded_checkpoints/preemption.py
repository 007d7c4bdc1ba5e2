"""Checks for notebook 09's ``PreemptionGuard``: it runs inside real gloo ranks, and a scheduler (a process of
its own, started after the ranks) decides when its SIGTERMs come and to which ranks, so nothing in a rank's
memory says.
"""

from __future__ import annotations

import functools
import signal

import torch

from ..checking import Remembered, expect, failing_if_raised, graded_check, observe
from ..engine.forked_ranks import scheduled_jobs


GLOBAL_BATCH = 12
# The scenarios a cluster produces, one job each: a notice to one rank in the middle of the run, and a node's
# worth of ranks signalled at once, as early as the first update (before any commit). The scheduler draws the
# rank(s) and the update itself, in its own process, after the ranks exist: nothing the ranks hold says which
# job is which, nor when.
JOBS = ("one", "first")
STORIES = {"one": "the scheduler's SIGTERM reached one of the {R} ranks in the middle of an update",
           "first": "the scheduler's SIGTERM reached two of the {R} ranks at once, during the first update, before "
                    "any commit"}


def _draw(job: str, steps: int, world_size: int, rng) -> dict:
    if job == "one":
        return {"ranks": [rng.randrange(1, world_size)], "update": rng.randrange(2, steps)}
    return {"ranks": sorted(rng.sample(range(world_size), 2)), "update": 1}


def _guarded_rank(guard_class, steps: int, rank: int, world_size: int, channel) -> dict:
    """A rank of a preemption job (engine.forked_ranks.rank_process runs it): trains with guard_class(save),
    calling at_commit() after each update; its report."""
    import torch.distributed as dist
    from ..helpers import regression_data

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    X, y = regression_data(n=GLOBAL_BATCH * (steps + 1), seed=1)
    state = {"cursor": 0, "updates": 0}
    history = [[p.detach().clone() for p in model.parameters()]]   # weights after each committed update
    saves = []

    def save():
        weights = [p.detach().clone() for p in model.parameters()]
        match = next((u for u, w in enumerate(history) if all(torch.equal(a, b) for a, b in zip(w, weights))), None)
        saves.append({"cursor": state["cursor"], "updates": state["updates"], "weights_of_update": match})

    guard = guard_class(save)
    stopped_at = None
    for step in range(1, steps + 1):
        rows = list(range(state["cursor"] + rank, state["cursor"] + GLOBAL_BATCH, world_size))
        loss = torch.nn.functional.mse_loss(model(X[rows]), y[rows])
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():      # plain SGD by hand: torch.optim's first step imports torch._dynamo
                dist.all_reduce(p.grad)
                p -= 0.1 * p.grad / world_size
        state["updates"] += 1
        channel.mid_update()                          # the weights moved, the cursor has not
        state["cursor"] += GLOBAL_BATCH               # the update commits: weights, count and cursor agree
        history.append([p.detach().clone() for p in model.parameters()])
        if guard.at_commit():
            stopped_at = step
            break
    return {"stopped_at": stopped_at, "updates": state["updates"], "saves": saves}


def probe_preemption(guard_class, world_size: int, steps: int) -> list[dict]:
    """Two jobs at once, one per scenario of JOBS, each of ``world_size`` forked gloo ranks training with
    ``guard_class(save)`` and calling ``at_commit()`` after each update, under a scheduler process of its own
    that draws which rank(s) get a SIGTERM and in which update. Per job: the schedule it drew, the signals it
    sent, and per rank how it ended and its report."""
    return scheduled_jobs({job: (functools.partial(_guarded_rank, guard_class, steps),
                                 functools.partial(_draw, job, steps)) for job in JOBS},
                          world_size, deadline=40.0, prefix="preempt-")


_preemptions = Remembered(keep=4)


def _preemption(PreemptionGuard, world_size: int, steps: int) -> list[dict]:
    def run():
        with failing_if_raised("the ranks running PreemptionGuard"):
            return observe(probe_preemption, PreemptionGuard, world_size, steps)
    jobs = _preemptions((PreemptionGuard, world_size, steps), run)
    if any(rank["error"] == "NotImplementedError" for job in jobs for rank in job["ranks"]):
        raise NotImplementedError("PreemptionGuard")     # the stub: the runner says "not answered yet"
    for job in jobs:
        expect(job["schedule"] is not None and len(job["ranks"]) == world_size,
               f"The job in which {STORIES[job['job']].format(R=world_size)} did not report back: its ranks did not "
               f"end within 40 s.")
    return jobs


def _ending(rank: dict, notice: int) -> str:
    report = rank["report"]
    if report is None:
        return ("ended by the SIGTERM itself: no handler was installed" if rank["exit"] == -signal.SIGTERM
                else f"died ({rank['error'] or rank['exit']})")
    stopped = report["stopped_at"]
    if stopped is None:
        return f"never stopped (ran all {report['updates']} updates)"
    if stopped == notice:
        return "stopped at that update's commit"
    return (f"stopped {stopped - notice} commit{'s' * (stopped - notice > 1)} later" if stopped > notice
            else "stopped before the notice came")


def _summary(job: dict) -> str:
    notice, signalled = job["schedule"]["update"], set(job["schedule"]["ranks"])
    groups = [("the rank that got it" if len(signalled) == 1 else "the two that got it",
               [r for r in range(len(job["ranks"])) if r in signalled]),
              ("the other rank" if len(job["ranks"]) - len(signalled) == 1 else
               f"the other {len(job['ranks']) - len(signalled)}",
               [r for r in range(len(job["ranks"])) if r not in signalled])]
    parts = []
    for label, members in groups:
        endings = sorted({_ending(job["ranks"][r], notice) for r in members})
        parts.append(f"{label}: {' / '.join(endings)}")
    return "; ".join(parts)


def _story(job: dict, world_size: int) -> str:
    return STORIES[job["job"]].format(R=world_size)


@graded_check("PreemptionGuard stops every rank at the same commit, the first one after the notice")
def check_preemption_guard_same_boundary(PreemptionGuard, seed: int = 0, world_size: int = 3,
                                         notice: tuple | None = None, steps: int = 8) -> None:
    # `notice` is still accepted from test cells released before the scheduler drew the schedule itself.
    for job in _preemption(PreemptionGuard, world_size, steps):
        ranks, update, signalled = job["ranks"], job["schedule"]["update"], set(job["schedule"]["ranks"])
        stops = {r["report"]["stopped_at"] if r["report"] else None for r in ranks}
        if stops == {update} and all(r["exit"] == 0 for r in ranks):
            continue
        if any(ranks[r]["report"] is None and ranks[r]["exit"] == -signal.SIGTERM for r in signalled):
            trap = ("The SIGTERM found no handler and ended the rank on the spot (Python's default). "
                    + ("This notice came before the first commit: install the handler in __init__, before training "
                       "starts, not at the first at_commit." if job["job"] == "first" else
                       "Install the handler in __init__."))
        elif (all(ranks[r]["report"] and ranks[r]["report"]["stopped_at"] == update for r in signalled)
              and any(ranks[r]["report"] is None or ranks[r]["report"]["stopped_at"] != update
                      for r in range(len(ranks)) if r not in signalled)):
            trap = ("Only the rank that got the notice stopped; the others went on to the next collective and met a "
                    "dead peer. A flag is local to one process: at the commit, every rank must learn whether any rank "
                    "got a notice (one all_reduce of the flags).")
        elif all(r["report"] and r["report"]["stopped_at"] is None for r in ranks):
            trap = ("No rank stopped: the scheduler's SIGKILL at the end of the grace period would take the job, and "
                    "every update since the last checkpoint with it. One rank's notice must stop all ranks"
                    + (", and notices can reach several ranks at once" if len(signalled) > 1 else "")
                    + ": how do your ranks combine their flags?")
        elif any(r["error"] for r in ranks):
            trap = ("A rank ended outside the commit: a signal handler that saves or exits runs in the middle of "
                    "whatever the rank was doing, and the other ranks wait for it in a collective that never comes. "
                    "Let the handler only set a flag.")
        else:
            trap = ("The ranks must stop together at the first commit after the notice: the grace period is short, "
                    "and ranks that stop at different updates leave checkpoints that disagree.")
        raise AssertionError(f"{world_size} ranks; {_story(job, world_size)}: {_summary(job)}. {trap}")


def _torn(record: dict) -> str | None:
    """What is wrong with a saved record, in words that do not depend on the update: None when weights,
    count and cursor all belong to one commit."""
    weights, count, cursor = record["weights_of_update"], record["updates"], record["cursor"] // GLOBAL_BATCH
    if weights is None:
        return "weights that belong to no commit"
    if weights == count == cursor and record["cursor"] % GLOBAL_BATCH == 0:
        return None
    ahead = weights - cursor
    return (f"weights {ahead} update{'s' * (abs(ahead) != 1)} {'ahead of' if ahead >= 0 else 'behind'} its cursor "
            f"(and {count - cursor:+d} in its update count)")


@graded_check("PreemptionGuard has every rank save once, at that commit: weights, count and cursor of one update")
def check_preemption_guard_saves(PreemptionGuard, seed: int = 0, world_size: int = 3, notice: tuple | None = None,
                                 steps: int = 8) -> None:
    for job in _preemption(PreemptionGuard, world_size, steps):
        story, signalled = _story(job, world_size), set(job["schedule"]["ranks"])
        # the ranks that got the notice first: which rank numbers they have is the scheduler's draw
        order = sorted(range(len(job["ranks"])), key=lambda r: r not in signalled)
        for rank, seen in ((r, job["ranks"][r]) for r in order):
            who = "a rank that got the notice" if rank in signalled else "a rank that did not get it"
            for record in (seen["report"] or {}).get("saves", []):
                torn = _torn(record)
                expect(torn is None,
                       f"{world_size} ranks; {story}: {who} saved {torn}: a state from the middle of an update. A "
                       f"signal handler runs between two lines of the training loop, wherever it happens to be; a "
                       f"save inside it writes a half-done update, and on that one rank only. Save at the commit.")
        for rank, seen in ((r, job["ranks"][r]) for r in order):
            who = "a rank that got the notice" if rank in signalled else "a rank that did not get it"
            expect(seen["report"] is not None,
                   f"{world_size} ranks; {story}: {who} {_ending(seen, job['schedule']['update'])}, so its saves are "
                   f"unknown. A preemption handler must leave one checkpoint that every rank wrote, at the same "
                   f"commit.")
            saves = seen["report"]["saves"]
            expect(len(saves) == 1,
                   f"{world_size} ranks; {story}: {who} saved {len(saves)} times. Every rank must save exactly once, "
                   f"at the commit where all of them stop: a checkpoint missing one rank's shard is not a checkpoint.")
