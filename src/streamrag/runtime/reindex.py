"""Model migration as a versioned operation: build, switch, roll back, drop.

``streamrag reindex --embedder NEW`` (``POST /v1/admin/reindex``) starts a
new index :mod:`generation <.generations>` for the new model, while the
serving one keeps answering and keeps receiving live changes:

1. **Start.** The book gains generation ``n`` in state ``building``. From the
   next commit on, a mirror copies every live change into it (re-embedded).
2. **Backfill** (:class:`Backfill`, a background thread at low priority). It
   reads the serving generation's current documents — chunk texts as they
   were chunked, with their versions — and commits them into generation ``n``
   in batches, re-embedded. A document the live stream has changed meanwhile
   is newer in generation ``n`` already; the backfill's older version then
   changes nothing there (versions order every write, whichever comes first).
   Progress and an ETA are in ``/v1/status``.
3. **Switch**, once the backfill is done (automatically unless asked not
   to). Between two commits, with the committer held: generation ``n``
   becomes ``serving`` in the book (one atomic file write), the pipeline
   commits into it and queries embed with its model; the old one becomes
   ``previous`` and is now the mirror's target. Each answer names the
   generation it read.
4. **Rollback** to the previous generation is the same switch backwards, and
   immediate: it has received every change. **Drop** deletes the previous
   (or a building) generation's files.

**Crashes.** Nothing of a migration lives only in memory: on restart the book
says which generations exist; a ``building`` one is mirrored again and its
backfill starts over, skipping every document it already holds at that
version — a SIGKILL costs the re-embedding of at most one batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrag.changes import Op
from streamrag.chunking import content_hash
from streamrag.embed.resilient import RetryPolicy
from streamrag.errors import StateError
from streamrag.index.base import DocOp, Hit
from streamrag.index.versions import is_newer
from streamrag.runtime.generations import Generation, copy_docs
from streamrag.timing import US_PER_S, Clock, format_timestamp

if TYPE_CHECKING:
    from streamrag.runtime.service import Service

__all__ = ["Backfill", "BackfillProgress", "Reindexer"]

log = logging.getLogger("streamrag.reindex")


@dataclass
class BackfillProgress:
    """How far a backfill is: documents and chunks done of the total, and its pace."""

    docs_total: int = 0
    docs_done: int = 0
    docs_skipped: int = 0
    """Documents the new generation held at that version already (mirrored, or before a crash)."""
    chunks_done: int = 0
    started_us: int = 0
    finished_us: int | None = None
    error: str | None = None
    passes: int = 0

    def to_json(self, now_us: int) -> dict[str, Any]:
        """Progress with its rate and ETA, for status."""
        took = max(1, (self.finished_us or now_us) - self.started_us) / US_PER_S
        rate = self.docs_done / took
        left = self.docs_total - self.docs_done - self.docs_skipped
        eta = None if self.finished_us is not None or rate <= 0 else round(left / rate, 1)
        return {
            "docs_total": self.docs_total,
            "docs_done": self.docs_done,
            "docs_skipped": self.docs_skipped,
            "chunks_done": self.chunks_done,
            "docs_per_s": round(rate, 1),
            "eta_s": 0.0 if self.finished_us is not None else eta,
            "done": self.finished_us is not None,
            "error": self.error,
        }


class Backfill:
    """Fills a building generation from the serving one's current documents."""

    def __init__(
        self,
        source: Callable[[], Generation],
        target: Generation,
        *,
        clock: Clock,
        retry: RetryPolicy,
        batch_chunks: int = 256,
        refused: dict[str, str],
        on_done: Callable[[], None] = lambda: None,
        stop: threading.Event | None = None,
    ) -> None:
        self.source, self.target, self.clock = source, target, clock
        self.retry, self.batch_chunks = retry, batch_chunks
        self.refused, self.on_done = refused, on_done
        self.stop = stop or threading.Event()
        self.progress = BackfillProgress()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run in a background thread."""
        self._thread = threading.Thread(target=self._main, name="streamrag-backfill", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _main(self) -> None:
        with contextlib.suppress(OSError):  # behind the pipeline and queries, like maintenance
            os.nice(10)
        try:
            self.run()
        except Exception as exc:  # shown in status; a restart or a new reindex retries
            self.progress.error = f"{type(exc).__name__}: {exc}"
            log.exception("the backfill of generation %d failed", self.target.number)
            return
        if not self.stop.is_set():
            self.on_done()

    def run(self) -> None:
        """Copy every current document the target lacks, in batches (see the module doc)."""
        p = self.progress
        p.started_us = self.clock.now_us()
        p.passes += 1
        src = self.source()
        docs = _current_docs(src)
        p.docs_total = len(docs)
        batch: list[list[Hit]] = []
        size = 0
        for hits in docs:
            if self.stop.is_set():
                return
            if not self._lacks(hits[0]):
                p.docs_skipped += 1
                continue
            batch.append(hits)
            size += len(hits)
            if size >= self.batch_chunks:
                self._commit(batch)
                batch, size = [], 0
        if batch:
            self._commit(batch)
        p.finished_us = self.clock.now_us()

    def _lacks(self, hit: Hit) -> bool:
        state = self.target.index.doc_state(hit.tenant, hit.doc_id)
        return state is None or is_newer((hit.event_time, hit.offset), state.version)

    def _commit(self, docs: list[list[Hit]]) -> None:
        ops: list[DocOp] = []
        texts: list[str] = []
        positions: list[int] = []
        ids: list[int] = []
        hashes: list[bytes] = []
        for hits in docs:
            h = hits[0]
            ops.append(
                DocOp(
                    *(h.tenant, h.doc_id, Op.UPSERT, h.event_time, h.offset, h.source),
                    *(h.domain, len(texts), len(hits), h.metadata),
                )
            )
            for c in hits:
                texts.append(c.text)
                positions.append(c.position)
                ids.append(c.chunk_id)
                hashes.append(content_hash(c.text))
        target = self.target
        # Embedded without the target's lock: live commits mirror into it meanwhile.
        copied = copy_docs(
            target, ops, texts, positions, ids, hashes, self.retry, self.refused, reuse_held=False
        )
        with target.lock:  # what the mirror committed meanwhile is not written again
            index = target.index
            copied = copied.only(lambda d: index.wants(d.tenant, d.doc_id, d.event_time, d.offset))
            index.commit(copied.batch(target.embedder.version))
        self.progress.docs_done += len(docs)
        self.progress.chunks_done += len(copied.texts)


def _current_docs(gen: Generation) -> list[list[Hit]]:
    """The serving generation's current documents, each as its chunks in order."""
    index = gen.index
    by_doc: dict[tuple[str, str], list[Hit]] = defaultdict(list)
    for hit, _ in index.export():
        by_doc[(hit.tenant, hit.doc_id)].append(hit)
    out = []
    for (tenant, doc_id), hits in by_doc.items():
        state = index.doc_state(tenant, doc_id)
        if state is None or state.deleted:
            continue
        current = [h for h in hits if (h.event_time, h.offset) == state.version]
        if current:
            current.sort(key=lambda h: h.position)
            out.append(current)
    return out


