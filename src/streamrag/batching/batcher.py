"""The micro-batcher: when pending changes go to the embedder, and with whom.

Embedding and committing one change at a time wastes the embedder (it is far
faster per item in batches) and the index (one epoch per change). Waiting for
large batches makes changes visible late. Changes wait in one queue per
semantic partition (:mod:`.partition`) and a partition is flushed at whichever
comes first:

* **size** — its pending chunks reach the target batch size (set by the
  :mod:`adaptive controller <.adaptive>` within ``max_batch_size``) or its
  pending tokens reach ``max_batch_tokens``;
* **deadline** — ``max_delay_ms`` of processing time has passed since its oldest
  change arrived. No change is ever held past its deadline: a batch cut by a
  deadline also takes every other partition whose deadline has passed;
* **watermark** — the watermark has passed the end of the partition's date
  bucket, so nothing more is expected for it;
* **tick** — with ``tick_us`` set, deadlines also fall on processing-time ticks
  aligned to the epoch, so batches (and the window firings that follow each
  batch's watermark) run on one schedule — the hybrid of micro-batches and
  sliding windows: a 1 s tick over a 5 s sliding window gives a fresh
  aggregate and a fresh index every second.

Sizes are counted in chunks (a delete counts as one) and in tokens, because the
pipeline chunks a change before it is queued.

The batcher is bounded: :attr:`MicroBatcher.full` turns true at
``max_pending`` chunks or ``max_pending_bytes`` bytes of text, and the
pipeline stops reading its sources until it clears, which is how a slow
embedder pushes back on the sources. It is safe to use from one thread that
adds and another that takes.

>>> from streamrag.changes import Change, Op
>>> from streamrag.testing import ManualClock
>>> clock = ManualClock(0)
>>> b = MicroBatcher(max_batch_size=3, max_delay_ms=20, clock=clock)
>>> b.add(ChangeBatch.from_changes([Change("t", "d", Op.DELETE, 1)]))
>>> b.due(), b.wait_us()
(False, 20000)
>>> clock.advance_ms(20); b.due()
True
>>> p = b.take(); len(p.changes), p.reason, b.pending
(1, 'deadline', 0)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.batching.adaptive import AdaptiveController
from streamrag.batching.partition import PartitionKey
from streamrag.changes import ChangeBatch
from streamrag.errors import ArgumentError
from streamrag.timing import MIN_TIMESTAMP, US_PER_MS, Clock, Duration, Timestamp

__all__ = ["MicroBatcher", "PendingBatch"]


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """Changes taken from the batcher, with what was prepared for each of them.

    ``first_arrival_us`` is the processing time the oldest of them arrived —
    for changes found after a poll that found nothing, that poll's time, so a
    deadline bounds the time from the write; ``first_read_us`` is when the
    oldest of them was read (the freshness a commit reports; None: the same).
    ``reason`` says which limit cut the batch (size, deadline, watermark, forced).
    """

    changes: ChangeBatch
    first_arrival_us: Timestamp
    prepared: list[Any] = field(default_factory=list)
    chunks: int = 0
    tokens: int = 0
    reason: str = "forced"
    segments: tuple[tuple[Hashable, int, Timestamp, Timestamp], ...] = ()
    """(partition, rows, arrival, read) of each queued piece, in order: for :meth:`put_back`."""
    row_chunks: npt.NDArray[np.int64] | None = None
    row_tokens: npt.NDArray[np.int64] | None = None
    row_bytes: npt.NDArray[np.int64] | None = None
    first_read_us: Timestamp | None = None

    @property
    def read_us(self) -> Timestamp:
        """When the oldest change was read (its arrival where that was not kept apart)."""
        return self.first_arrival_us if self.first_read_us is None else self.first_read_us

    @classmethod
    def merge(cls, batches: Sequence[PendingBatch]) -> PendingBatch:
        """Several taken batches as one (for a commit that groups micro-batches)."""
        if len(batches) == 1:
            return batches[0]

        def rows(attr: str) -> npt.NDArray[np.int64] | None:
            cols = [getattr(b, attr) for b in batches]
            if any(c is None for c in cols):
                return None
            return np.concatenate(cols)

        return cls(
            ChangeBatch.concat([b.changes for b in batches]),
            min(b.first_arrival_us for b in batches),
            [
                p
                for b in batches
                for p in (b.prepared or [None] * len(b.changes))  # keep rows aligned
            ],
            sum(b.chunks for b in batches),
            sum(b.tokens for b in batches),
            batches[0].reason,
            tuple(s for b in batches for s in (b.segments or b.whole())),
            rows("row_chunks"),
            rows("row_tokens"),
            rows("row_bytes"),
            min(b.read_us for b in batches),
        )

    def whole(self) -> tuple[tuple[Hashable, int, Timestamp, Timestamp], ...]:
        """The batch as one piece of :attr:`segments` (when it was not taken in pieces)."""
        return (((), len(self.changes), self.first_arrival_us, self.read_us),)


@dataclass(slots=True)
class _Segment:
    changes: ChangeBatch
    prepared: list[Any]
    weights: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    arrived_us: Timestamp
    sizes: npt.NDArray[np.int64]
    read_us: Timestamp

    def split(self, n: int) -> tuple[_Segment, _Segment]:
        head = _Segment(
            self.changes.slice(0, n),
            self.prepared[:n],
            self.weights[:n],
            self.tokens[:n],
            self.arrived_us,
            self.sizes[:n],
            self.read_us,
        )
        tail = _Segment(
            self.changes.slice(n, len(self.changes)),
            self.prepared[n:],
            self.weights[n:],
            self.tokens[n:],
            self.arrived_us,
            self.sizes[n:],
            self.read_us,
        )
        return head, tail


@dataclass(slots=True)
class _Queue:
    segments: deque[_Segment] = field(default_factory=deque)
    chunks: int = 0
    tokens: int = 0


class MicroBatcher:
    """Per-partition queues flushed by size, deadline, watermark or tick."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_delay_ms: int,
        clock: Clock,
        max_batch_tokens: int | None = None,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        partition: PartitionKey | None = None,
        controller: AdaptiveController | None = None,
        tick_us: Duration | None = None,
    ) -> None:
        if max_batch_size <= 0:
            msg = f"max_batch_size must be positive, found {max_batch_size}"
            raise ArgumentError(msg)
        if tick_us is not None and tick_us <= 0:
            msg = f"tick must be positive, found {tick_us} µs"
            raise ArgumentError(msg)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_delay_us = max_delay_ms * US_PER_MS
        self.max_pending = max_pending or max_batch_size
        self.max_pending_bytes = max_pending_bytes
        self.partition = partition
        self.controller = controller
        self.tick_us = tick_us
        self._clock = clock
        self._queues: dict[Hashable, _Queue] = {}
        self._pending = 0
        self._pending_chunks = 0  # kept as a counter: other threads read it
        self._pending_bytes = 0
        self._watermark: Timestamp = MIN_TIMESTAMP
        self._lock = threading.Lock()

    # -- state -----------------------------------------------------------------

    @property
    def target_size(self) -> int:
        """Chunks per batch now: the controller's choice, or ``max_batch_size``."""
        if self.controller is None:
            return self.max_batch_size
        return min(self.controller.target, self.max_batch_size)

    @property
    def pending(self) -> int:
        """Changes waiting to be flushed."""
        return self._pending

    @property
    def pending_chunks(self) -> int:
        """Chunks waiting to be flushed (deletes count one each)."""
        return self._pending_chunks

    @property
    def pending_bytes(self) -> int:
        """Bytes of text waiting to be flushed."""
        return self._pending_bytes

    def positions(self) -> dict[str, list[int]]:
        """Source and offset of every waiting change: what a checkpoint must replay."""
        out: dict[str, list[int]] = {}
        with self._lock:
            for q in self._queues.values():
                for seg in q.segments:
                    ch = seg.changes
                    for src, off in zip(ch.sources, ch.offsets.tolist(), strict=True):
                        out.setdefault(src, []).append(off)
        for offsets in out.values():
            offsets.sort()
        return out

    def waiting_prepared(self) -> list[Any]:
        """What was prepared for every waiting change (None for a delete), in queue order."""
        with self._lock:
            return [p for q in self._queues.values() for seg in q.segments for p in seg.prepared]

    @property
    def partitions(self) -> int:
        """Partitions with changes waiting."""
        return len(self._queues)

    @property
    def full(self) -> bool:
        """True when ``max_pending`` chunks (or ``max_pending_bytes``) wait: sources pause."""
        if self.max_pending_bytes is not None and self._pending_bytes >= self.max_pending_bytes:
            return True
        return self._pending_chunks >= self.max_pending

    def set_watermark(self, watermark: Timestamp) -> None:
        """Tell the batcher how far event time has progressed (closes date buckets)."""
        self._watermark = max(self._watermark, watermark)

    # -- adding ----------------------------------------------------------------

    def add(
        self,
        changes: ChangeBatch,
        arrived_us: Timestamp | None = None,
        *,
        prepared: Sequence[Any] | None = None,
        chunks: Sequence[int] | npt.NDArray[np.int64] | None = None,
        tokens: Sequence[int] | npt.NDArray[np.int64] | None = None,
        sizes: Sequence[int] | npt.NDArray[np.int64] | None = None,
        read_us: Timestamp | None = None,
    ) -> None:
        """Queue changes that arrived at ``arrived_us`` and were read at ``read_us`` (default: now).

        ``prepared`` is carried along, one item per change (the pipeline passes
        each change's chunks); ``chunks``, ``tokens`` and ``sizes`` (bytes) are
        their sizes. Without ``sizes`` a change weighs the length of its text.
        """
        n = len(changes)
        if n == 0:
            return
        now = self._clock.now_us()
        read = now if read_us is None else min(read_us, now)
        arrived = read if arrived_us is None else min(arrived_us, read)
        prep = list(prepared) if prepared is not None else [None] * n
        weights = np.maximum(np.asarray(chunks if chunks is not None else [1] * n), 1)
        toks = np.asarray(tokens if tokens is not None else [0] * n, dtype=np.int64)
        if sizes is None:
            sizes = [len(p.get("text") or "") for p in changes.payloads]
        nbytes = np.asarray(sizes, dtype=np.int64)
        if self.partition is None:
            groups: dict[Hashable, list[int]] = {(): list(range(n))}
        else:
            groups = {}
            for i, key in enumerate(self.partition.keys(changes)):
                groups.setdefault(key, []).append(i)
        with self._lock:
            for key, rows in groups.items():
                if len(rows) == n:
                    seg = _Segment(
                        changes, prep, weights.astype(np.int64), toks, arrived, nbytes, read
                    )
                else:
                    seg = _Segment(
                        changes.take(rows),
                        [prep[i] for i in rows],
                        weights[rows].astype(np.int64),
                        toks[rows],
                        arrived,
                        nbytes[rows],
                        read,
                    )
                q = self._queues.get(key)
                if q is None:
                    q = self._queues[key] = _Queue()
                q.segments.append(seg)
                added = int(seg.weights.sum())
                q.chunks += added
                self._pending_chunks += added
                q.tokens += int(seg.tokens.sum())
                self._pending_bytes += int(seg.sizes.sum())
            self._pending += n

    # -- deciding --------------------------------------------------------------

    def _deadline(self, arrived: Timestamp) -> Timestamp:
        deadline = arrived + self.max_delay_us
        if self.tick_us is not None:
            deadline = min(deadline, arrived - arrived % self.tick_us + self.tick_us)
        return deadline

    def _reason(self, key: Hashable, q: _Queue, now: Timestamp) -> str | None:
        if self._deadline(q.segments[0].arrived_us) <= now:
            return "deadline"
        if q.chunks >= self.target_size or (
            self.max_batch_tokens is not None and q.tokens >= self.max_batch_tokens
        ):
            return "size"
        if self.partition is not None:
            end = self.partition.bucket_end(key)
            if end is not None and end - 1 <= self._watermark:
                return "watermark"
        return None

    def wait_us(self) -> Timestamp | None:
        """Processing time until some partition is due (0 if one is), or None when empty."""
        with self._lock:
            if not self._queues:
                return None
            now = self._clock.now_us()
            soonest = None
            for key, q in self._queues.items():
                if self._reason(key, q, now) is not None:
                    return 0
                left = self._deadline(q.segments[0].arrived_us) - now
                soonest = left if soonest is None else min(soonest, left)
            return max(0, soonest or 0)

    def due(self) -> bool:
        """Whether a batch should be flushed now."""
        wait = self.wait_us()
        return wait is not None and wait == 0

    # -- taking ----------------------------------------------------------------

    def take(self, max_chunks: int | None = None) -> PendingBatch:
        """Cut the most urgent batch: expired deadlines first, then full, then closed buckets.

        Without a due partition (a forced flush), partitions go oldest first and
        the batch is filled from as many of them as fit, each kept together.
        ``max_chunks`` caps the batch below the usual size (a change's chunks are
        never split, so one change always fits).
        """
        with self._lock:
            now = self._clock.now_us()
            if not self._queues:
                return PendingBatch(ChangeBatch.empty(), now)
            rank = {"deadline": 0, "size": 1, "watermark": 2}
            candidates = []
            for key, q in self._queues.items():
                reason = self._reason(key, q, now)
                order = rank[reason] if reason is not None else 3
                candidates.append((order, q.segments[0].arrived_us, key, reason))
            candidates.sort(key=lambda c: (c[0], c[1]))
            order, _, key, reason = candidates[0]
            keys = [key]
            if reason == "deadline":  # take every partition whose deadline has passed
                keys += [c[2] for c in candidates[1:] if c[0] == 0]
            elif reason is None:  # forced (a drain or a bounded replay): fill the batch
                keys += [c[2] for c in candidates[1:]]
            cap = self.target_size if max_chunks is None else min(self.target_size, max_chunks)
            return self._cut(keys, reason or "forced", now, cap)

    def _cut(
        self, keys: list[Hashable], reason: str, now: Timestamp, size_cap: int
    ) -> PendingBatch:
        token_cap = self.max_batch_tokens
        taken: list[_Segment] = []
        meta: list[tuple[Hashable, int, Timestamp, Timestamp]] = []
        chunks = tokens = 0
        for key in keys:
            q = self._queues[key]
            while q.segments and (chunks < size_cap or not taken):
                if token_cap is not None and tokens >= token_cap and taken:
                    break
                seg = q.segments[0]
                # Rows that fit: by chunks and tokens, at least one row per batch.
                room = size_cap - chunks
                fit = int(np.searchsorted(np.cumsum(seg.weights), room, side="right"))
                if token_cap is not None:
                    t_room = token_cap - tokens
                    fit = min(fit, int(np.searchsorted(np.cumsum(seg.tokens), t_room, "right")))
                if not taken:
                    fit = max(fit, 1)
                if fit == 0:
                    break
                q.segments.popleft()
                if fit < len(seg.changes):
                    seg, rest = seg.split(fit)
                    q.segments.appendleft(rest)
                c, t = int(seg.weights.sum()), int(seg.tokens.sum())
                q.chunks -= c
                self._pending_chunks -= c
                q.tokens -= t
                self._pending_bytes -= int(seg.sizes.sum())
                chunks += c
                tokens += t
                taken.append(seg)
                meta.append((key, len(seg.changes), seg.arrived_us, seg.read_us))
            if not q.segments:
                del self._queues[key]
            if chunks >= size_cap:
                break
        n = sum(len(s.changes) for s in taken)
        self._pending -= n
        return PendingBatch(
            ChangeBatch.concat([s.changes for s in taken]),
            min((s.arrived_us for s in taken), default=now),
            [p for s in taken for p in s.prepared],
            chunks,
            tokens,
            reason,
            tuple(meta),
            np.concatenate([s.weights for s in taken]) if taken else None,
            np.concatenate([s.tokens for s in taken]) if taken else None,
            np.concatenate([s.sizes for s in taken]) if taken else None,
            min((s.read_us for s in taken), default=now),
        )

    def put_back(self, pending: PendingBatch) -> None:
        """Return a batch that could not be committed to the front of its queues."""
        if not len(pending.changes):
            return
        with self._lock:
            start = 0
            pieces = []
            for key, n, arrived, read in pending.segments or pending.whole():
                stop = start + n
                pieces.append((key, start, stop, arrived, read))
                start = stop
            n = len(pending.changes)
            all_weights = (
                pending.row_chunks if pending.row_chunks is not None else np.ones(n, dtype=np.int64)
            )
            all_tokens = (
                pending.row_tokens
                if pending.row_tokens is not None
                else np.zeros(n, dtype=np.int64)
            )
            all_sizes = (
                pending.row_bytes if pending.row_bytes is not None else np.zeros(n, dtype=np.int64)
            )
            for key, lo, hi, arrived, read in reversed(pieces):
                prep = pending.prepared[lo:hi] or [None] * (hi - lo)
                changes = pending.changes.slice(lo, hi)
                weights, toks = all_weights[lo:hi], all_tokens[lo:hi]
                seg = _Segment(changes, prep, weights, toks, arrived, all_sizes[lo:hi], read)
                q = self._queues.get(key)
                if q is None:
                    q = self._queues[key] = _Queue()
                q.segments.appendleft(seg)
                q.chunks += int(weights.sum())
                self._pending_chunks += int(weights.sum())
                q.tokens += int(toks.sum())
                self._pending_bytes += int(seg.sizes.sum())
            self._pending += len(pending.changes)
