"""Window state in columns: sliding and tumbling windows with numeric aggregations.

The general window operator keeps one small Python object per window. With many
keys — feedback rates per document, counts per user — that object, its timers
and its result cost more than the arithmetic. This store keeps every window of
an operator in numpy columns instead: key code, start, accumulator columns and
the fired / fresh / filled / alive flags. A micro-batch is folded in with a few
array operations, firing and expiry are masks over the columns, and only the
results themselves become Python objects.

It implements exactly the semantics of :mod:`.operator` (the operator uses it
when the assigner is sliding and the aggregation is :class:`~.aggregates.Columnar`),
and the same property tests check it against the naive oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.eventtime.aggregates import Columnar
from streamrag.eventtime.windows import Sliding, Window
from streamrag.timing import Timestamp

__all__ = ["ColumnarWindows"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Emit = Callable[[Hashable, Window, Any, int], Any]


class ColumnarWindows:
    """Every live window of one operator, in columns."""

    def __init__(self, assigner: Sliding, aggregator: Columnar, allowed_lateness_us: int) -> None:
        self.assigner = assigner
        self.agg = aggregator
        self.lateness = allowed_lateness_us
        self.identity = np.asarray(aggregator.identity, dtype=np.float64)
        self._reset()

    def _reset(self) -> None:
        """No keys and no windows."""
        self.keys: list[Hashable] = []
        self.key_reprs: list[str] = []
        self.key_codes: dict[Hashable, int] = {}
        self.slot_of: dict[tuple[int, int], int] = {}
        self.free: list[int] = []
        self.size = 0  # slots in use or freed (high-water mark)
        self.open = 0
        cap = 64
        self.code = np.zeros(cap, dtype=np.int64)
        self.start = np.zeros(cap, dtype=np.int64)
        self.acc: F64 = np.tile(self.identity, (cap, 1))
        self.panes = np.zeros(cap, dtype=np.int64)
        self.alive = np.zeros(cap, dtype=bool)
        self.fired = np.zeros(cap, dtype=bool)
        self.fresh = np.zeros(cap, dtype=bool)
        self.filled = np.zeros(cap, dtype=bool)

    # -- slots -------------------------------------------------------------------

    def _grow(self, need: int) -> None:
        cap = self.code.shape[0]
        if need <= cap:
            return
        new = max(need, 2 * cap)
        for name in ("code", "start", "panes", "alive", "fired", "fresh", "filled"):
            old = getattr(self, name)
            grown = np.zeros(new, dtype=old.dtype)
            grown[:cap] = old
            setattr(self, name, grown)
        acc = np.tile(self.identity, (new, 1))
        acc[:cap] = self.acc
        self.acc = acc

    def _allocate(self, n: int) -> I64:
        reuse = self.free[-n:] if n else []
        del self.free[len(self.free) - len(reuse) :]
        fresh_n = n - len(reuse)
        self._grow(self.size + fresh_n)
        out = np.asarray(reuse + list(range(self.size, self.size + fresh_n)), dtype=np.int64)
        self.size += fresh_n
        return out

    def code_of(self, key: Hashable) -> int:
        """The key's code, registering it on first sight."""
        c = self.key_codes.get(key)
        if c is None:
            c = self.key_codes[key] = len(self.keys)
            self.keys.append(key)
            self.key_reprs.append(repr(key))
        return c

    # -- input -------------------------------------------------------------------

    def fold(
        self,
        codes: I64,
        starts: I64,
        partials: F64,
        watermark: Timestamp,
    ) -> I64:
        """Fold one accumulator row per (key code, window start) group.

        Returns the slots of the touched windows that are already behind the
        watermark: they re-fire at once.
        """
        size = self.assigner.size_us
        found = [self.slot_of.get(t) for t in zip(codes.tolist(), starts.tolist(), strict=True)]
        new_idx = [i for i, s in enumerate(found) if s is None]
        if new_idx:
            slots_new = self._allocate(len(new_idx))
            ni = np.asarray(new_idx, dtype=np.int64)
            self.code[slots_new] = codes[ni]
            self.start[slots_new] = starts[ni]
            self.acc[slots_new] = self.identity
            self.panes[slots_new] = 0
            self.alive[slots_new] = True
            self.fired[slots_new] = False
            for i, slot in zip(new_idx, slots_new.tolist(), strict=True):
                found[i] = slot
                self.slot_of[(int(codes[i]), int(starts[i]))] = slot
            self.open += len(new_idx)
        slots = np.asarray(found, dtype=np.int64)
        self.acc[slots] = self.agg.ufunc(self.acc[slots], partials)
        self.fresh[slots] = True
        self.filled[slots] = True
        behind = self.start[slots] + size - 1 <= watermark
        return slots[behind]

    # -- output ------------------------------------------------------------------

    def fire(self, slots: I64, emit: Emit, *, mark_fired: bool, discarding: bool) -> list[Any]:
        """Emit the windows in ``slots`` that hold elements, in result order.

        ``mark_fired`` records that the watermark has passed them (on-time and
        late firings; not early ones). Each emitted window's pane count goes up,
        it holds no unreported elements any more, and in discarding mode its
        accumulator starts again.
        """
        if slots.size == 0:
            return []
        if mark_fired:
            self.fired[slots] = True
        slots = slots[self.filled[slots]]
        if slots.size == 0:
            return []
        starts = self.start[slots].tolist()
        codes = self.code[slots].tolist()
        reprs = self.key_reprs
        # Results come ordered by (end, start, key), as the operator's other path does.
        order = sorted(range(len(starts)), key=lambda i: (starts[i], reprs[codes[i]]))
        slots = slots[np.asarray(order, dtype=np.int64)]
        values = self.agg.results(self.acc[slots])
        size = self.assigner.size_us
        keys = self.keys
        out = [
            emit(keys[c], Window(s, s + size), v, p)
            for c, s, v, p in zip(
                self.code[slots].tolist(),
                self.start[slots].tolist(),
                values,
                self.panes[slots].tolist(),
                strict=True,
            )
        ]
        self.panes[slots] += 1
        self.fresh[slots] = False
        if discarding:
            self.acc[slots] = self.identity
            self.filled[slots] = False
        return out

    def due(self, watermark: Timestamp) -> I64:
        """Live windows that the watermark completes and that have not fired."""
        n = self.size
        end1 = self.start[:n] + (self.assigner.size_us - 1)
        mask = self.alive[:n] & ~self.fired[:n] & (end1 <= watermark)
        return np.flatnonzero(mask).astype(np.int64)

    def expire(self, watermark: Timestamp) -> None:
        """Drop windows whose allowed lateness has passed."""
        n = self.size
        limit = self.start[:n] + (self.assigner.size_us - 1 + self.lateness)
        gone = np.flatnonzero(self.alive[:n] & (limit <= watermark))
        if gone.size == 0:
            return
        self.alive[gone] = False
        for c, s in zip(self.code[gone].tolist(), self.start[gone].tolist(), strict=True):
            del self.slot_of[(c, s)]
        self.free.extend(gone.tolist())
        self.open -= int(gone.size)

    def early(self) -> I64:
        """Open, unfired windows holding elements not yet in a result."""
        n = self.size
        return np.flatnonzero(self.alive[:n] & ~self.fired[:n] & self.fresh[:n]).astype(np.int64)

    # -- checkpoints -------------------------------------------------------------

    def rows(self) -> list[list[Any]]:
        """Live windows as ``[key, start, end, acc, fired, panes, fresh, filled]`` rows."""
        size = self.assigner.size_us
        live = np.flatnonzero(self.alive[: self.size])
        return [
            [
                self.keys[int(self.code[i])],
                int(self.start[i]),
                int(self.start[i]) + size,
                self.agg.to_acc(self.acc[i]),
                bool(self.fired[i]),
                int(self.panes[i]),
                bool(self.fresh[i]),
                bool(self.filled[i]),
            ]
            for i in live.tolist()
        ]

    def load(self, rows: Sequence[Sequence[Any]], hashable: Callable[[Any], Hashable]) -> None:
        """Replace the state with checkpoint rows."""
        self._reset()
        if not rows:
            return
        slots = self._allocate(len(rows))
        for slot, (key, start, _end, acc, fired, panes, fresh, filled, *_) in zip(
            slots.tolist(), rows, strict=True
        ):
            c = self.code_of(hashable(key))
            self.code[slot] = c
            self.start[slot] = int(start)
            self.acc[slot] = self.agg.from_acc(acc)
            self.alive[slot] = True
            self.fired[slot] = bool(fired)
            self.panes[slot] = int(panes)
            self.fresh[slot] = bool(fresh)
            self.filled[slot] = bool(filled)
            self.slot_of[(c, int(start))] = slot
        self.open = len(rows)
