"""The half-precision copy of a segment answers exactly, near-ties and duplicates included.

Half precision moves a score by up to ~5e-4; rows whose scores differ by less
than that are ordered by the copy at random. The copy must then either prove
that its candidate list holds the true top k (and re-score it in float32), or
decline so that the float32 vectors are scanned. These tests build the cases
where the proof fails: a cluster of near-identical vectors around the query,
and many exact duplicates.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.compaction import CompactionSpec
from streamrag.index.half import HalfScan
from streamrag.index.search import SearchTuning

DIM = 64


def _unit(a: np.ndarray) -> np.ndarray:
    return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)


def _cluster(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """300 random rows and 200 rows within 1e-4 of one direction, the query near it.

    The 200 scores then differ by ~1e-5: far above float32 rounding (~1e-7),
    far below half precision's error.
    """
    rng = np.random.default_rng(seed)
    base = _unit(rng.standard_normal(DIM))
    near = _unit(base + 1e-4 * rng.standard_normal((200, DIM)))
    far = _unit(rng.standard_normal((300, DIM)))
    rows = np.vstack([far, near])
    query = _unit(base + 3e-2 * rng.standard_normal(DIM))[None, :]
    return rows, query


def _brute(rows: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None = None) -> list[int]:
    scores = rows @ q
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


@pytest.mark.parametrize("k", [1, 5, 40])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("m", [1, 3])  # one query takes the short way (_one_query)
def test_random_rows_come_back_exactly(k: int, masked: bool, m: int) -> None:
    rng = np.random.default_rng(k)
    rows = _unit(rng.standard_normal((3000, DIM)))
    half = HalfScan.build(rows)
    assert half is not None
    mask = rng.random(3000) < 0.7 if masked else None
    matching = 3000 if mask is None else int(mask.sum())
    queries = _unit(rng.standard_normal((m, DIM)))
    got = half.search(rows, queries, k, mask, matching)
    assert got is not None
    found, scores = got
    for i in range(m):
        assert found[i].tolist() == _brute(rows, queries[i], k, mask)
        np.testing.assert_allclose(scores[i], rows[found[i]] @ queries[i], rtol=1e-6)


def test_a_mask_over_the_best_rows_is_searched_with_the_mask() -> None:
    """The best 60 rows are hidden: the unmasked candidate list holds none the query
    may see, so the copy searches again with the mask instead of declining."""
    rng = np.random.default_rng(4)
    rows = _unit(rng.standard_normal((2000, DIM)))
    q = rows[:1].copy()
    order = np.argsort(-(rows @ q[0]))
    mask = np.ones(2000, dtype=bool)
    mask[order[:60]] = False
    half = HalfScan.build(rows)
    assert half is not None
    got = half.search(rows, q, 5, mask, int(mask.sum()))
    assert got is not None
    assert got[0][0].tolist() == _brute(rows, q[0], 5, mask)


def test_fewer_matching_rows_than_k_are_padded() -> None:
    rng = np.random.default_rng(2)
    rows = _unit(rng.standard_normal((100, DIM)))
    half = HalfScan.build(rows)
    assert half is not None
    mask = np.zeros(100, dtype=bool)
    mask[[3, 50, 77]] = True
    got = half.search(rows, rows[:1], 5, mask, 3)
    assert got is not None
    found, scores = got
    assert sorted(found[0, :3].tolist()) == [3, 50, 77]
    assert np.isneginf(scores[0, 3:]).all()


def test_near_ties_are_declined_and_would_be_wrong_without_the_bound() -> None:
    rows, query = _cluster(seed=5)
    half = HalfScan.build(rows)
    assert half is not None
    # The 200 near rows sit within the copy's error of each other: no candidate
    # list of k + margin rows can prove it holds the true top 5.
    assert half.search(rows, query, 5, None, rows.shape[0]) is None
    # Without the bound the copy answers, and wrongly: the case is a real one.
    careless = HalfScan(half._index, half.rows, 0.0)
    got = careless.search(rows, query, 5, None, rows.shape[0])
    assert got is not None
    assert got[0][0].tolist() != _brute(rows, query[0], 5)


def test_duplicates_are_declined() -> None:
    rng = np.random.default_rng(8)
    rows = _unit(rng.standard_normal((500, DIM)))
    rows[100:200] = rows[0]  # one paragraph in a hundred documents
    half = HalfScan.build(rows)
    assert half is not None
    assert half.search(rows, rows[:1] + 0.0, 5, None, 500) is None


def _cases() -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None, int]]:
    """Rows, one query, a mask and k: friendly and hostile alike."""
    rng = np.random.default_rng(21)
    rand = _unit(rng.standard_normal((3000, DIM)))
    near_rows, near_q = _cluster(seed=9)
    dup = _unit(rng.standard_normal((500, DIM)))
    dup[100:200] = dup[0]
    hide = np.ones(2000, dtype=bool)
    best = rand[:2000] @ rand[0]
    hide[np.argsort(-best)[:60]] = False  # the best 60 rows hidden from the query
    few = np.zeros(100, dtype=bool)
    few[[3, 50, 77]] = True
    return [
        ("random", rand, rand[7:8] * 0.9 + rand[8:9] * 0.1, None, 5),
        ("random, masked", rand, rand[9:10], rng.random(3000) < 0.7, 10),
        ("near ties", near_rows, near_q, None, 5),
        ("near ties, masked", near_rows, near_q, np.arange(500) % 3 != 0, 5),
        ("duplicates", dup, dup[:1] + 0.0, None, 5),
        ("best rows hidden", rand[:2000], rand[:1], hide, 5),
        ("fewer matching than k", rand[:100], rand[:1], few, 5),
        ("every row wanted", rand[:20], rand[:1], None, 20),
    ]


@pytest.mark.parametrize("case", range(8))
def test_one_query_answers_as_the_batched_path_does(case: int) -> None:
    """A lone query's short way (``_one_query``) and the batched path agree, declines included."""
    name, rows, q, mask, k = _cases()[case]
    half = HalfScan.build(rows)
    assert half is not None
    q = _unit(q)
    matching = rows.shape[0] if mask is None else int(mask.sum())
    alone = half.search(rows, q, k, mask, matching)
    pair = half.search(rows, np.vstack([q, q]), k, mask, matching)  # two queries: the general way
    assert (alone is None) == (pair is None), name
    if alone is not None and pair is not None:
        assert alone[0][0].tolist() == pair[0][0].tolist(), name
        np.testing.assert_allclose(alone[1][0], pair[1][0], rtol=1e-6, atol=1e-6)
        assert (
            alone[0][0].tolist()[: min(k, matching)]
            == _brute(rows, q[0], k, mask)[: min(k, matching)]
        ), name


