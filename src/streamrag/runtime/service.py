"""A running streamrag job: the pipeline, its index and the query side, built from settings.

:class:`Service` is what the HTTP API and the CLI talk to. It owns one
embedder (shared by ingestion and queries), one index, the pipeline and the
thread that runs it, and the metrics registry. ``start()`` begins ingesting,
``stop()`` commits what is pending and stops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from streamrag.batching import AdaptiveController, PartitionKey
from streamrag.chunking import TokenSplitter, count_words
from streamrag.config import Settings
from streamrag.embed.base import Embedder, build_embedder, check_vectors
from streamrag.embed.resilient import RetryPolicy
from streamrag.eventtime import (
    AGGREGATORS,
    Accumulation,
    EventTimeStage,
    Mode,
    NamedWindow,
    Session,
    Sliding,
    WatermarkTracker,
    WindowedAggregation,
)
from streamrag.index.base import Hit, SearchFilter
from streamrag.index.factory import build_index
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.runtime.epochs import EpochLog
from streamrag.runtime.executor import PipelineRunner
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.pipeline import Pipeline
from streamrag.sources.base import Source
from streamrag.sources.files import JsonlSource
from streamrag.sources.multi import MultiSource
from streamrag.timing import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    US_PER_MS,
    US_PER_S,
    Clock,
    SystemClock,
    format_timestamp,
)

__all__ = ["Service"]


class Service:
    """One streamrag job: ingestion in a background thread, retrieval on demand."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        source: Source | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        # Process-wide: every matrix product (search, hashing) uses this many threads.
        threadpool_limits(limits=settings.blas_threads, user_api="blas")
        self.embedder = embedder or build_embedder(settings.embedder.class_, settings.embedder.args)
        self.metrics = Metrics()
        self.index = build_index(
            settings.index, self.embedder.dim, state_dir=settings.state_dir, clock=self.clock
        )
        self.metrics.watch_index(getattr(self.index, "health", None))
        # What each commit changed: the answer cache checks it before serving.
        self.epochs = EpochLog()
        ingest = settings.ingest
        batcher = settings.batcher
        line_cap = ingest.max_document_bytes + 1
        src = source or MultiSource(
            [
                JsonlSource(
                    settings.source.path, glob=settings.source.glob, max_line_bytes=line_cap
                ),
                JsonlSource(settings.replay_dir, max_line_bytes=line_cap),
            ]
        )
        # Where the last commit left the stream: a restart resumes exactly there.
        cursor = self.index.cursor
        self.resumed_from = self.index.epoch if cursor is not None else None
        self.resumed_at: dict[str, int] = {"ingested": 0, "waiting": 0}
        if cursor is not None:
            self.resumed_at = {
                "ingested": int(cursor.get("stats", {}).get("ingested", 0)),
                "waiting": sum(len(v) for v in (cursor.get("pending") or {}).values()),
            }
        emb = settings.embedder
        self.pipeline = Pipeline(
            source=src,
            embedder=self.embedder,
            index=self.index,
            # Kept across restarts; a record refused again on a replay is stored once.
            dead_letters=DeadLetterStore(settings.dead_letter_path),
            clock=self.clock,
            splitter=_splitter(settings, self.embedder),
            decoder=Decoder(
                default_tenant=ingest.default_tenant, max_document_bytes=ingest.max_document_bytes
            ),
            max_batch_size=batcher.max_batch_size,
            max_delay_ms=batcher.max_delay_ms,
            max_batch_tokens=batcher.max_batch_tokens,
            max_pending=batcher.max_pending or 4 * batcher.max_batch_size,
            max_pending_bytes=batcher.max_pending_bytes,
            commit_interval_ms=batcher.commit_interval_ms,
            history=settings.index.kind == "lsm" and settings.index.history == "full",
            retry=RetryPolicy(
                attempts=emb.attempts,
                backoff_s=emb.backoff_ms / 1000,
                max_backoff_s=emb.max_backoff_ms / 1000,
                timeout_s=emb.timeout_s,
            ),
            cursor=cursor,
            partition=PartitionKey(
                tuple(batcher.partition_key), batcher.date_bucket_ms * US_PER_MS
            ),
            controller=_controller(settings),
            tick_us=None if batcher.tick_ms is None else batcher.tick_ms * US_PER_MS,
            max_read_bytes=settings.source.max_read_bytes,
            event_time=build_event_time(settings, self.clock),
            window_side_output=settings.event_time.late_to_dead_letter,
            metrics=self.metrics,
            on_commit=[self.epochs.record],
        )
        self.runner = PipelineRunner(
            self.pipeline, poll_interval_ms=settings.source.poll_interval_ms
        )
        self.started_us = self.clock.now_us()

    def start(self) -> None:
        """Load the embedder and start ingesting in the background."""
        load = getattr(self.embedder, "load", None)
        if callable(load):
            load()
        self.runner.start()

    def stop(self) -> None:
        """Stop ingesting, commit what is pending (within ``stop_timeout_s``), close the index.

        Closing the index writes a final checkpoint when it persists; changes not
        embedded in time are read again on restart.
        """
        self.runner.stop(self.settings.stop_timeout_s)
        close = getattr(self.index, "close", None)
        if callable(close):
            close()

    def retrieve_many(
        self, queries: Sequence[str], k: int, flt: SearchFilter
    ) -> tuple[int, list[list[Hit]]]:
        """Embed queries in one call and search one pinned epoch for all of them."""
        epoch, hits, _ = self.retrieve_many_with_vectors(queries, k, flt)
        return epoch, hits

    def retrieve_many_with_vectors(
        self, queries: Sequence[str], k: int, flt: SearchFilter
    ) -> tuple[int, list[list[Hit]], npt.NDArray[np.float32]]:
        """:meth:`retrieve_many`, also returning the query vectors (one unit row per query)."""
        started = time.perf_counter()
        vectors = self.embed_many(queries)
        epoch, hits = self.index.search_many(vectors, k, flt)
        self.metrics.query_seconds.observe(time.perf_counter() - started)
        self.metrics.query_batch.observe(len(queries))
        return epoch, hits, vectors

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Texts as unit vectors from the job's embedder, checked (``/v1/embeddings``)."""
        return check_vectors(
            self.embedder.embed_many(list(texts)), len(texts), self.embedder.dim, "embedder"
        )

    def _torn_tails(self) -> int:
        health = getattr(self.index, "health", None)
        return int(health().wal_torn_tails) if callable(health) else 0

    def status(self) -> dict[str, Any]:
        """Epoch, watermark, counts, lag and freshness, as ``GET /v1/status`` returns them."""
        # The counts and what is uncommitted at one instant: they always add up.
        st, pending = self.pipeline.counts()
        idx = self.index.stats()
        now = self.clock.now_us()
        wm = self.pipeline.watermark
        tracker = self.pipeline.event_time.tracker
        batcher = self.pipeline.batcher
        backlog = self.pipeline.reader.backlog_bytes()  # stats every file: read it once
        body: dict[str, Any] = {
            "epoch": idx.epoch,
            "watermark": _time(wm),
            "source": {
                "path": str(self.settings.source.path),
                # A missing path is read once it appears; until then nothing is ingested.
                "exists": self.settings.source.path.exists(),
            },
            "event_time": {
                "watermark": _time(wm),
                "lag_s": None if wm in (MIN_TIMESTAMP, MAX_TIMESTAMP) else (now - wm) / US_PER_S,
                "max_event_time": _time(tracker.max_seen()),
                "partitions": tracker.partitions,
                "active_partitions": len(tracker.active()),
                "mode": self.pipeline.event_time.mode.value,
                "windows": {
                    w.name: {"open": w.operator.open_windows, "late": st_late}
                    for w, st_late in zip(
                        self.pipeline.event_time.windows,
                        self.pipeline.event_time.late_counts.values(),
                        strict=True,
                    )
                },
            },
            "batcher": {
                "target_size": batcher.target_size,
                "pending_chunks": batcher.pending_chunks,
                "partitions": batcher.partitions,
                "full": batcher.full,
            },
            "queues": {
                "batcher": {
                    "changes": batcher.pending,
                    "chunks": batcher.pending_chunks,
                    "bytes": batcher.pending_bytes,
                    "max_chunks": batcher.max_pending,
                    "max_bytes": batcher.max_pending_bytes,
                },
                "embedding": self.pipeline.uncommitted - batcher.pending,
                "source_backlog_bytes": backlog,
            },
            "backpressure": {
                "on": batcher.full,
                "paused_polls": self.pipeline.paused_polls,
            },
            "last_commit": (self.index.cursor or {}).get("audit"),
            "recovery": {
                "resumed_from_epoch": self.resumed_from,
                "ingested_before": self.resumed_at["ingested"],
                "waiting_at_resume": self.resumed_at["waiting"],
                "replayed": st.replayed,
                "skipped": st.skipped,
                "wal_torn_tails": self._torn_tails(),
                # Set when a damaged index was moved aside and is rebuilt from the sources.
                "rebuilt_from_source": getattr(self.index, "rebuilt", None),
            },
            "counts": {
                "ingested": st.ingested,
                "applied": st.applied,
                "stale": st.stale,
                "past_versions": st.past_versions,
                "dead_lettered": st.dead_lettered,
                "pending": pending,
                "chunks_embedded": st.chunks_embedded,
                "chunks_reused": st.chunks_reused,
                "commits": st.commits,
                "window_results": st.window_results,
                "window_late": st.window_late,
                "window_invalid": st.window_invalid,
                "window_errors": st.window_errors,
                "poison": st.poison,
                "embed_retries": st.embed_retries,
            },
            "index": {
                "live_docs": idx.live_docs,
                "live_chunks": idx.live_chunks,
                "deleted_docs": idx.deleted_docs,
                "history": self.settings.index.history
                if self.settings.index.kind == "lsm"
                else "current",
            },
            "ingest_lag": {
                "backlog_bytes": backlog,
                "pending_changes": pending,
                "caught_up": self.pipeline.drained and pending == 0 and backlog == 0,
                "watermark_lag_s": None
                if wm in (MIN_TIMESTAMP, MAX_TIMESTAMP)
                else (now - wm) / US_PER_S,
            },
            "freshness": {
                "last_batch_ms": None
                if st.last_freshness_us is None
                else st.last_freshness_us / US_PER_MS,
                "since_last_commit_ms": None
                if st.last_commit_us is None
                else max(0, now - st.last_commit_us) / US_PER_MS,
            },
            "embedder": self.embedder.version,
            "dead_letter_path": str(self.settings.dead_letter_path),
            "pipeline": {
                "running": self.runner.running,
                "errors": self.runner.errors,
                "last_error": self.runner.last_error,
            },
            "uptime_s": (now - self.started_us) / 1e6,
        }
        return body


