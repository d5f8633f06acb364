"""The versioned, time-aware vector index: an LSM of segments with MVCC epochs.

Layout. Rows (one per chunk version) are appended to one small *growing*
segment, searched exactly; at ``seal_rows`` rows it is sealed and the
maintenance thread builds an ANN structure for it (:mod:`.ann`) and later merges
it with its neighbours in event time (:mod:`.compaction`). Segments are sized by
rows, not by time, so a decade of history costs what its rows cost; queries skip
segments from their bounds. Nothing slow happens on the commit path.

Versions. A commit applies one micro-batch and publishes an immutable
:class:`~.manifest.Manifest` by swapping one reference. Every change becomes a
version of its document (:mod:`.versions`): a change newer than the current
version replaces it (last writer wins on ``(event_time, offset)``), an older one
— late, or beaten within its micro-batch — is inserted into the past, and the
version before it gets an end in valid time (its rows are *stamped*, see
:mod:`.segment`). A query pins the manifest it starts with, so it reads exactly
one epoch; it may also read an earlier ``epoch`` or the documents ``as_of`` an
event time, within the retained history. With ``history=False`` older changes
are dropped as stale instead (today's state and epoch reads only).
``rollback(epoch)`` makes an earlier epoch's documents current again as a new
epoch.

Persistence (when opened on a directory). Each commit is appended to the
write-ahead log (:mod:`.wal`) and fsynced before it is published. A checkpoint
writes the segments, the stamps and the deletes (:mod:`.store`) and then a
manifest file, and drops the log it covers; checkpoints run on the
maintenance thread after seals and compactions and every ``checkpoint_every``
commits. Opening the directory loads the newest manifest and replays the log
after it, so a crash at any point loses nothing that was committed.

Threads. One writer commits; any number of readers search without locks; one
maintenance thread (``background=True``) builds ANN structures, compacts and
checkpoints, taking the writer lock only to publish its result.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.changes import Op
from streamrag.errors import CorruptStateError, IndexStoreError, QueryError
from streamrag.index.ann import (
    Ann,
    AnnSpec,
    BuildCancelled,
    build_ann,
    choose_ann,
    load_hnsw,
    recall_on,
)
from streamrag.index.base import (
    CommitBatch,
    CommitResult,
    DocState,
    Hit,
    IndexStats,
    SearchFilter,
    check_queries,
    merge_cursor,
)
from streamrag.index.compaction import CompactionSpec, droppable, plan
from streamrag.index.manifest import Manifest
from streamrag.index.pending import PendingRows
from streamrag.index.search import SearchTuning, View, search_segments
from streamrag.index.segment import NEVER, Rows, Segment
from streamrag.index.store import (
    file_checksum,
    load_arrow,
    read_cursor,
    read_manifest,
    read_rows,
    read_table,
    verify_file,
    write_atomic,
    write_cursor,
    write_manifest,
    write_rows,
    write_table,
)
from streamrag.index.versions import Key, Versions
from streamrag.index.wal import WriteAheadLog
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, SystemClock, Timestamp

__all__ = ["IndexHealth", "LsmIndex", "LsmSpec"]

log = logging.getLogger("streamrag.index")

I64 = npt.NDArray[np.int64]


_MAINTENANCE_NICE = 10
_PROBE_SAMPLING = 8
"""One query in this many is kept as a probe for the recall re-check."""
"""How much lower the maintenance thread's CPU priority is than the process's."""


@dataclass(frozen=True, slots=True)
class LsmSpec:
    """Every knob of the LSM index (built from ``IndexSettings`` by the service)."""

    seal_rows: int = 8192
    ann: AnnSpec = field(default_factory=AnnSpec)
    compaction: CompactionSpec = field(default_factory=CompactionSpec)
    retention_us: int = 7 * 86_400 * US_PER_S
    checkpoint_every: int = 256
    wal_fsync: bool = True
    tuning: SearchTuning = field(default_factory=SearchTuning)
    history: bool = True
    """Keep every change as a version (as_of reads); False keeps only the newest."""

    def __post_init__(self) -> None:
        if self.seal_rows <= 0 or self.retention_us < 0:
            msg = (
                f"seal_rows must be positive and retention_us not negative; "
                f"found {self.seal_rows}, {self.retention_us}"
            )
            raise IndexStoreError(msg)


@dataclass(frozen=True, slots=True)
class IndexHealth:
    """What maintenance has to do and has done: the index's gauges."""

    epoch: int
    segments: int
    growing_segments: int
    ann_segments: int
    ann_pending: int
    ann_recall_min: float  # lowest recall@10 on recent queries over ANN segments (1.0: none)
    exact_by_measurement: int  # sealed segments whose structure missed the recall target
    rows: int
    live_chunks: int
    tombstoned_rows: int
    tombstone_ratio: float
    bytes: int
    compactions: int
    last_compaction_us: Timestamp | None
    checkpoint_epoch: int | None
    history_floor_us: Timestamp
    epoch_floor: int
    wal_torn_tails: int = 0
    """Torn last log records cut off on open (a crash in the middle of a commit)."""