def test_coordinates_beyond_half_precision_get_no_copy() -> None:
    rows = np.ones((10, DIM), dtype=np.float32)
    rows[3, 7] = 1e6
    assert HalfScan.build(rows) is None
    rows[3, 7] = np.inf
    assert HalfScan.build(rows) is None


def _commit(index: LsmIndex, rows: np.ndarray, first: int, domains: list[str]) -> None:
    n = rows.shape[0]
    ids = range(first, first + n)
    index.commit(
        CommitBatch(
            docs=[
                DocOp("default", f"d{i}", Op.UPSERT, 1_000 + i, i, "src", domains[i], i - first, 1)
                for i in ids
            ],
            chunk_ids=np.arange(first, first + n, dtype=np.int64),
            positions=np.zeros(n, np.int32),
            texts=["x"] * n,
            hashes=[b"h"] * n,
            vectors=rows,
            embedder_version="test",
        )
    )


SPEC = LsmSpec(
    seal_rows=250,
    ann=AnnSpec(min_rows=2**62),
    compaction=CompactionSpec(fanout=64, seal_rows=250),
    # Copies up to 6 queries a call, whatever this CPU measured (streamrag.index.half_limit).
    tuning=SearchTuning(half_min_rows=1, half_min_bytes=0, half_max_queries=6),
    wal_fsync=False,
)


