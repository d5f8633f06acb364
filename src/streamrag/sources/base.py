"""The source contract: read raw records, and say where to resume.

A :class:`Source` is a frozen *spec* (a path, a topic name). ``build(resume)``
turns it into a :class:`SourceReader`, the live object that reads. A reader's
``snapshot()`` is its resume position — for a file, the byte offset after the
last record it returned — so a restart that passes that snapshot back to
``build`` continues exactly there, with nothing skipped and nothing read twice.

Readers return :class:`RawBatch` objects: undecoded lines plus the offset of
each one. Decoding and validation happen in the next stage (:mod:`streamrag.ingest`),
so a malformed record can be dead-lettered with its exact source and offset.

**Watermarks a source carries.** Most sources know nothing about event time,
and the event-time stage estimates a watermark for them (bounded
out-of-orderness). Some know more: a partition that is ordered by event time, or
a broker that tracks time per partition, can say "no record of this partition
with an event time below *t* will follow". Flink does this for Kafka: its
watermark strategy can run inside the Kafka consumer, one watermark per Kafka
partition, merged like any other per-partition watermark (Flink docs,
"Generating Watermarks", *Watermark Strategies and the Kafka Connector*); Beam's
``TestStream.advance_watermark_to`` scripts the same in tests. A reader passes
such a claim on in :attr:`RawBatch.watermark`. (Not to be confused with Kafka's
*high watermark*, which is an offset, not a time.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from streamrag.timing import Timestamp

__all__ = [
    "AcknowledgesCommits",
    "GroupsWatermarks",
    "RawBatch",
    "ReportsHealth",
    "Source",
    "SourceReader",
    "WakeEvent",
    "Wakes",
]


@dataclass(frozen=True, slots=True)
class RawBatch:
    """Raw records read from one partition of a source (one file, one topic partition).

    ``offsets[i]`` is where ``lines[i]`` starts; ``end_offset`` is the resume
    position after the last line. A reader that cuts a runaway record short says
    how long it really was in ``sizes`` (line index → bytes), so the error names it.

    ``decoder`` names the decoder of the lines (see
    :class:`streamrag.ingest.formats.DecoderSet`): None is streamrag's own change
    format (one JSON change per line); a connector whose records are in another
    shape (Debezium envelopes, table rows, document files) names the decoder
    that was configured for it. ``keys[i]`` is the record's key where the system
    has one (a Kafka key, a file's path) and ``times[i]`` the time the system
    stamped on it (a Kafka timestamp, a commit time), in microseconds; a decoder
    may take the event time from it.

    ``watermark`` is an explicit watermark the source itself carries, or None
    when it has none (the file sources). It holds *after* the batch's last line:
    no record of this partition read after this batch has an event time below
    it. Records inside the batch may be below it — they came before the claim.
    A source never sends a partition's watermark backwards, and a batch may
    carry a watermark and no lines at all (time moved on, nothing arrived), so a
    reader of batches must not assume ``offsets[0]`` exists.

    >>> RawBatch("orders-0", [b'{"doc_id": "a"}'], [41], 42, watermark=1_000_000)
    ... # doctest: +NORMALIZE_WHITESPACE
    RawBatch(source='orders-0', lines=[b'{"doc_id": "a"}'], offsets=[41], end_offset=42,
             sizes=None, watermark=1000000, decoder=None, keys=None, times=None)
    """

    source: str
    lines: list[bytes]
    offsets: list[int]
    end_offset: int
    sizes: dict[int, int] | None = None
    watermark: Timestamp | None = None
    decoder: str | None = None
    keys: list[bytes | None] | None = None
    times: list[Timestamp | None] | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def subset(self, keep: Sequence[int]) -> RawBatch:
        """The records at positions ``keep`` (in that order), with their keys, times and sizes."""
        sizes = self.sizes or {}
        kept = {j: sizes[i] for j, i in enumerate(keep) if i in sizes}
        return RawBatch(
            self.source,
            [self.lines[i] for i in keep],
            [self.offsets[i] for i in keep],
            self.end_offset,
            kept or None,
            decoder=self.decoder,
            keys=None if self.keys is None else [self.keys[i] for i in keep],
            times=None if self.times is None else [self.times[i] for i in keep],
        )


@runtime_checkable
class SourceReader(Protocol):
    """A live reader over a source's partitions."""

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """Return what is available now, at most about ``max_bytes``; never blocks.

        ``final=True`` says no more data will come (a bounded replay), so a last
        line without a trailing newline is returned too. At least one record
        comes back when one is available, however small ``max_bytes`` is. A
        batch may hold no lines when it carries a watermark; with nothing to
        say, the poll returns ``[]``.
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
class AcknowledgesCommits(Protocol):
    """A reader whose system wants to hear what streamrag has committed.

    streamrag's own resume position is the cursor in its write-ahead log, so
    exactly-once never depends on this call. But a queue keeps unacknowledged
    messages for redelivery (NATS JetStream, Redis Streams), a database keeps
    its log until a replication slot is confirmed (PostgreSQL), and a consumer
    group's lag is watched in Kafka's own offsets. After every commit the
    pipeline tells the reader: in each partition, every record below
    ``positions[p]`` is applied or dead-lettered, except those whose offsets
    are in ``waiting[p]`` (read, but in a later micro-batch). Acknowledge
    exactly those; the call repeats the whole state each time, so a failed
    acknowledgement is made good by the next one. It runs on the committing
    thread, after the commit is durable: an error is logged and counted, never
    undoes the commit.
    """

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Acknowledge what the last commit made durable (see the class docstring)."""
        ...


@runtime_checkable
class Source(Protocol):
    """A spec of where changes come from; ``build`` makes the reader."""

    def build(self, resume: Mapping[str, int] | None = None) -> SourceReader:
        """Open a reader that starts at ``resume`` (or at the beginning)."""
        ...


@runtime_checkable
class Wakes(Protocol):
    """A reader that can say when new data may be there, so an idle job sleeps.

    Without it the job polls an idle source every ``source.poll_interval_ms``.
    A reader that is woken by its system (file-system events, a broker pushing
    messages to its client) sets ``event`` when a poll may find something; the
    job then sleeps on that event, with a long safety timeout, instead of polling.
    Setting it too often costs a poll; setting it too rarely costs freshness.
    """

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` whenever a poll may return something new."""
        ...


class WakeEvent(threading.Event):
    """The job's wake event: a :class:`threading.Event` that knows whether the job waits on it.

    A source that wakes the job by polling its system in fine steps (the
    folder watch) needs to step finely only while the job waits: a job busy
    reading a backlog looks again anyway. :meth:`reading_for` says for how long
    nobody has waited.
    """

    def __init__(self) -> None:
        super().__init__()
        self._count = threading.Lock()
        self._waiting = 0
        self._since = time.monotonic()  # when the last waiter went back to work

    def wait(self, timeout: float | None = None) -> bool:
        """Wait as :meth:`threading.Event.wait` does, counted."""
        with self._count:
            self._waiting += 1
        try:
            return super().wait(timeout)
        finally:
            with self._count:
                self._waiting -= 1
                if self._waiting == 0:
                    self._since = time.monotonic()

    def reading_for(self, now: float) -> float:
        """Seconds (``time.monotonic()``) since anyone last waited on it; 0 while someone waits."""
        with self._count:
            return 0.0 if self._waiting else max(0.0, now - self._since)


@runtime_checkable
class ReportsHealth(Protocol):
    """A reader connected to a system that can fail: it reports how that is going.

    ``/v1/status`` shows the report under ``sources``, one entry per connector:
    ``kind``, ``connected``, ``lag`` (records or bytes behind, when known),
    ``last_error`` (the last connection or read error, secrets left out),
    ``retries`` and anything the connector adds. A connector turns a lost
    connection into retries with back-off and says so here, never a crash loop.
    """

    def health(self) -> dict[str, Any]:
        """The connector's state as ``/v1/status`` shows it."""
        ...


@runtime_checkable
class GroupsWatermarks(Protocol):
    """A reader whose partitions share one watermark input.

    The event-time stage keeps a watermark per input, and by default every
    partition is an input: right for a Kafka partition, which is ordered in
    itself. A folder's partitions are its files: each one speaks once per
    version and then falls silent, so as inputs they would hold event time back
    until each went idle, and their state would grow with the folder. Such a
    reader names the input each of its partitions belongs to (the folder).
    """

    def watermark_input(self, partition: str) -> str:
        """The watermark input of ``partition`` (``partition`` itself when not this reader's)."""
        ...
