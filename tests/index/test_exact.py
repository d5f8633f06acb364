from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.changes import Op
from streamrag.chunking import chunk_id, content_hash
from streamrag.errors import IndexStoreError, QueryError
from streamrag.index import CommitBatch, DocOp, ExactIndex, SearchFilter

DIM = 8


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _batch(*docs: tuple) -> CommitBatch:  # type: ignore[type-arg]
    """Each doc: (doc_id, op, event_time, offset, [seeds], domain, tenant)."""
    ops, ids, pos, texts, hashes, vecs = [], [], [], [], [], []
    for doc_id, op, t, off, seeds, *rest in docs:
        domain = rest[0] if rest else ""
        tenant = rest[1] if len(rest) > 1 else "default"
        first = len(texts)
        for p, s in enumerate(seeds):
            ids.append(chunk_id(tenant, doc_id, p))
            pos.append(p)
            texts.append(f"{doc_id}:{s}")
            hashes.append(content_hash(f"{doc_id}:{s}"))
            vecs.append(_vec(s))
        ops.append(DocOp(tenant, doc_id, op, t, off, "src", domain, first, len(seeds)))
    return CommitBatch(
        docs=ops,
        chunk_ids=np.asarray(ids, np.int64),
        positions=np.asarray(pos, np.int32),
        texts=texts,
        hashes=hashes,
        vectors=np.asarray(vecs, np.float32).reshape(-1, DIM),
        embedder_version="test",
    )


def _search(index: ExactIndex, seed: int, k: int = 10, **flt: object) -> list[tuple[str, str]]:
    _, hits = index.search_many(_vec(seed)[None, :], k, SearchFilter(**flt))  # type: ignore[arg-type]
    return [(h.doc_id, h.text) for h in hits[0]]


U, D = Op.UPSERT, Op.DELETE


def test_epoch_advances_once_per_commit_and_results_are_exact() -> None:
    index = ExactIndex(DIM)
    assert index.epoch == 0
    r = index.commit(_batch(("a", U, 10, 0, [1, 2]), ("b", U, 10, 1, [3])))
    assert (r.epoch, r.applied_docs, r.chunks_added) == (1, 2, 3)
    epoch, hits = index.search_many(_vec(3)[None, :], 1, SearchFilter())
    assert epoch == 1
    assert hits[0][0].doc_id == "b"
    assert hits[0][0].score == pytest.approx(1.0)
    assert hits[0][0].epoch == 1


def test_update_replaces_old_chunks() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(("a", U, 10, 0, [1, 2])))
    index.commit(_batch(("a", U, 20, 5, [3])))
    assert _search(index, 1) == [("a", "a:3")]
    assert index.stats().live_chunks == 1


def test_older_version_arriving_late_is_ignored() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(("a", U, 20, 0, [1])))
    r = index.commit(_batch(("a", U, 10, 9, [2])))
    assert (r.applied_docs, r.stale_docs) == (0, 1)
    assert _search(index, 2) == [("a", "a:1")]


def test_tie_on_event_time_breaks_on_offset() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(("a", U, 10, 5, [1])))
    index.commit(_batch(("a", U, 10, 4, [2])))
    assert _search(index, 1) == [("a", "a:1")]
    index.commit(_batch(("a", U, 10, 6, [3])))
    assert _search(index, 1) == [("a", "a:3")]


def test_delete_leaves_a_tombstone_that_blocks_older_upserts() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(("a", U, 10, 0, [1]), ("b", U, 10, 1, [2])))
    index.commit(_batch(("a", D, 20, 2, [])))
    assert [d for d, _ in _search(index, 1)] == ["b"]
    index.commit(_batch(("a", U, 15, 3, [4])))  # older than the delete: no resurrection
    assert [d for d, _ in _search(index, 4)] == ["b"]
    index.commit(_batch(("a", U, 25, 4, [5])))  # newer than the delete: back
    assert ("a", "a:5") in _search(index, 5)
    s = index.stats()
    assert (s.live_docs, s.deleted_docs) == (2, 0)


def test_within_one_batch_the_newest_version_wins() -> None:
    index = ExactIndex(DIM)
    r = index.commit(_batch(("a", U, 30, 0, [1]), ("a", U, 10, 1, [2]), ("a", U, 20, 2, [3])))
    assert (r.applied_docs, r.stale_docs) == (1, 2)
    assert _search(index, 2) == [("a", "a:1")]


def test_a_pinned_snapshot_never_sees_a_later_commit() -> None:
    index = ExactIndex(DIM, initial_capacity=1)
    index.commit(_batch(("a", U, 10, 0, [1])))
    pinned = index.pin()
    index.commit(_batch(("a", U, 20, 1, [2]), ("b", U, 20, 2, [3, 4, 5])))  # grows storage
    epoch, hits = index.search_many(_vec(2)[None, :], 10, SearchFilter(), snapshot=pinned)
    assert epoch == 1
    assert [(h.doc_id, h.text) for h in hits[0]] == [("a", "a:1")]
    assert [d for d, _ in _search(index, 2)].count("a") == 1
    assert index.epoch == 2


