"""The reading half of the pipeline: source → decode → redact → event time → chunk → batcher.

:meth:`Intake.poll` reads what the source has — unless the batcher is full,
which is how backpressure reaches the source — runs the stages
(:mod:`.stages`; personal data is redacted right after decoding, before
anything else sees the changes) and queues the changes, with their chunks, in the
micro-batcher. Each read is cut to the room left in the batcher, in bytes and
in chunks (from the bytes per chunk of recent reads). After a restart, records
below the committed position are sifted (:class:`~.cursor.Rewind`): the
changes that were waiting go to the batcher again, the rest is skipped. A
watermark that a source carries itself (:attr:`RawBatch.watermark`) is passed
to the event-time stage after the changes it came with.

It runs in its own thread beside the committing half (:mod:`.executor`), so
the next batch is decoded and chunked while the current one embeds. Every
record it reads is counted in the :class:`~.accounting.Ledger`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from streamrag.batching import MicroBatcher
from streamrag.changes import ChangeBatch
from streamrag.eventtime import EventTimeStage, StageOutput, WindowResult
from streamrag.index.half_limit import note_read
from streamrag.ingest import DeadLetter
from streamrag.runtime.accounting import Ledger
from streamrag.runtime.cursor import CursorKeeper
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.outbox import Outbox
from streamrag.runtime.stages import (
    ChunkStage,
    DecodeStage,
    EventTimeStep,
    LetterSink,
    Prepared,
    RedactStage,
)
from streamrag.runtime.stages import change_letter as _letter
from streamrag.sources.base import RawBatch, SourceReader
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, Timestamp

__all__ = ["Intake", "WindowHook"]

WindowHook = Callable[[str, WindowResult], None]


class AheadHook(Protocol):
    """Takes the chunks of changes just queued (:meth:`.commit.Embedding.send_ahead`)."""

    def __call__(self, prepared: Sequence[Prepared | None], *, backlog: bool) -> None:
        """Send them on; ``backlog`` says a whole batch or more waits in the batcher."""


_MIN_READ = 1 << 14
"""Smallest read while the batcher is nearly full, so reading still makes progress.

