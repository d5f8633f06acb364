"""Searching one pinned manifest: prune, pre-filter, score, merge.

A query runs against the segments of the manifest it pinned, each in three steps:

1. **Prune** whole segments from their bounds alone: the range of event times
   it holds (``time_range``, ``as_of``), the epochs it was committed in
   (``epoch``), the tenants it contains, and how much of it is history: a
   segment whose every row had ended by the epoch read (and, for ``as_of`` T,
   ended at or before T) holds nothing that read can see. So a query for one day
   of a ten-year index scans the segments around that day, and a query of the
   current documents skips segments that hold only superseded versions.
2. **Pre-filter** the rows of each remaining segment in columns
   (:meth:`~streamrag.index.segment.Segment.mask`): version, tenant, domains,
   doc ids, time range and metadata.
3. **Score**. A growing segment, a sealed one without an ANN structure, or a
   segment where few rows pass the filter is scanned exactly (one matrix
   product over the matching rows); a segment with a half-precision copy
   (:mod:`.half`) is scanned through it for up to six queries, still
   exactly, at half the bytes read (the growing segment's copy holds its
   first rows; those appended since are scanned in float32). Otherwise the
   ANN structure is asked for enough candidates that ``k`` of them should pass
   the filter given the share of rows that pass it; candidates are re-scored
   exactly against the stored vectors, and a query left with fewer than ``k``
   asks again for four times as many until the segment is exhausted (then it
   is scanned exactly). So a filter never silently returns fewer than ``k``
   results when ``k`` rows match.

Every exactly scanned segment writes its scores into one shared row per query
(:class:`_Scan`), masked rows set to ``-inf``, and one selection picks the
top ``k`` over all of them: a query pays one partial sort, not one per segment
plus a merge. ANN segments' top-``k`` lists are merged with that by score.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from streamrag.index.half import HalfScan
from streamrag.index.hits import Hits, HitTable
from streamrag.index.scan_helpers import ScanHelpers, scan_helpers
from streamrag.index.scores import score_rows
from streamrag.index.segment import NEVER, ReadSpec, Segment
from streamrag.index.topk import top_k

__all__ = [
    "DEFAULT_HALF_QUERIES",
    "SearchTuning",
    "View",
    "half_query_limit",
    "search_segments",
    "set_half_query_limit",
]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SearchTuning:
    """When a segment is scanned exactly, and when through a half-precision copy.

    An ANN segment where few rows match is scanned exactly instead; a sealed
    segment scanned exactly is read through its copy (:mod:`.half`).
    """

    exact_max_rows: int = 4096
    min_ann_share: float = 0.02
    # Smaller sealed segments get no copy (3 MB stays cached); the growing segment gets
    # one each time this many of its rows lack one.
    half_min_rows: int = 2048
    # Nor does any segment while all exactly scanned vectors together are smaller:
    # a scan that stays in the CPU's cache gains nothing from reading half the bytes.
    half_min_bytes: int = 16 << 20
    # More per call: the float32 matrix product is as fast (it reads the rows once for
    # all queries; the copy's scan reads them once a query). None: as measured on this
    # CPU (:mod:`.half_limit`).
    half_max_queries: int | None = None
    # Threads one exact scan may split across while they are idle (0: every CPU of
    # the process; 1: never split), each range at least ``split_min_rows`` wide.
    scan_threads: int = 0
    split_min_rows: int = 4096

    def helpers(self) -> ScanHelpers | None:
        """The process's scan helpers for this tuning (:mod:`.scan_helpers`); None: scan alone."""
        return None if self.scan_threads == 1 else scan_helpers(self.scan_threads)


DEFAULT_HALF_QUERIES = 6
"""Queries a call through the half-precision copies until this process measured its own."""

_half_limits: dict[int, int] = {}


def half_query_limit(dim: int) -> int:
    """Most queries a call scans through the copies, for ``dim``-wide rows.

    As measured on this CPU (:mod:`.half_limit`, once per process and width),
    :data:`DEFAULT_HALF_QUERIES` until then.
    """
    return _half_limits.get(dim, DEFAULT_HALF_QUERIES)


def set_half_query_limit(dim: int, limit: int) -> None:
    """Record the limit measured for ``dim``-wide rows (:mod:`.half_limit`)."""
    _half_limits[dim] = limit


