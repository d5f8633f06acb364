"""The pipeline: the stages of the data path wired top to bottom.

::

    source ─► decode (dead letters) ─► micro-batcher ─► last-writer-wins
           ─► chunk + content hash ─► embed what changed ─► commit one epoch

One call of :meth:`Pipeline.step` reads what the source has (unless the batcher
is full, which is how backpressure reaches the source) and commits every batch
that is due. The pipeline never sleeps and never reads the wall clock itself:
time comes from the injected :class:`~streamrag.timing.Clock`, so tests drive it
with a :class:`~streamrag.testing.ManualClock`. :mod:`.executor` runs it in a
thread for a live job.

Accounting (invariant 4, nothing lost): every record read is either applied
(committed, or found stale by last-writer-wins), dead-lettered with its reason,
or not yet committed — ``ingested == applied + dead_lettered + uncommitted``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from streamrag.batching import MicroBatcher, PendingBatch
from streamrag.changes import Op
from streamrag.chunking import TokenSplitter, chunk_id, content_hash
from streamrag.embed.base import Embedder, check_vectors
from streamrag.errors import EmbedderError, StreamragError
from streamrag.eventtime import BoundedOutOfOrderness
from streamrag.index.base import CommitBatch, CommitResult, DocOp, VectorIndex
from streamrag.ingest import DeadLetter, DeadLetterStore, Decoder
from streamrag.runtime.metrics import Metrics
from streamrag.sources.base import Source
from streamrag.timing import US_PER_S, Clock, Timestamp

__all__ = ["CommitHook", "Pipeline", "PipelineStats"]

log = logging.getLogger("streamrag.pipeline")

CommitHook = Callable[[CommitBatch, CommitResult], None]


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
        watermark: BoundedOutOfOrderness | None = None,
        metrics: Metrics | None = None,
        on_commit: Sequence[CommitHook] = (),
        resume: Mapping[str, int] | None = None,
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
            max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, clock=clock
        )
        self.max_read_bytes = max_read_bytes
        self.watermark = watermark or BoundedOutOfOrderness()
        self.metrics = metrics or Metrics()
        self.on_commit = list(on_commit)
        self.stats = PipelineStats()
        self._in_flight = 0
        self._drained = False
        self._idle_poll_us: Timestamp = 0

    # -- the loop body ---------------------------------------------------------

    def step(self) -> bool:
        """Read what is available and commit what is due; True if anything happened."""
        read = self.poll()
        committed = self.flush()
        return read > 0 or committed > 0

    def poll(self, *, final: bool = False) -> int:
        """Read from the source into the batcher, unless it is full. Returns records read."""
        if self.batcher.full:
            return 0
        # Data found now landed after the last poll that found nothing: the
        # deadline counts from then, so max_delay_ms bounds the time from the
        # write, not from our read (which is up to a poll interval later).
        idle_since = self._idle_poll_us if self._drained else None
        self._drained = False  # before reading: what is read counts as in progress
        now = self.clock.now_us()
        raws = self.reader.poll(self.max_read_bytes, final=final)
        if not raws:
            self._drained = True
            self._idle_poll_us = now
            return 0
        n = sum(len(r) for r in raws)
        changes, letters = self.decoder.decode(raws)
        self.stats.ingested += n
        self.metrics.ingested.inc(n)
        self._dead_letter(letters)
        if len(changes):
            self.watermark.observe(int(changes.event_times.max()))
            self.metrics.watermark.set(self.watermark.watermark / US_PER_S)
        self.batcher.add(changes, arrived_us=idle_since)
        self.metrics.pending.set(self.batcher.pending)
        return n

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
        letters: list[DeadLetter] = []
        split = self.splitter.split
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
            try:
                chunks = split(payload["text"])
            except Exception as exc:  # a stage error must not stop the stream
                letters.append(
                    DeadLetter(
                        changes.sources[i],
                        offsets[i],
                        "chunk",
                        f"chunking failed: {type(exc).__name__}: {exc}",
                        repr(dict(payload))[:64_000],
                    )
                )
                continue
            old = {}
            if state is not None and not state.deleted:
                old = dict(zip(state.hashes, state.rows, strict=True))
            first = len(texts)
            for pos, chunk in enumerate(chunks):
                h = content_hash(chunk)
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
            started = time.perf_counter()
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
            self.metrics.embed_seconds.observe(time.perf_counter() - started)
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
        self._dead_letter(letters)
        st = self.stats
        applied = len(changes) - len(letters)
        stale += result.stale_docs
        st.applied += applied
        st.stale += stale
        st.chunks_embedded += len(embed_slots)
        st.chunks_reused += len(reuse_slots)
        st.commits += 1
        st.last_commit_us = now
        st.last_freshness_us = now - pending.first_arrival_us
        m = self.metrics
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
