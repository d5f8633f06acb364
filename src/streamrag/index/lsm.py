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

Code. The class is assembled from parts by role, each in its own module over
one shared state (:mod:`.lsm_state`): the writer (:mod:`.lsm_writer`),
persistence (:mod:`.lsm_persistence`, with the typed checkpoint manifest of
:mod:`.checkpoint`), maintenance (:mod:`.lsm_maintenance`), rollback
(:mod:`.lsm_rollback`) and reads (:mod:`.lsm_reads`).
"""

from __future__ import annotations

import atexit
import weakref
from pathlib import Path
from typing import Any

from streamrag.index.lsm_maintenance import LsmMaintenance
from streamrag.index.lsm_reads import IndexHealth, LsmReads
from streamrag.index.lsm_rollback import LsmRollback
from streamrag.index.lsm_state import LsmSpec
from streamrag.index.store import load_arrow
from streamrag.timing import Clock

__all__ = ["IndexHealth", "LsmIndex", "LsmSpec"]


class LsmIndex(LsmReads, LsmRollback, LsmMaintenance):
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
        super().__init__(dim, spec, path, clock)
        if self._path is not None:
            # Load pyarrow now: importing it inside the first checkpoint would stall
            # commits and queries for tens of milliseconds.
            load_arrow()
            self._open(self._path)
        if background:
            self._start_thread()
            # A process that exits without close() must not kill the thread inside a
            # graph build: native code aborts the process then. Let it finish first.
            atexit.register(_halt_at_exit, weakref.ref(self))

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
