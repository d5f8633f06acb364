"""A test kit for streamrag pipelines: drive time by hand, script the input, watch the output.

* :class:`ManualClock` — processing time that moves only when told.
* :class:`ScriptedSource` — an in-memory source you push lines into. Offsets
  are positions in its script, so resume positions are easy to check. The script
  can also hold markers: :data:`EOF` (the stream ends), :data:`CRASH` (the
  process dies there, once: :class:`ScriptedCrash`), :data:`PAUSE` (the next
  poll finds nothing) and ``WATERMARK(t)`` (the source's own watermark).
* :class:`Timeline` — builds such a script step by step and refuses what no
  correct source could do (a watermark going backwards, data after the end, a
  change below a watermark not marked late).
* :class:`ListSink` — records every commit a pipeline makes.
* :class:`CountingEmbedder` — wraps an embedder and records what it embedded
  (to prove unchanged chunks are not embedded again).
* :class:`FakeEmbedder` — the deterministic hashing embedder, small by default.

>>> clock = ManualClock(1_000)
>>> clock.advance_ms(5); clock.now_us()
6000
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.embed.base import Embedder
from streamrag.embed.hashing import HashingEmbedder
from streamrag.errors import ArgumentError, SourceError, StateError, TimestampError
from streamrag.index.base import CommitBatch, CommitResult
from streamrag.sources.base import RawBatch
from streamrag.timing import (
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    US_PER_MS,
    Timestamp,
    parse_timestamp,
)

__all__ = [
    "CRASH",
    "EOF",
    "PAUSE",
    "WATERMARK",
    "CountingEmbedder",
    "FakeEmbedder",
    "ListSink",
    "ManualClock",
    "Marker",
    "ScriptItem",
    "ScriptedCrash",
    "ScriptedReader",
    "ScriptedSource",
    "Timeline",
    "Watermark",
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


class Marker(enum.Enum):
    """A point in a scripted stream that is not a record.

    * ``EOF`` — the partition ends here. The reader that reaches it returns what
      came before, then nothing, and reports no backlog: what a final read of a
      file at its end does. Its snapshot lies past the marker, so a reader built
      from it continues with whatever the script holds after (Bytewax's
      ``TestingSource.EOF`` behaves the same way).
    * ``CRASH`` — the reader dies here, the way a killed process does: the poll
      that reaches it returns what came before, and the next poll raises
      :class:`ScriptedCrash`. Each ``CRASH`` fires once (it is remembered by the
      source), so a reader rebuilt from an earlier snapshot passes it by, like
      Bytewax's ``TestingSource.ABORT``.
    * ``PAUSE`` — the source has no data for a while: the next poll returns
      nothing, and the backlog does not count what lies beyond the pause.
      Several in a row make several empty polls.
    """

    EOF = "eof"
    CRASH = "crash"
    PAUSE = "pause"

    def __repr__(self) -> str:
        return self.name


EOF = Marker.EOF
CRASH = Marker.CRASH
PAUSE = Marker.PAUSE


@dataclass(frozen=True, slots=True)
class Watermark:
    """A scripted source watermark: no later record has an event time below ``time``.

    The reader closes the batch it is reading at this point and that batch
    carries :attr:`~streamrag.sources.base.RawBatch.watermark` ``= time`` (the
    batch is empty when nothing came before the marker in that poll). Beam's
    ``TestStream.advance_watermark_to`` is the same idea. ``time`` is a
    :data:`~streamrag.timing.Timestamp` (µs).

    >>> WATERMARK(5_000_000)
    Watermark(time=5000000)
    """

    time: Timestamp


WATERMARK = Watermark
"""``WATERMARK(t)``: the marker for a scripted watermark at ``t`` µs."""

ScriptItem = bytes | Marker | Watermark
"""One entry of a script: a record (one line, no newline) or a marker."""


class ScriptedCrash(BaseException):
    """A scripted source reached a ``CRASH`` marker: the process "dies" here.

    It derives from :class:`BaseException`, as :class:`KeyboardInterrupt` does,
    so that no ``except Exception`` on the way up — a retry, a dead-letter
    guard — can swallow it: nothing catches a SIGKILL either. A test catches
    it, abandons what the process held (``index.abandon()``), and builds the
    next pipeline from the committed cursor.
    """


@dataclass
class ScriptedSource:
    """An in-memory source of JSONL lines; push lines (or dicts) while a test runs.

    Its one partition is ``name``, and an offset is a position in the script
    ``lines``, so resume positions are easy to check. Besides records the script
    may hold markers (:data:`EOF`, :data:`CRASH`, :data:`PAUSE`,
    ``WATERMARK(t)``; see :class:`Marker`); each marker takes a position of its
    own. The script says anything, even what a broken source would do (a
    watermark going backwards); :class:`Timeline` builds only scripts a correct
    source could produce.

    >>> src = ScriptedSource()
    >>> src.push({"doc_id": "a", "event_time": 1}, PAUSE, {"doc_id": "b", "event_time": 2}, EOF)
    >>> reader = src.build()
    >>> [b.lines for b in reader.poll(1 << 20)]
    [[b'{"doc_id": "a", "event_time": 1}']]
    >>> reader.poll(1 << 20), reader.backlog_bytes()  # the pause: nothing now
    ([], 32)
    >>> [b.offsets for b in reader.poll(1 << 20)], reader.ended, reader.snapshot()
    ([[2]], True, {'scripted': 4})
    """

    name: str = "scripted"
    lines: list[ScriptItem] = field(default_factory=list)
    fired: set[int] = field(default_factory=set, repr=False, compare=False)
    """Positions of the ``CRASH`` markers that have fired: each fires once."""
    acked: list[tuple[int, tuple[int, ...]]] = field(default_factory=list, compare=False)
    """What each commit acknowledged: (position, offsets still waiting), in order."""

    def push(self, *items: str | bytes | Mapping[str, Any] | Marker | Watermark) -> None:
        """Append lines and markers; a mapping is written as JSON."""
        for item in items:
            if isinstance(item, Marker | Watermark | bytes):
                self.lines.append(item)
            elif isinstance(item, Mapping):
                self.lines.append(json.dumps(item).encode())
            elif isinstance(item, str):
                self.lines.append(item.encode())
            else:
                msg = (
                    f"ScriptedSource.push takes lines (str, bytes), mappings and markers; "
                    f"found {type(item).__name__} {item!r}"
                )
                raise ArgumentError(msg)

    def build(self, resume: Mapping[str, int] | None = None) -> ScriptedReader:
        """A reader that starts at script position ``resume[name]``."""
        return ScriptedReader(self, (resume or {}).get(self.name, 0))


class ScriptedReader:
    """Reads a :class:`ScriptedSource`'s script; its position is the next item's index."""

    def __init__(self, spec: ScriptedSource, position: int) -> None:
        self._spec = spec
        self._pos = position
        self._ended = False
        self._crashed = False

    @property
    def ended(self) -> bool:
        """True once the reader has passed an ``EOF`` marker."""
        return self._ended

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """The records up to the next marker that stops reading, about ``max_bytes`` of them.

        At least one record comes back when one is available. ``final`` changes
        nothing: scripted records are always complete lines.
        """
        spec = self._spec
        script = spec.lines
        if self._crashed:
            msg = (
                f"the reader of {spec.name!r} crashed at position {self._pos}; build a new "
                "reader from a snapshot, as a restarted process would"
            )
            raise StateError(msg)
        if self._pos > len(script):
            msg = (
                f"{spec.name}: resume position {self._pos} lies past the end of the script "
                f"({len(script)} items); was the source replaced by a shorter one?"
            )
            raise SourceError(msg)
        if self._ended:
            return []
        out: list[RawBatch] = []
        lines: list[bytes] = []
        offsets: list[int] = []
        size = 0
        pos = self._pos
        while pos < len(script):
            item = script[pos]
            if isinstance(item, bytes):
                if (out or lines) and size >= max_bytes:
                    break
                lines.append(item)
                offsets.append(pos)
                size += len(item)
                pos += 1
            elif isinstance(item, Watermark):
                pos += 1
                out.append(RawBatch(spec.name, lines, offsets, pos, watermark=item.time))
                lines, offsets = [], []
            elif item is PAUSE:
                if not out and not lines:
                    pos += 1  # this poll is the pause
                break
            elif item is EOF:
                pos += 1
                self._ended = True
                break
            elif pos in spec.fired:  # a CRASH that has fired already
                pos += 1
            elif out or lines:
                break  # return what came before; the next poll crashes
            else:
                spec.fired.add(pos)
                self._pos = pos
                self._crashed = True
                msg = f"scripted crash of {spec.name!r} at position {pos}"
                raise ScriptedCrash(msg)
        self._pos = pos
        if lines:
            out.append(RawBatch(spec.name, lines, offsets, pos))
        return out

    def snapshot(self) -> dict[str, int]:
        """The position of the next script item."""
        return {self._spec.name: self._pos}

    def backlog_bytes(self) -> int:
        """Bytes of the records available now: up to the next ``PAUSE`` or ``EOF``."""
        if self._ended:
            return 0
        total = 0
        for item in self._spec.lines[self._pos :]:
            if item is PAUSE or item is EOF:
                break
            if isinstance(item, bytes):
                total += len(item)
        return total

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Record what a commit acknowledged (as ``AcknowledgesCommits`` readers do)."""
        name = self._spec.name
        if name in positions:
            self._spec.acked.append((positions[name], tuple(waiting.get(name, ()))))

    def close(self) -> None:
        """Nothing to release."""