def test_filters_apply_before_ranking() -> None:
    index = ExactIndex(DIM)
    docs = [(f"d{i}", U, i * 100, i, [i], "ops" if i % 10 == 0 else "hr") for i in range(100)]
    index.commit(_batch(*docs))
    hits = _search(index, 55, k=5, domains=frozenset({"ops"}))
    assert len(hits) == 5  # 10 ops documents exist: a filter never starves the top-k
    assert all(int(d[1:]) % 10 == 0 for d, _ in hits)
    in_range = _search(index, 1, k=100, start_us=1_000, end_us=2_000)
    assert sorted(int(d[1:]) for d, _ in in_range) == list(range(10, 20))  # [start, end)
    assert _search(index, 1, doc_ids=frozenset({"d7", "zz"})) == [("d7", "d7:7")]
    assert _search(index, 1, domains=frozenset({"nope"})) == []
    assert _search(index, 1, tenant="other") == []


def test_tenants_are_isolated() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(("a", U, 1, 0, [1], "", "t1"), ("a", U, 1, 1, [2], "", "t2")))
    assert _search(index, 1, tenant="t1") == [("a", "a:1")]
    assert _search(index, 1, tenant="t2") == [("a", "a:2")]


def test_compaction_keeps_results_and_old_snapshots() -> None:
    index = ExactIndex(DIM, initial_capacity=8)
    index.commit(_batch(*[(f"d{i}", U, 1, i, [i]) for i in range(1500)]))
    before = index.pin()
    index.commit(_batch(*[(f"d{i}", U, 2, i, [i + 5000]) for i in range(1500)]))
    assert index.stats().rows == 1500  # compacted: dead rows dropped
    assert _search(index, 5003, k=1) == [("d3", "d3:5003")]
    assert _search(index, 6200, k=1) == [("d1200", "d1200:6200")]
    _, old = index.search_many(_vec(3)[None, :], 1, SearchFilter(), snapshot=before)
    assert old[0][0].text == "d3:3"
    index.commit(_batch(("d3", U, 3, 0, [9])))  # rows of documents are still right
    assert _search(index, 9, k=1) == [("d3", "d3:9")]
    assert index.stats().live_chunks == 1500


def test_bad_shapes_and_queries_are_refused() -> None:
    index = ExactIndex(DIM)
    b = _batch(("a", U, 1, 0, [1]))
    with pytest.raises(IndexStoreError, match="expected"):
        index.commit(
            CommitBatch(
                b.docs, b.chunk_ids, b.positions, b.texts, b.hashes, np.zeros((1, 3), np.float32)
            )
        )
    with pytest.raises(QueryError, match="shape"):
        index.search_many(np.zeros((1, 3), np.float32), 1, SearchFilter())
    with pytest.raises(QueryError, match="k must be positive"):
        index.search_many(np.zeros((1, DIM), np.float32), 0, SearchFilter())
    with pytest.raises(QueryError, match="empty"):
        SearchFilter(start_us=5, end_us=5)


_op = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([U, U, D]),
    st.integers(0, 20),
    st.lists(st.integers(0, 30), min_size=1, max_size=3),
    st.sampled_from(["x", "y"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1, max_size=8), st.integers(0, 30))
def test_matches_a_brute_force_reference(batches: list, query_seed: int) -> None:  # type: ignore[type-arg]
    index = ExactIndex(DIM, initial_capacity=2)
    truth: dict[str, tuple] = {}  # type: ignore[type-arg]
    offset = 0
    for ops in batches:
        docs = []
        for doc_id, op, t, seeds, domain in ops:
            docs.append((doc_id, op, t, offset, seeds, domain))
            cur = truth.get(doc_id)
            if cur is None or (t, offset) > cur[0]:
                truth[doc_id] = ((t, offset), op, seeds, domain)
            offset += 1
        index.commit(_batch(*docs))
    q = _vec(query_seed)
    for domain in (None, "x"):
        expected = sorted(
            (
                (-float(_vec(s) @ q), d, f"{d}:{s}")
                for d, (_, op, seeds, dom) in truth.items()
                if op == U and (domain is None or dom == domain)
                for s in seeds
            ),
        )
        flt = {} if domain is None else {"domains": frozenset({domain})}
        got = _search(index, query_seed, k=5, **flt)
        assert [s for s, *_ in expected[:5]] == pytest.approx(
            [-float(_vec(int(t.split(":")[1])) @ q) for _, t in got], abs=1e-5
        )
        assert len(got) == min(5, len(expected))
    assert index.epoch == len(batches)


def test_selective_and_broad_filters_rank_alike() -> None:
    index = ExactIndex(DIM)
    index.commit(_batch(*[(f"d{i}", U, i, i, [i], "a" if i < 30 else "b") for i in range(300)]))
    q = _vec(7)[None, :]
    _, few = index.search_many(q, 3, SearchFilter(domains=frozenset({"a"})))  # gathers 30 rows
    _, all_ = index.search_many(q, 300, SearchFilter())  # scans every row
    expected = [h.doc_id for h in all_[0] if int(h.doc_id[1:]) < 30][:3]
    assert [h.doc_id for h in few[0]] == expected
    assert few[0][0].score == pytest.approx(
        all_[0][[h.doc_id for h in all_[0]].index(expected[0])].score
    )
