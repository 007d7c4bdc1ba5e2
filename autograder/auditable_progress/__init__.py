"""Checks for notebook 10: progress you can audit beyond fixed samples.

``token_cursor`` is judged by resuming the packing loader (``token_streams``) at the cursor it returns
and auditing the source-token positions of the committed batches plus the resumed stream against the
uninterrupted stream (notebook 06's per-position audit), for padded packed blocks, concatenate-and-chunk
blocks and batches built to a token budget, on streams that start at the first document or where an
earlier resume left them, with nothing committed yet or nothing fetched beyond the commit. ``resume_plan``
is judged by reading, for every new owner (rank x worker), the records its plan names, and counting every
record of every partition. ``verify_resume`` gets manifests, checkpoints and resumed jobs built here, each
wrong in one way (or in none), as plain dicts that carry numbers and strings, never the name of the
scenario. ``judge_deviation`` gets audit reports per stratum, every one over the same strata. Everything the
learner's code gets is data, so no probe is needed; what it is handed must come back unchanged.
"""

from __future__ import annotations

import copy
import numbers
import random

import torch

from .checking import expect, failing_if_raised, first_difference, graded_check
from .data_ledger import reference_audit
from .distributed_sampler import interleave, sampler_shards
from .demos.token_streams import (budget_batches, chunked_batches, doc_starts, document_lengths, packed_batches,
                            trained_spans, valid_tokens, window_digest)

# ---- token_cursor -------------------------------------------------------------------------------------


def _rebuilt(lengths, rebuild, start):
    """The batches a loader of this kind yields from ``start`` = (doc, offset)."""
    if rebuild[0] == "packed":
        return packed_batches(lengths, rebuild[1], rebuild[2], start=start)
    if rebuild[0] == "chunked":
        return chunked_batches(lengths, rebuild[1], rebuild[2], start=start)
    return budget_batches(lengths, rebuild[1], start=start)


