"""Reads of the LSM index: searches of a pinned epoch, exports, and what the writer asks.

A search pins the manifest it starts with (or one the caller pinned) and reads
exactly that epoch, without locks (:mod:`.search`). One query in
``_PROBE_SAMPLING`` is kept as a probe for the maintenance thread's recall
re-check. The writer side asks about documents before embedding a change
(:meth:`LsmReads.wants`, :meth:`LsmReads.doc_state`) and reuses stored vectors
of unchanged chunks (:meth:`LsmReads.vectors_at`). :meth:`LsmReads.health` gives
the gauges of the latest manifest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrag.errors import IndexStoreError
from streamrag.index.ann import choose_ann
from streamrag.index.base import DocState, Hit, IndexStats, SearchFilter, check_queries
from streamrag.index.hits import Hits
from streamrag.index.lsm_state import LsmState
from streamrag.index.manifest import Manifest
from streamrag.index.search import search_segments
from streamrag.index.segment import Rows
from streamrag.index.versions import is_newer
from streamrag.timing import Timestamp

__all__ = ["IndexHealth", "LsmReads"]

_PROBE_SAMPLING = 8
"""One query in this many is kept as a probe for the recall re-check."""


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
    half_segments: int = 0
    """Segments scanned exactly through a half-precision copy (:mod:`.half`), growing too."""


class LsmReads(LsmState):
    """Searches, exports, document lookups and gauges."""

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
            return is_newer(version, None if current is None else current.version)
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

    def embedders_at(self, rows: Sequence[int]) -> list[str]:
        """The embedder version that made each row's vector (rows of :meth:`doc_state`)."""
        with self._lock:
            return [
                self._segments[int(self._rid_seg[r])].embedders[int(self._rid_row[r])] for r in rows
            ]

    def search_many(
        self,
        queries: npt.NDArray[np.float32],
        k: int,
        flt: SearchFilter,
        manifest: Manifest | None = None,
    ) -> tuple[int, list[Hits]]:
        """Top-``k`` chunks per query from one pinned manifest; returns (epoch read, hits)."""
        man = manifest or self._manifest
        q = check_queries(queries, self._dim, k)
        spec = man.read_spec(flt)
        hits = search_segments(man.views, q, k, spec, man.epoch, self._spec.tuning)
        self._queries_seen += q.shape[0]  # approximate under threads: it only paces checks
        if self._queries_seen % _PROBE_SAMPLING < q.shape[0]:
            self._probes.append(q[0].copy())
            if self._queries_seen - self._queries_at_check >= self._probe_interval:
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

    def stored_rows(self, block: int = 8192) -> Iterator[Rows]:
        """Copies of every row the latest manifest's segments hold, ``block`` at a time.

        Every row, whatever its stamps: versions that ended, rows a rollback
        undid and copies alike (each keeps the ``committed`` epoch of its
        version). For audits, which recompute what each epoch stored.
        """
        for view in self._manifest.views:
            seg, n = view.segment, view.rows
            for lo in range(0, n, block):
                yield seg.take(np.arange(lo, min(n, lo + block)))

    def stored_deletes(self) -> list[tuple[str, str, Timestamp, int, int]]:
        """Every tombstone the index holds: tenant, doc id, event time, offset and epoch."""
        with self._lock:
            return list(self._deletes)

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
            half_segments=sum(1 for s in segs if s.half is not None),
        )
