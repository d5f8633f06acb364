"""Rollback of the LSM index: an earlier epoch's documents current again, as a new epoch.

``rollback(E)`` publishes epoch ``latest + 1`` whose documents are those of
epoch E. Nothing is rewritten: rows created after E are marked undone (never
seen by any read, and dropped by the next compaction), and ends and kills
stamped after E are taken back, in copies of the stamps of the segments
concerned, so readers that pinned an earlier manifest are not disturbed. The
epochs after E become unreadable (the manifest lists them as rolled back);
history before E stays. The document table is rebuilt from the rows, and the
rollback is checkpointed at once when the index persists.
"""

from __future__ import annotations

from streamrag.errors import IndexStoreError, QueryError
from streamrag.index.base import SearchFilter
from streamrag.index.lsm_persistence import LsmPersistence
from streamrag.index.segment import NEVER

__all__ = ["LsmRollback"]


class LsmRollback(LsmPersistence):
    """Undo the epochs after a given one."""

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
