"""The commit plan: one index lookup per document, and the counts it feeds."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from streamrag.batching import PendingBatch
from streamrag.changes import Change, ChangeBatch, Op
from streamrag.chunking import content_hash
from streamrag.index import CommitBatch, LsmIndex, LsmSpec
from streamrag.index.base import CommitResult, DocOp, DocState
from streamrag.runtime.commit import past_versions, plan
from streamrag.runtime.epochs import EpochLog, NewVersion
from streamrag.runtime.stages import Prepared

DIM = 4


def _index() -> LsmIndex:
    index = LsmIndex(DIM, LsmSpec(), background=False)
    text = "held text"
    index.commit(
        CommitBatch(
            docs=[DocOp("t", "a", Op.UPSERT, 30, 3, "in", "", 0, 1)],
            chunk_ids=np.zeros(1, np.int64),
            positions=np.zeros(1, np.int32),
            texts=[text],
            hashes=[content_hash(text)],
            vectors=np.ones((1, DIM), np.float32),
        )
    )
    return index


def _pending(changes: list[Change]) -> PendingBatch:
    prepared: list[Any] = []
    for c in changes:
        if c.op == Op.DELETE:
            prepared.append(None)
        else:
            text = str(c.payload["text"])
            prepared.append(Prepared((text,), (content_hash(text),), 2))
    return PendingBatch(ChangeBatch.from_changes(changes), 0, prepared)


def _upsert(doc: str, t: int, offset: int, text: str) -> Change:
    return Change("t", doc, Op.UPSERT, t, {"text": text, "domain": "d"}, "in", offset)


class _Counting:
    """An index that counts ``doc_state`` calls."""

    def __init__(self, index: LsmIndex) -> None:
        self.index = index
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    def doc_state(self, tenant: str, doc_id: str) -> DocState | None:
        self.calls.append((tenant, doc_id))
        return self.index.doc_state(tenant, doc_id)


def test_the_plan_asks_for_each_documents_state_once() -> None:
    index = _Counting(_index())
    pending = _pending(
        [
            _upsert("a", 40, 4, "held text"),  # same text as held: its vector is reused
            _upsert("a", 20, 5, "late"),  # older than the held version: a past version
            _upsert("b", 10, 6, "new"),
            Change("t", "b", Op.DELETE, 50, {}, "in", 7),
        ]
    )
    p = plan(pending, index, history=True)  # type: ignore[arg-type]
    assert sorted(index.calls) == [("t", "a"), ("t", "b")]
    assert p.held == {("t", "a"): (30, 3), ("t", "b"): None}
    assert [d.doc_id for d in p.docs] == ["a", "a", "b", "b"]
    assert p.reuse == [0]
    assert p.embed == [1, 2]
    assert [d.first_chunk for d in p.docs if d.op == Op.UPSERT] == [0, 1, 2]
    assert p.docs[0].domain == "d"
    assert p.docs[0].n_chunks == 1


def test_past_versions_from_the_held_versions_matches_asking_the_index() -> None:
    index = _index()
    docs = [
        DocOp("t", "a", Op.UPSERT, 20, 5, "in", "", 0, 1),  # older than the held (30, 3)
        DocOp("t", "a", Op.UPSERT, 25, 6, "in", "", 1, 1),  # older too
        DocOp("t", "b", Op.UPSERT, 10, 1, "in", "", 2, 1),  # beaten by the delete after it
        DocOp("t", "b", Op.DELETE, 11, 2, "in"),
        DocOp("t", "c", Op.UPSERT, 5, 1, "in", "", 3, 1),  # new: current
    ]
    held = {("t", "a"): (30, 3), ("t", "b"): None, ("t", "c"): None}
    assert past_versions(docs, index) == 3
    assert past_versions(docs, index, held) == 3
    # A held version given by the caller is what counts, not a second lookup.
    assert past_versions(docs, index, {**held, ("t", "c"): (6, 0)}) == 4


def test_the_epoch_log_keeps_its_new_versions_out_of_the_collectors_way() -> None:
    log = EpochLog()
    batch = CommitBatch(
        docs=[DocOp("t", "a", Op.UPSERT, 1_000, 0, "in", "it", 0, 0)],
        chunk_ids=np.zeros(0, np.int64),
        positions=np.zeros(0, np.int32),
        texts=[],
        hashes=[],
        vectors=np.zeros((0, DIM), np.float32),
    )
    log.record(batch, CommitResult(epoch=1, applied_docs=1, stale_docs=0, chunks_added=0))
    found = log.since(0, 1)
    assert found is not None
    (v,) = found[0].upserts
    assert v == NewVersion("t", "a", "it", 1_000)
    assert (v.tenant, v.doc_id, v.domain, v.event_time) == ("t", "a", "it", 1_000)
    gc.collect()
    assert not gc.is_tracked(v)  # nothing for a full collection to visit


def test_the_chunk_stage_prepares_untracked_chunks_and_hashes() -> None:
    from streamrag.chunking import TokenSplitter
    from streamrag.runtime.stages import ChunkStage

    long = " ".join(f"w{i}" for i in range(10))
    changes = ChangeBatch.from_changes(
        [_upsert("a", 1, 1, long), Change("t", "b", Op.DELETE, 2, {}, "in", 2)]
    )
    out = ChunkStage(TokenSplitter(max_tokens=4, overlap_tokens=0))(changes)
    assert out.letters == []
    prep, gone = out.out.prepared
    assert gone is None
    assert prep is not None
    assert prep.chunks == ("w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9")
    assert prep.hashes == tuple(content_hash(c) for c in prep.chunks)
    assert prep.tokens == 10
    assert out.out.chunk_counts == [3, 1]
    gc.collect()
    # Alive until its change commits, and nothing in it for a full collection to visit.
    assert not gc.is_tracked(prep)
    assert not gc.is_tracked(prep.chunks)
    assert not gc.is_tracked(prep.hashes)