def _token_scenarios(seed: int):
    """(what, doc_lengths, the batches of the run, how a resume rebuilds them, fetched, committed): padded
    packed blocks, concatenate-and-chunk blocks and batches built to a token budget; a stream that was itself
    resumed once (it does not start at the first document); nothing committed yet; nothing fetched beyond the
    commit; documents with no tokens at all."""
    rng = random.Random(seed)
    out = []

    def add(what, lengths, rebuild, start=(0, 0), committed=None, ahead=None):
        batches = _rebuilt(lengths, rebuild, start)
        committed = rng.randint(2, len(batches) - 4) if committed is None else committed
        fetched = committed + (rng.randint(1, 3) if ahead is None else ahead)   # fetched, never committed
        if start != (0, 0):
            what += f", the stream started at doc {start[0]}, token {start[1]} (the job was resumed once before)"
        out.append((what, lengths, batches, rebuild, fetched, committed))

    for i, (block_len, batch_size) in enumerate(((16, 4), (32, 2), (24, 3))):
        lengths = document_lengths(40, seed=seed * 10 + i, shortest=3, longest=2 * block_len)
        add(f"blocks of {block_len} tokens, {batch_size} per batch", lengths, ("packed", block_len, batch_size))
    for i, budget in enumerate((64, 96)):
        lengths = document_lengths(40, seed=seed * 10 + 5 + i, shortest=3, longest=budget // 2)
        add(f"batches built to a budget of {budget} tokens", lengths, ("budget", budget))
    lengths = document_lengths(40, seed=seed * 10 + 7, shortest=3, longest=40)
    add("documents joined end to end and cut into blocks of 16 tokens, 4 per batch", lengths, ("chunked", 16, 4))
    lengths = document_lengths(50, seed=seed * 10 + 8, shortest=3, longest=32)
    doc = rng.randint(5, 15)
    resumed_at = (doc, rng.randint(1, lengths[doc] - 1))
    add("blocks of 16 tokens, 4 per batch", lengths, ("packed", 16, 4), start=resumed_at)
    add("blocks of 16 tokens, 4 per batch, nothing committed yet", lengths, ("packed", 16, 4), start=resumed_at,
        committed=0)
    add("batches built to a budget of 64 tokens, nothing committed yet", lengths, ("budget", 64), committed=0)
    add("blocks of 24 tokens, 3 per batch, nothing fetched beyond the commit", lengths, ("packed", 24, 3), ahead=0)
    lengths = document_lengths(40, seed=seed * 10 + 9, shortest=3, longest=30)
    for d in rng.sample(range(3, 37), 6):
        lengths[d] = 0                                  # empty documents: spans (d, 0, 0) in padded blocks
    add("blocks of 16 tokens, 4 per batch, some documents empty", lengths, ("packed", 16, 4))
    return out


def _call_cursor(token_cursor, lengths, batches, fetched, committed) -> dict:
    given = list(batches[:fetched])
    with failing_if_raised(f"token_cursor(doc_lengths, batches, committed={committed})"):
        got = token_cursor(list(lengths), given, committed)
    expect(isinstance(got, dict) and {"doc", "offset", "tokens"} <= set(got),
           f"token_cursor should return a dict with keys 'doc', 'offset' and 'tokens', not {got!r:.120}.")
    cursor = {}
    for key in ("doc", "offset", "tokens"):
        value = got[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = value.item()     # an integer tensor or a NumPy integer is a count too
        expect(isinstance(value, numbers.Integral) and not isinstance(value, bool),
               f"token_cursor(...)[{key!r}] should be an integer, not {type(value).__name__} {value!r:.40}.")
        cursor[key] = int(value)
    return cursor


def _story(what, batches, fetched, committed) -> str:
    return (f"({what}: the loader had fetched {fetched} batches, the optimizer had committed the first "
            f"{committed})")


def _walk(lengths, tokens: int) -> tuple[int, int]:
    """(doc, offset) of the token ``tokens`` source tokens after the start of the first document."""
    for doc, length in enumerate(lengths):
        if tokens < length:
            return doc, tokens
        tokens -= length
    return len(lengths), 0


@graded_check("token_cursor resumes the packed stream exactly: no token replayed, none skipped")
def check_token_cursor_resume(token_cursor, seed: int = 0) -> None:
    for what, lengths, batches, rebuild, fetched, committed in _token_scenarios(seed):
        got = _call_cursor(token_cursor, lengths, batches, fetched, committed)
        doc, offset = got["doc"], got["offset"]
        expect(0 <= doc <= len(lengths) and 0 <= offset <= (lengths[doc] if doc < len(lengths) else 0),
               f"token_cursor returned doc={doc}, offset={offset} {_story(what, batches, fetched, committed)}, "
               f"but there are {len(lengths)} documents" + (f" and document {doc} has {lengths[doc]} tokens"
                                                             if 0 <= doc < len(lengths) else "") + ".")
        first = batches[0]["spans"][0][0]
        earlier = [range(0, doc_starts(lengths)[first[0]] + first[1])]     # what the job before this one committed
        before = earlier + trained_spans(lengths, batches[:committed])
        after = trained_spans(lengths, _rebuilt(lengths, rebuild, (doc, offset)))
        found = reference_audit(expected=[range(0, sum(lengths))], trained=before + after)
        replayed, omitted = sum(map(len, found["replayed"])), sum(map(len, found["omitted"]))
        if not replayed and not omitted:
            continue
        rows = sum(len(b["spans"]) for b in batches[:committed])
        fetched_end = batches[fetched - 1]["spans"][-1][-1]
        if committed == 0:
            where = (f"Nothing was committed yet: the next token to train is where this stream started, the first "
                     f"fetched batch's first span (document {first[0]}, token {first[1]}). ")
        else:
            last = batches[committed - 1]["spans"][-1][-1]
            where = f"The last committed row ends with tokens {last[1]}..{last[2] - 1} of document {last[0]}. "
        if committed and doc == rows and offset == 0:
            hint = (f"The committed batches hold {rows} rows, but a row is not a document: count where the "
                    f"source documents are, not how many rows went by. ")
        elif fetched > committed and (doc, offset) in ((fetched_end[0], fetched_end[2]), (fetched_end[0] + 1, 0)):
            hint = (f"That is where the {fetched} fetched batches end, {fetched - committed} of which no optimizer "
                    f"step committed. ")
        elif first[:2] != (0, 0) and (doc, offset) == _walk(lengths, valid_tokens(batches[:committed])):
            hint = ("That is as many tokens after the first document's start as the committed batches hold, but this "
                    "stream did not start there: the spans say where the batches come from, a count from the start "
                    "of the data does not. ")
        else:
            hint = ""
        raise AssertionError(
            f"Resuming the loader at doc={doc}, offset={offset} {_story(what, batches, fetched, committed)} "
            f"trains {replayed} source tokens twice and never trains {omitted}. {where}{hint}The cursor is the "
            f"source position of the next token to train, at the optimizer commit: where do the spans of the "
            f"committed batches end?")


@graded_check("token_cursor counts the valid tokens committed, not padding and not prefetched batches")
def check_token_cursor_tokens(token_cursor, seed: int = 0) -> None:
    for what, lengths, batches, rebuild, fetched, committed in _token_scenarios(seed):
        got = _call_cursor(token_cursor, lengths, batches, fetched, committed)["tokens"]
        want = valid_tokens(batches[:committed])
        if got == want:
            continue
        slots = sum(b["tokens"].numel() for b in batches[:committed])
        cause = (f"that is every token slot of the committed batches ({slots}), padding included. "
                 if got == slots else
                 f"that counts the {fetched - committed} fetched batches no optimizer step committed. "
                 if got == valid_tokens(batches[:fetched]) else "")
        raise AssertionError(
            f"token_cursor(...)['tokens'] is {got} {_story(what, batches, fetched, committed)}, but the committed "
            f"batches hold {want} valid tokens; {cause}A token budget or a learning-rate schedule in tokens needs "
            f"the count of real tokens the weights have seen.")


TOKEN_CURSOR_CHECKS = ("check_token_cursor_resume", "check_token_cursor_tokens")


# ---- resume_plan ----------------------------------------------------------------------------------------

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


# ---- verify_resume --------------------------------------------------------------------------------------

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
        raise AssertionError(f"report['failed'] should be a list of step names, not {report['failed']!r:.80}.") from None
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
    for what, resumed in (("a resume on the same 4 ranks", run.resumed(cursor)),
                          ("a resume on 2 ranks that rebuilt the remaining global order and dealt it anew (same "
                           "global batch, twice the accumulation steps)", run.resumed(cursor, world=2))):
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


# ---- judge_deviation ------------------------------------------------------------------------------------

STRATA = ("web", "code", "curated")   # every report has the same strata: their names say nothing of the case


def _report(unit: str, global_batch: int, strata: dict) -> dict:
    return {"unit": unit, "global_batch": global_batch,
            "strata": {name: {"expected": e, "replayed": r, "recomputed": c, "omitted": o, "explained": x}
                       for name, (e, r, c, o, x) in strata.items()}}


def _judge(judge_deviation, report, inputs_judged: bool = False) -> dict:
    given = copy.deepcopy(report)
    with failing_if_raised("judge_deviation(report)"):
        verdict = judge_deviation(given)
    if inputs_judged and given != report:
        name = next((n for n in report["strata"] if given.get("strata", {}).get(n) != report["strata"][n]), None)
        raise AssertionError(
            f"judge_deviation changed the report it was judging"
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


def _sound_reports(seed: int) -> list[dict]:
    rng = random.Random(seed)
    reports = []
    for _ in range(2):
        unit, batch = _unit_and_batch(rng)
        split = rng.randint(batch // 4, 3 * batch // 4)
        tail = rng.randint(1, 7)                           # a drop_last tail the policy explains
        reports.append(_report(unit, batch, {"web": (100_000 * batch, 0, split, tail, tail),
                                             "code": (10_000 * batch, 0, batch - split, 0, 0),
                                             "curated": (2 * batch, 0, 0, 0, 0)}))
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
    rng = random.Random(seed)
    unit, batch = _unit_and_batch(rng)
    replayed, small = rng.randint(8, 40), 2 * batch
    report = _report(unit, batch, {"web": (100_000 * batch, 0, batch // 2, 0, 0), "code": (10_000 * batch, 0, 0, 0, 0),
                                   "curated": (small, replayed, 0, 0, 0)})
    verdict = _judge(judge_deviation, report)
    total = sum(s["expected"] for s in report["strata"].values())
    expect(not verdict["ok"],
           f"judge_deviation accepted an audit in which the small high-weight stratum 'curated' trained {replayed} "
           f"committed {unit} again ({_strata_text(report)}): {replayed / small:.1%} of that stratum, "
           f"{replayed / total:.4%} of the run. The rule allows zero replay of committed positions, and it "
           f"holds per stratum: a rate over the whole run hides a small stratum.")


@graded_check("judge_deviation rejects omissions that the documented policy does not explain")
def check_judge_deviation_omission(judge_deviation, seed: int = 0) -> None:
    rng = random.Random(seed)
    unit, batch = _unit_and_batch(rng)
    omitted, explained = rng.randint(2, min(30, batch - 8)), rng.randint(1, 7)
    report = _report(unit, batch, {"web": (100_000 * batch, 0, 0, omitted + explained, explained),
                                   "code": (10_000 * batch, 0, 0, 0, 0), "curated": (2 * batch, 0, 0, 0, 0)})
    verdict = _judge(judge_deviation, report)
    expect(not verdict["ok"],
           f"judge_deviation accepted an audit with {omitted} unexplained omissions ({_strata_text(report)}): a gap "
           f"larger than the padding policy explains ({explained}). The rule allows zero unexplained omissions: "
           f"only what the documented policy explains may be left out. (The allowance of one global batch, "
           f"{batch:,} {unit}, is for uncommitted work recomputed after the restart, which is trained again; omitted "
           f"positions are never trained.)")


@graded_check("judge_deviation allows at most one uncommitted global batch recomputed, summed over strata")
def check_judge_deviation_recompute(judge_deviation, seed: int = 0) -> None:
    rng = random.Random(seed)
    unit, batch = _unit_and_batch(rng)
    for recomputed in ((batch, batch // 2, 0), (batch // 2 + 1, batch // 4, batch // 4)):
        report = _report(unit, batch, {"web": (100_000 * batch, 0, recomputed[0], 0, 0),
                                       "code": (10_000 * batch, 0, recomputed[1], 0, 0),
                                       "curated": (2 * batch, 0, recomputed[2], 0, 0)})
        verdict = _judge(judge_deviation, report)
        expect(not verdict["ok"],
               f"judge_deviation accepted {sum(recomputed):,} recomputed {report['unit']} after a crash "
               f"({_strata_text(report)}), but one global batch is {batch:,}: the bound is one uncommitted global "
               f"batch for the whole run, whichever strata it falls in.")


@graded_check("judge_deviation measures duplicate and omission rates per stratum")
def check_judge_deviation_rates(judge_deviation, seed: int = 0) -> None:
    rng = random.Random(seed)
    unit, batch = _unit_and_batch(rng)
    strata = {"web": (100_000 * batch, rng.randint(1, 50), batch // 3, rng.randint(10, 90), 5),
              "code": (10_000 * batch, 0, batch // 3, 0, 0),
              "curated": (2 * batch, rng.randint(1, 20), batch // 4, 0, 0)}
    report = _report(unit, batch, strata)
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


JUDGE_DEVIATION_CHECKS = ("check_judge_deviation_accepts", "check_judge_deviation_replay",
                          "check_judge_deviation_omission", "check_judge_deviation_recompute",
                          "check_judge_deviation_rates")
