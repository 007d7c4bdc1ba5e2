"""Token streams and sharded streams for notebook 10: the pieces its demos and its checks share.

* ``pack_blocks`` / ``PackedStream``: documents of different lengths packed into fixed-length token
  blocks. A document that does not fit in what is left of a block starts a new one (the rest of the
  block is padding); a document longer than a block is split over several. Every block says which
  stretches of which documents it holds (``spans``: ``(doc, start, stop)``, half-open).
* ``chunked_batches``: concatenate-and-chunk packing: documents end to end, cut every ``block_len``
  tokens, so a block may hold the end of one document and the start of the next and only the last
  block is padded. There a token slot is a source token.
* ``budget_batches``: batches built to a token budget, one document per row, padded to the longest
  row: the number of rows changes from batch to batch.
* ``ShardedStream``: an ``IterableDataset`` over partitions of records ``(partition, offset)``, with
  explicit ownership per rank and DataLoader worker, resumable from a ``{partition: offset}`` ledger;
  ``state_dict`` / ``load_state_dict`` make it work with torchdata's ``StatefulDataLoader``.
* ``window_digest``: notebook 06's order-sensitive digest of identifiers.

Token ``t`` of document ``d`` has the id ``token_id(d, t)`` (never 0, the padding id), so a block read
back tells which source tokens it holds.
"""

from __future__ import annotations

import hashlib
import random

import torch
from torch.utils.data import IterableDataset, get_worker_info

PAD = 0
VOCAB = 50_000


def token_id(doc: int, offset: int) -> int:
    return 1 + (doc * 7_919 + offset * 31) % (VOCAB - 1)


def document_lengths(n_docs: int, seed: int = 0, shortest: int = 3, longest: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(shortest, longest) for _ in range(n_docs)]


def _normalised(doc_lengths, doc: int, offset: int) -> tuple[int, int]:
    """(doc, offset) moved past documents that are already fully read (offset == length)."""
    while doc < len(doc_lengths) and offset >= doc_lengths[doc]:
        doc, offset = doc + 1, 0
    return doc, offset


# ---- packing into fixed-length blocks -----------------------------------------------------------

def pack_spans(doc_lengths, block_len: int, start=(0, 0)):
    """The spans of each block, in stream order, packing from ``start`` = (doc, offset)."""
    doc, offset = _normalised(doc_lengths, *start)
    block, space = [], block_len
    while doc < len(doc_lengths):
        left = doc_lengths[doc] - offset
        if left <= space:
            block.append((doc, offset, offset + left))
            space -= left
            doc, offset = doc + 1, 0
        elif space == block_len:                      # a document longer than a block: split it
            block.append((doc, offset, offset + block_len))
            offset += block_len
            space = 0
        else:                                         # does not fit in what is left: pad, new block
            space = 0
        if space == 0:
            yield block
            block, space = [], block_len
    if block:
        yield block


def block_tensors(spans, block_len: int) -> dict:
    tokens = torch.full((block_len,), PAD, dtype=torch.int64)
    at = 0
    for doc, a, b in spans:
        tokens[at:at + b - a] = torch.tensor([token_id(doc, t) for t in range(a, b)], dtype=torch.int64)
        at += b - a
    valid = torch.zeros(block_len, dtype=torch.bool)
    valid[:at] = True
    return {"tokens": tokens, "valid": valid, "spans": [tuple(s) for s in spans]}


def pack_blocks(doc_lengths, block_len: int, start=(0, 0)):
    """Packed blocks as dicts: ``tokens`` (int64, padding 0), ``valid`` (bool), ``spans``."""
    for spans in pack_spans(doc_lengths, block_len, start):
        yield block_tensors(spans, block_len)


class PackedStream(IterableDataset):
    """The packed blocks of a list of documents, from a (doc, offset) cursor."""

    def __init__(self, doc_lengths, block_len: int, start=(0, 0)):
        self.doc_lengths, self.block_len, self.start = list(doc_lengths), block_len, tuple(start)

    def __iter__(self):
        return pack_blocks(self.doc_lengths, self.block_len, self.start)


def collate_blocks(rows: list[dict]) -> dict:
    """A batch of blocks (or rows): tensors stacked, spans kept as one list per row."""
    return {"tokens": torch.stack([r["tokens"] for r in rows]), "valid": torch.stack([r["valid"] for r in rows]),
            "spans": [list(r["spans"]) for r in rows]}


def packed_batches(doc_lengths, block_len: int, batch_size: int, start=(0, 0)) -> list[dict]:
    """What ``DataLoader(PackedStream(...), batch_size, collate_fn=collate_blocks)`` yields, without a loader."""
    batches, rows = [], []
    for block in pack_blocks(doc_lengths, block_len, start):
        rows.append(block)
        if len(rows) == batch_size:
            batches.append(collate_blocks(rows))
            rows = []
    if rows:
        batches.append(collate_blocks(rows))
    return batches


