"""The dead-letter store: where records that cannot be applied are kept.

Nothing is dropped silently. A record that fails decoding, validation or a later
stage is written here — one JSON object per line with the raw input, its source
and offset, the stage that refused it and the reason — and counted. A person can
read the file, fix the records and feed them back as a new input file.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from streamrag.timing import Timestamp, format_timestamp

__all__ = ["DeadLetter", "DeadLetterStore"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused record and why."""

    source: str
    offset: int
    stage: str
    reason: str
    raw: str
    time: str = ""


class DeadLetterStore:
    """An append-only JSONL file of :class:`DeadLetter` records, with counts.

    ``truncate=True`` starts an empty file: right for a job that rebuilds its
    index from the start of its input, so that a restart does not list the same
    bad record twice.
    """

    def __init__(self, path: Path, *, truncate: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate or not self.path.exists():
            self.path.write_text("", encoding="utf-8")
        self._lock = threading.Lock()
        self.by_stage: Counter[str] = Counter()
        if not truncate:
            for letter in self.read():
                self.by_stage[letter.stage] += 1

    @property
    def count(self) -> int:
        """How many records are in the store."""
        return sum(self.by_stage.values())

    def add_many(self, letters: list[DeadLetter], now_us: Timestamp) -> None:
        """Append records and flush them to the file."""
        if not letters:
            return
        stamp = format_timestamp(now_us)
        lines = []
        for letter in letters:
            row = asdict(letter)
            row["time"] = stamp
            lines.append(json.dumps(row, ensure_ascii=False))
            self.by_stage[letter.stage] += 1
        # Bad records are rare: open, append and close each time, so nothing
        # stays open and every record is on disk when this returns.
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    def read(self) -> Iterator[DeadLetter]:
        """Yield every record stored so far."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield DeadLetter(**json.loads(line))

    def close(self) -> None:
        """Nothing to release: the file is opened per write."""
