"""The ANN configurations against the exact one, on clustered data with tombstones and filters."""

from __future__ import annotations

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import CommitBatch, LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.compaction import CompactionSpec

from .reference import Change, make_batch

DIM = 32
N = 4000


def _clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((40, DIM)).astype(np.float32)
    x = centers[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _load(index: LsmIndex, data: np.ndarray) -> None:
    """Two tenants, then every 5th document updated and every 7th deleted."""
    for lo in range(0, N, 500):
        changes = [
            Change(f"d{i}", Op.UPSERT, 100 + i, i, (i,), "acme" if i % 10 == 0 else "default")
            for i in range(lo, lo + 500)
        ]
        index.commit(_batch(changes, data))
    later = [
        Change(
            f"d{i}", Op.UPSERT, 10_000 + i, N + i, (N + i,), "acme" if i % 10 == 0 else "default"
        )
        for i in range(0, N, 5)
    ]
    gone = [
        Change(f"d{i}", Op.DELETE, 20_000 + i, 2 * N + i, (), "acme" if i % 10 == 0 else "default")
        for i in range(0, N, 7)
    ]
    index.commit(_batch(later, data))
    index.commit(_batch(gone, data))


def _batch(changes: list[Change], data: np.ndarray):  # type: ignore[no-untyped-def]
    batch = make_batch(changes, DIM)
    rows = [s for c in changes for s in c.seeds]
    batch.vectors[:] = data[rows] if rows else batch.vectors
    return batch


@pytest.mark.parametrize(
    ("ann", "floor"),
    [
        (AnnSpec(min_rows=1000, hnsw_m=16, hnsw_ef_search=48), 0.95),
        (AnnSpec(min_rows=1000, ivfpq_min_rows=1000, pq_m=8, ivf_nprobe=16, refine=8), 0.95),
    ],
    ids=["hnsw", "ivfpq"],
)
def test_ann_recall_against_exact(ann: AnnSpec, floor: float) -> None:
    data = _clustered(2 * N, seed=1)
    common = {"seal_rows": 1024, "compaction": CompactionSpec(fanout=2, seal_rows=1024)}
    exact = LsmIndex(DIM, LsmSpec(ann=AnnSpec(min_rows=2**62), **common))  # type: ignore[arg-type]
    approx = LsmIndex(DIM, LsmSpec(ann=ann, **common))  # type: ignore[arg-type]
    for index in (exact, approx):
        _load(index, data)
        index.seal_all()
        while index.maintain():
            pass
    assert approx.health().ann_segments >= 1
    queries = _clustered(200, seed=2)
    for flt in (
        SearchFilter(),
        SearchFilter(tenant="acme"),  # 10 % of rows: pre-filtered, exact
        SearchFilter(start_us=100, end_us=100 + N // 2),  # half the documents
        SearchFilter(as_of_us=15_000),  # before the deletes
    ):
        _, want = exact.search_many(queries, 10, flt)
        _, got = approx.search_many(queries, 10, flt)
        # Columns first (no structs built yet), then the structs must agree with them.
        ids = [g.chunk_ids.tolist() for g in got]
        scores = [g.scores.tolist() for g in got]
        assert ids == [[h.chunk_id for h in g] for g in got]
        assert scores == [[h.score for h in g] for g in got]
        hits = sum(
            len({h.chunk_id for h in g} & {h.chunk_id for h in w})
            for g, w in zip(got, want, strict=True)
        )
        total = sum(len(w) for w in want)
        assert [len(g) for g in got] == [len(w) for w in want]
        assert hits / total >= floor, (flt, hits / total)


def _with_vectors(batch: CommitBatch, vectors: np.ndarray) -> CommitBatch:
    """The same commit, carrying the given vectors."""
    return CommitBatch(
        batch.docs,
        batch.chunk_ids,
        batch.positions,
        batch.texts,
        batch.hashes,
        vectors,
        batch.embedder_version,
    )


def test_structures_are_calibrated_to_the_recall_target_or_dropped() -> None:
    """Unstructured vectors: the graph must search wider, or the segment is scanned exactly."""
    from streamrag.index.ann import HnswAnn, build_ann, recall_at_10

    rng = np.random.default_rng(5)
    data = rng.standard_normal((3000, 128)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    sample = np.arange(0, 3000, 25)
    raw = HnswAnn.build(data, AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=10))
    assert recall_at_10(raw, data, sample) < 0.95  # as built, it misses the target here
    wide = build_ann("hnsw", data, AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=10))
    assert isinstance(wide, HnswAnn)
    assert wide.ef > 10
    assert recall_at_10(wide, data, sample) >= 0.95
    capped = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=10, max_ef=10)
    assert build_ann("hnsw", data, capped) is None

    # An index whose structure was refused still answers exactly.
    common = {"seal_rows": 1024, "compaction": CompactionSpec(fanout=8, seal_rows=1024)}
    # Four links per row (a graph too thin for these 1024-row segments at ef 10).
    thin = AnnSpec(min_rows=1000, hnsw_m=4, hnsw_ef_search=10, max_ef=10)
    spec = LsmSpec(ann=thin, **common)  # type: ignore[arg-type]
    index = LsmIndex(128, spec)
    changes = [Change(f"d{i}", Op.UPSERT, 100 + i, i, (i,)) for i in range(2048)]
    batch = make_batch(changes, 128)
    index.commit(_with_vectors(batch, data[:2048].copy()))
    index.seal_all()
    while index.maintain():
        pass
    assert index.health().ann_segments == 0
    assert index.health().ann_pending == 0
    q = data[2048:2100]
    _, hits = index.search_many(q, 10, SearchFilter())
    want = np.argsort(-(q @ data[:2048].T), axis=1)[:, :10]
    got = [[int(h.doc_id[1:]) for h in row] for row in hits]
    assert got == want.tolist()


