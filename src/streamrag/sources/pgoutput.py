"""Parse the messages of PostgreSQL's ``pgoutput`` logical-decoding plugin (protocol 1).

The layout is the manual's "Logical Replication Message Formats" chapter: every
message starts with one type byte; integers are big-endian; strings end with a
NUL byte. A :class:`Relation` message describes a table (its columns, which of
them form the replica-identity key, their type OIDs) and comes before the first
change of that table in a session and again after its schema changed; changes
name the relation by OID. Column values come in their text form;
:func:`convert` turns those of the common types into JSON values.

>>> import struct
>>> msg = b"B" + struct.pack(">qqi", 0x16B3748, 0, 731)
>>> parse(msg)
Begin(final_lsn=23803720, commit_time_us=946684800000000, xid=731)
>>> convert(23, "42"), convert(16, "t"), convert(1184, "2024-01-02 03:04:05.5+00")
(42, True, '2024-01-02T03:04:05.5+00:00')
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from streamrag.errors import DecodeError
from streamrag.sources.base import RawBatch

__all__ = [
    "ROW_BITS",
    "SNAP_BITS",
    "SNAP_DONE",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Other",
    "Out",
    "Outbox",
    "Relation",
    "Truncate",
    "TypeMsg",
    "Update",
    "convert",
    "envelope",
    "fmt_lsn",
    "ident",
    "lsn_of",
    "parse",
    "parse_lsn",
    "quoted",
    "row_values",
    "wal_offset",
]

PG_EPOCH_US = 946_684_800_000_000
"""2000-01-01T00:00:00Z in Unix microseconds: PostgreSQL's timestamps count from it."""

UNCHANGED = object()
"""An unchanged TOAST value: the server did not send it (see :func:`row_values`)."""

_BOOL = {16}
_INT = {20, 21, 23, 26, 28}  # int8, int2, int4, oid, xid
_FLOAT = {700, 701}
_NUMERIC = {1700}
_JSON = {114, 3802}
_TIMESTAMP = {1114, 1184}  # timestamp, timestamptz


def convert(type_oid: int, text: str | None) -> Any:
    """A column's text form as a JSON value: numbers, booleans, JSON; ISO timestamps; else text."""
    if text is None:
        return None
    try:
        if type_oid in _BOOL:
            return text == "t"
        if type_oid in _INT:
            return int(text)
        if type_oid in _FLOAT:
            value = float(text)
            return value if value == value and value not in (float("inf"), float("-inf")) else text
        if type_oid in _NUMERIC:
            if text in ("NaN", "Infinity", "-Infinity"):
                return text
            return int(text) if "." not in text and "e" not in text.lower() else float(text)
        if type_oid in _JSON:
            return json.loads(text)
    except ValueError:
        return text
    if type_oid in _TIMESTAMP:
        return _iso(text)
    return text


def _iso(text: str) -> str:
    """PostgreSQL's ``2024-01-02 03:04:05+00`` as ISO-8601 (``T``, ``+00:00``)."""
    out = text.replace(" ", "T", 1)
    tail = out[-3:]
    if len(out) > 19 and tail[0] in "+-" and tail[1:].isdigit():
        out += ":00"
    return out


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a relation: name, type OID, and whether it is part of the key."""

    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts; ``final_lsn`` is where its commit record is."""

    final_lsn: int
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction ends: its commit record at ``commit_lsn``, the next one at ``end_lsn``."""

    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape as of the changes that follow."""

    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        """``schema.table``."""
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class TypeMsg:
    """A user-defined type's name (the values still come as text)."""

    oid: int
    schema: str
    name: str


Tuple = tuple[Any, ...]
"""One row's values: the text of each column, None for NULL, :data:`UNCHANGED`."""


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row."""

    relation: int
    new: Tuple


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row; ``old`` is the old key (``K``) or old row (``O``) when the server sent it."""

    relation: int
    old: Tuple | None
    old_kind: str | None
    new: Tuple


@dataclass(frozen=True, slots=True)
class Delete:
    """A removed row: its key (``K``) or, with REPLICA IDENTITY FULL, its whole row (``O``)."""

    relation: int
    old: Tuple
    old_kind: str


