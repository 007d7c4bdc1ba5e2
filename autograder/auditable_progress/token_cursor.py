"""Checks for notebook 10's ``token_cursor(doc_lengths, batches, committed)``: judged by resuming the packing
loader (``token_streams``) at the cursor it returns and auditing the source-token positions of the committed
batches plus the resumed stream against the uninterrupted stream (notebook 06's per-position audit), for padded
packed blocks, concatenate-and-chunk blocks and batches built to a token budget, on streams that start at the
first document or where an earlier resume left them, with nothing committed yet or nothing fetched beyond the
commit.
"""

from __future__ import annotations

import numbers
import random

import torch

from ..checking import expect, failing_if_raised, graded_check
from ..data_ledger import reference_audit
from ..demos.token_streams import (budget_batches, chunked_batches, doc_starts, document_lengths, packed_batches,
                                   trained_spans, valid_tokens)


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
