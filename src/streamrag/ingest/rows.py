"""Rows into documents: a table row, a JSON object or a Debezium ``after`` becomes one change.

A :class:`RowMapper` applies a :class:`~streamrag.config.RowMapping` to a row
(a dict of column → value):

* **document id** — ``id_prefix`` and the values of the ``id`` columns joined
  by ``:`` (``id: [org, number]`` and ``{"org": "acme", "number": 7}`` give
  ``acme:7``). A missing id column is refused, naming the columns the row has.
* **text** — ``template.format_map(row)`` when a template is set (a null value
  fills in as ``""``, an object or list as JSON), else the non-null ``text``
  columns joined by a blank line.
* **title, domain, tenant** — from their columns when set (the tenant falls
  back to the default tenant when its column is null or absent).
* **metadata** — the ``metadata`` columns that hold a value, as JSON values.
* **event time** — the ``event_time`` column when set, else the time the
  caller says the system stamped on the record (a commit time, a message
  timestamp); with neither the record is refused.

Values become text the obvious way: strings as they are, numbers with
``str``, booleans as ``true``/``false``, objects and lists as JSON; nulls are
left out.

**Typed columns.** A row wrapped by Kafka Connect's JSON converter
(``{"schema": ..., "payload": ...}``) names the semantic type of each column
(Debezium docs, "Debezium connector for PostgreSQL", *Data type mappings*).
Those are read as what they mean, in the event time and everywhere else:
``io.debezium.time.Timestamp`` / ``MicroTimestamp`` / ``NanoTimestamp``
(epoch ms / µs / ns; Kafka Connect's own ``Timestamp`` is ms), ``Date`` (days
since the epoch), ``ZonedTimestamp`` (an ISO-8601 string), times of day, and
decimals (``org.apache.kafka.connect.data.Decimal``: base64 of the unscaled
big-endian integer, with its ``scale`` parameter; ``io.debezium.data.VariableScaleDecimal``:
``{"scale", "value"}``). In text a timestamp shows as ISO-8601 and a decimal
with its digits; in metadata a decimal is a number. Without a schema an event
time is read by :func:`~streamrag.timing.parse_timestamp` (ISO-8601 with a
zone, or epoch seconds): an integer of milliseconds or microseconds is refused
rather than guessed, with a reason saying how to send its type.

**Deletes** map only the id (and the tenant, which must then be present:
deleting in the default tenant by mistake would delete another document). Their
event time is the later of the event-time column (when the ``before`` image
holds it) and the record time, so a delete never sorts before the version it
removes.

:class:`RowDecoder` is the ``row`` record format of the message connectors
(Kafka, NATS, Redis): each record is one JSON object, always an upsert; one
outcome per record, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import msgspec

from streamrag.changes import DEFAULT_TENANT, ChangeBatch, Op
from streamrag.config.sources import (
    KafkaSourceSettings,
    NatsSourceSettings,
    RedisSourceSettings,
    RowMapping,
)
from streamrag.errors import DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import check_change, decode_each
from streamrag.sources.base import RawBatch
from streamrag.timing import US_PER_MS, US_PER_S, Timestamp, format_timestamp, parse_timestamp

__all__ = ["ColumnTypes", "RowDecoder", "RowMapper", "column_types", "unwrap"]

ColumnTypes = Mapping[str, Mapping[str, Any]]
"""Column → its Kafka Connect field schema (``name`` is the semantic type)."""

_NO_TYPES: ColumnTypes = {}
_BOM = b"\xef\xbb\xbf"

_TS_UNITS = {
    "io.debezium.time.Timestamp": US_PER_MS,
    "org.apache.kafka.connect.data.Timestamp": US_PER_MS,
    "io.debezium.time.MicroTimestamp": 1,
}
_NANO_TS = "io.debezium.time.NanoTimestamp"
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_TIMES_OF_DAY = {  # since midnight: (multiply, divide) to µs
    "io.debezium.time.Time": (US_PER_MS, 1),
    "org.apache.kafka.connect.data.Time": (US_PER_MS, 1),
    "io.debezium.time.MicroTime": (1, 1),
    "io.debezium.time.NanoTime": (1, 1000),
}
_ZONED_TIME = "io.debezium.time.ZonedTime"
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_DAY_US = 86_400 * US_PER_S
_FIRST_US = -62_135_596_800 * US_PER_S  # 0001-01-01T00:00:00Z
_LAST_US = 253_402_300_799 * US_PER_S  # 9999-12-31T23:59:59Z


def unwrap(value: Any) -> tuple[Any, Any]:
    """Split Kafka Connect's JSON envelope: ``(payload, schema)``, or ``(value, None)`` without one.

    >>> unwrap({"schema": {"type": "struct"}, "payload": {"id": 1}})
    ({'id': 1}, {'type': 'struct'})
    >>> unwrap({"id": 1})
    ({'id': 1}, None)
    """
    if (
        isinstance(value, dict)
        and len(value) == 2
        and "payload" in value
        and "schema" in value
        and (value["schema"] is None or isinstance(value["schema"], dict))
    ):
        return value["payload"], value["schema"]
    return value, None


def column_types(schema: Any, *, field: str | None = None) -> ColumnTypes:
    """The field schemas of a struct schema (of its sub-struct ``field`` if named); ``{}`` if none.

    >>> s = {"type": "struct", "fields": [{"field": "at", "type": "int64",
    ...      "name": "io.debezium.time.MicroTimestamp"}]}
    >>> column_types(s)["at"]["name"]
    'io.debezium.time.MicroTimestamp'
    """
    if not isinstance(schema, dict):
        return _NO_TYPES
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return _NO_TYPES
    if field is not None:
        for f in fields:
            if isinstance(f, dict) and f.get("field") == field:
                return column_types(f)
        return _NO_TYPES
    return {
        f["field"]: f for f in fields if isinstance(f, dict) and isinstance(f.get("field"), str)
    }


class RowMapper:
    r"""Applies a :class:`RowMapping`: ``map(row)`` → ``(doc_id, tenant, op, time, payload)``.

    ``id_prefix`` is used when the mapping's own ``id_prefix`` is None (the
    table name and ``/`` for a table, nothing for messages).

    >>> m = RowMapper(RowMapping(id=["id"], text=["title", "body"], metadata=["n"]))
    >>> m.map({"id": 7, "title": "Hi", "body": "there", "n": 2}, record_time=1_000_000)
    ('7', 'default', <Op.UPSERT: 0>, 1000000, {'text': 'Hi\n\nthere', 'metadata': {'n': 2}})
    """

    def __init__(
        self, mapping: RowMapping, *, default_tenant: str = DEFAULT_TENANT, id_prefix: str = ""
    ) -> None:
        self.mapping = mapping
        self.default_tenant = default_tenant
        self.id_prefix = mapping.id_prefix if mapping.id_prefix is not None else id_prefix

    def doc_id(self, row: Mapping[str, Any], types: ColumnTypes = _NO_TYPES) -> str:
        """The document id of ``row`` (before :func:`check_change` strips it)."""
        parts: list[str] = []
        for column in self.mapping.id:
            if column not in row:
                msg = (
                    f"id column {column!r} is not in the row (its columns: {_columns(row)}); "
                    "set mapping.id to the column(s) that identify a row"
                )
                raise DecodeError(msg)
            part = as_text(plain(row[column], types.get(column)))
            if part is None:
                msg = f"id column {column!r} is null; every row needs a value in its id columns"
                raise DecodeError(msg)
            parts.append(part)
        return self.id_prefix + ":".join(parts)

    def map(
        self,
        row: Mapping[str, Any],
        *,
        op: Op = Op.UPSERT,
        record_time: Timestamp | None = None,
        types: ColumnTypes = _NO_TYPES,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[str, str, Op, Timestamp, dict[str, Any]]:
        """Map one row; raises :class:`DecodeError` with what to do when it cannot.

        ``record_time`` is the time the system stamped on the record (µs), used
        when the mapping names no event-time column; ``types`` the row's column
        schemas; ``metadata`` more metadata to add (the table).
        """
        mapping = self.mapping
        doc_id = self.doc_id(row, types)
        tenant = self._tenant(row, types, op)
        event_time = self._event_time(row, types, op, record_time)
        if op is Op.DELETE:
            doc_id, tenant, payload = check_change(doc_id, tenant, op)
            return doc_id, tenant, op, event_time, payload
        meta: dict[str, Any] = dict(metadata or {})
        for column in mapping.metadata:
            value = row.get(column)
            if value is not None:
                meta[column] = _json_safe(plain(value, types.get(column)))
        doc_id, tenant, payload = check_change(
            doc_id,
            tenant,
            op,
            text=self._text(row, types),
            title=self._column_text(row, mapping.title, types),
            domain=self._column_text(row, mapping.domain, types),
            metadata=meta,
        )
        return doc_id, tenant, op, event_time, payload

    def _tenant(self, row: Mapping[str, Any], types: ColumnTypes, op: Op) -> str:
        column = self.mapping.tenant
        if column is None:
            return self.default_tenant
        value = as_text(plain(row.get(column), types.get(column)))
        if value is not None:
            return value
        if op is Op.DELETE:
            msg = (
                f"a delete needs the tenant, but its row has no value in the tenant column "
                f"{column!r} (columns: {_columns(row)}); Debezium sends only the key columns "
                "of a deleted row unless the table has REPLICA IDENTITY FULL: set it, or make "
                "the tenant column part of the key"
            )
            raise DecodeError(msg)
        return self.default_tenant

    def _event_time(
        self, row: Mapping[str, Any], types: ColumnTypes, op: Op, record_time: Timestamp | None
    ) -> Timestamp:
        column = self.mapping.event_time
        if column is not None and row.get(column) is not None:
            try:
                ts = event_time_of(row[column], types.get(column))
            except ValueError as exc:
                if op is Op.DELETE and record_time is not None:
                    return record_time  # an old row's bad time must not keep a delete out
                msg = f"event-time column {column!r}: {exc}"
                raise DecodeError(msg) from None
            return ts if op is Op.UPSERT or record_time is None else max(ts, record_time)
        if column is not None and op is Op.UPSERT:
            msg = (
                f"event-time column {column!r} is missing or null in the row (columns: "
                f"{_columns(row)}); give every row its time, or unset mapping.event_time "
                "to use the time the system stamped on the record"
            )
            raise DecodeError(msg)
        if record_time is None:
            msg = (
                "no event time: set mapping.event_time to the column that holds it, or read "
                "from a source that stamps its records (a commit time, a message timestamp)"
            )
            raise DecodeError(msg)
        return record_time

    def _text(self, row: Mapping[str, Any], types: ColumnTypes) -> str:
        mapping = self.mapping
        if mapping.template is not None:
            return self._fill(row, types, mapping.template)
        parts = [as_text(plain(row.get(c), types.get(c))) for c in mapping.text]
        text = "\n\n".join(p for p in parts if p)
        absent = [c for c in mapping.text if c not in row]
        if not text.strip() and absent:
            msg = (
                f"the text column(s) {', '.join(map(repr, absent))} are not in the row (its "
                f"columns: {_columns(row)}); set mapping.text to the columns that hold the "
                "document body, or mapping.template"
            )
            raise DecodeError(msg)
        return text

    @staticmethod
    def _fill(row: Mapping[str, Any], types: ColumnTypes, template: str) -> str:
        try:
            return template.format_map(_TemplateValues(row, types))
        except KeyError as exc:
            msg = (
                f"mapping.template names the column {exc.args[0]!r}, which the row lacks "
                f"(its columns: {_columns(row)}); fix the template"
            )
            raise DecodeError(msg) from None
        except (ValueError, IndexError, AttributeError, TypeError) as exc:
            msg = (
                f"mapping.template cannot be filled from this row ({type(exc).__name__}: "
                f"{exc}); use only {{column}} names, with formats that suit the values"
            )
            raise DecodeError(msg) from None

    @staticmethod
    def _column_text(row: Mapping[str, Any], column: str | None, types: ColumnTypes) -> str | None:
        if column is None:
            return None
        return as_text(plain(row.get(column), types.get(column)))


class _TemplateValues(Mapping[str, Any]):
    """The row as a template sees it: typed values read, null as "", objects as JSON."""

    def __init__(self, row: Mapping[str, Any], types: ColumnTypes) -> None:
        self.row = row
        self.types = types

    def __getitem__(self, key: str) -> Any:
        value = plain(self.row[key], self.types.get(key))
        if value is None or isinstance(value, bool | dict | list):
            return as_text(value) or ""
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.row)

    def __len__(self) -> int:
        return len(self.row)


def as_text(value: Any) -> str | None:
    """A column value as text: None stays None, objects and lists become JSON.

    >>> as_text(None), as_text(3), as_text(True), as_text({"a": [1]}), as_text(Decimal("1.50"))
    (None, '3', 'true', '{"a":[1]}', '1.50')
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    return msgspec.json.encode(value).decode("utf-8")


