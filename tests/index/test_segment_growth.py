"""Segments are sized by rows, not by days, and allocate as their rows arrive."""

from __future__ import annotations

import numpy as np

from streamrag.changes import Op
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec

from .reference import Change, as_keys, make_batch, unit

DIM = 32
DAY = 86_400_000_000


def test_a_thousand_sparse_days_share_segments_sized_by_rows() -> None:
    """A thousand days of a few changes each: segments follow the rows, not the days."""
    spec = LsmSpec(seal_rows=256, ann=AnnSpec(min_rows=2**62))
    index = LsmIndex(DIM, spec, background=False)
    for start in range(0, 1000, 100):
        index.commit(
            make_batch(
                [Change(f"d{i}", Op.UPSERT, i * DAY, i, (i,)) for i in range(start, start + 100)],
                DIM,
            )
        )
    segments = [v.segment for v in index.pin().views]
    assert len(segments) == 4  # 1000 rows in segments of 256, not one per day
    assert sum(s.n for s in segments) == 1000
    # Each covers a narrow span of event time, so a one-day range reads one segment.
    spans = sorted((s.min_valid_from // DAY, s.max_valid_from // DAY) for s in segments)
    assert spans == [(0, 255), (256, 511), (512, 767), (768, 999)]
    index.close()


def test_a_segment_keeps_its_rows_as_it_grows() -> None:
    spec = LsmSpec(seal_rows=2000, ann=AnnSpec(min_rows=2**62))
    index = LsmIndex(DIM, spec, background=False)
    pinned = []
    for block in range(6):  # 6 × 200 rows: grows 256 → 512 → 1024 → 2000
        changes = [
            Change(f"d{block}-{i}", Op.UPSERT, 1_000 + block, block * 200 + i, (block * 200 + i,))
            for i in range(200)
        ]
        index.commit(make_batch(changes, DIM))
        pinned.append(index.pin())
    [view] = index.pin().views
    assert view.segment.alloc >= 1200
    q = np.stack([unit(5, DIM), unit(1_111, DIM)])
    for man in pinned:  # every pinned epoch still reads exactly its rows
        _, hits = index.search_many(q, 3, SearchFilter(), manifest=man)
        assert as_keys(hits[0])[0][1] == "d0-5"
        if man.epoch >= 6:
            assert as_keys(hits[1])[0][1] == "d5-111"
        else:
            assert all(h[1] != "d5-111" for h in as_keys(hits[1]))
    index.close()
