"""The redaction stage in the pipeline: nothing raw is embedded, stored, logged or counted."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from streamrag.batching import MicroBatcher
from streamrag.chunking import TokenSplitter
from streamrag.config import load_settings
from streamrag.config.redaction import RedactionSettings
from streamrag.errors import ConfigError
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.ingest import DeadLetterStore
from streamrag.ingest.pii import EmailDetector, Policy, Redactor, Span
from streamrag.runtime import Pipeline
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.replay import index_digest
from streamrag.runtime.service import Service
from streamrag.runtime.stages import RedactStage
from streamrag.sources import JsonlSource
from streamrag.testing import FakeEmbedder, ManualClock, change_line
from tests.conftest import PipelineFactory

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, in seconds
KEY = "a-test-key-of-thirty-two-chars!!"
EMAIL, PHONE, CARD, IP = "ada@example.org", "+44 20 7946 0958", "4539 5787 6362 1486", "10.1.2.3"
SECRET = "AKIAIOSFODNN7EXAMPLE"
RAW = [EMAIL, PHONE, CARD, IP, SECRET, "4539578763621486"]


def _stage(metrics: Metrics | None = None, **settings: Any) -> RedactStage:
    redactor = Redactor.from_settings(
        RedactionSettings.model_validate(settings), environ={"STREAMRAG_REDACTION_KEY": KEY}
    )
    return RedactStage(redactor, metrics or Metrics())


def _texts(p: Pipeline) -> dict[str, str]:
    vec = p.embedder.embed_many(["anything"])
    _, hits = p.index.search_many(vec, 100, SearchFilter())
    return {h.doc_id: h.text for h in hits[0]}


def _metric(metrics: Metrics, entity: str) -> float:
    text = metrics.render().decode()
    m = re.search(rf'^streamrag_redactions_total{{entity="{entity}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_job_stores_and_logs_no_raw_value_anywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """End to end through Service: the index files, the log, dead letters and the audit log."""
    source = tmp_path / "input.jsonl"
    lines = [
        change_line(
            "a", T0, f"zebracorn: mail {EMAIL} or call {PHONE}.", title=f"Card {CARD}", domain="ops"
        ),
        change_line("b", T0 + 1, f"From {IP} with key {SECRET}", metadata={"owner": EMAIL}),
        '{"doc_id": "broken", "text": "reach ' + EMAIL + '", "event_time": ',  # not JSON
        change_line("c", T0 + 2, "nothing personal here"),
        change_line("c", T0 + 3, op="delete"),
    ]
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    state = tmp_path / "state"
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(state),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            "index.kind": "lsm",
        },
        environ={},
    )
    caplog.set_level(logging.DEBUG)
    svc = Service(settings, clock=ManualClock(T0 * 10**6))
    svc.pipeline.run_until_caught_up()
    texts = _texts(svc.pipeline)
    stats, uncommitted = svc.pipeline.counts()
    rendered = svc.metrics.render().decode()
    svc.stop()
    assert texts == {
        "a": "zebracorn: mail [EMAIL] or call [PHONE].",
        "b": "From [IP] with key [SECRET]",
    }
    assert (stats.ingested, stats.applied, stats.dead_lettered, uncommitted) == (5, 4, 1, 0)
    stored = b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())
    assert b"zebracorn" in stored  # what is stored is plain to read: the search below is real
    assert b"[EMAIL]" in stored
    for value in RAW:
        assert value.encode() not in stored, value
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "dead-lettered" in logged
    for value in RAW:
        assert value not in logged, value
    (letter,) = DeadLetterStore(settings.dead_letter_path).read()
    assert letter.stage == "decode"
    assert "reach [EMAIL]" in letter.raw
    assert 'streamrag_redactions_total{entity="EMAIL"} 2.0' in rendered  # in changes
    assert 'streamrag_redactions_total{entity="CARD"} 1.0' in rendered
    records = [json.loads(x) for x in (state / "audit" / "epochs.jsonl").read_text().splitlines()]
    summed: dict[str, int] = {}
    for rec in records:
        for entity, n in (rec.get("counts") or {}).get("redactions", {}).items():
            summed[entity] = summed.get(entity, 0) + n
    assert summed == {"CARD": 1, "EMAIL": 2, "IP": 1, "PHONE": 1, "SECRET": 1}


def test_the_stage_counts_in_the_payload_and_passes_deletes(tmp_path: Path) -> None:
    from streamrag.ingest import Decoder
    from streamrag.sources.base import RawBatch

    lines = [
        change_line("a", T0, f"mail {EMAIL} twice: {EMAIL}", pushed_by="ci"),
        change_line("b", T0, "plain"),
        change_line("a", T0 + 1, op="delete"),
    ]
    raw = RawBatch("in.jsonl", [x.encode() for x in lines], [0, 100, 200], 300)
    changes, _ = Decoder().decode([raw])
    metrics = Metrics()
    stage = _stage(metrics)
    stage.source_name = lambda _: "push"  # pushed_by is the journal's own field
    out = stage(changes, [raw])
    assert out.letters == []
    assert [dict(p) for p in out.out.payloads] == [
        {"text": "mail [EMAIL] twice: [EMAIL]", "pushed_by": "ci", "redactions": {"EMAIL": 2}},
        {"text": "plain"},
        {},
    ]
    assert list(out.out.ops) == list(changes.ops)
    assert _metric(metrics, "EMAIL") == 2
    again = stage(changes, [raw], replay=True)  # read again after a restart
    assert [dict(p) for p in again.out.payloads] == [dict(p) for p in out.out.payloads]
    assert _metric(metrics, "EMAIL") == 2  # counted once, when first read


def test_a_dropped_document_is_a_counted_letter_without_the_value(
    pipeline_factory: PipelineFactory, jsonl: Any, tmp_path: Path
) -> None:
    path = jsonl(
        change_line("a", T0, f"the key is {SECRET}, ask {EMAIL}"),
        change_line("b", T0, f"ask {EMAIL}"),
        change_line("c", T0, op="delete"),
    )
    p = pipeline_factory(JsonlSource(path), redact=_stage(entities={"SECRET": "drop_document"}))
    p.run_until_caught_up()
    assert _texts(p) == {"b": "ask [EMAIL]"}
    stats, uncommitted = p.counts()
    assert (stats.ingested, stats.applied, stats.dead_lettered, uncommitted) == (3, 2, 1, 0)
    (letter,) = DeadLetterStore(tmp_path / "dead.jsonl").read()
    assert letter.stage == "redact"
    assert letter.reason == (
        "dropped by the redaction policy: contains EMAIL (1), SECRET (1); SECRET is set to "
        "drop_document"
    )
    assert SECRET not in letter.raw
    assert EMAIL not in letter.raw
    assert json.loads(letter.raw)["doc_id"] == "a"  # the change, scrubbed, is the record


class _Fails:
    name = "fragile"
    entities = ("X",)

    def find(self, text: str) -> list[Span]:
        if "boom" in text:
            msg = f"cannot handle {text!r}"
            raise RuntimeError(msg)
        return []


def test_a_failing_detector_dead_letters_its_change_only(
    pipeline_factory: PipelineFactory, jsonl: Any, tmp_path: Path
) -> None:
    redactor = Redactor([EmailDetector(), _Fails()])
    path = jsonl(
        change_line("a", T0, f"boom from {EMAIL}"),
        change_line("b", T0, f"fine, {EMAIL}"),
    )
    p = pipeline_factory(JsonlSource(path), redact=RedactStage(redactor, Metrics()))
    p.run_until_caught_up()
    assert _texts(p) == {"b": "fine, [EMAIL]"}
    stats, uncommitted = p.counts()
    assert (stats.ingested, stats.applied, stats.dead_lettered, uncommitted) == (2, 1, 1, 0)
    (letter,) = DeadLetterStore(tmp_path / "dead.jsonl").read()
    assert letter.stage == "redact"
    assert "'fragile' failed (RuntimeError)" in letter.reason
    assert EMAIL not in letter.reason
    # The letter's record could not be checked (the same detector fails on it): withheld.
    assert letter.raw.startswith("[withheld: the redaction failed")


def test_without_a_redactor_everything_passes_as_it_is(
    pipeline_factory: PipelineFactory, jsonl: Any
) -> None:
    p = pipeline_factory(JsonlSource(jsonl(change_line("a", T0, f"mail {EMAIL}"))))
    p.run_until_caught_up()
    assert _texts(p) == {"a": f"mail {EMAIL}"}


class _Job:
    """One process' worth of pipeline over a state directory (see test_recovery)."""

    opened: ClassVar[list[LsmIndex]] = []

    def __init__(self, state: Path, data: Path, clock: ManualClock) -> None:
        self.index = LsmIndex(64, LsmSpec(), path=state / "index", clock=clock)
        _Job.opened.append(self.index)
        self.metrics = Metrics()
        redactor = Redactor([EmailDetector()], Policy({"EMAIL": "hash"}), key=KEY.encode())
        self.pipeline = Pipeline(
            source=JsonlSource(data),
            embedder=FakeEmbedder(),
            index=self.index,
            dead_letters=DeadLetterStore(state / "dead.jsonl"),
            clock=clock,
            splitter=TokenSplitter(max_tokens=8, overlap_tokens=2),
            batcher=MicroBatcher(max_batch_size=16, max_delay_ms=10_000, clock=clock),
            cursor=self.index.cursor,
            metrics=self.metrics,
            max_read_bytes=2048,
            redact=RedactStage(redactor, self.metrics),
        )


