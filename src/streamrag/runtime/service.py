"""A running streamrag job: the pipeline, its index and the query side, built from settings.

:class:`Service` is what the HTTP API and the CLI talk to. It owns the
serving index :class:`~streamrag.runtime.generations.Generation` (an index and
the embedder whose vectors it holds, shared by ingestion and queries), any
other generation being built or kept for rollback (:mod:`.reindex`), the
pipeline and the thread that runs it, and the metrics registry. ``start()``
begins ingesting, ``stop()`` commits what is pending and stops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from streamrag.config import Settings
from streamrag.embed.ahead import LOCK_FREE, holds_gil
from streamrag.embed.base import Embedder, Loadable
from streamrag.embed.choice import EmbedderChoice
from streamrag.errors import ConfigError, IndexStoreError, OverloadedError, StateError
from streamrag.index.base import (
    Closeable,
    SearchFilter,
    SupportsHealth,
    SupportsRollback,
    VectorIndex,
)
from streamrag.index.factory import build_index
from streamrag.index.hits import Hits
from streamrag.ingest import Decoder
from streamrag.runtime.build import (
    build_choice,
    build_epoch_audit,
    build_event_time,
    build_pipeline,
    embedder_from,
)
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.epochs import EpochLog
from streamrag.runtime.executor import PipelineRunner
from streamrag.runtime.generations import Book, Entry, Generation, Mirror, State, index_home
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.push import PushJournal, PushReceipt, changes_of
from streamrag.runtime.reindex import Reindexer
from streamrag.runtime.status import job_status
from streamrag.sources.base import Source
from streamrag.timing import Clock, SystemClock, format_timestamp

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
        self.metrics = Metrics()
        # Which index generation serves, and which others are built or kept (reindex).
        self.book = Book.load(settings.state_dir) if settings.index.kind == "lsm" else None
        self._given_embedder = embedder
        self._others: dict[int, Generation] = {}
        self._mirrors: dict[int, Mirror] = {}
        self.on_switch: list[Callable[[Generation], None]] = []
        """Called after the serving generation changed (the answer cache clears itself)."""
        first = self.book.serving if self.book is not None else None
        self.serving = self._open(1 if first is None else first.number, first)
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
            choice=self.serving.choice,
        )
        # One hash-chained record per committed epoch, and what a crash left to append.
        self.audit = build_epoch_audit(settings, self.pipeline, lambda: self.serving.number)
        self.reindexer = Reindexer(self)
        for entry in self.book.others() if self.book is not None else []:
            self._attach(self._open(entry.number, entry))
        self.runner = self._runner()
        self.started_us = self.clock.now_us()

    def _runner(self) -> PipelineRunner:
        """The threads that run the pipeline live (read, commit), as the settings say."""
        settings = self.settings
        return PipelineRunner(
            self.pipeline,
            poll_interval_ms=settings.source.poll_interval_ms,
            wake_timeout_ms=settings.source.wake_timeout_ms,
            share_core=settings.ingest.share_core,
            nice=settings.ingest.nice,
        )

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

    # -- generations -------------------------------------------------------------

    @property
    def index(self) -> VectorIndex:
        """The serving generation's index."""
        return self.serving.index

    @property
    def embedder(self) -> Embedder:
        """The serving generation's configured embedder."""
        return self.serving.embedder  # type: ignore[no-any-return]

    def pin(self) -> Generation:
        """The generation a query reads: embed and search with it, both halves."""
        return self.serving

    def generation(self, number: int) -> Generation | None:
        """Generation ``number`` if it is open (serving, building or previous)."""
        if number == self.serving.number:
            return self.serving
        return self._others.get(number)

    def mirror_of(self, number: int) -> Mirror | None:
        """The mirror that copies live changes into generation ``number``."""
        return self._mirrors.get(number)

    def _open(self, number: int, entry: Entry | None) -> Generation:
        """Open generation ``number``'s index with its embedder (and fallbacks)."""
        settings = self.settings
        if entry is None or entry.embedder is None:
            primary = self._given_embedder or embedder_from(
                settings, settings.embedder.class_, settings.embedder.args
            )
            choice = build_choice(settings, primary, self.clock)
        else:
            spec = entry.embedder
            primary = embedder_from(settings, str(spec["class"]), spec.get("args") or {})
            choice = EmbedderChoice(primary, clock=self.clock)
        index = build_index(
            settings.index,
            primary.dim,
            state_dir=index_home(settings.state_dir, number),
            clock=self.clock,
        )
        return Generation(number, index, choice)

    def _attach(self, gen: Generation) -> None:
        """Copy every live change into ``gen`` from now on (before each commit)."""
        self._others[gen.number] = gen
        mirror = Mirror(
            gen,
            source_cursor=lambda: self.serving.index.cursor,
            retry=self.pipeline.embedding.retry,
        )
        self._mirrors[gen.number] = mirror
        self.pipeline.committer.mirrors.append(mirror)

    def detach(self, number: int) -> None:
        """Stop copying changes into generation ``number`` and close its index."""
        committer = self.pipeline.committer
        with committer.lock:
            mirror = self._mirrors.pop(number, None)
            if mirror is not None:
                committer.mirrors.remove(mirror)
            gen = self._others.pop(number, None)
        if gen is not None and isinstance(gen.index, Closeable):
            gen.index.close()

    def book_for_write(self) -> Book:
        """The book of generations, made (with generation 1 serving) if there was none."""
        if self.settings.index.kind != "lsm" or not self.settings.index.persist:
            msg = (
                "index generations need the persistent LSM index (index.kind: lsm, "
                "index.persist: true); rebuild with the new embedder instead"
            )
            raise ConfigError(msg)
        if self.book is None:
            emb = self.embedder
            self.book = Book([Entry(1, "serving", None, self.clock.now_us(), emb.version)])
            self.book.save(self.settings.state_dir)
        return self.book

    def open_generation(
        self, number: int, spec: dict[str, Any], *, state: State, switch: bool = True
    ) -> Generation:
        """Add generation ``number`` for embedder ``spec`` to the book and mirror into it."""
        book = self.book_for_write()
        spec = {"class": str(spec["class"]), "args": dict(spec.get("args") or {})}
        entry = Entry(number, state, spec, self.clock.now_us(), switch_when_built=switch)
        gen = self._open(number, entry)
        if isinstance(gen.embedder, Loadable):
            gen.embedder.load()
        entry.version = gen.embedder.version
        with self.pipeline.committer.lock:  # from the next commit on, it gets every change
            book.entries.append(entry)
            book.save(self.settings.state_dir)
            self._attach(gen)
        return gen

    def switch_to(self, number: int) -> None:
        """Serve generation ``number`` from the next commit on (see :mod:`.reindex`)."""
        book = self.book_for_write()
        committer = self.pipeline.committer
        with committer.lock:  # between two commits
            new = self._others.get(number)
            if new is None:
                msg = f"generation {number} is not open here; it cannot serve"
                raise StateError(msg)
            old = self.serving
            mirror = self._mirrors.pop(number)
            committer.mirrors.remove(mirror)
            del self._others[number]
            book.get(old.number).state = "previous"
            book.get(number).state = "serving"
            book.switches.append(
                {
                    "at": format_timestamp(self.clock.now_us()),
                    "from": old.number,
                    "to": number,
                    "epochs": {str(old.number): old.index.epoch, str(number): new.index.epoch},
                }
            )
            book.save(self.settings.state_dir)  # the switch: one atomic file write
            self.serving = new
            pipeline = self.pipeline
            pipeline.index = committer.index = new.index
            pipeline.embedder = new.embedder
            pipeline.embedding.choice = new.choice
            if pipeline.embedding.ahead is not None:  # it embeds for the old model
                pipeline.embedding.ahead.close()
                pipeline.embedding.ahead = None
            self._attach(old)
        for hook in self.on_switch:
            hook(new)

    # -- running -------------------------------------------------------------------

    def start(self) -> None:
        """Load the embedders, check their vector space, and start ingesting in the background."""
        choice = self.serving.choice
        for emb in choice.embedders() + [g.embedder for g in self._others.values()]:
            if isinstance(emb, Loadable):
                emb.load()
        choice.verify()
        self.runner.start()
        if self.book is not None:
            for entry in self.book.others():
                if entry.state == "building":
                    gen = self._others[entry.number]
                    self.reindexer.resume(gen, switch=entry.switch_when_built)

    def stop(self) -> None:
        """Stop ingesting, commit what is pending (within ``stop_timeout_s``), close the index.

        Closing the index writes a final checkpoint when it persists; changes not
        embedded in time are read again on restart.
        """
        self.reindexer.close()
        self.runner.stop(self.settings.stop_timeout_s)
        for gen in [self.serving, *self._others.values()]:
            if isinstance(gen.index, Closeable):
                gen.index.close()

    def rollback(self, epoch: int) -> int:
        """Make epoch ``epoch``'s documents current again as a new epoch; returns it.

        It happens between two commits, and the audit log records it.
        """
        index = self.index
        if not isinstance(index, SupportsRollback):
            msg = "this index keeps no history to roll back to; use index.kind: lsm"
            raise IndexStoreError(msg)
        with self.pipeline.committer.lock:
            if self.audit is None:
                return index.rollback(epoch)
            return self.audit.rollback(self.index, epoch)

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
    ) -> tuple[int, list[Hits]]:
        """Embed queries in one call and search one pinned epoch for all of them."""
        epoch, hits, _ = self.retrieve_many_with_vectors(queries, k, flt)
        return epoch, hits

    def retrieve_many_with_vectors(
        self, queries: Sequence[str], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits], npt.NDArray[np.float32]]:
        """:meth:`retrieve_many`, also returning the query vectors (one unit row per query)."""
        started = time.perf_counter()
        gen = self.pin()
        vectors = gen.embed_many(queries)
        epoch, hits = gen.search_many(vectors, k, flt)
        self.observe_query(time.perf_counter() - started, len(queries))
        return epoch, hits, vectors

    def search_many(
        self, vectors: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits]]:
        """The top ``k`` of each query vector in one pinned epoch of the serving index."""
        return self.serving.search_many(vectors, k, flt)

    def observe_query(self, seconds: float, queries: int, *, inline: bool = False) -> None:
        """Record one batch of ``queries`` answered in ``seconds`` (``inline``: on the loop)."""
        self.metrics.query_seconds.observe(seconds)
        self.metrics.query_batch.observe(queries)
        if inline:
            self.metrics.queries_inline.inc()

    def embedder_holds_lock(self) -> bool | None:
        """Whether the serving embedder computes holding the interpreter lock; None: not known.

        Its class says so (:func:`~streamrag.embed.ahead.holds_gil`), or, when it
        says nothing, the job measured it before embedding ahead
        (:attr:`~streamrag.embed.ahead.EmbedAhead.lock_free`).
        """
        said = holds_gil(self.serving.embedder)
        if said is not None:
            return said
        ahead = self.pipeline.embedding.ahead
        if ahead is None or ahead.embedder is not self.serving.embedder or ahead.lock_free is None:
            return None
        return ahead.lock_free < LOCK_FREE

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Texts as unit vectors from the serving generation's embedder, checked."""
        return self.serving.embed_many(texts)

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
