"""One query's results as columns: :class:`Hits`, a sequence of :class:`Hit` built on demand.

A search finds, per query, up to ``k`` rows of the segments it read and their
scores. Turning those into ``Hit`` structs means reading a dozen columns at
scattered rows — in a lone ANN query over 40,000 rows, 8.8 µs against the
graph search's 31.5 µs (``docs/performance.md``). Most callers
want all of it (the HTTP answer, the context of a generated answer), but some
want only the chunk ids and scores (a benchmark's recall, an evaluation, a
caller that joins the ids with its own store).

So a search returns :class:`Hits`: a read-only ``Sequence[Hit]`` over the rows
found. :attr:`Hits.chunk_ids` and :attr:`Hits.scores` are read from the columns
without building any struct; the first access to a hit builds the hits of
every query of the search at once (one gather per column and segment, as
before). The rows it refers to are never rewritten — segments are appended to,
and what a later epoch changes is written as new rows and new stamps — so
building hits later shows exactly what the search read.

A ``Hits`` pickles, copies and compares as a plain list of ``Hit``: sending one
to another process never drags the segments along. While held, it keeps the
segments it read in memory (after a compaction too): to keep results for
long, keep ``list(hits)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import numpy.typing as npt

from streamrag.index.base import Hit

if TYPE_CHECKING:
    from streamrag.index.segment import Segment

__all__ = ["HitTable", "Hits"]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

_NUMBERS = ("chunk_ids", "positions", "valid_from", "offsets", "committed")
"""The segment columns a :class:`Hit` takes its numbers from, in its field order."""

_HIT_BY_HIT = 8
"""Candidates per segment up to which a table reads its hits' numbers one by one
(:meth:`HitTable._build`)."""


class HitTable:
    """The rows a search found: ``(queries × k)`` segment numbers, rows and scores.

    Every row of the table is best first, ``-inf`` scores (no hit) last.
    ``which`` None: every candidate is from the one segment in ``segments``.
    """

    __slots__ = ("_built", "_columns", "_groups", "rows", "scores", "segments", "which")

    def __init__(self, segments: list[Segment], which: I64 | None, rows: I64, scores: F32) -> None:
        self.segments = segments
        self.which = None if which is None or len(segments) == 1 else which
        self.rows = rows
        self.scores = scores
        self._built: list[list[Hit]] | None = None
        self._columns: dict[str, npt.NDArray[Any]] = {}
        self._groups: list[tuple[Segment, npt.NDArray[np.bool_], I64]] | None = None

    def split(self) -> list[Hits]:
        """One :class:`Hits` per query."""
        m = self.rows.shape[0]
        return [Hits(self, 0)] if m == 1 else [Hits(self, i) for i in range(m)]

    def count(self, i: int) -> int:
        """How many hits query ``i`` has (its scores above ``-inf``)."""
        scores = self.scores
        kk = scores.shape[1]
        # The last candidate is the worst: a real score there means the row is full.
        if kk == 0 or scores.item(i, kk - 1) != -math.inf:
            return int(kk)
        return int(np.count_nonzero(scores[i] != -np.inf))

    def column(self, name: str, i: int, n: int) -> npt.NDArray[Any]:
        """Query ``i``'s first ``n`` values of one of the segments' number columns."""
        return self._gathered(name)[i, :n]

    def _gathered(self, name: str) -> npt.NDArray[Any]:
        """A number column at every ``(query, candidate)`` of the table (gathered once).

        One fancy index per column and segment that holds a candidate, for
        every query at once: a batch pays one gather, not one per query.
        Entries past a query's hits are whatever row they name; they are never
        shown.
        """
        table = self._columns.get(name)
        if table is None:
            if self.which is None:
                table = getattr(self.segments[0], name)[self.rows]
            else:
                table = np.empty(self.rows.shape, dtype=getattr(self.segments[0], name).dtype)
                for seg, sel, rows in self._by_segment():
                    table[sel] = getattr(seg, name)[rows]
            self._columns[name] = table
        return table

    def _by_segment(self) -> list[tuple[Segment, npt.NDArray[np.bool_], I64]]:
        """Each segment that holds a candidate, where in the table its candidates are, their rows.

        Only those segments: a search reads every segment of its epoch (a
        dozen while ingest runs ahead of merges), but the few best rows of a
        query come from a few of them.
        """
        groups = self._groups
        if groups is None:
            assert self.which is not None
            held = np.bincount(self.which.ravel(), minlength=len(self.segments))
            groups = self._groups = [
                (self.segments[g], sel, self.rows[sel])
                for g in np.flatnonzero(held).tolist()
                for sel in (self.which == g,)
            ]
        return groups

    def built(self) -> list[list[Hit]]:
        """Every query's hits as structs (built once, on first use)."""
        if self._built is None:
            self._built = self._build()
        return self._built

    def _build(self) -> list[list[Hit]]:
        """Hits from the table, best first, skipping ``-inf`` (no hit).

        A table with up to :data:`_HIT_BY_HIT` candidates per segment reads
        each hit's numbers from its own row (``ndarray.item``: a Python number
        at once); a larger one gathers each number column once
        (:meth:`_gathered`), one fancy index per segment, not one numpy scalar
        per hit. Gathering costs a dozen numpy calls per segment that holds a
        candidate, reading row by row five calls per candidate.
        The first build right after a search (``benchmarks/hits.py``, 2-core
        Intel Xeon, two alternated runs each): one query's five hits over 13
        segments took 62–65 µs one by one against 187–189 µs gathered over
        every segment as before, over 3 segments 35–38 against 69–71 µs; four
        queries 164–170 against 298–305 µs and 84–86 against 104–110 µs; 16
        and 64 queries (gathered either way) within noise.
        """
        m, kk = self.rows.shape
        if m * kk <= _HIT_BY_HIT * len(self.segments):
            return self._by_row()
        return self._by_column()

    def _candidates(self) -> Iterator[list[tuple[int, Segment, int, float]]]:
        """Per query, its hits' places in the table, segments, rows and scores (no ``-inf``)."""
        segs, which = self.segments, self.which
        m, kk = self.rows.shape
        rows_l = self.rows.ravel().tolist()
        scores_l = self.scores.ravel().tolist()
        which_l = None if which is None else which.ravel().tolist()
        one = segs[0]
        ninf = -math.inf
        for i in range(m):
            yield [
                (j, one if which_l is None else segs[which_l[j]], rows_l[j], scores_l[j])
                for j in range(i * kk, (i + 1) * kk)
                if scores_l[j] != ninf
            ]

    def _by_row(self) -> list[list[Hit]]:
        """Hits whose numbers are read from their own rows, one by one."""
        return [
            [
                Hit(
                    score,
                    seg.chunk_ids.item(r),
                    seg.tenants[r],
                    seg.doc_ids[r],
                    seg.domains[r],
                    seg.positions.item(r),
                    seg.texts[r],
                    seg.valid_from.item(r),
                    seg.sources[r],
                    seg.offsets.item(r),
                    seg.committed.item(r),
                    seg.embedders[r],
                    seg.metadata[r],
                )
                for _, seg, r, score in found
            ]
            for found in self._candidates()
        ]

    def _by_column(self) -> list[list[Hit]]:
        """Hits whose numbers come from columns gathered once for the whole table.

        A loop of its own rather than over :meth:`_candidates`: for the large
        tables that come here, building a tuple per candidate first took 18 %
        longer (64 queries over 13 segments, warm: 256–263 µs against 216–221).
        """
        segs, which = self.segments, self.which
        m, kk = self.rows.shape
        chunk_ids, positions, times, offsets, epochs = (
            self._gathered(name).ravel().tolist() for name in _NUMBERS
        )
        rows_l = self.rows.ravel().tolist()
        scores_l = self.scores.ravel().tolist()
        which_l = None if which is None else which.ravel().tolist()
        one = segs[0]
        ninf = -math.inf
        out: list[list[Hit]] = []
        for i in range(m):
            hits = []
            for j in range(i * kk, (i + 1) * kk):
                score = scores_l[j]
                if score == ninf:
                    continue
                seg = one if which_l is None else segs[which_l[j]]
                r = rows_l[j]
                hits.append(
                    Hit(
                        score,
                        chunk_ids[j],
                        seg.tenants[r],
                        seg.doc_ids[r],
                        seg.domains[r],
                        positions[j],
                        seg.texts[r],
                        times[j],
                        seg.sources[r],
                        offsets[j],
                        epochs[j],
                        seg.embedders[r],
                        seg.metadata[r],
                    )
                )
            out.append(hits)
        return out