def plain(value: Any, field: Mapping[str, Any] | None) -> Any:
    """A value read as its semantic type says (timestamps → ISO-8601, decimals → Decimal).

    A value that does not fit its type is left as it is.

    >>> plain(1714564800000000, {"name": "io.debezium.time.MicroTimestamp"})
    '2024-05-01T12:00:00Z'
    >>> plain("AJw=", {"name": "org.apache.kafka.connect.data.Decimal",
    ...                "parameters": {"scale": "2"}})
    Decimal('1.56')
    """
    name = field.get("name") if field else None
    if value is None or not isinstance(name, str):
        return value
    try:
        if name in _TS_UNITS or name == _NANO_TS:
            return format_timestamp(_epoch_us(value, name))
        if name in _DATES and _is_int(value):
            return (date(1970, 1, 1) + timedelta(days=value)).isoformat()
        if name in _TIMES_OF_DAY and _is_int(value):
            times, per = _TIMES_OF_DAY[name]
            us = value * times // per
            return (
                (datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).time().isoformat()
            )
        if name in (_DECIMAL, _VARIABLE_DECIMAL):
            return _decimal(value, field)
    except (ArithmeticError, ValueError, OverflowError, OSError, TypeError):
        return value
    return value


def event_time_of(value: Any, field: Mapping[str, Any] | None = None) -> Timestamp:
    """An event-time column's value as µs: by its semantic type, else :func:`parse_timestamp`.

    Raises ``ValueError`` (a :class:`~streamrag.errors.TimestampError` or
    :class:`DecodeError`) that says what was found and what to send.

    >>> event_time_of(1714564800000, {"name": "io.debezium.time.Timestamp"})
    1714564800000000
    >>> event_time_of("2024-05-01T12:00:00Z")
    1714564800000000
    """
    name = field.get("name") if field else None
    if name in _TS_UNITS or name == _NANO_TS:
        return _epoch_us(value, name)
    if name in _DATES:
        if not _is_int(value):
            msg = f"a {name} holds days since the epoch, found {value!r}"
            raise DecodeError(msg)
        return _in_range(value * _DAY_US, value)
    if name in _TIMES_OF_DAY or name == _ZONED_TIME:
        msg = f"a time of day ({name}) is not a point in time; name a timestamp column"
        raise DecodeError(msg)
    if name in (_DECIMAL, _VARIABLE_DECIMAL):
        return _decimal_seconds(_decimal(value, field))
    if _is_int(value) and not isinstance(value, bool) and abs(value) > 253_402_300_799:
        msg = (
            f"{value!r} is too large for epoch seconds: it looks like milliseconds or "
            "microseconds, which cannot be told apart without a schema; send the record with "
            "its schema (Kafka Connect value.converter.schemas.enable=true), as ISO-8601, "
            "or in epoch seconds"
        )
        raise DecodeError(msg)
    return parse_timestamp(value)


