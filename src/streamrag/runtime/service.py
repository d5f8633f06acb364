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

from streamrag.config import Settings
from streamrag.embed.base import Embedder, build_embedder, check_vectors
from streamrag.index.base import Hit, SearchFilter
from streamrag.index.factory import build_index
from streamrag.runtime.build import build_event_time, build_pipeline
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.epochs import EpochLog
from streamrag.runtime.executor import PipelineRunner
from streamrag.runtime.metrics import Metrics
from streamrag.sources.base import Source
from streamrag.timing import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    US_PER_MS,
    US_PER_S,
    Clock,
    SystemClock,
    format_timestamp,
)

__all__ = ["Service", "build_event_time"]


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
        # Where the last commit left the stream: a restart resumes exactly there.
        cursor = self.index.cursor
        self.resumed_from = self.index.epoch if cursor is not None else None
        resumed = Cursor.from_mapping(cursor) if cursor is not None else Cursor()
        self.resumed_at = {
            "ingested": int(resumed.stats.get("ingested", 0)),
            "waiting": resumed.waiting,
        }
        self.pipeline = build_pipeline(
            settings,
            embedder=self.embedder,
            index=self.index,
            clock=self.clock,
            metrics=self.metrics,
            source=source,
            on_commit=[self.epochs.record],
            cursor=cursor,
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


def _time(ts: int) -> str | None:
    """A watermark or event time for people: None before anything, 'end' after a replay."""
    if ts == MIN_TIMESTAMP:
        return None
    if ts == MAX_TIMESTAMP:
        return "end"
    return format_timestamp(ts)
