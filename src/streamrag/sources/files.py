"""Tail a JSONL file, or every ``*.jsonl`` file of a directory.

Each line is one change. The resume position of a file is the byte offset after
the last complete line returned; a line is complete once its newline is
written, so a writer that is half-way through a line is never read early.
New files that appear in a watched directory are picked up on the next poll.
The reader wakes an idle job when the file's folder changes (:meth:`JsonlSourceReader.wake_on`,
a :class:`~streamrag.sources.watch.FolderWatch` of that folder).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from streamrag.errors import SourceError
from streamrag.sources.base import RawBatch

if TYPE_CHECKING:
    from streamrag.sources.watch import FolderWatch

__all__ = ["JsonlSource", "JsonlSourceReader"]

_BLOCK = 1 << 16
_CONNECTOR = re.compile(r"^(folder|postgres|kafka|nats|redis):[A-Za-z0-9_.-]+:")
_WATCH_STEP_MS = 25
"""How often the folder watch looks at the kernel's events while idle (25-50 ms to wake)."""
_BUSY_STEP_MS = 2
"""How often it looks for two seconds after a change: a stream of appends wakes within ms."""


@dataclass(frozen=True, slots=True)
class JsonlSource:
    """A JSONL file, or a directory whose files matching ``glob`` are read in name order.

    ``max_line_bytes`` bounds memory for a runaway line: anything longer is cut
    there (and then rejected by the decoder as too large) and reading skips to
    the next newline.
    """

    path: Path
    glob: str = "*.jsonl"
    max_line_bytes: int = 1_000_001
    decoder: str | None = None
    """The decoder its batches name (None: streamrag's own change format)."""

    def owns(self, partition: str) -> bool:
        """Whether a partition name (a file path) belongs to this source."""
        if _CONNECTOR.match(partition):  # another connector's (kind:name:...), never a path
            return False
        path = Path(self.path)
        return partition == str(path) or Path(partition).parent == path

    def build(self, resume: Mapping[str, int] | None = None) -> JsonlSourceReader:
        """Open a reader at ``resume`` (file name → byte offset), or at the start."""
        return JsonlSourceReader(self, dict(resume or {}))


class JsonlSourceReader:
    """Reads complete lines from one or more files, remembering byte offsets."""

    def __init__(self, spec: JsonlSource, offsets: dict[str, int]) -> None:
        self._spec = spec
        self._offsets = offsets
        self._watch: FolderWatch | None = None

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` when anything changes in the folder of the file (or the folder read).

        A thread watches that folder (not recursively) from the first call on;
        a folder that does not exist yet is waited for. Lines are still found by
        reading the files on each poll, so a lost event costs freshness, never data.
        """
        if self._watch is None:
            from streamrag.sources.watch import FolderWatch

            path = Path(self._spec.path)
            folder = path if path.is_dir() or path.suffix == "" else path.parent
            self._watch = FolderWatch(
                folder.absolute(),
                recursive=False,
                keep_paths=False,
                step_ms=_WATCH_STEP_MS,
                busy_step_ms=_BUSY_STEP_MS,
                name="streamrag-watch-jsonl",
            )
            self._watch.wake_on(event)
            self._watch.start()
        else:
            self._watch.wake_on(event)

    def _files(self) -> list[Path]:
        path = Path(self._spec.path)
        if path.is_dir():
            return sorted(p for p in path.glob(self._spec.glob) if p.is_file())
        if path.exists():
            return [path]
        return []

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """Read complete lines from every file, up to about ``max_bytes`` in all."""
        batches: list[RawBatch] = []
        budget = max_bytes
        for file in self._files():
            if budget <= 0:
                break
            batch = self._read(file, budget, final)
            if batch is not None:
                batches.append(batch)
                budget -= batch.end_offset - batch.offsets[0]
        return batches

    def _read(self, file: Path, budget: int, final: bool) -> RawBatch | None:
        name = str(file)
        start = self._offsets.get(name, 0)
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            return None
        if size < start:
            msg = (
                f"{name} shrank to {size} bytes below the resume offset {start}; streamrag "
                "reads append-only files. Write new data to a new file in the watched directory."
            )
            raise SourceError(msg)
        if size == start:
            return None
        with open(file, "rb") as fh:
            fh.seek(start)
            data = fh.read(min(budget, size - start))
            lines: list[bytes] = []
            offsets: list[int] = []
            pos = 0
            end = len(data)
            while pos < end:
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break
                if nl > pos:  # skip blank lines, but keep their bytes consumed
                    lines.append(data[pos:nl])
                    offsets.append(start + pos)
                pos = nl + 1
            consumed = pos
            sizes = None
            if not lines and pos < end:
                # One line longer than the budget: keep its head, skip to its end.
                head, line_end, length = self._long_line(fh, start + end, data[pos:], final, size)
                if line_end is None:
                    return None
                lines.append(head)
                offsets.append(start + pos)
                consumed = line_end - start
                if length > len(head):
                    sizes = {0: length}
            elif final and consumed < end and start + end == size:
                tail = data[consumed:]
                if tail.strip():
                    lines.append(tail)
                    offsets.append(start + consumed)
                consumed = end
        if consumed == 0:
            return None
        self._offsets[name] = start + consumed
        if not lines:
            return None
        return RawBatch(name, lines, offsets, start + consumed, sizes, decoder=self._spec.decoder)

    def _long_line(
        self, fh: BinaryIO, pos: int, head: bytes, final: bool, size: int
    ) -> tuple[bytes, int | None, int]:
        """Find the end of a line that did not fit: its head, end offset and whole length.

        ``pos`` is the file position after ``head``.
        """
        limit = self._spec.max_line_bytes
        kept = bytearray(head[:limit])
        length = len(head)
        while True:
            block = fh.read(_BLOCK)
            if not block:
                if final:
                    return bytes(kept), size, length
                return b"", None, length  # the line is not complete yet
            nl = block.find(b"\n")
            if nl >= 0:
                if len(kept) < limit:
                    kept += block[: min(nl, limit - len(kept))]
                return bytes(kept), pos + nl + 1, length + nl
            if len(kept) < limit:
                kept += block[: limit - len(kept)]
            pos += len(block)
            length += len(block)

    def snapshot(self) -> dict[str, int]:
        """Byte offset after the last line returned, per file."""
        return dict(self._offsets)

    def backlog_bytes(self) -> int:
        """Bytes written to the files but not yet returned."""
        total = 0
        for file in self._files():
            try:
                total += max(0, os.path.getsize(file) - self._offsets.get(str(file), 0))
            except FileNotFoundError:
                continue
        return total

    def close(self) -> None:
        """Nothing stays open between polls; the folder watch, if any, stops."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