def _epoch_us(value: Any, name: str | None) -> Timestamp:
    if not _is_int(value):
        msg = f"a {name} holds an integer since the epoch, found {value!r}"
        raise DecodeError(msg)
    ts: int = value // 1000 if name == _NANO_TS else value * _TS_UNITS[name or ""]
    return _in_range(ts, value)


def _in_range(ts: Timestamp, value: Any) -> Timestamp:
    if not _FIRST_US <= ts <= _LAST_US:
        msg = f"{value!r} is outside years 1–9999 in its unit; check the column's type"
        raise DecodeError(msg)
    return ts


def _decimal(value: Any, field: Mapping[str, Any] | None) -> Decimal:
    scale: Any
    if isinstance(value, dict):  # VariableScaleDecimal
        scale, value = value.get("scale"), value.get("value")
    else:
        params = (field or {}).get("parameters") or {}
        scale = params.get("scale", 0) if isinstance(params, dict) else 0
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(str(value))  # decimal.handling.mode=double sends a number
    if not isinstance(value, str):
        msg = f"a decimal holds base64 of its unscaled value, found {value!r}"
        raise DecodeError(msg)
    try:
        unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(scale))
    except (binascii.Error, ValueError, TypeError, ArithmeticError):
        msg = f"a decimal holds base64 of its unscaled value and a scale, found {value!r}"
        raise DecodeError(msg) from None


