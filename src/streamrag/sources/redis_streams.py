"""Redis Streams, read in a consumer group and acknowledged once streamrag has committed.

Each stream key is one partition, ``redis:<name>:<stream>``. An entry's
``field`` value (``data`` by default) is the record, its ``key_field`` value
the record's key, the millisecond part of its id the record's time.

**Offsets.** An entry id ``ms-seq`` becomes ``ms * 2**20 + seq``
(:func:`entry_offset`; :func:`offset_id` turns it back). The packing keeps the
order of ids, fits 63 bits (ms below 2**43, the year 2248) and makes
``offset + 1`` the next id there can be, so a batch's ``end_offset`` is its last
offset plus one. An id whose sequence reaches 2**20 (a million entries in one
millisecond, or hand-written ids such as ``0-5000000``) cannot be packed: every
poll raises a :class:`~streamrag.errors.SourceError` naming it rather than skip
it. Auto ids (``XADD key * ...``) never come near the limit.

**Reading.** The group (created with ``MKSTREAM`` from id 0 if missing, so
entries already there are read) delivers; streamrag's own cursor is the resume
position, as for every source. A reader built at ``resume`` reads each stream
in three steps: (1) it claims (``XAUTOCLAIM ... JUSTID``) what other consumers
of the group held unacknowledged for ``claim_idle_ms`` or more (one that
crashed, or this job under an earlier consumer name); (2) it reads its own
pending entries again in id order (``XREADGROUP`` from id 0), now merged with
what it claimed: those below the resume position were committed (the crash came
between the commit and the ``XACK``) and are acknowledged and skipped, the rest
come back at the same offsets, so the changes waiting in the batcher at the last
commit are found again (:class:`streamrag.runtime.cursor.Rewind` skips those
committed since); (3) new entries (``XREADGROUP ... >``), all with higher ids.
Claiming before the re-read keeps each partition's offsets rising. Claims happen
at the start only: entries another consumer has held for less than
``claim_idle_ms`` stay with it (it may be alive). The group belongs to the job: a
fresh state directory continues where the group stands (destroy the group, or
name a new one, to index a stream from its start again).

**Delivery.** Exactly once into the index (the cursor decides); at least once
from Redis's point of view. ``XACK`` comes only after a commit
(:meth:`RedisSourceReader.committed`): every entry below the committed position
that is not waiting in the batcher; until then it stays in the group's pending
list, which is what a restart reads again. An entry without ``field`` is still
one record: its line is a short text no decoder accepts (it starts with ``<``)
naming the missing field and the fields present, so it becomes one dead letter
at its offset; so does a pending entry deleted (``XDEL``, trimming) before its
commit.

**Connections.** Calls have short socket timeouts and no client-side retries;
a failure goes to :class:`~streamrag.sources.health.ConnectionHealth` and the
poll returns nothing until the back-off has run, then reconnects and first reads
its pending entries again from the last one it had (a reply lost in flight). A
background thread waits with ``XREAD BLOCK`` on its own connection (consuming
nothing of the group) and wakes the job when an entry arrives. A poll takes well
under a millisecond on a local server; a server that stops answering can hold
one up to :data:`SOCKET_TIMEOUT_S`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from streamrag.config import RedisSourceSettings
from streamrag.errors import ConfigError, SourceError
from streamrag.sources.base import RawBatch
from streamrag.sources.health import ConnectionHealth, redact
from streamrag.timing import US_PER_MS, Clock

__all__ = ["SEQ_BITS", "RedisSource", "RedisSourceReader", "entry_offset", "offset_id"]

log = logging.getLogger("streamrag.sources.redis")

SEQ_BITS = 20
"""Bits of an offset that hold the entry id's sequence number."""
_SEQ_LIMIT = 1 << SEQ_BITS
_MS_LIMIT = 1 << (63 - SEQ_BITS)

SOCKET_TIMEOUT_S = 5.0
"""Longest wait for a reply of the server (a non-blocking command answers in microseconds)."""
CONNECT_TIMEOUT_S = 2.0
"""Longest wait for a new connection."""

_MAX_COUNT = 1000
_PAGE = ("COUNT", 1000, "JUSTID")
_WAKE_BLOCK_MS = 500
_SETUP, _CLAIM, _PEL, _LIVE = "setup", "claim", "pel", "live"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")


