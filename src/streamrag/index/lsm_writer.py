"""The writer of the LSM index: a commit, applied and published as the next epoch.

A commit is logged first (when the index persists: the write-ahead log record
is fsynced before anything is visible), then applied, then published by
swapping one reference to a new immutable manifest.

Applying places every change in its document's history (:mod:`.versions`):
changes are taken per document in version order, so each meets the versions
around it as they will be once the batch is in. A change newer than the current
version becomes current; an older one — late, or beaten within its micro-batch
— is filed in the past, and the version before it gets an end in valid time
(:meth:`LsmWriter._end`: its rows are *stamped*, or killed and copied when they
had an earlier end, see :mod:`.segment`). With ``history=False`` only the newest
change per document is kept, and an older one is stale. A change that would
land entirely before the history floor is not stored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from streamrag.changes import Op
from streamrag.errors import IndexStoreError
from streamrag.index.base import (
    CommitBatch,
    CommitResult,
    DocOp,
    DocState,
    check_commit,
    merge_cursor,
)
from streamrag.index.lsm_state import LsmState
from streamrag.index.pending import PendingRows
from streamrag.index.segment import NEVER, Rows
from streamrag.index.versions import Key, Version, is_newer
from streamrag.timing import MIN_TIMESTAMP, Timestamp

__all__ = ["LsmWriter"]


def _version_order(docs: Sequence[DocOp], history: bool) -> list[int]:
    """The batch's changes per document in version order (only the newest without history).

    Of two changes with the same version, the later in the batch comes last (and
    is the one kept without history).
    """
    versions = [(d.tenant, d.doc_id, d.event_time, d.offset) for d in docs]
    order = sorted(range(len(docs)), key=versions.__getitem__)
    if history:
        return order
    # Only the newest change per document: the last of its run in version order.
    last = len(order) - 1
    return [
        i for j, i in enumerate(order) if j == last or versions[order[j + 1]][:2] != versions[i][:2]
    ]


class LsmWriter(LsmState):
    """The commit path: log, apply, publish (one writer thread)."""

    def commit(self, batch: CommitBatch) -> CommitResult:
        """Log the micro-batch, apply it and publish the next epoch."""
        check_commit(batch, self._dim)
        with self._lock:
            if self._maintenance.closed:
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
        order = _version_order(docs, history)
        stale = len(docs) - len(order)
        filed = 0  # changes kept as versions
        current: set[Key] = set()  # documents whose current version this commit changed
        pending = PendingRows(batch, epoch, self._next_rid)
        high = self._high
        neighbours = self._neighbours
        new_version = self._new_version
        count_current = self._count_current
        add = versions.add
        forget = history and floor != MIN_TIMESTAMP
        for i in order:
            d = docs[i]
            key = (d.tenant, d.doc_id)
            before, after, held = neighbours(key, (d.event_time, d.offset))
            if held or (after is not None and after.version[0] <= floor):
                stale += 1  # held already, or no readable version could show it
                continue
            if before is not None and before.rows:
                self._end(before, d.event_time, pending)
            state = new_version(batch, i, after, pending)
            filed += 1
            if after is None:
                current.add(key)
                if d.event_time > high:
                    high = d.event_time
                count_current(before, state)
            add(key, state)
            if forget:
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

    def _neighbours(
        self, key: Key, version: Version
    ) -> tuple[DocState | None, DocState | None, bool]:
        """The versions before and after ``version``, and whether it is held already.

        Without history only the current version counts: it is the one before
        a newer change, and a change not newer than it is held.
        """
        if self._spec.history:
            return self._versions.neighbours(key, version)
        before = self._versions.current(key)
        return before, None, before is not None and not is_newer(version, before.version)

    def _new_version(
        self, batch: CommitBatch, i: int, after: DocState | None, pending: PendingRows
    ) -> DocState:
        """The version the batch's ``i``-th change makes: a tombstone, or its new rows.

        Its rows end where the version ``after`` it begins (never, for a new
        current version).
        """
        d = batch.docs[i]
        version = (d.event_time, d.offset)
        n = d.n_chunks
        if d.op == Op.DELETE or n == 0:
            self._deletes.append((d.tenant, d.doc_id, d.event_time, d.offset, pending.epoch))
            return DocState(version, deleted=True)
        end = NEVER if after is None else after.version[0]
        first = d.first_chunk
        return DocState(
            version, False, pending.add_version(d, end), batch.hashes[first : first + n]
        )

    def _count_current(self, before: DocState | None, state: DocState) -> None:
        """Keep the live and deleted counts as ``state`` replaces ``before`` as current."""
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
            self._live_chunks += len(state.rows)

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
            first = int(segs[0])
            if segs.shape[0] == 1 or bool((segs == first).all()):  # the usual: one segment
                self._segments[first].stamp(local, epoch, valid_to)
                return
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
