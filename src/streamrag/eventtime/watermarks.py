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
from collections.abc import Iterable
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

    def advance_to(self, watermark: Timestamp) -> None:
        """Raise the watermark to one the source sent itself; a lower one is ignored."""
        if watermark > self.watermark:
            self.watermark = watermark

    @property
    def raised(self) -> bool:
        """Whether a source's own watermark put W above what the data implies."""
        derived = (
            MIN_TIMESTAMP if self.max_seen == MIN_TIMESTAMP else self.max_seen - self.bound_us - 1
        )
        return self.watermark > max(derived, MIN_TIMESTAMP)

    def is_late(self, event_time: Timestamp) -> bool:
        """Whether a change is behind the watermark."""
        return event_time <= self.watermark


class WatermarkTracker:
    """The pipeline watermark over several inputs (source partitions).

    Each input has its own watermark: the bounded out-of-orderness one derived
    from its data, raised by any watermark the source sends itself
    (:meth:`observe_watermark`, as a Kafka or Flink source can). The pipeline
    watermark is the minimum over the inputs that are **active**. An input that
    has sent nothing for *more than* ``idle_timeout_us`` of processing time is
    idle and stops holding event time back (a quiet partition must not stall
    every window); silent for exactly the timeout, it is still active. When it
    sends again it rejoins, but the pipeline watermark never goes back: its
    elements behind ``W`` are late.

    **Declared inputs.** By default the minimum is over the inputs seen so far,
    so the first partition to speak sets ``W`` alone. Naming the inputs up front
    (``inputs=[...]``) makes one that has sent nothing yet hold ``W`` at its
    minimum, as Flink does with the splits of a source: no window fires before
    every partition has spoken, or gone idle (its idle clock starts when the
    tracker is built).

    >>> from streamrag.testing import ManualClock
    >>> clock = ManualClock(0)
    >>> wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    >>> wm.observe("a", 50); wm.observe("b", 20); wm.advance()
    19
    >>> clock.advance_us(101); wm.observe("a", 60); wm.advance()  # b is idle now
    59
    >>> wm.observe("b", 30); wm.advance()  # b is back, but W does not go back
    59
    >>> declared = WatermarkTracker(clock=clock, inputs=["a", "b"])
    >>> declared.observe("a", 50); declared.advance() == MIN_TIMESTAMP  # b holds W
    True
    >>> declared.observe_watermark("b", 40); declared.advance()  # b's source says 40
    40
    """

    def __init__(
        self,
        *,
        bound_us: Duration = 0,
        idle_timeout_us: Duration | None = None,
        clock: Clock,
        inputs: Iterable[str] | None = None,
    ) -> None:
        if idle_timeout_us is not None and idle_timeout_us <= 0:
            msg = f"idle_timeout must be positive, found {idle_timeout_us} µs"
            raise ArgumentError(msg)
        self.bound_us = bound_us
        self.idle_timeout_us = idle_timeout_us
        self.clock = clock
        self.declared: tuple[str, ...] = tuple(dict.fromkeys(inputs or ()))
        self._inputs: dict[str, BoundedOutOfOrderness] = {}
        self._last_data_us: dict[str, Timestamp] = {}
        self.watermark: Timestamp = MIN_TIMESTAMP
        self.finished = False
        # Inputs appear while the API reads: readers and the writer share this lock.
        self._lock = threading.Lock()
        self._declare(clock.now_us())

    def _declare(self, now: Timestamp) -> None:
        """Register the declared inputs not known yet: at the minimum, silent since ``now``."""
        for partition in self.declared:
            if partition not in self._inputs:
                self._inputs[partition] = BoundedOutOfOrderness(self.bound_us)
                self._last_data_us[partition] = now

    def _input(self, partition: str) -> BoundedOutOfOrderness:
        w = self._inputs.get(partition)
        if w is None:
            w = self._inputs[partition] = BoundedOutOfOrderness(self.bound_us)
        return w

    def observe(self, partition: str, max_event_time: Timestamp) -> None:
        """Record that ``partition`` delivered data up to ``max_event_time`` (now)."""
        with self._lock:
            self._input(partition).observe(max_event_time)
            self._last_data_us[partition] = self.clock.now_us()

    def observe_watermark(self, partition: str, watermark: Timestamp) -> None:
        """Record a watermark that ``partition``'s source sent itself.

        It raises that input's watermark (a lower one than it holds is ignored:
        watermarks never go back) and, as a sign of life, keeps it active. Call
        :meth:`advance` to recompute the pipeline watermark.
        """
        with self._lock:
            self._input(partition).advance_to(watermark)
            self._last_data_us[partition] = self.clock.now_us()

    @property
    def partitions(self) -> int:
        """Inputs declared or seen so far, idle or not."""
        return len(self._inputs)

    def active(self) -> list[str]:
        """Inputs that are not idle now (silent for at most the idle timeout)."""
        if self.idle_timeout_us is None:
            with self._lock:
                return list(self._inputs)
        horizon = self.clock.now_us() - self.idle_timeout_us
        with self._lock:
            return [p for p, t in self._last_data_us.items() if t >= horizon]

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
        """Per-input maximum event times and the watermark, as plain data.

        Two keys appear only when they hold something, so that a snapshot without
        them reads as before: ``idle``, the inputs idle now (they stay idle after
        a restore until they send again), and ``input_watermarks``, the inputs
        whose watermark a source's own watermark raised above what their data
        implies.
        """
        idle = set(self._inputs).difference(self.active())
        with self._lock:
            inputs = {p: w.max_seen for p, w in self._inputs.items()}
            raised = {p: w.watermark for p, w in self._inputs.items() if w.raised}
        state: dict[str, Any] = {
            "watermark": self.watermark,
            "finished": self.finished,
            "inputs": inputs,
        }
        if idle:
            state["idle"] = sorted(idle)
        if raised:
            state["input_watermarks"] = raised
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`snapshot`.

        Inputs idle at the snapshot stay idle until they send again; every other
        input (and every input of a snapshot that does not list idle ones) counts
        as active from now.
        """
        now = self.clock.now_us()
        idle = set(state.get("idle", ()))
        raised = state.get("input_watermarks", {})
        with self._lock:
            self.watermark = int(state["watermark"])
            self.finished = bool(state.get("finished", False))
            self._inputs = {}
            self._last_data_us = {}
            for partition, max_seen in state["inputs"].items():
                w = self._inputs[partition] = BoundedOutOfOrderness(self.bound_us)
                w.observe(int(max_seen))
                if partition in raised:
                    w.advance_to(int(raised[partition]))
                # An idle input's last data is as good as infinitely old.
                self._last_data_us[partition] = MIN_TIMESTAMP if partition in idle else now
            self._declare(now)
