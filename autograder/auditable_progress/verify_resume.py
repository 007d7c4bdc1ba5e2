"""Checks for notebook 10's ``verify_resume(manifest, checkpoint, resumed)``: it gets manifests, checkpoints
and resumed jobs built here, each wrong in one way (or in none), as plain dicts that carry numbers and strings,
never the name of the scenario.
"""

from __future__ import annotations

import copy
import random

from ..checking import expect, failing_if_raised, graded_check
from ..distributed_sampler import interleave, sampler_shards
from ..demos.token_streams import window_digest


STEPS = ("dataset_version", "committed_cursor", "world_size", "next_identifiers", "one_update")
WINDOW = 32


class _Run:
    """A small data-parallel run: DistributedSampler over n samples, global batch = world x micro x accum."""

    def __init__(self, seed: int):
        rng = random.Random(seed)
        self.n, self.seed, self.epoch = rng.choice((400, 480, 512)), seed, rng.randint(0, 3)
        self.world, self.micro, self.accum = 4, 2, rng.choice((2, 4))
        self.global_batch = self.world * self.micro * self.accum
        self.updates = rng.randint(6, 9)
        self.cursor = self.updates * self.global_batch      # the committed global cursor of the checkpoint
        self.generation = 10 + rng.randint(0, 20)
        self.number = rng.randint(2, 8)
        self.version = f"docs-v{self.number}"

    def order(self, epoch: int | None = None) -> list[int]:
        return interleave(sampler_shards(self.n, self.seed, self.epoch if epoch is None else epoch, self.world))

    def manifest(self, updates: int | None = None, generation: int | None = None, epoch: int | None = None) -> dict:
        """The manifest saved with the checkpoint (or, given other values, the one saved with another)."""
        updates = self.updates if updates is None else updates
        generation = self.generation if generation is None else generation
        epoch = self.epoch if epoch is None else epoch
        cursor = updates * self.global_batch
        window = self.order(epoch)[cursor:cursor + WINDOW]
        return {"dataset_version": self.version,
                "sampler": {"algorithm": "DistributedSampler", "shuffle": True, "seed": self.seed, "drop_last": False},
                "epoch": epoch, "global_cursor": cursor, "world_size": self.world, "micro_batch": self.micro,
                "accum_steps": self.accum, "global_batch": self.global_batch, "generation": generation,
                "torch": "2.13.0", "next_digest": window_digest(ids=window), "next_sample": window[:8]}

    def checkpoint(self) -> dict:
        return {"generation": self.generation, "epoch": self.epoch, "global_cursor": self.cursor}

    def resumed(self, cursor: int, world: int | None = None, repartitioned: bool = True, version: str | None = None,
                advance: int | None = None, ids=None, epoch: int | None = None) -> dict:
        world = world or self.world
        if ids is None and repartitioned:
            ids = self.order(epoch)[cursor:cursor + WINDOW]          # the remaining global order, re-dealt
        elif ids is None:                                     # each new rank resumes an old rank-local cursor
            local = cursor // self.world
            ids = interleave([s[local:] for s in sampler_shards(self.n, self.seed, self.epoch, world)])[:WINDOW]
        return {"dataset_version": version or self.version, "world_size": world, "torch": "2.13.0",
                "next_ids": list(ids), "cursor_after_one_update": cursor + (self.global_batch if advance is None
                                                                            else advance)}