def entry_offset(entry_id: bytes | str, stream: str = "?") -> int:
    """The offset of entry id ``ms-seq``: ``ms * 2**20 + seq``, ordered like the ids.

    >>> entry_offset(b"1700000000000-3") == 1700000000000 * 2**20 + 3
    True
    >>> offset_id(entry_offset("5-7") + 1)
    '5-8'
    """
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms_text, _, seq_text = text.partition("-")
    ms, seq = int(ms_text), int(seq_text or 0)
    if seq >= _SEQ_LIMIT or ms >= _MS_LIMIT:
        msg = (
            f"redis entry {text} of stream {stream!r} cannot be given an offset: streamrag "
            f"packs an id ms-seq into ms * 2**{SEQ_BITS} + seq, which needs seq below "
            f"{_SEQ_LIMIT:,} and ms below 2**{63 - SEQ_BITS}; write entries with auto ids "
            "(XADD key * ...), or delete this one (XDEL) and acknowledge it (XACK)"
        )
        raise SourceError(msg)
    return (ms << SEQ_BITS) | seq


def offset_id(offset: int) -> str:
    """The entry id ``ms-seq`` of an offset (the inverse of :func:`entry_offset`)."""
    return f"{offset >> SEQ_BITS}-{offset & (_SEQ_LIMIT - 1)}"


@dataclass(frozen=True, slots=True)
class RedisSource:
    """Redis Streams read by consumer ``consumer`` of group ``group``, one partition per stream.

    Delivery: exactly once into the index. The resume position of partition
    ``redis:<name>:<stream>`` is the packed id (:func:`entry_offset`) after the
    last entry returned. A restart claims what crashed consumers held, reads
    its own pending entries again at the same offsets, then new ones; ``XACK``
    comes only once a commit holds an entry (see the module docstring).
    """

    name: str
    streams: tuple[str, ...]
    url: str = "redis://127.0.0.1:6379/0"
    password_env: str | None = None
    group: str = "streamrag"
    consumer: str = "streamrag"
    field: str = "data"
    key_field: str | None = "key"
    claim_idle_ms: int = 30_000
    decoder: str | None = None
    """The decoder its batches name (the source's name when built from settings)."""
    backoff_s: tuple[float, float] = (0.2, 30.0)
    """First and longest wait between reconnects."""
    clock: Clock | None = dataclasses.field(default=None, compare=False)
    """The clock of the reconnect back-off (tests inject one)."""

    def __post_init__(self) -> None:
        if not self.streams:
            msg = f"redis source {self.name!r} names no stream; list the stream keys to read"
            raise ConfigError(msg)
        dup = sorted({s for s in self.streams if self.streams.count(s) > 1})
        if dup:
            msg = f"redis source {self.name!r} lists streams more than once: {', '.join(dup)}"
            raise ConfigError(msg)

    @classmethod
    def from_settings(cls, spec: RedisSourceSettings) -> RedisSource:
        """The source a ``sources:`` entry of kind ``redis`` describes."""
        same = {"url", "password_env", "group", "consumer", "field", "key_field", "claim_idle_ms"}
        args = spec.model_dump(include=same)
        return cls(name=spec.name, streams=tuple(spec.streams), decoder=spec.name, **args)

    def partition(self, stream: str) -> str:
        """The partition name of a stream key."""
        return f"redis:{self.name}:{stream}"

    def owns(self, partition: str) -> bool:
        """Whether a partition name is one of this source's streams."""
        return partition.startswith(f"redis:{self.name}:")

    def build(self, resume: Mapping[str, int] | None = None) -> RedisSourceReader:
        """Open a reader at ``resume`` (partition → packed id after the last committed entry)."""
        return RedisSourceReader(self, dict(resume or {}))


class _Entry(NamedTuple):
    offset: int
    entry_id: bytes
    line: bytes
    key: bytes | None


