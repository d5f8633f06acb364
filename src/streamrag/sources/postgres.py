"""PostgreSQL tables as a stream: a consistent snapshot, then logical replication (pgoutput).

The reader creates a logical replication slot with the built-in ``pgoutput``
plugin and a publication of the configured tables (both if missing), reads
each table once at the snapshot the slot exported, and then streams the
changes the slot decodes from the write-ahead log. Each row change becomes one
Debezium-shaped JSON envelope (``before``/``after``/``op``/``source``) for
:class:`streamrag.ingest.debezium.DebeziumDecoder`.

**Why psycopg2.** psycopg 3 does not speak the streaming-replication protocol
(``START_REPLICATION`` / CopyBoth); psycopg2's
:class:`~psycopg2.extras.LogicalReplicationConnection` does, with a
non-blocking ``read_message()`` and ``send_feedback()``. So this connector
needs the ``postgres`` extra (``psycopg2-binary``); streamrag itself imports
without it.

**Partitions and offsets.** ``postgres:<name>:wal`` holds the stream. The
server sends whole transactions in commit order; the offset of the *j*-th row
change of the transaction whose commit record is at LSN *C* is
``C << 18 | j``, and the position after a transaction is ``E << 18`` (*E* its
end LSN), so offsets increase strictly, are the same on every redelivery, and
a position's LSN is ``offset >> 18``. (Limits: 262,143 row changes in one
transaction and LSNs below 2^45, i.e. 32 TiB of WAL; a larger transaction is
refused with a clear status.) ``postgres:<name>:snapshot:<schema.table>``
holds a table's snapshot rows: ``generation << 40 | row number`` in
primary-key order, and ``generation << 40 | 2^40 - 1`` once the table was read
to its end.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import psycopg2.extensions  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]

from streamrag.config import PostgresSourceSettings
from streamrag.errors import DecodeError, SourceError
from streamrag.sources import pgoutput as pg
from streamrag.sources.base import RawBatch
from streamrag.sources.health import ConnectionHealth
from streamrag.sources.pgoutput import SNAP_BITS, SNAP_DONE, lsn_of, wal_offset
from streamrag.timing import Clock

__all__ = ["PostgresReader", "PostgresSource"]

_MAX_ROWS = (1 << pg.ROW_BITS) - 1
SNAPSHOT_MARGIN_US = 1_000_000
"""Snapshot rows are stamped this much before the snapshot was taken (see PostgresSource)."""


@dataclass(frozen=True, slots=True)
class PostgresSource:
    """Tables of one database: snapshot, then changes by logical replication (pgoutput).

    **Delivery and resume.** At least once from the server, exactly once into
    the index: the resume position is the offset of the WAL partition in
    streamrag's commit (see the module docstring), and streaming restarts at
    its LSN; the server then sends again every transaction committed from
    there, with the same offsets, and the cursor skips what was committed.
    The slot's confirmed position (what the server may recycle) is sent only
    after a commit: the LSN below which every row change is committed and
    none is waiting (:meth:`PostgresReader.committed`).

    **Snapshot.** A new slot exports its snapshot; each table is read at it in
    REPEATABLE READ, ordered by primary key, as ``op: r`` records. A snapshot
    row's event time is the server's clock *before* the snapshot was taken,
    less a second, so any change that the snapshot does not hold has a later
    commit time and wins. **Crash during the snapshot:** the slot is kept (it
    has not moved past its start, since nothing of the stream was read), and
    every table whose snapshot did not finish is read again at the *current*
    state, in a new generation of offsets; then streaming starts at the WAL
    position of the commit (or the slot's). The changes made since the slot's
    start are sent again after the snapshot: those older than a snapshot row
    lose to it, the newer win, and the deletes of rows that the partial
    snapshot had read remove them; so the index ends equal to the tables. (Of
    the partial snapshot's rows that were waiting in the batcher at the crash,
    the job logs that they were not found again: they come back in the new
    generation instead.)

    **Schema changes.** Column names come from the server's Relation message
    before each change, so added and dropped columns need nothing. A table
    dropped and created again under its name leaves the publication: the
    reader sees it, adds the new table and reads it again (a new snapshot
    generation); rows of the old table that the new one lacks stay in the
    index (DROP TABLE writes no deletes), which ``/v1/status`` says.
    TRUNCATE is not applied (its rows are not listed); status says so. A large
    value that an UPDATE did not touch (TOAST) is not in the stream: it is read
    from the table by key.
    """

    name: str
    dsn: str
    tables: tuple[str, ...]
    slot: str = "streamrag"
    publication: str = "streamrag"
    password_env: str | None = None
    status_interval_s: float = 10.0
    snapshot_rows: int = 1000
    """Rows fetched per poll while reading a snapshot."""

    @classmethod
    def from_settings(cls, spec: PostgresSourceSettings) -> PostgresSource:
        """The source of a ``kind: postgres`` entry of ``sources:``."""
        return cls(
            name=spec.name,
            dsn=spec.dsn,
            tables=tuple(t if "." in t else f"public.{t}" for t in spec.tables),
            slot=spec.slot,
            publication=spec.publication,
            password_env=spec.password_env,
            status_interval_s=spec.status_interval_s,
        )

    @property
    def wal_partition(self) -> str:
        """The partition of the stream."""
        return f"postgres:{self.name}:wal"

    def snapshot_partition(self, table: str) -> str:
        """The partition of one table's snapshot rows."""
        return f"postgres:{self.name}:snapshot:{table}"

    def owns(self, partition: str) -> bool:
        """Whether ``partition`` is one of this source's."""
        return partition.startswith(f"postgres:{self.name}:")

    def build(self, resume: Mapping[str, int] | None = None) -> PostgresReader:
        """A reader resuming at ``resume`` (nothing connects before the first poll)."""
        return PostgresReader(self, dict(resume or {}))


@dataclass(slots=True)
class _Table:
    qualified: str
    oid: int
    keys: tuple[str, ...]


class _Txn:
    __slots__ = ("commit_us", "rows")

    def __init__(self, commit_us: int) -> None:
        self.commit_us = commit_us
        self.rows: list[bytes] = []


class PostgresReader:
    """Reads a snapshot, then the replication stream; never blocks in ``poll``."""

    def __init__(
        self, spec: PostgresSource, resume: dict[str, int], *, clock: Clock | None = None
    ) -> None:
        self.spec = spec
        self._password = os.environ.get(spec.password_env) if spec.password_env else None
        self.health_state = ConnectionHealth(
            "postgres", clock=clock, secrets=(self._password,) if self._password else ()
        )
        self._wal = spec.wal_partition
        self._positions: dict[str, int] = {p: o for p, o in resume.items() if spec.owns(p)}
        self._gens: dict[str, int] = {}
        self._skip_below = resume.get(self._wal, 0)
        self._wal_read: int | None = resume.get(self._wal)
        self._out = pg.Outbox(spec.name)
        self._conn: Any = None
        self._repl: Any = None
        self._rcur: Any = None
        self._snap_conn: Any = None
        self._snap_cur: Any = None
        self._snap_todo: list[_Table] = []
        self._snap_table: _Table | None = None
        self._snap_row = 0
        self._snap_time = 0
        self._snap_lsn = 0
        self._streaming = False
        self._tables: dict[str, _Table] = {}
        self._relations: dict[int, pg.Relation] = {}
        self._txn: _Txn | None = None
        self._lock = threading.Lock()
        self._ack_lsn = 0
        self._sent_ack = 0
        self._lag: int | None = None
        self._next_check = 0.0
        self._next_keepalive = 0.0
        self._next_feedback = 0.0
        self._warnings: dict[str, str] = {}
        self._fd: int | None = None
        self._event: threading.Event | None = None
        self._closed = threading.Event()
        self._waker: threading.Thread | None = None

    # -- the SourceReader contract -------------------------------------------------

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """Hand out what was read; read more (a bounded, non-blocking step) when nothing is."""
        if not self._out:
            try:
                self._step(max_bytes)
            except (psycopg2.Error, OSError, SourceError, DecodeError) as exc:
                self._fail(exc)
        return self._drain(max_bytes)

    def snapshot(self) -> dict[str, int]:
        """The WAL partition's position and each table's snapshot position."""
        return dict(self._positions)

    def backlog_bytes(self) -> int:
        """Bytes read from the server and not handed out yet."""
        return self._out.bytes

    def close(self) -> None:
        """Stop the waker and close the connections (the slot stays)."""
        self._closed.set()
        self._disconnect()

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Remember the LSN below which everything is committed; the next poll tells the server."""
        at = positions.get(self._wal)
        if at is None:
            return
        low = min([at, *waiting.get(self._wal, ())])
        with self._lock:
            self._ack_lsn = max(self._ack_lsn, lsn_of(low))

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` when the replication socket has data (a thread watches it)."""
        self._event = event
        if self._waker is None:
            self._waker = threading.Thread(target=self._watch, name="postgres-waker", daemon=True)
            self._waker.start()

    def health(self) -> dict[str, Any]:
        """Connected, slot lag in bytes, phase, last error and warnings (no secrets)."""
        phase = "streaming" if self._streaming and self._snap_table is None else "snapshot"
        if not self.health_state.connected:
            phase = "disconnected"
        report = self.health_state.report(
            lag=self._lag,
            lag_unit="bytes",
            phase=phase,
            slot=self.spec.slot,
            publication=self.spec.publication,
            confirmed_lsn=pg.fmt_lsn(self._sent_ack) if self._sent_ack else None,
            warnings=sorted(self._warnings.values()),
        )
        return {self.spec.name: report}

    # -- connecting ---------------------------------------------------------------

    def _connect_args(self) -> dict[str, Any]:
        # The same text forms on every connection (snapshot rows and streamed ones alike).
        out: dict[str, Any] = {"connect_timeout": 5, "options": "-c TimeZone=UTC -c DateStyle=ISO"}
        if self._password:
            out["password"] = self._password
        return out

    def _step(self, max_bytes: int) -> None:
        if self._conn is None:
            if not self.health_state.due():
                return
            self._connect()
        if self._snap_table is not None or self._snap_todo:
            self._read_snapshot()
            return
        if not self._streaming:
            self._start_stream()
        self._read_stream(max_bytes)
        self._feedback()
        self._checks()

    def _connect(self) -> None:
        self._disconnect()
        self._conn = psycopg2.connect(self.spec.dsn, **self._connect_args())
        self._conn.autocommit = True
        self._tables = self._describe(self.spec.tables)
        self._publication()
        self._repl = psycopg2.connect(
            self.spec.dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            **self._connect_args(),
        )
        self._rcur = self._repl.cursor()
        slot = self._query(
            "SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            self.spec.slot,
        )
        todo = [t for t in self._tables.values() if not self._snapshot_done(t.qualified)]
        if slot:
            plugin, database, confirmed = slot[0]
            if plugin != "pgoutput" or database != self._conn.info.dbname:
                msg = (
                    f"replication slot {self.spec.slot!r} belongs to plugin {plugin} in "
                    f"database {database}; name another slot (sources[].slot)"
                )
                raise SourceError(msg)
            if self._wal_read is None:
                self._wal_read = wal_offset(pg.parse_lsn(confirmed or "0/0"))
            if todo:
                self._begin_snapshot(todo, None)
        else:
            if len(todo) < len(self._tables):
                self._warnings["slot"] = (
                    f"slot {self.spec.slot} was gone: the tables were read again; rows "
                    "deleted while there was no slot may still be in the index"
                )
            stamp = self._server_us() - SNAPSHOT_MARGIN_US
            create = f"CREATE_REPLICATION_SLOT {pg.ident(self.spec.slot)} LOGICAL pgoutput"
            self._rcur.execute(create + " EXPORT_SNAPSHOT")
            _, point, snapshot_name, _ = self._rcur.fetchone()
            start = wal_offset(pg.parse_lsn(point))
            self._wal_read = max(start, self._wal_read or 0)
            self._begin_snapshot(list(self._tables.values()), snapshot_name, stamp)
        self._positions.setdefault(self._wal, self._wal_read)
        self._fd = self._repl.fileno()
        if not self._snap_todo:
            self._start_stream()
        self.health_state.ok()

    def _describe(self, tables: Sequence[str]) -> dict[str, _Table]:
        out: dict[str, _Table] = {}
        for table in tables:
            rows = self._query("SELECT to_regclass(%s)::oid", pg.quoted(table))
            if not rows or rows[0][0] is None:
                msg = f"table {table} does not exist (sources[{self.spec.name}].tables)"
                raise SourceError(msg)
            oid = int(rows[0][0])
            keys = self._query(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary "
                "ORDER BY array_position(i.indkey, a.attnum)",
                oid,
            )
            if not keys:
                msg = (
                    f"table {table} has no primary key: logical replication names a row by its "
                    "replica identity, which is the primary key; add one "
                    f"(ALTER TABLE {table} ADD PRIMARY KEY (...))"
                )
                raise SourceError(msg)
            out[table] = _Table(table, oid, tuple(k for (k,) in keys))
        return out

    def _publication(self) -> None:
        names = ", ".join(pg.quoted(t) for t in self._tables)
        exists = self._query(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", self.spec.publication
        )
        if not exists:
            self._query(f"CREATE PUBLICATION {pg.ident(self.spec.publication)} FOR TABLE {names}")
            return
        for table in self._tables:
            self._ensure_published(table)

    def _ensure_published(self, table: str) -> bool:
        schema, _, name = table.partition(".")
        there = self._query(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s "
            "AND tablename = %s",
            self.spec.publication,
            schema,
            name,
        )
        if there:
            return False
        pub = pg.ident(self.spec.publication)
        self._query(f"ALTER PUBLICATION {pub} ADD TABLE {pg.quoted(table)}")
        return True

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._conn.cursor() as cur:
            cur.execute(sql, args or None)
            return list(cur.fetchall()) if cur.description else []

    def _server_us(self) -> int:
        return int(
            self._query("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint")[0][0]
        )

    def _disconnect(self) -> None:
        self._fd = None
        for conn in (self._snap_conn, self._repl, self._conn):
            if conn is not None:
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
        self._conn = self._repl = self._rcur = self._snap_conn = self._snap_cur = None
        self._streaming = False
        self._txn = None

    def _fail(self, exc: BaseException) -> None:
        self.health_state.failed(exc)
        # A snapshot that was cut off is read again, at the current state, on reconnect.
        if self._snap_table is not None:
            self._snap_todo.insert(0, self._snap_table)
        self._snap_table = None
        self._disconnect()

    # -- the snapshot -------------------------------------------------------------

    def _snapshot_done(self, table: str) -> bool:
        at = self._positions.get(self.spec.snapshot_partition(table))
        return at is not None and at & SNAP_DONE == SNAP_DONE

    def _begin_snapshot(self, tables: list[_Table], exported: str | None, stamp: int = 0) -> None:
        if exported is None:
            stamp = self._server_us() - SNAPSHOT_MARGIN_US
        self._snap_conn = psycopg2.connect(self.spec.dsn, **self._connect_args())
        self._snap_conn.set_session(
            isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ, readonly=True
        )
        with self._snap_conn.cursor() as cur:
            if exported is not None:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (exported,))
            cur.execute("SELECT pg_current_wal_lsn()::text")
            self._snap_lsn = pg.parse_lsn(cur.fetchone()[0])
        self._snap_time = stamp
        self._snap_todo = list(tables)
        self._snap_table = None

    def _open_table(self, table: _Table) -> None:
        part = self.spec.snapshot_partition(table.qualified)
        before = self._positions.get(part)
        gen = 0 if before is None else (before >> SNAP_BITS) + 1
        gen = max(gen, self._gens.get(part, -1) + 1)
        self._gens[part] = gen
        self._snap_row = gen << SNAP_BITS
        cols = self._snap_query(
            "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            table.oid,
        )
        columns = tuple(pg.Column(n, int(t), n in table.keys) for n, t in cols)
        schema, _, name = table.qualified.partition(".")
        self._snap_rel = pg.Relation(table.oid, schema, name, "d", columns)
        select_list = ", ".join(f"{pg.ident(c.name)}::text" for c in columns)
        order = ", ".join(pg.ident(k) for k in table.keys)
        self._snap_cur = self._snap_conn.cursor(name=f"streamrag_snapshot_{gen}_{table.oid}")
        self._snap_cur.itersize = self.spec.snapshot_rows
        self._snap_cur.execute(
            f"SELECT {select_list} FROM {pg.quoted(table.qualified)} ORDER BY {order}"  # noqa: S608
        )
        self._snap_table = table

    def _snap_query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._snap_conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def _read_snapshot(self) -> None:
        if self._snap_table is None:
            if not self._snap_todo:
                return
            self._open_table(self._snap_todo.pop(0))
        table = self._snap_table
        assert table is not None
        if self._streaming and time.monotonic() >= self._next_keepalive:
            self._rcur.send_feedback(force=True)  # a long snapshot must not time the stream out
            self._next_keepalive = time.monotonic() + 1.0
        part = self.spec.snapshot_partition(table.qualified)
        rows = self._snap_cur.fetchmany(self.spec.snapshot_rows)
        for row in rows:
            after = pg.row_values(self._snap_rel, tuple(row))
            line = self._envelope(None, after, "r", self._snap_rel, self._snap_time, self._snap_lsn)
            self._push(pg.Out(part, line, self._snap_row, self._snap_row + 1, self._snap_time))
            self._snap_row += 1
        if len(rows) < self.spec.snapshot_rows:
            done = (self._snap_row >> SNAP_BITS) << SNAP_BITS | SNAP_DONE
            self._push(pg.Out(part, None, done, done, self._snap_time))
            self._snap_cur.close()
            self._snap_cur = None
            self._snap_table = None
            if not self._snap_todo:
                self._snap_conn.commit()
                self._snap_conn.close()
                self._snap_conn = None
        self._wake()

    # -- the stream ---------------------------------------------------------------

    def _start_stream(self) -> None:
        start = lsn_of(self._wal_read or 0)
        self._rcur.start_replication(
            slot_name=self.spec.slot,
            decode=False,
            start_lsn=start,
            status_interval=max(1.0, self.spec.status_interval_s),
            options={"proto_version": "1", "publication_names": self.spec.publication},
        )
        self._streaming = True
        self._fd = self._repl.fileno()

    def _read_stream(self, max_bytes: int) -> None:
        deadline = time.monotonic() + 0.005
        while self._out.bytes < max_bytes and time.monotonic() < deadline:
            msg = self._rcur.read_message()
            if msg is None:
                return
            self._handle(msg.payload, msg.data_start)
        self._wake()  # stopped with more to read

    def _handle(self, data: bytes, data_start: int) -> None:
        try:
            msg = pg.parse(data)
        except DecodeError as exc:
            if self._txn is None or data[:1] in (b"B", b"C", b"R"):
                raise
            self._txn.rows.append(f"pgoutput: {exc} at LSN {pg.fmt_lsn(data_start)}".encode())
            return
        if isinstance(msg, pg.Begin):
            self._txn = _Txn(msg.commit_time_us)
        elif isinstance(msg, pg.Commit):
            self._commit(msg)
        elif isinstance(msg, pg.Relation):
            self._relations[msg.oid] = msg
            known = self._tables.get(msg.qualified)
            if known is not None and known.oid != msg.oid:
                self._next_check = 0.0
        elif isinstance(msg, pg.Truncate):
            names = [self._relations[o].qualified for o in msg.relations if o in self._relations]
            self._warnings["truncate"] = (
                f"TRUNCATE of {', '.join(names)} was not applied: the index keeps their rows"
            )
        elif isinstance(msg, pg.Insert | pg.Update | pg.Delete) and self._txn is not None:
            self._change(msg, data_start)

    def _change(self, msg: pg.Insert | pg.Update | pg.Delete, lsn: int) -> None:
        txn = self._txn
        assert txn is not None
        rel = self._relations.get(msg.relation)
        if rel is None:
            txn.rows.append(f"pgoutput: change of unknown relation {msg.relation}".encode())
            return
        if rel.qualified not in self._tables:
            return
        try:
            if isinstance(msg, pg.Insert):
                after = pg.row_values(rel, msg.new)
                txn.rows.append(self._envelope(None, after, "c", rel, txn.commit_us, lsn))
            elif isinstance(msg, pg.Delete):
                before = pg.row_values(rel, msg.old, keys_only=msg.old_kind == "K")
                txn.rows.append(self._envelope(before, None, "d", rel, txn.commit_us, lsn))
            else:
                self._update(txn, rel, msg, lsn)
        except DecodeError as exc:
            txn.rows.append(f"pgoutput: {exc} at LSN {pg.fmt_lsn(lsn)}".encode())

    def _update(self, txn: _Txn, rel: pg.Relation, msg: pg.Update, lsn: int) -> None:
        full = msg.old if msg.old_kind == "O" else None
        after = pg.row_values(rel, msg.new, full)
        self._unchanged(rel, msg.new, after)
        if msg.old is not None:
            old_key = pg.row_values(rel, msg.old, keys_only=True)
            new_key = {c.name: after.get(c.name) for c in rel.columns if c.key}
            if old_key != new_key:  # the key changed: the old row is gone, a new one is there
                txn.rows.append(self._envelope(old_key, None, "d", rel, txn.commit_us, lsn))
                txn.rows.append(self._envelope(None, after, "c", rel, txn.commit_us, lsn))
                return
        before = None if full is None else pg.row_values(rel, full)
        txn.rows.append(self._envelope(before, after, "u", rel, txn.commit_us, lsn))

    def _unchanged(self, rel: pg.Relation, new: pg.Tuple, after: dict[str, Any]) -> None:
        """Large values an UPDATE left alone (TOAST) are not sent: read them from the table.

        The value read may be newer than this change; the change that made it
        newer follows in the stream, so the document ends right all the same.
        """
        missing = [c for c, v in zip(rel.columns, new, strict=True) if v is pg.UNCHANGED]
        missing = [c for c in missing if c.name not in after]
        keys = [c for c in rel.columns if c.key]
        if not missing or not all(k.name in after for k in keys):
            return
        cols = ", ".join(f"{pg.ident(c.name)}::text" for c in missing)
        where = " AND ".join(f"{pg.ident(k.name)} = %s" for k in keys)
        sql = f"SELECT {cols} FROM {pg.quoted(rel.qualified)} WHERE {where}"  # noqa: S608
        found = self._query(sql, *(after[k.name] for k in keys))
        if found:  # else the row is gone: its delete follows
            for col, text in zip(missing, found[0], strict=True):
                after[col.name] = pg.convert(col.type_oid, text)

    def _commit(self, msg: pg.Commit) -> None:
        txn, self._txn = self._txn, None
        read = self._wal_read or 0
        if txn is None or msg.commit_lsn < lsn_of(read):
            return  # sent again from before the position already read
        if len(txn.rows) > _MAX_ROWS:
            msg_ = (
                f"a transaction (commit LSN {pg.fmt_lsn(msg.commit_lsn)}) changed "
                f"{len(txn.rows)} rows; this connector numbers at most {_MAX_ROWS} per transaction"
            )
            raise SourceError(msg_)
        for j, line in enumerate(txn.rows):
            off = wal_offset(msg.commit_lsn, j)
            if off >= self._skip_below:
                self._push(pg.Out(self._wal, line, off, off + 1, txn.commit_us))
        end = wal_offset(msg.end_lsn)
        self._push(pg.Out(self._wal, None, end, end, txn.commit_us))
        self._wal_read = end

    def _envelope(
        self, before: Any, after: Any, op: str, rel: pg.Relation, ts_us: int, lsn: int
    ) -> bytes:
        return pg.envelope(before, after, op, rel, ts_us, lsn, self.spec.name)

    def _feedback(self) -> None:
        with self._lock:
            ack = self._ack_lsn
        now = time.monotonic()
        if ack > self._sent_ack and now >= self._next_feedback:
            self._rcur.send_feedback(flush_lsn=ack, force=True)
            self._sent_ack = ack
            self._next_feedback = now + self.spec.status_interval_s

    def _checks(self) -> None:
        """Every second or so: the slot's lag, and whether each table is still the one published."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 1.0
        rows = self._query(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s",
            self.spec.slot,
        )
        self._lag = int(rows[0][0]) if rows and rows[0][0] is not None else None
        for table in list(self._tables.values()):
            found = self._query("SELECT to_regclass(%s)::oid", pg.quoted(table.qualified))
            oid = found[0][0] if found else None
            key = f"table:{table.qualified}"
            if oid is None:
                self._warnings[key] = f"table {table.qualified} does not exist (dropped?)"
                continue
            if int(oid) == table.oid:
                self._warnings.pop(key, None)
                continue
            # Dropped and created again: publish the new table and read it again.
            fresh = self._describe([table.qualified])[table.qualified]
            self._ensure_published(table.qualified)
            self._tables[table.qualified] = fresh
            self._warnings[key] = (
                f"table {table.qualified} was created again: it was read again; rows of the "
                "old table that the new one lacks stay in the index (DROP TABLE writes no deletes)"
            )
            self._begin_snapshot([fresh], None)

    # -- handing out --------------------------------------------------------------

    def _push(self, out: pg.Out) -> None:
        self._out.push(out)

    def _drain(self, max_bytes: int) -> list[RawBatch]:
        batches = self._out.drain(max_bytes, self._positions)
        if self._out:
            self._wake()
        return batches

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()

    def _watch(self) -> None:
        """The waker thread: set the event when the socket is readable, or now and then."""
        while not self._closed.is_set():
            event = self._event
            fd = self._fd
            if event is None or event.is_set() or fd is None or not self._streaming:
                self._closed.wait(0.05)
                if self._event is not None and (self._fd is None or not self._streaming):
                    self._event.set()  # connecting or reading a snapshot: poll on
                continue
            try:
                ready, _, _ = select.select(
                    [fd], [], [], max(0.05, self.spec.status_interval_s / 2)
                )
            except (OSError, ValueError):
                self._closed.wait(0.05)
                continue
            event.set()
            if ready:
                self._closed.wait(0.002)
