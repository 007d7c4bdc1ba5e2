"""The capstone's checks: the learner's ``resume_equivalent``, driven as a black box on runs of each
policy, must accept both correct resumes and reject every broken one, comparing every tensor bitwise at
atol=0 and within atol otherwise.
"""

from __future__ import annotations

import math

import torch

from ..checking import expect, graded_check, max_abs_diff, observe
from ..engine import fresh_process
from .handles import probe_resume_equivalent
from .training_loop import CHECKPOINTING, CORRECT_POLICIES, POLICY_PARTS, RESUMING, run_with_a_crash, uninterrupted_run


def _verdict(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int,
             atol: float | None = None) -> bool:
    writes, resuming = POLICY_PARTS[policy]
    shown = f"resume_equivalent(new_run, resume_run, {total}, {crash_at}" + (
        ")" if atol is None else f", atol={atol!r})")
    seen = observe(probe_resume_equivalent, resume_equivalent, seed, accum_steps, CHECKPOINTING.index(writes),
                   RESUMING.index(resuming), total, crash_at, atol)
    if "raised" in seen:
        if seen["raised"]["type"] == "NotImplementedError":
            raise NotImplementedError
        raise AssertionError(f"{shown} raised {fresh_process.raised_text(seen['raised'])}")
    expect("verdict" in seen, f"resume_equivalent should return True or False, not {seen.get('not_a_verdict')}.")
    return seen["verdict"]


def _catches(resume_equivalent, policy: str, seed: int, accum_steps: int, total: int, crash_at: int,
             trap: str, hint: str = "") -> None:
    verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
    expect(not verdict,
           f"With a crash after microbatch {crash_at} of {total} ({accum_steps} per update), a resume that "
           f"{trap} ends with different weights than the uninterrupted run, yet resume_equivalent returned "
           f"True.{hint}")


@graded_check("resume_equivalent accepts a correct resume (at the commit boundary and mid-update)")
def check_resume_equivalent_accepts_correct_resume(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_points=(8, 11)) -> None:
    for policy in CORRECT_POLICIES:
        for crash_at in crash_points:
            verdict = _verdict(resume_equivalent, policy, seed, accum_steps, total, crash_at)
            if verdict:
                continue
            mid = crash_at % accum_steps
            if mid and policy == "commit_boundary":
                why = (f" The crash came {mid} microbatches into an update, and this checkpoint was written at "
                       f"the last commit: the resumed run's position is {crash_at - mid}, not {crash_at}, and it "
                       f"must redo those {mid} microbatches. How many does your check train after the resume?")
            else:
                why = (f" The resumed run continues from position {crash_at}, exactly where the crash left it, so "
                       f"the number of microbatches trained after the resume is not the question here. Either "
                       f"something changes torch's global RNG after resume_run (the resumed run must draw from "
                       f"the state its checkpoint restored: disturb the RNG before resume_run, never after), or "
                       f"the comparison rejects equal weights (at atol=0, |difference| <= atol, not < atol).")
            raise AssertionError(
                f"A resume that restores the complete state ({policy.replace('_', ' ')} checkpoint, crash after "
                f"microbatch {crash_at} of {total}) matches the uninterrupted run bitwise on this CPU, but "
                f"resume_equivalent returned False.{why}")


@graded_check("resume_equivalent catches a resume that does not restore the RNG")
def check_resume_equivalent_catches_unrestored_rng(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                   total: int = 12, crash_at: int = 8) -> None:
    # A crash at an update boundary on purpose: after a mid-update crash the recomputed microbatches
    # draw from a generator that has moved on, which shows the bug even to a check in one process.
    if crash_at % accum_steps:
        raise ValueError("crash_at must be at an update boundary for this check")
    _catches(resume_equivalent, "unrestored_rng", seed, accum_steps, total, crash_at,
             "never restores torch's global RNG (so dropout draws different masks after a real restart)",
             " Inside one process the global generator simply carries on where the crashed run left it, and "
             "hides the bug. A new process would not: what does your check do to the RNG between the crash and "
             "the resume?")


@graded_check("resume_equivalent catches a resume with a changed seed")
def check_resume_equivalent_catches_changed_seed(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                 total: int = 12, crash_at: int = 8) -> None:
    _catches(resume_equivalent, "changed_seed", seed, accum_steps, total, crash_at,
             "restarts with a different seed (new data order and dropout stream)")


@graded_check("resume_equivalent catches a weights-only resume")
def check_resume_equivalent_catches_weights_only(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                 total: int = 12, crash_at: int = 8) -> None:
    _catches(resume_equivalent, "weights_only", seed, accum_steps, total, crash_at,
             "loads only the model weights (fresh momentum, learning-rate schedule and scaler)")


