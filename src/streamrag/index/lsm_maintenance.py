"""Maintenance of the LSM index: ANN builds, recall checks, compaction, its thread.

Nothing slow happens on the commit path. A full growing segment is only
sealed; the maintenance thread (``background=True``) then builds its ANN
structure (:mod:`.ann`) or, for a segment too small for one, its
half-precision copy (:mod:`.half`), re-checks the recall of every structure on
a sample of recent real queries (widening or dropping one that misses the
target), merges segments its policy picks with their neighbours in event time
(:mod:`.compaction`), and checkpoints when one is due. It takes the writer
lock only to publish its result, and runs at a lower CPU priority than the
process. A step with nothing else to do, while the process is quiet (as it
starts, or after a bulk load), measures how many queries a call the
half-precision copies are worth on this CPU (:mod:`.half_limit`). Without the
thread, :meth:`LsmMaintenance.maintain` does one round of it all (tests call
it, deterministically). The thread itself is a
:class:`~.maintenance_thread.MaintenanceThread`.

A compaction that a rollback overtook is void: the rollback bumps the
generation, and a merge begun under an older one is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from streamrag.index.ann import Ann, BuildCancelled, build_ann, choose_ann, recall_on
from streamrag.index.compaction import droppable, plan
from streamrag.index.half import HalfScan
from streamrag.index.half_limit import (
    MeasurementCancelled,
    MeasurementPostponed,
    Quiet,
    measure_half_limit,
    measured_half_limit,
    others_cpu_s,
    reads,
)
from streamrag.index.lsm_persistence import LsmPersistence
from streamrag.index.search import half_query_limit
from streamrag.index.segment import Rows, Segment

__all__ = ["LsmMaintenance"]

log = logging.getLogger("streamrag.index")


class LsmMaintenance(LsmPersistence):
    """ANN structures, recall checks, compaction, checkpoints when due, and the thread."""

    def seal_all(self) -> None:
        """Seal every growing segment now (before a bulk compaction, or a rollback)."""
        with self._lock:
            if self._growing is not None:
                self._seal(self._growing)
            self._republish()

    def maintain(self) -> bool:
        """Build missing ANN structures, compact, checkpoint when due; True if it did work.

        On the maintenance thread, a step that did nothing else measures the
        half-precision limit if it is to be measured and the process is quiet
        (:meth:`_measure_half_limit`), after the maintenance lock is let go:
        it reads no index state, and a rollback or checkpoint asked for
        meanwhile need not wait for it.
        """
        did = False
        with self._maint:
            while self._build_one_ann():
                did = True
            while self._build_one_half():
                did = True
            did |= self.check_recall()
            did |= self.compact()
            if self._path is not None and (
                self._needs_checkpoint or self._dirty >= self._spec.checkpoint_every
            ):
                self.checkpoint()
                did = True
        if not did and self._maintenance.running:
            self._measure_half_limit()
        return did

    def _in_use(self, *, reading: bool = False) -> Callable[[], bool]:
        """For a build: whether a query or a commit came since it last asked.

        The first answer is about the time since this was called. A graph is
        built on the idle cores only while neither comes (:func:`.ann.build_threads`).
        With ``reading``, a read of the process's input counts too
        (:func:`.half_limit.note_read`).
        """

        def state() -> tuple[int, int, int]:
            return (self._queries_seen, self._manifest.epoch, reads() if reading else 0)

        last = state()

        def busy() -> bool:
            nonlocal last
            now = state()
            moved, last = now != last, now
            return moved

        return busy

    def check_recall(self, *, force: bool = False) -> bool:
        """Re-check every ANN structure's recall@10 on recent real queries.

        A structure below ``target_recall`` is widened until it reaches it, or
        dropped (the segment is then scanned exactly). Runs every
        ``probe_every`` queries, an interval that doubles up to ``probe_every_max``
        while checks change nothing; True if a structure was changed.
        """
        spec = self._spec.ann
        due = self._queries_seen - self._queries_at_check >= self._probe_interval
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
        if changed:
            self._probe_interval = spec.probe_every
        else:
            self._probe_interval = min(2 * self._probe_interval, spec.probe_every_max)
        return changed

    def _build_one_ann(self) -> bool:
        with self._lock:
            todo = self._ann_candidates()
        if not todo:
            return False
        seg = todo[0]
        kind = choose_ann(seg.n, self._spec.ann)
        assert kind is not None
        try:
            ann = build_ann(
                kind, seg.vectors[: seg.n], self._spec.ann, self._closing, self._in_use()
            )
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

    def _build_one_half(self) -> bool:
        """Give one segment searched exactly its half-precision copy (:mod:`.half`).

        A sealed segment's copy holds all its rows; the growing segment's the
        rows it has now (rows are only appended, so those never change).
        """
        with self._lock:
            todo = self._half_candidates()
            if not todo:
                return False
            seg = todo[0]
            rows = seg.n
        half = self._half_copy(seg, rows)
        with self._lock:
            if half is None:
                # Coordinates beyond half precision's range, or no copy is worth making here.
                self._failed_half.add(seg.id)
                return True
            seg.half = half
            current = self._segments.get(seg.id)
            if current is not None and current is not seg and current.vectors is seg.vectors:
                current.half = half
        return True

    def _half_copy(self, seg: Segment, rows: int | None = None) -> HalfScan | None:
        """A copy of the segment's first ``rows`` rows (all: None); None if refused.

        Refused also where this CPU measured no batch size that the copies
        search faster (:mod:`.half_limit`): they would cost memory for nothing.
        """
        try:
            if self._half_limit() in (0, None):
                return None  # this CPU searches faster without (or closing): no copy
            return HalfScan.build(seg.vectors[: seg.n if rows is None else rows])
        except Exception as exc:  # searched over float32, as before
            log.exception("building the half-precision copy of %r failed", seg)
            self.last_maintenance_error = f"{type(exc).__name__}: {exc}"
            return None

    def _half_limit(self) -> int | None:
        """The queries a call worth the half-precision copies; None if closing meanwhile.

        ``index.half_max_queries``, or measured once per process
        (:mod:`.half_limit`). With the maintenance thread,
        :meth:`_measure_half_limit` measures it in a step with nothing else to do
        while the process is quiet, and until then this is the default
        (:data:`~.search.DEFAULT_HALF_QUERIES`). Without the thread
        (:meth:`maintain` called in the foreground) it is measured before the
        first copy, at once: the caller does nothing else meanwhile.
        """
        tuning = self._spec.tuning
        if tuning.half_max_queries is not None:
            return tuning.half_max_queries
        measured = measured_half_limit(self._dim)  # every step asks: no lock, no objects
        if measured is not None:
            return measured
        if self._maintenance.running:
            return half_query_limit(self._dim)  # the default, until measured
        try:
            return measure_half_limit(self._dim, self._spec.seal_rows, tuning)
        except MeasurementCancelled:
            return None

    def _measure_half_limit(self) -> None:
        """On the maintenance thread, with nothing else to do: measure the limit if it is due.

        It waits for a quiet spell — no query, no commit, the process's other
        threads nearly idle (:class:`~.half_limit.Quiet`) — and times in the
        gaps; an attempt that finds none within its budget is postponed to a
        later step, so a bulk load is never timed over, and the steps between
        attempts do the other maintenance. Measured at none (the copies never
        win here), the copies made meanwhile under the default are let go.
        Outside the maintenance lock: it reads no index state.
        """
        tuning = self._spec.tuning
        if tuning.half_max_queries is not None or measured_half_limit(self._dim) is not None:
            return
        helpers = tuning.helpers()  # the searches' own helpers: their work is not a load
        quiet = Quiet(
            self._in_use(reading=True),
            self._maintenance.pause,
            self._closing,
            others_cpu=lambda: others_cpu_s(helpers),
        )
        try:
            limit = measure_half_limit(self._dim, self._spec.seal_rows, tuning, quiet)
        except (MeasurementCancelled, MeasurementPostponed):
            return  # closing (the next open measures), or not quiet: a later step tries
        if limit == 0:
            with self._lock:
                for seg in self._segments.values():
                    seg.half = None

    def _attach_ann(self, seg: Segment, ann: Ann) -> None:
        with self._lock:
            seg.ann = ann
            # A copy of its first rows from when it was growing: the structure answers now.
            seg.half = None
            current = self._segments.get(seg.id)
            if current is not None and current.vectors is seg.vectors:
                current.ann = ann
                current.half = None
            self._needs_checkpoint = True
            self._probe_interval = self._spec.ann.probe_every  # check it on live queries soon

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
                    *(kind, merged.vectors[: merged.n], self._spec.ann),
                    *(self._closing, self._in_use()),
                )
            except BuildCancelled:
                return False  # closing: the segments stay as they were
        elif merged.n >= self._spec.tuning.half_min_rows:
            with self._lock:
                wanted = self._scans_past_cache()
            if wanted:
                merged.half = self._half_copy(merged)
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

    def _start_thread(self) -> None:
        """Run :meth:`maintain` on the maintenance thread from now on."""
        self._maintenance.start(self.maintain, self._maintenance_failed)

    def _maintenance_failed(self, exc: Exception) -> None:
        log.exception("index maintenance failed")
        self.last_maintenance_error = f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop the maintenance thread, checkpoint (if persistent) and close the log."""
        if self._maintenance.stop():
            return  # closed already
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

    def _halt(self) -> None:
        """Stop the maintenance thread after its current step (no checkpoint)."""
        self._maintenance.stop()
