"""Queries first: the ingest threads step aside, briefly, while queries are in flight.

Queries and ingest share one interpreter lock. While the reader or the
committer runs Python (decoding, chunking, planning a commit), a query's every
hop between threads waits for the lock (see ``serve.switch_interval_ms``).
:class:`QueryPriority` counts the queries in flight; before each unit of work —
one poll, one commit — the ingest threads call :meth:`QueryPriority.step_aside`,
which waits until no query is in flight or ``max_yield_s`` has passed, holding
no lock meanwhile. So a query in flight runs alone between two units of ingest
work, and ingest never waits more than ``max_yield_s`` per unit: under a
steady query load it loses at most that share of its time, and with no query
in flight it loses nothing.
"""

from __future__ import annotations

import threading

from streamrag.errors import ArgumentError

__all__ = ["QueryPriority"]


class QueryPriority:
    """The number of queries in flight, and the ingest threads' bounded wait for none."""

    def __init__(self, max_yield_s: float) -> None:
        if max_yield_s < 0:
            msg = f"max_yield_s must be zero or more, found {max_yield_s}"
            raise ArgumentError(msg)
        self.max_yield_s = max_yield_s
        self._cond = threading.Condition()
        self._in_flight = 0
        self.steps_aside = 0
        """Units of ingest work that waited for queries (a counter for status and tests)."""

    @property
    def in_flight(self) -> int:
        """Queries entered and not yet left."""
        return self._in_flight

    def enter(self) -> None:
        """A query starts (is queued for embedding and search)."""
        with self._cond:
            self._in_flight += 1

    def leave(self) -> None:
        """A query is answered (or failed); the last one out wakes the ingest threads."""
        with self._cond:
            self._in_flight -= 1
            if self._in_flight <= 0:
                self._in_flight = 0
                self._cond.notify_all()

    def step_aside(self) -> bool:
        """Wait, up to ``max_yield_s``, until no query is in flight; True if it waited.

        Called by an ingest thread between units of work. Returns at once when
        no query is in flight or yielding is off (``max_yield_s`` 0).
        """
        if self.max_yield_s <= 0 or self._in_flight == 0:  # a racy read: only a hint
            return False
        with self._cond:
            if self._in_flight == 0:
                return False
            self.steps_aside += 1
            self._cond.wait_for(lambda: self._in_flight == 0, timeout=self.max_yield_s)
        return True
