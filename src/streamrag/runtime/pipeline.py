"""The pipeline: the stages of the data path wired top to bottom.

::

    source ─► decode ─► redact ─► event time ─► chunk ─► micro-batcher ─► commit (plan, embed, WAL)
                │         │          │            │                          │
                └─────────┴──────────┴────────────┴── dead letters ──────────┘

Each stage (:mod:`.stages`) returns what goes on and the records it refused.
The pipeline has two halves, which can run in two threads (:mod:`.executor`)
so that the next batch is decoded and chunked while one embeds:

* :meth:`Pipeline.poll` — the reading half (:mod:`.intake`): the stages up to
  the batcher, reading nothing while the batcher is full (backpressure);
* :meth:`Pipeline.flush` — the committing half (:mod:`.flush`): every
  micro-batch that is due becomes one epoch (:mod:`.commit`, whose docstring
  explains exactly-once), its cursor (:mod:`.cursor`) in the same log record.

Time comes only from the injected :class:`~streamrag.timing.Clock`.

**Every record is counted** (invariant 4): ``ingested == applied +
dead_lettered + uncommitted`` at every moment another thread can look
(:meth:`Pipeline.counts`; :mod:`.accounting` says how).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamrag.batching import MicroBatcher
from streamrag.chunking import Splitter, TokenSplitter
from streamrag.embed.ahead import EmbedAhead
from streamrag.embed.base import Embedder
from streamrag.embed.choice import EmbedderChoice
from streamrag.embed.resilient import RetryPolicy
from streamrag.errors import StreamragError
from streamrag.eventtime import EventTimeStage, WatermarkTracker
from streamrag.index.base import CommitBatch, CommitResult, VectorIndex
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.ingest.formats import RecordDecoder
from streamrag.runtime.accounting import Ledger, PipelineStats
from streamrag.runtime.commit import Committer, Embedding
from streamrag.runtime.cursor import CURSOR_FORMAT, Cursor, CursorKeeper
from streamrag.runtime.flush import Flusher
from streamrag.runtime.intake import Intake, WindowHook
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
from streamrag.sources.base import GroupsWatermarks, Source, SourceReader
from streamrag.sources.multi import MultiSourceReader
from streamrag.timing import Clock, Timestamp

__all__ = ["CURSOR_FORMAT", "CommitHook", "Pipeline", "PipelineStats", "Prepared", "WindowHook"]

log = logging.getLogger("streamrag.pipeline")

CommitHook = Callable[[CommitBatch, CommitResult], None]


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
        splitter: Splitter | None = None,
        decoder: RecordDecoder | None = None,
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
        choice: EmbedderChoice | None = None,
        redact: RedactStage | None = None,
        ahead: EmbedAhead | None = None,
    ) -> None:
        _check_dims(embedder, index)
        self.keeper = CursorKeeper(Cursor.from_mapping(cursor) if cursor else None, resume)
        self.reader = source.build(self.keeper.resume)
        self.embedder, self.index, self.clock = embedder, index, clock
        self.dead_letters, self.metrics = dead_letters, metrics or Metrics()
        self.letters = LetterSink(
            dead_letters, self.metrics, clock, side_outputs=window_side_output
        )
        self.batcher = batcher or MicroBatcher(max_batch_size=256, max_delay_ms=20, clock=clock)
        self.ledger = Ledger(lambda: self.batcher.pending, lambda: self.keeper.rewind.waiting)
        self.windows = EventTimeStep(
            event_time or EventTimeStage(WatermarkTracker(clock=clock)),
            _watermark_inputs(self.reader),
        )
        self.embedding = self._embedding(embedder, retry, sleep, choice, ahead)
        self.committer = Committer(
            index, self.embedding, history=history, store_letters=self.letters.refused
        )
        self.on_commit, self.on_window = list(on_commit), list(on_window)
        self.outbox = Outbox(self.on_window, self.letters.side_output)
        self.intake = self._intake(decoder, splitter, max_read_bytes, redact)
        self.flusher = Flusher(self, commit_interval_ms)
        if self.keeper.cursor is not None:  # counts, watermarks and windows as committed
            self.ledger.restore(self.keeper.cursor.stats)
            self.keeper.restore(self.event_time)

    def _embedding(
        self,
        embedder: Embedder,
        retry: RetryPolicy | None,
        sleep: Callable[[float], None],
        choice: EmbedderChoice | None,
        ahead: EmbedAhead | None,
    ) -> Embedding:
        return Embedding(
            embedder,
            clock=self.clock,
            metrics=self.metrics,
            retry=retry,
            sleep=sleep,
            controller=self.batcher.controller,
            queued=lambda: self.batcher.pending_chunks,
            choice=choice,
            ahead=ahead,
            waiting=self.batcher.waiting_prepared,
        )

    def _intake(
        self,
        decoder: RecordDecoder | None,
        splitter: Splitter | None,
        max_read_bytes: int,
        redact: RedactStage | None,
    ) -> Intake:
        redact = redact or RedactStage(None)  # none: nothing is redacted
        self.letters.scrub = redact.scrub  # letters hold raw records: scrubbed alike
        return Intake(
            reader=self.reader,
            batcher=self.batcher,
            decode=DecodeStage(decoder or Decoder()),
            chunk=ChunkStage(splitter or TokenSplitter()),
            windows=self.windows,
            letters=self.letters,
            ledger=self.ledger,
            keeper=self.keeper,
            metrics=self.metrics,
            clock=self.clock,
            outbox=self.outbox,
            max_read_bytes=max_read_bytes,
            redact=redact,
            ahead=self.embedding.send_ahead if self.embedding.ahead is not None else None,
        )

    @property
    def stats(self) -> PipelineStats:
        """The running counts (read them with :meth:`counts` from another thread)."""
        return self.ledger.stats

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

        Returns the number of records read (:meth:`.Intake.poll`).
        """
        return self.intake.poll(final=final)

    def finish_event_time(self) -> int:
        """End of a bounded input: the watermark goes to +inf and every window fires."""
        return self.intake.finish_event_time()

    # -- committing: batcher → plan → embed → one WAL record ----------------------

    def flush(self, *, force: bool = False, most: int | None = None) -> int:
        """Commit every batch that is due (every pending one if ``force``). Returns commits.

        ``most`` caps the commits this call makes.
        """
        return self.flusher.flush(force=force, most=most)

    def stop_by(self, deadline_us: Timestamp) -> None:
        """Stop gracefully: commit small batches until ``deadline_us``, then no more."""
        self.flusher.stop_by(deadline_us)

    def wait_us(self) -> Timestamp | None:
        """Processing time until a commit is due (0 if one is), or None with nothing waiting."""
        return self.flusher.wait_us()

    def run_until_caught_up(self, *, final: bool = True) -> None:
        """Read the source to its current end and commit everything (a bounded replay).

        Once a worker embeds ahead (:mod:`streamrag.embed.ahead`), a full
        batcher gets one commit (of what the worker has embedded) and then
        another read, so that the worker embeds the next changes while this
        thread commits and reads.
        """
        embedding = self.embedding
        while True:
            read = self.poll(final=final)
            while self.batcher.full:
                self.flush(force=True, most=1 if embedding.ahead_started else None)
                read += self.poll(final=final)
            if read == 0:
                break
        self.flush(force=True)

    # -- where things stand --------------------------------------------------------

    @property
    def uncommitted(self) -> int:
        """Records read but not committed or refused yet (also those a restart reads again)."""
        return self.ledger.uncommitted

    def counts(self) -> tuple[PipelineStats, int]:
        """The counts and the uncommitted records at one instant (they always add up)."""
        return self.ledger.counts()

    @property
    def drained(self) -> bool:
        """True when the last poll found nothing new (and no poll is under way)."""
        return self.intake.drained

    @property
    def paused_polls(self) -> int:
        """Polls skipped because the batcher was full (backpressure)."""
        return self.intake.paused_polls

    @property
    def caught_up(self) -> bool:
        """True when every change read is committed and the source has no unread bytes."""
        return self.drained and self.uncommitted == 0 and self.reader.backlog_bytes() == 0

    def close(self) -> None:
        """Commit what is pending (until the :meth:`stop_by` deadline) and release the files."""
        try:
            self.flush(force=True)
            if self.flusher.stopping and self.batcher.pending:
                log.info(
                    "stopped with %d changes not yet embedded; they are read again on restart",
                    self.batcher.pending,
                )
        finally:
            self.reader.close()
            self.letters.close()
            if self.embedding.ahead is not None:
                self.embedding.ahead.close()


def _check_dims(embedder: Embedder, index: VectorIndex) -> None:
    if embedder.dim != index.dim:
        msg = (
            f"the embedder makes {embedder.dim}-dimensional vectors but the index holds "
            f"{index.dim}; build the index with dim={embedder.dim}"
        )
        raise StreamragError(msg)


def _watermark_inputs(reader: SourceReader) -> Callable[[str], str] | None:
    """How the reader groups partitions into watermark inputs; None when it does not.

    None keeps the event-time step off the remapping path for the many jobs whose
    partitions are each their own input (a multi-source reader groups only when
    one of its readers does).
    """
    if isinstance(reader, MultiSourceReader):
        return reader.watermark_input if reader.groups_watermarks else None
    return reader.watermark_input if isinstance(reader, GroupsWatermarks) else None
