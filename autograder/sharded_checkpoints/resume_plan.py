"""Checks for notebook 09's ``resume_plan(saved, new_world_size, steps)``, judged on the positions it returns,
update by update.
"""

from __future__ import annotations

import copy

from ..checking import expect, failing_if_raised, graded_check


def _saved(world_size: int, global_batch: int, updates: int) -> dict:
    return {"world_size": world_size, "global_batch": global_batch,
            "samples_seen": [updates * global_batch // world_size] * world_size}


def _plan(resume_plan, saved: dict, new_world_size: int, steps: int, inputs_judged: bool = False) -> tuple[str, list]:
    call = f"resume_plan({saved!r}, new_world_size={new_world_size}, steps={steps})"
    given = copy.deepcopy(saved)
    with failing_if_raised(call):
        plan = resume_plan(given, new_world_size, steps)
    expect(given == saved or not inputs_judged,
           f"{call} changed the saved state it was given (afterwards it reads {given!r}). That state is what the "
           f"checkpoint holds: the next resume, or an audit, reads it too. Compute from it, do not write into it.")
    try:
        plan = [[[int(p) for p in update] for update in rank] for rank in plan]
    except (TypeError, ValueError):
        raise AssertionError(f"{call} should return plan[rank][update] = a list of global positions.") from None
    expect(len(plan) == new_world_size and all(len(rank) == steps for rank in plan),
           f"{call} returned {len(plan)} ranks x {[len(r) for r in plan][:6]} updates; expected {new_world_size} "
           f"ranks, each with {steps} updates.")
    return call, plan


def _plan_cases(seed: int) -> list[tuple]:
    b = 12
    return [(_saved(4, b, 2 + seed % 3), 3, 3), (_saved(4, b, 3 + seed % 2), 2, 2), (_saved(2, b, 1 + seed % 4), 4, 2),
            (_saved(3, b, 2), 6, 2), (_saved(4, b, 0), 3, 2)]


@graded_check("resume_plan continues from the global cursor: update u trains the u-th global batch after it")
def check_resume_plan_cursor(resume_plan, seed: int = 0) -> None:
    for saved, new_world_size, steps in _plan_cases(seed):
        call, plan = _plan(resume_plan, saved, new_world_size, steps, inputs_judged=True)
        cursor = sum(saved["samples_seen"])
        trained = sorted(p for rank in plan for update in rank for p in update)
        expected = list(range(cursor, cursor + len(trained)))
        if trained != expected:
            replayed = sorted({p for p in trained if p < cursor})
            twice = len(trained) - len(set(trained))
            skipped = sorted(set(range(cursor, max(trained, default=cursor))) - set(trained))
            found = [f"trains {len(replayed)} of them again (e.g. {replayed[:5]})" if replayed else "",
                     f"trains {twice} positions twice" if twice else "",
                     f"skips {len(skipped)} positions after the cursor (e.g. {skipped[:5]})" if skipped else ""]
            found = [f for f in found if f] or [f"trains {trained[:5]}... instead of {expected[:5]}..."]
            raise AssertionError(
                f"{call}: the {saved['world_size']} old ranks committed positions 0..{cursor - 1}, and the plan "
                f"{', '.join(found)}. A rank-local count ('rank r saw k samples of its slice') "
                f"names a place in a slice that no longer exists once the world size changes. Turn the saved counts "
                f"into one global cursor first, then deal out the positions after it.")
        updates = [sorted(p for rank in plan for p in rank[u]) for u in range(steps)]
        for u in range(steps - 1):
            if updates[u] and updates[u + 1] and updates[u][-1] > updates[u + 1][0]:
                raise AssertionError(
                    f"{call}: every position after the cursor is trained once, but not in order: update {u} trains "
                    f"position {updates[u][-1]} and update {u + 1} position {updates[u + 1][0]}, which comes before "
                    f"it. In order means that the u-th update trains the u-th global batch after the cursor, split "
                    f"among the ranks, as the run that never stopped did; the same positions in another order give "
                    f"other updates.")


@graded_check("resume_plan keeps the global batch: each update trains global_batch positions, split evenly")
def check_resume_plan_global_batch(resume_plan, seed: int = 0) -> None:
    for saved, new_world_size, steps in _plan_cases(seed):
        call, plan = _plan(resume_plan, saved, new_world_size, steps)
        sizes = [[len(rank[s]) for rank in plan] for s in range(steps)]
        want = saved["global_batch"] // new_world_size
        expect(all(size == want for update in sizes for size in update),
               f"{call}: per-rank batch sizes {sizes[0]} at the first update, {sum(sizes[0])} positions in all, "
               f"instead of {want} on each of the {new_world_size} ranks ({saved['global_batch']} in all). "
               f"Keeping the per-rank batch changes the global batch with the world size, so every later update "
               f"(its gradient noise, the step Adam takes per sample) differs from the run that never stopped. "
               f"Keep the global batch and divide it by the new world size.")
