"""The policy: what becomes of each entity type found, in which field, for which source."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any

import pytest

from streamrag.config import load_settings
from streamrag.config.redaction import VALIDATED_ENTITIES, RedactionSettings
from streamrag.errors import ConfigError, InputError
from streamrag.ingest import DeadLetter
from streamrag.ingest.pii import (
    EmailDetector,
    IpDetector,
    PhoneDetector,
    Policy,
    Redactor,
    SecretDetector,
    Span,
)

KEY = "a-test-key-of-thirty-two-chars!!"
EMAIL, PHONE, CARD = "ada@example.org", "+44 20 7946 0958", "4539 5787 6362 1486"


def _redactor(entities: dict[str, Any] | None = None, **kw: Any) -> Redactor:
    settings = RedactionSettings.model_validate({"entities": entities or {}, **kw})
    made = Redactor.from_settings(settings, environ={"STREAMRAG_REDACTION_KEY": KEY})
    assert made is not None
    return made


def test_the_default_masks_every_validated_type_in_text_title_and_metadata() -> None:
    settings = load_settings(environ={}).redaction
    assert settings.enabled
    assert settings.entities == dict.fromkeys(VALIDATED_ENTITIES, "mask")
    redactor = Redactor.from_settings(settings, environ={})
    assert redactor is not None
    payload = {
        "text": f"Mail {EMAIL} or call {PHONE}.",
        "title": f"Refund to {CARD}",
        "domain": "billing",
        "metadata": {
            "owner": EMAIL,
            "hosts": ["10.1.2.3", "web-1"],
            "nested": {"card": 4539578763621486, "count": 3, "ok": True},
        },
    }
    before = json.dumps(payload)
    out = redactor.redact(payload, "input")
    assert out.payload == {
        "text": "Mail [EMAIL] or call [PHONE].",
        "title": "Refund to [CARD]",
        "domain": "billing",
        "metadata": {
            "owner": "[EMAIL]",
            "hosts": ["[IP]", "web-1"],
            "nested": {"card": "[CARD]", "count": 3, "ok": True},
        },
        "redactions": {"CARD": 2, "EMAIL": 2, "IP": 1, "PHONE": 1},
    }
    assert out.counts == {"CARD": 2, "EMAIL": 2, "IP": 1, "PHONE": 1}
    assert json.dumps(payload) == before  # the change's own payload is left as it was


def test_a_payload_without_personal_data_is_returned_as_it_is() -> None:
    payload = {"text": "Rotate the keys every quarter.", "metadata": {"n": 12}}
    out = _redactor().redact(payload)
    assert out.payload is payload
    assert "redactions" not in out.payload
    assert out.counts == {}


def test_hash_tags_are_keyed_joinable_and_never_the_value() -> None:
    redactor = _redactor({"EMAIL": "hash", "PHONE": "hash"})
    out = redactor.redact(
        {"text": f"{EMAIL} wrote to ADA@EXAMPLE.ORG; call +44 20 7946 0958 or +442079460958."}
    )
    assert out.payload is not None
    tags = re.findall(r"\[(EMAIL|PHONE):([0-9a-f]{12})\]", out.payload["text"])
    assert len(tags) == 4
    assert tags[0] == tags[1]  # one address, two spellings, one tag
    assert tags[2] == tags[3]
    assert tags[0][1] != tags[2][1]
    expected = hmac.new(KEY.encode(), b"EMAIL:ada@example.org", hashlib.sha256).hexdigest()
    assert tags[0][1] == expected[:12]
    plain = hashlib.sha256(b"ada@example.org").hexdigest()[:12]  # what a dictionary attack tries
    assert plain not in out.payload["text"]
    other = Redactor.from_settings(
        RedactionSettings.model_validate({"entities": {"EMAIL": "hash"}}),
        environ={"STREAMRAG_REDACTION_KEY": "another-key-of-enough-length"},
    )
    assert other is not None
    again = other.redact({"text": EMAIL}).payload
    assert again is not None
    assert again["text"] != f"[EMAIL:{tags[0][1]}]"


def test_hash_without_the_key_refuses_to_start_and_names_the_variable() -> None:
    settings = RedactionSettings.model_validate(
        {"sources": {"crm": {"entities": {"EMAIL": "hash"}}}, "hmac_key_env": "MY_KEY"}
    )
    with pytest.raises(ConfigError, match=r"EMAIL@crm set to hash.*MY_KEY.*unset"):
        Redactor.from_settings(settings, environ={})
    with pytest.raises(ConfigError, match=r"at least 16"):
        Redactor.from_settings(settings, environ={"MY_KEY": "short"})
    assert Redactor.from_settings(settings, environ={"MY_KEY": KEY}) is not None
    assert Redactor.from_settings(RedactionSettings(), environ={}) is not None  # no hash: no key


def test_drop_field_removes_the_title_or_the_metadata_value_that_held_it() -> None:
    redactor = _redactor({"EMAIL": "drop_field"})
    out = redactor.redact(
        {
            "text": "The owner signs off.",
            "title": f"Owner {EMAIL}",
            "metadata": {"owner": EMAIL, "cc": ["ops", EMAIL], "team": "billing"},
        }
    )
    assert out.payload == {
        "text": "The owner signs off.",
        "metadata": {"cc": ["ops"], "team": "billing"},
        "redactions": {"EMAIL": 3},
    }


def test_drop_field_on_the_text_drops_the_document() -> None:
    out = _redactor({"EMAIL": "drop_field"}).redact({"text": f"Write to {EMAIL}."})
    assert out.payload is None
    assert out.reason is not None
    assert out.reason.startswith("dropped by the redaction policy: contains EMAIL (1)")
    assert "drop_field" in out.reason
    assert EMAIL not in out.reason


def test_drop_document_names_types_and_counts_never_values() -> None:
    redactor = _redactor({"SECRET": "drop_document"})
    key = "AKIAIOSFODNN7EXAMPLE"
    out = redactor.redact(
        {"text": f"Use {key} and mail {EMAIL}.", "metadata": {"also": "AKIAI44QH8DHBEXAMPLE"}}
    )
    assert out.payload is None
    assert out.counts == {"EMAIL": 1, "SECRET": 2}
    assert out.reason == (
        "dropped by the redaction policy: contains EMAIL (1), SECRET (2); SECRET is set to "
        "drop_document"
    )


def test_keep_leaves_the_value_and_does_not_count_it() -> None:
    out = _redactor({"IP": "keep"}).redact({"text": f"From 10.1.2.3 by {EMAIL}"})
    assert out.payload == {"text": "From 10.1.2.3 by [EMAIL]", "redactions": {"EMAIL": 1}}


def test_a_source_overrides_the_job_wide_actions() -> None:
    redactor = _redactor(
        {"PHONE": "mask"},
        sources={"crm": {"entities": {"PHONE": "keep", "EMAIL": "hash"}}},
    )
    text = f"{EMAIL} / {PHONE}"
    crm = redactor.redact({"text": text}, "crm").payload
    other = redactor.redact({"text": text}, "push").payload
    assert crm is not None
    assert other is not None
    assert re.fullmatch(r"\[EMAIL:[0-9a-f]{12}\] / \+44 20 7946 0958", crm["text"])
    assert other["text"] == "[EMAIL] / [PHONE]"


def test_redaction_is_a_function_of_payload_source_and_key() -> None:
    redactor = _redactor({"EMAIL": "hash"})
    payload = {"text": f"{EMAIL} and {CARD}", "metadata": {"x": [EMAIL, {"y": PHONE}]}}
    assert redactor.redact(payload, "a") == redactor.redact(dict(payload), "a")


def test_settings_name_only_known_entity_types_and_sources() -> None:
    with pytest.raises(ConfigError, match=r"'EMIAL'.*did you mean 'EMAIL'"):
        _redactor({"EMIAL": "mask"})
    with pytest.raises(ConfigError, match=r"PERSON.*add its detector"):
        _redactor({"PERSON": "mask"})  # presidio is not among the detectors
    settings = RedactionSettings.model_validate({"sources": {"crn": {"entities": {}}}})
    with pytest.raises(ConfigError, match=r"'crn'.*did you mean 'crm'"):
        Redactor.from_settings(settings, environ={}, sources=["crm", "push", "replay", "input"])
    with pytest.raises(ConfigError, match=r"upper-case names"):
        load_settings(overrides={"redaction.entities": {"email": "mask"}}, environ={})
    with pytest.raises(ConfigError, match=r"redaction.entities.EMAIL"):
        load_settings(overrides={"redaction.entities": {"EMAIL": "blur"}}, environ={})
    assert Redactor.from_settings(RedactionSettings(enabled=False)) is None


def test_only_the_configured_detectors_run() -> None:
    redactor = _redactor(detectors=["email"])
    out = redactor.redact({"text": f"{EMAIL} {PHONE}"})
    assert out.payload == {"text": f"[EMAIL] {PHONE}", "redactions": {"EMAIL": 1}}


class _Broken:
    name = "broken"
    entities = ("X",)

    def find(self, text: str) -> list[Span]:
        msg = f"cannot read {text!r}"  # an error message that quotes the text
        raise ValueError(msg)


def test_a_failing_detector_is_named_without_quoting_the_text() -> None:
    redactor = Redactor([EmailDetector(), _Broken()])
    with pytest.raises(InputError) as err:
        redactor.redact({"text": f"mail {EMAIL}"})
    assert "'broken' failed (ValueError)" in str(err.value)
    assert EMAIL not in str(err.value)


def test_scrub_masks_raw_records_and_withholds_what_it_cannot_check() -> None:
    redactor = Redactor(
        [SecretDetector(), EmailDetector(), PhoneDetector(), IpDetector()],
        Policy({"IP": "keep", "EMAIL": "hash"}),
        key=KEY.encode(),
    )
    raw = json.dumps({"doc_id": "a", "text": f"mail {EMAIL} from 10.1.2.3, call {PHONE}"})
    letter = DeadLetter("in.jsonl", 7, "decode", f"bad record from {EMAIL}", raw)
    clean = redactor.scrub_letter(letter)
    assert EMAIL not in clean.raw
    assert PHONE not in clean.raw
    assert "10.1.2.3" in clean.raw  # kept job-wide, so kept here too
    assert re.search(r"\[EMAIL:[0-9a-f]{12}\]", clean.reason)
    assert (clean.source, clean.offset, clean.stage) == ("in.jsonl", 7, "decode")
    json.loads(clean.raw)  # still the JSON it was
    assert redactor.scrub_letter(DeadLetter("s", 1, "decode", "no", "nothing here")).raw == (
        "nothing here"
    )
    broken = Redactor([_Broken()])
    withheld = broken.scrub(f"mail {EMAIL}")
    assert withheld.startswith("[withheld: the redaction failed on this text (ValueError)")
    assert EMAIL not in withheld
