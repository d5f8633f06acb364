"""An epoch's leaves made per document are the bytes :func:`chunk_leaf` makes per chunk."""

from __future__ import annotations

import numpy as np

from streamrag.changes import Op
from streamrag.chunking import chunk_id, content_hash
from streamrag.index.base import CommitBatch, DocOp
from streamrag.runtime.audit import batch_leaves, chunk_leaf, tombstone_leaf


def _batch(*, per_chunk_embedders: bool) -> CommitBatch:
    docs = [
        DocOp("t", "a", Op.UPSERT, 5, 1, "src", "dom", 0, 2, {"z": 1, "a": [1, "x"]}),
        DocOp("t", "b", Op.DELETE, 6, 2, "src"),
        DocOp("u", "c", Op.UPSERT, 7, 3, "other", "", 2, 0),  # no chunks: a tombstone
        DocOp("u", "d", Op.UPSERT, 8, 4, "other", "d2", 2, 3, None),
    ]
    texts = ["alpha", "beta", "gamma ünïcode", "delta", "alpha"]
    keys = [("t", "a", 0), ("t", "a", 1), ("u", "d", 0), ("u", "d", 1), ("u", "d", 2)]
    rng = np.random.default_rng(3)
    return CommitBatch(
        docs=docs,
        chunk_ids=np.asarray([chunk_id(*k) for k in keys], np.int64),
        positions=np.asarray([k[2] for k in keys], np.int32),
        texts=texts,
        hashes=[content_hash(t) for t in texts],
        vectors=rng.standard_normal((5, 8)).astype(np.float32),
        embedder_version="e1",
        chunk_embedders=["e1", "e2", "e1", "e1", "e3"] if per_chunk_embedders else None,
    )


def _reference(batch: CommitBatch) -> tuple[list[bytes], list[bytes]]:
    chunks, tombs = [], []
    for d in batch.docs:
        if d.op == Op.DELETE or d.n_chunks == 0:
            tombs.append(tombstone_leaf(d.tenant, d.doc_id, d.event_time, d.offset))
            continue
        rows = range(d.first_chunk, d.first_chunk + d.n_chunks)
        for r, made_by in zip(rows, batch.embedders(rows), strict=True):
            chunks.append(
                chunk_leaf(
                    *(d.tenant, d.doc_id, d.event_time, d.offset, d.source, d.domain),
                    d.metadata,
                    *(int(batch.positions[r]), int(batch.chunk_ids[r]), made_by),
                    batch.texts[r],
                    batch.vectors[r],
                )
            )
    return chunks, tombs


def test_batch_leaves_are_the_chunk_leaves() -> None:
    for per_chunk in (False, True):
        batch = _batch(per_chunk_embedders=per_chunk)
        assert batch_leaves(batch) == _reference(batch)


def test_a_batch_without_hashes_hashes_its_texts() -> None:
    batch = _batch(per_chunk_embedders=False)
    expected = _reference(batch)
    batch.hashes.clear()
    assert batch_leaves(batch) == expected


def test_leaves_of_a_batch_of_tombstones_only() -> None:
    batch = CommitBatch(
        docs=[DocOp("t", "b", Op.DELETE, 6, 2, "src")],
        chunk_ids=np.zeros(0, np.int64),
        positions=np.zeros(0, np.int32),
        texts=[],
        hashes=[],
        vectors=np.zeros((0, 8), np.float32),
    )
    assert batch_leaves(batch) == ([], [tombstone_leaf("t", "b", 6, 2)])