def _splitter(settings: Settings, embedder: Embedder) -> TokenSplitter:
    """Chunk in the embedder's own tokens when it can count them."""
    chunking = settings.chunking
    count = getattr(embedder, "count_tokens", None)
    if chunking.tokens == "words" or not callable(count):
        count = count_words
    return TokenSplitter(chunking.max_tokens, chunking.overlap_tokens, count_tokens=count)


def _time(ts: int) -> str | None:
    """A watermark or event time for people: None before anything, 'end' after a replay."""
    if ts == MIN_TIMESTAMP:
        return None
    if ts == MAX_TIMESTAMP:
        return "end"
    return format_timestamp(ts)


def _controller(settings: Settings) -> AdaptiveController | None:
    b = settings.batcher
    if not b.adaptive:
        return None
    low = min(b.min_batch_size, b.max_batch_size)
    return AdaptiveController(
        min_size=low,
        max_size=b.max_batch_size,
        target_latency_s=b.target_embed_ms / 1000,
        initial=max(low, min(b.max_batch_size, 16)),
    )


def build_event_time(settings: Settings, clock: Clock) -> EventTimeStage:
    """The event-time stage from settings: the watermark tracker and the windows."""
    et = settings.event_time
    tracker = WatermarkTracker(
        bound_us=et.max_out_of_orderness_ms * US_PER_MS,
        idle_timeout_us=None if et.idle_timeout_ms is None else et.idle_timeout_ms * US_PER_MS,
        clock=clock,
    )
    windows = []
    for w in et.windows:
        ms = US_PER_MS
        if w.kind == "session":
            assert w.gap_ms is not None
            assigner: Session | Sliding = Session(w.gap_ms * ms)
        else:
            assert w.size_ms is not None
            slide = w.size_ms if w.kind == "tumbling" else w.slide_ms
            assert slide is not None
            assigner = Sliding(w.size_ms * ms, slide * ms, w.offset_ms * ms)
        op = WindowedAggregation(
            assigner,
            AGGREGATORS[w.aggregate](),
            allowed_lateness_us=w.allowed_lateness_ms * ms,
            accumulation=Accumulation(w.accumulation),
            early_every_us=None if w.early_every_ms is None else w.early_every_ms * ms,
            name=w.name,
        )
        windows.append(NamedWindow(w.name, op, tuple(w.key), w.value, w.keep_results))
    tick = settings.batcher.tick_ms
    return EventTimeStage(
        tracker, windows, mode=Mode(et.mode), tick_us=None if tick is None else tick * US_PER_MS
    )