@dataclass(frozen=True, slots=True)
class Truncate:
    """Tables emptied at once (no per-row deletes follow)."""

    relations: tuple[int, ...]
    options: int


@dataclass(frozen=True, slots=True)
class Other:
    """A message this reader does not act on (origin, logical message, stream control)."""

    kind: str


Message = Begin | Commit | Relation | TypeMsg | Insert | Update | Delete | Truncate | Other


class _Buf:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            msg = f"pgoutput message cut short at byte {self.pos}"
            raise DecodeError(msg)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            msg = f"pgoutput string without its NUL at byte {self.pos}"
            raise DecodeError(msg)
        text = self.data[self.pos : end].decode("utf-8", "replace")
        self.pos = end + 1
        return text

    def tuple_data(self) -> Tuple:
        n = self.take(">H")
        values: list[Any] = []
        for _ in range(n):
            kind = self.take(">c")
            if kind == b"n":
                values.append(None)
            elif kind == b"u":
                values.append(UNCHANGED)
            elif kind in (b"t", b"b"):
                length = self.take(">i")
                if self.pos + length > len(self.data):
                    msg = "pgoutput column value cut short"
                    raise DecodeError(msg)
                raw = self.data[self.pos : self.pos + length]
                self.pos += length
                values.append(raw.decode("utf-8", "replace") if kind == b"t" else raw)
            else:
                msg = f"pgoutput column of unknown kind {kind!r}"
                raise DecodeError(msg)
        return tuple(values)


def parse(data: bytes) -> Message:
    """One pgoutput message; raises :class:`DecodeError` on bytes that are not one."""
    if not data:
        msg = "empty pgoutput message"
        raise DecodeError(msg)
    kind = chr(data[0])
    buf = _Buf(data)
    buf.pos = 1
    if kind == "B":
        lsn, ts, xid = buf.take(">Q"), buf.take(">q"), buf.take(">I")
        return Begin(lsn, ts + PG_EPOCH_US, xid)
    if kind == "C":
        buf.take(">B")
        commit, end, ts = buf.take(">Q"), buf.take(">Q"), buf.take(">q")
        return Commit(commit, end, ts + PG_EPOCH_US)
    if kind == "R":
        oid, schema, name = buf.take(">I"), buf.string(), buf.string()
        ident = chr(buf.take(">B"))
        cols = []
        for _ in range(buf.take(">H")):
            flags, col = buf.take(">B"), buf.string()
            type_oid, _typmod = buf.take(">I"), buf.take(">i")
            cols.append(Column(col, type_oid, bool(flags & 1)))
        return Relation(oid, schema, name, ident, tuple(cols))
    if kind == "Y":
        return TypeMsg(buf.take(">I"), buf.string(), buf.string())
    if kind == "I":
        oid = buf.take(">I")
        buf.take(">c")  # 'N'
        return Insert(oid, buf.tuple_data())
    if kind == "U":
        oid = buf.take(">I")
        tag = buf.take(">c")
        old = old_kind = None
        if tag in (b"K", b"O"):
            old_kind, old = tag.decode(), buf.tuple_data()
            tag = buf.take(">c")
        if tag != b"N":
            msg = f"pgoutput update without its new tuple (got {tag!r})"
            raise DecodeError(msg)
        return Update(oid, old, old_kind, buf.tuple_data())
    if kind == "D":
        oid = buf.take(">I")
        tag = buf.take(">c").decode()
        return Delete(oid, buf.tuple_data(), tag)
    if kind == "T":
        n, options = buf.take(">I"), buf.take(">B")
        return Truncate(tuple(buf.take(">I") for _ in range(n)), options)
    return Other(kind)


def row_values(
    relation: Relation, values: Tuple, fallback: Tuple | None = None, *, keys_only: bool = False
) -> dict[str, Any]:
    """A tuple as ``{column: JSON value}`` by the relation's columns.

    An unchanged TOAST value (the server leaves out large values an UPDATE did
    not touch) is taken from ``fallback`` (the old row, sent with REPLICA
    IDENTITY FULL) or else left out. ``keys_only`` keeps only key columns that
    were sent (an old-key tuple holds NULL in the other columns).
    """
    if len(values) != len(relation.columns):
        msg = (
            f"pgoutput tuple of {relation.qualified} has {len(values)} columns, "
            f"its relation {len(relation.columns)}"
        )
        raise DecodeError(msg)
    out: dict[str, Any] = {}
    for i, (col, value) in enumerate(zip(relation.columns, values, strict=True)):
        if keys_only and not col.key:
            continue
        if value is UNCHANGED:
            if fallback is None or fallback[i] is UNCHANGED:
                continue
            value = fallback[i]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out[col.name] = convert(col.type_oid, value)
    return out