class LsmIndex:
    """Segments, epochs, as-of reads and persistence behind the ``VectorIndex`` contract.

    ``path`` makes it persistent (opened, or created if empty); ``background``
    starts the maintenance thread. Without it, call :meth:`maintain` to build
    ANN structures, compact and checkpoint (tests do, deterministically).
    """

    def __init__(
        self,
        dim: int,
        spec: LsmSpec | None = None,
        *,
        path: str | Path | None = None,
        clock: Clock | None = None,
        background: bool = False,
    ) -> None:
        if dim <= 0:
            msg = f"dim must be positive, found {dim}"
            raise IndexStoreError(msg)
        self._dim = dim
        self._spec = spec or LsmSpec()
        self._clock = clock or SystemClock()
        self._path = Path(path) if path is not None else None
        self._lock = threading.RLock()  # the writer lock: commits and publishes
        self._maint = threading.RLock()  # one maintenance task at a time
        self._versions = Versions()  # every document's current and older versions (writer)
        self._deletes: list[tuple[str, str, int, int, int]] = []  # tenant, doc, time, offset, epoch
        self._segments: dict[int, Segment] = {}
        self._growing: Segment | None = None
        self._rid_seg = np.full(1024, -1, dtype=np.int64)
        self._rid_row = np.full(1024, -1, dtype=np.int64)
        self._next_rid = 0
        self._next_seg = 0
        self._live_chunks = 0
        self._live_docs = 0
        self._deleted_docs = 0
        self._high = MIN_TIMESTAMP  # the newest event time committed
        self._epoch_high = np.full(1024, MIN_TIMESTAMP, dtype=np.int64)
        self._compacted_floor = 0
        self._rolled_back: tuple[tuple[int, int], ...] = ()
        self._generation = 0  # bumped by rollbacks: compactions begun before are void
        self._compactions = 0
        self._last_compaction_us: Timestamp | None = None
        self._checkpoint_epoch: int | None = None
        self._cursor: dict[str, Any] | None = None  # the stream position of the latest epoch
        self._sums: dict[str, dict[str, int]] = {}  # size and CRC-32 of each file written
        self._dirty = 0  # commits since the last checkpoint
        self._needs_checkpoint = False
        self._failed_ann: set[int] = set()
        self._view_cache: dict[int, View] = {}
        # A sample of recent query vectors, to re-check ANN recall on real traffic.
        self._probes: deque[npt.NDArray[np.float32]] = deque(maxlen=self._spec.ann.probe_queries)
        self._queries_seen = 0
        self._queries_at_check = 0
        self.ann_recall_min = 1.0
        self._wal: WriteAheadLog | None = None
        self._wake = threading.Condition()
        self._closed = False
        self.last_maintenance_error: str | None = None
        self.rebuilt: dict[str, str] | None = None
        """Set when a damaged index was moved aside and this one rebuilds it from the sources."""
        self._manifest = self._make_manifest(0, None, self._clock.now_us())
        if self._path is not None:
            # Load pyarrow now: importing it inside the first checkpoint would stall
            # commits and queries for tens of milliseconds.
            load_arrow()
            self._open(self._path)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._maintenance_loop, name="streamrag-index-maintenance", daemon=True
            )
            self._thread.start()
            # A process that exits without close() must not kill the thread inside a
            # graph build: native code aborts the process then. Let it finish first.
            atexit.register(_halt_at_exit, weakref.ref(self))

    def _halt(self) -> None:
        """Stop the maintenance thread after its current step (no checkpoint)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- the VectorIndex contract ----------------------------------------------

    @property
    def dim(self) -> int:
        """Vector length."""
        return self._dim

    @property
    def epoch(self) -> int:
        """The latest committed epoch."""
        return self._manifest.epoch

    @property
    def cursor(self) -> dict[str, Any] | None:
        """The stream position committed with the latest epoch (None before any)."""
        return self._cursor

    @property
    def spec(self) -> LsmSpec:
        """The index's configuration."""
        return self._spec

    def pin(self) -> Manifest:
        """The latest manifest; pass it to :meth:`search_many` to read one epoch repeatedly."""
        return self._manifest

    def stats(self) -> IndexStats:
        """Sizes of the latest epoch."""
        return self._manifest.stats

    def doc_state(self, tenant: str, doc_id: str) -> DocState | None:
        """The current version of a document (writer side)."""
        return self._versions.current((tenant, doc_id))

    def doc_history(self, tenant: str, doc_id: str) -> list[DocState]:
        """Every version of a document still in the retained history, oldest first."""
        key = (tenant, doc_id)
        current = self._versions.current(key)
        return [*self._versions.past(key), *([current] if current is not None else [])]

    def wants(self, tenant: str, doc_id: str, event_time: Timestamp, offset: int) -> bool:
        """Whether a change with this version would change any answer (before embedding it).

        False for a version the index holds already (a change read twice), and
        for one that no readable version could show: older than the current one
        without history, or — with history — ending before the history floor.
        """
        key = (tenant, doc_id)
        version = (event_time, offset)
        if not self._spec.history:
            current = self._versions.current(key)
            return current is None or version > current.version
        _, after, held = self._versions.neighbours(key, version)
        return not held and not (after is not None and after.version[0] <= self._floor())

    def vectors_at(self, rows: Sequence[int]) -> npt.NDArray[np.float32]:
        """Copies of the vectors of current chunks, by the row ids :meth:`doc_state` gives."""
        rids = np.asarray(rows, dtype=np.int64)
        out = np.empty((rids.size, self._dim), dtype=np.float32)
        with self._lock:
            segs = self._rid_seg[rids]
            local = self._rid_row[rids]
            if rids.size and (segs < 0).any():
                msg = "vectors_at was given row ids the index no longer holds; use doc_state's rows"
                raise IndexStoreError(msg)
            for sid in np.unique(segs).tolist():
                sel = segs == sid
                out[sel] = self._segments[sid].vectors[local[sel]]
        return out

    def search_many(
        self,
        queries: npt.NDArray[np.float32],
        k: int,
        flt: SearchFilter,
        manifest: Manifest | None = None,
    ) -> tuple[int, list[list[Hit]]]:
        """Top-``k`` chunks per query from one pinned manifest; returns (epoch read, hits)."""
        man = manifest or self._manifest
        q = check_queries(queries, self._dim, k)
        spec = man.read_spec(flt)
        hits = search_segments(man.views, q, k, spec, man.epoch, self._spec.tuning)
        self._queries_seen += q.shape[0]  # approximate under threads: it only paces checks
        if self._queries_seen % _PROBE_SAMPLING < q.shape[0]:
            self._probes.append(q[0].copy())
            if self._queries_seen - self._queries_at_check >= self._spec.ann.probe_every:
                self._notify()
        return spec.epoch, hits

    def export(self) -> list[tuple[Hit, npt.NDArray[np.float32]]]:
        """Every chunk current at the latest epoch, with a copy of its vector (score 0)."""
        man = self._manifest
        out: list[tuple[Hit, npt.NDArray[np.float32]]] = []
        for view in man.views:
            seg, n = view.segment, view.rows
            if n == 0:
                continue
            live = (seg.created[:n] <= man.epoch) & (seg.sup[:n] > man.epoch)
            for r in np.flatnonzero(live).tolist():
                hit = Hit(
                    0.0,
                    int(seg.chunk_ids[r]),
                    seg.tenants[r],
                    seg.doc_ids[r],
                    seg.domains[r],
                    int(seg.positions[r]),
                    seg.texts[r],
                    int(seg.valid_from[r]),
                    seg.sources[r],
                    int(seg.offsets[r]),
                    int(seg.committed[r]),
                    seg.embedders[r],
                    seg.metadata[r],
                )
                out.append((hit, seg.vectors[r].copy()))
        return out

    def commit(self, batch: CommitBatch) -> CommitResult:
        """Log the micro-batch, apply it and publish the next epoch."""
        if batch.vectors.shape != (len(batch.texts), self._dim):
            msg = (
                f"commit carries vectors of shape {batch.vectors.shape} for "
                f"{len(batch.texts)} chunks; expected ({len(batch.texts)}, {self._dim})"
            )
            raise IndexStoreError(msg)
        with self._lock:
            if self._closed:
                msg = "the index is closed; open it again to commit"
                raise IndexStoreError(msg)
            epoch = self._manifest.epoch + 1
            now = self._clock.now_us()
            if self._wal is not None:
                self._wal.append(epoch, now, batch)
            result = self._apply(batch, epoch, now)
            self._cursor = merge_cursor(self._cursor, batch.cursor)
            self._dirty += 1
            due = self._dirty >= self._spec.checkpoint_every and self._path is not None
        if due or self._wants_ann():
            self._notify()
        return result

    # -- applying a commit (the writer) ----------------------------------------

    def _apply(self, batch: CommitBatch, epoch: int, now: Timestamp) -> CommitResult:
        """Place every change of the batch in its document's history; publish ``epoch``.

        Changes are taken per document in version order, so each one meets the
        versions around it as they will be once the batch is in; the outcome
        does not depend on the order of the batch or on how the stream was cut
        into batches.
        """
        docs = batch.docs
        versions = self._versions
        history = self._spec.history
        floor = self._floor()
        order = sorted(
            range(len(docs)),
            key=lambda i: (docs[i].tenant, docs[i].doc_id, docs[i].event_time, docs[i].offset),
        )
        if not history:
            # Only the newest change per document: the last of its run in version order.
            order = [
                i
                for j, i in enumerate(order)
                if j + 1 == len(order)
                or (docs[order[j + 1]].tenant, docs[order[j + 1]].doc_id)
                != (docs[i].tenant, docs[i].doc_id)
            ]
        stale = len(docs) - len(order)
        filed = 0  # changes kept as versions
        current: set[Key] = set()  # documents whose current version this commit changed
        pending = PendingRows(batch, epoch, self._next_rid)
        hashes = batch.hashes
        delete = Op.DELETE
        high = self._high
        for i in order:
            d = docs[i]
            key = (d.tenant, d.doc_id)
            version = (d.event_time, d.offset)
            before: DocState | None
            after: DocState | None
            if history:
                before, after, held = versions.neighbours(key, version)
            else:
                before, after = versions.current(key), None
                held = before is not None and before.version >= version
            if held or (after is not None and after.version[0] <= floor):
                stale += 1  # held already, or no readable version could show it
                continue
            if before is not None and before.rows:
                self._end(before, d.event_time, pending)
            n = d.n_chunks
            end = NEVER if after is None else after.version[0]
            if d.op == delete or n == 0:
                state = DocState(version, deleted=True)
                self._deletes.append((d.tenant, d.doc_id, d.event_time, d.offset, epoch))
            else:
                first = d.first_chunk
                state = DocState(
                    version, False, pending.add_version(d, end), hashes[first : first + n]
                )
            filed += 1
            if after is None:
                current.add(key)
                high = max(high, d.event_time)
                if before is not None:  # the version that was current until now
                    if before.deleted:
                        self._deleted_docs -= 1
                    else:
                        self._live_docs -= 1
                        self._live_chunks -= len(before.rows)
                if state.deleted:
                    self._deleted_docs += 1
                else:
                    self._live_docs += 1
                    self._live_chunks += n
            versions.add(key, state)
            if history and floor != MIN_TIMESTAMP:
                versions.forget_before(key, floor)
        added = len(pending)
        rows = pending.rows()
        self._next_rid = pending.next_rid
        self._reserve_rids(self._next_rid)
        if rows is not None:
            self._place(rows)
        self._high = high
        self._publish(epoch, epoch - 1, now)
        # One change per document ends up current; the others are its past, including
        # those that were current for a moment of this same commit.
        return CommitResult(epoch, len(current), stale, added, filed - len(current))

    def _end(self, state: DocState, valid_to: Timestamp, pending: PendingRows) -> None:
        """Give a version an end in valid time from this commit on (its interval is split).

        Rows without an end yet, or given one by this same commit, are stamped
        in place; rows that had an earlier end are killed and copied with the
        new one (see :mod:`.segment`).
        """
        rids = state.rows
        if pending.holds(rids[0]):
            pending.end(rids[0], valid_to)
            return
        arr = np.asarray(rids, dtype=np.int64)
        segs = self._rid_seg[arr]
        if (segs < 0).any():
            return  # compacted away: its interval ended before the retained history
        local = self._rid_row[arr]
        epoch = pending.epoch
        sup = int(self._segments[int(segs[0])].sup[local[0]])
        if sup in (NEVER, epoch):
            for sid in np.unique(segs).tolist():
                sel = segs == sid
                self._segments[sid].stamp(local[sel], epoch, valid_to)
            return
        parts: list[Rows] = []
        where: list[npt.NDArray[np.int64]] = []
        for sid in np.unique(segs).tolist():
            sel = np.flatnonzero(segs == sid)
            seg = self._segments[sid]
            parts.append(seg.take(local[sel]))
            where.append(sel)
            seg.kill(local[sel], epoch)
        copies = Rows.concat(parts)
        if len(parts) > 1:  # back into the version's row order
            copies = copies.select(np.argsort(np.concatenate(where)))
        state.rows = pending.add_copies(copies, valid_to)

    def _floor(self) -> Timestamp:
        """The history floor: ``as_of`` before it is outside the retained history."""
        if self._high == MIN_TIMESTAMP:
            return MIN_TIMESTAMP
        return max(MIN_TIMESTAMP, self._high - self._spec.retention_us)

    def _place(self, rows: Rows) -> None:
        """Append rows to the growing segment, sealing it (and starting another) when full."""
        done = 0
        total = len(rows)
        while done < total:
            seg = self._growing
            if seg is None:
                seg = Segment(self._new_seg_id(), self._dim, self._spec.seal_rows)
                self._growing = seg
                self._segments[seg.id] = seg
            take = min(seg.room, total - done)
            part = rows if take == total else rows.select(np.arange(done, done + take))
            lo = seg.n
            seg.append(part)
            self._rid_seg[part.rids] = seg.id
            self._rid_row[part.rids] = np.arange(lo, lo + take)
            done += take
            if seg.room == 0:
                self._seal(seg)

    def _seal(self, seg: Segment) -> None:
        seg.seal()
        if self._growing is seg:
            self._growing = None
        self._needs_checkpoint = True

    def _new_seg_id(self) -> int:
        self._next_seg += 1
        return self._next_seg

    def _reserve_rids(self, n: int) -> None:
        cap = self._rid_seg.shape[0]
        if n <= cap:
            return
        new_cap = max(n, cap * 2)
        for name in ("_rid_seg", "_rid_row"):
            old = getattr(self, name)
            grown = np.full(new_cap, -1, dtype=np.int64)
            grown[:cap] = old
            setattr(self, name, grown)

    def _publish(
        self, epoch: int, parent: int | None, now: Timestamp, restored_from: int | None = None
    ) -> None:
        if epoch >= self._epoch_high.shape[0]:
            grown = np.full(max(epoch + 1, self._epoch_high.shape[0] * 2), MIN_TIMESTAMP, np.int64)
            grown[: self._epoch_high.shape[0]] = self._epoch_high
            self._epoch_high = grown
        self._epoch_high[epoch] = self._high
        self._manifest = self._make_manifest(epoch, parent, now, restored_from)

    def _make_manifest(
        self, epoch: int, parent: int | None, now: Timestamp, restored_from: int | None = None
    ) -> Manifest:
        views = self._views()
        floor = self._floor()
        window = int(np.searchsorted(self._epoch_high[: epoch + 1], floor, side="left"))
        stats = IndexStats(
            epoch=epoch,
            live_chunks=self._live_chunks,
            live_docs=self._live_docs,
            deleted_docs=self._deleted_docs,
            rows=sum(v.rows for v in views),
            committed_at_us=now,
        )
        return Manifest(
            epoch=epoch,
            parent=parent,
            views=views,
            stats=stats,
            history_floor_us=floor,
            epoch_floor=min(epoch, max(self._compacted_floor, window)),
            rolled_back=self._rolled_back,
            restored_from=restored_from,
            history=self._spec.history,
        )

    def _views(self) -> tuple[View, ...]:
        """A view of every segment at its current length, reusing unchanged ones.

        An index over many days holds thousands of segments and a commit touches
        a few: building a fresh view of each would make every commit cost
        O(segments).
        """
        cache = self._view_cache
        views = []
        for sid, seg in self._segments.items():
            v = cache.get(sid)
            if v is None or v.segment is not seg or v.rows != seg.n:
                v = cache[sid] = View(seg, seg.n)
            views.append(v)
        if len(cache) > 2 * len(self._segments) + 64:  # forget merged-away segments
            self._view_cache = {sid: cache[sid] for sid in self._segments if sid in cache}
        return tuple(views)

    def _republish(self) -> None:
        """Publish the same epoch with the current segments (after maintenance)."""
        man = self._manifest
        views = self._views()
        self._manifest = replace(
            man, views=views, stats=replace(man.stats, rows=sum(v.rows for v in views))
        )

    # -- maintenance -------------------------------------------------------------

    def seal_all(self) -> None:
        """Seal every growing segment now (before a bulk compaction, or a rollback)."""
        with self._lock:
            if self._growing is not None:
                self._seal(self._growing)
            self._republish()

    def maintain(self) -> bool:
        """Build missing ANN structures, compact, checkpoint when due; True if it did work."""
        did = False
        with self._maint:
            while self._build_one_ann():
                did = True
            did |= self.check_recall()
            did |= self.compact()
            if self._path is not None and (
                self._needs_checkpoint or self._dirty >= self._spec.checkpoint_every
            ):
                self.checkpoint()
                did = True
        return did

    def check_recall(self, *, force: bool = False) -> bool:
        """Re-check every ANN structure's recall@10 on recent real queries.

        A structure below ``target_recall`` is widened until it reaches it, or
        dropped (the segment is then scanned exactly). Runs every
        ``probe_every`` queries; True if a structure was changed.
        """
        spec = self._spec.ann
        due = self._queries_seen - self._queries_at_check >= spec.probe_every
        if not self._probes or not (due or force):
            return False
        self._queries_at_check = self._queries_seen
        queries = np.stack(list(self._probes))
        changed = False
        lowest = 1.0
        for seg in list(self._segments.values()):
            ann = seg.ann
            if ann is None or not seg.sealed:
                continue
            vectors = seg.vectors[: ann.rows]
            recall = recall_on(ann, vectors, queries)
            while recall < spec.target_recall and ann.widen(spec):
                changed = True
                recall = recall_on(ann, vectors, queries)
            if recall < spec.target_recall:
                log.warning(
                    "%r: its %s structure finds %.0f%% of the true top 10 on recent queries "
                    "at its widest; searching it exactly from now on",
                    seg,
                    ann.kind,
                    100 * recall,
                )
                with self._lock:
                    seg.ann = None
                    seg.ann_file = None
                    self._failed_ann.add(seg.id)
                    self._needs_checkpoint = True
                changed = True
                continue
            lowest = min(lowest, recall)
        self.ann_recall_min = lowest
        return changed

    def _ann_candidates(self) -> list[Segment]:
        spec = self._spec.ann
        return [
            s
            for s in self._segments.values()
            if s.sealed
            and s.ann is None
            and s.id not in self._failed_ann
            and choose_ann(s.n, spec) is not None
        ]

    def _wants_ann(self) -> bool:
        return bool(self._ann_candidates())

    def _build_one_ann(self) -> bool:
        with self._lock:
            todo = self._ann_candidates()
        if not todo:
            return False
        seg = todo[0]
        kind = choose_ann(seg.n, self._spec.ann)
        assert kind is not None
        try:
            ann = build_ann(kind, seg.vectors[: seg.n], self._spec.ann, self._closing)
        except BuildCancelled:
            return False  # the index is closing; the next open builds it
        except Exception as exc:
            self._failed_ann.add(seg.id)  # searched exactly from now on
            log.exception("building the %s structure of %r failed", kind, seg)
            self.last_maintenance_error = f"{type(exc).__name__}: {exc}"
            return True
        if ann is None:
            # Not accurate enough on this data at any width: scan it exactly.
            self._failed_ann.add(seg.id)
            log.info("%r is searched exactly: its %s structure missed the recall target", seg, kind)
            return True
        self._attach_ann(seg, ann)
        return True

    def _attach_ann(self, seg: Segment, ann: Ann) -> None:
        with self._lock:
            seg.ann = ann
            current = self._segments.get(seg.id)
            if current is not None and current.vectors is seg.vectors:
                current.ann = ann
            self._needs_checkpoint = True

    def compact(self, *, force: bool = False) -> bool:
        """Merge segments the policy picks: neighbours in event time (all with ``force``)."""
        did = False
        with self._maint:
            with self._lock:
                man = self._manifest
                groups = plan(
                    list(self._segments.values()),
                    self._spec.compaction,
                    man.history_floor_us,
                    man.epoch_floor,
                    force=force,
                )
                generation = self._generation
            for group in groups:
                did |= self._merge(group, man.history_floor_us, man.epoch_floor, generation)
        return did

    def _merge(
        self, group: list[Segment], hist_floor: int, epoch_floor: int, generation: int
    ) -> bool:
        keeps = [np.flatnonzero(~droppable(s, s.n, hist_floor, epoch_floor)) for s in group]
        rows = Rows.concat([s.take(k) for s, k in zip(group, keeps, strict=True)])
        # In event-time order: a time range or an as_of read then selects a run of
        # neighbouring rows, which a scan reads as one slice instead of gathering.
        order = np.argsort(rows.valid_from, kind="stable")
        rows = rows.select(order)
        with self._lock:
            seg_id = self._new_seg_id()
        merged = Segment.from_rows(seg_id, rows, sealed=True)
        kind = choose_ann(merged.n, self._spec.ann)
        if kind is not None:
            try:
                merged.ann = build_ann(
                    kind, merged.vectors[: merged.n], self._spec.ann, self._closing
                )
            except BuildCancelled:
                return False  # closing: the segments stay as they were
        if self._path is not None and merged.n:
            self._write_segment(merged)
        with self._lock:
            if generation != self._generation or any(
                self._segments.get(s.id) is not s for s in group
            ):
                return False  # a rollback replaced these segments meanwhile
            # Stamps written while we merged: copy them over, under the writer lock.
            n = merged.n
            for name in ("sup", "valid_to", "dead"):
                now = np.concatenate(
                    [getattr(s, name)[k] for s, k in zip(group, keeps, strict=True)]
                )
                getattr(merged, name)[:n] = now[order]
            merged.refresh_bounds()
            for s in group:
                dropped = np.setdiff1d(s.rids[: s.n], merged.rids[: merged.n], assume_unique=True)
                self._rid_seg[dropped] = -1
                del self._segments[s.id]
            if merged.n:
                self._segments[merged.id] = merged
                self._rid_seg[merged.rids[: merged.n]] = merged.id
                self._rid_row[merged.rids[: merged.n]] = np.arange(merged.n)
            self._compacted_floor = max(self._compacted_floor, epoch_floor)
            self._compactions += 1
            self._last_compaction_us = self._clock.now_us()
            self._needs_checkpoint = True
            self._republish()
        return True

    def rollback(self, epoch: int) -> int:
        """Make epoch ``epoch``'s documents current again, as a new epoch; returns it.

        The epochs after ``epoch`` become unreadable; history before it stays.
        Changes the input held after ``epoch`` are applied again if replayed.
        """
        with self._maint, self._lock:
            man = self._manifest
            try:
                man.read_spec(SearchFilter(epoch=epoch))
            except QueryError as exc:
                msg = f"cannot roll back to epoch {epoch}: {exc}"
                raise IndexStoreError(msg) from None
            latest = man.epoch
            if epoch == latest:
                return latest
            if self._growing is not None:
                self._seal(self._growing)
            for sid, seg in list(self._segments.items()):
                n = seg.n
                created = seg.created[:n]
                sup, dead = seg.sup[:n], seg.dead[:n]
                # Rows written after ``epoch`` are undone: never seen by any read
                # (``dead == created`` marks them for compaction). Ends and kills
                # after ``epoch`` are taken back.
                undo = created > epoch
                unstamp = ~undo & (sup > epoch) & (sup != NEVER)
                revive = ~undo & (dead > epoch) & (dead != NEVER)
                if not (undo.any() or unstamp.any() or revive.any()):
                    continue
                clone = seg.with_new_stamps()
                clone.sup[:n][undo] = created[undo]
                clone.valid_to[:n][undo] = seg.valid_from[:n][undo]
                clone.dead[:n][undo] = created[undo]
                clone.sup[:n][unstamp] = NEVER
                clone.valid_to[:n][unstamp] = NEVER
                clone.dead[:n][revive] = NEVER
                clone.refresh_bounds()
                self._segments[sid] = clone
            self._deletes = [d for d in self._deletes if d[4] <= epoch]
            self._rebuild_docs()
            self._rolled_back = (*self._rolled_back, (epoch + 1, latest))
            self._generation += 1
            self._publish(latest + 1, latest, self._clock.now_us(), restored_from=epoch)
            self._needs_checkpoint = True
            if self._path is not None:
                self.checkpoint()
            return latest + 1

    def _rebuild_docs(self) -> None:
        """Every document's versions and the counts, from the rows and the delete log.

        Column-wise: the rows every read at the latest epoch may see are
        gathered, ordered by document, version and position with one sort, and
        cut into versions; the deletes are merged in. Each document's newest
        version is its current one.
        """
        keys: list[Key] = []
        cols: list[tuple[npt.NDArray[Any], ...]] = []
        hashes: list[bytes] = []
        for seg in self._segments.values():
            n = seg.n
            rows = np.flatnonzero(seg.dead[:n] == NEVER) if seg.killed else np.arange(n)
            if not rows.size:
                continue
            tenants, doc_ids, seg_hashes = seg.tenants, seg.doc_ids, seg.hashes
            rl = rows.tolist()
            keys.extend([(tenants[i], doc_ids[i]) for i in rl])
            hashes.extend([seg_hashes[i] for i in rl])
            cols.append(
                (seg.positions[rows], seg.rids[rows], seg.valid_from[rows], seg.offsets[rows])
            )
        found: dict[Key, list[DocState]] = {}
        total = len(keys)
        if total:
            codes_of: dict[Key, int] = {}
            codes = np.fromiter(
                (codes_of.setdefault(k, len(codes_of)) for k in keys), np.int64, total
            )
            positions, rids, valid_from, offsets = (
                np.concatenate([c[f] for c in cols]) for f in range(4)
            )
            order = np.lexsort((positions, offsets, valid_from, codes))
            c, t, o = codes[order], valid_from[order], offsets[order]
            cut = np.r_[True, (c[1:] != c[:-1]) | (t[1:] != t[:-1]) | (o[1:] != o[:-1])]
            starts = np.flatnonzero(cut)
            ends = np.r_[starts[1:], total].tolist()
            firsts = order[starts]
            first_t = valid_from[firsts].tolist()
            first_o = offsets[firsts].tolist()
            rid_list = rids[order].tolist()
            hash_list = [hashes[i] for i in order.tolist()]
            for g, (lo, hi) in enumerate(zip(starts.tolist(), ends, strict=True)):
                key = keys[int(firsts[g])]
                state = DocState((first_t[g], first_o[g]), False, rid_list[lo:hi], hash_list[lo:hi])
                found.setdefault(key, []).append(state)
        for tenant, doc_id, t_del, off, _ in self._deletes:
            found.setdefault((tenant, doc_id), []).append(DocState((t_del, off), deleted=True))
        versions = Versions()
        floor = self._floor()
        live = chunks = 0
        for key, states in found.items():
            states.sort(key=lambda st: st.version)
            current = states[-1]
            versions.set_current(key, current)
            versions.set_past(key, states[:-1])
            if floor != MIN_TIMESTAMP:
                versions.forget_before(key, floor)
            if not current.deleted:
                live += 1
                chunks += len(current.rows)
        self._versions = versions
        self._live_docs = live
        self._deleted_docs = len(versions) - live
        self._live_chunks = chunks

    # -- persistence -------------------------------------------------------------

    def _write_segment(self, seg: Segment) -> None:
        assert self._path is not None
        name = f"seg-{seg.id:08d}.arrow"
        write_rows(self._path / name, seg.take(np.arange(seg.n)))
        self._sums[name] = file_checksum(self._path / name)
        seg.file = name
        if seg.ann is not None:
            self._write_ann(seg)

    def _write_ann(self, seg: Segment) -> None:
        assert self._path is not None
        assert seg.ann is not None
        save = getattr(seg.ann, "save", None)
        if save is None:
            return  # IVF-PQ structures are rebuilt on open (minutes, in the background)
        name = f"seg-{seg.id:08d}.{seg.ann.kind}"
        write_atomic(self._path / name, save)
        self._sums[name] = file_checksum(self._path / name)
        seg.ann_file = name

    def checkpoint(self) -> int | None:
        """Write the latest epoch to disk and drop the log it covers; returns the epoch."""
        if self._path is None:
            return None
        path = self._path
        with self._maint:
            with self._lock:
                man = self._manifest
                epoch = man.epoch
                wal = self._wal
                assert wal is not None
                if wal.current is None or wal.current.name != f"wal-{epoch + 1:012d}.log":
                    wal.start(epoch + 1)
                deletes = list(self._deletes)
                cursor = self._cursor
                epoch_high = self._epoch_high[: epoch + 1].copy()
                meta: dict[str, Any] = {
                    "epoch": epoch,
                    "parent": man.parent,
                    "restored_from": man.restored_from,
                    "dim": self._dim,
                    "history": self._spec.history,
                    "next_rid": self._next_rid,
                    "next_segment": self._next_seg,
                    "high": self._high,
                    "compacted_floor": self._compacted_floor,
                    "rolled_back": [list(r) for r in self._rolled_back],
                    "compactions": self._compactions,
                    "last_compaction_us": self._last_compaction_us,
                    "committed_at_us": man.stats.committed_at_us,
                }
                self._dirty = 0
                self._needs_checkpoint = False
            segments = []
            keep = {wal.current.name if wal.current else ""}
            stamp_rids, stamp_sup, stamp_vt, stamp_dead = [], [], [], []
            for view in man.views:
                seg, n = view.segment, view.rows
                if seg.sealed and n == seg.n:
                    if seg.file is None:
                        self._write_segment(seg)
                    elif seg.ann is not None and seg.ann_file is None:
                        self._write_ann(seg)
                    name = seg.file
                else:
                    name = f"grow-{seg.id:08d}-{n}.arrow"
                    if name not in self._sums or not (path / name).exists():
                        write_rows(path / name, seg.take(np.arange(n)))
                        self._sums[name] = file_checksum(path / name)
                assert name is not None
                keep.add(name)
                if seg.ann_file:
                    keep.add(seg.ann_file)
                segments.append(
                    {
                        "id": seg.id,
                        "rows": n,
                        "file": name,
                        "sealed": seg.sealed and n == seg.n,
                        "ann": seg.ann_file if seg.sealed else None,
                    }
                )
                # Stamps as of the checkpoint's epoch: later ones are in the log.
                # (A kill always follows its row's first stamp, so sup ≤ dead.)
                loc = np.flatnonzero(seg.sup[:n] <= epoch)
                stamp_rids.append(seg.rids[loc])
                stamp_sup.append(seg.sup[loc])
                stamp_vt.append(seg.valid_to[loc])
                dead = seg.dead[loc]
                stamp_dead.append(np.where(dead <= epoch, dead, NEVER))
            tables: dict[str, dict[str, Any]] = {
                "stamps": {
                    "rid": np.concatenate([np.zeros(0, np.int64), *stamp_rids]),
                    "sup": np.concatenate([np.zeros(0, np.int64), *stamp_sup]),
                    "valid_to": np.concatenate([np.zeros(0, np.int64), *stamp_vt]),
                    "dead": np.concatenate([np.zeros(0, np.int64), *stamp_dead]),
                },
                "deletes": {
                    "tenant": [d[0] for d in deletes],
                    "doc_id": [d[1] for d in deletes],
                    "event_time": np.asarray([d[2] for d in deletes], np.int64),
                    "offset": np.asarray([d[3] for d in deletes], np.int64),
                    "epoch": np.asarray([d[4] for d in deletes], np.int64),
                },
                "epochs": {"high": epoch_high},
            }
            for name, columns in tables.items():
                fname = f"{name}-{epoch:012d}.arrow"
                write_table(path / fname, columns)
                self._sums[fname] = file_checksum(path / fname)
                meta[name] = fname
                keep.add(fname)
            if cursor is not None:
                cname = f"cursor-{epoch:012d}.msgpack"
                write_cursor(path / cname, cursor)
                self._sums[cname] = file_checksum(path / cname)
                meta["cursor"] = cname
                keep.add(cname)
            # Every file the manifest names, with its size and CRC-32: checked on open.
            meta["files"] = {n: self._sums[n] for n in sorted(keep) if n in self._sums}
            self._sums = {n: self._sums[n] for n in keep if n in self._sums}
            mname = f"manifest-{epoch:012d}.json"
            write_manifest(path / mname, {**meta, "segments": segments})
            keep.add(mname)
            self._checkpoint_epoch = epoch
            for p in path.iterdir():
                if p.name not in keep and not p.name.startswith("wal-"):
                    with contextlib.suppress(OSError):
                        p.unlink()
            wal.drop_before(wal.current)
        return epoch

    def _open(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        body = None
        for candidate in sorted(path.glob("manifest-*.json"), reverse=True):
            body = read_manifest(candidate)
            break
        if body is not None:
            self._load_checkpoint(path, body)
        self._wal = WriteAheadLog(path, fsync=self._spec.wal_fsync)
        replayed = 0
        for rec in self._wal.replay(self._manifest.epoch):
            if rec.batch.vectors.shape[1:] not in ((self._dim,), (0,)):
                msg = (
                    f"the index in {path} holds {rec.batch.vectors.shape[1]}-dimensional "
                    f"vectors but this index is {self._dim}-dimensional; point state_dir "
                    f"elsewhere or delete {path}"
                )
                raise IndexStoreError(msg)
            self._apply(rec.batch, rec.epoch, rec.committed_at_us)
            self._cursor = merge_cursor(self._cursor, rec.batch.cursor)
            replayed += 1
        self._dirty = replayed
        self._wal.start(self._manifest.epoch + 1)
        if replayed:
            log.info("index %s: replayed %d commits from the write-ahead log", path, replayed)

    def _load_checkpoint(self, path: Path, body: dict[str, Any]) -> None:
        if body["dim"] != self._dim:
            msg = (
                f"the index in {path} holds {body['dim']}-dimensional vectors but the embedder "
                f"makes {self._dim}; point state_dir elsewhere or delete {path} to start over"
            )
            raise IndexStoreError(msg)
        self._next_rid = body["next_rid"]
        self._next_seg = body["next_segment"]
        self._reserve_rids(self._next_rid)
        sums: dict[str, dict[str, int]] = body.get("files") or {}

        def checked(name: str) -> Path:
            """The file, once its size and CRC-32 match the manifest's (raises if not)."""
            verify_file(path / name, sums.get(name))
            if name in sums:
                self._sums[name] = sums[name]
            return path / name

        for entry in body["segments"]:
            rows = read_rows(checked(entry["file"]), self._dim)
            seg = Segment.from_rows(
                entry["id"],
                rows,
                sealed=entry["sealed"],
                capacity=0 if entry["sealed"] else self._spec.seal_rows,
            )
            if entry["sealed"]:
                seg.file = entry["file"]
                if entry.get("ann"):
                    try:
                        ann_path = checked(entry["ann"])
                    except CorruptStateError as exc:
                        # Rebuilt from the segment's vectors; searched exactly meanwhile.
                        log.warning("%s; its graph will be built again", exc.args[0])
                    else:
                        seg.ann = load_hnsw(str(ann_path), seg.vectors[: seg.n], self._spec.ann)
                        if seg.ann is None:
                            self._failed_ann.add(seg.id)
                        else:
                            seg.ann_file = entry["ann"]
            elif self._growing is None or self._growing.id < seg.id:
                # One growing segment (format 1 had one per day: the others are sealed).
                if self._growing is not None:
                    self._growing.seal()
                self._growing = seg
            else:
                seg.seal()
            self._segments[seg.id] = seg
            self._rid_seg[rows.rids] = seg.id
            self._rid_row[rows.rids] = np.arange(seg.n)
        stamps = read_table(checked(body["stamps"]))
        rids = stamps["rid"]
        if rids.size:
            dead = stamps.get("dead")
            if dead is None:  # format 1: a row a rollback undid carries sup == created
                created = np.empty_like(rids)
                for sid, seg in self._segments.items():
                    sel = self._rid_seg[rids] == sid
                    created[sel] = seg.created[self._rid_row[rids[sel]]]
                dead = np.where(stamps["sup"] == created, created, NEVER)
            segs = self._rid_seg[rids]
            local = self._rid_row[rids]
            for sid in np.unique(segs).tolist():
                sel = segs == sid
                seg = self._segments[sid]
                seg.sup[local[sel]] = stamps["sup"][sel]
                seg.valid_to[local[sel]] = stamps["valid_to"][sel]
                seg.dead[local[sel]] = dead[sel]
                seg.refresh_bounds()
        deletes = read_table(checked(body["deletes"]))
        self._deletes = list(
            zip(
                deletes["tenant"],
                deletes["doc_id"],
                deletes["event_time"].tolist(),
                deletes["offset"].tolist(),
                deletes["epoch"].tolist(),
                strict=True,
            )
        )
        highs = read_table(checked(body["epochs"]))["high"]
        self._epoch_high = np.full(max(1024, highs.size * 2), MIN_TIMESTAMP, np.int64)
        self._epoch_high[: highs.size] = highs
        self._high = body["high"]
        self._compacted_floor = body["compacted_floor"]
        self._rolled_back = tuple((int(a), int(b)) for a, b in body["rolled_back"])
        self._compactions = body["compactions"]
        self._last_compaction_us = body["last_compaction_us"]
        self._checkpoint_epoch = body["epoch"]
        if body.get("cursor"):
            self._cursor = read_cursor(checked(body["cursor"]))
        self._rebuild_docs()
        self._manifest = self._make_manifest(
            body["epoch"], body["parent"], body["committed_at_us"], body["restored_from"]
        )

    # -- the maintenance thread --------------------------------------------------

    def _closing(self) -> bool:
        """True once :meth:`close` was called: long maintenance work gives up."""
        return self._closed

    def _notify(self) -> None:
        if self._thread is not None:
            with self._wake:
                self._wake.notify()

    def _maintenance_loop(self) -> None:
        # Graph builds and merges can wait; commits and queries cannot. On Linux a
        # thread has its own nice value: give this one less CPU when others want it.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _MAINTENANCE_NICE)
        while True:
            with self._wake:
                if self._closed:
                    return
            try:
                busy = self.maintain()
            except Exception as exc:
                log.exception("index maintenance failed")
                self.last_maintenance_error = f"{type(exc).__name__}: {exc}"
                busy = False
            if not busy:
                with self._wake:
                    if self._closed:
                        return
                    # Woken by commits that seal or make a checkpoint due; the timeout
                    # is a safety net for compaction made possible by time passing.
                    self._wake.wait(timeout=5.0)

    def close(self) -> None:
        """Stop the maintenance thread, checkpoint (if persistent) and close the log."""
        with self._wake:
            was_closed = self._closed
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if was_closed:
            return
        with self._maint, self._lock:
            if self._path is not None and self._wal is not None:
                self.checkpoint()
                self._wal.close()

    def abandon(self) -> None:
        """Stop and release files without a checkpoint: what a crash leaves (for tests)."""
        self._halt()
        with self._lock:
            if self._wal is not None:
                self._wal.close()

    # -- observability -------------------------------------------------------------

    def health(self) -> IndexHealth:
        """Gauges of the latest manifest: segments, tombstones, bytes, compactions."""
        man = self._manifest
        segs = [v.segment for v in man.views]
        rows = sum(v.rows for v in man.views)
        tomb = sum(s.stamped for s in segs)
        return IndexHealth(
            epoch=man.epoch,
            segments=len(segs),
            growing_segments=sum(1 for s in segs if not s.sealed),
            ann_segments=sum(1 for s in segs if s.ann is not None),
            ann_pending=sum(
                1
                for s in segs
                if s.sealed
                and s.ann is None
                and s.id not in self._failed_ann
                and choose_ann(s.n, self._spec.ann) is not None
            ),
            exact_by_measurement=sum(1 for s in segs if s.id in self._failed_ann),
            ann_recall_min=self.ann_recall_min,
            rows=rows,
            live_chunks=man.stats.live_chunks,
            tombstoned_rows=tomb,
            tombstone_ratio=tomb / rows if rows else 0.0,
            bytes=sum(s.nbytes() for s in segs),
            compactions=self._compactions,
            last_compaction_us=self._last_compaction_us,
            checkpoint_epoch=self._checkpoint_epoch,
            history_floor_us=man.history_floor_us,
            epoch_floor=man.epoch_floor,
            wal_torn_tails=self._wal.torn_tails if self._wal is not None else 0,
        )

    def __repr__(self) -> str:
        s = self._manifest.stats
        where = f", path={str(self._path)!r}" if self._path else ""
        return (
            f"LsmIndex(dim={self._dim}, epoch={s.epoch}, live_chunks={s.live_chunks}, "
            f"segments={len(self._manifest.views)}{where})"
        )


def _halt_at_exit(ref: weakref.ReferenceType[LsmIndex]) -> None:
    index = ref()
    if index is not None:
        index._halt()
