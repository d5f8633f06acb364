"""Several sources read as one: the configured input plus the replay folder.

Partition names (file paths, topic partitions) are unique across the sources,
so one resume map serves them all: each source gets the entries it owns.
``streamrag deadletter replay`` writes fixed records into the replay folder,
which every job reads alongside its configured source.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from streamrag.sources.base import (
    AcknowledgesCommits,
    GroupsWatermarks,
    RawBatch,
    ReportsHealth,
    SourceReader,
    Wakes,
)

__all__ = ["MultiSource", "MultiSourceReader", "OwnsPartitions"]


@runtime_checkable
class OwnsPartitions(Protocol):
    """A source spec that can tell its partitions from another's."""

    def owns(self, partition: str) -> bool:
        """Whether ``partition`` is one of this source's."""
        ...

    def build(self, resume: Mapping[str, int] | None = None) -> SourceReader:
        """Open a reader that starts at ``resume``."""
        ...


@dataclass(frozen=True, slots=True)
class MultiSource:
    """Sources read together, in order, within one read budget."""

    sources: Sequence[OwnsPartitions]

    def build(self, resume: Mapping[str, int] | None = None) -> MultiSourceReader:
        """Open every source at its own part of ``resume``."""
        resume = dict(resume or {})
        readers = [s.build({k: v for k, v in resume.items() if s.owns(k)}) for s in self.sources]
        return MultiSourceReader(readers)


class MultiSourceReader:
    """Polls each reader in turn; positions and backlog are the union of theirs."""

    def __init__(self, readers: Sequence[SourceReader]) -> None:
        self.readers = list(readers)

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """What every reader has, up to about ``max_bytes`` in all."""
        out: list[RawBatch] = []
        budget = max_bytes
        for reader in self.readers:
            if budget <= 0:
                break
            got = reader.poll(budget, final=final)
            out.extend(got)
            # Bytes of the records, not offset spans: offsets need not count bytes
            # (a Redis id, a log sequence number). A batch may carry only a watermark.
            budget -= sum(len(line) for b in got for line in b.lines)
        return out

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Pass the last commit on to every reader that acknowledges commits."""
        for reader in self.readers:
            if isinstance(reader, AcknowledgesCommits):
                reader.committed(positions, waiting)

    def wake_on(self, event: threading.Event) -> None:
        """Let every reader that can be woken set ``event``."""
        for reader in self.readers:
            if isinstance(reader, Wakes):
                reader.wake_on(event)

    @property
    def wakes(self) -> bool:
        """Whether every reader wakes the job itself (then an idle job need not poll)."""
        return all(isinstance(r, Wakes) for r in self.readers)

    @property
    def groups_watermarks(self) -> bool:
        """Whether any reader names watermark inputs (else every partition is its own)."""
        return any(isinstance(r, GroupsWatermarks) for r in self.readers)

    def watermark_input(self, partition: str) -> str:
        """The watermark input the owning reader names for ``partition`` (else itself)."""
        for reader in self.readers:
            if isinstance(reader, GroupsWatermarks):
                named = reader.watermark_input(partition)
                if named != partition:
                    return named
        return partition

    def health(self) -> dict[str, Any]:
        """Each connector's report (see :class:`~streamrag.sources.base.ReportsHealth`)."""
        out: dict[str, Any] = {}
        for reader in self.readers:
            if isinstance(reader, ReportsHealth):
                out.update(reader.health())
        return out

    def snapshot(self) -> dict[str, int]:
        """Resume position of every partition of every source."""
        merged: dict[str, int] = {}
        for reader in self.readers:
            merged.update(reader.snapshot())
        return merged

    def backlog_bytes(self) -> int:
        """Bytes available in all sources but not yet returned."""
        return sum(r.backlog_bytes() for r in self.readers)

    def close(self) -> None:
        """Close every reader."""
        for reader in self.readers:
            reader.close()
