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

from streamrag.timing import MIN_TIMESTAMP, Duration, Timestamp

__all__ = ["BoundedOutOfOrderness"]


class BoundedOutOfOrderness:
    """Watermark = newest event time seen − bound − 1 µs, never decreasing."""

    def __init__(self, bound_us: Duration = 0) -> None:
        if bound_us < 0:
            msg = f"bound_us must be >= 0, found {bound_us}"
            raise ValueError(msg)
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