def _index(rows: np.ndarray, domains: list[str]) -> LsmIndex:
    index = LsmIndex(DIM, SPEC, background=False)
    _commit(index, rows, 0, domains)
    index.seal_all()
    index.maintain()
    return index


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_the_index_answers_near_ties_exactly(seed: int) -> None:
    rows, query = _cluster(seed)
    domains = ["a" if i % 4 else "b" for i in range(rows.shape[0])]
    index = _index(rows, domains)
    segs = [v.segment for v in index.pin().views if v.rows]
    assert segs
    assert all(s.half is not None for s in segs), "no copy: this tests nothing"
    assert index.health().half_segments == len(segs)
    for flt, mask in (
        (SearchFilter(), None),
        (SearchFilter(domains=frozenset({"a"})), np.array([d == "a" for d in domains])),
    ):
        _, hits = index.search_many(query, 5, flt)
        assert [h.chunk_id for h in hits[0]] == _brute(rows, query[0], 5, mask)


def test_a_copy_that_cannot_be_made_is_not_retried_and_search_stays_exact() -> None:
    rng = np.random.default_rng(3)
    rows = _unit(rng.standard_normal((500, DIM)))
    rows[[7, 300]] *= 1e6  # beyond half precision, in both segments
    index = _index(rows, ["a"] * 500)
    segs = [v.segment for v in index.pin().views if v.rows]
    assert all(s.half is None for s in segs)
    assert not index.maintain()  # nothing left to try
    q = _unit(rng.standard_normal((1, DIM)))
    _, hits = index.search_many(q, 5, SearchFilter())
    assert [h.chunk_id for h in hits[0]] == _brute(rows, q[0], 5)


def test_the_copies_are_counted_in_the_metrics() -> None:
    from streamrag.runtime.metrics import _IndexCollector

    rng = np.random.default_rng(9)
    index = _index(_unit(rng.standard_normal((500, DIM))), ["a"] * 500)
    gauges = {m.name: m.samples[0].value for m in _IndexCollector(index.health).collect()}
    assert gauges["streamrag_index_half_segments"] == 2.0


def test_copies_can_be_turned_off() -> None:
    from streamrag.config import IndexSettings
    from streamrag.index.factory import lsm_spec

    assert lsm_spec(IndexSettings()).tuning == SearchTuning()
    for on in (True, False):
        spec = lsm_spec(IndexSettings(half_copies=on, seal_rows=4096))
        # (Copies used up to 6 queries a call: whatever this CPU measured, they are made.)
        spec = replace(spec, tuning=replace(spec.tuning, half_min_bytes=0, half_max_queries=6))
        index = _filled(spec)
        assert (index.health().half_segments > 0) == on


def test_an_index_scanned_within_the_cache_gets_no_copies() -> None:
    index = _filled(replace(SPEC, tuning=SearchTuning(half_min_rows=1)))
    assert index.health().segments >= 2
    assert index.health().half_segments == 0  # 9,000 rows x 64: 2.3 MB


def _filled(spec: LsmSpec) -> LsmIndex:
    index = LsmIndex(DIM, spec, background=False)
    rng = np.random.default_rng(1)
    _commit(index, _unit(rng.standard_normal((9000, DIM))), 0, [""] * 9000)
    index.seal_all()
    index.maintain()
    return index


def test_a_copy_that_fails_to_build_leaves_the_segment_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(vectors: np.ndarray) -> HalfScan | None:
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(HalfScan, "build", staticmethod(broken))
    rng = np.random.default_rng(12)
    rows = _unit(rng.standard_normal((500, DIM)))
    index = _index(rows, ["a"] * 500)  # maintain() does not raise
    assert index.health().half_segments == 0
    assert "MemoryError" in (index.last_maintenance_error or "")
    assert not index.maintain()  # not tried again
    q = _unit(rng.standard_normal((1, DIM)))
    _, hits = index.search_many(q, 5, SearchFilter())
    assert [h.chunk_id for h in hits[0]] == _brute(rows, q[0], 5)


GROWING = LsmSpec(
    seal_rows=10_000,
    ann=AnnSpec(min_rows=2**62),
    compaction=CompactionSpec(fanout=64, seal_rows=10_000),
    tuning=SearchTuning(half_min_rows=200, half_min_bytes=0, half_max_queries=6),
    wal_fsync=False,
)


