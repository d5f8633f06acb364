"""Watermarks: how far event time has progressed.

A watermark ``W`` promises that no further change with ``event_time <= W`` is
expected. With bounded out-of-orderness — changes arrive at most ``bound``
behind the newest one seen — ``W = max_event_time_seen - bound - 1 µs``. ``W``
never moves backwards, whatever arrives.

>>> w = BoundedOutOfOrderness(bound_us=10)
>>> w.watermark == MIN_TIMESTAMP
True
>>> w.observe(100); w.watermark
89
>>> w.observe(50); w.watermark  # a late change does not move W back
89
>>> w.is_late(89), w.is_late(90)
(True, False)
"""

from __future__ import annotations

import threading
from typing import Any

from streamrag.errors import ArgumentError
from streamrag.timing import MAX_TIMESTAMP, MIN_TIMESTAMP, Clock, Duration, Timestamp

__all__ = ["BoundedOutOfOrderness", "WatermarkTracker"]


class BoundedOutOfOrderness:
    """Watermark = newest event time seen − bound − 1 µs, never decreasing."""

    def __init__(self, bound_us: Duration = 0) -> None:
        if bound_us < 0:
            msg = f"bound_us must be >= 0, found {bound_us}"
            raise ArgumentError(msg)
        self.bound_us = bound_us
        self.max_seen: Timestamp = MIN_TIMESTAMP
        self.watermark: Timestamp = MIN_TIMESTAMP

    def observe(self, max_event_time: Timestamp) -> None:
        """Account for a batch whose newest event time is ``max_event_time``."""
        if max_event_time > self.max_seen:
            self.max_seen = max_event_time
            self.watermark = max(self.watermark, max_event_time - self.bound_us - 1)

    def is_late(self, event_time: Timestamp) -> bool:
        """Whether a change is behind the watermark."""
        return event_time <= self.watermark


class WatermarkTracker:
    """The pipeline watermark over several inputs (source partitions).

    Each input has its own bounded out-of-orderness watermark. The pipeline
    watermark is the minimum over the inputs that are **active**: an input that
    has sent nothing for ``idle_timeout_us`` of processing time is idle and stops
    holding event time back (a quiet partition must not stall every window).
    When it sends again it rejoins, but the pipeline watermark never goes back:
    its elements behind ``W`` are late.

    >>> from streamrag.testing import ManualClock
    >>> clock = ManualClock(0)
    >>> wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    >>> wm.observe("a", 50); wm.observe("b", 20); wm.advance()
    19
    >>> clock.advance_us(100); wm.observe("a", 60); wm.advance()  # b is idle now
    59
    >>> wm.observe("b", 30); wm.advance()  # b is back, but W does not go back
    59
    """

    def __init__(
        self,
        *,
        bound_us: Duration = 0,
        idle_timeout_us: Duration | None = None,
        clock: Clock,
    ) -> None:
        if idle_timeout_us is not None and idle_timeout_us <= 0:
            msg = f"idle_timeout must be positive, found {idle_timeout_us} µs"
            raise ArgumentError(msg)
        self.bound_us = bound_us
        self.idle_timeout_us = idle_timeout_us
        self.clock = clock
        self._inputs: dict[str, BoundedOutOfOrderness] = {}
        self._last_data_us: dict[str, Timestamp] = {}
        self.watermark: Timestamp = MIN_TIMESTAMP
        self.finished = False
        # Inputs appear while the API reads: readers and the writer share this lock.
        self._lock = threading.Lock()

    def observe(self, partition: str, max_event_time: Timestamp) -> None:
        """Record that ``partition`` delivered data up to ``max_event_time`` (now)."""
        with self._lock:
            w = self._inputs.get(partition)
            if w is None:
                w = self._inputs[partition] = BoundedOutOfOrderness(self.bound_us)
            w.observe(max_event_time)
            self._last_data_us[partition] = self.clock.now_us()

    @property
    def partitions(self) -> int:
        """Inputs seen so far, idle or not."""
        return len(self._inputs)

    def active(self) -> list[str]:
        """Inputs that are not idle now."""
        if self.idle_timeout_us is None:
            with self._lock:
                return list(self._inputs)
        horizon = self.clock.now_us() - self.idle_timeout_us
        with self._lock:
            return [p for p, t in self._last_data_us.items() if t > horizon]

    def advance(self) -> Timestamp:
        """Recompute the pipeline watermark from the active inputs; never decreases."""
        if self.finished:
            return self.watermark
        active = self.active()
        if active:
            low = min(self._inputs[p].watermark for p in active)
            self.watermark = max(self.watermark, low)
        return self.watermark

    def finish(self) -> Timestamp:
        """End of a bounded input: the watermark goes to +inf."""
        self.finished = True
        self.watermark = MAX_TIMESTAMP
        return self.watermark

    def max_seen(self) -> Timestamp:
        """The newest event time seen on any input."""
        with self._lock:
            return max((w.max_seen for w in self._inputs.values()), default=MIN_TIMESTAMP)

    def snapshot(self) -> dict[str, Any]:
        """Per-input maximum event times and the watermark, as plain data."""
        with self._lock:
            inputs = {p: w.max_seen for p, w in self._inputs.items()}
        return {"watermark": self.watermark, "finished": self.finished, "inputs": inputs}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`snapshot`; every input counts as active from now."""
        now = self.clock.now_us()
        self.watermark = int(state["watermark"])
        self.finished = bool(state.get("finished", False))
        self._inputs = {}
        self._last_data_us = {}
        for partition, max_seen in state["inputs"].items():
            w = self._inputs[partition] = BoundedOutOfOrderness(self.bound_us)
            w.observe(int(max_seen))
            self._last_data_us[partition] = now