def test_recall_is_rechecked_on_live_queries() -> None:
    """A graph that passes on its own rows but misses on the queries users send is widened."""
    from streamrag.index.ann import HnswAnn, recall_on

    data = _clustered(3000, seed=7)
    ann = AnnSpec(
        min_rows=1000,
        hnsw_m=4,
        hnsw_ef_construction=16,
        hnsw_ef_search=10,
        probe_every=64,
        probe_queries=128,
    )
    common = {"seal_rows": 4096, "compaction": CompactionSpec(fanout=8, seal_rows=4096)}
    index = LsmIndex(DIM, LsmSpec(ann=ann, **common), background=False)  # type: ignore[arg-type]
    batch = make_batch([Change(f"d{i}", Op.UPSERT, 100 + i, i, (i,)) for i in range(3000)], DIM)
    index.commit(_with_vectors(batch, data.copy()))
    index.seal_all()
    while index.maintain():
        pass
    [seg] = [v.segment for v in index.pin().views]
    assert isinstance(seg.ann, HnswAnn)
    ef_before = seg.ann.ef
    # Queries unlike the documents: random directions, where a thin graph gets lost.
    rng = np.random.default_rng(11)
    queries = rng.standard_normal((1200, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    before = recall_on(seg.ann, data, queries[:200])
    assert before < 0.95
    for i in range(1200):
        index.search_many(queries[i : i + 1], 10, SearchFilter())
    assert index.maintain()  # the re-check was due, and changed the structure
    after = seg.ann
    if after is not None:
        assert isinstance(after, HnswAnn)
        assert after.ef > ef_before
        assert recall_on(after, data, queries[:200]) >= 0.9
    else:
        assert index.health().exact_by_measurement == 1
    assert index.ann_recall_min >= 0.95
    index.close()


def test_rechecks_that_change_nothing_space_out_and_a_new_structure_resets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each re-check is an exact scan of every graph: while they pass, they come less often."""
    import streamrag.index.lsm_maintenance as maintenance

    checks: list[int] = []
    real = maintenance.recall_on

    def counted(ann, vectors, queries, exclude=None):  # type: ignore[no-untyped-def]
        checks.append(index._queries_seen)
        return real(ann, vectors, queries, exclude)

    monkeypatch.setattr(maintenance, "recall_on", counted)
    data = _clustered(4000, seed=7)
    ann = AnnSpec(min_rows=1000, probe_every=64, probe_every_max=256, probe_queries=64)
    common = {"seal_rows": 2000, "compaction": CompactionSpec(fanout=100, seal_rows=2000)}
    index = LsmIndex(DIM, LsmSpec(ann=ann, **common), background=False)  # type: ignore[arg-type]
    first = make_batch([Change(f"d{i}", Op.UPSERT, 100 + i, i, (i,)) for i in range(2000)], DIM)
    index.commit(_with_vectors(first, data[:2000].copy()))
    index.seal_all()
    while index.maintain():
        pass
    assert index.health().ann_pending == 0
    rng = np.random.default_rng(5)
    # Queries near the documents: the graph holds its recall on them, nothing changes.
    noise = 0.05 * rng.standard_normal((1000, DIM)).astype(np.float32)
    queries = data[rng.integers(0, 2000, 1000)] + noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    def one_by_one(n: int) -> None:
        for i in range(n):
            index.search_many(queries[i : i + 1], 10, SearchFilter())
            index.maintain()

    one_by_one(1000)
    # Due after 64, then 128, 256 and 256 more queries (the longest interval), not every 64.
    assert checks == [64, 192, 448, 704, 960]
    assert index.ann_recall_min >= 0.95
    # A second segment gets its graph: it is checked on live queries at the first pace again.
    second = make_batch(
        [Change(f"d{i}", Op.UPSERT, 100 + i, i, (i,)) for i in range(2000, 4000)], DIM
    )
    index.commit(_with_vectors(second, data[2000:].copy()))
    index.seal_all()
    while index.maintain():
        pass
    checks.clear()
    one_by_one(100)
    # Both graphs, 64 queries after the last check (at 960), not 256.
    assert checks == [1024, 1024]
    index.close()