class Reindexer:
    """A job's generations in motion: start a migration, switch, roll back, drop."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.backfill: Backfill | None = None
        self.building: Generation | None = None
        self.auto_switch = True
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- commands ------------------------------------------------------------------

    def start(self, embedder: dict[str, Any], *, switch: bool = True) -> dict[str, Any]:
        """Begin building a generation for ``embedder`` (``{"class": ..., "args": ...}``)."""
        svc = self.service
        with self._lock:
            if self.building is not None:
                msg = (
                    f"generation {self.building.number} is being built already; wait for it, "
                    "or drop it (streamrag reindex --drop N) before starting another"
                )
                raise StateError(msg)
            book = svc.book_for_write()
            for old in [e for e in book.entries if e.state == "previous"]:
                svc.detach(old.number)
                book.drop(old.number, svc.settings.state_dir)
            number = book.next_number()
            gen = svc.open_generation(number, embedder, state="building", switch=switch)
            self.auto_switch = switch
            self._begin_backfill(gen)
            return self.status()

    def resume(self, gen: Generation, *, switch: bool = True) -> None:
        """After a restart: build a generation the book says is still building."""
        with self._lock:
            self.auto_switch = switch
            self._begin_backfill(gen)

    def _begin_backfill(self, gen: Generation) -> None:
        svc = self.service
        self.building = gen
        mirror = svc.mirror_of(gen.number)
        refused = mirror.refused if mirror is not None else {}
        self.backfill = Backfill(
            lambda: svc.serving,
            gen,
            clock=svc.clock,
            retry=svc.pipeline.embedding.retry,
            refused=refused,
            on_done=self._done,
            stop=self._stop,
        )
        self.backfill.start()

    def _done(self) -> None:
        if self.auto_switch and self.building is not None:
            try:
                self.switch(self.building.number)
            except StateError:
                log.exception("the switch to the new generation failed")

    def switch(self, number: int | None = None) -> dict[str, Any]:
        """Serve generation ``number`` (the one built, by default) from the next epoch on."""
        svc = self.service
        if number is None:
            if self.building is None:
                msg = "no generation is being built; start one with streamrag reindex --embedder"
                raise StateError(msg)
            number = self.building.number
        if self.building is not None and number == self.building.number:
            fill = self.backfill
            if fill is None or fill.progress.finished_us is None:
                msg = (
                    f"generation {number} is still being filled "
                    f"({0 if fill is None else fill.progress.docs_done} documents so far); "
                    "switch when status says reindex.backfill.done"
                )
                raise StateError(msg)
        svc.switch_to(number)
        if self.building is not None and self.building.number == number:
            self.building = None
            self.backfill = None
        return self.status()

    def rollback(self) -> dict[str, Any]:
        """Serve the previous generation again (it has every change)."""
        book = self.service.book_for_write()
        previous = [e for e in book.entries if e.state == "previous"]
        if not previous:
            msg = "there is no previous generation to roll back to (it was dropped, or none)"
            raise StateError(msg)
        self.service.switch_to(previous[-1].number)
        return self.status()

    def drop(self, number: int) -> dict[str, Any]:
        """Delete a previous or building generation."""
        svc = self.service
        with self._lock:
            book = svc.book_for_write()
            if book.get(number).state == "serving":
                msg = (
                    f"generation {number} is serving queries; switch to another before dropping it"
                )
                raise StateError(msg)
            if self.building is not None and self.building.number == number:
                self._stop.set()
                if self.backfill is not None:
                    self.backfill.join(30)
                self._stop = threading.Event()
                self.building = None
                self.backfill = None
            svc.detach(number)
            book.drop(number, svc.settings.state_dir)
        return self.status()

    def close(self) -> None:
        """Stop a running backfill (a restart resumes it)."""
        self._stop.set()
        if self.backfill is not None:
            self.backfill.join(10)

    # -- where things stand --------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The generations, the one serving, and a migration's progress."""
        svc = self.service
        now = svc.clock.now_us()
        book = svc.book
        gens = []
        entries = book.entries if book is not None else []
        for e in entries:
            live = svc.generation(e.number)
            gens.append(
                {
                    "number": e.number,
                    "state": e.state,
                    "embedder": e.version,
                    "created": format_timestamp(e.created_us),
                    "epoch": None if live is None else live.index.epoch,
                    "live_docs": None if live is None else live.index.stats().live_docs,
                }
            )
        out: dict[str, Any] = {
            "serving": svc.serving.number,
            "generations": gens,
            "switches": [] if book is None else book.switches[-5:],
        }
        if self.building is not None:
            fill = self.backfill
            mirror = svc.mirror_of(self.building.number)
            out["building"] = {
                "generation": self.building.number,
                "embedder": self.building.embedder.version,
                "backfill": None if fill is None else fill.progress.to_json(now),
                "mirrored_commits": 0 if mirror is None else mirror.commits,
                "refused": dict(list((mirror.refused if mirror else {}).items())[:20]),
                "switch_when_done": self.auto_switch,
            }
        return out
