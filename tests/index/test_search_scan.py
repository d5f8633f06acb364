"""Exact scans over several segments: one score row per query, one top-k selection.

The exactly searched segments of a query are scored into one shared array
(masked rows at ``-inf``) and the best ``k`` picked once. These tests check
that against brute force over the documents in force, for every shape the scan
takes: whole segments, segments with superseded rows masked, a selective
filter (rows gathered), a time range (a run of rows), another tenant, and one,
two (one product per query) or many queries per call (one matrix product).
The stream is not a friendly one: several versions of a document in one
commit, versions that arrive after newer ones, deletes of documents never seen.
And when an ANN structure reaches nothing, its segment is scanned exactly.
Every case runs twice: on float32 scans, and with every sealed segment read
through its half-precision copy (:mod:`streamrag.index.half`).
"""

from __future__ import annotations

import copy
import pickle

import msgspec
import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import Hits, LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.compaction import CompactionSpec
from streamrag.index.search import SearchTuning

DIM = 16
DOCS = 90
SPEC = LsmSpec(
    seal_rows=16,
    ann=AnnSpec(min_rows=2**62),
    compaction=CompactionSpec(fanout=64, seal_rows=16),
    wal_fsync=False,
)


def _vec(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class _World:
    """An index and the documents in force, kept side by side."""

    def __init__(self, spec: LsmSpec = SPEC) -> None:
        self.index = LsmIndex(DIM, spec, background=False)
        self.rng = np.random.default_rng(11)
        self.state: dict[tuple[str, str], tuple[int, np.ndarray, str, int]] = {}
        self.newest: dict[tuple[str, str], tuple[int, int]] = {}  # (event time, offset)
        self.offset = 0

    def commit(self, changes: list[tuple[str, str, Op, int]]) -> None:
        docs: list[DocOp] = []
        ids: list[int] = []
        vecs: list[np.ndarray] = []
        for tenant, doc, op, t in changes:
            self.offset += 1
            first = len(ids)
            domain = f"dom{int(doc[1:]) % 3}"
            key = (tenant, doc)
            # The newest event time wins (ties: the later offset), whatever the arrival order.
            wins = (t, self.offset) > self.newest.get(key, (-1, -1))
            if wins:
                self.newest[key] = (t, self.offset)
            if op == Op.UPSERT:
                cid = (hash(key) & 0xFFFFFFFF) * 1000 + self.offset
                v = _vec(self.rng)
                ids.append(cid)
                vecs.append(v)
                if wins:
                    self.state[key] = (cid, v, domain, t)
            elif wins:
                self.state.pop(key, None)
            n = 1 if op == Op.UPSERT else 0
            docs.append(DocOp(tenant, doc, op, t, self.offset, "src", domain, first, n))
        self.index.commit(
            CommitBatch(
                docs=docs,
                chunk_ids=np.asarray(ids, np.int64),
                positions=np.zeros(len(ids), np.int32),
                texts=["x"] * len(ids),
                hashes=[b"h"] * len(ids),
                vectors=np.asarray(vecs, np.float32).reshape(-1, DIM),
                embedder_version="test",
            )
        )

    def brute(self, q: np.ndarray, k: int, flt: SearchFilter) -> list[int]:
        cands = []
        for (tenant, doc), (cid, v, domain, t) in self.state.items():
            if tenant != flt.tenant:
                continue
            if flt.domains is not None and domain not in flt.domains:
                continue
            if flt.doc_ids is not None and doc not in flt.doc_ids:
                continue
            if flt.start_us is not None and t < flt.start_us:
                continue
            if flt.end_us is not None and t >= flt.end_us:
                continue
            cands.append((float(v @ q), cid))
        cands.sort(reverse=True)
        return [cid for _, cid in cands[:k]]


HALF_SPEC = LsmSpec(
    seal_rows=16,
    ann=AnnSpec(min_rows=2**62),
    compaction=CompactionSpec(fanout=64, seal_rows=16),
    # Every sealed segment gets a half-precision copy, used for up to 16 queries a call.
    tuning=SearchTuning(half_min_rows=1, half_min_bytes=0, half_max_queries=16),
    wal_fsync=False,
)


@pytest.fixture(scope="module", params=["float32", "half"])
def world(request: pytest.FixtureRequest) -> _World:
    w = _World(HALF_SPEC if request.param == "half" else SPEC)
    # Several sealed segments and a growing one, in event-time order.
    for lo in range(0, DOCS, 10):
        w.commit([("default", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(lo, lo + 10)])
    w.commit([("acme", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(0, 30)])
    # Updates and deletes leave superseded rows in earlier segments (masked at -inf).
    w.commit([("default", f"d{i}", Op.UPSERT, 5_000 + i) for i in range(0, DOCS, 4)])
    w.commit([("default", f"d{i}", Op.DELETE, 6_000 + i) for i in range(1, DOCS, 9)])
    # Several versions of one document in one commit, out of order; late versions older
    # than what is current (kept as history, never current); a delete of a stranger.
    w.commit(
        [
            ("default", "d3", Op.UPSERT, 7_003),
            ("default", "d3", Op.UPSERT, 7_001),
            ("default", "d3", Op.UPSERT, 7_002),
            ("default", "d8", Op.UPSERT, 2_000),
            ("default", "d9", Op.DELETE, 2_000),
            ("default", "d999", Op.DELETE, 7_000),
        ]
    )
    w.commit([("acme", f"d{i}", Op.UPSERT, 500 + i) for i in range(0, 30, 3)])
    assert len(w.index.pin().views) >= 4
    if request.param == "half":
        w.index.maintain()
        copies = [v.segment.half for v in w.index.pin().views if v.segment.sealed]
        assert copies
        assert all(c is not None for c in copies), "no copy: this tests nothing"
    return w


FILTERS = {
    "all": SearchFilter(),
    "domain": SearchFilter(domains=frozenset({"dom1"})),
    "few_docs": SearchFilter(doc_ids=frozenset({"d5", "d33", "d70", "d71"})),
    "time_range": SearchFilter(start_us=1_020, end_us=1_060),
    "other_tenant": SearchFilter(tenant="acme"),
    "nobody": SearchFilter(tenant="nobody"),
}


@pytest.mark.parametrize("name", sorted(FILTERS))
@pytest.mark.parametrize("m", [1, 2, 5, 9])
@pytest.mark.parametrize("k", [1, 7, 500])
def test_scan_matches_brute_force(world: _World, name: str, m: int, k: int) -> None:
    flt = FILTERS[name]
    rng = np.random.default_rng(m * 1000 + k)
    queries = np.stack([_vec(rng) for _ in range(m)])
    _, hits = world.index.search_many(queries, k, flt)
    assert len(hits) == m
    for q, got in zip(queries, hits, strict=True):
        want = world.brute(q, k, flt)
        # The columns first (read without building hits), then the hits themselves.
        assert len(got) == len(want)
        assert got.chunk_ids.tolist() == want
        column_scores = got.scores.tolist()
        assert [h.chunk_id for h in got] == want
        assert [h.score for h in got] == column_scores
        scores = [h.score for h in got]
        assert scores == sorted(scores, reverse=True)
        assert all(h.tenant == flt.tenant for h in got)


@pytest.mark.parametrize(("m", "k", "gathered"), [(1, 7, False), (2, 3, False), (9, 500, True)])
def test_every_field_of_a_hit_is_its_rows(world: _World, m: int, k: int, gathered: bool) -> None:
    """A hit carries its own row's fields, read one by one (few candidates) or gathered (many).

    Each hit, its score aside, equals the same chunk as an export of the
    index shows it: the right segment, row and column for every field.
    """
    stored = {hit.chunk_id: hit for hit, _ in world.index.export()}
    rng = np.random.default_rng(40 + m)
    queries = np.stack([_vec(rng) for _ in range(m)])
    _, hits = world.index.search_many(queries, k, SearchFilter())
    table = hits[0]._table
    assert table is not None
    assert table.which is not None, "candidates from one segment only"
    got = [list(h) for h in hits]
    assert bool(table._columns) == gathered, "the other way of reading the numbers was taken"
    assert sum(map(len, got)) >= m
    for row in got:
        for hit in row:
            assert msgspec.structs.replace(hit, score=0.0) == stored[hit.chunk_id]


def test_hits_are_built_on_demand_and_travel_as_lists(world: _World) -> None:
    """Columns build no struct; pickles and copies are plain lists, equal to the hits."""
    rng = np.random.default_rng(8)
    queries = np.stack([_vec(rng) for _ in range(3)])
    _, hits = world.index.search_many(queries, 6, SearchFilter())
    table = hits[0]._table
    assert table is not None
    assert all(h._table is table for h in hits), "one table per search"
    ids = [h.chunk_ids.tolist() for h in hits]
    assert table._built is None, "reading chunk ids built hit structs"
    first = hits[1][0]
    assert table._built is not None
    assert first.chunk_id == ids[1][0]
    assert hits[1][-1].chunk_id == ids[1][-1]
    assert hits[1][:2] == list(hits[1])[:2]
    for got in hits:
        back = pickle.loads(pickle.dumps(got))
        assert type(back) is list
        assert back == got
        assert got == back
        assert copy.deepcopy(got) == list(got)
        assert type(copy.copy(got)) is list
    assert hits[0] != hits[1]
    assert hits[0] == Hits.of(list(hits[0]))
    built = Hits.of(list(hits[2]))
    assert built.chunk_ids.tolist() == ids[2]
    assert built.scores.tolist() == hits[2].scores.tolist()
    with pytest.raises(TypeError):
        hash(hits[0])


def test_hits_built_after_later_commits_and_compaction_show_what_the_search_read() -> None:
    """Hits are built on first read: later versions, deletes and merges must not show."""
    w = _World(SPEC)
    for lo in range(0, 60, 10):
        w.commit([("default", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(lo, lo + 10)])
    rng = np.random.default_rng(5)
    queries = np.stack([_vec(rng) for _ in range(4)])
    _, lazy = w.index.search_many(queries, 7, SearchFilter())
    _, eager = w.index.search_many(queries, 7, SearchFilter())
    want = [list(h) for h in eager]
    # Every document found gets newer versions, several in one commit, out of order;
    # some are deleted; late versions older than the current ones arrive; all merged.
    found = sorted({h.doc_id for hits in want for h in hits})
    w.commit([("default", d, Op.UPSERT, 9_000 + j) for j, d in enumerate(found)])
    w.commit([("default", d, Op.UPSERT, 8_000 + j) for j, d in enumerate(found)])
    w.commit([("default", d, Op.DELETE, 9_500) for d in found[::2]])
    w.commit([("default", d, Op.UPSERT, 500) for d in found])
    w.index.seal_all()
    while w.index.maintain():
        pass
    assert [h.chunk_ids.tolist() for h in lazy] == [[x.chunk_id for x in hits] for hits in want]
    assert [list(h) for h in lazy] == want
    _, now = w.index.search_many(queries, 7, SearchFilter())
    assert [list(h) for h in now] != want, "the later commits changed nothing: this tests nothing"


def test_batched_equals_one_at_a_time(world: _World) -> None:
    rng = np.random.default_rng(3)
    queries = np.stack([_vec(rng) for _ in range(12)])
    _, together = world.index.search_many(queries, 5, SearchFilter())
    for i in range(12):
        _, alone = world.index.search_many(queries[i : i + 1], 5, SearchFilter())
        assert [h.chunk_id for h in alone[0]] == [h.chunk_id for h in together[i]]
        np.testing.assert_allclose(
            [h.score for h in alone[0]], [h.score for h in together[i]], rtol=1e-5
        )


class _Blind:
    """An ANN structure that reaches no row: every candidate list comes back empty."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, None]:
        return np.full((queries.shape[0], k), -1, dtype=np.int64), None


@pytest.mark.parametrize("name", ["all", "domain", "other_tenant"])
@pytest.mark.parametrize("m", [1, 5])
def test_a_graph_that_comes_up_short_is_scanned_exactly(name: str, m: int) -> None:
    w = _World(
        LsmSpec(
            seal_rows=16,
            ann=AnnSpec(min_rows=32, hnsw_m=8, hnsw_ef_construction=20),
            compaction=CompactionSpec(fanout=64, seal_rows=16),
            tuning=SearchTuning(exact_max_rows=0, min_ann_share=0.0),  # always the graph
            wal_fsync=False,
        )
    )
    w.commit([("default", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(DOCS)])
    w.commit([("acme", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(40)])
    w.commit([("default", f"d{i}", Op.UPSERT, 900 + i) for i in range(0, DOCS, 5)])  # late
    w.index.seal_all()
    w.index.compact(force=True)
    segs = [v.segment for v in w.index.pin().views if v.rows]
    assert len(segs) == 1
    assert segs[0].ann is not None, "no graph was built: this test tests nothing"
    segs[0].ann = _Blind(segs[0].ann.rows)  # type: ignore[assignment]
    flt = FILTERS[name]
    rng = np.random.default_rng(m)
    queries = np.stack([_vec(rng) for _ in range(m)])
    _, hits = w.index.search_many(queries, 7, flt)
    for q, got in zip(queries, hits, strict=True):
        assert [h.chunk_id for h in got] == w.brute(q, 7, flt)


def test_copies_made_while_readers_search_a_hostile_stream() -> None:
    """Readers search while commits bring several versions of a document at once,
    late versions and deletes of strangers, and maintenance adds half-precision
    copies in between: no read fails or comes back unordered, and the end state
    is the brute force's, through the copies."""
    import threading

    w = _World(HALF_SPEC)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        rng = np.random.default_rng(77)
        while not stop.is_set():
            try:
                for flt in FILTERS.values():
                    _, hits = w.index.search_many(np.stack([_vec(rng)]), 5, flt)
                    scores = [h.score for h in hits[0]]
                    assert scores == sorted(scores, reverse=True)
                    assert all(h.tenant == flt.tenant for h in hits[0])
                reads[0] += 1
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for r in range(12):
            base = 1_000 + 100 * r
            batch = [("default", f"d{i}", Op.UPSERT, base + i) for i in range(r, DOCS, 3)]
            batch += [("default", f"d{i}", Op.UPSERT, base + i + 50) for i in range(r, DOCS, 7)]
            batch += [("default", f"d{i}", Op.UPSERT, base - 500 + i) for i in range(0, DOCS, 11)]
            batch += [("default", f"d{r}", Op.DELETE, base + 99), ("default", "d999", Op.DELETE, 1)]
            batch += [("acme", f"d{i}", Op.UPSERT, base + i) for i in range(r, 30, 4)]
            w.commit(batch)
            w.index.maintain()
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]
    assert reads[0] > 0
    copies = [v.segment.half for v in w.index.pin().views if v.segment.sealed]
    assert copies
    assert all(c is not None for c in copies), "no copy: this tests nothing"
    rng = np.random.default_rng(5)
    for flt in FILTERS.values():
        q = _vec(rng)
        _, hits = w.index.search_many(q[None, :], 7, flt)
        assert [h.chunk_id for h in hits[0]] == w.brute(q, 7, flt)


GRAPH_SPEC = LsmSpec(
    seal_rows=16,
    # A graph on every merged segment, searched so widely that it answers exactly.
    ann=AnnSpec(min_rows=32, hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=256),
    compaction=CompactionSpec(fanout=64, seal_rows=16),
    tuning=SearchTuning(exact_max_rows=0, min_ann_share=0.0),  # always the graph
    wal_fsync=False,
)


def test_the_graph_is_asked_directly_only_while_nothing_in_it_is_superseded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unfiltered read of a one-tenant graph segment skips the mask and takes
    the graph's top k as they come. Once a commit supersedes rows of it — several
    versions of one document in one commit, late versions, deletes of strangers,
    updates of the very rows the queries found — the latest read must mask them,
    and a reader still holding the earlier manifest must go on seeing them."""
    import streamrag.index.search as search

    w = _World(GRAPH_SPEC)
    w.commit([("default", f"d{i}", Op.UPSERT, 1_000 + i) for i in range(DOCS)])
    w.index.seal_all()
    w.index.compact(force=True)
    segs = [v.segment for v in w.index.pin().views if v.rows]
    assert len(segs) == 1
    assert segs[0].ann is not None, "no graph was built: this tests nothing"
    rng = np.random.default_rng(21)
    queries = np.stack([_vec(rng) for _ in range(6)])
    flt = SearchFilter()
    before = w.index.pin()
    want_before = [w.brute(q, 5, flt) for q in queries]

    def no_widening(*args: object, **kwargs: object) -> None:
        raise AssertionError("the direct read should have answered")

    with monkeypatch.context() as mp:
        mp.setattr(search, "_ann", no_widening)
        _, hits = w.index.search_many(queries, 5, flt)
        # The graph is handed the query block's pointer: any layout is made
        # contiguous float32 first, and answers alike.
        wide = np.zeros((2 * queries.shape[0], queries.shape[1]), np.float32)
        wide[::2] = queries
        for layout in (wide[::2], np.asfortranarray(queries), queries.astype(np.float64)):
            _, again = w.index.search_many(layout, 5, flt)  # type: ignore[arg-type]
            assert [h.chunk_ids.tolist() for h in again] == want_before
    assert [h.chunk_ids.tolist() for h in hits] == want_before

    # Update the documents the queries found (their rows in the graph are now
    # superseded), with several versions in one commit and late ones.
    found = sorted({int(c) for ids in want_before for c in ids})
    by_cid = {cid: doc for (_, doc), (cid, *_rest) in w.state.items()}
    batch = []
    for cid in found:
        doc = by_cid[cid]
        t = w.newest[("default", doc)][0]
        batch += [
            ("default", doc, Op.UPSERT, t + 20),
            ("default", doc, Op.UPSERT, t + 10),  # older than the one before it
            ("default", doc, Op.UPSERT, t - 500),  # late: history, never current
        ]
    batch += [("default", "d7", Op.DELETE, 9_000), ("default", "d999", Op.DELETE, 1)]
    w.commit(batch)
    assert segs[0].stamped > 0, "nothing in the graph superseded: this tests nothing"
    _, hits = w.index.search_many(queries, 5, flt)
    assert [h.chunk_ids.tolist() for h in hits] == [w.brute(q, 5, flt) for q in queries]
    # The earlier manifest reads its own epoch: the rows superseded since are its answer.
    _, hits = w.index.search_many(queries, 5, flt, manifest=before)
    assert [h.chunk_ids.tolist() for h in hits] == want_before
