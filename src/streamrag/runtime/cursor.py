"""The stream cursor: where a commit leaves the stream, and how a restart resumes from it.

Every commit writes a cursor in the same write-ahead-log record as its
documents, so the index and the stream position can never disagree. A cursor
holds:

* ``positions`` — the read position of every source partition (a byte offset
  for files) after the last record read;
* ``pending`` — the offsets of the changes read but still waiting in the
  batcher: they are below ``positions`` but not in the index yet;
* ``watermarks`` and ``late`` — the event-time stage's watermark state and its
  late counts;
* ``stats`` — the pipeline's counts as they are once the commit is in;
* ``windows`` — the state of each window aggregation that changed since the
  previous commit (written as ``window:NAME`` keys, so the index keeps the
  newest of each across commits: see :func:`streamrag.index.base.merge_cursor`);
* ``audit`` — what the commit did (changes, chunks embedded and reused, why
  the batch was cut).

A restart (:class:`Rewind`) starts each partition at its oldest waiting change.
Below the committed position it takes again only the changes that were
waiting — they go straight to the batcher, since the windows and counts already
hold them — and skips the rest, which were committed or dead-lettered; from the
committed position on it reads as usual.

>>> c = Cursor(positions={"a.jsonl": 120}, pending={"a.jsonl": [40, 80]})
>>> Cursor.from_mapping(c.to_mapping()) == c
True
>>> r = Rewind(c)
>>> r.resume, r.waiting
({'a.jsonl': 40}, 2)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from streamrag.batching import MicroBatcher
from streamrag.errors import SourceError, StreamragError
from streamrag.eventtime import EventTimeStage
from streamrag.sources.base import RawBatch, SourceReader

__all__ = [
    "CURSOR_FORMAT",
    "Cursor",
    "CursorKeeper",
    "PollGate",
    "Rewind",
    "Sifted",
    "check_forward",
]

CURSOR_FORMAT = 2
"""Version of the cursor layout written with each commit.

