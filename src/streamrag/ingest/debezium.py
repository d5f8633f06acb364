"""Debezium change events into changes: one row event, one change.

Debezium turns each committed row change of a database into an event whose
value is an *envelope* (Debezium docs, "Debezium connector for PostgreSQL",
*Data change events*, change event values)::

    {"before": {...} | null,      # the row before the change (updates, deletes)
     "after":  {...} | null,      # the row after it (creates, updates, snapshot reads)
     "op": "c" | "u" | "d" | "r" | "t" | "m",
     "source": {"ts_ms": ..., "ts_us": ..., "schema": "public", "table": "t", "lsn": ...},
     "ts_ms": ...}                # when Debezium handled the event

With Kafka Connect's JSON converter and ``schemas.enable=true`` the envelope
comes wrapped as ``{"schema": ..., "payload": <envelope>}``, the schema naming
each column's semantic type (see :mod:`streamrag.ingest.rows`); both shapes are
read. The event's *key* (the Kafka key) holds the primary-key columns, wrapped
the same way or not (``{"id": 5}``).

How each event maps, through the source's :class:`~streamrag.config.RowMapping`:

* ``c`` (insert), ``u`` (update), ``r`` (snapshot read): an upsert of ``after``.
  A primary-key change is sent by Debezium as a delete of the old key (and its
  tombstone) and a create of the new one, so it becomes two changes from two
  records. (An update whose ``before`` names another key than its ``after`` is
  an upsert of ``after`` only: one record, one outcome.)
* ``d`` (delete): a delete of the id the mapping makes from ``before``, which
  holds at least the key columns unless the table has ``REPLICA IDENTITY
  NOTHING``; without them, from the record key.
* a **tombstone** (the value ``null``, or no value), which Debezium sends after
  each delete so Kafka's log compaction can drop the key: a delete of the id
  made from the record key (a delete after a delete is harmless). Without a key
  it is a dead letter, since one outcome per record holds for it too.
* ``t`` (truncate) and ``m`` (logical decoding message): dead letters, with a
  reason that says what to do; they change no single row.

**Event time**: the mapping's ``event_time`` column when set; else
``source.ts_us``, else ``source.ts_ms`` (the commit time in the database),
else the envelope's ``ts_ms``, else the record's time (``RawBatch.times``).

**Tables.** For a ``postgres`` source the table comes from ``source.schema``
and ``source.table``: a table the source does not follow is a dead letter, and
each table has its own mapping (``table_mappings``, else ``mapping``). Its
document ids start with the table name (without the schema) and ``/`` when the
mapping sets no ``id_prefix``, so two tables' ids cannot meet: ``public.tickets``
row 7 is ``tickets/7``. A message source (Kafka, NATS, Redis with ``format:
debezium``) uses ``mapping`` for every event and prefixes nothing by default.
Either way, upserts carry the table (``schema.table``) in their metadata as
``table`` when the event names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from streamrag.changes import DEFAULT_TENANT, ChangeBatch, Op
from streamrag.config.sources import (
    KafkaSourceSettings,
    NatsSourceSettings,
    PostgresSourceSettings,
    RedisSourceSettings,
    RowMapping,
)
from streamrag.errors import DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import decode_each, show
from streamrag.ingest.rows import ColumnTypes, RowMapper, column_types, unwrap
from streamrag.sources.base import RawBatch
from streamrag.timing import US_PER_MS, Timestamp

__all__ = ["DebeziumDecoder"]

_BOM = b"\xef\xbb\xbf"
_ROW_OPS = {"c", "u", "r"}
_Mapped = tuple[str, str, Op, Timestamp, dict[str, Any]]


class DebeziumDecoder:
    """The ``debezium`` record format (and the ``postgres`` connector's own records).

    ``tables`` (``schema.table`` → mapping) routes each event by its
    ``source``; None takes every event through ``mapping``. One outcome per
    record: an event that cannot become a change is a dead letter whose reason
    says what was expected and what to do; ``decode`` never raises.
    """

    stage = "decode"

    def __init__(
        self,
        mapping: RowMapping,
        *,
        default_tenant: str = DEFAULT_TENANT,
        max_document_bytes: int = 1_000_000,
        tables: Mapping[str, RowMapping] | None = None,
    ) -> None:
        self.max_document_bytes = max_document_bytes
        self.mapper = RowMapper(mapping, default_tenant=default_tenant)
        self.tables: dict[str, RowMapper] | None = None
        if tables is not None:
            self.tables = {
                name: RowMapper(
                    m, default_tenant=default_tenant, id_prefix=name.rpartition(".")[2] + "/"
                )
                for name, m in tables.items()
            }
        self._decode = msgspec.json.Decoder().decode

    @classmethod
    def from_settings(
        cls,
        spec: PostgresSourceSettings
        | KafkaSourceSettings
        | NatsSourceSettings
        | RedisSourceSettings,
        *,
        default_tenant: str,
        max_document_bytes: int,
    ) -> DebeziumDecoder:
        """The decoder of a ``postgres`` source, or of a message source in ``format: debezium``."""
        tables = None
        if isinstance(spec, PostgresSourceSettings):
            tables = {}
            for name in spec.tables:
                full = name if "." in name else f"public.{name}"
                tables[full] = spec.table_mappings.get(
                    name, spec.table_mappings.get(full, spec.mapping)
                )
        return cls(
            spec.mapping,
            default_tenant=default_tenant,
            max_document_bytes=max_document_bytes,
            tables=tables,
        )

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode every record; each becomes one change or one dead letter."""
        return decode_each(raws, self.stage, self.max_document_bytes, self._one)

    def _one(self, line: bytes, key: bytes | None, time: Timestamp | None) -> _Mapped:
        if line.startswith(_BOM):
            line = line[len(_BOM) :]
        if not line.strip():
            return self._tombstone(key, time)
        env, schema = unwrap(self._decode(line))
        if env is None:
            return self._tombstone(key, time)
        if not isinstance(env, dict):
            msg = (
                "expected a Debezium change event (a JSON object with 'op', 'before', 'after' "
                f"and 'source'), found {type(env).__name__}; send the event's value as JSON"
            )
            raise DecodeError(msg)
        op = env.get("op")
        if op == "m":
            msg = (
                "a logical decoding message (op 'm') changes no row, so it is no document; "
                "route such messages to another topic, or leave them out of the capture"
            )
            raise DecodeError(msg)
        source = env.get("source")
        source = source if isinstance(source, dict) else {}
        table = _table(source)
        mapper = self._route(table)
        if op == "t":
            msg = (
                f"a TRUNCATE of {table or 'a table'} (op 't') removes every row at once, which "
                "cannot be applied row by row; delete the table's documents and take a new "
                "snapshot, and leave truncates out of the capture (Debezium: "
                "skipped.operations=t, its default)"
            )
            raise DecodeError(msg)
        if op not in _ROW_OPS and op != "d":
            msg = (
                f"expected a Debezium change event with op 'c', 'u', 'd' or 'r', found op "
                f"{op!r}; only row change events can be indexed"
            )
            raise DecodeError(msg)
        record_time = _record_time(env, source, time)
        if op == "d":
            row, types = self._deleted_row(env, schema, key, mapper)
            return mapper.map(row, op=Op.DELETE, record_time=record_time, types=types)
        after = env.get("after")
        if not isinstance(after, dict):
            msg = (
                f"a change event with op {op!r} needs the new row in 'after', found "
                f"{'null' if after is None else type(after).__name__}"
            )
            raise DecodeError(msg)
        types = column_types(schema, field="after")
        meta = {"table": table} if table else None
        return mapper.map(after, record_time=record_time, types=types, metadata=meta)

    def _route(self, table: str | None) -> RowMapper:
        if self.tables is None:
            return self.mapper
        if table is None:
            msg = (
                "the change event names no table (source.schema and source.table); a "
                "postgres source needs them to choose the table's mapping"
            )
            raise DecodeError(msg)
        mapper = self.tables.get(table)
        if mapper is None:
            msg = (
                f"table {table!r} is not one this source follows ({', '.join(self.tables)}); "
                "add it to the source's tables, or leave it out of the publication"
            )
            raise DecodeError(msg)
        return mapper

    def _deleted_row(
        self, env: Mapping[str, Any], schema: Any, key: bytes | None, mapper: RowMapper
    ) -> tuple[Mapping[str, Any], ColumnTypes]:
        before = env.get("before")
        ids = mapper.mapping.id
        if isinstance(before, dict) and all(before.get(c) is not None for c in ids):
            return before, column_types(schema, field="before")
        keyed = self._key_row(key, mapper)
        if keyed is not None and all(keyed[0].get(c) is not None for c in ids):
            return keyed
        if isinstance(before, dict):
            return before, column_types(schema, field="before")  # the mapper names what is missing
        if keyed is not None:
            return keyed
        msg = (
            "a delete (op 'd') without a 'before' row or a record key names no document; "
            "give the table a primary key and REPLICA IDENTITY DEFAULT or FULL (NOTHING "
            "sends no old row)"
        )
        raise DecodeError(msg)

    def _tombstone(self, key: bytes | None, time: Timestamp | None) -> _Mapped:
        keyed = self._key_row(key, None)
        if keyed is None:
            msg = (
                "a tombstone (a null value) without a key names no document; the source "
                "must pass the record key, or set tombstones.on.delete=false in Debezium "
                "for this sink (the delete event before it already removed the document)"
            )
            raise DecodeError(msg)
        row, types = keyed
        mapper = self._route(self._key_table(key)) if self.tables is not None else self.mapper
        tenant = mapper.mapping.tenant
        if tenant is not None and row.get(tenant) is None:
            msg = (
                f"a tombstone's key has no tenant column {tenant!r}, so it names no document; "
                "set tombstones.on.delete=false in Debezium for this sink (the delete event "
                "before it already removed the document)"
            )
            raise DecodeError(msg)
        return mapper.map(row, op=Op.DELETE, record_time=time, types=types)

    def _key_row(
        self, key: bytes | None, mapper: RowMapper | None
    ) -> tuple[Mapping[str, Any], ColumnTypes] | None:
        if key is None or not key.strip():
            return None
        try:
            value, schema = unwrap(self._decode(key))
        except msgspec.DecodeError:
            msg = (
                f"the record key {show(key, 200)!r} is not JSON; Debezium keys are JSON "
                'objects of the key columns, such as {"id": 5}'
            )
            raise DecodeError(msg) from None
        if isinstance(value, dict):
            return value, column_types(schema)
        ids = (mapper or self._any_mapper()).mapping.id
        if isinstance(value, str | int) and not isinstance(value, bool) and len(ids) == 1:
            return {ids[0]: value}, ({ids[0]: schema} if schema else {})
        if value is None:
            return None
        msg = (
            f"the record key holds {type(value).__name__}, not the key columns; Debezium "
            'keys are JSON objects of the key columns, such as {"id": 5}'
        )
        raise DecodeError(msg)

    def _any_mapper(self) -> RowMapper:
        if self.tables and len(self.tables) == 1:
            return next(iter(self.tables.values()))
        return self.mapper

    def _key_table(self, key: bytes | None) -> str | None:
        """A tombstone's table: the only one, or the one its key's schema names.

        Debezium names a key schema ``<topic prefix>.<schema>.<table>.Key``.
        """
        if self.tables is not None and len(self.tables) == 1:
            return next(iter(self.tables))
        try:
            _, schema = unwrap(self._decode(key or b"null"))
        except msgspec.DecodeError:
            schema = None
        name = schema.get("name") if isinstance(schema, dict) else None
        parts = name.split(".") if isinstance(name, str) else []
        if len(parts) >= 3 and parts[-1] == "Key":
            return f"{parts[-3]}.{parts[-2]}"
        msg = (
            "a tombstone of a source with several tables names no table (its key has no "
            "schema naming it); set tombstones.on.delete=false in Debezium for this sink"
        )
        raise DecodeError(msg)


def _table(source: Mapping[str, Any]) -> str | None:
    table = source.get("table")
    if not isinstance(table, str) or not table:
        return None
    schema = source.get("schema") or source.get("db")
    return f"{schema}.{table}" if isinstance(schema, str) and schema else table


def _record_time(
    env: Mapping[str, Any], source: Mapping[str, Any], time: Timestamp | None
) -> Timestamp | None:
    ts_us = source.get("ts_us")
    if isinstance(ts_us, int) and not isinstance(ts_us, bool):
        return ts_us
    for ms in (source.get("ts_ms"), env.get("ts_ms")):
        if isinstance(ms, int) and not isinstance(ms, bool):
            return ms * US_PER_MS
    return time
