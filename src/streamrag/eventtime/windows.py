"""Windows: which slice of event time an element is counted in.

A window is the half-open span ``[start, end)`` of event time; its last instant
is ``end - 1`` (:attr:`Window.max_timestamp`). Three kinds by time, as in Apache
Flink, Beam and Bytewax, all aligned to the Unix epoch (plus an optional offset),
and the global window:

* **tumbling** ``size``: back-to-back windows; an element is in exactly one.
* **sliding** ``size, slide``: a window starts every ``slide``; an element is in
  the ``size / slide`` windows that cover it.
* **session** ``gap``: each element opens ``[ts, ts + gap)``; windows of the same
  key that overlap *or touch* merge, so two elements exactly ``gap`` apart share a
  session.
* **global**: one window per key that never closes by time: it spans every
  calendar time (years 1 to 9999), and in practice the watermark reaches its end
  only at the end of a bounded input. It is used with
  a count trigger (:mod:`.triggers`), as Flink's and Beam's ``GlobalWindows``.

Window starts are ``offset + k * slide`` for whole ``k``, negative included, so
times before 1970 fall in windows too.

>>> Tumbling(10).assign(25)
[Window(start=20, end=30)]
>>> Tumbling(10).assign(-5)
[Window(start=-10, end=0)]
>>> Sliding(10, 5).assign(12)
[Window(start=10, end=20), Window(start=5, end=15)]
>>> Session(5).assign(12)
[Window(start=12, end=17)]
>>> Global().assign(12) == [GLOBAL_WINDOW]
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from streamrag.errors import ConfigError
from streamrag.timing import Duration, Timestamp

__all__ = ["GLOBAL_WINDOW", "Global", "Session", "Sliding", "Tumbling", "Window", "WindowAssigner"]


class Window(NamedTuple):
    """The span ``[start, end)`` of event time, in microseconds.

    A named tuple: windows are dictionary keys on the hot path, and a tuple
    hashes and compares in C.
    """

    start: Timestamp
    end: Timestamp

    @property
    def max_timestamp(self) -> Timestamp:
        """The last instant inside the window: the watermark at which it is complete."""
        return self.end - 1

    def touches(self, other: Window) -> bool:
        """Whether two windows overlap or meet end to start (sessions merge then)."""
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: Window) -> Window:
        """The smallest window holding both."""
        return Window(min(self.start, other.start), max(self.end, other.end))


class WindowAssigner(Protocol):
    """Maps an element's event time to the windows it belongs to."""

    @property
    def merging(self) -> bool:
        """True for session windows, which merge as elements arrive."""
        ...

    def assign(self, ts: Timestamp) -> list[Window]:
        """The windows an element at ``ts`` belongs to, latest first."""
        ...


def _positive(name: str, value: int) -> None:
    if value <= 0:
        msg = f"window {name} must be a positive number of microseconds, found {value}"
        raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``size_us`` starting every ``slide_us`` (plus ``offset_us``)."""

    size_us: Duration
    slide_us: Duration
    offset_us: Duration = 0

    def __post_init__(self) -> None:
        _positive("size", self.size_us)
        _positive("slide", self.slide_us)
        if self.slide_us > self.size_us:
            msg = (
                f"a sliding window's slide ({self.slide_us} µs) is longer than its size "
                f"({self.size_us} µs): elements between windows would belong to none; "
                "use a slide no longer than the size"
            )
            raise ConfigError(msg)

    @property
    def merging(self) -> bool:
        """Sliding windows never merge."""
        return False

    @property
    def windows_per_element(self) -> int:
        """The most windows one element can belong to: ``ceil(size / slide)``."""
        return -(-self.size_us // self.slide_us)

    def last_start(self, ts: Timestamp) -> Timestamp:
        """Start of the latest window holding ``ts`` (floor modulo: right for negatives)."""
        return ts - (ts - self.offset_us) % self.slide_us

    def assign(self, ts: Timestamp) -> list[Window]:
        """The windows that cover ``ts``, latest first."""
        start = self.last_start(ts)
        out = []
        while start > ts - self.size_us:
            out.append(Window(start, start + self.size_us))
            start -= self.slide_us
        return out

    def last_starts(self, ts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`last_start` for a column of times."""
        return ts - np.mod(ts - self.offset_us, self.slide_us)


def Tumbling(size_us: Duration, offset_us: Duration = 0) -> Sliding:
    """Back-to-back windows of ``size_us``: a sliding window whose slide is its size."""
    return Sliding(size_us, size_us, offset_us)


@dataclass(frozen=True, slots=True)
class Session:
    """Windows that grow while elements keep coming less than ``gap_us`` apart."""

    gap_us: Duration

    def __post_init__(self) -> None:
        _positive("gap", self.gap_us)

    @property
    def merging(self) -> bool:
        """Sessions merge when a new element bridges or touches them."""
        return True

    def assign(self, ts: Timestamp) -> list[Window]:
        """Each element opens its own session ``[ts, ts + gap)``; merging comes later."""
        return [Window(ts, ts + self.gap_us)]


GLOBAL_WINDOW = Window(-62_135_596_800_000_000, 253_402_300_799_999_999)
"""The one window of :class:`Global`: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z.

Its bounds are the widest that ISO-8601 results can show (``MIN_TIMESTAMP`` and
``MAX_TIMESTAMP`` have no calendar date), as Beam's global window ends a day
before its maximum timestamp, so that the end of input (``W = MAX_TIMESTAMP``)
passes it. Every element of a key belongs to it, whatever its time.
"""


@dataclass(frozen=True, slots=True)
class Global:
    """One window per key over all of event time, which only the end of input closes."""

    @property
    def merging(self) -> bool:
        """There is one window per key: nothing to merge."""
        return False

    def assign(self, ts: Timestamp) -> list[Window]:
        """Every element belongs to the global window."""
        return [GLOBAL_WINDOW]
