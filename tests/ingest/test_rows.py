"""Rows into documents: the mapping, typed columns, and the ``row`` record format."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.changes import Op
from streamrag.config.sources import KafkaSourceSettings, RowMapping
from streamrag.errors import DecodeError
from streamrag.ingest import Decoder
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import DecoderSet
from streamrag.ingest.rows import RowDecoder, RowMapper, column_types, event_time_of
from streamrag.sources.base import RawBatch

T0 = 1_714_564_800_000_000  # 2024-05-01T12:00:00Z in µs


def _dec(value: int, scale: int) -> str:
    """Kafka Connect's Decimal: base64 of the unscaled big-endian two's complement."""
    n = (value.bit_length() + 8) // 8
    return base64.b64encode(value.to_bytes(n, "big", signed=True)).decode()


def test_id_text_title_domain_tenant_and_metadata() -> None:
    mapping = RowMapping(
        id=["org", "number"],
        id_prefix="t/",
        text=["subject", "body", "notes"],
        title="subject",
        domain="area",
        tenant="org",
        metadata=["prio", "tags", "extra", "missing"],
    )
    row = {
        "org": "acme",
        "number": 7,
        "subject": "Disk full",
        "body": "on db-1",
        "notes": None,
        "area": "ops",
        "prio": 2,
        "tags": ["a", "b"],
        "extra": {"k": True},
    }
    doc_id, tenant, op, ts, payload = RowMapper(mapping).map(row, record_time=T0)
    assert (doc_id, tenant, op, ts) == ("t/acme:7", "acme", Op.UPSERT, T0)
    assert payload == {
        "text": "Disk full\n\non db-1",
        "title": "Disk full",
        "domain": "ops",
        "metadata": {"prio": 2, "tags": ["a", "b"], "extra": {"k": True}},
    }


def test_values_of_every_json_type_become_text() -> None:
    mapping = RowMapping(text=["s", "i", "f", "b", "o", "l", "n"])
    row = {"id": 1, "s": "x", "i": 3, "f": 1.5, "b": False, "o": {"a": 1}, "l": [1, "z"], "n": None}
    *_, payload = RowMapper(mapping).map(row, record_time=T0)
    assert payload["text"] == 'x\n\n3\n\n1.5\n\nfalse\n\n{"a":1}\n\n[1,"z"]'


def test_the_default_prefix_applies_only_when_the_mapping_sets_none() -> None:
    row = {"id": 5, "text": "hi"}
    assert RowMapper(RowMapping(), id_prefix="tickets/").map(row, record_time=T0)[0] == "tickets/5"
    explicit = RowMapping(id_prefix="")
    assert RowMapper(explicit, id_prefix="tickets/").map(row, record_time=T0)[0] == "5"


def test_a_missing_id_column_names_it_and_the_columns_there_are() -> None:
    with pytest.raises(DecodeError) as err:
        RowMapper(RowMapping(id=["ticket_id"])).map({"id": 1, "text": "x"}, record_time=T0)
    assert "id column 'ticket_id' is not in the row (its columns: id, text)" in str(err.value)
    with pytest.raises(DecodeError, match="id column 'id' is null"):
        RowMapper(RowMapping()).map({"id": None, "text": "x"}, record_time=T0)


def test_a_template_fills_from_the_columns() -> None:
    mapping = RowMapping(template="{subject}\n\n{body} (prio {prio:03d}) {tags}{none}")
    row = {"id": 1, "subject": "S", "body": "B", "prio": 7, "tags": ["x"], "none": None}
    *_, payload = RowMapper(mapping).map(row, record_time=T0)
    assert payload["text"] == 'S\n\nB (prio 007) ["x"]'
    with pytest.raises(DecodeError, match="names the column 'body', which the row lacks"):
        RowMapper(mapping).map({"id": 1, "subject": "S"}, record_time=T0)
    with pytest.raises(DecodeError, match="cannot be filled"):
        RowMapper(RowMapping(template="{} {id}")).map({"id": 1}, record_time=T0)


def test_text_columns_that_are_absent_are_named() -> None:
    with pytest.raises(DecodeError, match="text column\\(s\\) 'text' are not in the row"):
        RowMapper(RowMapping()).map({"id": 1, "body": "x"}, record_time=T0)
    with pytest.raises(DecodeError, match="an upsert needs a non-empty text"):
        RowMapper(RowMapping()).map({"id": 1, "text": "  "}, record_time=T0)


def test_event_time_from_the_column_else_the_record_time_else_refused() -> None:
    on_column = RowMapper(RowMapping(event_time="at"))
    row = {"id": 1, "text": "x", "at": "2024-05-01T14:00:00+02:00"}
    assert on_column.map(row, record_time=5)[3] == T0
    assert on_column.map({**row, "at": 1714564800}, record_time=5)[3] == T0
    with pytest.raises(DecodeError, match="'at' is missing or null"):
        on_column.map({"id": 1, "text": "x"}, record_time=5)
    with pytest.raises(DecodeError, match="looks like milliseconds or microseconds"):
        on_column.map({**row, "at": T0 // 1000}, record_time=5)
    with pytest.raises(DecodeError, match="no time zone"):
        on_column.map({**row, "at": "2024-05-01T12:00:00"}, record_time=5)
    plain = RowMapper(RowMapping())
    assert plain.map({"id": 1, "text": "x"}, record_time=T0)[3] == T0
    with pytest.raises(DecodeError, match="no event time: set mapping"):
        plain.map({"id": 1, "text": "x"})


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ({"type": "int64", "name": "io.debezium.time.Timestamp"}, T0 // 1000, T0),
        ({"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}, T0 // 1000, T0),
        ({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, T0 + 7, T0 + 7),
        ({"type": "int64", "name": "io.debezium.time.NanoTimestamp"}, T0 * 1000 + 999, T0),
        ({"type": "int32", "name": "io.debezium.time.Date"}, 19_844, 19_844 * 86_400 * 10**6),
        (
            {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
            "2024-05-01T12:00:00.25Z",
            T0 + 250_000,
        ),
        (
            {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "3", "connect.decimal.precision": "13"},
            },
            _dec(1_714_564_800_125, 3),
            T0 + 125_000,
        ),
        (
            {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
            {"scale": 1, "value": _dec(17_145_648_005, 1)},
            T0 + 500_000,
        ),
        ({"type": "int64"}, 1714564800, T0),
    ],
)
def test_typed_event_time_columns(field: dict[str, Any], value: Any, expected: int) -> None:
    assert event_time_of(value, field) == expected


def test_times_of_day_and_bad_typed_values_are_refused_with_reasons() -> None:
    with pytest.raises(DecodeError, match="a time of day"):
        event_time_of(3_600_000, {"name": "io.debezium.time.MicroTime"})
    with pytest.raises(DecodeError, match="holds an integer since the epoch"):
        event_time_of("soon", {"name": "io.debezium.time.MicroTimestamp"})
    with pytest.raises(DecodeError, match="outside years 1–9999"):
        event_time_of(2**62, {"name": "io.debezium.time.Timestamp"})
    with pytest.raises(DecodeError, match="base64 of its unscaled value"):
        event_time_of("not base64!", {"name": "org.apache.kafka.connect.data.Decimal"})


def test_typed_columns_read_as_what_they_mean_in_text_and_metadata() -> None:
    schema = {
        "type": "struct",
        "fields": [
            {"field": "id", "type": "int32"},
            {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
            {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
            {
                "field": "price",
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "2"},
            },
            {
                "field": "qty",
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "0"},
            },
            {"field": "t", "type": "int64", "name": "io.debezium.time.MicroTime"},
        ],
    }
    mapping = RowMapping(
        template="{price} on {day} at {t}", metadata=["at", "price", "qty"], event_time="at"
    )
    row = {"id": 1, "at": T0, "day": 19_844, "price": _dec(-1999, 2), "qty": _dec(3, 0)}
    row["t"] = 3_723_000_001
    *_, ts, payload = RowMapper(mapping).map(row, types=column_types(schema))
    assert ts == T0
    assert payload["text"] == "-19.99 on 2024-05-01 at 01:02:03.000001"
    assert payload["metadata"] == {"at": "2024-05-01T12:00:00Z", "price": -19.99, "qty": 3}


def test_a_delete_maps_only_the_key_and_never_sorts_before_what_it_removes() -> None:
    mapping = RowMapping(tenant="org", event_time="at")
    mapper = RowMapper(mapping)
    before = {"id": 1, "org": "acme", "at": "2024-05-01T12:00:09Z"}
    later = T0 + 9_000_000
    assert mapper.map(before, op=Op.DELETE, record_time=T0) == ("1", "acme", Op.DELETE, later, {})
    assert mapper.map(before, op=Op.DELETE, record_time=T0 + 10**7)[3] == T0 + 10**7
    assert mapper.map({"id": 1, "org": "acme"}, op=Op.DELETE, record_time=T0)[3] == T0
    unreadable = {**before, "at": "yesterday"}
    assert mapper.map(unreadable, op=Op.DELETE, record_time=T0)[3] == T0
    with pytest.raises(DecodeError, match=r"a delete needs the tenant.*REPLICA IDENTITY FULL"):
        mapper.map({"id": 1, "org": None}, op=Op.DELETE, record_time=T0)
    assert mapper.map({"id": 1, "text": "x", "at": 1714564800}, record_time=0)[1] == "default"


# --- the row record format -------------------------------------------------------------------


def _through_set(
    decoder: RowDecoder, lines: list[bytes], times: list[int | None] | None = None, **kw: Any
) -> dict[int, Any]:
    """Decode via DecoderSet; exactly one outcome per record, keyed by offset."""
    offsets = [10 * i for i in range(len(lines))]
    raw = RawBatch("kafka:k:t-0", lines, offsets, 10 * len(lines), decoder="k", times=times, **kw)
    batch, letters = DecoderSet(Decoder(), {"k": decoder}).decode([raw])
    outcomes: dict[int, Any] = {}
    for change in batch.to_changes():
        assert change.offset not in outcomes
        outcomes[change.offset] = change
    for letter in letters:
        assert letter.offset not in outcomes
        assert (letter.source, letter.stage) == ("kafka:k:t-0", "decode")
        outcomes[letter.offset] = letter
    assert sorted(outcomes) == offsets
    return outcomes


def test_row_decoder_turns_each_record_into_one_outcome() -> None:
    spec = KafkaSourceSettings(
        kind="kafka",
        name="k",
        topics=["t"],
        format="row",
        mapping=RowMapping(id=["sku"], text=["name", "desc"], metadata=["price"]),
    )
    decoder = RowDecoder.from_settings(spec, default_tenant="shop", max_document_bytes=20_000)
    wrapped = {
        "schema": {
            "type": "struct",
            "fields": [
                {"field": "sku", "type": "string"},
                {
                    "field": "price",
                    "type": "bytes",
                    "name": "org.apache.kafka.connect.data.Decimal",
                    "parameters": {"scale": "2"},
                },
            ],
        },
        "payload": {"sku": "B2", "name": "Bolt", "price": _dec(250, 2)},
    }
    lines = [
        b'\xef\xbb\xbf{"sku": "A1", "name": "Anvil", "desc": "heavy"}',
        json.dumps(wrapped).encode(),
        b"not json at all \xff",
        b"[1, 2]",
        b"null",
        b'{"name": "no sku"}',
        b"[" * 5000 + b"]" * 5000,
        b'{"sku": "C3", "name": "' + b"x" * 25_000 + b'"}',
        b'{"sku": "D4", "name": "cut"}',
    ]
    out = _through_set(decoder, lines, times=[T0 + i for i in range(9)], sizes={8: 30_000})
    a, b = out[0], out[10]
    assert (a.tenant, a.doc_id, a.op, a.event_time, a.text) == (
        "shop",
        "A1",
        Op.UPSERT,
        T0,
        "Anvil\n\nheavy",
    )
    assert (b.doc_id, b.text, b.payload["metadata"], b.event_time) == (
        "B2",
        "Bolt",
        {"price": 2.5},
        T0 + 1,
    )
    reasons = {off: letter.reason for off, letter in out.items() if isinstance(letter, DeadLetter)}
    assert sorted(reasons) == [20, 30, 40, 50, 60, 70, 80]
    assert reasons[20].startswith("not JSON") or reasons[20].startswith("not UTF-8")
    assert "expected a JSON object (a row of column: value), found an array" in reasons[30]
    assert "found null" in reasons[40]
    assert "id column 'sku' is not in the row (its columns: name)" in reasons[50]
    assert "nested too deeply" in reasons[60]
    assert "above ingest.max_document_bytes=20,000" in reasons[70]
    assert "30,000 bytes" in reasons[80]


def test_row_decoder_without_a_record_time_needs_the_column() -> None:
    decoder = RowDecoder(RowMapping())
    out = _through_set(decoder, [b'{"id": 1, "text": "x"}'])
    assert "no event time: set mapping.event_time" in out[0].reason
    out = _through_set(decoder, [b'{"id": 1, "text": "x"}'], times=[None])
    assert isinstance(out[0], DeadLetter)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=80),
            st.sampled_from([b"", b"null", b"{}", b'{"id": 1}', b'{"id": 1, "text": "x"}']),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c),
                max_leaves=10,
            ).map(lambda v: json.dumps({"id": v, "text": v, "at": v}).encode()),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_any_bytes_give_one_outcome_per_record(lines: list[bytes], timed: bool) -> None:
    decoder = RowDecoder(RowMapping(event_time="at", metadata=["id"], template=None))
    times: list[int | None] | None = [T0] * len(lines) if timed else None
    _through_set(decoder, lines, times=times)
