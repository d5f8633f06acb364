"""Schema on read by event time: records that change shape, decoded in any arrival order."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.changes import ChangeBatch, Op
from streamrag.config import load_settings
from streamrag.config.schemas import Registry, load_registry
from streamrag.errors import ConfigError, SchemaError
from streamrag.index.base import MetaPredicate, SearchFilter
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.schemas import SchemaDecoder, schema_decoders
from streamrag.runtime.build import build_decoders
from streamrag.runtime.service import Service
from streamrag.sources.base import RawBatch
from streamrag.testing import ManualClock
from streamrag.timing import parse_timestamp

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "schemas.yaml"
"""tickets: v1 (2024-01) ``body``; v2 (2024-06) ``text`` aliasing ``body``, optional ``team``;
v3 (2025-01) ``priority`` widened from integer to number."""


def _rec(doc: str, when: str, **fields: Any) -> bytes:
    return json.dumps({"id": doc, "updated": when, **fields}).encode()


STREAM = [
    _rec("t1", "2024-01-10T09:00:00Z", body="Printer on floor 3 jams", priority=2),
    _rec("t2", "2024-03-02T10:00:00Z", body="VPN drops at night", priority="3", subject="VPN"),
    _rec("t3", "2024-06-05T08:00:00Z", text="Mail quota reached", priority=1, team="mail"),
    _rec("t4", "2024-07-01T12:00:00Z", body="Badge reader offline", priority=2),  # v2, by alias
    _rec("t5", "2025-02-01T00:00:00Z", text="Laptop fan loud", priority=2.5, team="it"),
    _rec("t6", "2025-03-01T00:00:00Z", text="Wiki search slow", priority=4),
    _rec("t0", "2023-11-30T00:00:00Z", body="Before the registry began", priority=1),
]
"""One record per document, each written under the version of its event time."""

EXPECTED = {
    "t0": (1, {"text": "Before the registry began", "metadata": {"priority": 1}}),
    "t1": (1, {"text": "Printer on floor 3 jams", "metadata": {"priority": 2}}),
    "t2": (1, {"text": "VPN drops at night", "title": "VPN", "metadata": {"priority": 3}}),
    "t3": (2, {"text": "Mail quota reached", "metadata": {"priority": 1, "team": "mail"}}),
    "t4": (2, {"text": "Badge reader offline", "metadata": {"priority": 2}}),
    "t5": (3, {"text": "Laptop fan loud", "metadata": {"priority": 2.5, "team": "it"}}),
    "t6": (3, {"text": "Wiki search slow", "metadata": {"priority": 4.0}}),
}


def _decoder(**kw: Any) -> SchemaDecoder:
    return SchemaDecoder.from_registry(load_registry(EXAMPLE), "tickets", **kw)


def _decode(
    decoder: Any, lines: list[bytes], source: str = "tickets.jsonl"
) -> tuple[ChangeBatch, list[DeadLetter]]:
    return decoder.decode([RawBatch(source, lines, list(range(len(lines))), len(lines))])  # type: ignore[no-any-return]


def _by_doc(changes: ChangeBatch) -> dict[str, tuple[int, dict[str, Any]]]:
    out = {}
    for doc, payload in zip(changes.doc_ids, changes.payloads, strict=True):
        body = dict(payload)
        out[doc] = (body.pop("schema_version"), body)
    return out


def _orders() -> list[list[bytes]]:
    late_v1 = [STREAM[i] for i in (2, 3, 4, 5, 0, 1, 6)]  # v1 records after v2 and v3 ones
    orders = [list(STREAM), list(reversed(STREAM)), late_v1]
    rng = random.Random(7)
    for _ in range(5):
        shuffled = list(STREAM)
        rng.shuffle(shuffled)
        orders.append(shuffled)
    return orders


@pytest.mark.parametrize("arrival", _orders())
def test_each_record_decodes_with_the_version_of_its_event_time_in_any_order(
    arrival: list[bytes],
) -> None:
    decoder = _decoder()
    changes, letters = _decode(decoder, arrival)
    assert letters == []
    assert _by_doc(changes) == EXPECTED
    times = dict(zip(changes.doc_ids, changes.event_times.tolist(), strict=True))
    assert times["t4"] == parse_timestamp("2024-07-01T12:00:00Z")
    assert decoder.stats() == {"decoded": {1: 3, 2: 2, 3: 2}, "refused": {}}


def test_cutting_the_stream_into_batches_changes_nothing() -> None:
    decoder = _decoder()
    whole, _ = _decode(decoder, STREAM)
    parts = [_decode(decoder, STREAM[i : i + 2])[0] for i in range(0, len(STREAM), 2)]
    assert _by_doc(ChangeBatch.concat(parts)) == _by_doc(whole)


def test_types_are_the_declared_ones_after_decoding() -> None:
    """A v1 string "3" is the integer 3; a v3 integer 4 is the number 4.0; v2 refuses 2.5."""
    changes, letters = _decode(_decoder(), STREAM)
    meta = {
        d: dict(p).get("metadata", {})
        for d, p in zip(changes.doc_ids, changes.payloads, strict=True)
    }
    assert type(meta["t2"]["priority"]) is int
    assert type(meta["t6"]["priority"]) is float
    changes, letters = _decode(_decoder(), [_rec("x", "2024-08-01T00:00Z", text="a", priority=2.5)])
    assert len(changes) == 0
    assert "version 2" in letters[0].reason
    assert "field 'priority': expected integer, found number 2.5" in letters[0].reason


BAD = [
    (
        _rec("b1", "2024-02-01T00:00:00Z", text="written in the v2 shape", priority=1),
        ["schema 'tickets' version 1 (in force from 2024-01-01T00:00:00Z", "'body' is missing"],
    ),
    (
        _rec("b2", "2024-09-01T00:00:00Z", text="x", priority="high"),
        ["version 2", "field 'priority': expected integer, found string \"high\""],
    ),
    (
        _rec("b3", "2025-05-01T00:00:00Z", text="x", priority=1, team=5),
        ["version 3", "field 'team': expected string, found integer 5"],
    ),
    (
        _rec("b4", "2024-09-01T00:00:00Z", text="x", priority=True),
        ["field 'priority': expected integer, found boolean true", "not a number"],
    ),
    (
        _rec("b5", "2023-01-01T00:00:00Z", priority=1),
        ["version 1 (the first; the record's event time 2023-01-01", "'body' is missing"],
    ),
    (b'{"id": "b6", "text": "no time", "priority": 1}', ["no event time", "fields 'updated'"]),
    (_rec("b7", "yesterday", text="x", priority=1), ["event-time field 'updated'", "ISO-8601"]),
    (b"not json at all", ["not JSON"]),
    (b"[1, 2]", ["expected a JSON object", "found array"]),
    (
        _rec("b8", "2024-09-01T00:00:00Z", text="   ", priority=1),
        ["version 2", "needs a non-empty text"],
    ),
    (_rec(" ", "2024-09-01T00:00:00Z", text="x", priority=1), ["version 2", "id is empty"]),
    (b"{" * 100_000, ["not JSON"]),
]


def test_records_that_fit_no_schema_are_dead_lettered_with_the_reason() -> None:
    decoder = _decoder()
    good = [_rec("g", "2024-09-01T00:00:00Z", text="fine", priority=1)]
    lines = [line for line, _ in BAD] + good
    changes, letters = _decode(decoder, lines)
    assert list(changes.doc_ids) == ["g"]
    assert len(letters) == len(BAD)  # one outcome per record
    for letter, (line, words) in zip(letters, BAD, strict=True):
        assert letter.stage == "decode"
        assert letter.offset == lines.index(line)
        for w in words:
            assert w in letter.reason, letter.reason
    versioned = [lt.reason for lt in letters if lt.reason.startswith("schema 'tickets' version")]
    assert len(versioned) == 7  # every refusal after the version was chosen names it
    assert decoder.stats()["refused"] == {1: 2, 2: 4, 3: 1, 0: 5}
    assert sum(decoder.stats()["refused"].values()) == len(BAD)


def test_a_record_above_the_size_limit_is_refused_before_parsing() -> None:
    line = _rec("big", "2024-09-01T00:00:00Z", text="x" * 500, priority=1)
    _, letters = _decode(_decoder(max_document_bytes=100), [line])
    assert "above ingest.max_document_bytes=100" in letters[0].reason


def _registry(tmp_path: Path, *docs: dict[str, Any]) -> Registry:
    path = tmp_path / "schemas.yaml"
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False), encoding="utf-8")
    return load_registry(path)


KEYS = {
    "key": {"type": "string", "role": "doc_id"},
    "at": {"type": "timestamp", "role": "event_time"},
}


def test_deletes_need_only_their_key_and_ops_are_checked(tmp_path: Path) -> None:
    fields = {
        **KEYS,
        "op": {"type": "string", "default": "upsert"},
        "org": {"type": "string", "role": "tenant", "required": False},
        "text": {"type": "string"},
        "level": {"type": "integer"},
    }
    reg = _registry(tmp_path, {"source": "s", "version": 1, "valid_from": 0, "fields": fields})
    dec = SchemaDecoder.from_registry(reg, "s", default_tenant="acme")
    lines = [
        b'{"key": "a", "at": 10, "text": "hello", "level": 1, "org": "zeta"}',
        b'{"key": "a", "at": 11, "op": "delete", "org": "zeta"}',
        b'{"key": "b", "at": 12, "op": "remove"}',
        b'{"key": "c", "at": 13, "text": "no level"}',
    ]
    changes, letters = _decode(dec, lines)
    assert changes.ops.tolist() == [Op.UPSERT, Op.DELETE]
    assert list(changes.tenants) == ["zeta", "zeta"]
    assert dict(changes.payloads[1]) == {"schema_version": 1}
    assert "field 'op' feeds op: expected 'upsert' or 'delete', found 'remove'" in letters[0].reason
    assert "required field 'level' is missing" in letters[1].reason
    one, _ = _decode(dec, [b'{"key": "d", "at": 1, "text": "t", "level": 2}'])
    assert list(one.tenants) == ["acme"]  # no tenant field: the default tenant


def test_a_renamed_field_is_one_metadata_key_and_objects_merge(tmp_path: Path) -> None:
    v1 = {
        **KEYS,
        "body": {"type": "string", "role": "text"},
        "prio": {"type": "integer"},
        "seen": {"type": "timestamp", "required": False},
        "extra": {"type": "object", "role": "metadata", "required": False},
    }
    v2 = {
        **v1,
        "priority": {"type": "number", "aliases": ["prio"]},
        "tags": {"type": "array", "required": False},
    }
    del v2["prio"]
    reg = _registry(
        tmp_path,
        {"source": "s", "version": 1, "valid_from": 0, "fields": v1},
        {"source": "s", "version": 2, "valid_from": 100, "fields": v2},
    )
    dec = SchemaDecoder.from_registry(reg, "s")
    assert dec.destinations(1) == {
        "key": "doc_id",
        "at": "event_time",
        "body": "text",
        "prio": "metadata.priority",
        "seen": "metadata.seen",
        "extra": "metadata",
    }
    lines = [
        b'{"key": "a", "at": 5, "body": "x", "prio": 2, "seen": 1.5, "extra": {"lang": "en"}}',
        b'{"key": "b", "at": 150, "body": "y", "prio": 3, "tags": ["db"], "ignored": 1}',
    ]
    changes, letters = _decode(dec, lines)
    assert letters == []
    assert dict(changes.payloads[0])["metadata"] == {
        "lang": "en",
        "priority": 2,
        "seen": "1970-01-01T00:00:01.500000Z",
    }
    assert dict(changes.payloads[1])["metadata"] == {"priority": 3.0, "tags": ["db"]}


def test_the_event_time_is_found_under_every_name_it_had(tmp_path: Path) -> None:
    v1 = {
        "key": KEYS["key"],
        "ts": {"type": "timestamp", "role": "event_time"},
        "text": {"type": "string"},
    }
    v2 = {**v1, "updated_at": {"type": "timestamp", "role": "event_time", "aliases": ["ts"]}}
    del v2["ts"]
    reg = _registry(
        tmp_path,
        {"source": "s", "version": 1, "valid_from": 0, "fields": v1},
        {"source": "s", "version": 2, "valid_from": 100, "fields": v2},
    )
    dec = SchemaDecoder.from_registry(reg, "s")
    assert dec.time_fields == ("updated_at", "ts")
    lines = [
        b'{"key": "a", "ts": 5, "text": "v1"}',
        b'{"key": "b", "updated_at": 150, "text": "v2"}',
        b'{"key": "c", "ts": 160, "text": "v2 by the old name"}',
        b'{"key": "d", "updated_at": 50, "text": "v1 time under the new name"}',
        b'{"key": "e", "updated_at": 150, "ts": 10, "text": "two times"}',
    ]
    changes, letters = _decode(dec, lines)
    assert [dict(p)["schema_version"] for p in changes.payloads] == [1, 2, 2, 2]
    assert list(changes.doc_ids) == ["a", "b", "c", "e"]
    assert "version 1" in letters[0].reason
    assert "required field 'ts' is missing" in letters[0].reason


def test_a_decoder_is_made_only_of_versions_that_keep_the_rules() -> None:
    schema = load_registry(EXAMPLE).versions("tickets")[0]
    with pytest.raises(SchemaError, match="rule version-order"):
        SchemaDecoder("tickets", [schema, schema])
    with pytest.raises(ConfigError, match="has no versions"):
        SchemaDecoder("tickets", [])


def test_sources_without_a_schema_keep_the_change_decoder(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={
            "schemas.registry": str(EXAMPLE),
            "sources": [
                {"kind": "jsonl", "name": "tickets", "path": str(tmp_path)},
                {"kind": "jsonl", "name": "plain", "path": str(tmp_path)},
            ],
        },
        environ={},
    )
    decoders = build_decoders(settings)
    assert isinstance(decoders.named["tickets"], SchemaDecoder)
    assert type(decoders.named["plain"]) is Decoder
    assert type(decoders.default) is Decoder


def test_a_registry_for_a_source_that_cannot_use_it_is_refused(tmp_path: Path) -> None:
    reg = load_registry(EXAMPLE)
    with pytest.raises(
        ConfigError, match=r"source 'tickets', which is not configured \(sources: other\)"
    ):
        schema_decoders(
            reg,
            load_settings(
                overrides={"sources": [{"kind": "jsonl", "name": "other", "path": "x"}]}, environ={}
            ).sources,
        )
    rows = load_settings(
        overrides={
            "sources": [{"kind": "kafka", "name": "tickets", "topics": ["t"], "format": "row"}]
        },
        environ={},
    )
    with pytest.raises(ConfigError, match="reads row records; schemas apply to sources of JSON"):
        schema_decoders(reg, rows.sources)


# -- end to end --------------------------------------------------------------------------


def test_a_job_indexes_a_stream_whose_records_change_shape(tmp_path: Path) -> None:
    """A Service on a JSONL source with a registry in its config: late v1 records, bad ones too."""
    tickets, plain = tmp_path / "tickets", tmp_path / "plain"
    tickets.mkdir()
    plain.mkdir()
    arrival = [STREAM[i] for i in (2, 4, 3, 0, 5, 1, 6)]  # v2 and v3, then late v1 records
    bad = [line for line, _ in BAD[:3]]
    (tickets / "a.jsonl").write_bytes(b"".join(line + b"\n" for line in arrival[:4] + bad[:1]))
    (tickets / "b.jsonl").write_bytes(b"".join(line + b"\n" for line in arrival[4:] + bad[1:]))
    change = {"doc_id": "p1", "event_time": "2024-05-01T00:00:00Z", "text": "A plain change"}
    (plain / "p.jsonl").write_text(json.dumps(change) + "\n", encoding="utf-8")
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "embedder": {"class": "hashing"},
                "index": {"kind": "lsm"},
                "schemas": {"registry": str(EXAMPLE)},
                "sources": [
                    {"kind": "jsonl", "name": "tickets", "path": str(tickets)},
                    {"kind": "jsonl", "name": "plain", "path": str(plain)},
                ],
            }
        ),
        encoding="utf-8",
    )
    svc = Service(load_settings(config, environ={}), clock=ManualClock(1_800_000_000_000_000))
    try:
        svc.pipeline.run_until_caught_up(final=True)
        stats, pending = svc.pipeline.counts()
        assert (stats.ingested, stats.applied, stats.dead_lettered, pending) == (11, 8, 3, 0)
        vec = svc.embed_many(["ticket"])

        def docs(*preds: MetaPredicate) -> dict[str, Any]:
            _, hits = svc.search_many(vec, 50, SearchFilter(metadata=tuple(preds)))
            return {h.doc_id: h for h in hits[0]}

        found = docs()
        assert set(found) == {*EXPECTED, "p1"}
        assert found["t2"].text.startswith("VPN drops at night")
        for doc, (_, payload) in EXPECTED.items():
            assert dict(found[doc].metadata or {}) == payload["metadata"]
        # One metadata key over every version, filterable: v1 integers and v3 numbers alike.
        assert set(docs(MetaPredicate("priority", gte=2.5))) == {"t2", "t5", "t6"}
        assert set(docs(MetaPredicate("team", values=frozenset({"mail", "it"})))) == {"t3", "t5"}
    finally:
        svc.stop()
    letters = [e.letter for e in DeadLetterStore(svc.settings.dead_letter_path).entries()]
    assert len(letters) == 3
    reasons = sorted(lt.reason for lt in letters)
    assert any("version 1" in r and "'body' is missing" in r for r in reasons)
    assert any("version 2" in r and "field 'priority': expected integer" in r for r in reasons)
    assert any("version 3" in r and "field 'team': expected string" in r for r in reasons)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_FIELDS = st.sampled_from(["id", "updated", "body", "text", "priority", "team", "subject"])
_VALUES = _JSON | st.sampled_from(["2024-03-01T00:00:00Z", "2025-03-01T00:00:00Z", 1.7e9, "x"])


_SHARED = _decoder()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.dictionaries(_FIELDS, _VALUES, max_size=7).map(lambda d: json.dumps(d).encode())
        | st.binary(max_size=40),
        min_size=1,
        max_size=12,
    )
)
def test_any_input_gets_exactly_one_outcome_and_never_raises(lines: list[bytes]) -> None:
    decoder = _SHARED
    decoder.decoded.clear()
    decoder.refused.clear()
    changes, letters = _decode(decoder, lines)
    assert len(changes) + len(letters) == len(lines)
    outcomes = sorted([*changes.offsets.tolist(), *(lt.offset for lt in letters)])
    assert outcomes == list(range(len(lines)))
    assert sum(decoder.decoded.values()) == len(changes)
    assert sum(decoder.refused.values()) == len(letters)
    for payload in changes.payloads:
        assert dict(payload)["schema_version"] in (1, 2, 3)
        assert dict(payload)["text"]
