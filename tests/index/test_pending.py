"""Pending rows of one commit: row ids, ends given in place, and the batch's chunk order."""

from __future__ import annotations

import numpy as np

from streamrag.changes import Op
from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.pending import PendingRows
from streamrag.index.segment import NEVER

DIM = 2


def _batch() -> tuple[CommitBatch, list[DocOp]]:
    docs = [
        DocOp("t", "a", Op.UPSERT, 10, 1, "in", "da", 0, 2),
        DocOp("t", "b", Op.UPSERT, 20, 2, "in", "db", 2, 1),
        DocOp("t", "c", Op.UPSERT, 30, 3, "in", "dc", 3, 3),
    ]
    n = 6
    batch = CommitBatch(
        docs=docs,
        chunk_ids=np.arange(1000, 1000 + n, dtype=np.int64),
        positions=np.asarray([0, 1, 0, 0, 1, 2], dtype=np.int32),
        texts=[f"text {i}" for i in range(n)],
        hashes=[bytes([i]) * 16 for i in range(n)],
        vectors=np.arange(n * DIM, dtype=np.float32).reshape(n, DIM),
    )
    return batch, docs


def test_versions_decided_out_of_order_come_out_in_the_batchs_chunk_order() -> None:
    batch, (a, b, c) = _batch()
    pending = PendingRows(batch, epoch=7, next_rid=100)
    assert pending.add_version(c, NEVER) == [100, 101, 102]
    assert pending.add_version(a, NEVER) == [103, 104]
    assert pending.add_version(b, 99) == [105]
    pending.end(103, 50)  # a later change of the same commit ends a's version
    assert len(pending) == 6
    assert pending.holds(100)
    assert not pending.holds(99)
    rows = pending.rows()
    assert rows is not None
    assert rows.rids.tolist() == [103, 104, 105, 100, 101, 102]
    assert rows.chunk_ids.tolist() == list(range(1000, 1006))
    assert rows.doc_ids == ["a", "a", "b", "c", "c", "c"]
    assert rows.domains == ["da", "da", "db", "dc", "dc", "dc"]
    assert rows.valid_from.tolist() == [10, 10, 20, 30, 30, 30]
    assert rows.valid_to.tolist() == [50, 50, 99, NEVER, NEVER, NEVER]
    assert rows.sup.tolist() == [7, 7, 7, NEVER, NEVER, NEVER]  # stamped: born with an end
    assert rows.texts == batch.texts
    assert np.array_equal(rows.vectors, batch.vectors)


def test_copies_follow_the_versions_and_take_their_end_in_place() -> None:
    batch, (a, b, _) = _batch()
    first = PendingRows(batch, epoch=1, next_rid=0)
    first.add_version(a, NEVER)
    held = first.rows()
    assert held is not None
    pending = PendingRows(batch, epoch=2, next_rid=10)
    pending.add_version(b, NEVER)
    assert pending.add_copies(held, 40) == [11, 12]
    pending.end(11, 30)  # an end given again within the commit: the copy block's
    rows = pending.rows()
    assert rows is not None
    assert rows.rids.tolist() == [10, 11, 12]
    assert rows.doc_ids == ["b", "a", "a"]
    assert rows.valid_to.tolist() == [NEVER, 30, 30]
    assert rows.created.tolist() == [2, 2, 2]
    assert rows.sup.tolist() == [NEVER, 2, 2]


def test_nothing_pending_is_no_rows() -> None:
    batch, _ = _batch()
    assert PendingRows(batch, epoch=1, next_rid=0).rows() is None
