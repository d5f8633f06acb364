"""How many queries a call are worth scanning through half-precision copies, on this CPU.

An exact scan can read a segment two ways (:mod:`.search`): through its
half-precision copy (:mod:`.half`), which reads half the bytes but reads them
once *per query* and then proves and re-scores each query's candidates, or as
one float32 matrix product (:mod:`.scores`), which reads the rows once *per
call* for all its queries. A lone query gains from the copy where the scan is
bound by memory bandwidth; a batch gains from the matrix product. Where the
two cross depends on the CPU's SIMD units, caches and memory, so it is
measured, not assumed:

- on a 2-core AMD EPYC host (32 MiB L3) the copies won up to six queries a
  call, the fixed limit streamrag used before
  (:data:`~.search.DEFAULT_HALF_QUERIES`); this measurement gave 6 there
  too (2026-12-07, three runs: the copies' time 0.42–0.45 of float32's at
  one query, 0.85–0.86 at six, 1.14–1.15 at eight);
- on a 2-core Intel Xeon host with a large cache (2026-12-07), over the
  21,200 rows of the bench workload in process (20,000 documents: two sealed
  segments and the growing one, both threads): 4 queries 0.62 ms a query
  through the copies against 0.41 in float32, 2 queries 0.84–0.91 against
  0.82–0.86, one query 1.05 against 1.07–1.11.

:func:`measure_half_limit` runs the search itself (:func:`~.search.search_segments`,
with the index's own tuning and threads) over synthetic sealed segments of the
index's segment size, 32 MiB of float32 rows in all (past the last-level
cache of most CPUs, as an index is once copies are made: they start at 16
MiB), both ways for each batch size, best of several alternated tries, and
takes the largest size up to which the copies were faster at every size.
Where none was, no copy is made at all (they would cost half as much memory
again for nothing). It runs once per process and width, in the index's
maintenance thread before the first copy is made (0.2–0.7 s of one core
here; the process's peak memory grows by up to ~70 MB for the while: the
synthetic rows, their copies and the segments' columns), never on a
query's path. Measured under whatever else the process does then (a bulk load,
often): on the Intel host above it gave 0 or 1, the sizes where the two ways
tie. ``index.half_max_queries`` sets the limit instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import numpy.typing as npt

from streamrag.index.half import HalfScan
from streamrag.index.search import (
    SearchTuning,
    View,
    half_query_limit,
    search_segments,
    set_half_query_limit,
)
from streamrag.index.segment import NEVER, ReadSpec, Rows, Segment

__all__ = ["measure_half_limit"]

log = logging.getLogger("streamrag.index")

F32 = npt.NDArray[np.float32]

_SIZES = (1, 2, 3, 4, 5, 6, 8)
"""Batch sizes tried, in order; the limit is the last of a run of sizes the copies win."""

_BYTES = 32 << 20
"""Float32 rows searched: past the caches, as the rows are once copies are worth making."""

_MIN_ROWS = 1024
_MAX_SEGMENTS = 16
"""Bounds on the synthetic segments (narrow rows or tiny ``seal_rows`` stay cheap to time)."""

_TRIES = 5
_K = 10
_TENANT = "t"

_measured: set[int] = set()
_measuring = threading.Lock()


def measure_half_limit(dim: int, segment_rows: int, tuning: SearchTuning) -> int:
    """Measure the limit for ``dim``-wide rows once in this process (see the module); return it.

    ``segment_rows``: the rows of a sealed segment (``seal_rows``); ``tuning``:
    the index's (its scan threads), whose ``half_max_queries`` is varied.
    """
    with _measuring:
        if dim not in _measured:
            started = time.perf_counter()
            limit, ratios = _measure(dim, segment_rows, tuning)
            set_half_query_limit(dim, limit)
            _measured.add(dim)
            log.info(
                "half-precision copies answer up to %d queries a call on this CPU "
                "(measured in %.0f ms; time through the copies / in float32, by queries: %s)",
                limit,
                (time.perf_counter() - started) * 1000,
                ratios,
            )
    return half_query_limit(dim)


def _measure(dim: int, segment_rows: int, tuning: SearchTuning) -> tuple[int, dict[int, float]]:
    """The limit, and the copies' time over float32's at each size tried."""
    per = max(_MIN_ROWS, min(segment_rows, _BYTES // (4 * dim)))
    count = min(_MAX_SEGMENTS, max(1, -(-_BYTES // (4 * dim * per))))
    rng = np.random.default_rng(0)
    views: list[View] = []
    for i in range(count):
        seg = _sealed_segment(i + 1, rng, per, dim, first_rid=i * per)
        if seg.half is None:
            return 0, {}
        views.append(View(seg, per))
    # Queries near stored rows, as real ones are: the copies' candidate lists then prove.
    picked = views[0].segment.vectors[rng.choice(per, max(_SIZES), replace=False)]
    queries = _unit(picked + 0.1 * rng.standard_normal(picked.shape, dtype=np.float32) / dim**0.5)
    spec = ReadSpec(epoch=1, as_of=NEVER, tenant=_TENANT)

    def search(q: F32, limit: int) -> Callable[[], object]:
        return partial(
            search_segments, views, q, _K, spec, 1, replace(tuning, half_max_queries=limit)
        )

    limit = 0
    ratios: dict[int, float] = {}
    for m in _SIZES:
        q = queries[:m]
        half, full = _best_of(search(q, m), search(q, 0))
        ratios[m] = round(half / full, 2)
        if half >= full:
            break
        limit = m
    return limit, ratios


def _unit(x: F32) -> F32:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> F32:
    rows = rng.standard_normal((n, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)  # in place: one block at a time
    return rows


def _sealed_segment(
    seg_id: int, rng: np.random.Generator, n: int, dim: int, first_rid: int
) -> Segment:
    """A sealed segment of ``n`` random unit rows, one version each, with its half-precision copy.

    The rows are made here and let go once the segment holds its copy of them,
    before the half-precision copy is made: one block less at the peak.
    """
    vectors = _unit_rows(rng, n, dim)
    ids = np.arange(first_rid, first_rid + n, dtype=np.int64)
    ones = np.ones(n, dtype=np.int64)
    never = np.full(n, NEVER, dtype=np.int64)
    rows = Rows(
        vectors=vectors,
        rids=ids,
        chunk_ids=ids,
        positions=np.zeros(n, dtype=np.int32),
        valid_from=np.zeros(n, dtype=np.int64),
        offsets=ids,
        created=ones,
        committed=ones,
        sup=never,
        valid_to=never,
        dead=never,  # the segment copies every column
        tenants=[_TENANT] * n,
        doc_ids=[str(i) for i in ids.tolist()],
        domains=[""] * n,
        sources=[""] * n,
        embedders=[""] * n,
        texts=[""] * n,
        hashes=[b""] * n,
        metadata=[None] * n,
    )
    seg = Segment.from_rows(seg_id, rows, sealed=True)
    del rows, vectors
    seg.half = HalfScan.build(seg.vectors[:n])
    return seg


def _best_of(a: Callable[[], object], b: Callable[[], object]) -> tuple[float, float]:
    """The fastest of :data:`_TRIES` timings of each, taken in turns (load falls on both)."""
    best = [float("inf"), float("inf")]
    for _ in range(_TRIES):
        for which, fn in enumerate((a, b)):
            started = time.perf_counter()
            fn()
            best[which] = min(best[which], time.perf_counter() - started)
    return best[0], best[1]
