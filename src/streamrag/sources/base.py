"""The source contract: read raw records, and say where to resume.

A :class:`Source` is a frozen *spec* (a path, a topic name). ``build(resume)``
turns it into a :class:`SourceReader`, the live object that reads. A reader's
``snapshot()`` is its resume position — for a file, the byte offset after the
last record it returned — so a restart that passes that snapshot back to
``build`` continues exactly there, with nothing skipped and nothing read twice.

Readers return :class:`RawBatch` objects: undecoded lines plus the offset of
each one. Decoding and validation happen in the next stage (:mod:`streamrag.ingest`),
so a malformed record can be dead-lettered with its exact source and offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["RawBatch", "Source", "SourceReader"]


@dataclass(frozen=True, slots=True)
class RawBatch:
    """Raw records read from one partition of a source (one file, one topic partition).

    ``offsets[i]`` is where ``lines[i]`` starts; ``end_offset`` is the resume
    position after the last line. A reader that cuts a runaway record short says
    how long it really was in ``sizes`` (line index → bytes), so the error names it.
    """

    source: str
    lines: list[bytes]
    offsets: list[int]
    end_offset: int
    sizes: dict[int, int] | None = None

    def __len__(self) -> int:
        return len(self.lines)


@runtime_checkable
class SourceReader(Protocol):
    """A live reader over a source's partitions."""

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """Return what is available now, at most about ``max_bytes``; never blocks.

        ``final=True`` says no more data will come (a bounded replay), so a last
        line without a trailing newline is returned too.
        """
        ...

    def snapshot(self) -> dict[str, int]:
        """Resume position of every partition (partition name → offset)."""
        ...

    def backlog_bytes(self) -> int:
        """Bytes available but not yet returned (0 when caught up)."""
        ...

    def close(self) -> None:
        """Release files and connections."""
        ...


@runtime_checkable
class Source(Protocol):
    """A spec of where changes come from; ``build`` makes the reader."""

    def build(self, resume: Mapping[str, int] | None = None) -> SourceReader:
        """Open a reader that starts at ``resume`` (or at the beginning)."""
        ...