def _verify(verify_resume, manifest, checkpoint, resumed, inputs_judged: bool = False) -> dict:
    given = copy.deepcopy((manifest, checkpoint, resumed))
    with failing_if_raised("verify_resume(manifest, checkpoint, resumed)"):
        report = verify_resume(*given)
    if inputs_judged:
        for name, before, after in zip(("manifest", "checkpoint", "resumed"), (manifest, checkpoint, resumed), given):
            key = next((k for k in set(before) | set(after) if before.get(k) != after.get(k)), None)
            expect(key is None,
                   f"verify_resume changed the {name} it was given: its {key!r} is {after.get(key)!r:.60} afterwards "
                   f"instead of {before.get(key)!r:.60}. The sequence only reads: the manifest and the checkpoint "
                   f"are the record a second look (or the next resume) needs as they were.")
    expect(isinstance(report, dict) and "ok" in report and "failed" in report,
           f"verify_resume should return a report dict with 'ok' and 'failed', not {report!r:.120}.")
    expect(isinstance(report["ok"], bool), f"report['ok'] should be True or False, not {report['ok']!r:.40}.")
    try:
        failed = [str(s) for s in report["failed"]]
    except TypeError:
        raise AssertionError(f"report['failed'] should be a list of step names, "
                             f"not {report['failed']!r:.80}.") from None
    unknown = [s for s in failed if s not in STEPS]
    expect(not unknown, f"report['failed'] names {unknown}; the steps are {list(STEPS)}.")
    expect(report["ok"] == (not failed),
           f"The report says ok={report['ok']} with failed={failed}: a resume is ok exactly when no step failed.")
    return {"ok": report["ok"], "failed": failed}


def _expect_rejected(verify_resume, run, manifest, resumed, step, trap) -> None:
    report = _verify(verify_resume, manifest, run.checkpoint(), resumed)
    if not report["ok"] and step in report["failed"]:
        return
    verdict = "accepted it" if report["ok"] else f"rejected it for {report['failed']}, not for {step!r}"
    raise AssertionError(f"{trap} verify_resume {verdict}.")


@graded_check("verify_resume accepts a sound resume, also one repartitioned onto another world size, and changes "
              "none of its inputs")
