"""The window operator: keyed, incremental window aggregation driven by watermarks.

This follows Apache Flink's window operator, which users of streaming systems
know, with Beam's pane timing on every result:

* An element is assigned to its windows (:mod:`.windows`) and folded into each
  window's accumulator (:mod:`.aggregates`). A window exists only once an
  element arrives, so an empty window never emits.
* **On time.** When the watermark ``W`` reaches a window's last instant
  (``W >= end - 1``) the window fires once, marked ``ON_TIME``.
* **Allowed lateness.** A fired window keeps its state until
  ``end - 1 + allowed_lateness <= W``. An element that arrives for it before then
  re-fires it at once with the updated result, marked ``LATE``.
* **Late side output.** An element whose windows have *all* expired is not
  counted; it comes back as a :class:`LateElement` carrying the original event,
  so the caller can count it and keep it (the pipeline writes it to the
  dead-letter store). Nothing is dropped silently.
* **Sessions** merge before the lateness check; a merged window that is already
  behind ``W`` fires at once.
* **Early firing** (optional) emits ``EARLY`` results of windows that are still
  open every ``early_every_us`` of processing time, for dashboards.
* **Accumulating** (default) results carry everything the window has seen;
  **discarding** results carry only what arrived since the window last fired.
* **Triggers** (:mod:`.triggers`) add firings before the window's end: every
  ``n`` elements, or on every element, marked ``EARLY``; a *purging* trigger
  clears the window after each firing (as discarding does). With the
  :class:`~.windows.Global` window they give count windows.

Sliding and tumbling windows with a numeric aggregation (count, sum, min, max,
mean) keep their state in columns (:mod:`.columnar`); sessions and ``collect``
keep one small object per window. Both layouts follow the same rules and write
the same checkpoint rows.

Elements are judged against the watermark the operator holds when
:meth:`WindowedAggregation.process` is called, and the watermark moves only by
:meth:`WindowedAggregation.advance`. Calling ``process`` with a whole
micro-batch and then ``advance`` gives the micro-batch semantics (every element
of a batch is judged against ``W`` at the batch's start, as in Spark); calling
them per element gives Flink's per-event semantics.

>>> from streamrag.eventtime.aggregates import Count
>>> from streamrag.eventtime.windows import Tumbling
>>> op = WindowedAggregation(Tumbling(10), Count(), allowed_lateness_us=10)
>>> op.process(["a", "a", "b"], [1, 5, 12])
([], [])
>>> [(r.key, r.window.start, r.value, r.timing.value) for r in op.advance(9)]
[('a', 0, 2, 'on_time')]
>>> fired, late = op.process(["a"], [3])   # late, but within the allowed lateness
>>> [(r.key, r.value, r.timing.value) for r in fired]
[('a', 3, 'late')]
>>> _ = op.advance(19)
>>> op.process(["a"], [4])[1]             # its window expired at W = 19: side output
[LateElement(index=0, key='a', event_time=4, value=None, watermark=19)]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import ArgumentError, SpecError
from streamrag.eventtime.aggregates import Aggregator
from streamrag.eventtime.columnar import ColumnarWindows
from streamrag.eventtime.triggers import ON_WATERMARK, Trigger
from streamrag.eventtime.windows import Session, Sliding, Window, WindowAssigner
from streamrag.timing import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

__all__ = ["Accumulation", "LateElement", "Timing", "WindowResult", "WindowedAggregation"]


class Timing(StrEnum):
    """When a result was emitted relative to its window's end (Beam's pane timing)."""

    EARLY = "early"
    ON_TIME = "on_time"
    LATE = "late"


class Accumulation(StrEnum):
    """What a window's later results carry."""

    ACCUMULATING = "accumulating"
    DISCARDING = "discarding"


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One firing of one window: ``pane`` counts the window's firings from 0."""

    key: Hashable
    window: Window
    value: Any
    timing: Timing
    pane: int


