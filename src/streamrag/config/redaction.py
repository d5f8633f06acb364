"""The ``redaction`` section: which personal data is taken out of changes, and how.

Redaction runs right after decoding (:mod:`streamrag.ingest.pii`), so nothing
downstream — the index, the write-ahead log, the dead-letter store, the logs,
the answer cache — ever holds what it removed. Each *entity type* (``EMAIL``,
``PHONE``, ...) found by the configured detectors gets an *action*:

``mask``
    the value becomes its type: ``[EMAIL]``.
``hash``
    the value becomes a keyed hash, ``[EMAIL:3f9a1c2b7d4e]`` (HMAC-SHA256 with the
    secret in the environment variable ``hmac_key_env``): the same value gives
    the same tag, so documents stay joinable on it, but without the key nobody
    can test guesses against the tags.
``drop_field``
    the field that held it goes: the title, or a metadata value; for the body
    text this drops the whole document.
``drop_document``
    the change is not applied; it becomes a dead letter whose reason names the
    types and their counts, never the values.
``keep``
    the value stays (and is not counted).

``sources`` overrides actions per source (a configured source's ``name``, or
``push``, ``replay`` and ``input`` for pushed changes, re-injected dead letters
and the JSONL input of ``source.path``)::

    redaction:
      entities: {EMAIL: hash, SECRET: drop_document}
      sources:
        crm: {entities: {PHONE: keep}}
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from streamrag.config.base import Frozen as _Frozen
from streamrag.errors import SpecError

__all__ = [
    "DEFAULT_DETECTORS",
    "VALIDATED_ENTITIES",
    "Action",
    "PresidioSettings",
    "RedactionSettings",
    "SourceRedactionSettings",
]

Action = Literal["mask", "hash", "drop_field", "drop_document", "keep"]

VALIDATED_ENTITIES = ("SECRET", "EMAIL", "CN_ID", "IBAN", "CARD", "PHONE", "IP")
"""The entity types of the built-in detectors, each found by shape and then validated."""

_MASK: Action = "mask"

DEFAULT_DETECTORS = ("secrets", "email", "cn_id", "iban", "card", "phone", "ip")
"""The built-in detectors, in the order that breaks ties between overlapping finds."""


def _check_entities(value: dict[str, Action]) -> dict[str, Action]:
    bad = [k for k in value if not k or not k.replace("_", "").isalnum() or k != k.upper()]
    if bad:
        msg = (
            f"entity types are upper-case names such as EMAIL or CARD; found {bad}. "
            f"The built-in ones: {', '.join(VALIDATED_ENTITIES)}"
        )
        raise SpecError(msg)
    return value


EntityActions = Annotated[dict[str, Action], AfterValidator(_check_entities)]


class SourceRedactionSettings(_Frozen):
    """Actions for the changes of one source, over the job-wide ones."""

    entities: EntityActions = Field(
        default_factory=dict,
        description="Entity type → action for this source (mask, hash, drop_field, "
        "drop_document, keep); types not named keep the job-wide action.",
    )


class PresidioSettings(_Frozen):
    """The Presidio detector (``detectors: [..., presidio]``): names, organisations, places."""

    model: str = Field(
        "en_core_web_sm",
        description="The spaCy pipeline Presidio reads entities from: an installed package "
        "name or a directory.",
    )
    entities: list[str] = Field(
        default_factory=lambda: ["PERSON", "ORGANIZATION", "LOCATION"],
        min_length=1,
        description="Presidio entity types to find.",
    )
    score_threshold: float = Field(
        0.5, ge=0, le=1, description="Presidio's lowest score that counts as a find."
    )
    language: str = Field("en", min_length=2, description="Language of the texts.")


class RedactionSettings(_Frozen):
    """Personal data found in changes and what is done with it (see the module docstring)."""

    enabled: bool = Field(
        True, description="Redact changes before they are chunked, embedded, stored or logged."
    )
    entities: EntityActions = Field(
        default_factory=lambda: {e: _MASK for e in VALIDATED_ENTITIES},
        description="Entity type → action: mask ([EMAIL]), hash ([EMAIL:3f9a1c2b7d4e], keyed), "
        "drop_field (the title or metadata value; for the text, the document), drop_document "
        "(a dead letter naming the types) or keep.",
    )
    default_action: Action = Field(
        "mask", description="Action for a type a detector finds that entities does not name."
    )
    sources: dict[str, SourceRedactionSettings] = Field(
        default_factory=dict,
        description="Per source name (a configured source's name, or push, replay, input): "
        "actions over the job-wide ones.",
    )
    hmac_key_env: str = Field(
        "STREAMRAG_REDACTION_KEY",
        min_length=1,
        description="Environment variable holding the secret key of the hash action (at least "
        "16 characters); streamrag refuses to start when hash is configured and it is unset.",
    )
    detectors: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DETECTORS),
        description="Detectors to run, by registered name (secrets, email, cn_id, iban, card, "
        "phone, ip, presidio) or import path 'pkg.mod:Factory'; earlier ones win where finds "
        "overlap.",
    )
    presidio: PresidioSettings = PresidioSettings()
