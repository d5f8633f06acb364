"""Snapshot isolation: readers querying while a writer commits see exactly one epoch each."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import Hits, LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.compaction import CompactionSpec
from streamrag.index.scan_helpers import scan_helpers
from streamrag.index.search import SearchTuning

from .reference import Change, Reference, as_keys, make_batch, unit

DIM = 8
EPOCHS = 120
READERS = 3
SIZES = (1, 2, 4)  # queries per call, by reader


# The default tuning; and one where every exact scan is split over helper threads
# and sealed segments are searched through half-precision copies (scan_helpers).
SPLIT = SearchTuning(
    scan_threads=4, split_min_rows=1, half_min_rows=1, half_min_bytes=0, half_max_queries=6
)


@pytest.mark.parametrize(
    ("tuning", "seal_rows"),
    [(SearchTuning(), 4), (SPLIT, 4), (SPLIT, 256)],
    # growing: the growing segment lives for many epochs, its copy replaced under the readers
    ids=["default", "split", "growing"],
)
def test_every_result_is_that_of_one_committed_epoch(tuning: SearchTuning, seal_rows: int) -> None:
    spec = LsmSpec(
        seal_rows=seal_rows,
        ann=AnnSpec(min_rows=2**62),
        compaction=CompactionSpec(fanout=2, seal_rows=seal_rows),
        tuning=tuning,
    )
    helpers = scan_helpers(4)
    borrowed = helpers.borrowed
    # The maintenance thread seals, merges and swaps segments under the readers too.
    index = LsmIndex(DIM, spec, background=True)
    ref = Reference(DIM, retention=spec.retention_us)
    queries = np.stack([unit(10_000 + i, DIM) for i in range(4)])
    flt = SearchFilter()
    expected: dict[int, list[list[tuple]]] = {0: [[] for _ in queries]}  # type: ignore[type-arg]
    seen: list[list[tuple[int, list[Hits]]]] = [[] for _ in range(READERS)]
    lazy: list[tuple[list[Hits], list[list[int]]]] = []
    start = threading.Barrier(READERS + 1)
    done = threading.Event()

    def reader(slot: int) -> None:
        # One, two and four queries per call: a product per query, and one matrix product.
        batch = queries[: SIZES[slot]]
        start.wait()
        while not done.is_set():
            epoch, hits = index.search_many(batch, 5, flt)
            # The chunk ids now, from the columns; the hits themselves only after every
            # later commit and merge (they are built on first read, from rows never rewritten).
            lazy.append((hits, [h.chunk_ids.tolist() for h in hits]))
            seen[slot].append((epoch, hits))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    rng = np.random.default_rng(3)
    seed = 0
    start.wait()
    try:
        for e in range(1, EPOCHS + 1):
            changes = []
            for j, doc in enumerate(rng.choice(12, size=3, replace=False).tolist()):
                op = Op.DELETE if rng.random() < 0.2 else Op.UPSERT
                seeds = []
                for _ in range(int(rng.integers(1, 4)) if op == Op.UPSERT else 0):
                    seed += 1
                    seeds.append(seed)
                changes.append(
                    Change(f"d{doc}", op, int(rng.integers(0, 1000)), e * 10 + j, tuple(seeds))
                )
            # The reference's answer for epoch e is recorded before the index publishes it.
            ref.commit(changes)
            expected[e] = [
                [(t, d, p, ep, s) for t, d, p, ep, s in ref.search(q, 5, flt)[1]] for q in queries
            ]
            index.commit(make_batch(changes, DIM))
    finally:
        done.set()
        for t in threads:
            t.join()
        index.close()
    for hits, ids in lazy:
        assert [[h.chunk_id for h in q] for q in hits] == ids
    checked = 0
    for results in seen:
        for epoch, lazy_hits in results:
            hits = [as_keys(h) for h in lazy_hits]
            want = expected[epoch]
            for got_q, want_q in zip(hits, want[: len(hits)], strict=True):
                assert [g[:4] for g in got_q] == [w[:4] for w in want_q], epoch
                assert np.allclose([g[4] for g in got_q], [w[4] for w in want_q], atol=1e-5)
            checked += 1
    epochs_seen = {e for results in seen for e, _ in results}
    assert checked > 0
    assert len(epochs_seen) > 1  # the readers really ran while epochs changed
    if tuning is SPLIT:
        assert helpers.borrowed > borrowed, "no scan was split: this tests nothing"
    if seal_rows > 4:
        growing = [v.segment for v in index.pin().views if not v.segment.sealed]
        assert growing, "nothing left growing: this tests nothing"
        assert all(s.half is not None and 0 < s.half.rows <= s.n for s in growing)
