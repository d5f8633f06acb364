"""Pushed changes are redacted before the push journal stores them, and counted once.

The journal is a file of the job's state: a value that reached it unredacted
would sit on disk until the file is rotated out. And the fields only the
journal writes (``pushed_by``, ``redactions``) go into the audit record, so a
file or a queue cannot claim them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from streamrag.config import load_settings
from streamrag.errors import RequestError
from streamrag.index import SearchFilter
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.service import Service
from streamrag.testing import ManualClock, change_line

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, in seconds
EMAIL, IBAN, SECRET = "ada@example.org", "GB82 WEST 1234 5698 7654 32", "AKIAIOSFODNN7EXAMPLE"


def _service(tmp_path: Path, **overrides: Any) -> Service:
    settings = load_settings(
        overrides={
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            "index.kind": "lsm",
            **overrides,
        },
        environ={},
    )
    return Service(settings, clock=ManualClock(T0 * 10**6))


def _texts(svc: Service) -> dict[str, str]:
    p = svc.pipeline
    _, hits = p.index.search_many(p.embedder.embed_many(["anything"]), 100, SearchFilter())
    return {h.doc_id: h.text for h in hits[0]}


def _metric(metrics: Metrics, entity: str) -> float:
    text = metrics.render().decode()
    m = re.search(rf'^streamrag_redactions_total{{entity="{entity}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "state" / "audit" / "epochs.jsonl"
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _summed(records: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in records:
        for entity, n in (rec.get("counts") or {}).get("redactions", {}).items():
            out[entity] = out.get(entity, 0) + n
    return out


def test_the_journal_holds_no_raw_value_and_the_counts_reach_the_audit_once(
    tmp_path: Path,
) -> None:
    svc = _service(tmp_path)
    svc.push(
        [
            {
                "doc_id": "p1",
                "event_time": T0,
                "text": f"mail {EMAIL}, pay to {IBAN}",
                "redactions": {"EMAIL": 50},  # a client's claim: discarded
            },
            {"doc_id": "p2", "event_time": T0 + 1, "text": "nothing personal"},
        ]
    )
    journal = b"".join(p.read_bytes() for p in (tmp_path / "state" / "push").glob("*"))
    svc.pipeline.run_until_caught_up()
    texts = _texts(svc)
    metrics = svc.metrics
    svc.stop()
    assert b"nothing personal" in journal  # the search below is over the real journal
    assert EMAIL.encode() not in journal
    assert b"GB82" not in journal
    assert texts == {"p1": "mail [EMAIL], pay to [IBAN]", "p2": "nothing personal"}
    assert _summed(_audit(tmp_path)) == {"EMAIL": 1, "IBAN": 1}
    assert (_metric(metrics, "EMAIL"), _metric(metrics, "IBAN")) == (1.0, 1.0)


def test_a_push_the_policy_drops_is_refused_naming_types_not_values(tmp_path: Path) -> None:
    svc = _service(tmp_path, **{"redaction.entities": {"SECRET": "drop_document"}})
    try:
        with pytest.raises(RequestError) as err:
            svc.push(
                [
                    {"doc_id": "ok", "event_time": T0, "text": "fine"},
                    {"doc_id": "bad", "event_time": T0, "text": f"key {SECRET}"},
                ]
            )
        journal = b"".join(p.read_bytes() for p in (tmp_path / "state" / "push").glob("*"))
    finally:
        svc.stop()
    message = str(err.value)
    assert "change 1" in message
    assert "SECRET" in message
    assert "drop_document" in message
    assert SECRET not in message
    assert b"fine" not in journal  # none of the push was taken


def test_a_file_cannot_claim_the_journal_fields(tmp_path: Path) -> None:
    source = tmp_path / "input.jsonl"
    line = json.loads(change_line("f1", T0, "from a file"))
    line |= {"pushed_by": "mallory", "redactions": {"EMAIL": 99}}
    source.write_text(json.dumps(line) + "\n", encoding="utf-8")
    for enabled in (True, False):
        svc = _service(
            tmp_path / str(enabled),
            **{"source.path": str(source), "redaction.enabled": enabled},
        )
        svc.pipeline.run_until_caught_up()
        svc.stop()
        records = _audit(tmp_path / str(enabled))
        assert records, "the job committed nothing"
        assert _summed(records) == {}
        assert all("mallory" not in json.dumps(r) for r in records)


def test_versions_out_of_order_in_one_batch_with_a_hostile_line_are_redacted_and_counted(
    tmp_path: Path,
) -> None:
    """Several versions of one document in one push, late ones among them, beside bad input."""
    svc = _service(tmp_path, **{"batcher.max_batch_size": 64})
    versions = [  # arrival order: the newest first, then two older ones
        {"doc_id": "p1", "event_time": T0 + 2, "text": f"v3 mail {EMAIL}"},
        {"doc_id": "p1", "event_time": T0, "text": f"v1 mail {EMAIL} and {IBAN}"},
        {"doc_id": "p1", "event_time": T0 + 1, "text": f"v2 key {SECRET}"},
    ]
    svc.push(versions)
    with pytest.raises(RequestError):  # a hostile change refuses its push, with no value echoed
        svc.push([{"doc_id": "p2", "event_time": "not a time", "text": f"mail {EMAIL}"}])
    svc.push([{"doc_id": "p1", "event_time": T0 - 5, "text": f"v0 late {EMAIL}"}])  # late
    journal = b"".join(p.read_bytes() for p in (tmp_path / "state" / "push").glob("*"))
    svc.pipeline.run_until_caught_up()
    texts = _texts(svc)
    history = svc.pipeline.index.doc_history("default", "p1")
    metrics = svc.metrics
    svc.stop()
    for raw in (EMAIL.encode(), b"GB82", SECRET.encode()):
        assert raw not in journal
    assert texts == {"p1": "v3 mail [EMAIL]"}  # the newest event time wins, masked
    assert len(history) == 4  # every version is kept, each one redacted
    # Every version's finds are counted once, in the epochs that committed them.
    assert _summed(_audit(tmp_path)) == {"EMAIL": 3, "IBAN": 1, "SECRET": 1}
    assert _metric(metrics, "EMAIL") == 3.0