@pytest.fixture
def _release_files() -> Iterator[None]:
    yield
    while _Job.opened:
        _Job.opened.pop().abandon()


@pytest.mark.usefixtures("_release_files")
def test_changes_read_again_after_a_crash_are_redacted_the_same_way(tmp_path: Path) -> None:
    lines = [
        change_line(f"d{i % 25}", T0 + i, f"v{i} from user{i % 7}@example.org about refunds")
        for i in range(120)
    ]
    data = tmp_path / "changes.jsonl"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    clock = ManualClock(T0 * 10**6)
    ref = _Job(tmp_path / "ref", data, clock)
    ref.pipeline.run_until_caught_up()
    job = _Job(tmp_path / "state", data, clock)
    job.pipeline.poll()
    job.pipeline.flush()  # full batches commit; the rest waits, and the cursor says so
    assert job.pipeline.batcher.pending > 0
    first = _metric(job.metrics, "EMAIL")
    job.index.abandon()  # a crash: what waited is read again on restart
    again = _Job(tmp_path / "state", data, clock)
    again.pipeline.run_until_caught_up()
    assert again.pipeline.stats.replayed > 0
    assert index_digest(again.index) == index_digest(ref.index)
    texts = [row["text"] for row in index_digest(again.index)]
    assert all(re.search(r"\[EMAIL:[0-9a-f]{12}\]", t) for t in texts)
    assert not any("@example.org" in t for t in texts)
    assert first + _metric(again.metrics, "EMAIL") == len(lines)  # replayed ones: counted once