class Hits(Sequence[Hit]):
    """One query's hits, best first: a read-only sequence of :class:`Hit`.

    Either a row of a :class:`HitTable` (what the LSM index returns) or a list
    of hits (:meth:`of`). Compares equal to any sequence of the same hits.
    """

    __slots__ = ("_i", "_list", "_n", "_table")

    def __init__(self, table: HitTable | None, i: int = 0, hits: list[Hit] | None = None) -> None:
        self._table = table
        self._i = i
        self._list = hits
        self._n = -1 if hits is None else len(hits)

    @classmethod
    def of(cls, hits: Sequence[Hit]) -> Hits:
        """Hits already built (an index that makes structs directly, a reranker's order)."""
        return hits if isinstance(hits, Hits) else cls(None, hits=list(hits))

    def __len__(self) -> int:
        if self._n < 0:
            assert self._table is not None
            self._n = self._table.count(self._i)
        return self._n

    @property
    def _hits(self) -> list[Hit]:
        if self._list is None:
            assert self._table is not None
            self._list = self._table.built()[self._i]
        return self._list

    @overload
    def __getitem__(self, index: int) -> Hit: ...

    @overload
    def __getitem__(self, index: slice) -> list[Hit]: ...

    def __getitem__(self, index: int | slice) -> Hit | list[Hit]:
        return self._hits[index]

    def __iter__(self) -> Iterator[Hit]:
        return iter(self._hits)

    @property
    def chunk_ids(self) -> I64:
        """The hits' chunk ids, best first, read from the columns (no structs built).

        Like :attr:`scores`, a view of the search's own arrays: copy it before writing to it.
        """
        if self._list is not None or self._table is None:
            return np.fromiter((h.chunk_id for h in self._hits), dtype=np.int64)
        return self._table.column("chunk_ids", self._i, len(self))

    @property
    def scores(self) -> F32:
        """The hits' scores, best first (no structs built)."""
        if self._list is not None or self._table is None:
            return np.fromiter((h.score for h in self._hits), dtype=np.float32)
        return self._table.scores[self._i, : len(self)]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self._hits == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list: equal by content, so unhashable

    def __repr__(self) -> str:
        return f"Hits({self._hits!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled, copied and deep-copied as a plain list: the segments stay here.
        return (list, (self._hits,))
