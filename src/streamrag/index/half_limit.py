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
maintenance thread (0.2–0.7 s of one core here; the process's peak memory
grows by up to ~70 MB for the while: the synthetic rows, their copies and
the segments' columns), never on a query's path, so a process pays it even
if its index never grows to a copy. ``index.half_max_queries`` sets the
limit instead.

It times the search where the process does nothing else (:class:`Quiet`): it
waits for a spell of :data:`QUIET_S` with no query, no commit, no read of the
input (:func:`note_read`) and the process's other threads below
:data:`OTHERS_SHARE` of a core, then times back to back until one of those
comes; a timing that one overlapped — or in which the other threads, its own
scan helpers aside, used more than that share — is taken again after the
next quiet spell. An attempt that finds no quiet spell within
:data:`WAIT_BUDGET_S` is postponed (:class:`MeasurementPostponed`), and the
copies use :data:`~.search.DEFAULT_HALF_QUERIES` until the measurement is
done. The index's maintenance thread makes an attempt in each step with
nothing else to do, so it is measured as the process starts, or once a bulk
load and the maintenance it left are done. Not in one burst when the first
copy is due — the end of a bulk load, when the first queries come: measured
so, on the AMD host above (2026-12-07), in freshness probes like the peer
benchmark's right after 20,000 documents, the first four probes took 14–41 ms
where the rest took 10–12, and they set the p99 of 100 (py-spy: the
maintenance thread spent 65 % of that second timing these searches, and the
checkpoint of the segments sealed during the load waited for it). Measured at
start, in the peer benchmark's own runs (eight alternated rounds, the same
host): freshness p99 median 16.4 ms against 21.9
(``benchmarks/results/freshness-half-limit/``). And never over a bulk load: a
quiet spell counted by queries and commits alone, as it first was, came
between a bulk load's commits (every ~30 ms, with reading, decoding and
chunking in between), and the limit measured so was 1 (the copies' time over
float32's 0.65 at one query) where the same process, measuring once the load
was done, gives 3 (0.76 at one query, 1.06 at four; AMD host, 2026-12-08) — in
that `make bench` the default index answered a lone query in 1.76 ms against
1.45 for exact search over the same 20,000 documents, where it had been 1.59
times faster.
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
from streamrag.index.scan_helpers import ScanHelpers
from streamrag.index.search import (
    SearchTuning,
    View,
    half_query_limit,
    search_segments,
    set_half_query_limit,
)
from streamrag.index.segment import NEVER, ReadSpec, Rows, Segment

__all__ = [
    "QUIET_S",
    "WAIT_BUDGET_S",
    "MeasurementCancelled",
    "MeasurementPostponed",
    "Quiet",
    "measure_half_limit",
    "measured_half_limit",
    "note_read",
    "others_cpu_s",
    "reads",
]

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

QUIET_S = 0.02
"""A spell with no query, no commit and idle threads, waited for before timing.

Longer than the gap between a client's queries while it waits for a write to
show (a few milliseconds of polling), shorter than most gaps between bursts.
"""

OTHERS_SHARE = 0.2
"""The most of one core the process's other threads may use in a spell that counts as quiet.

A bulk load commits every few tens of milliseconds and reads, decodes and
chunks in between: the gaps between its commits are not quiet, its CPU says so.
"""

WAIT_BUDGET_S = 1.0
"""The most one attempt at the measurement waits for quiet spells, in all; past it, it
is postponed to a later maintenance step (:class:`MeasurementPostponed`)."""

_RETAKES = 2 * len(_SIZES) * _TRIES
"""Timings overlapped by a query or commit taken again, at most, in one attempt."""

_measured: set[int] = set()
_measuring = threading.Lock()


_READS = [0]


def note_read() -> None:
    """Say that the process read input (a pipeline's poll found changes): it is not quiet.

    A bulk load reads, decodes and chunks for a while before its first commit;
    a measurement that saw only queries and commits would time over it.
    """
    _READS[0] += 1


def reads() -> int:
    """How many times :func:`note_read` was called (only its changes mean anything)."""
    return _READS[0]


class MeasurementCancelled(Exception):
    """The index closed while the measurement waited: nothing was measured."""


class MeasurementPostponed(Exception):
    """No quiet spell came within the attempt's budget: nothing was measured, try later."""


def others_cpu_s(helpers: ScanHelpers | None = None) -> float:
    """CPU seconds the process's threads have used so far, but this one and ``helpers``.

    ``helpers``: the scan helpers a measurement's searches borrow (their work is
    the measurement's own).
    """
    own = time.thread_time() + (helpers.cpu_s() if helpers is not None else 0.0)
    return time.process_time() - own


class Quiet:
    """Puts a measurement's timings where the process does nothing else.

    ``busy()`` says whether a query, a commit or a read came since it was last asked
    (:meth:`~.lsm_maintenance.LsmMaintenance._in_use`); ``pause(seconds)``
    sleeps that long, or less (woken by a commit, or by closing);
    ``closing()`` says whether the index is closing; ``clock`` is monotonic
    seconds; ``others_cpu()`` the CPU seconds the process's other threads have
    used so far; ``budget_s`` defaults to :data:`WAIT_BUDGET_S`. All are
    injected (tests script them).
    """

    __slots__ = (
        "_budget",
        "_busy",
        "_clock",
        "_closing",
        "_mark",
        "_others_cpu",
        "_pause",
        "_timing",
        "retaken",
        "waited_s",
    )

    def __init__(
        self,
        busy: Callable[[], bool],
        pause: Callable[[float], object],
        closing: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        budget_s: float | None = None,
        others_cpu: Callable[[], float] = others_cpu_s,
    ) -> None:
        self._busy, self._pause, self._closing, self._clock = busy, pause, closing, clock
        self._others_cpu = others_cpu
        self._budget = WAIT_BUDGET_S if budget_s is None else budget_s
        self._timing = False  # a quiet spell was found and nothing came since
        self._mark = (0.0, 0.0)  # (clock, others_cpu) when wait() last returned
        self.waited_s = 0.0
        """Seconds spent waiting for quiet spells so far."""
        self.retaken = 0
        """Timings taken again because a query or commit overlapped them."""

    def wait(self) -> None:
        """Return once the process is quiet: at once while nothing came since the last timing.

        The first call, and every call after something came (``busy()``), waits
        for a spell of :data:`QUIET_S` in which nothing came and the process's
        other threads used less than :data:`OTHERS_SHARE` of a core. So a quiet process is timed
        back to back, as in one burst, and one that answers queries between
        them. Raises :class:`MeasurementCancelled` once the index is closing, and
        :class:`MeasurementPostponed` when the budget is spent without a quiet
        spell: a timing under load would measure the load.
        """
        if self._closing():
            raise MeasurementCancelled
        if self._timing and not self._busy():
            self._mark = (self._clock(), self._others_cpu())
            return
        self._timing = False
        while self.waited_s < self._budget:
            started, cpu = self._clock(), self._others_cpu()
            self._pause(min(QUIET_S, self._budget - self.waited_s))
            took = self._clock() - started
            self.waited_s += took
            if self._closing():
                raise MeasurementCancelled
            now_cpu = self._others_cpu()
            if not self._busy() and took >= QUIET_S and now_cpu - cpu <= OTHERS_SHARE * took:
                self._timing = True
                self._mark = (self._clock(), now_cpu)
                return
        raise MeasurementPostponed

    def overlapped(self) -> bool:
        """Whether something else ran since :meth:`wait` returned (then time again).

        A query or a commit came, or the process's other threads used more than
        :data:`OTHERS_SHARE` of a core meanwhile (a load that reads before its
        first commit). Raises :class:`MeasurementPostponed` once
        :data:`_RETAKES` timings were taken again.
        """
        since, cpu = self._mark
        took = self._clock() - since
        came = self._busy()
        if not came and self._others_cpu() - cpu <= OTHERS_SHARE * took:
            return False
        self._timing = False
        self.retaken += 1
        if self.retaken > _RETAKES:
            raise MeasurementPostponed
        return True


def measured_half_limit(dim: int) -> int | None:
    """The limit measured for ``dim``-wide rows in this process; None before it is."""
    return half_query_limit(dim) if dim in _measured else None


def measure_half_limit(
    dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None = None
) -> int:
    """Measure the limit for ``dim``-wide rows once in this process (see the module); return it.

    ``segment_rows``: the rows of a sealed segment (``seal_rows``); ``tuning``:
    the index's (its scan threads), whose ``half_max_queries`` is varied;
    ``quiet``: when to time (None: at once, back to back). Raises
    :class:`MeasurementCancelled` if the index closes while it waits, and
    :class:`MeasurementPostponed` if no quiet spell came within its budget;
    the limit is then measured by a later call.
    """
    with _measuring:
        if dim not in _measured:
            started = time.perf_counter()
            limit, ratios = _measure(dim, segment_rows, tuning, quiet)
            set_half_query_limit(dim, limit)
            _measured.add(dim)
            log.info(
                "half-precision copies answer up to %d queries a call on this CPU "
                "(measured in %.0f ms, %.0f of them waiting for quiet spells, %d timings "
                "taken again; time through the copies / in float32, by queries: %s)",
                limit,
                (time.perf_counter() - started) * 1000,
                0.0 if quiet is None else quiet.waited_s * 1000,
                0 if quiet is None else quiet.retaken,
                ratios,
            )
    return half_query_limit(dim)


def _measure(
    dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None = None
) -> tuple[int, dict[int, float]]:
    """The limit, and the copies' time over float32's at each size tried."""
    per = max(_MIN_ROWS, min(segment_rows, _BYTES // (4 * dim)))
    count = min(_MAX_SEGMENTS, max(1, -(-_BYTES // (4 * dim * per))))
    rng = np.random.default_rng(0)
    views: list[View] = []
    for i in range(count):
        if quiet is not None:
            quiet.wait()
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
        half, full = _best_of(search(q, m), search(q, 0), quiet)
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


def _best_of(
    a: Callable[[], object], b: Callable[[], object], quiet: Quiet | None = None
) -> tuple[float, float]:
    """The fastest of :data:`_TRIES` timings of each, taken in turns (load falls on both).

    With ``quiet``, each timing waits for a quiet spell and is taken again if a
    query or commit came while it ran.
    """
    best = [float("inf"), float("inf")]
    for _ in range(_TRIES):
        for which, fn in enumerate((a, b)):
            while True:
                if quiet is not None:
                    quiet.wait()
                started = time.perf_counter()
                fn()
                took = time.perf_counter() - started
                if quiet is None or not quiet.overlapped():
                    break
            best[which] = min(best[which], took)
    return best[0], best[1]
