"""The pipeline: the stages of the data path wired top to bottom.

::

    source ─► decode (dead letters) ─► event time (watermark, windows, late output)
           ─► chunk ─► micro-batcher (partitioned; size, deadline, watermark)
           ─► last-writer-wins ─► embed what changed ─► commit one epoch

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

Accounting (invariant 4, nothing lost): every record read is either applied
(committed, or found stale by last-writer-wins), dead-lettered with its reason,
or not yet committed — ``ingested == applied + dead_lettered + uncommitted``.
Window side outputs (late changes, changes without the value a window needs)
are also kept in the dead-letter store, under their own stages, but those
changes are applied to the index all the same and are counted apart.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrag.batching import AdaptiveController, MicroBatcher, PartitionKey, PendingBatch
from streamrag.changes import ChangeBatch, Op
from streamrag.chunking import TokenSplitter, chunk_id, content_hash
from streamrag.embed.base import Embedder, check_vectors
from streamrag.errors import EmbedderError, StreamragError
from streamrag.eventtime import EventTimeStage, StageOutput, WatermarkTracker, WindowResult
from streamrag.index.base import CommitBatch, CommitResult, DocOp, VectorIndex
from streamrag.ingest import DeadLetter, DeadLetterStore, Decoder
from streamrag.runtime.metrics import Metrics
from streamrag.sources.base import Source
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, Duration, Timestamp

__all__ = ["CommitHook", "Pipeline", "PipelineStats", "Prepared", "WindowHook"]

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
    last_commit_us: Timestamp | None = None
    last_freshness_us: int | None = None
    window_results: int = 0
    window_late: int = 0
    window_invalid: int = 0


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
        partition: PartitionKey | None = None,
        controller: AdaptiveController | None = None,
        tick_us: Duration | None = None,
        event_time: EventTimeStage | None = None,
        window_side_output: bool = True,
        metrics: Metrics | None = None,
        on_commit: Sequence[CommitHook] = (),
        on_window: Sequence[WindowHook] = (),
        resume: Mapping[str, int] | None = None,
        event_time_state: Mapping[str, Any] | None = None,
    ) -> None:
        if embedder.dim != index.dim:
            msg = (
                f"the embedder makes {embedder.dim}-dimensional vectors but the index holds "
                f"{index.dim}; build the index with dim={embedder.dim}"
            )
            raise StreamragError(msg)
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
            partition=partition,
            controller=controller,
            tick_us=tick_us,
        )
        self.max_read_bytes = max_read_bytes
        self.event_time = event_time or EventTimeStage(WatermarkTracker(clock=clock))
        if event_time_state is not None:
            self.event_time.restore(dict(event_time_state))
        self.window_side_output = window_side_output
        self.metrics = metrics or Metrics()
        self.on_commit = list(on_commit)
        self.on_window = list(on_window)
        self.stats = PipelineStats()
        self._in_flight = 0
        self._drained = False
        self._idle_poll_us: Timestamp = 0
        self._stats_lock = threading.Lock()

    def checkpoint(self) -> dict[str, Any]:
        """Source positions and event-time state together, at a point where both agree.

        Taken when nothing read is uncommitted (after a flush), the positions
        say where to resume reading and the event-time state (watermark,
        per-input maxima, every window) is exactly what those records produced;
        pass them back as ``resume`` and ``event_time_state`` to continue.
        Plain data, so it can be written with the commit it belongs to.
        """
        if self.uncommitted:
            msg = (
                f"{self.uncommitted} changes are read but not committed; flush before taking "
                "a checkpoint, so that positions and window state describe the same records"
            )
            raise StreamragError(msg)
        return {"positions": self.reader.snapshot(), "event_time": self.event_time.snapshot()}

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
        now = self.clock.now_us()
        self._windows(self.event_time.on_processing_time(now), None)
        if self.batcher.full:
            return 0
        # Data found now landed after the last poll that found nothing: the
        # deadline counts from then, so max_delay_ms bounds the time from the
        # write, not from our read (which is up to a poll interval later).
        idle_since = self._idle_poll_us if self._drained else None
        self._drained = False  # before reading: what is read counts as in progress
        raws = self.reader.poll(self.max_read_bytes, final=final)
        if not raws:
            self._drained = True
            self._idle_poll_us = now
            return 0
        n = sum(len(r) for r in raws)
        changes, letters = self.decoder.decode(raws)
        with self._stats_lock:
            self.stats.ingested += n
        self.metrics.ingested.inc(n)
        self._dead_letter(letters)
        if len(changes):
            self._windows(self.event_time.process(changes), changes)
            changes, prepared, letters = self._prepare(changes)
            self._dead_letter(letters)
            self.batcher.add(
                changes,
                arrived_us=idle_since,
                prepared=prepared,
                chunks=[len(p.chunks) if p else 1 for p in prepared],
                tokens=[p.tokens if p else 0 for p in prepared],
            )
        self.metrics.pending.set(self.batcher.pending)
        return n

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
        """Commit every batch that is due (every pending one if ``force``). Returns commits."""
        done = 0
        batcher = self.batcher
        while batcher.pending and (force or batcher.due()):
            # Count the batch as in flight before it leaves the batcher, so that
            # another thread never sees it in neither place.
            self._in_flight = min(batcher.pending, batcher.max_batch_size)
            self._commit(batcher.take())
            done += 1
        return done

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
        """Changes read but not yet committed: waiting in the batcher or being embedded."""
        return self.batcher.pending + self._in_flight

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
        """Commit what is pending and release the source and the dead-letter file."""
        try:
            self.flush(force=True)
        finally:
            self.reader.close()
            self.dead_letters.close()

    # -- one micro-batch -------------------------------------------------------

    def _commit(self, pending: PendingBatch) -> None:
        self._in_flight = len(pending.changes)
        try:
            batch, result = self._apply(pending)
        except BaseException:
            # Nothing is lost: the batch goes back to the front and is retried.
            self.batcher.put_back(pending)
            raise
        finally:
            self._in_flight = 0
        for hook in self.on_commit:  # after the commit: a failing hook cannot undo it
            hook(batch, result)

    def _apply(self, pending: PendingBatch) -> tuple[CommitBatch, CommitResult]:
        """Everything of one micro-batch up to and including its index commit."""
        changes = pending.changes
        tenants, doc_ids = changes.tenants, changes.doc_ids
        times = changes.event_times.tolist()
        offsets = changes.offsets.tolist()
        ops = changes.ops.tolist()
        # Last writer wins within the batch: keep the newest change per document.
        winners: dict[tuple[str, str], int] = {}
        for i, key in enumerate(zip(tenants, doc_ids, strict=True)):
            j = winners.get(key)
            if j is None or (times[i], offsets[i]) > (times[j], offsets[j]):
                winners[key] = i
        stale = len(changes) - len(winners)

        docs: list[DocOp] = []
        ids: list[int] = []
        positions: list[int] = []
        texts: list[str] = []
        hashes: list[bytes] = []
        embed_slots: list[int] = []
        reuse_slots: list[int] = []
        reuse_rows: list[int] = []
        prepared = pending.prepared or [None] * len(changes)
        index = self.index
        for (tenant, doc_id), i in winners.items():
            version = (times[i], offsets[i])
            state = index.doc_state(tenant, doc_id)
            if state is not None and state.version >= version:
                stale += 1
                continue
            payload = changes.payloads[i]
            domain = str(payload.get("domain", ""))
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
                if row is None:
                    embed_slots.append(slot)
                else:
                    reuse_slots.append(slot)
                    reuse_rows.append(row)
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
        if embed_slots:
            # Measured on the injected clock, so a test's synthetic embedder can set it.
            started = self.clock.now_us()
            try:
                out = self.embedder.embed_many([texts[s] for s in embed_slots])
                vectors[embed_slots] = check_vectors(
                    out, len(embed_slots), index.dim, type(self.embedder).__name__
                )
            except Exception as exc:
                if isinstance(exc, EmbedderError):
                    raise
                msg = f"embedder {self.embedder!r} failed: {type(exc).__name__}: {exc}"
                raise EmbedderError(msg) from exc
            took = max(0, self.clock.now_us() - started) / US_PER_S
            self.metrics.embed_seconds.observe(took)
            controller = self.batcher.controller
            if controller is not None:
                action = controller.observe(
                    len(embed_slots), took, queued=self.batcher.pending_chunks
                )
                self.metrics.batch_decisions.labels(action=action).inc()
                self.metrics.batch_target.set(controller.target)
        if reuse_slots:
            vectors[reuse_slots] = index.vectors_at(reuse_rows)

        batch = CommitBatch(
            docs=docs,
            chunk_ids=np.asarray(ids, dtype=np.int64),
            positions=np.asarray(positions, dtype=np.int32),
            texts=texts,
            hashes=hashes,
            vectors=vectors,
            embedder_version=self.embedder.version,
        )
        result = index.commit(batch)
        now = self.clock.now_us()
        st = self.stats
        applied = len(changes)
        stale += result.stale_docs
        with self._stats_lock:
            st.applied += applied
            st.stale += stale
            st.chunks_embedded += len(embed_slots)
            st.chunks_reused += len(reuse_slots)
            st.commits += 1
            st.last_commit_us = now
            st.last_freshness_us = now - pending.first_arrival_us
        m = self.metrics
        m.batch_chunks.observe(pending.chunks)
        m.batch_reasons.labels(reason=pending.reason).inc()
        m.applied.inc(applied)
        m.stale.inc(stale)
        m.chunks_embedded.inc(len(embed_slots))
        m.chunks_reused.inc(len(reuse_slots))
        m.commits.inc()
        m.freshness.observe(st.last_freshness_us / US_PER_S)
        m.epoch.set(result.epoch)
        stats = index.stats()
        m.live_chunks.set(stats.live_chunks)
        m.live_docs.set(stats.live_docs)
        m.pending.set(self.batcher.pending)
        return batch, result

    def _dead_letter(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        self.dead_letters.add_many(letters, self.clock.now_us())
        with self._stats_lock:
            self.stats.dead_lettered += len(letters)
        for letter in letters:
            self.metrics.dead_letters.labels(stage=letter.stage).inc()
            log.warning(
                "dead-lettered %s@%d (%s): %s",
                letter.source,
                letter.offset,
                letter.stage,
                letter.reason,
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
