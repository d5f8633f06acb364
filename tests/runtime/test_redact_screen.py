"""A batch of plain prose is screened in one pass, and comes out as the redactor leaves it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from streamrag.changes import Change, ChangeBatch, Op
from streamrag.ingest.pii import EmailDetector, Redactor, Span
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.stages import RedactStage

EMAIL = "ada@example.org"


def _batch(*payloads: Mapping[str, Any]) -> ChangeBatch:
    changes = [Change("t", f"d{i}", Op.UPSERT, i, dict(p), "in", i) for i, p in enumerate(payloads)]
    changes.append(Change("t", "gone", Op.DELETE, 99, {}, "in", 99))
    return ChangeBatch.from_changes(changes)


def _metric(metrics: Metrics, entity: str) -> float:
    text = metrics.render().decode()
    m = re.search(rf'^streamrag_redactions_total{{entity="{entity}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_screen_out_rules_out_only_payloads_no_detector_can_match() -> None:
    r = Redactor([EmailDetector()])
    assert r.screen_out([{"text": "plain words only"}, {"text": "more", "title": "and more"}])
    assert r.screen_out([])
    assert not r.screen_out([{"text": "plain"}, {"text": f"write to {EMAIL}"}])
    assert not r.screen_out([{"text": "plain", "title": f"by {EMAIL}"}])
    assert not r.screen_out([{"text": "plain", "metadata": {"owner": [EMAIL]}}])


class _NoCandidates:
    """A detector that declares no candidate characters: nothing can be screened out."""

    name = "words"
    entities: ClassVar[frozenset[str]] = frozenset({"WORD"})

    def find(self, text: str) -> list[Span]:
        i = text.find("secret")
        return [] if i < 0 else [Span(i, i + 6, "WORD")]


def test_a_detector_without_candidates_sees_every_payload() -> None:
    r = Redactor([EmailDetector(), _NoCandidates()])  # type: ignore[list-item]
    assert not r.screen_out([{"text": "plain words only"}])
    out = RedactStage(r)(_batch({"text": "plain"}, {"text": "a secret word"}))
    assert [p.get("text") for p in out.out.payloads] == ["plain", "a [WORD] word", None]


def test_a_plain_batch_goes_on_as_it_is_with_the_journals_counts() -> None:
    metrics = Metrics()
    stage = RedactStage(Redactor([EmailDetector()]), metrics, source_name=lambda _: "push")
    batch = _batch(
        {"text": "plain words", "domain": "it"},
        {"text": "pushed [EMAIL]", "pushed_by": "ci", "redactions": {"EMAIL": 2}},
    )
    out = stage(batch, replay=False)
    assert out.letters == []
    assert list(out.out.payloads) == list(batch.payloads)
    assert out.out.doc_ids == batch.doc_ids
    assert _metric(metrics, "EMAIL") == 2.0
    stage(batch, replay=True)  # counted when first read
    assert _metric(metrics, "EMAIL") == 2.0


def test_one_change_with_an_entity_sends_the_batch_through_the_redactor() -> None:
    metrics = Metrics()
    stage = RedactStage(Redactor([EmailDetector()]), metrics)
    out = stage(_batch({"text": "plain words"}, {"text": f"mail {EMAIL} now"}))
    assert out.letters == []
    assert out.out.payloads[0] == {"text": "plain words"}
    assert out.out.payloads[1]["text"] == "mail [EMAIL] now"
    assert out.out.payloads[1]["redactions"] == {"EMAIL": 1}
    assert _metric(metrics, "EMAIL") == 1.0


class _ScreenFails(Redactor):
    def screen_out(self, payloads: Any) -> bool:
        raise RuntimeError("boom")


def test_a_failing_screen_falls_back_to_each_change() -> None:
    stage = RedactStage(_ScreenFails([EmailDetector()]))
    out = stage(_batch({"text": "plain"}, {"text": f"to {EMAIL}"}))
    assert out.letters == []
    assert out.out.payloads[1]["text"] == "to [EMAIL]"
