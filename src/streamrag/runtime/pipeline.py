"""The pipeline: the stages of the data path wired top to bottom.

::

    source ─► decode (dead letters) ─► event time (watermark, windows, late output)
           ─► chunk ─► micro-batcher (partitioned; size, deadline, watermark)
           ─► versions the index wants ─► embed what changed ─► commit one epoch

The pipeline has two halves that can run in two threads (see :mod:`.executor`),
so the next batch is decoded and chunked while the current one embeds:

* :meth:`Pipeline.poll` reads what the source has (unless the batcher is full,
  which is how backpressure reaches the source), decodes it, runs the event-time
  stage and chunks each upsert, then queues the changes in the batcher;
* :meth:`Pipeline.flush` takes every batch that is due, embeds it and commits it.

:meth:`Pipeline.step` does one of each, for a single thread. The pipeline never
sleeps and never reads the wall clock itself: time comes from the injected
:class:`~streamrag.timing.Clock`, so tests drive it with a
:class:`~streamrag.testing.ManualClock`.

**Exactly once.** Every commit carries a *cursor* in the same log record as its
documents (see :meth:`Pipeline._capture`): the read position of every source
partition, the source offsets of the changes still waiting in the batcher, the
counts, the watermarks and the window state (only windows whose state changed).
A pipeline built with that cursor (``cursor=index.cursor``) rewinds each
partition to its oldest waiting change and reads forward. Below the committed
read position it takes again only the changes that were waiting — straight to
the batcher, since the windows and counts already hold them — and skips the
rest, which are committed or dead-lettered; from there on it reads as usual.
Versions are ``(event_time, offset)`` and chunk ids are derived from the
document, so a change committed twice is found stale the second time: the index
ends as if there had been no crash.

**Every change is a version** (``history=True``, the LSM index's default): a
change older than its document's current version — late, or beaten by a newer
one in the same micro-batch — is embedded and committed too, and the index files
it in the document's past, so ``as_of`` reads answer what the documents said at
any time. Chunks whose text was embedded before are not embedded again: the
document's current chunks are reused by content hash, and within a micro-batch
each distinct chunk text is embedded once. With ``history=False`` only the
newest change per document in a micro-batch is embedded (last writer wins), as
an index without history would drop the others anyway.

Accounting (invariant 4, nothing lost): every record read is either applied
(committed, or found stale by last-writer-wins), dead-lettered with its reason,
or not yet committed — ``ingested == applied + dead_lettered + uncommitted`` —
and that holds at every moment another thread can look (:meth:`Pipeline.counts`):
a record moves from one of those states to the next under one lock, from being
read (decoded and chunked), to waiting in the batcher, to being embedded, to
committed. After a restart the changes that were waiting at the last commit
count as uncommitted until they are read again.
Window side outputs (late changes, changes without the value a window needs)
are also kept in the dead-letter store, under their own stages, but those
changes are applied to the index all the same and are counted apart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.batching import AdaptiveController, MicroBatcher, PartitionKey, PendingBatch
from streamrag.changes import ChangeBatch, Op
from streamrag.chunking import TokenSplitter, chunk_id, content_hash
from streamrag.embed.base import Embedder
from streamrag.embed.resilient import RetryPolicy, embed_resilient
from streamrag.errors import StreamragError
from streamrag.eventtime import EventTimeStage, StageOutput, WatermarkTracker, WindowResult
from streamrag.index.base import CommitBatch, CommitResult, DocOp, VectorIndex
from streamrag.ingest import DeadLetter, DeadLetterStore, Decoder
from streamrag.runtime.metrics import Metrics
from streamrag.sources.base import RawBatch, Source
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, Duration, Timestamp

__all__ = ["CURSOR_FORMAT", "CommitHook", "Pipeline", "PipelineStats", "Prepared", "WindowHook"]

_MIN_READ = 1 << 14
"""Smallest read while the batcher is nearly full, so reading still makes progress.

Never more than ``source.max_read_bytes``. (A reader returns at least one
whole record, however long.)"""

CURSOR_FORMAT = 1
"""Version of the cursor layout written with each commit."""

log = logging.getLogger("streamrag.pipeline")

CommitHook = Callable[[CommitBatch, CommitResult], None]
WindowHook = Callable[[str, WindowResult], None]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A change's chunks and their content hashes, made before it is queued."""

    chunks: list[str]
    hashes: list[bytes]
    tokens: int


@dataclass
class PipelineStats:
    """Running counts of what the pipeline did."""

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


