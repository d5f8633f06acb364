"""Stage ⑥ of the data path: the micro-batcher.

Embedding and committing one change at a time wastes the embedder (it is far
faster per item in batches) and the index (one epoch per change). Waiting for
large batches makes changes visible late. The micro-batcher flushes at
whichever comes first:

* ``max_batch_size`` changes are pending, or
* ``max_delay_ms`` of processing time has passed since the oldest pending
  change arrived — this bounds freshness.

It never holds more than it is given; the pipeline stops reading its sources
while the batcher is full (:attr:`MicroBatcher.full`), which is how a slow
embedder pushes back on the sources.

>>> from streamrag.changes import Change, Op
>>> from streamrag.testing import ManualClock
>>> clock = ManualClock(0)
>>> b = MicroBatcher(max_batch_size=3, max_delay_ms=20, clock=clock)
>>> b.add(ChangeBatch.from_changes([Change("t", "d", Op.DELETE, 1)]))
>>> b.due(), b.wait_us()
(False, 20000)
>>> clock.advance_ms(20); b.due()
True
>>> len(b.take().changes), b.pending
(1, 0)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from streamrag.changes import ChangeBatch
from streamrag.timing import US_PER_MS, Clock, Timestamp

__all__ = ["MicroBatcher", "PendingBatch"]


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """Changes taken from the batcher, with the processing time the oldest arrived."""

    changes: ChangeBatch
    first_arrival_us: Timestamp


class MicroBatcher:
    """Groups changes into micro-batches by size and processing-time deadline."""

    def __init__(self, *, max_batch_size: int, max_delay_ms: int, clock: Clock) -> None:
        if max_batch_size <= 0:
            msg = f"max_batch_size must be positive, found {max_batch_size}"
            raise ValueError(msg)
        self.max_batch_size = max_batch_size
        self.max_delay_us = max_delay_ms * US_PER_MS
        self._clock = clock
        self._queue: deque[tuple[ChangeBatch, Timestamp]] = deque()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Changes waiting to be flushed."""
        return self._pending

    @property
    def full(self) -> bool:
        """True when a full batch is waiting: sources should pause."""
        return self._pending >= self.max_batch_size

    def add(self, changes: ChangeBatch, arrived_us: Timestamp | None = None) -> None:
        """Queue changes that arrived at ``arrived_us`` (default: now)."""
        if len(changes):
            now = self._clock.now_us()
            arrived = now if arrived_us is None else min(arrived_us, now)
            self._queue.append((changes, arrived))
            self._pending += len(changes)

    def wait_us(self) -> Timestamp | None:
        """Processing time until the deadline (0 if due), or None when empty."""
        if not self._queue:
            return None
        if self.full:
            return 0
        left = self._queue[0][1] + self.max_delay_us - self._clock.now_us()
        return max(0, left)

    def due(self) -> bool:
        """Whether a batch should be flushed now."""
        wait = self.wait_us()
        return wait is not None and wait == 0

    def take(self) -> PendingBatch:
        """Remove and return up to ``max_batch_size`` of the oldest changes."""
        taken: list[ChangeBatch] = []
        size = 0
        first = self._queue[0][1] if self._queue else self._clock.now_us()
        while self._queue and size < self.max_batch_size:
            batch, arrived = self._queue.popleft()
            room = self.max_batch_size - size
            if len(batch) > room:
                self._queue.appendleft((batch.slice(room, len(batch)), arrived))
                batch = batch.slice(0, room)
            taken.append(batch)
            size += len(batch)
        self._pending -= size
        return PendingBatch(ChangeBatch.concat(taken), first)

    def put_back(self, pending: PendingBatch) -> None:
        """Return a batch that could not be committed to the front of the queue."""
        if len(pending.changes):
            self._queue.appendleft((pending.changes, pending.first_arrival_us))
            self._pending += len(pending.changes)