class _Stream:
    """Where the reader stands in one stream."""

    def __init__(self, key: str, part: str, resume: Mapping[str, int]) -> None:
        self.key = key
        self.part = part
        self.resumed = part in resume
        self.floor = int(resume.get(part, 0))
        """Entries below are committed: skipped and acknowledged."""
        self.phase = _SETUP
        self.claim_from: bytes | str = "0-0"
        self.pel_from: bytes | str = "0-0"
        self.fetched = -1
        """Offset of the last entry fetched (returned or buffered)."""
        self.fetched_id: bytes | None = None
        self.returned: int | None = None
        self.buffer: deque[_Entry] = deque()
        self.gone: list[bytes] = []
        """Pending entries the claim found deleted from the stream (they become dead letters)."""
        self.unacked: dict[int, bytes] = {}
        """Entries fetched and not acknowledged yet, offset → id, in offset order."""
        self.lag: int | None = None
        self.pending: int | None = None
        self.last_delivered: bytes | None = None

    def position(self) -> int:
        return self.floor if self.returned is None else max(self.floor, self.returned + 1)

    def report(self) -> dict[str, Any]:
        lag = None if self.lag is None else self.lag + len(self.buffer)
        position = offset_id(self.position())
        return {"lag": lag, "pending": self.pending, "phase": self.phase, "position": position}


