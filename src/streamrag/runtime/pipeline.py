"""The pipeline: the stages of the data path wired top to bottom.

::

    source ─► decode ─► event time ─► chunk ─► micro-batcher ─► commit (plan, embed, WAL)
                │          │            │                          │
                └──────────┴────────────┴── dead letters ──────────┘

Each stage (:mod:`.stages`) returns what goes on and the records it refused;
:meth:`Pipeline.poll` runs the stages up to the batcher (reading nothing while
the batcher is full: that is how backpressure reaches the source), and
:meth:`Pipeline.flush` commits every micro-batch that is due (:mod:`.commit`,
whose docstring explains exactly-once). The two halves can run in two threads
(:mod:`.executor`), so the next batch is decoded and chunked while one embeds.
Time comes only from the injected :class:`~streamrag.timing.Clock`.

**Every record is counted** (invariant 4): ``ingested == applied +
dead_lettered + uncommitted`` at every moment another thread can look
(:meth:`Pipeline.counts`). A record moves under one lock from being read, to
waiting in the batcher, to being embedded, to applied or refused. After a
restart the changes that were waiting at the last commit (:mod:`.cursor`)
count as uncommitted until they are read again. Window side outputs are kept
in the dead-letter store too, but their changes are indexed and counted apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from streamrag.batching import MicroBatcher, PendingBatch
from streamrag.changes import ChangeBatch
from streamrag.chunking import TokenSplitter
from streamrag.embed.base import Embedder
from streamrag.embed.resilient import RetryPolicy
from streamrag.errors import StreamragError
from streamrag.eventtime import EventTimeStage, StageOutput, WatermarkTracker, WindowResult
from streamrag.index.base import CommitBatch, CommitResult, VectorIndex
from streamrag.ingest import DeadLetter, DeadLetterStore, Decoder
from streamrag.runtime.commit import Committer, Embedding, observe
from streamrag.runtime.cursor import CURSOR_FORMAT, Cursor, PollGate, Rewind, check_forward
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.stages import ChunkStage, DecodeStage, EventTimeStep, LetterSink, Prepared
from streamrag.runtime.stages import change_letter as _letter
from streamrag.sources.base import RawBatch, Source
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, Timestamp

__all__ = ["CURSOR_FORMAT", "CommitHook", "Pipeline", "PipelineStats", "Prepared", "WindowHook"]

_MIN_READ = 1 << 14
"""Smallest read while the batcher is nearly full, so reading still makes progress.

