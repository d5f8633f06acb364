"""Every record counted: where each record read stands, at every moment another thread looks.

Invariant 4 says a record is applied or dead-lettered with its reason, and
counted. The :class:`Ledger` keeps it as an identity that holds whenever
``/v1/status`` reads it::

    ingested == applied + dead_lettered + uncommitted
    uncommitted == being read + waiting in the batcher + being embedded
                   + waiting at the last commit and not read again yet

A record moves from one term to the next in one step under one lock — read
(decoded and chunked), queued in the batcher, taken for a commit, then applied
or refused — so no reader ever sees it in two places or in none. Window side
outputs (late changes, changes without a window's value) are indexed all the
same and counted apart (``window_late``, ``window_invalid``, ``window_errors``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

from streamrag.timing import Timestamp

__all__ = ["Ledger", "PipelineStats"]


@dataclass
class PipelineStats:
    """Running counts of what the pipeline did (written into every commit's cursor)."""

    ingested: int = 0
    applied: int = 0
    stale: int = 0
    dead_lettered: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    commits: int = 0
    past_versions: int = 0
    """Changes older than their document's current version, kept in its history."""
    last_commit_us: Timestamp | None = None
    last_freshness_us: int | None = None
    window_results: int = 0
    window_late: int = 0
    window_invalid: int = 0
    window_errors: int = 0
    """Changes the event-time stage failed on (applied to the index all the same)."""
    embed_retries: int = 0
    poison: int = 0
    replayed: int = 0
    """Waiting changes read again after a restart (counted once, when first read)."""
    skipped: int = 0
    """Records read again after a restart that were already committed or refused."""
    superseded: int = 0
    """Changes waiting at a crash that the source replaced with newer reads (a snapshot
    read again, a file changed meanwhile): taken out of ``ingested``, their new reads in."""


class Ledger:
    """The counts and the records in flight, moved under one lock (see the module docstring).

    ``waiting`` and ``unread`` report the batcher's queue and the changes a
    restart has still to read again; they are read under the same lock.
    """

    def __init__(self, waiting: Callable[[], int], unread: Callable[[], int]) -> None:
        self.stats = PipelineStats()
        self.lock = threading.Lock()
        self.reading = 0
        """Records read and not yet queued or refused."""
        self.in_flight = 0
        """Records taken from the batcher for the commit being made."""
        self._waiting = waiting
        self._unread = unread

    @contextmanager
    def moving(self) -> Iterator[PipelineStats]:
        """Hold the lock for a move that also changes the batcher (queue, take, put back)."""
        with self.lock:
            yield self.stats

    def add(self, **counts: int) -> None:
        """Add to counts that move no record (side outputs, skipped records, retries)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    def read(self, n: int) -> None:
        """``n`` records read for the first time."""
        with self.lock:
            self.reading += n
            self.stats.ingested += n

    def refused(self, n: int) -> None:
        """``n`` records being read were refused (dead-lettered)."""
        with self.lock:
            self.stats.dead_lettered += n
            self.reading -= n

    def committed(
        self, delta: Mapping[str, int], now: Timestamp, first_arrival: Timestamp | None
    ) -> None:
        """The records in flight are applied or refused: add the commit's counts.

        ``first_arrival`` is when the oldest change of the commit was read (None
        for a commit of window output alone: it says nothing about freshness).
        """
        with self.lock:
            for name, value in delta.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
            self.in_flight = 0
            self.stats.last_commit_us = now
            if first_arrival is not None:
                self.stats.last_freshness_us = now - first_arrival

    def restore(self, saved: Mapping[str, Any]) -> None:
        """The counts as a committed cursor holds them."""
        with self.lock:
            for name, value in saved.items():
                if hasattr(self.stats, name):
                    setattr(self.stats, name, value)

    def snapshot(self) -> dict[str, Any]:
        """The counts as plain values, for a cursor."""
        with self.lock:
            return asdict(self.stats)

    def uncommitted_locked(self) -> int:
        """Records read but not committed or refused yet (call with :attr:`lock` held)."""
        return self._waiting() + self.in_flight + self.reading + self._unread()

    @property
    def uncommitted(self) -> int:
        """Records read but not committed or refused yet (also those a restart reads again)."""
        with self.lock:
            return self.uncommitted_locked()

    def counts(self) -> tuple[PipelineStats, int]:
        """The counts and the uncommitted records at one instant (they always add up)."""
        with self.lock:
            return replace(self.stats), self.uncommitted_locked()