class Timeline:
    """A script for a :class:`ScriptedSource` that refuses impossible timelines.

    A stream has rules that a test input can break by mistake, and then the test
    checks nothing real. Each step is checked when it is added, and an
    impossible one raises :class:`~streamrag.errors.ArgumentError`:

    * a watermark never goes backwards;
    * nothing follows ``eof()``;
    * a change whose event time is below a watermark already emitted is late —
      the source broke its promise — so it must say so: ``add(..., late=True)``.
      Marking a change late that is not is refused too;
    * every change added has an event time to check (``raw()`` adds lines that
      are meant to be refused by the decoder, unchecked).

    Times are :data:`~streamrag.timing.Timestamp` µs or ISO-8601 strings; a
    change's event time is read as the decoder reads it (epoch seconds or ISO).
    The steps follow Beam's ``TestStream`` (``add_elements``,
    ``advance_watermark_to``) and Bytewax's ``TestingSource`` markers.

    >>> tl = (
    ...     Timeline()
    ...     .add(change_line("a", 10, "first"))
    ...     .watermark("1970-01-01T00:00:20Z")
    ...     .add(change_line("b", 5, "late on purpose"), late=True)
    ...     .pause()
    ...     .crash()
    ...     .add(change_line("c", 30, "after the restart"))
    ...     .eof()
    ... )
    >>> src = tl.source()
    >>> reader = src.build()
    >>> [(b.offsets, b.watermark) for b in reader.poll(1 << 20)]
    [([0], 20000000), ([2], None)]
    >>> reader.poll(1 << 20)  # the pause
    []
    >>> reader.poll(1 << 20)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamrag.testing.ScriptedCrash: scripted crash of 'scripted' at position 4
    >>> restarted = src.build(reader.snapshot())
    >>> [b.offsets for b in restarted.poll(1 << 20)], restarted.ended
    ([[5]], True)
    >>> Timeline().watermark(20).watermark(10)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamrag.errors.ArgumentError: a watermark never goes backwards: watermark(10) follows ...
    """

    def __init__(self) -> None:
        self._items: list[ScriptItem] = []
        self._watermark: Timestamp | None = None
        self._eof_at: int | None = None

    @property
    def items(self) -> list[ScriptItem]:
        """The script so far (a copy)."""
        return list(self._items)

    @property
    def current_watermark(self) -> Timestamp | None:
        """The last watermark emitted, or None before the first."""
        return self._watermark

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Timeline({self._items!r})"

    def _open(self, step: str) -> None:
        if self._eof_at is not None:
            msg = (
                f"cannot {step} after eof() (item {self._eof_at}): nothing follows the end of "
                "a stream; end the timeline later, or script the next run as a new Timeline"
            )
            raise ArgumentError(msg)

    def add(self, *changes: str | bytes | Mapping[str, Any], late: bool = False) -> Timeline:
        """Append changes (JSONL lines or mappings), each checked against the watermark.

        ``late=True`` says the changes are late on purpose: below the watermark.
        """
        for change in changes:
            self._open("add a change")
            line = _as_line(change)
            t = _event_time(line)
            wm = self._watermark
            below = wm is not None and t < wm
            if below and not late:
                msg = (
                    f"change {line.decode(errors='replace')} has event time {t} µs, below "
                    f"the watermark {wm} already emitted, which promised no such change "
                    "would follow; add it with late=True to script a late change, or move "
                    "the watermark after it"
                )
                raise ArgumentError(msg)
            if late and not below:
                msg = (
                    f"change {line.decode(errors='replace')} is marked late but its event "
                    f"time {t} µs is not below the watermark ({wm}); drop late=True"
                )
                raise ArgumentError(msg)
            self._items.append(line)
        return self

    def raw(self, *lines: str | bytes) -> Timeline:
        """Append lines unchecked: malformed records meant for the dead-letter store."""
        for line in lines:
            self._open("add a line")
            self._items.append(_as_line(line))
        return self

    def watermark(self, t: Timestamp | str) -> Timeline:
        """Emit a watermark: nothing below ``t`` (µs, or ISO-8601) follows."""
        self._open("emit a watermark")
        if isinstance(t, str):
            try:
                t = parse_timestamp(t)
            except TimestampError as exc:
                msg = f"watermark({t!r}): {exc}"
                raise ArgumentError(msg) from exc
        elif isinstance(t, bool) or not isinstance(t, int):
            msg = f"a watermark is a Timestamp (int µs) or an ISO-8601 string; found {t!r}"
            raise ArgumentError(msg)
        if not MIN_TIMESTAMP <= t <= MAX_TIMESTAMP:
            msg = f"watermark {t} is outside [MIN_TIMESTAMP, MAX_TIMESTAMP]"
            raise ArgumentError(msg)
        wm = self._watermark
        if wm is not None and t < wm:
            msg = (
                f"a watermark never goes backwards: watermark({t}) follows watermark({wm}); "
                f"a source promised with the first that nothing below {wm} follows"
            )
            raise ArgumentError(msg)
        self._watermark = t
        self._items.append(Watermark(t))
        return self

    def pause(self, polls: int = 1) -> Timeline:
        """The source has nothing for ``polls`` polls."""
        self._open("pause")
        if polls < 1:
            msg = f"pause(polls={polls}): a pause lasts at least one poll"
            raise ArgumentError(msg)
        self._items.extend([PAUSE] * polls)
        return self

    def crash(self) -> Timeline:
        """The process dies here (once): the next poll raises :class:`ScriptedCrash`."""
        self._open("crash")
        self._items.append(CRASH)
        return self

    def eof(self) -> Timeline:
        """The stream ends here; nothing may follow."""
        self._open("end the stream again")
        self._eof_at = len(self._items)
        self._items.append(EOF)
        return self

    def source(self, name: str = "scripted", *, crashes: bool = True) -> ScriptedSource:
        """A :class:`ScriptedSource` playing this timeline.

        ``crashes=False`` disarms the ``CRASH`` markers (each is passed by as if it
        had fired), for the uninterrupted run to compare with: the records keep
        the same offsets.
        """
        src = ScriptedSource(name, list(self._items))
        if not crashes:
            src.fired.update(i for i, item in enumerate(self._items) if item is CRASH)
        return src


def _as_line(item: str | bytes | Mapping[str, Any]) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, Mapping):
        return json.dumps(item).encode()
    msg = f"a timeline change is a JSONL line (str, bytes) or a mapping; found {item!r}"
    raise ArgumentError(msg)


def _event_time(line: bytes) -> Timestamp:
    """The event time of a change line, read as the decoder reads it."""
    try:
        record = json.loads(line)
        return parse_timestamp(record["event_time"])
    except (ValueError, KeyError, TypeError, TimestampError) as exc:
        msg = (
            f"cannot read the event time of {line.decode(errors='replace')!r} ({exc}); "
            "a timeline checks every change against its watermarks; add a line that is "
            "meant to be refused with Timeline.raw()"
        )
        raise ArgumentError(msg) from None


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