def chunk_spans(doc_lengths, block_len: int, start=(0, 0)):
    """Concatenate-and-chunk: the spans of each full block of ``block_len`` source tokens, from ``start``."""
    doc, offset = _normalised(doc_lengths, *start)
    block, space = [], block_len
    while doc < len(doc_lengths):
        take = min(space, doc_lengths[doc] - offset)
        block.append((doc, offset, offset + take))
        space -= take
        doc, offset = _normalised(doc_lengths, doc, offset + take)
        if space == 0:
            yield block
            block, space = [], block_len
    if block:
        yield block


def chunked_batches(doc_lengths, block_len: int, batch_size: int, start=(0, 0)) -> list[dict]:
    """Batches of concatenate-and-chunk blocks (see chunk_spans), as packed_batches makes padded ones."""
    blocks = [block_tensors(spans, block_len) for spans in chunk_spans(doc_lengths, block_len, start)]
    return [collate_blocks(blocks[i:i + batch_size]) for i in range(0, len(blocks), batch_size)]


# ---- batches built to a token budget -------------------------------------------------------------

def budget_batches(doc_lengths, token_budget: int, start=(0, 0)) -> list[dict]:
    """One document (its rest, from the cursor) per row; rows are added while rows x longest row stays
    within ``token_budget``. A document longer than the budget is cut into budget-sized rows."""
    doc, offset = _normalised(doc_lengths, *start)
    batches, rows = [], []

    def close():
        longest = max(b - a for _, a, b in rows)
        batches.append(collate_blocks([block_tensors([span], longest) for span in rows]))
        rows.clear()

    while doc < len(doc_lengths):
        stop = min(doc_lengths[doc], offset + token_budget)
        span = (doc, offset, stop)
        longest = max([b - a for _, a, b in rows] + [stop - offset])
        if rows and (len(rows) + 1) * longest > token_budget:
            close()
        rows.append(span)
        doc, offset = _normalised(doc_lengths, doc, stop)
    if rows:
        close()
    return batches


# ---- reading batches back --------------------------------------------------------------------------

def doc_starts(doc_lengths) -> list[int]:
    starts, total = [], 0
    for n in doc_lengths:
        starts.append(total)
        total += n
    return starts


def trained_spans(doc_lengths, batches) -> list[range]:
    """The source-token positions (index in the concatenated documents) the batches hold, as spans."""
    starts = doc_starts(doc_lengths)
    return [range(starts[d] + a, starts[d] + b) for batch in batches for row in batch["spans"] for d, a, b in row]


def valid_tokens(batches) -> int:
    return sum(int(batch["valid"].sum()) for batch in batches)


# ---- sharded streams ---------------------------------------------------------------------------------

def default_owner(partition: int, owners: int) -> int:
    return partition % owners


class ShardedStream(IterableDataset):
    """Records ``(partition, offset)`` of ``len(partition_lengths)`` partitions.

    ``plan`` is the explicit ownership: ``plan[owner]`` the (partition, first offset) pairs that owner
    reads, with owner = rank x num_workers + worker. Without a plan each owner reads the partitions
    ``p % owners == owner`` from their start. ``sharded=False`` reproduces a stream that never looks at
    ``get_worker_info()``: every worker reads everything. ``state_dict`` is the offsets this copy of the
    dataset has handed out (per worker, under a DataLoader), every partition it owns listed from its first
    iteration on (one it has not started yet at its first offset)."""

    def __init__(self, partition_lengths, rank: int = 0, world_size: int = 1, plan=None, sharded: bool = True):
        self.partition_lengths = list(partition_lengths)
        self.rank, self.world_size, self.plan, self.sharded = rank, world_size, plan, sharded
        self.offsets: dict[int, int] = {}

    def owned(self, worker: int, num_workers: int) -> list[tuple[int, int]]:
        if not self.sharded:
            return [(p, 0) for p in range(len(self.partition_lengths))]
        owner, owners = self.rank * num_workers + worker, self.world_size * num_workers
        if self.plan is not None:
            return [(int(p), int(o)) for p, o in self.plan[owner]]
        return [(p, 0) for p in range(len(self.partition_lengths)) if default_owner(p, owners) == owner]

    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        owned = self.owned(worker, num_workers)
        for partition, first in owned:          # the state lists every partition owned, started or not
            self.offsets.setdefault(partition, first)
        for partition, _ in owned:
            start = self.offsets[partition]
            for offset in range(start, self.partition_lengths[partition]):
                self.offsets[partition] = offset + 1
                yield (partition, offset)

    def state_dict(self) -> dict:
        return {"offsets": dict(self.offsets)}

    def load_state_dict(self, state: dict) -> None:
        self.offsets = dict(state["offsets"])


# ---- digest ----------------------------------------------------------------------------------------

def window_digest(*, ids) -> str:
    """An order-sensitive digest of a window of integer identifiers, as notebook 10's manifest records it
    (window_digest(ids=...)): named, so it is no answer to notebook 06's exercise of the same name (issue 27)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()