@dataclass(frozen=True, slots=True)
class LateElement:
    """An element that arrived after all its windows expired: the late side output.

    ``index`` is its position in the batch given to ``process``; ``watermark`` is
    the watermark it was judged against.
    """

    index: int
    key: Hashable
    event_time: Timestamp
    value: Any
    watermark: Timestamp


@dataclass(slots=True)
class _State:
    acc: Any
    fired: bool = False  # fired since the watermark passed its end: new elements re-fire it
    panes: int = 0  # firings so far
    fresh: bool = True  # holds elements not yet in any result
    filled: bool = True  # the accumulator holds elements (false after a discarding firing)
    count: int = 0  # elements since the last firing (kept for counting triggers)


def _sort_key(r: WindowResult) -> tuple[Timestamp, Timestamp, str]:
    return (r.window.end, r.window.start, repr(r.key))


class WindowedAggregation:
    """Keyed windows over event time with allowed lateness and a late side output."""

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregator: Aggregator,
        *,
        allowed_lateness_us: Duration = 0,
        accumulation: Accumulation = Accumulation.ACCUMULATING,
        early_every_us: Duration | None = None,
        trigger: Trigger = ON_WATERMARK,
        name: str = "",
    ) -> None:
        if allowed_lateness_us < 0:
            msg = f"allowed_lateness must be >= 0, found {allowed_lateness_us} µs"
            raise SpecError(msg)
        if early_every_us is not None and early_every_us <= 0:
            msg = f"early firing interval must be positive, found {early_every_us} µs"
            raise SpecError(msg)
        self.assigner = assigner
        self.aggregator = aggregator
        self.allowed_lateness_us = allowed_lateness_us
        self.accumulation = Accumulation(accumulation)
        self.early_every_us = early_every_us
        self.trigger = trigger
        self.name = name
        # A purging trigger is discarding accumulation under Flink's name.
        self._discarding = self.accumulation is Accumulation.DISCARDING or trigger.purge
        self._watermark: Timestamp = MIN_TIMESTAMP
        self._state: dict[Hashable, dict[Window, _State]] = {}
        # Timers, bucketed by the time they are due: many windows share an end, so
        # the heaps hold distinct times only and a window costs one list append.
        self._fire_at: dict[Timestamp, list[tuple[Window, Hashable]]] = {}
        self._fire_heap: list[Timestamp] = []
        self._expire_at: dict[Timestamp, list[tuple[Window, Hashable]]] = {}
        self._expire_heap: list[Timestamp] = []
        self._next_early: Timestamp | None = None
        self._open = 0
        # Numeric aggregations over sliding windows keep their state in columns;
        # ``_vectorized`` switches that off (tests compare both layouts).
        self._columns: ColumnarWindows | None = None
        # Counting triggers need a per-window count the columns do not hold.
        if isinstance(assigner, Sliding) and hasattr(aggregator, "ufunc") and trigger.count is None:
            self._columns = ColumnarWindows(
                assigner,
                aggregator,  # type: ignore[arg-type]
                allowed_lateness_us,
            )
        self._vectorized = self._columns is not None

    def _columnar(self) -> ColumnarWindows | None:
        """The column store, when this operator uses it (tests may turn it off)."""
        return self._columns if self._vectorized else None

    # -- reading ---------------------------------------------------------------

    @property
    def watermark(self) -> Timestamp:
        """The watermark elements are judged against."""
        return self._watermark

    @property
    def open_windows(self) -> int:
        """Windows holding state (fired or not, until they expire).

        A counter, so another thread may read it while the operator runs.
        """
        cols = self._columnar()
        return self._open if cols is None else cols.open

    def expired(self, window: Window) -> bool:
        """Whether a window's state is gone: ``end - 1 + allowed_lateness <= W``.

        The end of input (``W = MAX_TIMESTAMP``) expires every window, whatever
        its allowed lateness.
        """
        wm = self._watermark
        return window.max_timestamp + self.allowed_lateness_us <= wm or wm == MAX_TIMESTAMP

    # -- input -----------------------------------------------------------------

    def process(
        self,
        keys: Sequence[Hashable],
        times: Sequence[int] | npt.NDArray[np.int64],
        values: Sequence[Any] | npt.NDArray[Any] | None = None,
    ) -> tuple[list[WindowResult], list[LateElement]]:
        """Add a batch of elements; returns re-firings of windows already behind W, and late ones.

        ``values`` may be None for aggregators that ignore them (:class:`Count`).
        """
        n = len(keys)
        if len(times) != n or (values is not None and len(values) != n):
            msg = f"keys, times and values must be the same length, found {n}, {len(times)}"
            raise ArgumentError(msg)
        if n == 0:
            return [], []
        cols = self._columnar()
        if cols is not None:
            return self._process_in_columns(cols, keys, times, values)
        dirty: dict[tuple[Hashable, Window], None] = {}
        fired: list[WindowResult] = []
        late = self._process_rows(keys, times, values, dirty, fired)
        for key, window in dirty:
            st = self._state.get(key, {}).get(window)
            if st is not None and st.fresh and window.max_timestamp <= self._watermark:
                st.fired = True
                fired.append(self._fire(key, window, st, Timing.LATE))
        fired.sort(key=_sort_key)
        return fired, late

    def _process_in_columns(
        self,
        cols: ColumnarWindows,
        keys: Sequence[Hashable],
        times: Sequence[int] | npt.NDArray[np.int64],
        values: Sequence[Any] | npt.NDArray[Any] | None,
    ) -> tuple[list[WindowResult], list[LateElement]]:
        """Fold a batch into the column store.

        Every step is an array operation except the key lookup (one per element)
        and building the results.
        """
        assigner = cols.assigner
        size, slide, lateness = assigner.size_us, assigner.slide_us, self.allowed_lateness_us
        wm = self._watermark
        t = np.asarray(times, dtype=np.int64)
        last = assigner.last_starts(t)
        late_mask = last + size - 1 + lateness <= wm
        steps = np.arange(assigner.windows_per_element, dtype=np.int64) * slide
        starts = last[:, None] - steps[None, :]
        ends = starts + size
        valid = (ends > t[:, None]) & (ends - 1 + lateness > wm)
        rows, which = np.nonzero(valid)
        win_starts = starts[rows, which]
        code_of = cols.code_of
        if isinstance(keys, np.ndarray) and keys.dtype != object:
            uniq, inverse = np.unique(keys, return_inverse=True)
            ucodes = np.asarray([code_of(k) for k in uniq.tolist()], dtype=np.int64)
            codes = ucodes[inverse]
        else:
            codes = np.asarray([code_of(k) for k in keys], dtype=np.int64)
        row_codes = codes[rows]
        order = np.lexsort((win_starts, row_codes))
        s_codes, s_starts = row_codes[order], win_starts[order]
        change = np.ones(len(order), dtype=bool)
        change[1:] = (s_codes[1:] != s_codes[:-1]) | (s_starts[1:] != s_starts[:-1])
        groups = np.empty(len(order), dtype=np.intp)
        groups[order] = np.cumsum(change) - 1
        firsts = np.flatnonzero(change)
        column = None
        if getattr(self.aggregator, "needs_value", True):
            if values is None:
                msg = f"aggregation {self.aggregator.name!r} needs values; pass values="
                raise SpecError(msg)
            column = np.asarray(values, dtype=np.float64)[rows]
        partials = cols.agg.grouped(column, groups, int(firsts.size))
        behind = cols.fold(s_codes[firsts], s_starts[firsts], partials, wm)
        fired = cols.fire(
            behind, self._emitter(Timing.LATE), mark_fired=True, discarding=self._discarding
        )
        late = []
        if late_mask.any():
            for i in np.flatnonzero(late_mask).tolist():
                value = None if values is None else values[i]
                late.append(LateElement(i, keys[i], int(t[i]), value, wm))
        return fired, late

    @staticmethod
    def _emitter(timing: Timing) -> Callable[[Hashable, Window, Any, int], WindowResult]:
        def emit(key: Hashable, window: Window, value: Any, pane: int) -> WindowResult:
            return WindowResult(key, window, value, timing, pane)

        return emit

    def _process_rows(
        self,
        keys: Sequence[Hashable],
        times: Sequence[int] | npt.NDArray[np.int64],
        values: Sequence[Any] | npt.NDArray[Any] | None,
        dirty: dict[tuple[Hashable, Window], None],
        fired: list[WindowResult],
    ) -> list[LateElement]:
        """Fold elements in; windows a counting trigger fires go to ``fired`` (EARLY)."""
        late = []
        agg = self.aggregator
        merging = self.assigner.merging
        every = self.trigger.count
        for i, key in enumerate(keys):
            ts = int(times[i])
            value = None if values is None else values[i]
            if merging:
                window = self._merge_session(key, ts)
                targets = [] if window is None else [window]
            else:
                targets = [w for w in self.assigner.assign(ts) if not self.expired(w)]
            if not targets:
                late.append(LateElement(i, key, ts, value, self._watermark))
                continue
            windows = self._state.setdefault(key, {})
            for window in targets:
                st = windows.get(window)
                if st is None:
                    st = windows[window] = _State(agg.create())
                    self._open += 1
                    self._schedule(key, window)
                st.acc = agg.add(st.acc, value)
                st.fresh = st.filled = True
                dirty[(key, window)] = None
                if every is not None:
                    st.count += 1
                    # Before the watermark reaches the end; behind it, LATE re-firing rules.
                    if st.count >= every and window.max_timestamp > self._watermark:
                        fired.append(self._fire(key, window, st, Timing.EARLY))
        return late

    def _merge_session(self, key: Hashable, ts: Timestamp) -> Window | None:
        """Merge the element's session with the ones it touches; None if it is late."""
        assert isinstance(self.assigner, Session)
        own = Window(ts, ts + self.assigner.gap_us)
        windows = self._state.get(key, {})
        partners = sorted(w for w in windows if w.touches(own))
        if not partners:
            return None if self.expired(own) else own
        merged = own
        for w in partners:
            merged = merged.cover(w)
        if len(partners) == 1 and partners[0] == merged:
            return merged
        agg = self.aggregator
        # The merged window is a new, longer window: it fires when W passes its
        # end (or at once, by the caller, if W already has). Panes keep counting.
        st = _State(agg.create(), fresh=False, filled=False)
        for w in partners:
            old = windows.pop(w)
            self._open -= 1
            st.acc = agg.merge(st.acc, old.acc)
            st.panes = max(st.panes, old.panes)
            st.fresh |= old.fresh
            st.filled |= old.filled
            st.count += old.count  # as Flink's CountTrigger.onMerge
        windows[merged] = st
        self._open += 1
        self._schedule(key, merged)
        return merged

    # -- time ------------------------------------------------------------------

    def advance(self, watermark: Timestamp) -> list[WindowResult]:
        """Move the watermark forward: fire windows it completes, drop those it expires.

        A watermark at or behind the current one changes nothing (W never decreases).
        """
        if watermark <= self._watermark:
            return []
        self._watermark = watermark
        cols = self._columnar()
        if cols is not None:
            due = cols.due(watermark)
            fired = cols.fire(
                due, self._emitter(Timing.ON_TIME), mark_fired=True, discarding=self._discarding
            )
            cols.expire(watermark)
            return fired
        out = []
        state = self._state
        heap = self._fire_heap
        while heap and heap[0] <= watermark:
            for window, key in self._fire_at.pop(heapq.heappop(heap)):
                st = state.get(key, {}).get(window)
                if st is None or st.fired:
                    continue
                st.fired = True
                if st.filled:
                    out.append(self._fire(key, window, st, Timing.ON_TIME))
        heap = self._expire_heap
        while heap and heap[0] <= watermark:
            for window, key in self._expire_at.pop(heapq.heappop(heap)):
                windows = state.get(key)
                if windows is not None and window in windows:
                    del windows[window]
                    self._open -= 1
                    if not windows:
                        del state[key]
        out.sort(key=_sort_key)
        return out

    def finish(self) -> list[WindowResult]:
        """End of input: the watermark goes to +inf and every remaining window fires."""
        return self.advance(MAX_TIMESTAMP)

    def on_processing_time(self, now_us: Timestamp) -> list[WindowResult]:
        """Early firing: every ``early_every_us``, emit open windows that gained elements."""
        if self.early_every_us is None:
            return []
        if self._next_early is None:
            self._next_early = now_us + self.early_every_us
            return []
        if now_us < self._next_early:
            return []
        # Ticks stay on the schedule set by the first call, however late we are.
        every = self.early_every_us
        self._next_early = now_us - (now_us - self._next_early) % every + every
        cols = self._columnar()
        if cols is not None:
            return cols.fire(
                cols.early(),
                self._emitter(Timing.EARLY),
                mark_fired=False,
                discarding=self._discarding,
            )
        out = []
        for key, windows in self._state.items():
            for window, st in windows.items():
                if not st.fired and st.fresh:
                    out.append(self._fire(key, window, st, Timing.EARLY))
        out.sort(key=_sort_key)
        return out

    def _schedule(self, key: Hashable, window: Window) -> None:
        entry = (window, key)
        at = window.end - 1
        bucket = self._fire_at.get(at)
        if bucket is None:
            self._fire_at[at] = [entry]
            heapq.heappush(self._fire_heap, at)
        else:
            bucket.append(entry)
        at += self.allowed_lateness_us
        if at > MAX_TIMESTAMP:  # lateness past the end of time: the end of input expires it
            at = MAX_TIMESTAMP
        bucket = self._expire_at.get(at)
        if bucket is None:
            self._expire_at[at] = [entry]
            heapq.heappush(self._expire_heap, at)
        else:
            bucket.append(entry)

    def _fire(self, key: Hashable, window: Window, st: _State, timing: Timing) -> WindowResult:
        result = WindowResult(key, window, self.aggregator.result(st.acc), timing, st.panes)
        st.panes += 1
        st.fresh = False
        st.count = 0
        if self._discarding:
            st.acc = self.aggregator.create()
            st.filled = False
        return result

    # -- checkpoints -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The operator's whole state as plain data: watermark, windows, accumulators.

        Timers are not stored: they are derived from the windows on restore. With
        a counting trigger each row also holds the elements counted since the
        window last fired.
        """
        cols = self._columnar()
        if cols is not None:
            rows = cols.rows()
        else:
            counting = self.trigger.count is not None
            rows = [
                [key, w.start, w.end, st.acc, st.fired, st.panes, st.fresh, st.filled]
                + ([st.count] if counting else [])
                for key, windows in self._state.items()
                for w, st in windows.items()
            ]
        return {"watermark": self._watermark, "next_early": self._next_early, "windows": rows}

    def restore(self, state: dict[str, Any]) -> None:
        """Replace this operator's state with a :meth:`snapshot`."""
        self._watermark = int(state["watermark"])
        self._next_early = state.get("next_early")
        self._state = {}
        self._open = 0
        self._fire_at, self._fire_heap = {}, []
        self._expire_at, self._expire_heap = {}, []
        cols = self._columnar()
        if cols is not None:
            cols.load(state["windows"], _hashable)
            return
        for key, start, end, acc, fired, panes, fresh, filled, *more in state["windows"]:
            k = _hashable(key)
            window = Window(int(start), int(end))
            count = int(more[0]) if more else 0  # rows written without a count: none counted
            st = _State(acc, fired, panes, fresh, filled, count)
            self._state.setdefault(k, {})[window] = st
            self._open += 1
            self._schedule(k, window)


def _hashable(value: Any) -> Hashable:
    """Keys come back from a checkpoint as lists; make them tuples again."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value  # type: ignore[no-any-return]
