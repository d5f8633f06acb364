"""Manifests: one immutable description of the index per committed epoch.

A commit builds a new :class:`Manifest` — the segments and how many of their
rows exist at that epoch, the sizes, the history that can still be read — and
publishes it by swapping one reference. A query reads that reference once and
uses the manifest it got for its whole run (it *pins* it), so it sees one whole
micro-batch or none of it, and the writer never waits for a reader.

Each manifest names its parent epoch. Maintenance (building ANN structures,
compaction) may publish a new manifest for the same epoch: the same documents,
stored differently.

**History.** A read may ask for an earlier ``epoch`` or for the documents
``as_of`` an event time. Both are answerable within a retention window
measured in event time back from the newest event time committed: history
older than that is compacted away, and asking for it is a
:class:`~streamrag.errors.QueryError`, never a silently wrong answer. Epochs
undone by a rollback cannot be read either.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrag.errors import QueryError
from streamrag.index.base import IndexStats, SearchFilter
from streamrag.index.search import View
from streamrag.index.segment import NEVER, ReadSpec
from streamrag.timing import MIN_TIMESTAMP, Timestamp, format_timestamp

__all__ = ["Manifest"]


@dataclass(frozen=True, slots=True)
class Manifest:
    """One committed epoch of the LSM index: what a query pins."""

    epoch: int
    parent: int | None
    views: tuple[View, ...]
    stats: IndexStats
    history_floor_us: Timestamp = MIN_TIMESTAMP
    """``as_of`` before this event time is outside the retained history."""
    epoch_floor: int = 0
    """Epochs before this one are outside the retained history."""
    rolled_back: tuple[tuple[int, int], ...] = ()
    """Inclusive ranges of epochs undone by rollbacks."""
    restored_from: int | None = None
    """For the manifest a rollback made: the epoch whose documents it restored."""
    history: bool = True
    """False when the index keeps only each document's newest version (no ``as_of``)."""

    def read_spec(self, flt: SearchFilter) -> ReadSpec:
        """Check the version a filter asks for against this manifest and compile it."""
        if flt.epoch is None and flt.as_of_us is None:
            # The common read: the latest epoch as it is now. It is always readable
            # (the epoch floor never passes it, and a rollback publishes a new epoch).
            epoch, as_of = self.epoch, NEVER
        else:
            epoch, as_of = self._checked_version(flt)
        return ReadSpec(
            epoch,
            as_of,
            flt.tenant,
            flt.domains,
            flt.doc_ids,
            flt.start_us,
            flt.end_us,
            flt.metadata,
        )

    def _checked_version(self, flt: SearchFilter) -> tuple[int, int]:
        """The epoch and ``as_of`` (NEVER: now) an earlier read asks for, checked."""
        epoch = self.epoch if flt.epoch is None else flt.epoch
        if epoch > self.epoch:
            msg = (
                f"epoch {epoch} is not committed yet: the latest epoch is {self.epoch}; "
                f"ask for an epoch up to {self.epoch}, or omit it to read the latest"
            )
            raise QueryError(msg)
        if epoch < self.epoch_floor:
            msg = (
                f"epoch {epoch} is older than the retained history: the oldest readable "
                f"epoch is {self.epoch_floor} (index.retention_s bounds how much history is kept)"
            )
            raise QueryError(msg)
        for lo, hi in self.rolled_back:
            if lo <= epoch <= hi:
                msg = (
                    f"epoch {epoch} was undone by a rollback (epochs {lo}–{hi}); "
                    f"read an epoch before {lo} or after {hi}"
                )
                raise QueryError(msg)
        as_of = NEVER
        if flt.as_of_us is not None and not self.history:
            msg = (
                "as_of needs the documents' history, and this index keeps only their newest "
                "versions (index.history: current); set index.history: full and replay the "
                "input, or ask without as_of"
            )
            raise QueryError(msg)
        if flt.as_of_us is not None:
            if flt.as_of_us < self.history_floor_us:
                msg = (
                    f"as_of {format_timestamp(flt.as_of_us)} is before the retained history, "
                    f"which starts at {format_timestamp(self.history_floor_us)} (the newest "
                    f"event time minus index.retention_s); ask for a later time or raise "
                    f"index.retention_s"
                )
                raise QueryError(msg)
            as_of = flt.as_of_us
        return epoch, as_of
