"""The rows one commit appends: new chunk versions, and copies of rows given a new end.

A commit decides, document by document, where each change goes in its
document's history (:mod:`.versions`). Rows it creates are not in a segment yet
while it decides: they are *pending*, with row ids already given out, so a later
change of the same commit can still give one of them an end in valid time — in
place, since no reader can see this commit's epoch. At the end of the commit
:meth:`PendingRows.rows` turns them into one block for the growing segment.

Two kinds of pending rows:

- the chunks of a new version (``DocOp`` rows of the micro-batch), current or
  born with an end (a change older than a version already held);
- copies of rows that had an end and get an earlier one, because a late change
  fell inside their interval. The original rows are killed from this epoch on
  (see :mod:`.segment`); their copies carry the new end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.segment import NEVER, Rows

__all__ = ["PendingRows"]


@dataclass(slots=True)
class _Block:
    """The pending rows of one version: ``n`` row ids from ``rid0``."""

    rid0: int
    n: int
    valid_to: int  # NEVER: the version has no end (yet)
    doc: DocOp | None = None  # the batch document whose chunks these are
    copies: Rows | None = None  # or copies of rows already in segments


class PendingRows:
    """Rows given out during one commit and not yet written to a segment."""

    __slots__ = ("_blocks", "_by_rid", "batch", "epoch", "first_rid", "next_rid")

    def __init__(self, batch: CommitBatch, epoch: int, next_rid: int) -> None:
        self.batch = batch
        self.epoch = epoch
        self.first_rid = next_rid
        self.next_rid = next_rid
        self._blocks: list[_Block] = []
        self._by_rid: dict[int, _Block] = {}

    def __len__(self) -> int:
        return self.next_rid - self.first_rid

    def holds(self, rid: int) -> bool:
        """True for a row id this commit gave out."""
        return rid >= self.first_rid

    def add_version(self, doc: DocOp, valid_to: int) -> list[int]:
        """Row ids for the chunks of ``doc``, ending at ``valid_to`` (NEVER: current)."""
        return self._add(_Block(self.next_rid, doc.n_chunks, valid_to, doc=doc))

    def add_copies(self, rows: Rows, valid_to: int) -> list[int]:
        """Row ids for copies of ``rows`` that end at ``valid_to`` from this epoch on."""
        return self._add(_Block(self.next_rid, len(rows), valid_to, copies=rows))

    def _add(self, block: _Block) -> list[int]:
        self._blocks.append(block)
        self._by_rid[block.rid0] = block
        self.next_rid += block.n
        return list(range(block.rid0, block.rid0 + block.n))

    def end(self, rid0: int, valid_to: int) -> None:
        """Give the pending version whose first row is ``rid0`` an end (in place)."""
        self._by_rid[rid0].valid_to = valid_to

    def rows(self) -> Rows | None:
        """Every pending row as one block (new versions first, then copies)."""
        if not self._blocks:
            return None
        parts: list[Rows] = []
        # New versions in the batch's own chunk order (they were decided in version order).
        docs = sorted(
            (b for b in self._blocks if b.doc is not None),
            key=lambda b: b.doc.first_chunk if b.doc is not None else 0,
        )
        if docs:
            parts.append(self._version_rows(docs))
        for b in self._blocks:
            if b.copies is not None:
                parts.append(self._copy_rows(b))
        return Rows.concat(parts)

    def _version_rows(self, blocks: list[_Block]) -> Rows:
        batch = self.batch
        kept = [b.doc for b in blocks if b.doc is not None]
        counts = [d.n_chunks for d in kept]
        keep = [i for d in kept for i in range(d.first_chunk, d.first_chunk + d.n_chunks)]
        m = len(keep)
        single = m == len(kept)  # the common case: one chunk per document

        def per_chunk(values: list[Any]) -> list[Any]:
            if single:
                return values
            return [v for v, c in zip(values, counts, strict=True) for _ in range(c)]

        def repeat(values: list[int]) -> Any:
            arr = np.asarray(values, dtype=np.int64)
            return arr if single else np.repeat(arr, counts)

        idx = np.asarray(keep, dtype=np.int64)
        ends = [b.valid_to for b in blocks]
        valid_to = repeat(ends)
        sup = np.where(valid_to == NEVER, NEVER, self.epoch).astype(np.int64)
        rids = (
            np.asarray([b.rid0 for b in blocks], np.int64)
            if single
            else np.concatenate([np.arange(b.rid0, b.rid0 + b.n, dtype=np.int64) for b in blocks])
        )
        return Rows(
            vectors=np.ascontiguousarray(batch.vectors[idx], dtype=np.float32),
            rids=rids,
            chunk_ids=batch.chunk_ids[idx],
            positions=batch.positions[idx],
            valid_from=repeat([d.event_time for d in kept]),
            offsets=repeat([d.offset for d in kept]),
            created=np.full(m, self.epoch, dtype=np.int64),
            committed=np.full(m, self.epoch, dtype=np.int64),
            sup=sup,
            valid_to=valid_to,
            dead=np.full(m, NEVER, dtype=np.int64),
            tenants=per_chunk([d.tenant for d in kept]),
            doc_ids=per_chunk([d.doc_id for d in kept]),
            domains=per_chunk([d.domain for d in kept]),
            sources=per_chunk([d.source for d in kept]),
            embedders=batch.embedders(keep),
            texts=[batch.texts[i] for i in keep],
            hashes=[batch.hashes[i] for i in keep],
            metadata=per_chunk([dict(d.metadata) if d.metadata else None for d in kept]),
        )

    def _copy_rows(self, block: _Block) -> Rows:
        rows = block.copies
        assert rows is not None
        n = block.n
        rows.rids = np.arange(block.rid0, block.rid0 + n, dtype=np.int64)
        rows.created = np.full(n, self.epoch, dtype=np.int64)
        rows.sup = np.full(n, self.epoch, dtype=np.int64)
        rows.valid_to = np.full(n, block.valid_to, dtype=np.int64)
        rows.dead = np.full(n, NEVER, dtype=np.int64)
        return rows