def _decimal_seconds(seconds: Decimal) -> Timestamp:
    if not seconds.is_finite():
        msg = f"epoch seconds {seconds} are not a number"
        raise DecodeError(msg)
    parse_timestamp(int(seconds))  # the range check
    return int((seconds * US_PER_S).to_integral_value(ROUND_HALF_EVEN))


def _json_safe(value: Any) -> Any:
    if isinstance(value, Decimal):
        if value == value.to_integral_value() and abs(value) < 2**63:
            return int(value)
        as_float = float(value)
        return as_float if math.isfinite(as_float) else str(value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _columns(row: Mapping[str, Any]) -> str:
    names = [str(c) for c in list(row)[:30]]
    more = f", … ({len(row)} in all)" if len(row) > 30 else ""
    return (", ".join(names) + more) if names else "none"


class RowDecoder:
    """The ``row`` record format: each record a JSON object, mapped to an upsert.

    The object may come wrapped by Kafka Connect's JSON converter
    (``{"schema", "payload"}``); its schema then types the columns. The event
    time is the mapping's ``event_time`` column, else the record's own time
    (``RawBatch.times``: the message timestamp). One outcome per record: a
    record that cannot become a change is a dead letter whose reason says what
    was expected and what to do; ``decode`` never raises.
    """

    stage = "decode"

    def __init__(
        self,
        mapping: RowMapping,
        *,
        default_tenant: str = DEFAULT_TENANT,
        max_document_bytes: int = 1_000_000,
        id_prefix: str = "",
    ) -> None:
        self.mapper = RowMapper(mapping, default_tenant=default_tenant, id_prefix=id_prefix)
        self.max_document_bytes = max_document_bytes
        self._decode = msgspec.json.Decoder().decode

    @classmethod
    def from_settings(
        cls,
        spec: KafkaSourceSettings | NatsSourceSettings | RedisSourceSettings,
        *,
        default_tenant: str,
        max_document_bytes: int,
    ) -> RowDecoder:
        """The decoder of a message connector whose ``format`` is ``row``."""
        return cls(
            spec.mapping, default_tenant=default_tenant, max_document_bytes=max_document_bytes
        )

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode every record; good ones become upserts, bad ones dead letters."""
        return decode_each(
            raws, self.stage, self.max_document_bytes, lambda line, _, time: self._one(line, time)
        )

    def _one(self, line: bytes, time: Timestamp | None) -> tuple[str, str, Op, int, dict[str, Any]]:
        if line.startswith(_BOM):
            line = line[len(_BOM) :]
        row, schema = unwrap(self._decode(line))
        if not isinstance(row, dict):
            msg = (
                f"expected a JSON object (a row of column: value), found "
                f"{_kind(row)}; each record must be one JSON object"
            )
            raise DecodeError(msg)
        return self.mapper.map(row, record_time=time, types=column_types(schema))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {str: "a string", bool: "a boolean", list: "an array"}.get(type(value), "a number")