@graded_check("resume_equivalent catches a mid-update checkpoint that claims uncommitted microbatches")
def check_resume_equivalent_catches_claimed_microbatches(resume_equivalent, seed: int = 0, accum_steps: int = 4,
                                                         total: int = 12, crash_at: int = 11) -> None:
    if crash_at % accum_steps == 0:
        raise ValueError("crash_at must fall inside an update for this check")
    _catches(resume_equivalent, "claims_uncommitted", seed, accum_steps, total, crash_at,
             f"counts the {crash_at % accum_steps} uncommitted microbatches as committed without saving "
             f"their gradients")


def _differences(policy: str, seed: int, accum_steps: int, total: int, crash_at: int) -> tuple[dict, int]:
    """What the check knows before it asks the learner's code: tensor name -> the largest |difference| between
    the final weights of a run resumed under ``policy`` and the uninterrupted run's, and the largest of them
    in units in the last place (ulps) of float32."""
    expected = uninterrupted_run(seed, accum_steps, total)
    got = run_with_a_crash(policy, seed, accum_steps, total, crash_at)
    ulps = 0
    for name, value in expected.items():
        magnitude = torch.maximum(value.abs(), got[name].abs())
        spacing = torch.nextafter(magnitude, torch.full_like(magnitude, math.inf)) - magnitude
        ulps = max(ulps, int(((got[name] - value).abs() / spacing).max()))
    return {name: max_abs_diff(got[name], value) for name, value in expected.items()}, ulps


@graded_check("resume_equivalent compares every tensor: bitwise at atol=0, |difference| <= atol otherwise")
def check_resume_equivalent_comparison(resume_equivalent, seed: int = 0, accum_steps: int = 4, total: int = 12,
                                       crash_at: int = 8) -> None:
    # 1. A resume whose last bits differ: every state restored, then each parameter one ulp up (what
    #    another build's rounding may do). It ends `largest` away from the uninterrupted run.
    differences, ulps = _differences("last_bits_differ", seed, accum_steps, total, crash_at)
    largest = max(differences.values())
    if largest == 0:
        raise ValueError("these arguments give a resume that ends bitwise equal: choose others")
    call = (resume_equivalent, "last_bits_differ", seed, accum_steps, total, crash_at)
    measured = (f"a resume whose final weights differ from the uninterrupted run's by at most {largest:.2e} "
                f"({ulps} units in the last place of float32 at most)")
    expect(not _verdict(*call, atol=0.0),
           f"At atol=0.0 (bitwise), {measured} must give False, but resume_equivalent returned True. A tolerance "
           f"crept in where none was declared: torch.allclose and torch.isclose add their defaults "
           f"(rtol=1e-05, atol=1e-08) unless told otherwise, and rounding or printing the weights hides the "
           f"last bits. At atol == 0 compare with torch.equal.")
    above = 2 * largest
    # Held only against an answer that accepts a correct resume at this atol: one that rejects even that one
    # loses check_resume_equivalent_accepts_correct_resume, for its experiment, not for its tolerance.
    expect(_verdict(*call, atol=above) or not _verdict(resume_equivalent, "commit_boundary", seed, accum_steps,
                                                        total, crash_at, atol=above),
           f"At atol={above:.2e}, {measured} is within the tolerance and must give True, but resume_equivalent "
           f"returned False. Does your check use atol, or does it always compare bitwise?")
    below = 0.9 * largest
    expect(not _verdict(*call, atol=below),
           f"At atol={below:.2e}, {measured} must give False (the largest difference is above atol), but "
           f"resume_equivalent returned True. atol bounds the largest |difference| of every entry: "
           f"torch.allclose and torch.isclose add rtol * |expected| (default rtol=1e-05) on top of it unless you "
           f"pass rtol=0, and a mean or sum of the differences hides the largest one.")
    # 2. A resume that restores the parameters but not the buffer (model.2.running_mean, a running mean):
    #    the final weights differ in that one tensor only, which is neither the first nor the last.
    differences, _ = _differences("buffers_not_restored", seed, accum_steps, total, crash_at)
    differing = [name for name, value in differences.items() if value]
    if len(differing) != 1:
        raise ValueError(f"expected one differing tensor, found {differing}")
    names = list(differences)
    call = (resume_equivalent, "buffers_not_restored", seed, accum_steps, total, crash_at)
    only = (f"a resume whose final tensors all equal the uninterrupted run's bitwise except one, "
            f"{', '.join(map(repr, differing))} (tensor {names.index(differing[0]) + 1} of {len(names)} in "
            f"weights(): a buffer, not a parameter), which differs by up to {differences[differing[0]]:.2e}")
    expect(not _verdict(*call, atol=0.0),
           f"At atol=0.0, {only}, must give False, but resume_equivalent returned True. Compare every tensor "
           f"weights() returns, {names}: not only the first or the last, not only those named weight or "
           f"bias, not only the parameters.")
    below = 0.9 * differences[differing[0]]
    expect(not _verdict(*call, atol=below),
           f"At atol={below:.2e}, {only}, must give False, but resume_equivalent returned True. atol bounds the "
           f"largest |difference| of every entry of every tensor; a mean or sum of the differences hides the "
           f"largest one.")