Never more than ``source.max_read_bytes``. (A reader returns at least one
whole record, however long.)"""

log = logging.getLogger("streamrag.pipeline")


class Intake:
    """Reads, decodes, windows and chunks changes into the micro-batcher."""

    def __init__(
        self,
        *,
        reader: SourceReader,
        batcher: MicroBatcher,
        decode: DecodeStage,
        chunk: ChunkStage,
        windows: EventTimeStep,
        letters: LetterSink,
        ledger: Ledger,
        keeper: CursorKeeper,
        metrics: Metrics,
        clock: Clock,
        outbox: Outbox,
        max_read_bytes: int,
        redact: RedactStage | None = None,
        ahead: AheadHook | None = None,
    ) -> None:
        self.reader, self.batcher, self.ledger, self.keeper = reader, batcher, ledger, keeper
        self.redact = redact or RedactStage(None)
        self.decode, self.chunk, self.windows, self.letters = decode, chunk, windows, letters
        self.metrics, self.clock, self.outbox = metrics, clock, outbox
        self.max_read_bytes = max_read_bytes
        self.ahead = ahead
        """Called with the changes just queued (and whether a backlog waits: a whole batch
        or more): their chunks go to the worker that embeds ahead (:mod:`streamrag.embed.ahead`)."""
        self.paused_polls = 0  # polls skipped because the batcher was full
        self.drained = False
        """True when the last poll found nothing new (and no poll is under way)."""
        self._idle_poll_us: Timestamp = 0
        self._bytes_per_chunk = 0.0  # of recent reads: sizes reads to the batcher's room

    @property
    def event_time(self) -> EventTimeStage:
        """The event-time stage the windows run in."""
        return self.windows.stage

    def poll(self, *, final: bool = False) -> int:
        """Read, decode, window and chunk what the source has, unless the batcher is full.

        Returns the number of records read (or of watermarks, when a poll
        brought nothing else): zero means there was nothing to take.
        """
        with self.keeper.gate.polling():
            return self._poll(final)

    def _poll(self, final: bool) -> int:
        now = self.clock.now_us()
        self._route_windows(self.event_time.on_processing_time(now))
        if self.batcher.full:
            self.paused_polls += 1
            self.metrics.backpressure.set(1)
            return 0
        self.metrics.backpressure.set(0)
        # Data found now landed after the last poll that found nothing: the deadline
        # counts from then, so max_delay_ms bounds the time from the write.
        idle_since = self._idle_poll_us if self.drained else None
        self.drained = False  # before reading: what is read counts as in progress
        raws = self.reader.poll(self._read_budget(), final=final)
        if not raws:
            self.drained, self._idle_poll_us = True, now
            return 0
        note_read()  # a measurement of this CPU waits: the process is at work
        read = sum(len(r) for r in raws)
        marks = [(r.source, r.watermark) for r in raws if r.watermark is not None]
        if self.keeper.rewind.active:
            raws = self._sift(raws, idle_since, now)
        n = sum(len(r) for r in raws)  # read for the first time
        self.ledger.read(n)
        self.metrics.ingested.inc(n)
        decoded = self.decode(raws)
        self._refuse(decoded.letters)
        redacted = self.redact(decoded.out, raws)
        self._refuse(redacted.letters)
        if len(redacted.out):
            windows = self.windows(redacted.out)
            self._route_windows(windows.out, windows.letters)
            chunks = self._queue(redacted.out, idle_since, now)
            if chunks:  # bytes per chunk, to size the next read to the room left
                per = sum(len(line) for r in raws for line in r.lines) / chunks
                old = self._bytes_per_chunk
                self._bytes_per_chunk = per if old == 0 else 0.7 * old + 0.3 * per
        for part, mark in marks:  # a source's own watermark holds after its batch
            part = self.windows.input_of(part)
            self._route_windows(self.event_time.observe_watermark(part, mark))
        self.metrics.pending.set(self.batcher.pending)
        return read or len(marks)  # a watermark alone is progress too

    def _read_budget(self) -> int:
        """Bytes to read now: no more than the batcher has room for, in bytes and in chunks."""
        batcher = self.batcher
        budget = self.max_read_bytes
        if batcher.max_pending_bytes is not None:
            budget = min(budget, batcher.max_pending_bytes - batcher.pending_bytes)
        if self._bytes_per_chunk > 0:  # the chunk room in bytes, from recent reads
            room = batcher.max_pending - batcher.pending_chunks
            budget = min(budget, int(room * self._bytes_per_chunk))
        return max(min(_MIN_READ, self.max_read_bytes), budget)

    def _sift(
        self, raws: list[RawBatch], arrived_us: Timestamp | None, read_us: Timestamp
    ) -> list[RawBatch]:
        """After a restart: waiting records go to the batcher again; returns the fresh ones."""
        with self.ledger.moving() as stats:  # from waiting-to-be-read to being read
            sifted = self.keeper.rewind.sift(raws)
            self.ledger.reading += sum(len(r) for r in sifted.again)
            stats.skipped += sifted.skipped
            # Read once, replaced by a newer read of the source before it was applied:
            # no longer taken in, so the counts still add up.
            stats.ingested -= sifted.superseded
            stats.superseded += sifted.superseded
        if sifted.again:
            decoded = self.decode(sifted.again)
            self._refuse(decoded.letters)
            # Redacted as when first read: the same records give the same changes.
            redacted = self.redact(decoded.out, sifted.again, replay=True)
            self._refuse(redacted.letters)
            self.ledger.add(replayed=len(redacted.out))
            if len(redacted.out):  # the windows and counts already hold these
                self._queue(redacted.out, arrived_us, read_us)
        return sifted.fresh

    def _queue(self, changes: ChangeBatch, arrived_us: Timestamp | None, read_us: Timestamp) -> int:
        """Chunk the changes and queue them in the batcher; returns the chunks queued.

        ``arrived_us`` starts their deadline (the last poll that found nothing, when
        the one before this found nothing); ``read_us`` is the poll that read them,
        where their freshness counts from.
        """
        chunked = self.chunk(changes)
        self._refuse(chunked.letters)
        done = chunked.out
        try:
            with self.ledger.moving():  # from being read to waiting, in one step
                self.batcher.add(
                    done.changes,
                    arrived_us=arrived_us,
                    read_us=read_us,
                    prepared=done.prepared,
                    chunks=done.chunk_counts,
                    tokens=[p.tokens if p else 0 for p in done.prepared],
                )
                self.ledger.reading -= len(done.changes)
        except Exception as exc:  # nothing of these is queued: each is refused, with the reason
            log.exception("queueing %d changes failed", len(done.changes))
            reason = f"the micro-batcher refused the change: {type(exc).__name__}: {exc}"
            self._refuse(
                [_letter(done.changes, i, "batch", reason) for i in range(len(done.changes))]
            )
            return 0
        if self.ahead is not None:  # queued: a failure here costs a head start, nothing else
            try:
                b = self.batcher
                self.ahead(done.prepared, backlog=b.pending_chunks >= b.max_batch_size or b.full)
            except Exception:
                log.exception("the chunks could not be sent to the embedding worker")
        return sum(done.chunk_counts)

    def _refuse(self, letters: list[DeadLetter]) -> None:
        """Records refused while being read: stored, and counted as dead-lettered."""
        if letters:
            self.letters.refused(letters)
            self.ledger.refused(len(letters))

    def finish_event_time(self) -> int:
        """End of a bounded input: the watermark goes to +inf and every window fires."""
        with self.keeper.gate.polling():
            out = self.event_time.finish()
            self._route_windows(out)
        return len(out.results)

    def _route_windows(self, out: StageOutput, letters: Sequence[DeadLetter] = ()) -> None:
        """Window results and side outputs to the outbox; the watermark to the batcher."""
        wm = self.event_time.watermark
        self.batcher.set_watermark(wm)
        m = self.metrics
        if wm != MIN_TIMESTAMP:
            m.watermark.set(wm / US_PER_S)
            m.watermark_lag.set(max(0, self.clock.now_us() - wm) / US_PER_S)
        if not (out.results or out.late or out.invalid or letters):
            return  # most polls: nothing fired, nothing to count or hold
        for name, result in out.results:
            m.window_results.labels(window=name, timing=result.timing.value).inc()
        for name, _ in out.late:
            m.window_late.labels(window=name).inc()
        self.ledger.add(
            window_results=len(out.results),
            window_late=len(out.late),
            window_invalid=len(out.invalid),
            window_errors=sum(1 for x in letters if x.stage == "window-error"),
        )
        self.outbox.hold(out.results, letters)  # released with the commit that covers them
