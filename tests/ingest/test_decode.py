from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.changes import Op
from streamrag.ingest import DeadLetter, DeadLetterStore, Decoder
from streamrag.sources import RawBatch


def _decode(*lines: bytes, **kw: int | str) -> tuple:  # type: ignore[type-arg]
    raw = RawBatch("in.jsonl", list(lines), [i * 100 for i in range(len(lines))], 999)
    return Decoder(**kw).decode([raw])  # type: ignore[arg-type]


def test_valid_records_become_changes() -> None:
    batch, letters = _decode(
        b'{"doc_id":"a","event_time":"2024-01-01T00:00:00Z","text":" hi\\u0000 ","domain":"ops",'
        b'"tenant":"acme","metadata":{"k":1},"extra":"ignored"}',
        b'{"doc_id":"b","op":"delete","event_time":1704067200}',
    )
    assert letters == []
    a, b = batch.to_changes()
    assert (a.tenant, a.doc_id, a.op, a.text, a.domain) == ("acme", "a", Op.UPSERT, "hi", "ops")
    assert a.payload["metadata"] == {"k": 1}
    assert (a.source, a.offset) == ("in.jsonl", 0)
    assert (b.tenant, b.op, b.event_time, b.offset) == ("default", Op.DELETE, a.event_time, 100)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not a JSON object"),
        (b'{"doc_id": "a\xff", "event_time": 1, "text": "x"}', "not UTF-8 text"),
        (b'{"doc_id": "a", "event_time": ', "not a JSON object"),
        (b"[1, 2]", "does not match the change schema"),
        (b'{"event_time": 1, "text": "x"}', "missing required field `doc_id`"),
        (b'{"doc_id": 5, "event_time": 1, "text": "x"}', "Expected `str`, got `int`"),
        (b'{"doc_id": " ", "event_time": 1, "text": "x"}', "'doc_id' is empty"),
        (b'{"doc_id": "a", "event_time": "2024-01-01", "text": "x"}', "no time zone"),
        (b'{"doc_id": "a", "event_time": 1, "op": "remove"}', "Invalid enum value 'remove'"),
        (b'{"doc_id": "a", "event_time": 1}', "an upsert needs a non-empty 'text'"),
        (b'{"doc_id": "a", "event_time": 1, "text": "\\u0001"}', "an upsert needs a non-empty"),
    ],
)
def test_bad_records_become_dead_letters_with_reasons(line: bytes, reason: str) -> None:
    batch, letters = _decode(b'{"doc_id":"ok","event_time":1,"text":"fine"}', line)
    assert batch.doc_ids == ["ok"]
    assert len(letters) == 1
    letter = letters[0]
    assert reason in letter.reason
    assert (letter.source, letter.offset, letter.stage) == ("in.jsonl", 100, "decode")
    assert letter.raw == line.decode("utf-8", "backslashreplace")


def test_oversized_record_is_dead_lettered() -> None:
    big = json.dumps({"doc_id": "a", "event_time": 1, "text": "x" * 500}).encode()
    batch, letters = _decode(big, max_document_bytes=100)
    assert len(batch) == 0
    assert "max_document_bytes=100" in letters[0].reason


def test_dead_letter_store_appends_counts_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "dl" / "dead.jsonl"
    store = DeadLetterStore(path, truncate=True)
    store.add_many([DeadLetter("s", 1, "decode", "bad", "raw1")], now_us=0)
    store.add_many([DeadLetter("s", 2, "chunk", "worse", "raw2")], now_us=1_000_000)
    store.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["offset"], r["stage"], r["reason"], r["raw"]) for r in rows] == [
        (1, "decode", "bad", "raw1"),
        (2, "chunk", "worse", "raw2"),
    ]
    assert rows[1]["time"] == "1970-01-01T00:00:01Z"
    reopened = DeadLetterStore(path)
    assert reopened.count == 2
    assert dict(reopened.by_stage) == {"decode": 1, "chunk": 1}
    reopened.close()
    emptied = DeadLetterStore(path, truncate=True)
    assert emptied.count == 0
    emptied.close()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=4,
)
_records = st.fixed_dictionaries(
    {},
    optional={
        "doc_id": _json_values,
        "event_time": _json_values | st.sampled_from(["2024-01-01T00:00:00Z", "2024-01-01"]),
        "op": _json_values | st.sampled_from(["upsert", "delete"]),
        "text": _json_values,
        "tenant": _json_values,
        "domain": _json_values,
        "metadata": _json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(st.binary(max_size=80), _records.map(lambda r: json.dumps(r).encode())),
        max_size=20,
    )
)
def test_decoding_never_raises_and_accounts_for_every_line(lines: list[bytes]) -> None:
    lines = [line.replace(b"\n", b" ") for line in lines]
    batch, letters = _decode(*lines)
    assert len(batch) + len(letters) == len(lines)
    assert sorted([*batch.offsets.tolist(), *(d.offset for d in letters)]) == [
        i * 100 for i in range(len(lines))
    ]