def _growing(index: LsmIndex) -> tuple[int, int | None]:
    """The growing segment's rows, and how many of them its copy holds (None: no copy)."""
    segs = [v.segment for v in index.pin().views if not v.segment.sealed]
    assert len(segs) == 1
    half = segs[0].half
    return segs[0].n, None if half is None else half.rows


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_the_growing_segment_is_scanned_through_a_copy_of_its_first_rows(seed: int) -> None:
    rng = np.random.default_rng(seed + 100)  # not _cluster's stream: no duplicate rows
    cluster, query = _cluster(seed)  # 300 random rows, then 200 near-ties around the query
    # The near-ties first, in the first copy (which cannot prove its list for
    # ``query``: the float32 rows it covers are scanned instead), random rows after.
    rows = np.vstack([cluster[300:], cluster[:300], _unit(rng.standard_normal((300, DIM)))])
    rows[250] = query[0]  # the best row of all, in the rows appended after the first copy
    domains = ["a" if i % 3 else "b" for i in range(800)]
    index = LsmIndex(DIM, GROWING, background=False)
    _commit(index, rows[:250], 0, domains)
    index.maintain()
    assert _growing(index) == (250, 250)
    _commit(index, rows[250:400], 250, domains)
    index.maintain()
    assert _growing(index) == (400, 250)  # 150 rows without a copy: under half_min_rows
    before = index.pin()
    mask_a = np.array([d == "a" for d in domains])
    for upto, man in ((400, before), (800, None)):
        if man is None:
            _commit(index, rows[400:], 400, domains)
            index.maintain()
            assert _growing(index) == (800, 800)
        for flt, mask in ((SearchFilter(), None), (SearchFilter(domains=frozenset({"a"})), mask_a)):
            for q in (query, rows[5:6], rows[350:351]):
                _, hits = index.search_many(q, 5, flt, man)
                want = _brute(rows[:upto], q[0], 5, None if mask is None else mask[:upto])
                assert [h.chunk_id for h in hits[0]] == want
    # A manifest pinned before the copy grew past it reads its own rows only.
    _, hits = index.search_many(rows[600:601], 5, SearchFilter(), before)
    assert [h.chunk_id for h in hits[0]] == _brute(rows[:400], rows[600], 5)
    assert max(h.chunk_id for h in hits[0]) < 400


def test_sealing_the_growing_segment_gives_it_a_whole_copy() -> None:
    rng = np.random.default_rng(41)
    rows = _unit(rng.standard_normal((450, DIM)))
    index = LsmIndex(DIM, GROWING, background=False)
    _commit(index, rows, 0, ["a"] * 450)
    index.maintain()
    assert _growing(index) == (450, 450)
    _commit(index, _unit(rng.standard_normal((50, DIM))), 450, ["a"] * 500)
    index.seal_all()
    index.maintain()
    (seg,) = [v.segment for v in index.pin().views if v.rows]
    assert seg.sealed
    assert seg.half is not None
    assert seg.half.rows == seg.n == 500
    assert index.health().half_segments == 1


def test_a_segment_that_gets_a_graph_drops_the_copy_it_had_while_growing() -> None:
    rng = np.random.default_rng(43)
    rows = _unit(rng.standard_normal((500, DIM)))
    spec = replace(GROWING, seal_rows=500, ann=AnnSpec(min_rows=400))
    index = LsmIndex(DIM, spec, background=False)
    _commit(index, rows[:450], 0, ["a"] * 500)
    index.maintain()
    assert _growing(index) == (450, 450)
    _commit(index, rows[450:], 450, ["a"] * 500)  # fills the segment: sealed
    index.maintain()
    (seg,) = [v.segment for v in index.pin().views if v.rows]
    assert seg.sealed
    assert seg.ann is not None, "no graph: this tests nothing"
    assert seg.half is None  # 450 rows of a copy no search would read
    _, hits = index.search_many(rows[7:8], 5, SearchFilter())
    assert hits[0][0].chunk_id == 7