class Pipeline:
    """Reads a source into a versioned index, one micro-batch per epoch."""

    def __init__(
        self,
        *,
        source: Source,
        embedder: Embedder,
        index: VectorIndex,
        dead_letters: DeadLetterStore,
        clock: Clock,
        splitter: TokenSplitter | None = None,
        decoder: Decoder | None = None,
        max_batch_size: int = 256,
        max_delay_ms: int = 20,
        max_read_bytes: int = 1 << 20,
        max_batch_tokens: int | None = None,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        partition: PartitionKey | None = None,
        controller: AdaptiveController | None = None,
        tick_us: Duration | None = None,
        event_time: EventTimeStage | None = None,
        window_side_output: bool = True,
        metrics: Metrics | None = None,
        on_commit: Sequence[CommitHook] = (),
        on_window: Sequence[WindowHook] = (),
        resume: Mapping[str, int] | None = None,
        cursor: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        commit_interval_ms: int = 0,
        history: bool = True,
    ) -> None:
        if embedder.dim != index.dim:
            msg = (
                f"the embedder makes {embedder.dim}-dimensional vectors but the index holds "
                f"{index.dim}; build the index with dim={embedder.dim}"
            )
            raise StreamragError(msg)
        self._guard: dict[str, tuple[int, frozenset[int]]] = {}
        self._reading = 0  # records read and not yet queued or dead-lettered
        self._unseen: dict[str, set[int]] = {}  # waiting at the last commit, not read again yet
        if cursor is not None:
            resume = self._rewind(cursor)
        self.reader = source.build(resume)
        self.embedder = embedder
        self.index = index
        self.dead_letters = dead_letters
        self.clock = clock
        self.splitter = splitter or TokenSplitter()
        self.decoder = decoder or Decoder()
        self.batcher = MicroBatcher(
            max_batch_size=max_batch_size,
            max_delay_ms=max_delay_ms,
            clock=clock,
            max_batch_tokens=max_batch_tokens,
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            partition=partition,
            controller=controller,
            tick_us=tick_us,
        )
        self.max_read_bytes = max_read_bytes
        self.event_time = event_time or EventTimeStage(WatermarkTracker(clock=clock))
        self.window_side_output = window_side_output
        self.metrics = metrics or Metrics()
        self.on_commit = list(on_commit)
        self.on_window = list(on_window)
        self.stats = PipelineStats()
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self.commit_interval_us = commit_interval_ms * 1000
        self.history = history
        self._last_commit_at: Timestamp | None = None
        self._stop_at: Timestamp | None = None  # a graceful stop commits until then
        self._embed_rate = 0.0  # texts per second, recent embed calls
        self._bytes_per_chunk = 0.0  # of recent reads: sizes reads to the batcher's room
        self._in_flight = 0
        self._drained = False
        self._idle_poll_us: Timestamp = 0
        self._stats_lock = threading.Lock()
        # The gate lets the committer see the reader's state between two polls.
        self._gate = threading.Condition()
        self._polling = False
        self._capturing = False
        self._positions: dict[str, int] = dict(resume or {})
        self._window_versions: dict[str, int] = {}
        self.paused_polls = 0  # polls skipped because the batcher was full
        if cursor is not None:
            self._restore(cursor)

    # -- the cursor: what a commit says about the stream -------------------------

    def _rewind(self, cursor: Mapping[str, Any]) -> dict[str, int]:
        """Where to start reading after a restart, and which records to take again."""
        if cursor.get("format") != CURSOR_FORMAT:
            msg = (
                f"the index holds a stream cursor of format {cursor.get('format')!r}; this "
                f"streamrag writes format {CURSOR_FORMAT}: upgrade streamrag, or delete the "
                "state directory and replay the input"
            )
            raise StreamragError(msg)
        positions: dict[str, int] = dict(cursor["positions"])
        waiting: dict[str, list[int]] = dict(cursor.get("pending") or {})
        resume = dict(positions)
        for part, offsets in waiting.items():
            if offsets:
                resume[part] = min(resume.get(part, offsets[0]), offsets[0])
                self._guard[part] = (positions.get(part, 0), frozenset(offsets))
                self._unseen[part] = set(offsets)
        return resume

    def _restore(self, cursor: Mapping[str, Any]) -> None:
        """Counts, watermarks and windows as they were at the committed cursor."""
        self._positions = dict(cursor["positions"])
        for k, v in (cursor.get("stats") or {}).items():
            if hasattr(self.stats, k):
                setattr(self.stats, k, v)
        state: dict[str, Any] = {
            "watermarks": cursor["watermarks"],
            "late": cursor.get("late", {}),
            "windows": {},
        }
        for w in self.event_time.windows:
            saved = cursor.get(f"window:{w.name}")
            if saved is not None:
                state["windows"][w.name] = saved
        self.event_time.restore(state)
        self._window_versions = dict(self.event_time.versions)

    def _capture(self) -> tuple[dict[str, Any], dict[str, int]]:
        """The cursor for the commit being made, taken between two polls.

        Read positions, the offsets of changes still waiting in the batcher
        (the batch being committed has left it), counts, watermarks, and the
        state of each window that changed since the last commit. Returns it with
        the window versions it covers.
        """
        with self._gate:
            self._capturing = True
            while self._polling:
                self._gate.wait()
        try:
            positions = self.reader.snapshot()
            for part, off in positions.items():
                if off < self._positions.get(part, 0) and part not in self._guard:
                    msg = (
                        f"source partition {part} moved back from offset "
                        f"{self._positions[part]} to {off}; offsets only move forward"
                    )
                    raise StreamragError(msg)
            waiting = self.batcher.positions()
            for part, (read_to, offsets) in self._guard.items():
                # A restart's waiting records not read again yet: still waiting.
                at = positions.get(part, 0)
                positions[part] = max(at, read_to)
                rest = [o for o in offsets if o >= at]
                if rest:
                    waiting[part] = sorted({*waiting.get(part, []), *rest})
            et = self.event_time
            cursor: dict[str, Any] = {
                "format": CURSOR_FORMAT,
                "positions": positions,
                "pending": waiting,
                "watermarks": et.tracker.snapshot(),
                "late": dict(et.late_counts),
                "stats": {},
            }
            versions = dict(et.versions)
            for w in et.windows:
                if versions[w.name] != self._window_versions.get(w.name):
                    cursor[f"window:{w.name}"] = w.operator.snapshot()
            with self._stats_lock:
                cursor["stats"] = asdict(self.stats)
        finally:
            with self._gate:
                self._capturing = False
                self._gate.notify_all()
        return cursor, versions

    @property
    def watermark(self) -> Timestamp:
        """The pipeline watermark (minimum over active source partitions)."""
        return self.event_time.watermark

    # -- the loop body ---------------------------------------------------------

    def step(self) -> bool:
        """Read what is available and commit what is due; True if anything happened."""
        read = self.poll()
        committed = self.flush()
        return read > 0 or committed > 0

    def poll(self, *, final: bool = False) -> int:
        """Read, decode, window and chunk what the source has, unless the batcher is full.

        Returns the number of records read.
        """
        with self._gate:
            while self._capturing:
                self._gate.wait()
            self._polling = True
        try:
            return self._poll(final)
        finally:
            with self._gate:
                self._polling = False
                self._gate.notify_all()

    def _poll(self, final: bool) -> int:
        now = self.clock.now_us()
        self._windows(self.event_time.on_processing_time(now), None)
        if self.batcher.full:
            self.paused_polls += 1
            self.metrics.backpressure.set(1)
            return 0
        self.metrics.backpressure.set(0)
        # Data found now landed after the last poll that found nothing: the
        # deadline counts from then, so max_delay_ms bounds the time from the
        # write, not from our read (which is up to a poll interval later).
        idle_since = self._idle_poll_us if self._drained else None
        self._drained = False  # before reading: what is read counts as in progress
        raws = self.reader.poll(self._read_budget(), final=final)
        if not raws:
            self._drained = True
            self._idle_poll_us = now
            return 0
        read = sum(len(r) for r in raws)
        if self._guard:
            raws = self._sift(raws, idle_since)
        n = sum(len(r) for r in raws)  # read for the first time
        with self._stats_lock:
            self.stats.ingested += n
            self._reading += n
        self.metrics.ingested.inc(n)
        changes, letters = self.decoder.decode(raws)
        self._dead_letter(letters)
        if len(changes):
            self._event_time(changes)
            chunks = self._queue(changes, idle_since)
            size = sum(len(line) for r in raws for line in r.lines)
            if chunks:  # bytes per chunk, to size the next read to the room left
                per = size / chunks
                old = self._bytes_per_chunk
                self._bytes_per_chunk = per if old == 0 else 0.7 * old + 0.3 * per
        self.metrics.pending.set(self.batcher.pending)
        return read

    def _read_budget(self) -> int:
        """Bytes to read now: no more than the batcher has room for, in bytes and in chunks.

        The chunk room is turned into bytes with the bytes per chunk of recent
        reads, so a read never brings far more chunks than the bound allows.
        """
        batcher = self.batcher
        budget = self.max_read_bytes
        cap = batcher.max_pending_bytes
        if cap is not None:
            budget = min(budget, cap - batcher.pending_bytes)
        if self._bytes_per_chunk > 0:
            room = batcher.max_pending - batcher.pending_chunks
            budget = min(budget, int(room * self._bytes_per_chunk))
        return max(min(_MIN_READ, self.max_read_bytes), budget)

    def _event_time(self, changes: ChangeBatch) -> None:
        """Run the event-time stage; if it fails, the changes still go to the index.

        Windows only aggregate what the index stores: a failure here is logged,
        counted and kept as a side output (stage ``window-error``), never a lost read.
        """
        try:
            out = self.event_time.process(changes)
        except Exception as exc:
            log.exception("the event-time stage failed on %d changes", len(changes))
            reason = (
                f"the event-time stage failed: {type(exc).__name__}: {exc}; the change was "
                "applied to the index but not counted in the windows"
            )
            letters = [_letter(changes, i, "window-error", reason) for i in range(len(changes))]
            with self._stats_lock:
                self.stats.window_errors += len(changes)
            if self.window_side_output:
                self.dead_letters.add_many(letters, self.clock.now_us())
            return
        self._windows(out, changes)

    def _queue(self, changes: ChangeBatch, arrived_us: Timestamp | None) -> int:
        """Chunk the changes and queue them in the batcher; returns the chunks queued."""
        changes, prepared, letters = self._prepare(changes)
        self._dead_letter(letters)
        try:
            with self._stats_lock:  # from being read to waiting, in one step
                self.batcher.add(
                    changes,
                    arrived_us=arrived_us,
                    prepared=prepared,
                    chunks=[len(p.chunks) if p else 1 for p in prepared],
                    tokens=[p.tokens if p else 0 for p in prepared],
                )
                self._reading -= len(changes)
        except Exception as exc:
            # Nothing of these changes is queued: each is dead-lettered, with the reason.
            log.exception("queueing %d changes failed", len(changes))
            reason = f"the micro-batcher refused the change: {type(exc).__name__}: {exc}"
            self._dead_letter([_letter(changes, i, "batch", reason) for i in range(len(changes))])
            return 0
        return sum(len(p.chunks) if p else 1 for p in prepared)

    def _sift(self, raws: list[RawBatch], arrived_us: Timestamp | None) -> list[RawBatch]:
        """After a restart: below the committed read position, take only waiting records.

        Those go straight to the batcher — the windows and the counts already
        hold them. The rest were committed or refused before the restart and are
        skipped. Returns what lies past the committed position, to read as usual.
        """
        fresh: list[RawBatch] = []
        again: list[RawBatch] = []
        skipped = 0
        for raw in raws:
            guard = self._guard.get(raw.source)
            if guard is None:
                fresh.append(raw)
                continue
            read_to, waiting = guard
            unseen = self._unseen.get(raw.source, set())
            keep_l: list[bytes] = []
            new_l: list[bytes] = []
            keep_o: list[int] = []
            new_o: list[int] = []
            keep_s: dict[int, int] = {}
            new_s: dict[int, int] = {}
            sizes = raw.sizes or {}
            for i, (line, off) in enumerate(zip(raw.lines, raw.offsets, strict=True)):
                if off >= read_to:
                    if i in sizes:
                        new_s[len(new_l)] = sizes[i]
                    new_l.append(line)
                    new_o.append(off)
                elif off in waiting:
                    if i in sizes:
                        keep_s[len(keep_l)] = sizes[i]
                    keep_l.append(line)
                    keep_o.append(off)
                    unseen.discard(off)
                else:
                    skipped += 1
            if keep_l:
                again.append(RawBatch(raw.source, keep_l, keep_o, raw.end_offset, keep_s or None))
            if new_l:
                fresh.append(RawBatch(raw.source, new_l, new_o, raw.end_offset, new_s or None))
            if raw.end_offset >= read_to:
                del self._guard[raw.source]
                lost = self._unseen.pop(raw.source, set())
                if lost:
                    log.error(
                        "%s: %d changes that were waiting at the last commit were not found "
                        "again (was the file rewritten?); offsets %s",
                        raw.source,
                        len(lost),
                        sorted(lost)[:10],
                    )
        if again:
            with self._stats_lock:  # still uncommitted: from waiting-to-be-read to being read
                self._reading += sum(len(r) for r in again)
            changes, letters = self.decoder.decode(again)
            self._dead_letter(letters)
            with self._stats_lock:
                self.stats.replayed += len(changes)
            if len(changes):
                self._queue(changes, arrived_us)
        with self._stats_lock:
            self.stats.skipped += skipped
        return fresh

    def finish_event_time(self) -> int:
        """End of a bounded input: the watermark goes to +inf and every window fires."""
        out = self.event_time.finish()
        self._windows(out, None)
        return len(out.results)

    def _windows(self, out: StageOutput, changes: ChangeBatch | None) -> None:
        """Route window results to hooks and metrics, side outputs to the dead-letter store."""
        wm = self.event_time.watermark
        self.batcher.set_watermark(wm)
        if wm != MIN_TIMESTAMP:
            self.metrics.watermark.set(wm / US_PER_S)
            self.metrics.watermark_lag.set(max(0, self.clock.now_us() - wm) / US_PER_S)
        for name, result in out.results:
            self.metrics.window_results.labels(window=name, timing=result.timing.value).inc()
            for hook in self.on_window:
                hook(name, result)
        letters = []
        for name, el in out.late:
            self.metrics.window_late.labels(window=name).inc()
            if changes is not None and self.window_side_output:
                reason = (
                    f"late for window {name!r}: event time {el.event_time} µs is behind "
                    f"the watermark {el.watermark} µs beyond the allowed lateness; the "
                    "change was applied to the index but not counted in the window"
                )
                letters.append(_letter(changes, el.index, f"window-late:{name}", reason))
        for name, row, reason in out.invalid:
            if changes is not None and self.window_side_output:
                letters.append(_letter(changes, row, f"window-value:{name}", reason))
        with self._stats_lock:
            self.stats.window_results += len(out.results)
            self.stats.window_late += len(out.late)
            self.stats.window_invalid += len(out.invalid)
        if letters:
            self.dead_letters.add_many(letters, self.clock.now_us())

    def _prepare(
        self, changes: ChangeBatch
    ) -> tuple[ChangeBatch, list[Prepared | None], list[DeadLetter]]:
        """Chunk every upsert; a change that cannot be chunked is dead-lettered."""
        prepared: list[Prepared | None] = []
        letters: list[DeadLetter] = []
        keep: list[int] = []
        split = self.splitter.split_counted
        for i, (op, payload) in enumerate(zip(changes.ops.tolist(), changes.payloads, strict=True)):
            if op == Op.DELETE:
                prepared.append(None)
                keep.append(i)
                continue
            try:
                chunks, tokens = split(payload["text"])
            except Exception as exc:  # a stage error must not stop the stream
                letters.append(
                    DeadLetter(
                        changes.sources[i],
                        int(changes.offsets[i]),
                        "chunk",
                        f"chunking failed: {type(exc).__name__}: {exc}",
                        repr(dict(payload))[:64_000],
                    )
                )
                continue
            prepared.append(Prepared(chunks, [content_hash(c) for c in chunks], tokens))
            keep.append(i)
        if len(keep) < len(changes):
            changes = changes.take(keep)
        return changes, prepared, letters

    def flush(self, *, force: bool = False) -> int:
        """Commit every batch that is due (every pending one if ``force``). Returns commits.

        With ``commit_interval_ms``, due batches wait until that long after the
        previous commit (or until the batcher is full) and are then committed
        together, as one epoch.
        """
        done = 0
        batcher = self.batcher
        while batcher.pending and (force or batcher.due()):
            if not force and self._interval_left() > 0 and not batcher.full:
                break
            cap = None
            if self._stop_at is not None:
                if self.clock.now_us() >= self._stop_at:
                    break  # the rest is read again on restart
                cap = self._stop_batch()
            # From waiting to being embedded in one step, so that another thread
            # never sees a change in neither place or in both.
            with self._stats_lock:
                taken = [batcher.take(cap)]
                self._in_flight = len(taken[0].changes)
            if self.commit_interval_us:
                while batcher.pending and (force or batcher.due()):
                    with self._stats_lock:
                        taken.append(batcher.take())
                        self._in_flight += len(taken[-1].changes)
            self._commit(PendingBatch.merge(taken))
            done += 1
        return done

    def stop_by(self, deadline_us: Timestamp) -> None:
        """Stop gracefully: flushes commit small batches until ``deadline_us``, then no more.

        What is still waiting then is not lost: it is uncommitted, so the cursor
        of the last commit lists it and a restart reads it again.
        """
        self._stop_at = deadline_us

    def _stop_batch(self) -> int:
        """Chunks a stopping flush takes at once: about half a second of embedding."""
        return max(1, int(self._embed_rate * 0.5)) if self._embed_rate > 0 else 16

    def _interval_left(self) -> int:
        if not self.commit_interval_us or self._last_commit_at is None:
            return 0
        return max(0, self._last_commit_at + self.commit_interval_us - self.clock.now_us())

    def wait_us(self) -> Timestamp | None:
        """Processing time until a commit is due (0 if one is), or None with nothing waiting."""
        wait = self.batcher.wait_us()
        if wait is None:
            return None
        return max(wait, self._interval_left())

    def run_until_caught_up(self, *, final: bool = True) -> None:
        """Read the source to its current end and commit everything (a bounded replay)."""
        while True:
            read = self.poll(final=final)
            while self.batcher.full:
                self.flush(force=True)
                read += self.poll(final=final)
            if read == 0:
                break
        self.flush(force=True)

    @property
    def uncommitted(self) -> int:
        """Records read but not yet committed or refused: being read, waiting, being embedded.

        After a restart it includes the changes that were waiting at the last
        commit and are not read again yet.
        """
        with self._stats_lock:
            return self._uncommitted()

    def _uncommitted(self) -> int:
        unseen = sum(len(v) for v in self._unseen.values())
        return self.batcher.pending + self._in_flight + self._reading + unseen

    def counts(self) -> tuple[PipelineStats, int]:
        """The counts and the uncommitted records at one instant (they always add up)."""
        with self._stats_lock:
            return replace(self.stats), self._uncommitted()

    @property
    def drained(self) -> bool:
        """True when the last poll found nothing new (and no poll is under way).

        Read from another thread, this closes the gap between a poll taking bytes
        from the source and its changes reaching the batcher.
        """
        return self._drained

    @property
    def caught_up(self) -> bool:
        """True when every change read is committed and the source has no unread bytes."""
        return self._drained and self.uncommitted == 0 and self.reader.backlog_bytes() == 0

    def close(self) -> None:
        """Commit what is pending and release the source and the dead-letter file.

        After :meth:`stop_by`, only what can be committed before the deadline is;
        the rest stays uncommitted and is read again on restart.
        """
        try:
            self.flush(force=True)
            if self._stop_at is not None and self.batcher.pending:
                log.info(
                    "stopped with %d changes not yet embedded; they are read again on restart",
                    self.batcher.pending,
                )
        finally:
            self.reader.close()
            self.dead_letters.close()

    # -- one micro-batch -------------------------------------------------------

    def _commit(self, pending: PendingBatch) -> None:
        try:
            batch, result = self._apply(pending)
        except BaseException:
            # Nothing is lost: the batch goes back to the front and is retried.
            with self._stats_lock:
                self.batcher.put_back(pending)
                self._in_flight = 0
            raise
        for hook in self.on_commit:  # after the commit: a failing hook cannot undo it
            hook(batch, result)

    def _apply(self, pending: PendingBatch) -> tuple[CommitBatch, CommitResult]:
        """Everything of one micro-batch up to and including its index commit."""
        changes = pending.changes
        tenants, doc_ids = changes.tenants, changes.doc_ids
        times = changes.event_times.tolist()
        offsets = changes.offsets.tolist()
        ops = changes.ops.tolist()
        keys = list(zip(tenants, doc_ids, strict=True))
        candidates: list[int]
        if self.history:
            # Every change is a version: each (document, version) once.
            seen: set[tuple[tuple[str, str], int, int]] = set()
            candidates = []
            for i, key in enumerate(keys):
                v = (key, times[i], offsets[i])
                if v not in seen:
                    seen.add(v)
                    candidates.append(i)
        else:
            # Last writer wins within the batch: keep the newest change per document.
            winners: dict[tuple[str, str], int] = {}
            for i, key in enumerate(keys):
                j = winners.get(key)
                if j is None or (times[i], offsets[i]) > (times[j], offsets[j]):
                    winners[key] = i
            candidates = list(winners.values())
        stale = len(changes) - len(candidates)

        docs: list[DocOp] = []
        doc_rows: list[int] = []  # the change behind each DocOp
        ids: list[int] = []
        positions: list[int] = []
        texts: list[str] = []
        hashes: list[bytes] = []
        embed_slots: list[int] = []
        reuse_slots: list[int] = []
        reuse_rows: list[int] = []
        alias_slots: list[int] = []  # chunks whose text another slot of this batch has
        alias_of: list[int] = []
        first_slot: dict[bytes, int] = {}  # content hash → the slot that gets its vector
        prepared = pending.prepared or [None] * len(changes)
        index = self.index
        for i in candidates:
            tenant, doc_id = keys[i]
            if not index.wants(tenant, doc_id, times[i], offsets[i]):
                stale += 1
                continue
            state = index.doc_state(tenant, doc_id)
            payload = changes.payloads[i]
            domain = str(payload.get("domain", ""))
            doc_rows.append(i)
            if ops[i] == Op.DELETE:
                docs.append(
                    DocOp(tenant, doc_id, Op.DELETE, times[i], offsets[i], changes.sources[i])
                )
                continue
            prep = prepared[i]
            assert prep is not None  # every upsert was chunked before it was queued
            chunks = prep.chunks
            old = {}
            if state is not None and not state.deleted:
                old = dict(zip(state.hashes, state.rows, strict=True))
            first = len(texts)
            for pos, (chunk, h) in enumerate(zip(chunks, prep.hashes, strict=True)):
                slot = len(texts)
                row = old.get(h)
                src = first_slot.get(h)
                if row is not None:
                    reuse_slots.append(slot)
                    reuse_rows.append(row)
                elif src is not None:
                    alias_slots.append(slot)
                    alias_of.append(src)
                else:
                    embed_slots.append(slot)
                if src is None:
                    first_slot[h] = slot
                ids.append(chunk_id(tenant, doc_id, pos))
                positions.append(pos)
                texts.append(chunk)
                hashes.append(h)
            docs.append(
                DocOp(
                    tenant,
                    doc_id,
                    Op.UPSERT,
                    times[i],
                    offsets[i],
                    changes.sources[i],
                    domain,
                    first,
                    len(chunks),
                    payload.get("metadata") or None,
                )
            )

        vectors = np.empty((len(texts), index.dim), dtype=np.float32)
        poisoned: dict[int, str] = {}  # slot → why the embedder refused it
        if embed_slots:
            poisoned = self._embed(texts, embed_slots, vectors)
        if reuse_slots:
            vectors[reuse_slots] = index.vectors_at(reuse_rows)
        if alias_slots:
            vectors[alias_slots] = vectors[alias_of]
            for slot, src in zip(alias_slots, alias_of, strict=True):
                if src in poisoned:
                    poisoned[slot] = poisoned[src]
        letters: list[DeadLetter] = []
        if poisoned:
            docs, ids, positions, texts, hashes, vectors, dropped = _without_poison(
                docs, ids, positions, texts, hashes, vectors, poisoned
            )
            for d_index, reason in dropped.items():
                row = doc_rows[d_index]
                letters.append(_letter(changes, row, "embed", reason))
        embedded = len(embed_slots) - sum(1 for s in embed_slots if s in poisoned)
        reused = len(reuse_slots) + len(alias_slots)

        past = _past_versions(docs, index)
        cursor, versions = self._capture()
        applied = len(changes) - len(letters)
        delta = {
            "applied": applied,
            "stale": stale,
            "dead_lettered": len(letters),
            "poison": len(letters),
            "chunks_embedded": embedded,
            "chunks_reused": reused,
            "commits": 1,
            "past_versions": past,
        }
        # The counts as they will be once this commit is in, written with it.
        counts = cursor["stats"]
        for count, value in delta.items():
            counts[count] += value
        # The audit record of this commit, in the same log record as its documents.
        upserts = sum(1 for d in docs if d.op == Op.UPSERT)
        cursor["audit"] = {
            "changes": len(changes),
            "upserts": upserts,
            "deletes": len(docs) - upserts,
            "stale": stale,
            "dead_lettered": len(letters),
            "chunks_embedded": embedded,
            "chunks_reused": reused,
            "cut_by": pending.reason,
            "first_arrival_us": pending.first_arrival_us,
            "embedder": self.embedder.version,
        }
        if letters:
            # Before the commit: a crash in between leaves a letter for a change
            # that is still waiting; it is refused again on replay and the store
            # keeps one copy.
            self.dead_letters.add_many(letters, self.clock.now_us())
        batch = CommitBatch(
            docs=docs,
            chunk_ids=np.asarray(ids, dtype=np.int64),
            positions=np.asarray(positions, dtype=np.int32),
            texts=texts,
            hashes=hashes,
            vectors=vectors,
            embedder_version=self.embedder.version,
            cursor=cursor,
        )
        result = index.commit(batch)
        self._window_versions = versions
        self._positions = cursor["positions"]
        now = self.clock.now_us()
        self._last_commit_at = now
        st = self.stats
        stale += result.stale_docs
        delta["stale"] = stale
        with self._stats_lock:  # from being embedded to applied (or refused), in one step
            for count, value in delta.items():
                setattr(st, count, getattr(st, count) + value)
            self._in_flight = 0
            st.last_commit_us = now
            st.last_freshness_us = now - pending.first_arrival_us
        m = self.metrics
        for letter in letters:
            m.dead_letters.labels(stage=letter.stage).inc()
            log.warning(
                "dead-lettered %s@%d (embed): %s", letter.source, letter.offset, letter.reason
            )
        m.batch_chunks.observe(pending.chunks)
        m.batch_reasons.labels(reason=pending.reason).inc()
        m.applied.inc(applied)
        m.stale.inc(stale)
        m.past_versions.inc(past)
        m.chunks_embedded.inc(embedded)
        m.chunks_reused.inc(reused)
        m.commits.inc()
        m.freshness.observe(st.last_freshness_us / US_PER_S)
        m.epoch.set(result.epoch)
        stats = index.stats()
        m.live_chunks.set(stats.live_chunks)
        m.live_docs.set(stats.live_docs)
        m.pending.set(self.batcher.pending)
        return batch, result

    def _embed(
        self, texts: list[str], slots: list[int], vectors: npt.NDArray[np.float32]
    ) -> dict[int, str]:
        """Embed the texts at ``slots`` into ``vectors``, in batches the controller sizes.

        Failures are retried and bisected (:func:`embed_resilient`); returns the
        slots whose text the embedder refuses on its own, with the reason.
        """
        controller = self.batcher.controller
        step = max(1, self.batcher.target_size) if self.commit_interval_us else len(slots)
        poisoned: dict[int, str] = {}
        for lo in range(0, len(slots), step):
            part = slots[lo : lo + step]
            # Measured on the injected clock, so a test's synthetic embedder can set it.
            started = self.clock.now_us()
            # Raises EmbedderError when the embedder fails for every text.
            out = embed_resilient(
                self.embedder, [texts[s] for s in part], self.retry, sleep=self._sleep
            )
            vectors[part] = out.vectors
            for j, reason in out.failed.items():
                poisoned[part[j]] = reason
            if out.retries or out.failed:
                with self._stats_lock:
                    self.stats.embed_retries += out.calls - 1
                self.metrics.embed_retries.inc(out.calls - 1)
            took = max(0, self.clock.now_us() - started) / US_PER_S
            self.metrics.embed_seconds.observe(took)
            if took > 0:
                rate = len(part) / took
                self._embed_rate = (
                    rate if self._embed_rate == 0 else 0.8 * self._embed_rate + 0.2 * rate
                )
            if controller is not None and not out.failed and out.calls == 1:
                action = controller.observe(len(part), took, queued=self.batcher.pending_chunks)
                self.metrics.batch_decisions.labels(action=action).inc()
                self.metrics.batch_target.set(controller.target)
        return poisoned

    def _dead_letter(self, letters: list[DeadLetter]) -> None:
        """Store and count refused records that were being read (never queued)."""
        if not letters:
            return
        self.dead_letters.add_many(letters, self.clock.now_us())
        with self._stats_lock:
            self.stats.dead_lettered += len(letters)
            self._reading -= len(letters)
        for letter in letters:
            self.metrics.dead_letters.labels(stage=letter.stage).inc()
            log.warning(
                "dead-lettered %s@%d (%s): %s",
                letter.source,
                letter.offset,
                letter.stage,
                letter.reason,
            )