Format 2 writes the position of each partition that moved as its own
``position:PART`` key, so a commit of a job with 10,000 partitions (a folder of
10,000 files) writes the few that moved, not all of them; format 1 wrote every
position in one ``positions`` map, and is still read.
"""

_READS = (1, 2)
_WINDOW = "window:"
_POSITION = "position:"

log = logging.getLogger("streamrag.pipeline")


class Cursor(msgspec.Struct, kw_only=True):
    """Where the stream stands once a commit is in (see the module docstring)."""

    format: int = CURSOR_FORMAT
    positions: dict[str, int] = {}
    pending: dict[str, list[int]] = {}
    watermarks: dict[str, Any] = {}
    late: dict[str, int] = {}
    stats: dict[str, Any] = {}
    windows: dict[str, Any] = {}
    audit: dict[str, Any] | None = None
    base: dict[str, int] | None = None
    """The positions of the commit before (not stored): only the partitions that moved
    since are written. None writes every position, as format 1 did."""

    @property
    def waiting(self) -> int:
        """Changes that were waiting in the batcher at this commit."""
        return sum(len(v) for v in self.pending.values())

    def to_mapping(self) -> dict[str, Any]:
        """The cursor as the index stores it: plain values, one ``window:NAME`` key per window.

        With a :attr:`base`, the positions that moved since are written one
        ``position:PART`` key each (format 2; the index keeps the newest of each
        key across commits). Without one, every position goes in ``positions``,
        in the key order of the first format.
        """
        out: dict[str, Any] = {"format": self.format if self.base is None else CURSOR_FORMAT}
        if self.base is None:
            out["positions"] = self.positions
        out["pending"] = self.pending
        out["watermarks"] = self.watermarks
        out["late"] = self.late
        out["stats"] = self.stats
        if self.base is not None:
            base = self.base
            for part, off in self.positions.items():
                if base.get(part) != off:
                    out[_POSITION + part] = off
        for name, state in self.windows.items():
            out[_WINDOW + name] = state
        if self.audit is not None:
            out["audit"] = self.audit
        return out

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Cursor:
        """A cursor read back from the index; refuses a layout this version cannot read."""
        if raw.get("format") not in _READS:
            msg = (
                f"the index holds a stream cursor of format {raw.get('format')!r}; this "
                f"streamrag writes format {CURSOR_FORMAT}: upgrade streamrag, or delete the "
                "state directory and replay the input"
            )
            raise StreamragError(msg)
        fields = {
            k: v for k, v in raw.items() if not k.startswith((_WINDOW, _POSITION)) and v is not None
        }
        fields["positions"] = {
            **raw.get("positions", {}),
            **{k[len(_POSITION) :]: v for k, v in raw.items() if k.startswith(_POSITION)},
        }
        fields["windows"] = {
            k[len(_WINDOW) :]: v for k, v in raw.items() if k.startswith(_WINDOW) and v is not None
        }
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as exc:
            msg = f"the index holds a stream cursor that cannot be read: {exc}"
            raise StreamragError(msg) from None


@dataclass(slots=True)
class Sifted:
    """A read after a restart, cut at the committed position."""

    again: list[RawBatch]
    """Changes that were waiting at the last commit: to the batcher, uncounted."""
    fresh: list[RawBatch]
    """Records past the committed position: read as usual."""
    skipped: int
    """Records below it that were committed or refused: dropped."""
    superseded: int = 0
    """Waiting changes the source did not return again: it replaced them with newer reads."""


class Rewind:
    """Which records a restart reads again, from the cursor of the last commit.

    ``resume`` is where each partition starts. While a partition is below its
    committed position, :meth:`sift` keeps only its waiting changes;
    ``waiting`` counts those not read again yet (they are still uncommitted).
    """

    def __init__(self, cursor: Cursor | None) -> None:
        self._guard: dict[str, tuple[int, frozenset[int]]] = {}
        self._unseen: dict[str, set[int]] = {}
        self.resume: dict[str, int] = {}
        if cursor is None:
            return
        self.resume = dict(cursor.positions)
        for part, offsets in cursor.pending.items():
            if offsets:
                self.resume[part] = min(self.resume.get(part, offsets[0]), offsets[0])
                self._guard[part] = (cursor.positions.get(part, 0), frozenset(offsets))
                self._unseen[part] = set(offsets)

    @property
    def active(self) -> bool:
        """True while some partition is still below its committed position."""
        return bool(self._guard)

    @property
    def waiting(self) -> int:
        """Changes waiting at the last commit that have not been read again yet."""
        return sum(len(v) for v in self._unseen.values())

    def rewinding(self, part: str) -> bool:
        """True while partition ``part`` is read again below its committed position."""
        return part in self._guard

    def sift(self, raws: list[RawBatch]) -> Sifted:
        """Cut a read at the committed positions (see the class docstring).

        The changes in ``again`` leave :attr:`waiting`: the caller counts them
        as being read, under the same lock as it reads :attr:`waiting`.
        """
        out = Sifted([], [], 0)
        for raw in raws:
            guard = self._guard.get(raw.source)
            if guard is None:
                out.fresh.append(raw)
                continue
            read_to, waiting = guard
            again = [i for i, off in enumerate(raw.offsets) if off < read_to and off in waiting]
            fresh = [i for i, off in enumerate(raw.offsets) if off >= read_to]
            out.skipped += len(raw) - len(again) - len(fresh)
            if again:
                out.again.append(raw.subset(again))
                self._unseen.get(raw.source, set()).difference_update(raw.offsets[i] for i in again)
            if fresh:
                out.fresh.append(raw.subset(fresh))
            if raw.end_offset >= read_to:
                out.superseded += self._passed(raw.source)
        return out

    def _passed(self, part: str) -> int:
        """Partition ``part`` is past its committed position; returns the waiting ones not seen.

        A source may legitimately not return a waiting change at its old offset:
        a database snapshot cut short by a crash is read again in a new
        generation, a file changed while the job was down is read as its new
        version. Those changes are *superseded*: their newer reads are counted
        and applied instead.
        """
        del self._guard[part]
        lost = self._unseen.pop(part, set())
        if lost:
            log.warning(
                "%s: %d changes that were waiting at the last commit were not read again "
                "at their offsets (the source replaced them with newer reads); offsets %s",
                part,
                len(lost),
                sorted(lost)[:10],
            )
        return len(lost)

    def positions(self, read: dict[str, int], waiting: dict[str, list[int]]) -> None:
        """Complete a capture: waiting records not read again yet are still waiting.

        ``read`` (the reader's positions) and ``waiting`` (the batcher's) are
        updated in place; a partition never moves back from its committed position.
        """
        for part, (read_to, offsets) in self._guard.items():
            at = read.get(part, 0)
            read[part] = max(at, read_to)
            rest = [o for o in offsets if o >= at]
            if rest:
                waiting[part] = sorted({*waiting.get(part, []), *rest})


def check_forward(before: Mapping[str, int], now: Mapping[str, int], rewind: Rewind) -> None:
    """Offsets only move forward (except while a restart rewinds a partition)."""
    for part, off in now.items():
        if off < before.get(part, 0) and not rewind.rewinding(part):
            msg = (
                f"source partition {part} moved back from offset {before[part]} to {off}; "
                "offsets only move forward"
            )
            raise SourceError(msg)


class PollGate:
    """Lets the committer take the cursor between two polls, never during one.

    A poll moves records from the source into the batcher; a capture reads the
    source positions and the batcher's waiting offsets. Taken at one instant,
    they describe the same records.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._polling = False
        self._capturing = False

    @contextmanager
    def polling(self) -> Iterator[None]:
        """Held while a poll moves records from the source to the batcher."""
        with self._cond:
            while self._capturing:
                self._cond.wait()
            self._polling = True
        try:
            yield
        finally:
            with self._cond:
                self._polling = False
                self._cond.notify_all()

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Held while the committer reads positions and waiting offsets (no poll runs)."""
        with self._cond:
            self._capturing = True
            while self._polling:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()


class CursorKeeper:
    """The pipeline's side of the cursor: restore from the last commit, capture the next.

    It remembers the read positions and window versions of the last commit, so
    a capture checks that offsets moved forward and writes only the windows
    whose state changed since.
    """

    def __init__(self, cursor: Cursor | None, resume: Mapping[str, int] | None) -> None:
        self.cursor = cursor
        self.rewind = Rewind(cursor)
        self.gate = PollGate()
        self.resume = self.rewind.resume if cursor is not None else dict(resume or {})
        self.positions: dict[str, int] = dict(self.resume if cursor is None else cursor.positions)
        self._versions: dict[str, int] = {}
        self._captured: dict[str, int] = {}

    def restore(self, event_time: EventTimeStage) -> None:
        """Watermarks and windows as they were at the committed cursor."""
        c = self.cursor
        if c is None:
            return
        windows = {w.name: c.windows[w.name] for w in event_time.windows if w.name in c.windows}
        event_time.restore({"watermarks": c.watermarks, "late": c.late, "windows": windows})
        self._versions = dict(event_time.versions)

    def capture(
        self,
        reader: SourceReader,
        batcher: MicroBatcher,
        event_time: EventTimeStage,
        stats: Callable[[], dict[str, Any]],
    ) -> Cursor:
        """The cursor for the commit being made (call it holding ``gate.capturing()``)."""
        positions = reader.snapshot()
        check_forward(self.positions, positions, self.rewind)
        waiting = batcher.positions()  # the batch being committed has left it
        self.rewind.positions(positions, waiting)
        versions = dict(event_time.versions)
        changed = {
            w.name: w.operator.snapshot()
            for w in event_time.windows
            if versions[w.name] != self._versions.get(w.name)
        }
        counts = stats()
        self._captured = versions
        return Cursor(
            base=dict(self.positions),
            positions=positions,
            pending=waiting,
            watermarks=event_time.tracker.snapshot(),
            late=dict(event_time.late_counts),
            stats=counts,
            windows=changed,
        )

    def committed(self, cursor: Cursor) -> None:
        """The captured cursor is in the index: the next capture starts from it."""
        self._versions = self._captured
        self.positions = cursor.positions
