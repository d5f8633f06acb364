"""A running streamrag job: the pipeline, its index and the query side, built from settings.

:class:`Service` is what the HTTP API and the CLI talk to. It owns one
embedder (shared by ingestion and queries), one index, the pipeline and the
thread that runs it, and the metrics registry. ``start()`` begins ingesting,
``stop()`` commits what is pending and stops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from streamrag.config import Settings
from streamrag.embed.base import Embedder, Loadable, build_embedder, check_vectors
from streamrag.errors import OverloadedError, StateError
from streamrag.index.base import Closeable, Hit, SearchFilter, SupportsHealth
from streamrag.index.factory import build_index
from streamrag.ingest import Decoder
from streamrag.runtime.build import build_event_time, build_pipeline
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.epochs import EpochLog
from streamrag.runtime.executor import PipelineRunner
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.push import PushJournal, PushReceipt, changes_of
from streamrag.runtime.status import job_status
from streamrag.sources.base import Source
from streamrag.timing import (
    Clock,
    SystemClock,
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
        self.metrics.watch_index(
            self.index.health if isinstance(self.index, SupportsHealth) else None
        )
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
        # Changes pushed over HTTP or from Python: journaled, then read like a file.
        self.journal = self._push_journal() if source is None else None
        self.pipeline = build_pipeline(
            settings,
            embedder=self.embedder,
            index=self.index,
            clock=self.clock,
            metrics=self.metrics,
            source=source,
            on_commit=[self.epochs.record],
            cursor=cursor,
            push=self.journal,
        )
        self.runner = PipelineRunner(
            self.pipeline,
            poll_interval_ms=settings.source.poll_interval_ms,
            wake_timeout_ms=settings.source.wake_timeout_ms,
        )
        self.started_us = self.clock.now_us()

    def _push_journal(self) -> PushJournal:
        """The journal that ``push``, ``upsert``, ``delete`` and ``POST /v1/documents`` fill."""
        settings = self.settings
        return PushJournal(
            settings.push_dir,
            decoder=Decoder(
                default_tenant=settings.ingest.default_tenant,
                max_document_bytes=settings.ingest.max_document_bytes,
            ),
            clock=self.clock,
            max_backlog_bytes=settings.push.max_backlog_bytes,
            max_changes=settings.push.max_changes,
            epoch=lambda: self.index.epoch,
        )

    def start(self) -> None:
        """Load the embedder and start ingesting in the background."""
        if isinstance(self.embedder, Loadable):
            self.embedder.load()
        self.runner.start()

    def stop(self) -> None:
        """Stop ingesting, commit what is pending (within ``stop_timeout_s``), close the index.

        Closing the index writes a final checkpoint when it persists; changes not
        embedded in time are read again on restart.
        """
        self.runner.stop(self.settings.stop_timeout_s)
        if isinstance(self.index, Closeable):
            self.index.close()

    # -- pushing changes ---------------------------------------------------------

    def push(
        self,
        changes: Sequence[Mapping[str, Any]],
        *,
        wait_for_commit: bool = False,
        timeout_s: float | None = None,
    ) -> PushReceipt:
        """Journal streamrag changes (``doc_id``, ``op``, ``text``; ``event_time`` defaults to now).

        The answer says how many were taken and, with ``wait_for_commit``, the
        epoch that made them visible. See :mod:`streamrag.runtime.push`.
        """
        journal = self._journal()
        wait = self.settings.push.wait_timeout_s if timeout_s is None else timeout_s
        return journal.push(changes, wait_for_commit=wait_for_commit, timeout_s=wait)

    def upsert(
        self,
        doc_id: str,
        text: str,
        *,
        wait_for_commit: bool = False,
        **fields: Any,
    ) -> PushReceipt:
        """Add or replace one document (``tenant``, ``title``, ``metadata``, ``event_time``...)."""
        change = {"doc_id": doc_id, "op": "upsert", "text": text, **fields}
        return self.push([change], wait_for_commit=wait_for_commit)

    def delete(self, doc_id: str, *, wait_for_commit: bool = False, **fields: Any) -> PushReceipt:
        """Remove one document (``tenant``, ``event_time``, ``idempotency_key`` may be given)."""
        change = {"doc_id": doc_id, "op": "delete", **fields}
        return self.push([change], wait_for_commit=wait_for_commit)

    def ingest(
        self,
        items: Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]],
        *,
        batch: int = 256,
        wait_for_commit: bool = True,
    ) -> PushReceipt:
        """Push every change of an iterable or async iterable; waits for the last epoch.

        The notebook way in, with no file: each list of ``batch`` changes is
        journaled as one push; when the pipeline is behind, this waits and
        retries (backpressure) instead of failing.
        """
        if isinstance(items, AsyncIterable):
            items = _drain_async(items)
        journal = self._journal()
        receipts = [self._push_patiently(journal, chunk) for chunk in changes_of(items, batch)]
        accepted = sum(r.accepted for r in receipts)
        duplicates = sum(r.duplicates for r in receipts)
        if not wait_for_commit:
            return PushReceipt(accepted, duplicates, committed=False)
        epochs = [journal.wait_for(r, self.settings.push.wait_timeout_s) for r in receipts]
        done = all(e is not None for e in epochs)
        epoch = max((e for e in epochs if e is not None), default=self.index.epoch)
        return PushReceipt(accepted, duplicates, committed=done, epoch=epoch if done else None)

    @staticmethod
    def _push_patiently(journal: PushJournal, chunk: list[Mapping[str, Any]]) -> PushReceipt:
        """Push, waiting out backpressure (``Retry-After``) instead of failing."""
        pause = threading.Event()
        while True:
            try:
                return journal.push(chunk)
            except OverloadedError as exc:
                pause.wait(min(exc.retry_after_s, 1.0))

    def _journal(self) -> PushJournal:
        if self.journal is None:
            msg = (
                "this job reads a source given in Python, so it has no push journal; "
                "push to a job built from settings (Service(settings)) instead"
            )
            raise StateError(msg)
        return self.journal

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
        epoch, hits = self.search_many(vectors, k, flt)
        self.observe_query(time.perf_counter() - started, len(queries))
        return epoch, hits, vectors

    def search_many(
        self, vectors: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[list[Hit]]]:
        """The top ``k`` of each query vector in one pinned epoch of the index."""
        return self.index.search_many(vectors, k, flt)

    def observe_query(self, seconds: float, queries: int) -> None:
        """Record one batch of ``queries`` answered in ``seconds`` in the metrics."""
        self.metrics.query_seconds.observe(seconds)
        self.metrics.query_batch.observe(queries)

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Texts as unit vectors from the job's embedder, checked (``/v1/embeddings``)."""
        return check_vectors(
            self.embedder.embed_many(list(texts)), len(texts), self.embedder.dim, "embedder"
        )

    def status(self) -> dict[str, Any]:
        """Epoch, watermark, counts, lag and freshness, as ``GET /v1/status`` returns them."""
        return job_status(self)


def _drain_async(items: AsyncIterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    """An async iterable's items, read on a private event loop in this thread."""
    loop = asyncio.new_event_loop()
    iterator = items.__aiter__()
    try:
        while True:
            try:
                yield loop.run_until_complete(iterator.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.close()