class RedisSourceReader:
    """Reads the streams of a :class:`RedisSource` in its consumer group (see the module docstring).

    ``poll`` makes only non-blocking calls; ``committed`` acknowledges on the
    committing thread; a background thread, started by ``wake_on``, wakes the
    job when entries arrive.
    """

    def __init__(self, spec: RedisSource, resume: dict[str, int]) -> None:
        self._spec = spec
        self._password = _password(spec)
        secrets = (self._password,) if self._password else ()
        initial_s, max_s = spec.backoff_s
        self.conn = ConnectionHealth(
            "redis", clock=spec.clock, initial_s=initial_s, max_s=max_s, secrets=secrets
        )
        self._streams = [_Stream(k, spec.partition(k), resume) for k in spec.streams]
        self._field = spec.field.encode()
        self._key_field = None if spec.key_field is None else spec.key_field.encode()
        self._group = spec.group
        self._consumer = spec.consumer
        self._client: Any = self._connect()
        self._io = threading.Lock()
        """Held by poll, and by backlog and health while they read the server."""
        self._acks = threading.Lock()
        """Guards the unacknowledged entries (poll adds, the committing thread removes)."""
        self._avg = 256.0
        self._turn = 0
        self._remote = 0
        self._waker: _Waker | None = None
        self._closed = False
        self.acked = 0
        """Entries acknowledged so far."""

    def _connect(self, suffix: str = "") -> Any:
        spec = self._spec
        name = _NAME_CHARS.sub("_", f"streamrag-{spec.name}-{spec.consumer}{suffix}")
        try:
            client = redis.Redis.from_url(
                spec.url,
                password=self._password,
                retry=Retry(NoBackoff(), 0),
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                client_name=name,
                protocol=2,
            )
        except ValueError as exc:
            msg = f"redis source {spec.name!r}: url {redact(str(exc), self.conn.secrets)}"
            raise ConfigError(msg) from None
        client.set_response_callback("XAUTOCLAIM", _raw)
        return client

    # -- reading ---------------------------------------------------------------------

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """Entries available now, up to about ``max_bytes`` of lines; ``[]`` during a back-off."""
        if self._closed:
            return []
        with self._io:
            if not self.conn.due():
                return []
            taken: list[tuple[_Stream, list[_Entry]]] = []
            budget = max(1, max_bytes)
            n = len(self._streams)
            start = self._turn % n
            self._turn += 1
            try:
                for st in self._streams[start:] + self._streams[:start]:
                    if budget <= 0:
                        break
                    got: list[_Entry] = []
                    taken.append((st, got))
                    budget = self._take(st, budget, got)
                self.conn.ok()
            except RedisError as exc:
                self._lost(exc)
            except SourceError:
                if not any(got for _, got in taken):
                    raise
                # What came before the bad entry goes on; the next poll raises.
            return self._batches(taken)

    def _take(self, st: _Stream, budget: int, got: list[_Entry]) -> int:
        while budget > 0:
            if not st.buffer and not self._fetch(st, budget):
                break
            entry = st.buffer.popleft()
            got.append(entry)
            budget -= max(1, len(entry.line))
        return budget

    def _fetch(self, st: _Stream, budget: int) -> bool:
        """Fill the stream's buffer; False when it has nothing more now."""
        count = max(1, min(_MAX_COUNT, int(budget / self._avg) + 1))
        while True:
            if st.phase == _SETUP:
                self._setup(st)
            elif st.phase == _CLAIM:
                self._claim(st)
            elif st.phase == _PEL:
                entries = self._with_gone(st, self._read(st, st.pel_from, count))
                if not entries:
                    st.phase = _LIVE
                    continue
                if not self._accept(st, entries):
                    st.pel_from = entries[-1][0]
                if st.buffer:
                    return True
            else:
                entries = self._read(st, ">", count)
                self._accept(st, entries)
                if len(entries) < count:
                    st.lag = 0
                if st.buffer:
                    return True
                if len(entries) < count:
                    return False

    def _setup(self, st: _Stream) -> None:
        """Create the group if missing; refuse a stream that is behind the resume position."""
        self._create_group(st)
        if st.floor > 0:
            info = self._client.xinfo_stream(st.key)
            last = entry_offset(info["last-generated-id"], st.key)
            if last + 1 < st.floor:
                msg = (
                    f"redis stream {st.key!r} ends at entry {offset_id(last)}, before the "
                    f"resume position {offset_id(st.floor)} streamrag committed: the stream was "
                    "deleted or replaced. Delete the state directory to index it afresh."
                )
                raise SourceError(msg)
        st.phase = _CLAIM

    def _create_group(self, st: _Stream) -> None:
        if st.fetched_id is not None:
            at: bytes | str = st.fetched_id
        else:
            at = offset_id(st.floor - 1) if st.floor > 0 else "0"
        try:
            self._client.xgroup_create(st.key, self._group, id=at, mkstream=True)
            log.info("redis %s: created consumer group %s at %s", st.key, self._group, _text(at))
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim(self, st: _Stream) -> None:
        """Take over what other consumers held for claim_idle_ms (it is read with the PEL)."""
        claimed = 0
        while True:
            who = (st.key, self._group, self._consumer, self._spec.claim_idle_ms)
            try:
                reply = self._client.execute_command("XAUTOCLAIM", *who, st.claim_from, *_PAGE)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                st.phase = _SETUP  # the group went away meanwhile
                return
            claimed += len(reply[1])
            st.gone += reply[2] if len(reply) > 2 else []  # deleted: dead letters, in order
            if _text(reply[0]) == "0-0":
                break
            st.claim_from = reply[0]
        if claimed:
            log.info("redis %s: %d pending entries idle long enough taken over", st.key, claimed)
        st.phase, st.pel_from = _PEL, st.fetched_id or "0-0"

    def _with_gone(self, st: _Stream, entries: list[tuple[bytes, Any]]) -> list[tuple[bytes, Any]]:
        """Pending entries read again, with those the claim found deleted in their place."""
        if not st.gone:
            return entries
        limit = entry_offset(entries[-1][0], st.key) if entries else None
        n = 0
        while n < len(st.gone) and (limit is None or entry_offset(st.gone[n]) < limit):
            n += 1
        gone, st.gone = st.gone[:n], st.gone[n:]
        merged = [*entries, *((g, None) for g in gone)]
        return sorted(merged, key=lambda e: entry_offset(e[0], st.key))

    def _read(self, st: _Stream, at: bytes | str, count: int) -> list[tuple[bytes, Any]]:
        for attempt in (0, 1):
            try:
                reply = self._client.xreadgroup(
                    self._group, self._consumer, {st.key: at}, count=count
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc) or attempt:
                    raise
                log.warning("redis %s: the consumer group is gone; creating it again", st.key)
                self._create_group(st)
                continue
            return list(reply[0][1]) if reply else []
        return []

    def _accept(self, st: _Stream, entries: Sequence[tuple[bytes, Any]]) -> bool:
        """Buffer what is new; acknowledge at once what lies below the resume position.

        An id that cannot be packed stops the stream there (returns True): what
        came before it is kept, and the pending entries are read again from it,
        so every poll after says so (:func:`entry_offset` raises).
        """
        offsets: list[int] = []
        bad: SourceError | None = None
        try:
            for eid, _ in entries:
                offsets.append(entry_offset(eid, st.key))
        except SourceError as exc:
            bad = exc
        below: list[bytes] = []
        with self._acks:
            for off, (eid, fields) in zip(offsets, entries, strict=False):
                if off <= st.fetched:
                    continue  # a group moved back (XGROUP SETID) delivers it again: had it
                st.fetched, st.fetched_id = off, eid
                st.unacked[off] = eid
                if off < st.floor:
                    below.append(eid)
                    continue
                line = self._line(st, eid, fields)
                key = None if self._key_field is None or not fields else fields.get(self._key_field)
                st.buffer.append(_Entry(off, eid, line, key))
                self._avg = 0.9 * self._avg + 0.1 * len(line)
        if below:
            self._ack(st, below)
        if bad is not None:
            st.phase, st.pel_from = _PEL, st.fetched_id or "0-0"
            if not offsets:
                raise bad
        return bad is not None

    def _line(self, st: _Stream, eid: bytes, fields: Mapping[bytes, bytes] | None) -> bytes:
        """The record of an entry; a text no decoder accepts when there is none."""
        if not fields:
            return (
                f"<redis entry {_text(eid)} of stream {st.key!r} was deleted (XDEL or "
                "trimming) before streamrag committed it>"
            ).encode()
        value = fields.get(self._field)
        if value is not None:
            return bytes(value)
        names = ", ".join(repr(_text(k)) for k in list(fields)[:20])
        return (
            f"<redis entry {_text(eid)} of stream {st.key!r} has no field "
            f"{self._spec.field!r}, which should hold the record; its fields: {names}>"
        ).encode()

    def _batches(self, taken: list[tuple[_Stream, list[_Entry]]]) -> list[RawBatch]:
        out = []
        for st, got in taken:
            if not got:
                continue
            st.returned = got[-1].offset
            out.append(
                RawBatch(
                    st.part,
                    [e.line for e in got],
                    [e.offset for e in got],
                    got[-1].offset + 1,
                    decoder=self._spec.decoder,
                    keys=None if self._key_field is None else [e.key for e in got],
                    times=[(e.offset >> SEQ_BITS) * US_PER_MS for e in got],
                )
            )
        return out

    def _lost(self, exc: BaseException) -> None:
        """A call failed: back off; afterwards read the pending entries again from the last one."""
        self.conn.failed(exc)
        log.warning("redis source %s: %s", self._spec.name, self.conn.last_error)
        for st in self._streams:
            if st.phase == _LIVE:
                st.phase, st.pel_from = _PEL, st.fetched_id or "0-0"

    # -- acknowledging -----------------------------------------------------------------

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """``XACK`` every entry below ``positions`` that is not in ``waiting`` (after a commit)."""
        for st in self._streams:
            pos = positions.get(st.part)
            if pos is None:
                continue
            keep = set(waiting.get(st.part, ()))
            with self._acks:
                done = []
                for off, eid in st.unacked.items():
                    if off >= pos:
                        break
                    if off not in keep:
                        done.append(eid)
            if done and not self._ack(st, done):
                return

    def _ack(self, st: _Stream, ids: list[bytes]) -> bool:
        try:
            for i in range(0, len(ids), _MAX_COUNT):
                self._client.xack(st.key, self._group, *ids[i : i + _MAX_COUNT])
        except RedisError as exc:  # they stay unacknowledged; the next commit tries again
            self.conn.failed(exc)
            log.warning("redis %s: XACK failed: %s", st.key, self.conn.last_error)
            return False
        acked = {entry_offset(i) for i in ids}
        with self._acks:
            for off in acked:
                st.unacked.pop(off, None)
        self.acked += len(ids)
        return True

    # -- where things stand ---------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        """Packed id after the last entry returned, per stream (the resume position if none)."""
        return {
            st.part: st.position() for st in self._streams if st.resumed or st.returned is not None
        }

    def backlog_bytes(self) -> int:
        """Bytes of records not returned yet: fetched ones, and those the group has not delivered.

        Exact up to a few hundred undelivered entries per stream, extrapolated
        from them beyond; while the reader still re-reads its pending entries,
        those count too (an upper bound).
        """
        buffered = sum(len(e.line) for st in self._streams for e in list(st.buffer))
        if self._closed or not self._io.acquire(timeout=0.2):
            return buffered + self._remote
        try:
            if self.conn.due():
                self._remote = self._remote_backlog()
        except RedisError as exc:
            self.conn.failed(exc)
        except SourceError:
            pass  # the poll says so
        finally:
            self._io.release()
        return buffered + self._remote

    def _remote_backlog(self) -> int:
        self._refresh()
        total = 0
        for st in self._streams:
            if st.phase != _LIVE and st.pending:
                total += int(st.pending * self._avg)
            if st.lag == 0 or st.last_delivered is None:
                continue
            want = _MAX_COUNT // 4 if st.lag is None else min(st.lag, _MAX_COUNT // 4)
            sample = self._client.xrange(st.key, b"(" + st.last_delivered, "+", count=want)
            size = sum(len(self._line(st, eid, fields)) for eid, fields in sample)
            if sample and st.lag is not None and st.lag > len(sample):
                size = size * st.lag // len(sample)
            total += size
        return total

    def _refresh(self) -> None:
        """Lag, pending count and last delivered id of the group, per stream (one round trip)."""
        for st in self._streams:
            if st.phase == _SETUP:
                self._setup(st)  # the group must be there to say how far behind it is
        pipe = self._client.pipeline(transaction=False)
        for st in self._streams:
            pipe.xinfo_groups(st.key)
        replies = pipe.execute(raise_on_error=False)
        for st, groups in zip(self._streams, replies, strict=True):
            if isinstance(groups, Exception) and not isinstance(groups, ResponseError):
                raise groups
            mine = [] if isinstance(groups, ResponseError) else groups  # no stream (yet)
            mine = [g for g in mine if _text(g.get("name", b"")) == self._group] or [{}]
            st.lag, st.pending = mine[0].get("lag"), mine[0].get("pending")
            st.last_delivered = mine[0].get("last-delivered-id")

    def health(self) -> dict[str, Any]:
        """Connected or not, lag (entries not read yet), pending (not acknowledged), errors."""
        if not self._closed and self._io.acquire(timeout=0.2):
            try:
                if self.conn.due():
                    self._refresh()
                    self.conn.ok()
            except RedisError as exc:
                self.conn.failed(exc)
            except SourceError:
                pass  # the poll says so
            finally:
                self._io.release()
        streams = {st.key: st.report() for st in self._streams}
        lags = [s["lag"] for s in streams.values()]
        pending = [s["pending"] for s in streams.values()]
        report = self.conn.report(
            lag=None if None in lags else sum(lags),
            pending=None if None in pending else sum(pending),
            group=self._group,
            consumer=self._consumer,
            acked=self.acked,
            streams=streams,
        )
        return {self._spec.name: report}

    # -- waking and closing ---------------------------------------------------------

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` when an entry is added to one of the streams (a background thread)."""
        if self._waker is not None or self._closed:
            return
        self._waker = _Waker(self._connect("-wake"), [st.key for st in self._streams], event)
        self._waker.start()

    def close(self) -> None:
        """Stop the wake thread and close the connections (twice is harmless)."""
        if self._closed:
            return
        self._closed = True
        if self._waker is not None:
            self._waker.stop()
        with contextlib.suppress(RedisError):
            self._client.close()


class _Waker(threading.Thread):
    """Blocks in ``XREAD`` past each stream's newest entry; sets the event when one grows."""

    def __init__(self, client: Any, keys: list[str], event: threading.Event) -> None:
        super().__init__(name="streamrag-redis-wake", daemon=True)
        self.client = client
        self.keys = keys
        self.event = event
        self._stop_event = threading.Event()

    def run(self) -> None:
        wait = 0.2
        tails: dict[str, bytes | str] | None = None
        while not self._stop_event.is_set():
            try:
                if tails is None:
                    tails = {k: self._tail(k) for k in self.keys}
                    self.event.set()  # connected (again): what came meanwhile is for a poll
                got = self.client.xread(dict(tails), count=1, block=_WAKE_BLOCK_MS)
                wait = 0.2
                for key, entries in got or []:
                    if entries:
                        self.event.set()
                        tails[_text(key)] = self._tail(_text(key))
            except RedisError as exc:
                if self._stop_event.is_set():
                    break
                log.debug("redis wake thread: %s; retrying in %.1fs", type(exc).__name__, wait)
                tails = None
                self._stop_event.wait(wait)
                wait = min(wait * 2, 5.0)
        with contextlib.suppress(RedisError):
            self.client.close()

    def _tail(self, key: str) -> bytes | str:
        newest = self.client.xrevrange(key, "+", "-", count=1)
        return newest[0][0] if newest else "0-0"

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=2 * _WAKE_BLOCK_MS / 1000 + 1)


def _password(spec: RedisSource) -> str | None:
    if spec.password_env is None:
        return None
    value = os.environ.get(spec.password_env)
    if not value:
        msg = (
            f"redis source {spec.name!r} takes its password from the environment variable "
            f"{spec.password_env}, which is not set"
        )
        raise ConfigError(msg)
    return value


def _raw(response: Any, **options: Any) -> Any:
    return response


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
