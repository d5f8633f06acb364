"""What a checkpoint of the LSM index writes last: its manifest, as a typed record.

A checkpoint of epoch E writes data files first — one Arrow file per segment
(``seg-*.arrow``, or ``grow-<id>-<rows>.arrow`` for a growing segment's rows so
far), an HNSW graph beside a sealed segment that has one, the row stamps, the
delete log, each epoch's newest event time, and the stream cursor — and then
the manifest ``manifest-<E>.json`` that names them all, with the size and
CRC-32 of each. The manifest is written atomically and last: until it exists,
the previous checkpoint (plus the write-ahead log after it) is the index.

:class:`CheckpointManifest` is that manifest's body. :meth:`~CheckpointManifest.to_body`
gives the JSON object :func:`~.store.write_manifest` writes (it adds the format
number and a checksum of its own), and :meth:`~CheckpointManifest.from_body`
reads one back, from this format (2) or the first one, which listed no file
checksums and no ANN files:

>>> m = CheckpointManifest(
...     epoch=3, parent=2, restored_from=None, dim=8, next_rid=5, next_segment=1,
...     high=10, compacted_floor=0, rolled_back=(), compactions=0,
...     last_compaction_us=None, committed_at_us=7, stamps="s", deletes="d",
...     epochs="e", segments=(SegmentEntry(1, 5, "grow-00000001-5.arrow", False),),
... )
>>> body = m.to_body()
>>> "cursor" in body, body["segments"][0]["ann"]
(False, None)
>>> CheckpointManifest.from_body(body, "manifest-000000000003.json") == m
True
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamrag.errors import CorruptStateError

__all__ = ["CheckpointManifest", "SegmentEntry"]


class SegmentEntry(msgspec.Struct, frozen=True):
    """One segment of a checkpoint: its rows so far and the files holding them."""

    id: int
    rows: int
    file: str
    """The Arrow file of its rows."""
    sealed: bool
    """False for the growing segment (which grows on after the checkpoint)."""
    ann: str | None = None
    """Its saved ANN structure (HNSW graph), if any; absent in format 1."""


class CheckpointManifest(msgspec.Struct, frozen=True):
    """Everything a checkpoint of one epoch writes into its manifest file."""

    epoch: int
    parent: int | None
    restored_from: int | None
    """The epoch a rollback restored, when this epoch is one."""
    dim: int
    next_rid: int
    next_segment: int
    high: int
    """The newest event time committed (µs)."""
    compacted_floor: int
    rolled_back: tuple[tuple[int, int], ...]
    """Ranges of epochs made unreadable by rollbacks, both ends included."""
    compactions: int
    last_compaction_us: int | None
    committed_at_us: int
    stamps: str
    """The Arrow file of the row stamps (``rid, sup, valid_to, dead``)."""
    deletes: str
    """The Arrow file of the delete log."""
    epochs: str
    """The Arrow file of each epoch's newest event time."""
    segments: tuple[SegmentEntry, ...]
    history: bool = True
    cursor: str | None = None
    """The msgpack file of the stream cursor; absent when no cursor was committed."""
    files: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    """Size and CRC-32 of every file named above (format 2), checked on open."""

    def to_body(self) -> dict[str, Any]:
        """The JSON object of the manifest file (without format number and checksum)."""
        body: dict[str, Any] = msgspec.to_builtins(self)
        if body["cursor"] is None:
            del body["cursor"]
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any], path: object) -> CheckpointManifest:
        """A manifest file's object as a typed manifest; a missing or bad field is damage."""
        try:
            return msgspec.convert(body, cls)
        except msgspec.ValidationError as exc:
            raise CorruptStateError(path, f"its manifest does not parse ({exc})") from None