def _service(tmp_path: Path, **overrides: Any) -> Service:
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "input.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            **overrides,
        },
        environ={},
    )
    return Service(settings, clock=ManualClock(T0 * 10**6))


def test_the_policy_of_each_source_is_applied_by_name(tmp_path: Path) -> None:
    crm = tmp_path / "crm.jsonl"
    crm.write_text(change_line("crm-1", T0, f"call {PHONE} or {EMAIL}") + "\n", encoding="utf-8")
    (tmp_path / "input.jsonl").write_text(
        change_line("in-1", T0, f"call {PHONE} or {EMAIL}") + "\n", encoding="utf-8"
    )
    svc = _service(
        tmp_path,
        sources=[{"kind": "jsonl", "name": "crm", "path": str(crm)}],
        **{"redaction.sources": {"crm": {"entities": {"PHONE": "keep"}}}},
    )
    svc.push([{"doc_id": "push-1", "event_time": T0, "text": f"call {PHONE} or {EMAIL}"}])
    svc.pipeline.run_until_caught_up()
    texts = _texts(svc.pipeline)
    svc.stop()
    assert texts == {
        "crm-1": f"call {PHONE} or [EMAIL]",
        "push-1": "call [PHONE] or [EMAIL]",
    }  # the JSONL input of source.path is not read when sources are configured


def test_a_job_that_hashes_without_its_key_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STREAMRAG_REDACTION_KEY", raising=False)
    with pytest.raises(ConfigError, match="STREAMRAG_REDACTION_KEY"):
        _service(tmp_path, **{"redaction.entities": {"EMAIL": "hash"}})
    with pytest.raises(ConfigError, match=r"'crn'.*did you mean 'crm'"):
        _service(
            tmp_path,
            sources=[{"kind": "jsonl", "name": "crm", "path": str(tmp_path / "crm.jsonl")}],
            **{"redaction.sources": {"crn": {"entities": {"PHONE": "keep"}}}},
        )
    monkeypatch.setenv("STREAMRAG_REDACTION_KEY", KEY)
    svc = _service(tmp_path, **{"redaction.entities": {"EMAIL": "hash"}})
    svc.stop()
