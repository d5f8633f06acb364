"""The LSM index's state, and the steps every part of it shares.

:class:`~streamrag.index.lsm.LsmIndex` is assembled from parts by role, each a
class over this one state: the writer (:mod:`.lsm_writer`), persistence
(:mod:`.lsm_persistence`), maintenance (:mod:`.lsm_maintenance`), rollback
(:mod:`.lsm_rollback`) and reads (:mod:`.lsm_reads`). They share one set of
mutable fields guarded by one writer lock, so the fields are declared once,
here, with the steps more than one role takes:

- **where each row lives**: segments by id, the growing one, and two arrays
  from row id to segment and to the row within it (:meth:`LsmState._place`
  appends rows and seals a full segment);
- **publishing an epoch**: a :class:`~.manifest.Manifest` of views of every
  segment at its current length, reusing unchanged views
  (:meth:`LsmState._publish`, :meth:`LsmState._republish`);
- **the history floor** (:meth:`LsmState._floor`): ``as_of`` reads before it are
  outside the retained history;
- **the document table again from the rows** (:meth:`LsmState._rebuild_docs`),
  after opening a checkpoint and after a rollback;
- **waking the maintenance thread** when a commit makes work for it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import IndexStoreError
from streamrag.index.ann import AnnSpec, choose_ann
from streamrag.index.base import DocState, IndexStats
from streamrag.index.compaction import CompactionSpec
from streamrag.index.maintenance_thread import MaintenanceThread
from streamrag.index.manifest import Manifest
from streamrag.index.search import SearchTuning, View
from streamrag.index.segment import NEVER, Rows, Segment
from streamrag.index.versions import Key, Versions
from streamrag.index.wal import WriteAheadLog
from streamrag.timing import MIN_TIMESTAMP, US_PER_S, Clock, SystemClock, Timestamp

__all__ = ["LsmSpec", "LsmState"]


@dataclass(frozen=True, slots=True)
class LsmSpec:
    """Every knob of the LSM index (built from ``IndexSettings`` by :mod:`.factory`)."""

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


class LsmState:
    """The fields of an LSM index and the steps its roles share (see the module)."""

    def __init__(
        self, dim: int, spec: LsmSpec | None, path: str | Path | None, clock: Clock | None
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
        self._failed_half: set[int] = set()  # half precision could not hold their vectors
        self._view_cache: dict[int, View] = {}
        # A sample of recent query vectors, to re-check ANN recall on real traffic.
        self._probes: deque[npt.NDArray[np.float32]] = deque(maxlen=self._spec.ann.probe_queries)
        self._queries_seen = 0
        self._queries_at_check = 0
        self._probe_interval = self._spec.ann.probe_every  # queries until the next re-check
        self.ann_recall_min = 1.0
        self._wal: WriteAheadLog | None = None
        self._maintenance = MaintenanceThread()  # the closed flag, and the thread if started
        self.last_maintenance_error: str | None = None
        self.rebuilt: dict[str, str] | None = None
        """Set when a damaged index was moved aside and this one rebuilds it from the sources."""
        self._manifest = self._make_manifest(0, None, self._clock.now_us())

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

    def _closing(self) -> bool:
        """True once :meth:`close` was called: long maintenance work gives up."""
        return self._maintenance.closed

    def _notify(self) -> None:
        self._maintenance.wake()

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

    def _half_candidates(self) -> list[Segment]:
        """Segments searched exactly whose half-precision copy is missing or short.

        A sealed segment's copy holds all its rows. The growing segment gets a
        copy of the rows it has once ``tuning.half_min_rows`` of them are not
        in one, and a new one each time as many more arrive; the rows after
        the copy are scanned in float32 (:meth:`~.search._Scan.add_half`).
        """
        spec = self._spec.ann
        least = self._spec.tuning.half_min_rows
        todo = [
            s
            for s in self._segments.values()
            if s.n - (0 if s.half is None else s.half.rows) >= (1 if s.sealed else least)
            and s.ann is None
            and s.n >= least
            and s.id not in self._failed_half
            and (not s.sealed or choose_ann(s.n, spec) is None or s.id in self._failed_ann)
        ]
        # Asked after every commit: the sum over all segments only when there is a candidate.
        return todo if todo and self._scans_past_cache() else []

    def _scans_past_cache(self) -> bool:
        """Whether the vectors scanned exactly (no ANN) reach ``tuning.half_min_bytes``."""
        scanned = sum(s.n * s.dim * 4 for s in self._segments.values() if s.ann is None)
        return scanned >= self._spec.tuning.half_min_bytes

    def _wants_ann(self) -> bool:
        """Whether maintenance has a structure to build: an ANN or a half-precision copy."""
        return bool(self._ann_candidates() or self._half_candidates())

    def _rebuild_docs(self) -> None:
        """Every document's versions and the counts, from the rows and the delete log.

        Column-wise: the rows every read at the latest epoch may see are
        gathered, ordered by document, version and position with one sort, and
        cut into versions; the deletes are merged in. Each document's newest
        version is its current one.
        """
        found = _versions_of_rows(self._segments.values(), self._deletes)
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


def _versions_of_rows(
    segments: Iterable[Segment], deletes: Sequence[tuple[str, str, int, int, int]]
) -> dict[Key, list[DocState]]:
    """Every document's versions (unsorted): rows cut into versions, plus the deletes."""
    keys: list[Key] = []
    cols: list[tuple[npt.NDArray[Any], ...]] = []
    hashes: list[bytes] = []
    for seg in segments:
        n = seg.n
        rows = np.flatnonzero(seg.dead[:n] == NEVER) if seg.killed else np.arange(n)
        if not rows.size:
            continue
        tenants, doc_ids, seg_hashes = seg.tenants, seg.doc_ids, seg.hashes
        rl = rows.tolist()
        keys.extend([(tenants[i], doc_ids[i]) for i in rl])
        hashes.extend([seg_hashes[i] for i in rl])
        cols.append((seg.positions[rows], seg.rids[rows], seg.valid_from[rows], seg.offsets[rows]))
    found: dict[Key, list[DocState]] = {}
    if keys:
        _cut_versions(keys, cols, hashes, found)
    for tenant, doc_id, t_del, off, _ in deletes:
        found.setdefault((tenant, doc_id), []).append(DocState((t_del, off), deleted=True))
    return found


def _cut_versions(
    keys: list[Key],
    cols: list[tuple[npt.NDArray[Any], ...]],
    hashes: list[bytes],
    found: dict[Key, list[DocState]],
) -> None:
    """Sort the gathered rows by document, version and position, and cut them into versions."""
    total = len(keys)
    codes_of: dict[Key, int] = {}
    codes = np.fromiter((codes_of.setdefault(k, len(codes_of)) for k in keys), np.int64, total)
    positions, rids, valid_from, offsets = (np.concatenate([c[f] for c in cols]) for f in range(4))
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
