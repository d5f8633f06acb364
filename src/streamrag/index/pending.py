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

from typing import Any

import numpy as np

from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.segment import NEVER, Rows

__all__ = ["PendingRows"]


class PendingRows:
    """Rows given out during one commit and not yet written to a segment.

    Kept as columns, one entry per pending version (its document, first row id
    and end), and a short list of copy blocks: a commit adds one version per
    document it changes, so no object is made per version beyond its row ids.
    """

    __slots__ = (
        "_by_rid",
        "_copies",
        "_ends",
        "_rid0s",
        "_versions",
        "batch",
        "epoch",
        "first_rid",
        "next_rid",
    )

    def __init__(self, batch: CommitBatch, epoch: int, next_rid: int) -> None:
        self.batch = batch
        self.epoch = epoch
        self.first_rid = next_rid
        self.next_rid = next_rid
        self._versions: list[DocOp] = []  # the batch document of each pending version
        self._rid0s: list[int] = []  # its first row id
        self._ends: list[int] = []  # its end in valid time (NEVER: none yet)
        self._copies: list[tuple[int, Rows, list[int]]] = []  # rid0, rows, [valid_to]
        self._by_rid: dict[int, int] = {}
        """First row id -> ``k`` for the ``k``-th version, ``~k`` for the ``k``-th copy block."""

    def __len__(self) -> int:
        return self.next_rid - self.first_rid

    def holds(self, rid: int) -> bool:
        """True for a row id this commit gave out."""
        return rid >= self.first_rid

    def add_version(self, doc: DocOp, valid_to: int) -> list[int]:
        """Row ids for the chunks of ``doc``, ending at ``valid_to`` (NEVER: current)."""
        rid0 = self.next_rid
        self._by_rid[rid0] = len(self._versions)
        self._versions.append(doc)
        self._rid0s.append(rid0)
        self._ends.append(valid_to)
        self.next_rid = rid0 + doc.n_chunks
        return list(range(rid0, self.next_rid))

    def add_copies(self, rows: Rows, valid_to: int) -> list[int]:
        """Row ids for copies of ``rows`` that end at ``valid_to`` from this epoch on."""
        rid0 = self.next_rid
        self._by_rid[rid0] = ~len(self._copies)
        self._copies.append((rid0, rows, [valid_to]))
        self.next_rid = rid0 + len(rows)
        return list(range(rid0, self.next_rid))

    def end(self, rid0: int, valid_to: int) -> None:
        """Give the pending version whose first row is ``rid0`` an end (in place)."""
        k = self._by_rid[rid0]
        if k >= 0:
            self._ends[k] = valid_to
        else:
            self._copies[~k][2][0] = valid_to

    def rows(self) -> Rows | None:
        """Every pending row as one block (new versions first, then copies)."""
        if not self._versions and not self._copies:
            return None
        parts: list[Rows] = []
        if self._versions:
            parts.append(self._version_rows())
        for rid0, rows, valid_to in self._copies:
            parts.append(self._copy_rows(rid0, rows, valid_to[0]))
        return Rows.concat(parts)

    def _version_rows(self) -> Rows:
        """The new versions' rows, in the batch's own chunk order.

        (They were decided in version order; each one's chunks are a run of
        the batch's rows from its ``first_chunk``.)
        """
        batch = self.batch
        versions = self._versions
        order = sorted(range(len(versions)), key=[d.first_chunk for d in versions].__getitem__)
        kept = [versions[k] for k in order]
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
        ends = self._ends
        valid_to = repeat([ends[k] for k in order])
        sup = np.where(valid_to == NEVER, NEVER, self.epoch).astype(np.int64)
        rid0s = np.asarray(self._rid0s, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
        if single:
            rids = rid0s
        else:  # each version's rows run from its first row id
            starts = np.repeat(rid0s, counts)
            within = np.arange(m, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
            rids = starts + within
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

    def _copy_rows(self, rid0: int, rows: Rows, valid_to: int) -> Rows:
        n = len(rows)
        rows.rids = np.arange(rid0, rid0 + n, dtype=np.int64)
        rows.created = np.full(n, self.epoch, dtype=np.int64)
        rows.sup = np.full(n, self.epoch, dtype=np.int64)
        rows.valid_to = np.full(n, valid_to, dtype=np.int64)
        rows.dead = np.full(n, NEVER, dtype=np.int64)
        return rows
