"""The dead-letter store: where records that cannot be applied are kept.

Nothing is dropped silently. A record that fails decoding, validation, a size
limit or a later stage (chunking, embedding) is written here — one JSON object
per line with the raw input, its source and offset, the stage that refused it
and the reason — and counted. ``streamrag deadletter list|show|replay`` reads
the store, and re-injects records (as they are, or fixed by hand) into the
pipeline through its replay folder.

Each record has an id: its line number in the file, from 1. The file is only
appended to, so ids are stable.

**Exactly once across crashes.** After a crash the pipeline re-reads whatever
was not committed, and would refuse the same bad records again. The store
keeps the key ``(source, offset, stage)`` of every record it holds and skips
a record whose key it already has, so each bad record appears once however
often the stream is replayed. A crash in the middle of an append leaves a torn
last line; opening the store cuts it off (it is written again on replay).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from streamrag.errors import StreamragError
from streamrag.timing import Timestamp, format_timestamp

__all__ = ["DeadLetter", "DeadLetterStore", "StoredLetter"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused record and why."""

    source: str
    offset: int
    stage: str
    reason: str
    raw: str
    time: str = ""

    @property
    def key(self) -> tuple[str, int, str]:
        """What makes a record the same record on a replay of the stream."""
        return (self.source, self.offset, self.stage)


@dataclass(frozen=True, slots=True)
class StoredLetter:
    """A dead letter as stored: its id, and where it was re-injected, if it was."""

    id: int
    letter: DeadLetter
    replayed_to: str | None = None


class DeadLetterStore:
    """An append-only JSONL file of :class:`DeadLetter` records, with counts.

    ``truncate=True`` starts an empty file (for a job that rebuilds its index
    from the start of its input). Re-injections are recorded next to it, in
    ``<name>.replayed.jsonl``.
    """

    def __init__(self, path: Path, *, truncate: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate or not self.path.exists():
            self.path.write_text("", encoding="utf-8")
            self.replay_log.unlink(missing_ok=True)
        else:
            _cut_torn_tail(self.path)
        self._lock = threading.Lock()
        self.by_stage: Counter[str] = Counter()
        self._keys: set[tuple[str, int, str]] = set()
        self._lines = 0
        for letter in self.read():
            self.by_stage[letter.stage] += 1
            self._keys.add(letter.key)
            self._lines += 1

    @property
    def replay_log(self) -> Path:
        """Where re-injections of stored records are recorded."""
        return self.path.with_name(self.path.name.removesuffix(".jsonl") + ".replayed.jsonl")

    @property
    def count(self) -> int:
        """How many records are in the store."""
        return self._lines

    def add_many(self, letters: Iterable[DeadLetter], now_us: Timestamp) -> int:
        """Append records not stored yet and flush them to the file; returns how many."""
        stamp = format_timestamp(now_us)
        lines = []
        with self._lock:
            for letter in letters:
                if letter.key in self._keys:
                    continue  # the same record refused again on a replay of the stream
                self._keys.add(letter.key)
                row = asdict(letter)
                row["time"] = stamp
                lines.append(json.dumps(row, ensure_ascii=False))
                self.by_stage[letter.stage] += 1
            if not lines:
                return 0
            # Bad records are rare: open, append and close each time, so nothing
            # stays open and every record is on disk when this returns.
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
            self._lines += len(lines)
        return len(lines)

    def read(self) -> Iterator[DeadLetter]:
        """Yield every record stored so far, oldest first."""
        for stored in self.entries():
            yield stored.letter

    def entries(self) -> Iterator[StoredLetter]:
        """Every record with its id and, if it was re-injected, where to."""
        if not self.path.exists():
            return
        replayed = self.replayed()
        with open(self.path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.endswith("\n"):
                    break  # a torn last line: not yet (or never) written whole
                if line.strip():
                    yield StoredLetter(n, DeadLetter(**json.loads(line)), replayed.get(n))

    def get(self, letter_id: int) -> StoredLetter:
        """One record by id; a clear error when there is none."""
        for stored in self.entries():
            if stored.id == letter_id:
                return stored
        msg = (
            f"no dead letter has id {letter_id} in {self.path} (it holds {self.count}); "
            "`streamrag deadletter list` shows the ids"
        )
        raise StreamragError(msg)

    def replayed(self) -> dict[int, str]:
        """Ids of re-injected records and the file each went to."""
        out: dict[int, str] = {}
        if not self.replay_log.exists():
            return out
        with open(self.replay_log, encoding="utf-8") as fh:
            for line in fh:
                if line.endswith("\n") and line.strip():
                    row = json.loads(line)
                    out[int(row["id"])] = str(row["to"])
        return out

    def mark_replayed(self, ids: Iterable[int], to: Path, now_us: Timestamp) -> None:
        """Record that these records were re-injected through ``to``."""
        stamp = format_timestamp(now_us)
        rows = [json.dumps({"id": i, "to": str(to), "time": stamp}) for i in ids]
        if rows:
            with self._lock, open(self.replay_log, "a", encoding="utf-8") as fh:
                fh.write("\n".join(rows) + "\n")

    def close(self) -> None:
        """Nothing to release: the file is opened per write."""


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line that a crash left without its newline."""
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as fh:
        fh.seek(max(0, size - 1))
        if fh.read(1) == b"\n":
            return
        # Find the last newline and cut after it (blocks from the end).
        pos = size
        keep = 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = pos + nl + 1
                break
        fh.truncate(keep)
        os.fsync(fh.fileno())