def _past_versions(docs: Sequence[DocOp], index: VectorIndex) -> int:
    """How many of a commit's documents will not become current (older than another)."""
    newest: dict[tuple[str, str], tuple[int, int]] = {}
    for d in docs:
        key = (d.tenant, d.doc_id)
        v = (d.event_time, d.offset)
        if key not in newest:
            state = index.doc_state(d.tenant, d.doc_id)
            newest[key] = v if state is None else max(v, state.version)
        elif v > newest[key]:
            newest[key] = v
    return sum(1 for d in docs if (d.event_time, d.offset) < newest[(d.tenant, d.doc_id)])


def _without_poison(
    docs: list[DocOp],
    ids: list[int],
    positions: list[int],
    texts: list[str],
    hashes: list[bytes],
    vectors: npt.NDArray[np.float32],
    poisoned: Mapping[int, str],
) -> tuple[
    list[DocOp],
    list[int],
    list[int],
    list[str],
    list[bytes],
    npt.NDArray[np.float32],
    dict[int, str],
]:
    """The commit without the documents that own a refused chunk (none half-written)."""
    dropped: dict[int, str] = {}
    keep_docs: list[DocOp] = []
    keep_rows: list[int] = []
    for k, d in enumerate(docs):
        rows = range(d.first_chunk, d.first_chunk + d.n_chunks) if d.op == Op.UPSERT else ()
        bad = [poisoned[r] for r in rows if r in poisoned]
        if bad:
            dropped[k] = f"the embedder refuses chunk text of this document: {bad[0]}"
            continue
        if d.op == Op.UPSERT:
            d = replace(d, first_chunk=len(keep_rows))
            keep_rows.extend(rows)
        keep_docs.append(d)
    return (
        keep_docs,
        [ids[r] for r in keep_rows],
        [positions[r] for r in keep_rows],
        [texts[r] for r in keep_rows],
        [hashes[r] for r in keep_rows],
        vectors[keep_rows],
        dropped,
    )


def _letter(changes: ChangeBatch, row: int, stage: str, reason: str) -> DeadLetter:
    """A dead letter for a decoded change: the change itself, as JSON, is the record."""
    record = {
        "tenant": changes.tenants[row],
        "doc_id": changes.doc_ids[row],
        "op": "delete" if changes.ops[row] == Op.DELETE else "upsert",
        "event_time_us": int(changes.event_times[row]),
        **dict(changes.payloads[row]),
    }
    raw = json.dumps(record, ensure_ascii=False, default=str)[:64_000]
    return DeadLetter(changes.sources[row], int(changes.offsets[row]), stage, reason, raw)