def check_verify_resume_accepts(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    manifest, cursor = run.manifest(), run.cursor
    other_torch = {**run.resumed(cursor), "torch": "2.15.0"}
    for what, resumed in (("a resume on the same 4 ranks", run.resumed(cursor)),
                          ("a resume on 2 ranks that rebuilt the remaining global order and dealt it anew (same "
                           "global batch, twice the accumulation steps)", run.resumed(cursor, world=2)),
                          (f"a resume under another PyTorch ({other_torch['torch']}; the manifest records "
                           f"{manifest['torch']}), whose identifiers match: the torch field is recorded for a person "
                           f"to read, and no step judges it. Whether the data order changed, the identifiers show",
                           other_torch)):
        report = _verify(verify_resume, manifest, run.checkpoint(), resumed, inputs_judged=True)
        expect(report["ok"],
               f"verify_resume rejected {what}, for {report['failed']}: the manifest and the checkpoint agree "
               f"(generation {run.generation}, cursor {cursor}), the next {WINDOW} identifiers match the manifest's "
               f"digest and one update advanced the cursor by {run.global_batch}. A world size may change when the "
               f"remaining global order is repartitioned: the identifiers are the test of that.")


@graded_check("verify_resume rejects a changed dataset version")
def check_verify_resume_dataset_version(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    cursor = run.cursor
    other = f"docs-v{run.number + 1}"
    _expect_rejected(verify_resume, run, run.manifest(),
                     run.resumed(cursor, version=other), "dataset_version",
                     f"The manifest names dataset version {run.version!r}, the resumed job reads {other!r}, with the "
                     f"same sample identifiers (the same documents, tokenized anew): the identifiers and their digest "
                     f"match, yet position {cursor} now means other data.")


@graded_check("verify_resume rejects a manifest of another generation or epoch than the checkpoint")
def check_verify_resume_generation(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    stale = run.manifest(run.updates - 1, run.generation - 1)
    cursor = stale["global_cursor"]
    _expect_rejected(verify_resume, run, stale, run.resumed(cursor), "committed_cursor",
                     f"The checkpoint is generation {run.generation} with the committed cursor "
                     f"{run.cursor}; the manifest is generation {run.generation - 1} with cursor "
                     f"{cursor} (a data state written apart from the weights, one update older). The resumed job, "
                     f"started from the manifest, agrees with the manifest: only the checkpoint shows that "
                     f"{run.global_batch} committed positions would be trained again.")
    ahead = run.manifest(run.updates + 1, run.generation + 1)
    cursor = ahead["global_cursor"]
    _expect_rejected(verify_resume, run, ahead, run.resumed(cursor), "committed_cursor",
                     f"The checkpoint is generation {run.generation} with the committed cursor {run.cursor}; the "
                     f"manifest is generation {run.generation + 1} with cursor {cursor}: a data state written after "
                     f"the weights, one update ahead of them (the job died between the two writes). A generation "
                     f"ahead is as wrong as one behind: resumed from it, the job never trains {run.global_batch} "
                     f"positions, a gap no padding policy explains.")
    other_epoch = run.manifest(epoch=run.epoch + 1)
    _expect_rejected(verify_resume, run, other_epoch, run.resumed(run.cursor, epoch=run.epoch + 1), "committed_cursor",
                     f"The manifest and the checkpoint agree on the generation ({run.generation}) and the cursor "
                     f"({run.cursor}), but the manifest says epoch {run.epoch + 1} and the checkpoint epoch "
                     f"{run.epoch}: each field varies alone. The resumed job, started from the manifest, rebuilt "
                     f"epoch {run.epoch + 1}'s order, and every position from the cursor on names other samples.")


@graded_check("verify_resume rejects a changed world size without repartitioning")
def check_verify_resume_world_size(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    cursor = run.cursor
    resumed = run.resumed(cursor, world=2, repartitioned=False)
    _expect_rejected(verify_resume, run, run.manifest(), resumed, "world_size",
                     f"The manifest was written by 4 ranks; the resumed job runs 2, each resuming a rank-local "
                     f"cursor (position {cursor // run.world} of its own slice): its next identifiers start "
                     f"{resumed['next_ids'][:6]} instead of {run.order()[cursor:cursor + 6]}. A new world size is "
                     f"sound only if the remaining global order was repartitioned, and the identifiers say whether "
                     f"it was;")


@graded_check("verify_resume compares the next identifiers in order (the digest, not a set or the first few)")
def check_verify_resume_next_identifiers(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    cursor = run.cursor
    for i, j in ((12, 13), (WINDOW - 2, WINDOW - 1)):
        ids = run.order()[cursor:cursor + WINDOW]
        ids[i], ids[j] = ids[j], ids[i]
        _expect_rejected(verify_resume, run, run.manifest(), run.resumed(cursor, ids=ids),
                         "next_identifiers",
                         f"The resumed job's next {WINDOW} identifiers are the manifest's, with the identifiers "
                         f"{i + 1} and {j + 1} swapped: the same samples in another order, and the first 8 identical, "
                         f"so only the order-sensitive digest of the whole window tells them apart.")


@graded_check("verify_resume checks that one update advanced the cursor by exactly one global batch")
def check_verify_resume_one_update(verify_resume, seed: int = 0) -> None:
    run = _Run(seed)
    cursor = run.cursor
    for advance, why in ((2 * run.global_batch, "two global batches: the cursor also counted batches the loader had "
                                                "only prefetched"),
                         (run.micro * run.accum, "one rank's share of the update")):
        _expect_rejected(verify_resume, run, run.manifest(),
                         run.resumed(cursor, advance=advance), "one_update",
                         f"After one optimizer update the resumed job's committed cursor moved from {cursor} to "
                         f"{cursor + advance}, by {advance} ({why}); the manifest's global batch is "
                         f"{run.global_batch}.")


VERIFY_RESUME_CHECKS = ("check_verify_resume_accepts", "check_verify_resume_dataset_version",
                        "check_verify_resume_generation", "check_verify_resume_world_size",
                        "check_verify_resume_next_identifiers", "check_verify_resume_one_update")
