"""A test kit for streamrag pipelines: drive time by hand, script the input, watch the output.

* :class:`ManualClock` — processing time that moves only when told.
* :class:`ScriptedSource` — an in-memory source you push lines into. Offsets
  are line numbers, so resume positions are easy to check.
* :class:`ListSink` — records every commit a pipeline makes.
* :class:`CountingEmbedder` — wraps an embedder and records what it embedded
  (to prove unchanged chunks are not embedded again).
* :class:`FakeEmbedder` — the deterministic hashing embedder, small by default.

>>> clock = ManualClock(1_000)
>>> clock.advance_ms(5); clock.now_us()
6000
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.embed.base import Embedder
from streamrag.embed.hashing import HashingEmbedder
from streamrag.errors import ArgumentError
from streamrag.index.base import CommitBatch, CommitResult
from streamrag.sources.base import RawBatch
from streamrag.timing import US_PER_MS, Timestamp

__all__ = [
    "CountingEmbedder",
    "FakeEmbedder",
    "ListSink",
    "ManualClock",
    "ScriptedSource",
    "change_line",
]


class ManualClock:
    """A clock for tests: time stands still until :meth:`advance_us` is called."""

    def __init__(self, start_us: Timestamp = 0) -> None:
        self._now = start_us

    def now_us(self) -> Timestamp:
        """The current manual time."""
        return self._now

    def advance_us(self, delta_us: int) -> None:
        """Move time forward by ``delta_us``."""
        if delta_us < 0:
            msg = f"a ManualClock only moves forward; got {delta_us}"
            raise ArgumentError(msg)
        self._now += delta_us

    def advance_ms(self, delta_ms: int) -> None:
        """Move time forward by ``delta_ms`` milliseconds."""
        self.advance_us(delta_ms * US_PER_MS)

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"


@dataclass
class ScriptedSource:
    """An in-memory source of JSONL lines; push lines (or dicts) while a test runs."""

    name: str = "scripted"
    lines: list[bytes] = field(default_factory=list)

    def push(self, *items: str | bytes | Mapping[str, Any]) -> None:
        """Append lines; a mapping is written as JSON."""
        for item in items:
            if isinstance(item, Mapping):
                self.lines.append(json.dumps(item).encode())
            elif isinstance(item, str):
                self.lines.append(item.encode())
            elif isinstance(item, bytes):
                self.lines.append(item)

    def build(self, resume: Mapping[str, int] | None = None) -> _ScriptedReader:
        """A reader that starts at line ``resume[name]``."""
        return _ScriptedReader(self, (resume or {}).get(self.name, 0))


class _ScriptedReader:
    def __init__(self, spec: ScriptedSource, position: int) -> None:
        self._spec = spec
        self._pos = position

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        lines = self._spec.lines
        if self._pos >= len(lines):
            return []
        taken: list[bytes] = []
        size = 0
        start = self._pos
        while self._pos < len(lines) and (not taken or size < max_bytes):
            taken.append(lines[self._pos])
            size += len(lines[self._pos])
            self._pos += 1
        return [RawBatch(self._spec.name, taken, list(range(start, self._pos)), self._pos)]

    def snapshot(self) -> dict[str, int]:
        return {self._spec.name: self._pos}

    def backlog_bytes(self) -> int:
        return sum(len(x) for x in self._spec.lines[self._pos :])

    def close(self) -> None:
        return None


@dataclass
class ListSink:
    """Collects ``(CommitBatch, CommitResult)`` pairs; pass ``sink.on_commit`` to a pipeline."""

    commits: list[tuple[CommitBatch, CommitResult]] = field(default_factory=list)

    def on_commit(self, batch: CommitBatch, result: CommitResult) -> None:
        """Record one commit."""
        self.commits.append((batch, result))

    @property
    def epochs(self) -> list[int]:
        """Epochs committed, in order."""
        return [r.epoch for _, r in self.commits]


class CountingEmbedder:
    """Wraps an embedder and keeps every text it was asked to embed."""

    def __init__(self, inner: Embedder | None = None) -> None:
        self.inner = inner or FakeEmbedder()
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        """The wrapped embedder's dimension."""
        return self.inner.dim

    @property
    def version(self) -> str:
        """The wrapped embedder's version."""
        return self.inner.version

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Record and delegate."""
        self.texts.extend(texts)
        return self.inner.embed_many(texts)


class FakeEmbedder(HashingEmbedder):
    """The deterministic hashing embedder at 64 dimensions: fast, for tests."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim=dim)


def change_line(
    doc_id: str,
    event_time: str | int,
    text: str | None = None,
    *,
    op: str = "upsert",
    **extra: Any,
) -> str:
    """One JSONL change line, for building test inputs.

    >>> change_line("d1", 0, "hi", domain="ops")
    '{"doc_id": "d1", "op": "upsert", "event_time": 0, "text": "hi", "domain": "ops"}'
    """
    record: dict[str, Any] = {"doc_id": doc_id, "op": op, "event_time": event_time}
    if text is not None:
        record["text"] = text
    record.update(extra)
    return json.dumps(record)
