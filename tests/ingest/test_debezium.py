"""Debezium change events: each op, the schema wrapper, tombstones, tables, and hostile bytes.

The samples are written by hand in the shape of the Debezium PostgreSQL
connector's events (Debezium docs, "Debezium connector for PostgreSQL", change
event keys and values), for a table::

    CREATE TABLE public.tickets (id int PRIMARY KEY, subject text, body text,
                                 org text, price numeric(10, 2), updated_at timestamp);
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.changes import Change, Op
from streamrag.config.sources import (
    KafkaSourceSettings,
    PostgresSourceSettings,
    RedisSourceSettings,
    RowMapping,
)
from streamrag.ingest import Decoder
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.debezium import DebeziumDecoder
from streamrag.ingest.formats import DecoderSet
from streamrag.sources.base import RawBatch

TS_MS = 1_714_564_800_123  # source.ts_ms: the commit, 2024-05-01T12:00:00.123Z
T0 = TS_MS * 1000
KAFKA_TS = T0 + 5_000_000  # the Kafka record timestamp, a little later
MAPPING = RowMapping(text=["subject", "body"], metadata=["org"])

_ROW_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "subject"},
    {"type": "string", "optional": True, "field": "body"},
    {"type": "string", "optional": True, "field": "org"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price",
    },
    {
        "type": "int64",
        "optional": True,
        "name": "io.debezium.time.MicroTimestamp",
        "version": 1,
        "field": "updated_at",
    },
]
VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "pg.public.tickets.Value",
            "field": "before",
        },
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "pg.public.tickets.Value",
            "field": "after",
        },
        {"type": "struct", "fields": [], "optional": False, "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "pg.public.tickets.Envelope",
}
KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "int32", "optional": False, "field": "id"}],
    "optional": False,
    "name": "pg.public.tickets.Key",
}


def _dec(unscaled: int) -> str:
    n = (unscaled.bit_length() + 8) // 8
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


def _source(table: str = "tickets", schema: str = "public", **more: Any) -> dict[str, Any]:
    return {
        "version": "2.5.0.Final",
        "connector": "postgresql",
        "name": "pg",
        "ts_ms": TS_MS,
        "snapshot": "false",
        "db": "shop",
        "schema": schema,
        "table": table,
        "txId": 771,
        "lsn": 24023128,
        **more,
    }


def _row(i: int, subject: str = "Disk full", **more: Any) -> dict[str, Any]:
    row = {"id": i, "subject": subject, "body": "on db-1", "org": "acme", "price": None}
    return {**row, "updated_at": None, **more}


def _event(op: str, before: Any = None, after: Any = None, **source: Any) -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "source": _source(**source),
        "op": op,
        "ts_ms": TS_MS + 40,
        "transaction": None,
    }


def _wrap(payload: Any, schema: dict[str, Any] = VALUE_SCHEMA) -> dict[str, Any]:
    return {"schema": schema, "payload": payload}


def _j(value: Any) -> bytes:
    return json.dumps(value).encode()


def _decode(
    decoder: DebeziumDecoder,
    lines: list[bytes],
    keys: list[bytes | None] | None = None,
    times: list[int | None] | None = None,
) -> list[Change | DeadLetter]:
    """Through DecoderSet; asserts exactly one outcome per record; outcomes in record order."""
    offsets = [100 + 10 * i for i in range(len(lines))]
    if times is None:
        times = [KAFKA_TS] * len(lines)
    raw = RawBatch("cdc:p-0", lines, offsets, 999, decoder="cdc", keys=keys, times=times)
    batch, letters = DecoderSet(Decoder(), {"cdc": decoder}).decode([raw])
    found: dict[int, Change | DeadLetter] = {}
    items: list[Change | DeadLetter] = [*batch.to_changes(), *letters]
    for item in items:
        assert item.offset not in found, f"two outcomes for offset {item.offset}"
        found[item.offset] = item
    assert sorted(found) == offsets, "a record without an outcome"
    for letter in letters:
        assert (letter.source, letter.stage) == ("cdc:p-0", "decode")
    return [found[o] for o in offsets]


def _kafka(mapping: RowMapping = MAPPING) -> DebeziumDecoder:
    spec = KafkaSourceSettings(
        kind="kafka", name="cdc", topics=["pg.public.tickets"], format="debezium", mapping=mapping
    )
    return DebeziumDecoder.from_settings(spec, default_tenant="default", max_document_bytes=50_000)


def _change(item: Change | DeadLetter) -> Change:
    assert isinstance(item, Change), item
    return item


def _reason(item: Change | DeadLetter) -> str:
    assert isinstance(item, DeadLetter), item
    return item.reason


@pytest.mark.parametrize("wrapped", [False, True])
def test_each_row_op_with_and_without_the_schema_wrapper(wrapped: bool) -> None:
    events = [
        _event("r", after=_row(1), snapshot="true"),
        _event("c", after=_row(2)),
        _event("u", before=None, after=_row(2, "Disk still full")),
        _event("d", before=_row(1)),
    ]
    lines = [_j(_wrap(e) if wrapped else e) for e in events]
    snap, create, update, delete = map(_change, _decode(_kafka(), lines))
    assert (snap.doc_id, snap.op, snap.text) == ("1", Op.UPSERT, "Disk full\n\non db-1")
    assert snap.payload["metadata"] == {"org": "acme", "table": "public.tickets"}
    assert (create.doc_id, create.event_time, create.tenant) == ("2", T0, "default")
    assert (update.doc_id, update.op, update.text) == ("2", Op.UPSERT, "Disk still full\n\non db-1")
    assert (delete.doc_id, delete.op, delete.payload, delete.event_time) == ("1", Op.DELETE, {}, T0)


def test_event_time_prefers_ts_us_then_ts_ms_then_the_envelope_then_the_record() -> None:
    both = _event("c", after=_row(1))
    both["source"]["ts_us"] = T0 + 456
    only_envelope = _event("c", after=_row(2))
    del only_envelope["source"]["ts_ms"]
    bare = {"op": "c", "after": _row(3)}
    lines = [_j(both), _j(_event("c", after=_row(4))), _j(only_envelope), _j(bare), _j(bare)]
    out = _decode(_kafka(), lines, times=[KAFKA_TS] * 4 + [None])
    assert [_change(c).event_time for c in out[:4]] == [T0 + 456, T0, T0 + 40_000, KAFKA_TS]
    assert "no event time: set mapping.event_time" in _reason(out[4])


def test_typed_event_time_and_decimal_columns_through_the_schema() -> None:
    mapping = RowMapping(text=["subject"], metadata=["price"], event_time="updated_at")
    at = 1_714_000_000_000_001
    row = _row(7, price=_dec(123_456), updated_at=at)
    out = _decode(_kafka(mapping), [_j(_wrap(_event("c", after=row)))])
    change = _change(out[0])
    assert change.event_time == at
    assert change.payload["metadata"] == {"price": 1234.56, "table": "public.tickets"}
    unwrapped = _decode(_kafka(mapping), [_j(_event("c", after=row))])
    assert "looks like milliseconds or microseconds" in _reason(unwrapped[0])
    assert "schemas.enable=true" in _reason(unwrapped[0])


def test_tombstones_delete_by_key_or_dead_letter_without_one() -> None:
    wrapped_key = _j(_wrap({"id": 5}, KEY_SCHEMA))
    lines = [b"", b"null", b'{"schema": null, "payload": null}', b" null \n", b"", b""]
    keys: list[bytes | None] = [b'{"id": 5}', wrapped_key, b"5", b'{"id": 6}', None, b"null"]
    out = _decode(_kafka(), lines, keys=keys)
    deletes = [_change(c) for c in out[:4]]
    assert [(c.doc_id, c.op, c.event_time) for c in deletes] == [
        ("5", Op.DELETE, KAFKA_TS),
        ("5", Op.DELETE, KAFKA_TS),
        ("5", Op.DELETE, KAFKA_TS),
        ("6", Op.DELETE, KAFKA_TS),
    ]
    for letter in out[4:]:
        assert "a tombstone (a null value) without a key names no document" in _reason(letter)
        assert "tombstones.on.delete=false" in _reason(letter)


def test_a_primary_key_change_is_a_delete_a_tombstone_and_a_create() -> None:
    # UPDATE tickets SET id = 9 WHERE id = 1: Debezium sends three records.
    lines = [_j(_event("d", before=_row(1))), b"", _j(_event("c", after=_row(9)))]
    keys: list[bytes | None] = [b'{"id": 1}', b'{"id": 1}', b'{"id": 9}']
    gone, again, new = map(_change, _decode(_kafka(), lines, keys=keys))
    assert [(c.doc_id, c.op) for c in (gone, again, new)] == [
        ("1", Op.DELETE),
        ("1", Op.DELETE),
        ("9", Op.UPSERT),
    ]


def test_a_delete_without_before_takes_the_key_and_without_either_is_refused() -> None:
    lines = [_j(_event("d", before=None))] * 2 + [_j(_event("d", before={"id": None}))]
    out = _decode(_kafka(), lines, keys=[b'{"id": 3}', None, b'{"id": 4}'])
    assert (_change(out[0]).doc_id, _change(out[0]).op) == ("3", Op.DELETE)
    assert "without a 'before' row or a record key" in _reason(out[1])
    assert _change(out[2]).doc_id == "4"


def test_a_tenant_from_a_column_must_be_in_what_a_delete_carries() -> None:
    mapping = RowMapping(text=["subject"], tenant="org")
    key_only = {"id": 1, "subject": None, "body": None, "org": None}  # REPLICA IDENTITY DEFAULT
    lines = [
        _j(_event("c", after=_row(1))),
        _j(_event("d", before=_row(1))),
        _j(_event("d", before=key_only)),
        b"",
    ]
    out = _decode(_kafka(mapping), lines, keys=[None, None, None, b'{"id": 1}'])
    assert (_change(out[0]).tenant, _change(out[1]).tenant) == ("acme", "acme")
    assert "REPLICA IDENTITY FULL" in _reason(out[2])
    assert "a tombstone's key has no tenant column 'org'" in _reason(out[3])


def test_truncate_message_and_unknown_ops_dead_letter_with_what_to_do() -> None:
    truncate = {"op": "t", "source": _source(), "ts_ms": TS_MS}
    message = {
        "op": "m",
        "source": _source(table=""),
        "message": {"prefix": "audit", "content": "aGk="},
    }
    lines = [_j(truncate), _j(message), _j(_event("x", after=_row(1))), _j({"ts_ms": TS_MS})]
    out = _decode(_kafka(), lines)
    assert "TRUNCATE of public.tickets" in _reason(out[0])
    assert "skipped.operations=t" in _reason(out[0])
    assert "logical decoding message (op 'm')" in _reason(out[1])
    assert "found op 'x'" in _reason(out[2])
    assert "found op None" in _reason(out[3])


def test_hostile_records_dead_letter_and_their_neighbours_decode() -> None:
    deep = b'{"op": "c", "after": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    lines = [
        b"\x00\xff garbage",
        b'{"op": "c", "after": ',
        deep,
        b"[1, 2]",
        _j(_event("c", after=[1])),
        _j(_event("u", after=None)),
        _j(_event("c", after={"ticket": 1, "subject": "x"})),
        _j(_event("c", after=_row(1, subject="", body=None))),
        b"\xef\xbb\xbf" + _j(_event("c", after=_row(2))),
        b'{"op": "c", "after": "' + b"x" * 60_000 + b'"}',
    ]
    out = _decode(_kafka(), lines, keys=[b"not json"] + [None] * 9)
    reasons = [_reason(x) for x in out[:8]] + [_reason(out[9])]
    assert reasons[0].startswith("not JSON")
    assert reasons[1].startswith("not JSON")
    assert "nested too deeply" in reasons[2]
    assert "expected a Debezium change event" in reasons[3]
    assert "needs the new row in 'after', found list" in reasons[4]
    assert "needs the new row in 'after', found null" in reasons[5]
    assert "id column 'id' is not in the row (its columns: ticket, subject)" in reasons[6]
    assert "an upsert needs a non-empty text" in reasons[7]
    assert _change(out[8]).doc_id == "2"
    assert "above ingest.max_document_bytes=50,000" in reasons[8]


def test_a_tombstone_whose_key_is_not_json_says_so() -> None:
    out = _decode(_kafka(), [b""], keys=[b"\x00garbage"])
    assert "the record key" in _reason(out[0])
    assert "is not JSON" in _reason(out[0])


def test_a_template_makes_the_text() -> None:
    mapping = RowMapping(template="[{org}] {subject}: {body} ({price})")
    row = _row(1, price=_dec(-50))
    out = _decode(_kafka(mapping), [_j(_wrap(_event("c", after=row)))])
    assert _change(out[0]).text == "[acme] Disk full: on db-1 (-0.50)"


def _postgres(**kw: Any) -> DebeziumDecoder:
    spec = PostgresSourceSettings(kind="postgres", name="db", tables=kw.pop("tables"), **kw)
    return DebeziumDecoder.from_settings(spec, default_tenant="t0", max_document_bytes=50_000)


def test_the_streamrag_postgres_envelope_routes_by_table_with_a_table_prefix() -> None:
    decoder = _postgres(
        tables=["public.tickets", "support.notes"],
        mapping=MAPPING,
        table_mappings={"support.notes": RowMapping(id=["note_id"], text=["note"])},
    )

    def pg(op: str, table: str, schema: str, before: Any, after: Any) -> bytes:
        source = {
            "ts_ms": TS_MS,
            "ts_us": T0 + 1,
            "schema": schema,
            "table": table,
            "lsn": 24023128,
            "connector": "postgresql",
            "name": "db",
        }
        return _j({"before": before, "after": after, "op": op, "source": source})

    lines = [
        pg("r", "tickets", "public", None, _row(1)),
        pg("c", "notes", "support", None, {"note_id": "n1", "note": "call back"}),
        pg("u", "tickets", "public", {"id": 1}, _row(1, "new")),
        pg("d", "notes", "support", {"note_id": "n1", "note": None}, None),
        pg("c", "secrets", "public", None, _row(2)),
        _j({"op": "c", "after": _row(3), "source": {"ts_ms": TS_MS}}),
    ]
    out = _decode(decoder, lines)
    snap, note, upd, gone = map(_change, out[:4])
    assert (snap.doc_id, snap.tenant, snap.event_time) == ("tickets/1", "t0", T0 + 1)
    assert snap.payload["metadata"] == {"org": "acme", "table": "public.tickets"}
    assert (note.doc_id, note.text, note.payload["metadata"]) == (
        "notes/n1",
        "call back",
        {"table": "support.notes"},
    )
    assert (upd.doc_id, upd.text) == ("tickets/1", "new\n\non db-1")
    assert (gone.doc_id, gone.op) == ("notes/n1", Op.DELETE)
    assert "table 'public.secrets' is not one this source follows" in _reason(out[4])
    assert "names no table" in _reason(out[5])


def test_postgres_tombstones_find_their_table_and_an_explicit_prefix_wins() -> None:
    one = _postgres(tables=["tickets"], mapping=RowMapping(id_prefix="T-"))
    assert _change(_decode(one, [b""], keys=[b'{"id": 1}'])[0]).doc_id == "T-1"
    two = _postgres(tables=["public.tickets", "public.notes"])
    keys: list[bytes | None] = [_j(_wrap({"id": 1}, KEY_SCHEMA)), b'{"id": 1}']
    out = _decode(two, [b"", b""], keys=keys)
    assert _change(out[0]).doc_id == "tickets/1"
    assert "names no table" in _reason(out[1])


def test_from_settings_of_a_message_source_prefixes_nothing() -> None:
    spec = RedisSourceSettings(kind="redis", name="r", streams=["s"], format="debezium")
    decoder = DebeziumDecoder.from_settings(spec, default_tenant="d", max_document_bytes=10)
    assert decoder.tables is None
    assert decoder.mapper.id_prefix == ""


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=12,
)
_ENVELOPE = st.fixed_dictionaries(
    {},
    optional={
        "op": st.sampled_from(["c", "u", "d", "r", "t", "m", "x"]) | _JSON,
        "before": st.none() | st.fixed_dictionaries({}, optional={"id": _JSON, "org": _JSON}),
        "after": st.none() | _JSON | st.fixed_dictionaries({}, optional={"id": _JSON}),
        "source": _JSON
        | st.fixed_dictionaries(
            {}, optional={"ts_ms": _JSON, "ts_us": _JSON, "table": _JSON, "schema": _JSON}
        ),
        "ts_ms": _JSON,
    },
).map(lambda e: json.dumps(e).encode())
_LINE = st.one_of(
    st.binary(max_size=60),
    _ENVELOPE,
    _ENVELOPE.map(lambda b: b'{"schema": {}, "payload": ' + b + b"}"),
)
_KEY = st.none() | st.binary(max_size=20) | _JSON.map(lambda v: json.dumps(v).encode())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_LINE, _KEY), max_size=8), st.booleans(), st.booleans())
def test_any_bytes_give_one_outcome_per_record(
    records: list[tuple[bytes, bytes | None]], postgres: bool, timed: bool
) -> None:
    mapping = RowMapping(text=["text"], tenant="org", event_time="at", metadata=["id"])
    if postgres:
        decoder = _postgres(tables=["public.tickets", "s.t"], mapping=mapping)
    else:
        decoder = _kafka(mapping)
    lines = [line for line, _ in records]
    keys = [key for _, key in records]
    _decode(decoder, lines, keys=keys, times=[KAFKA_TS if timed else None] * len(lines))
