"""A naive reference simulator of the window semantics, written from the spec alone.

It keeps every element, recomputes each result from the raw elements, scans
lists instead of keeping timers, and enumerates windows by brute force. Slow
and obviously right is the point: the operator is checked against it.

Semantics (see streamrag.eventtime.operator):
- windows are [start, end) with start = offset + k*slide; a window exists once an
  element is in it and never emits empty;
- elements are judged against W at the start of their batch;
- a window fires ON_TIME once when W >= end - 1; its state lives while
  end - 1 + lateness > W; an element for a live window already behind W
  re-fires it (LATE) at the end of its batch; an element with no live window is late;
- sessions open [ts, ts + gap) and merge with every session they overlap or touch,
  before the lateness check;
- the global window spans years 1 to 9999 (GLOBAL): every element of a key is in
  it, and the end of input (W = MAX) fires it and expires it;
- with a count trigger n, a window whose end W has not reached fires EARLY as soon
  as it holds n elements added since its last firing (any firing resets the count;
  merged sessions add their counts up).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

MIN = -(2**63)
MAX = 2**63 - 1
GLOBAL = (
    int(datetime(1, 1, 1, tzinfo=UTC).timestamp()) * 10**6,
    int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 10**6 + 999_999,
)


@dataclass
class Win:
    key: Hashable
    start: int
    end: int
    elems: list[Any] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)  # not yet emitted (discarding mode)
    fired: bool = False
    panes: int = 0
    since: int = 0  # elements added since the last firing


@dataclass
class Oracle:
    kind: str  # "sliding" (tumbling = size == slide), "session" or "global"
    size: int = 0
    slide: int = 0
    offset: int = 0
    gap: int = 0
    lateness: int = 0
    discarding: bool = False
    count: int | None = None
    agg: Callable[[list[Any]], Any] = len
    wm: int = MIN
    wins: list[Win] = field(default_factory=list)

    # results are tuples (key, start, end, value, timing, pane)

    def _windows_for(self, ts: int) -> list[tuple[int, int]]:
        if self.kind == "global":
            return [GLOBAL]
        out = []
        # brute force: every k whose window could contain ts
        k_hi = (ts - self.offset) // self.slide
        for k in range(k_hi - self.size // self.slide - 2, k_hi + 1):
            start = self.offset + k * self.slide
            if start <= ts < start + self.size:
                out.append((start, start + self.size))
        return out

    def _expired(self, end: int) -> bool:
        return min(end - 1 + self.lateness, MAX) <= self.wm

    def _find(self, key: Hashable, start: int, end: int) -> Win | None:
        for w in self.wins:
            if w.key == key and w.start == start and w.end == end:
                return w
        return None

    def _fire(self, w: Win, timing: str) -> tuple[Any, ...] | None:
        items = w.pending if self.discarding else w.elems
        if not items:
            return None
        out = (w.key, w.start, w.end, self.agg(list(items)), timing, w.panes)
        w.panes += 1
        w.since = 0
        w.pending = []
        if self.discarding:
            w.elems = []
        return out

    def batch(
        self, events: Sequence[tuple[Hashable, int, Any]]
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Hashable, int, Any]]]:
        touched: list[Win] = []
        late = []
        early = []
        for key, ts, value in events:
            if self.kind == "session":
                own = (ts, ts + self.gap)
                partners = sorted(
                    (
                        w
                        for w in self.wins
                        if w.key == key and w.start <= own[1] and own[0] <= w.end
                    ),
                    key=lambda w: (w.start, w.end),
                )
                if not partners and self._expired(own[1]):
                    late.append((key, ts, value))
                    continue
                start = min([own[0], *(w.start for w in partners)])
                end = max([own[1], *(w.end for w in partners)])
                merged = Win(key, start, end)
                for w in partners:
                    self.wins.remove(w)
                    merged.elems += w.elems
                    merged.pending += w.pending
                    merged.panes = max(merged.panes, w.panes)
                    merged.since += w.since
                merged.elems.append(value)
                merged.pending.append(value)
                self.wins.append(merged)
                early += self._count(merged)
                touched = [t for t in touched if t not in partners]
                touched.append(merged)
                continue
            accepted = False
            for start, end in self._windows_for(ts):
                if self._expired(end):
                    continue
                accepted = True
                w = self._find(key, start, end)
                if w is None:
                    w = Win(key, start, end)
                    self.wins.append(w)
                w.elems.append(value)
                w.pending.append(value)
                early += self._count(w)
                if w not in touched:
                    touched.append(w)
            if not accepted:
                late.append((key, ts, value))
        out = early
        for w in touched:
            if w in self.wins and w.end - 1 <= self.wm and w.pending:
                w.fired = True
                r = self._fire(w, "late")
                if r:
                    out.append(r)
        return sorted(out, key=_order), late

    def _count(self, w: Win) -> list[tuple[Any, ...]]:
        """Count one more element into ``w``; its EARLY firing if the count is reached."""
        w.since += 1
        if self.count is None or w.since < self.count or w.end - 1 <= self.wm:
            return []
        r = self._fire(w, "early")
        return [r] if r else []

    def advance(self, wm: int) -> list[tuple[Any, ...]]:
        if wm <= self.wm:
            return []
        self.wm = wm
        out = []
        for w in list(self.wins):
            if not w.fired and w.end - 1 <= wm:
                w.fired = True
                r = self._fire(w, "on_time")
                if r:
                    out.append(r)
        self.wins = [w for w in self.wins if not self._expired(w.end)]
        return sorted(out, key=_order)


def _order(r: tuple[Any, ...]) -> tuple[int, int, str]:
    return (r[2], r[1], repr(r[0]))


def as_tuples(results: Sequence[Any]) -> list[tuple[Any, ...]]:
    """WindowResults in the oracle's shape."""
    return [(r.key, r.window.start, r.window.end, r.value, r.timing.value, r.pane) for r in results]
