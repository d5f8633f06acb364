"""Secrets: credentials by the shapes their issuers give them, and private keys.

A leaked credential in an indexed runbook is served to everyone who can query
it, so every one found becomes ``SECRET``. Issuers make their tokens easy to
recognise on purpose (for secret scanning); what streamrag looks for:

=======================  ===================================================
AWS access key ids       ``AKIA``/``ASIA``/``ABIA``/``ACCA`` + 16 upper-case letters or digits
GitHub tokens            ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_`` + 36, and
                         ``github_pat_`` + 22 + ``_`` + 59
Slack tokens             ``xoxb-``/``xoxp-``/``xoxa-``/``xoxr-``/``xoxs-``, ``xapp-``, and
                         ``hooks.slack.com/services/`` webhook URLs
JWTs                     ``eyJ…​.eyJ…​.…``: the header must decode (base64url) to
                         a JSON object with an ``alg``
API keys                 ``sk-…`` (OpenAI-, Anthropic- and DeepSeek-style),
                         ``sk_live_``/``rk_live_`` (Stripe)
assignments              ``api_key=…``, ``token: …``, ``password = "…"``,
                         ``Authorization: Bearer …``: the value, when it is
                         long and random enough (16+ characters, letters and
                         digits, ≥ 3 bits of entropy per character)
private keys             a PEM ``-----BEGIN … PRIVATE KEY-----`` block, to its
                         ``END`` line (or, cut short, to the end of its body)
=======================  ===================================================

Random-looking is what tells a real token from a placeholder:
``ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX`` in documentation is left alone.
Each rule runs only when its literal prefix occurs in the text.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import re
from collections.abc import Callable

from streamrag.ingest.pii.detectors import Candidates, Span, resolve
from streamrag.ingest.pii.validators import shannon_entropy

__all__ = ["SecretDetector"]

_E = r"(?![A-Za-z0-9_\-])"


def _random(s: str, *, min_bits: float = 3.0) -> bool:
    """Whether ``s`` looks random: letters and digits mixed, and enough entropy.

    For a value after a key name, where prose could stand too ("token: it
    expires"); an issuer's prefix already says a token is one, and there
    :func:`_varied` suffices.
    """
    return any(c.isdigit() for c in s) and any(c.isalpha() for c in s) and _varied(s, min_bits)


def _varied(s: str, min_bits: float = 3.0) -> bool:
    """Whether ``s`` has the entropy of random characters (placeholders like XXXX have none)."""
    return shannon_entropy(s) >= min_bits


def _jwt_ok(token: str) -> bool:
    header = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))
        obj = json.loads(raw)
    except (binascii.Error, ValueError):
        return False
    return isinstance(obj, dict) and "alg" in obj


def _always(_: str) -> bool:
    return True


def _positions(text: str, word: str) -> list[int]:
    """Where ``word`` starts in ``text``, every time."""
    out = []
    i = text.find(word)
    while i >= 0:
        out.append(i)
        i = text.find(word, i + 1)
    return out


_Rule = tuple[str, re.Pattern[str], Callable[[str], bool]]
"""A character every match holds (tested first: most texts lack it), the pattern and its
validator. Each pattern begins with a literal, so the regex engine skips ahead to it."""

_RULES: list[_Rule] = [
    (
        "",
        re.compile(r"A(?<![A-Za-z0-9_\-]A)(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}" + _E),
        lambda s: len(set(s[4:])) > 4,
    ),
    (
        "_",
        re.compile(r"gh(?<![A-Za-z0-9_\-]gh)[pousr]_[A-Za-z0-9]{36}" + _E),
        lambda s: _varied(s[4:]),
    ),
    (
        "_",
        re.compile(
            r"github_pat_(?<![A-Za-z0-9_\-]github_pat_)[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _E
        ),
        lambda s: _varied(s[11:]),
    ),
    (
        "-",
        re.compile(
            r"xox(?<![A-Za-z0-9_\-]xox)[abposr]-[0-9A-Za-z]+(?:-[0-9A-Za-z]+){1,5}"
            + _E
            + r"|xapp-(?<![A-Za-z0-9_\-]xapp-)[0-9A-Za-z]+(?:-[0-9A-Za-z]+){1,5}"
            + _E
        ),
        lambda s: s.count("-") >= 2 and _varied(s.rsplit("-", 1)[-1], 2.5),
    ),
    (
        "/",
        re.compile(
            r"https://hooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/[A-Za-z0-9]{16,}"
        ),
        _always,
    ),
    (
        ".",
        re.compile(
            r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{6,}\.eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]*"
            + _E
        ),
        _jwt_ok,
    ),
    (
        "",
        re.compile(
            r"sk(?<![A-Za-z0-9_\-]sk)(?:-(?:proj-|ant-(?:api\d\d-)?|svcacct-|admin-)?|_(?:live|test)_)"
            r"[A-Za-z0-9_\-]{20,200}" + _E
        ),
        lambda s: _varied(s, 3.5),
    ),
    (
        "_",
        re.compile(r"rk_(?<![A-Za-z0-9_\-]rk_)(?:live|test)_[A-Za-z0-9]{20,200}" + _E),
        lambda s: _varied(s, 3.5),
    ),
]

_ASSIGN_WORDS = ("key", "token", "secret", "passw", "pwd", "credential")
_KEY_BEFORE = re.compile(
    r"(?i)(?:api[_\-]?key|apikey|access[_\-]?key|secret|token|password|passwd|pwd|credentials?)"
    r"[a-z0-9_\-]*[\"']?\s{0,3}$"
)
"""A key name that ends just before an assignment operator (``AWS_SECRET_ACCESS_KEY``)."""
_KEY_REACH = 40
"""Farthest a key word may end before its assignment operator (``secret_access_key" :``)."""
_VALUE_AFTER = re.compile(r"(?:>|=)?\s{0,3}[\"']?([A-Za-z0-9_\-./+=~]{16,512})")
_BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])bearer\s+([A-Za-z0-9_\-./+~]{16,2048}=*)")
_PEM_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----")
_PEM_BODY = re.compile(
    r"(?:(?:\r?\n|\\r\\n|\\n)[ \t]*(?:[A-Za-z0-9+/=]+|[A-Za-z\-]+: ?[A-Za-z0-9,\-]+))*"
)
"""A key's body: lines of base64 or PEM headers (``Proc-Type: 4,ENCRYPTED``), the newlines
between them also escaped, as in JSON."""
_PEM_MAX = 64_000
"""Farthest an END line is looked for after its BEGIN line."""


