"""Time in streamrag: one integer type, microseconds since the Unix epoch, UTC.

Two clocks matter in a streaming engine:

* **event time** — when a change happened at its source (``Change.event_time``).
  It decides which version of a document wins and what "the past 24 hours" means.
* **processing time** — when streamrag handles a record. It drives micro-batch
  deadlines and freshness figures.

Both are plain ``int`` microseconds (``Timestamp``); spans are ``Duration``, also
integer microseconds. Names that hold raw integers carry the unit (``*_us``,
``*_ms``). Naive datetimes are never accepted. Processing time is read through a
:class:`Clock`, so tests move it by hand instead of sleeping.

>>> parse_timestamp("2024-05-01T12:00:00Z")
1714564800000000
>>> format_timestamp(1714564800000000)
'2024-05-01T12:00:00Z'
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from streamrag.errors import TimestampError

__all__ = [
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "US_PER_MS",
    "US_PER_S",
    "Clock",
    "Duration",
    "SystemClock",
    "Timestamp",
    "format_timestamp",
    "parse_timestamp",
]

Timestamp = int
"""Microseconds since 1970-01-01T00:00:00Z."""

Duration = int
"""A span of time in microseconds."""

US_PER_MS = 1_000
US_PER_S = 1_000_000

MIN_TIMESTAMP: Timestamp = -(2**63)
"""Before every event: the watermark before anything was seen."""

MAX_TIMESTAMP: Timestamp = 2**63 - 1
"""After every event: the watermark at the end of a bounded input."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)  # noqa: DTZ001 - plain UTC arithmetic, formatted with a Z
_MAX_EPOCH_S = 253_402_300_799  # 9999-12-31T23:59:59Z


def parse_timestamp(value: object) -> Timestamp:
    """Turn an ISO-8601 string with a zone, or epoch seconds, into a Timestamp.

    Accepted: ``"2024-05-01T12:00:00Z"``, ``"2024-05-01T14:00:00+02:00"``,
    fractional seconds, and numbers (epoch seconds, int or float). A string
    without a zone is refused: its meaning depends on where it was written.

    >>> parse_timestamp(1.5)
    1500000
    >>> parse_timestamp("2024-05-01T12:00:00")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamrag.errors.TimestampError: timestamp '2024-05-01T12:00:00' has no time zone; add 'Z' ...
    """
    if isinstance(value, bool):
        msg = f"expected an ISO-8601 time or epoch seconds, found the boolean {value!r}"
        raise TimestampError(msg)
    if isinstance(value, int | float):
        if not -_MAX_EPOCH_S <= value <= _MAX_EPOCH_S:  # also false for NaN
            msg = f"epoch seconds {value!r} are outside years 1–9999; send seconds, not µs or ms"
            raise TimestampError(msg)
        return value * US_PER_S if isinstance(value, int) else round(value * US_PER_S)
    if not isinstance(value, str):
        msg = f"expected an ISO-8601 time or epoch seconds, found {type(value).__name__}"
        raise TimestampError(msg)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        msg = f"timestamp {value!r} is not ISO-8601; write it like '2024-05-01T12:00:00Z'"
        raise TimestampError(msg) from None
    if parsed.tzinfo is None:
        msg = f"timestamp {value!r} has no time zone; add 'Z' for UTC or an offset such as '+02:00'"
        raise TimestampError(msg)
    delta = parsed - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * US_PER_S + delta.microseconds


def format_timestamp(ts: Timestamp) -> str:
    """Format a Timestamp as ISO-8601 UTC with a ``Z``; microseconds only if non-zero.

    Every hit a query returns carries one, so this is on the serving path:
    ``isoformat`` of a naive datetime costs half of ``strftime``, and writes the
    four-digit year that :func:`parse_timestamp` reads back.

    >>> format_timestamp(1_714_521_600_123_456)
    '2024-05-01T00:00:00.123456Z'
    >>> format_timestamp(parse_timestamp("0001-01-01T00:00:00Z"))
    '0001-01-01T00:00:00Z'
    """
    seconds, micros = divmod(ts, US_PER_S)
    text = (_EPOCH_NAIVE + timedelta(seconds=seconds)).isoformat()
    if micros:
        text += f".{micros:06d}"
    return text + "Z"


@runtime_checkable
class Clock(Protocol):
    """Processing time, injected wherever a component needs "now"."""

    def now_us(self) -> Timestamp:
        """Current processing time in microseconds since the epoch."""
        ...


class SystemClock:
    """The real wall clock (``time.time_ns``). Never assume it moves forward."""

    def now_us(self) -> Timestamp:
        """Return the wall-clock time in microseconds."""
        return time.time_ns() // 1_000

    def __repr__(self) -> str:
        return "SystemClock()"