# -- positions and names (the offsets of postgres.PostgresSource) --------------------

ROW_BITS = 18
SNAP_BITS = 40
SNAP_DONE = (1 << SNAP_BITS) - 1


def wal_offset(lsn: int, row: int = 0) -> int:
    """The WAL partition offset of row ``row`` of the transaction committed at ``lsn``."""
    return lsn << ROW_BITS | row


def lsn_of(offset: int) -> int:
    """The LSN a WAL partition offset stands for (where streaming resumes)."""
    return offset >> ROW_BITS


def parse_lsn(text: str) -> int:
    """``16/B374D848`` as an integer."""
    hi, _, lo = text.partition("/")
    return int(hi, 16) << 32 | int(lo, 16)


def fmt_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def ident(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quoted(table: str) -> str:
    """``schema.table`` quoted for SQL."""
    schema, _, name = table.partition(".")
    return f"{ident(schema)}.{ident(name)}"


def envelope(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    op: str,
    rel: Relation,
    ts_us: int,
    lsn: int,
    name: str,
) -> bytes:
    """One row change as a Debezium-shaped JSON envelope (``source`` names the connector)."""
    source = {
        "ts_ms": ts_us // 1000,
        "ts_us": ts_us,
        "schema": rel.schema,
        "table": rel.name,
        "lsn": lsn,
        "connector": "postgresql",
        "name": name,
    }
    body = {"before": before, "after": after, "op": op, "source": source}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


# -- records read and not handed out yet --------------------------------------------


@dataclass(slots=True)
class Out:
    """One record of a partition (or, with ``line`` None, only a new position)."""

    partition: str
    line: bytes | None
    offset: int
    end: int
    time_us: int


class Outbox:
    """Records in the order they were read, handed out as :class:`RawBatch` runs.

    >>> box = Outbox("pg")
    >>> box.push(Out("wal", b"a", 8, 9, 5)); box.push(Out("wal", None, 16, 16, 5))
    >>> positions = {}
    >>> [(b.offsets, b.end_offset) for b in box.drain(1 << 20, positions)], positions
    ([([8], 16)], {'wal': 16})
    """

    def __init__(self, decoder: str) -> None:
        self.decoder = decoder
        self.items: deque[Out] = deque()
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.items)

    def push(self, out: Out) -> None:
        """Queue a record or a position."""
        self.items.append(out)
        self.bytes += len(out.line or b"")

    def drain(self, max_bytes: int, positions: dict[str, int]) -> list[RawBatch]:
        """About ``max_bytes`` of records (at least one); ``positions`` moves past them."""
        batches: list[RawBatch] = []
        budget = max_bytes
        lines: list[bytes] = []
        offsets: list[int] = []
        times: list[int | None] = []
        part: str | None = None
        while self.items and (budget > 0 or not batches):
            item = self.items.popleft()
            size = len(item.line or b"")
            self.bytes -= size
            budget -= size
            positions[item.partition] = item.end
            if item.line is None:
                if batches and part == item.partition:
                    batches[-1] = self._batch(part, lines, offsets, times, item.end)
                continue
            if part != item.partition or not batches:
                part, lines, offsets, times = item.partition, [], [], []
                batches.append(self._batch(part, lines, offsets, times, item.end))
            lines.append(item.line)
            offsets.append(item.offset)
            times.append(item.time_us)
            batches[-1] = self._batch(part, lines, offsets, times, item.end)
        return batches

    def _batch(
        self, part: str, lines: list[bytes], offsets: list[int], times: list[int | None], end: int
    ) -> RawBatch:
        return RawBatch(part, lines, offsets, end, decoder=self.decoder, times=times)