Never more than ``source.max_read_bytes``. (A reader returns at least one
whole record, however long.)"""

log = logging.getLogger("streamrag.pipeline")

CommitHook = Callable[[CommitBatch, CommitResult], None]
WindowHook = Callable[[str, WindowResult], None]


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
        batcher: MicroBatcher | None = None,
        splitter: TokenSplitter | None = None,
        decoder: Decoder | None = None,
        event_time: EventTimeStage | None = None,
        metrics: Metrics | None = None,
        on_commit: Sequence[CommitHook] = (),
        on_window: Sequence[WindowHook] = (),
        cursor: Mapping[str, Any] | None = None,
        resume: Mapping[str, int] | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_read_bytes: int = 1 << 20,
        commit_interval_ms: int = 0,
        history: bool = True,
        window_side_output: bool = True,
    ) -> None:
        if embedder.dim != index.dim:
            msg = (
                f"the embedder makes {embedder.dim}-dimensional vectors but the index holds "
                f"{index.dim}; build the index with dim={embedder.dim}"
            )
            raise StreamragError(msg)
        restored = Cursor.from_mapping(cursor) if cursor is not None else None
        self.rewind = Rewind(restored)
        self.reader = source.build(self.rewind.resume if restored else resume)
        self.embedder, self.index, self.clock = embedder, index, clock
        self.dead_letters = dead_letters
        self.metrics = metrics or Metrics()
        self.letters = LetterSink(
            dead_letters, self.metrics, clock, side_outputs=window_side_output
        )
        self.batcher = batcher or MicroBatcher(max_batch_size=256, max_delay_ms=20, clock=clock)
        self.decode = DecodeStage(decoder or Decoder())
        self.chunk = ChunkStage(splitter or TokenSplitter())
        self.windows = EventTimeStep(event_time or EventTimeStage(WatermarkTracker(clock=clock)))
        self.embedding = Embedding(
            embedder,
            clock=clock,
            metrics=self.metrics,
            retry=retry,
            sleep=sleep,
            controller=self.batcher.controller,
            queued=lambda: self.batcher.pending_chunks,
        )
        self.committer = Committer(
            index, self.embedding, history=history, store_letters=self.letters.refused
        )
        self.on_commit, self.on_window = list(on_commit), list(on_window)
        self.max_read_bytes = max_read_bytes
        self.commit_interval_us = commit_interval_ms * 1000
        self.stats = PipelineStats()
        self.paused_polls = 0  # polls skipped because the batcher was full
        self._stats_lock = threading.Lock()
        self._gate = PollGate()
        self._reading = 0  # records read and not yet queued or dead-lettered
        self._in_flight = 0  # records being embedded and committed
        self._drained = False
        self._idle_poll_us: Timestamp = 0
        self._bytes_per_chunk = 0.0  # of recent reads: sizes reads to the batcher's room
        self._last_commit_at: Timestamp | None = None
        self._stop_at: Timestamp | None = None  # a graceful stop commits until then
        self._positions: dict[str, int] = dict(resume or {})
        self._window_versions: dict[str, int] = {}
        self._captured: dict[str, int] = {}  # window versions in the cursor being committed
        if restored is not None:
            self._restore(restored)

    def _restore(self, cursor: Cursor) -> None:
        """Counts, watermarks and windows as they were at the committed cursor."""
        self._positions = dict(cursor.positions)
        for k, v in cursor.stats.items():
            if hasattr(self.stats, k):
                setattr(self.stats, k, v)
        windows = {
            w.name: cursor.windows[w.name]
            for w in self.event_time.windows
            if w.name in cursor.windows
        }
        self.event_time.restore(
            {"watermarks": cursor.watermarks, "late": cursor.late, "windows": windows}
        )
        self._window_versions = dict(self.event_time.versions)

    def _capture(self) -> Cursor:
        """The cursor for the commit being made, taken between two polls (:mod:`.cursor`)."""
        with self._gate.capturing():
            positions = self.reader.snapshot()
            check_forward(self._positions, positions, self.rewind)
            waiting = self.batcher.positions()  # the batch being committed has left it
            self.rewind.positions(positions, waiting)
            et = self.event_time
            versions = dict(et.versions)
            changed = {
                w.name: w.operator.snapshot()
                for w in et.windows
                if versions[w.name] != self._window_versions.get(w.name)
            }
            with self._stats_lock:
                stats = asdict(self.stats)
        self._captured = versions
        return Cursor(
            positions=positions,
            pending=waiting,
            watermarks=et.tracker.snapshot(),
            late=dict(et.late_counts),
            stats=stats,
            windows=changed,
        )

    @property
    def event_time(self) -> EventTimeStage:
        """The event-time stage: watermarks, windows and their late output."""
        return self.windows.stage

    @event_time.setter
    def event_time(self, stage: EventTimeStage) -> None:
        self.windows.stage = stage

    @property
    def watermark(self) -> Timestamp:
        """The pipeline watermark (minimum over active source partitions)."""
        return self.event_time.watermark

    # -- reading: source → decode → event time → chunk → batcher ------------------

    def step(self) -> bool:
        """Read what is available and commit what is due; True if anything happened."""
        read = self.poll()
        committed = self.flush()
        return read > 0 or committed > 0

    def poll(self, *, final: bool = False) -> int:
        """Read, decode, window and chunk what the source has, unless the batcher is full.

        Returns the number of records read.
        """
        with self._gate.polling():
            return self._poll(final)

    def _poll(self, final: bool) -> int:
        now = self.clock.now_us()
        self._route_windows(self.event_time.on_processing_time(now), None)
        if self.batcher.full:
            self.paused_polls += 1
            self.metrics.backpressure.set(1)
            return 0
        self.metrics.backpressure.set(0)
        # Data found now landed after the last poll that found nothing: the deadline
        # counts from then, so max_delay_ms bounds the time from the write.
        idle_since = self._idle_poll_us if self._drained else None
        self._drained = False  # before reading: what is read counts as in progress
        raws = self.reader.poll(self._read_budget(), final=final)
        if not raws:
            self._drained, self._idle_poll_us = True, now
            return 0
        read = sum(len(r) for r in raws)
        if self.rewind.active:
            raws = self._sift(raws, idle_since)
        n = sum(len(r) for r in raws)  # read for the first time
        with self._stats_lock:
            self.stats.ingested += n
            self._reading += n
        self.metrics.ingested.inc(n)
        decoded = self.decode(raws)
        self._refuse(decoded.letters)
        if len(decoded.out):
            windows = self.windows(decoded.out)
            self._route_windows(windows.out, decoded.out, windows.letters)
            chunks = self._queue(decoded.out, idle_since)
            if chunks:  # bytes per chunk, to size the next read to the room left
                per = sum(len(line) for r in raws for line in r.lines) / chunks
                old = self._bytes_per_chunk
                self._bytes_per_chunk = per if old == 0 else 0.7 * old + 0.3 * per
        self.metrics.pending.set(self.batcher.pending)
        return read

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

    def _sift(self, raws: list[RawBatch], arrived_us: Timestamp | None) -> list[RawBatch]:
        """After a restart: waiting records go to the batcher again; returns the fresh ones."""
        with self._stats_lock:  # from waiting-to-be-read to being read, in one step
            sifted = self.rewind.sift(raws)
            self._reading += sum(len(r) for r in sifted.again)
            self.stats.skipped += sifted.skipped
        if sifted.again:
            decoded = self.decode(sifted.again)
            self._refuse(decoded.letters)
            with self._stats_lock:
                self.stats.replayed += len(decoded.out)
            if len(decoded.out):  # the windows and counts already hold these
                self._queue(decoded.out, arrived_us)
        return sifted.fresh

    def _queue(self, changes: ChangeBatch, arrived_us: Timestamp | None) -> int:
        """Chunk the changes and queue them in the batcher; returns the chunks queued."""
        chunked = self.chunk(changes)
        self._refuse(chunked.letters)
        done = chunked.out
        try:
            with self._stats_lock:  # from being read to waiting, in one step
                self.batcher.add(
                    done.changes,
                    arrived_us=arrived_us,
                    prepared=done.prepared,
                    chunks=done.chunk_counts,
                    tokens=[p.tokens if p else 0 for p in done.prepared],
                )
                self._reading -= len(done.changes)
        except Exception as exc:  # nothing of these is queued: each is refused, with the reason
            log.exception("queueing %d changes failed", len(done.changes))
            reason = f"the micro-batcher refused the change: {type(exc).__name__}: {exc}"
            self._refuse(
                [_letter(done.changes, i, "batch", reason) for i in range(len(done.changes))]
            )
            return 0
        return sum(done.chunk_counts)

    def _refuse(self, letters: list[DeadLetter]) -> None:
        """Records refused while being read: stored, and counted as dead-lettered."""
        if letters:
            self.letters.refused(letters)
            with self._stats_lock:
                self.stats.dead_lettered += len(letters)
                self._reading -= len(letters)

    def finish_event_time(self) -> int:
        """End of a bounded input: the watermark goes to +inf and every window fires."""
        out = self.event_time.finish()
        self._route_windows(out, None)
        return len(out.results)

    def _route_windows(
        self, out: StageOutput, changes: ChangeBatch | None, letters: Sequence[DeadLetter] = ()
    ) -> None:
        """Window results to hooks and metrics, side outputs to the dead-letter store."""
        wm = self.event_time.watermark
        self.batcher.set_watermark(wm)
        m = self.metrics
        if wm != MIN_TIMESTAMP:
            m.watermark.set(wm / US_PER_S)
            m.watermark_lag.set(max(0, self.clock.now_us() - wm) / US_PER_S)
        for name, result in out.results:
            m.window_results.labels(window=name, timing=result.timing.value).inc()
            for hook in self.on_window:
                hook(name, result)
        for name, _ in out.late:
            m.window_late.labels(window=name).inc()
        with self._stats_lock:
            self.stats.window_results += len(out.results)
            self.stats.window_late += len(out.late)
            self.stats.window_invalid += len(out.invalid)
            self.stats.window_errors += sum(1 for x in letters if x.stage == "window-error")
        self.letters.side_output(list(letters))

    # -- committing: batcher → plan → embed → one WAL record ----------------------

    def flush(self, *, force: bool = False) -> int:
        """Commit every batch that is due (every pending one if ``force``). Returns commits.

        With ``commit_interval_ms``, due batches wait until that long after the
        previous commit (or until the batcher is full) and are committed as one epoch.
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
                cap = max(1, int(self.embedding.rate * 0.5)) if self.embedding.rate else 16
            # From waiting to being embedded in one step: never in neither place or both.
            with self._stats_lock:
                taken = [batcher.take(cap)]
                while self.commit_interval_us and batcher.pending and (force or batcher.due()):
                    taken.append(batcher.take())
                self._in_flight = sum(len(t.changes) for t in taken)
            self._commit(PendingBatch.merge(taken))
            done += 1
        return done

    def _commit(self, pending: PendingBatch) -> None:
        step = self.batcher.target_size if self.commit_interval_us else 0
        try:
            done = self.committer.apply(pending, self._capture, step)
        except BaseException:  # nothing is lost: the batch goes back to the front
            with self._stats_lock:
                self.batcher.put_back(pending)
                self._in_flight = 0
            raise
        self._window_versions = self._captured
        self._positions = done.cursor.positions
        now = self._last_commit_at = self.clock.now_us()
        with self._stats_lock:  # from being embedded to applied (or refused), in one step
            for count, value in done.delta.items():
                setattr(self.stats, count, getattr(self.stats, count) + value)
            self._in_flight = 0
            self.stats.last_commit_us = now
            self.stats.last_freshness_us = now - pending.first_arrival_us
        fresh_s = (now - pending.first_arrival_us) / US_PER_S
        observe(self.metrics, done, self.index, pending=self.batcher.pending, freshness_s=fresh_s)
        for hook in self.on_commit:  # after the commit: a failing hook cannot undo it
            hook(done.batch, done.result)

    def stop_by(self, deadline_us: Timestamp) -> None:
        """Stop gracefully: flushes commit small batches until ``deadline_us``, then no more.

        What is still waiting then is uncommitted: the last commit's cursor lists
        it and a restart reads it again.
        """
        self._stop_at = deadline_us

    def _interval_left(self) -> int:
        if not self.commit_interval_us or self._last_commit_at is None:
            return 0
        return max(0, self._last_commit_at + self.commit_interval_us - self.clock.now_us())

    def wait_us(self) -> Timestamp | None:
        """Processing time until a commit is due (0 if one is), or None with nothing waiting."""
        wait = self.batcher.wait_us()
        return None if wait is None else max(wait, self._interval_left())

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

    # -- where things stand --------------------------------------------------------

    @property
    def uncommitted(self) -> int:
        """Records read but not committed or refused yet (also those a restart reads again)."""
        with self._stats_lock:
            return self._uncommitted()

    def _uncommitted(self) -> int:
        return self.batcher.pending + self._in_flight + self._reading + self.rewind.waiting

    def counts(self) -> tuple[PipelineStats, int]:
        """The counts and the uncommitted records at one instant (they always add up)."""
        with self._stats_lock:
            return replace(self.stats), self._uncommitted()

    @property
    def drained(self) -> bool:
        """True when the last poll found nothing new (and no poll is under way)."""
        return self._drained

    @property
    def caught_up(self) -> bool:
        """True when every change read is committed and the source has no unread bytes."""
        return self._drained and self.uncommitted == 0 and self.reader.backlog_bytes() == 0

    def close(self) -> None:
        """Commit what is pending (until the :meth:`stop_by` deadline) and release the files."""
        try:
            self.flush(force=True)
            if self._stop_at is not None and self.batcher.pending:
                log.info(
                    "stopped with %d changes not yet embedded; they are read again on restart",
                    self.batcher.pending,
                )
        finally:
            self.reader.close()
            self.letters.close()
