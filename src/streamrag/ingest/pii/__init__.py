"""Personal data out of changes before anything embeds, stores, logs or caches them.

Once an e-mail address is in a chunk it is in the vectors, the write-ahead log,
the answers that quote it and the cache that keeps those answers; taking it out
later means finding every copy. So streamrag takes it out once, at the door:
right after a record is decoded, before event time, chunking and embedding
(``RedactStage`` in :mod:`streamrag.runtime.stages`).

The parts:

* :mod:`.detectors` — the :class:`Detector` interface, the built-in detectors
  (e-mail, phone, payment card, IBAN, PRC identity number, IP address) and
  their registry. Each proposes candidates with a pattern and keeps only those
  that pass a validation: a check digit, an allocation table, :mod:`ipaddress`;
* :mod:`.secrets` — API keys, tokens and private keys;
* :mod:`.validators` — Luhn, mod 97, GB 11643 and the tables;
* :mod:`.presidio` — people, organisations and places through Presidio
  (the optional ``pii`` extra);
* :mod:`.policy` — what is done with each entity type, per source (mask, keyed
  hash, drop the field, drop the document, keep), and the :class:`Redactor`
  that applies it;
* :mod:`.planted` — a corpus with planted values and decoys, and its answer
  key, that the tests and ``benchmarks/redaction.py`` measure recall and
  precision on.

>>> r = Redactor([EmailDetector()])
>>> r.redact({"text": "Write to ada@example.org today."}).payload
{'text': 'Write to [EMAIL] today.', 'redactions': {'EMAIL': 1}}
"""

from streamrag.ingest.pii.detectors import (
    CardDetector,
    CnIdDetector,
    Detector,
    EmailDetector,
    IbanDetector,
    IpDetector,
    PhoneDetector,
    Span,
    build_detector,
    build_detectors,
    detector_names,
    register_detector,
    resolve,
)
from streamrag.ingest.pii.policy import Policy, Redacted, Redactor
from streamrag.ingest.pii.secrets import SecretDetector

__all__ = [
    "CardDetector",
    "CnIdDetector",
    "Detector",
    "EmailDetector",
    "IbanDetector",
    "IpDetector",
    "PhoneDetector",
    "Policy",
    "Redacted",
    "Redactor",
    "SecretDetector",
    "Span",
    "build_detector",
    "build_detectors",
    "detector_names",
    "register_detector",
    "resolve",
]