class SecretDetector:
    """Credentials and private keys (see the module docstring); all reported as ``SECRET``."""

    name: str = "secrets"
    entities: tuple[str, ...] = ("SECRET",)
    candidates: Candidates = Candidates("A_-/.:=0123456789")
    """Every rule's literal holds one of these characters (``A`` of ``AKIA``, ``_`` of
    ``ghp_``, ``-`` of ``xoxb-`` and ``sk-``, ``.`` of a JWT, ``/`` of a webhook), a PEM
    block ``-``, an assignment ``:`` or ``=``; a bearer token is random only with an
    ASCII digit (:func:`_random`)."""

    def find(self, text: str) -> list[Span]:
        """Every secret in ``text``."""
        found: list[tuple[int, Span]] = []
        for rank, (char, pattern, valid) in enumerate(_RULES):
            if char and char not in text:
                continue
            first = pattern.search(text)
            if first is None:
                continue
            for m in pattern.finditer(text, first.start()):
                if valid(m.group()):
                    found.append((rank, Span(m.start(), m.end(), "SECRET")))
        if "-----BEGIN " in text:
            found.extend((0, s) for s in self._pem(text))
        if ":" in text or "=" in text:
            lowered = text.lower()
            for word in _ASSIGN_WORDS:
                if word in lowered:
                    found.extend((len(_RULES), s) for s in self._assignments(text, lowered))
                    break
        if "earer" in text or "EARER" in text:
            for m in _BEARER.finditer(text):
                if _random(m.group(1)):
                    found.append((len(_RULES), Span(m.start(1), m.end(1), "SECRET")))
        return resolve(found) if found else []

    @staticmethod
    def _assignments(text: str, lowered: str) -> list[Span]:
        """Values assigned to a key name (``api_key=…``, ``"token": "…"``), if random enough.

        Each ``=`` and ``:`` a key word ends shortly before is a candidate, checked
        by what stands before and after it: the cost follows the key words and
        operators in the text, not its length.
        """
        if len(lowered) == len(text):  # positions in the lowered copy are the text's
            ends = sorted(p + len(w) for w in _ASSIGN_WORDS for p in _positions(lowered, w))
        else:  # a character whose lower case is longer: test every operator
            ends = []
        out = []
        for op in "=:":
            i = text.find(op)
            while i >= 0:
                near = bisect.bisect_right(ends, i)
                if not ends or (near and i - ends[near - 1] <= _KEY_REACH):
                    before = text[max(0, i - 64) : i]
                    if _KEY_BEFORE.search(before) is not None:
                        m = _VALUE_AFTER.match(text, i + 1)
                        if m is not None and _random(m.group(1)):
                            out.append(Span(m.start(1), m.end(1), "SECRET"))
                i = text.find(op, i + 1)
        return out

    @staticmethod
    def _pem(text: str) -> list[Span]:
        """PEM private-key blocks, from BEGIN to END (or to the end of a body cut short)."""
        out = []
        for m in _PEM_BEGIN.finditer(text):
            end_marker = f"-----END {m.group(1)}-----"
            end = text.find(end_marker, m.end(), m.end() + _PEM_MAX)
            if end >= 0:
                out.append(Span(m.start(), end + len(end_marker), "SECRET"))
                continue
            body = _PEM_BODY.match(text, m.end())
            out.append(Span(m.start(), body.end() if body else m.end(), "SECRET"))
        return out