@dataclass(frozen=True, slots=True)
class View:
    """A segment as a manifest pins it: its first ``rows`` rows."""

    segment: Segment
    rows: int


def search_segments(
    views: Sequence[View],
    queries: F32,
    k: int,
    spec: ReadSpec,
    latest_epoch: int,
    tuning: SearchTuning,
) -> list[Hits]:
    """Top-``k`` hits per query over the pinned views, as columns (:mod:`.hits`)."""
    m = queries.shape[0]
    parts: list[_Found] = []
    scan = _Scan()
    # The latest epoch as it is now, no filter beyond the tenant: a segment's
    # visible rows then follow from its counts, without a mask.
    plain = not spec.narrows and spec.as_of == NEVER
    latest = plain and spec.epoch == latest_epoch
    for view in views:
        seg, n = view.segment, view.rows
        if n == 0 or _pruned(seg, spec):
            continue
        found = _search_one(seg, n, queries, k, spec, plain, latest, tuning, scan)
        if found is not None:
            parts.append(found)
    if scan.parts or scan.halves:
        parts.extend(scan.run(queries, k, tuning))
    if not parts:
        return [Hits.of([]) for _ in range(m)]
    if len(parts) == 1 and parts[0].ordered:
        # One list whose candidates came back best first: nothing to merge.
        only = parts[0]
        if only.which is None:
            return HitTable([only.segment], None, only.rows, only.scores).split()
        segs, which = only.sources()
        return HitTable(segs, which, only.rows, only.scores).split()
    segs = []
    whiches: list[I64] = []
    for f in parts:
        own, w = f.sources()
        whiches.append(w + len(segs))
        segs.extend(own)
    scores = np.hstack([f.scores for f in parts]) if len(parts) > 1 else parts[0].scores
    local = np.hstack([f.rows for f in parts]) if len(parts) > 1 else parts[0].rows
    which = np.hstack(whiches) if len(parts) > 1 else whiches[0]
    kk = min(k, scores.shape[1])
    if kk < scores.shape[1]:
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        scores = np.take_along_axis(scores, top, axis=1)
        local = np.take_along_axis(local, top, axis=1)
        which = np.take_along_axis(which, top, axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")
    return HitTable(
        segs,
        np.take_along_axis(which, order, axis=1),
        np.take_along_axis(local, order, axis=1),
        np.take_along_axis(scores, order, axis=1),
    ).split()


@dataclass(slots=True)
class _Found:
    """Candidates: (queries × up to k) rows and scores, -inf where none.

    From one ``segment``, or (``which`` set) from several: ``which`` numbers
    each candidate's segment in ``segments``.
    """

    segment: Segment
    scores: F32
    rows: I64
    ordered: bool = False  # best first in every row, -inf entries last
    which: I64 | None = None
    segments: list[Segment] | None = None

    def sources(self) -> tuple[list[Segment], I64]:
        """The segments the candidates come from, and each candidate's number in that list."""
        if self.which is None or self.segments is None:
            return [self.segment], np.zeros(self.rows.shape, dtype=np.int64)
        return self.segments, self.which


@dataclass(slots=True)
class _Part:
    """One segment's share of an exact scan: the rows it scores, and which of them count.

    ``rows`` set: those rows, gathered (a selective filter). Otherwise the run
    ``[lo, hi)``, with ``keep`` (over that run) saying which rows count; None:
    every one.
    """

    segment: Segment
    lo: int
    hi: int
    rows: I64 | None
    keep: npt.NDArray[np.bool_] | None

    @property
    def width(self) -> int:
        return self.hi - self.lo if self.rows is None else int(self.rows.size)


@dataclass(slots=True)
class _Half:
    """A segment's first ``rows`` rows scanned through its half-precision copy (:mod:`.half`).

    The copy of a sealed segment holds all of its rows; that of the growing
    segment the rows it had when the copy was made (its later rows are scanned
    in float32).
    """

    segment: Segment
    copy: HalfScan
    rows: int
    mask: npt.NDArray[np.bool_] | None
    matching: int
    found: _Found | None = None
    proven: bool = True  # False: the copy could not prove its list; scan the float32 rows

    def search(self, q: F32, k: int) -> None:
        seg = self.segment
        got = self.copy.search(seg.vectors, q, k, self.mask, self.matching)
        if got is None:
            self.proven = False
            return
        rows, scores = got
        self.found = _Found(seg, scores, rows, ordered=True)


class _Scan:
    """The exactly scanned segments of one search, scored into one row per query.

    Each part writes its scores into its columns of one ``(queries × columns)``
    array, rows the filter rejects set to ``-inf``; :meth:`top` then selects
    the best ``k`` of every query once, over all parts. Scoring several
    segments this way costs what scoring one segment of their total size costs.
    Sealed segments with a half-precision copy are searched through it, each
    on its own (:meth:`add_half`).

    :meth:`run` does all of it as tasks — each half-precision search, and the
    float32 columns cut into ranges — that idle cores share
    (:mod:`.scan_helpers`) when there is enough of it.
    """

    __slots__ = ("halves", "parts")

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self.halves: list[_Half] = []

    def add_half(
        self,
        seg: Segment,
        n: int,
        q: F32,
        mask: npt.NDArray[np.bool_] | None,
        tuning: SearchTuning,
    ) -> bool:
        """Search the segment through its half-precision copy; False: scan its float32 rows.

        Used for a few queries at a time over most of the segment's rows: a
        filter that admits under half of them is cheaper to score in float32 (a
        slice or a gather of just those rows), and a batch of more than
        ``tuning.half_max_queries`` in one float32 matrix product. A copy of
        the growing segment covers its first rows: the rows appended since are
        added to the float32 scan. (Without a set limit, the one measured on
        this CPU: :mod:`.half_limit`.)
        """
        copy = seg.half  # read once: maintenance may replace the growing segment's copy
        if copy is None or copy.rows > n:
            return False
        limit = tuning.half_max_queries
        if q.shape[0] > (half_query_limit(q.shape[1]) if limit is None else limit):
            return False
        covered = copy.rows
        head = None if mask is None else mask[:covered]
        matching = covered if head is None else int(np.count_nonzero(head))
        if matching * 2 < covered:
            return False
        self.halves.append(_Half(seg, copy, covered, head, matching))
        if covered < n:
            self.add(seg, n, mask, covered)
        return True

    def run(self, q: F32, k: int, tuning: SearchTuning) -> list[_Found]:
        """Every half-precision search and the float32 scan; what they found.

        A copy that cannot prove its list (many equal vectors near the top) has
        its segment's float32 rows scanned afterwards, so the answer is the
        same either way.
        """
        work = sum(h.rows for h in self.halves) + sum(p.width for p in self.parts)
        helpers = tuning.helpers() if work >= 2 * tuning.split_min_rows else None
        tasks: list[Callable[[], None]] = [partial(h.search, q, k) for h in self.halves]
        top: Callable[[], _Found] | None = None
        if self.parts:
            pieces = 1 if helpers is None else helpers.helpers + 1
            tasks_of_scan, top = self._begin(q, k, pieces, tuning.split_min_rows)
            tasks += tasks_of_scan
        if helpers is None:
            for task in tasks:
                task()
        else:  # (one task too: a scan under way is counted against the cores)
            helpers.run(tasks)
        out = [h.found for h in self.halves if h.found is not None]
        if top is not None:
            out.append(top())
        unproven = [h for h in self.halves if not h.proven]
        if unproven:
            again = _Scan()
            for h in unproven:
                again.add(h.segment, h.rows, h.mask)
            out.extend(again.run(q, k, tuning))
        return out

    def add(self, seg: Segment, n: int, mask: npt.NDArray[np.bool_] | None, start: int = 0) -> None:
        """Score rows ``[start, n)`` of ``seg`` where ``mask`` admits them (None: all)."""
        if mask is None:
            self.parts.append(_Part(seg, start, n, None, None))
            return
        rows = np.flatnonzero(mask[start:n])
        if rows.size == 0:
            return
        if start:
            rows += start
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        if hi - lo == rows.size:
            # One run (everything, or a time range over a segment in event-time
            # order): score that slice, nothing to mask.
            self.parts.append(_Part(seg, lo, hi, None, None))
        elif hi - lo <= 2 * rows.size:
            self.parts.append(_Part(seg, lo, hi, None, mask[lo:hi]))
        elif rows.size * 4 <= n - start:
            # A selective filter: gather the matching rows and score only those.
            self.parts.append(_Part(seg, 0, 0, rows, None))
        else:
            self.parts.append(_Part(seg, start, n, None, mask[start:n]))

    def _fill(self, q: F32, scores: F32, starts: list[int], lo: int, hi: int) -> None:
        """Score columns ``[lo, hi)`` of ``scores``: the parts' rows that fall in that range."""
        for part, start in zip(self.parts, starts, strict=False):
            a, b = max(lo, start), min(hi, start + part.width)
            if a >= b:
                continue
            out = scores[:, a:b]
            r0, r1 = a - start, b - start  # within the part
            vectors = part.segment.vectors
            if part.rows is not None:
                score_rows(vectors[part.rows[r0:r1]], q, out)
                continue
            score_rows(vectors[part.lo + r0 : part.lo + r1], q, out)
            if part.keep is not None:
                np.copyto(out, -np.inf, where=~part.keep[r0:r1])

    def _begin(
        self, q: F32, k: int, pieces: int, min_piece: int
    ) -> tuple[list[Callable[[], None]], Callable[[], _Found]]:
        """The float32 scan as up to ``pieces`` column ranges of at least ``min_piece``.

        Returns the tasks that score them and the call that then selects the
        best ``k`` rows over every part for each query, best first.
        """
        m = q.shape[0]
        widths = [p.width for p in self.parts]
        starts = np.cumsum([0, *widths])
        total = int(starts[-1])
        scores = np.empty((m, total), dtype=np.float32)
        first = starts.tolist()
        n = max(1, min(pieces, total // max(1, min_piece)))
        bounds = [total * i // n for i in range(n + 1)]
        tasks: list[Callable[[], None]] = [
            partial(self._fill, q, scores, first, bounds[i], bounds[i + 1]) for i in range(n)
        ]
        return tasks, partial(self._top, q, k, scores, starts)

    def top(self, q: F32, k: int) -> _Found:
        """The best ``k`` rows over every part for each query, best first (on this thread)."""
        tasks, finish = self._begin(q, k, 1, 1)
        for task in tasks:
            task()
        return finish()

    def _top(self, q: F32, k: int, scores: F32, starts: I64) -> _Found:
        m = q.shape[0]
        total = scores.shape[1]
        kk = min(k, total)
        if kk < total:
            cols, picked = top_k(scores, kk)  # best first (a heap per query, not a sort)
        else:
            order = np.argsort(-scores, axis=1, kind="stable")
            cols = np.take_along_axis(np.broadcast_to(np.arange(total), (m, total)), order, axis=1)
            picked = np.take_along_axis(scores, order, axis=1)
        which = np.searchsorted(starts, cols, side="right") - 1
        rows = cols - starts[which]
        for g, part in enumerate(self.parts):
            if part.rows is not None:
                sel = which == g
                rows[sel] = part.rows[rows[sel]]
            elif part.lo:
                rows[which == g] += part.lo
        segments = [p.segment for p in self.parts]
        return _Found(segments[0], picked, rows, True, which, segments)


def _pruned(seg: Segment, spec: ReadSpec) -> bool:
    """True when no row of the segment can match, judged from its bounds alone."""
    if seg.min_created > spec.epoch:
        return True
    if spec.as_of != NEVER and seg.min_valid_from > spec.as_of:
        return True
    # Every row has an end by this epoch, and (as of T) before T. The count is
    # read first: the writer updates it after the bounds it is judged with.
    if (
        seg.stamped == seg.n
        and seg.last_stamp <= spec.epoch
        and (spec.as_of == NEVER or seg.max_valid_to <= spec.as_of)
    ):
        return True
    if spec.start_us is not None and seg.max_valid_from < spec.start_us:
        return True
    if spec.end_us is not None and seg.min_valid_from >= spec.end_us:
        return True
    return spec.tenant not in seg.tenant_codes.codes


def _search_one(
    seg: Segment,
    n: int,
    q: F32,
    k: int,
    spec: ReadSpec,
    plain: bool,
    latest: bool,
    tuning: SearchTuning,
    scan: _Scan,
) -> _Found | None:
    """Search one segment: exactly (added to ``scan``; None) or through a structure.

    The structure is the segment's half-precision copy or its ANN; what it
    found is returned. ``plain``: no filter beyond the tenant, no ``as_of``;
    ``latest``: that, at the latest epoch.
    """
    ann = seg.ann if seg.sealed else None
    if ann is None or ann.rows != n:
        if plain and _all_visible(seg, spec):
            exact_mask = None
        else:
            exact_mask = seg.mask(n, spec)
            if exact_mask is None:
                return None
        if not scan.add_half(seg, n, q, exact_mask, tuning):
            scan.add(seg, n, exact_mask)
        return None
    mask = None
    if latest and len(seg.tenant_codes.names) == 1:
        if seg.stamped == 0 and n > tuning.exact_max_rows:
            # The hot path: nothing superseded, one tenant, the latest epoch —
            # every candidate is visible and the graph's scores are exact.
            top = ann.top_k(q, k) if k <= n else None
            if top is not None:
                return _Found(seg, top[1], top[0], ordered=True)
        share = (n - seg.stamped) / n
        matching = n - seg.stamped
    else:
        mask = seg.mask(n, spec)
        if mask is None:
            return None
        matching = int(np.count_nonzero(mask))
        share = matching / n
    if matching == 0:
        return None
    if matching <= tuning.exact_max_rows or share < tuning.min_ann_share:
        if mask is None:
            mask = seg.mask(n, spec)
            if mask is None:
                return None
        scan.add(seg, n, mask)
        return None
    return _ann(seg, n, q, k, spec, mask, share)


def _all_visible(seg: Segment, spec: ReadSpec) -> bool:
    """True when every row of a plain read's segment passes the filter, judged from its bounds.

    The common read (the latest epoch, no narrowing filter, a one-tenant
    segment with nothing superseded) needs no mask at all.
    """
    return (
        seg.stamped == 0
        and seg.max_created <= spec.epoch
        and len(seg.tenant_codes.names) == 1
        and spec.tenant in seg.tenant_codes.codes
    )


def _ann(
    seg: Segment,
    n: int,
    q: F32,
    k: int,
    spec: ReadSpec,
    mask: npt.NDArray[np.bool_] | None,
    share: float,
) -> _Found:
    """ANN candidates, filtered (and re-scored exactly if approximate); widen until ``k`` pass.

    (The unfiltered read of a segment with nothing superseded asks the graph
    once in :func:`_search_one` and comes here only if it found fewer than ``k``.)
    """
    ann = seg.ann
    assert ann is not None
    m = q.shape[0]
    epoch = spec.epoch
    out_s = np.full((m, k), -np.inf, dtype=np.float32)
    out_l = np.zeros((m, k), dtype=np.int64)
    todo = np.arange(m)
    want = min(n, max(k, math.ceil(k / share * 1.25) + 2))
    vectors = seg.vectors
    while todo.size:
        sub = q[todo] if todo.size != m else q
        labels, scores = ann.search(sub, want)
        valid = labels >= 0
        safe = np.where(valid, labels, 0)
        # With a mask, look candidates up in it; on the simple path only tombstones matter.
        ok = (mask[safe] if mask is not None else seg.sup[safe] > epoch) & valid
        if scores is None:
            # Approximate candidates: score them exactly against the stored vectors.
            scores = np.einsum("tcd,td->tc", vectors[safe], sub)
        scores = np.where(ok, scores, -np.inf).astype(np.float32, copy=False)
        kk = min(k, scores.shape[1])
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        out_s[todo, :kk] = np.take_along_axis(scores, top, axis=1)
        out_l[todo, :kk] = np.take_along_axis(safe, top, axis=1)
        short = np.count_nonzero(ok, axis=1) < k
        if not short.any():
            break
        if want >= n:
            # The whole segment was asked for and the structure still came up
            # short: scan it exactly for those queries.
            rest = todo[short]
            full = seg.mask(n, spec) if mask is None else mask
            out_s[rest] = -np.inf
            alone = _Scan()
            if full is not None:
                alone.add(seg, n, full)
            if alone.parts:
                f = alone.top(q[rest], k)
                out_s[rest, : f.scores.shape[1]] = f.scores
                out_l[rest, : f.rows.shape[1]] = f.rows
            break
        todo = todo[short]
        want = min(n, want * 4)
    return _Found(seg, out_s, out_l)
