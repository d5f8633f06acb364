"""The redaction policy, and the redactor that applies it to a change's fields.

A :class:`Policy` maps each entity type to an action — ``mask``, ``hash``,
``drop_field``, ``drop_document`` or ``keep`` (see
:mod:`streamrag.config.redaction`) — job-wide, and per source over that. The
:class:`Redactor` runs the detectors over the fields of an upsert that end up
in the index or its logs: the ``text``, the ``title`` and every string (or
long integer) in ``metadata``, however deeply nested. A delete has no fields
and passes as it is.

It is a pure function of the payload, the source and the key: a record read
again after a restart is redacted exactly as the first time, so the index it
builds is the same (invariant 3).

**Keyed hashes.** ``hash`` writes ``[EMAIL:3f9a1c2b7d4e]``: the first 48 bits
of HMAC-SHA256 over the type and the value in a canonical form (an address in
lower case, a number's digits), so the same value gives the same tag wherever
it occurs. Without the key the tags cannot be reversed by hashing guesses
— a plain hash of an e-mail address can. Changing the key changes every tag.

**Nothing raw leaves.** Counts of what was found go into the change's payload
as ``redactions`` (``{"EMAIL": 2}``); a document dropped by the policy becomes
a dead letter whose reason names types and counts; the values themselves are
never logged, counted or kept. Dead letters hold raw records (a line that
failed to decode is not a change yet): :meth:`Redactor.scrub_letter` masks
them too before they are stored.
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import hmac
import ipaddress
import os
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, get_args

from streamrag.config.redaction import Action, RedactionSettings
from streamrag.errors import ConfigError, InputError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.pii.detectors import Detector, Screen, Span, build_detectors, resolve

__all__ = ["MIN_KEY_CHARS", "Policy", "Redacted", "Redactor"]

MIN_KEY_CHARS = 16
"""Shortest secret the ``hash`` action accepts."""

ACTIONS: tuple[str, ...] = get_args(Action)

_SHORTEST = 6
"""Texts shorter than the shortest entity (``a@b.cd``, ``1.2.3.4``) hold none."""


class Policy:
    """Entity type → action, job-wide and per source."""

    def __init__(
        self,
        entities: Mapping[str, Action] | None = None,
        *,
        default: Action = "mask",
        sources: Mapping[str, Mapping[str, Action]] | None = None,
    ) -> None:
        self.entities = dict(entities or {})
        self.default = default
        self.sources = {name: dict(acts) for name, acts in (sources or {}).items()}
        self._merged: dict[str, dict[str, Action]] = {}
        for name, acts in [("", self.entities), *self.sources.items()]:
            bad = {e: a for e, a in acts.items() if a not in ACTIONS}
            if bad:
                msg = f"unknown redaction actions {bad} (source {name!r}); use one of {ACTIONS}"
                raise ConfigError(msg)

    def actions(self, source: str = "") -> dict[str, Action]:
        """The actions in force for ``source``: its own over the job-wide ones."""
        merged = self._merged.get(source)
        if merged is None:
            merged = {**self.entities, **self.sources.get(source, {})}
            if len(self._merged) < 10_000:
                self._merged[source] = merged
        return merged

    def action(self, entity: str, source: str = "") -> Action:
        """What is done with ``entity`` found in a change of ``source``."""
        return self.actions(source).get(entity, self.default)

    def where(self, action: Action) -> list[str]:
        """``ENTITY`` (job-wide) or ``ENTITY@source`` for every place ``action`` is set."""
        out = [e for e, a in self.entities.items() if a == action]
        out += [
            f"{e}@{s}" for s, acts in self.sources.items() for e, a in acts.items() if a == action
        ]
        if self.default == action:
            out.append("default_action")
        return out


@dataclass(frozen=True, slots=True)
class Redacted:
    """What became of one payload: the new one (None: dropped), the counts, why it was dropped."""

    payload: Mapping[str, Any] | None
    counts: dict[str, int]
    reason: str | None = None


_DROP = object()
"""A field or metadata value removed by ``drop_field``."""

_SEP = "\n\x00\n"
"""Joins a payload's strings for one pass of the detectors; no entity spans a NUL."""

_MIN_INT = 1_000_000
"""Integers in metadata from this size on are scanned too (a card or phone number)."""


def _scanned(value: Any) -> str | None:
    """The text a metadata leaf is scanned as: a string, or a large integer's digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _MIN_INT:
        return str(value)
    return None


def _leaves(value: Any, out: list[str]) -> None:
    """Append the scanned leaves of a metadata value, depth first (as :func:`_rebuild`)."""
    if isinstance(value, Mapping):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _leaves(v, out)
    else:
        text = _scanned(value)
        if text is not None:
            out.append(text)


def _rebuild(value: Any, done: Iterator[Any]) -> Any:
    """``value`` with each scanned leaf replaced by the next of ``done`` (``_DROP``: removed)."""
    if isinstance(value, Mapping):
        items = ((k, _rebuild(v, done)) for k, v in value.items())
        return {k: v for k, v in items if v is not _DROP}
    if isinstance(value, list | tuple):
        return [v for v in (_rebuild(x, done) for x in value) if v is not _DROP]
    text = _scanned(value)
    if text is None:
        return value
    new = next(done)
    return value if new is text else new


class _Scan:
    """The state of one payload's redaction: counts, and what makes the document go."""

    def __init__(self, actions: Mapping[str, Action], default: Action) -> None:
        self.actions, self.default = actions, default
        self.counts: Counter[str] = Counter()
        self.dropping: dict[str, str] = {}  # entity → why it drops the document

    def action(self, entity: str) -> Action:
        return self.actions.get(entity, self.default)


class Redactor:
    """Finds entities with its detectors and applies a :class:`Policy` (see the module docstring).

    Thread-safe: the detectors are stateless once built.
    """

    def __init__(
        self,
        detectors: Sequence[Detector],
        policy: Policy | None = None,
        *,
        key: bytes | None = None,
        key_env: str = "STREAMRAG_REDACTION_KEY",
    ) -> None:
        self.detectors = list(detectors)
        self._screen = Screen.of(self.detectors)
        """Rules out, in one pass, a text none of the detectors can find anything in
        (None when a detector declares no candidates: then every one is asked)."""
        self.policy = policy or Policy()
        self._key = key
        hashed = self.policy.where("hash")
        if hashed and key is None:
            msg = (
                f"redaction: {', '.join(hashed)} set to hash, which needs a secret key in the "
                f"environment variable {key_env} (redaction.hmac_key_env), and it is unset. Set "
                f"it to a random value of at least {MIN_KEY_CHARS} characters (for example the "
                "output of `python -c 'import secrets; print(secrets.token_hex(32))'`) and keep "
                "it: the same key gives the same tags"
            )
            raise ConfigError(msg)
        if key is not None and len(key) < MIN_KEY_CHARS:
            msg = (
                f"redaction: the key in {key_env} is {len(key)} bytes; use at least "
                f"{MIN_KEY_CHARS} random characters"
            )
            raise ConfigError(msg)

    @classmethod
    def from_settings(
        cls,
        settings: RedactionSettings,
        *,
        environ: Mapping[str, str] | None = None,
        sources: Collection[str] | None = None,
    ) -> Redactor | None:
        """The redactor the settings describe; None when redaction is off.

        ``environ`` is where the hash key is read (the process environment when
        None); ``sources`` the source names a per-source policy may name.
        """
        if not settings.enabled:
            return None
        options: dict[str, dict[str, Any]] = {"presidio": settings.presidio.model_dump()}
        detectors = build_detectors(settings.detectors, options)
        known = sorted({e for d in detectors for e in d.entities})
        named = dict(settings.sources)
        checked = (
            [("redaction.entities", settings.entities)]
            if ("entities" in settings.model_fields_set)
            else []
        )
        checked += [(f"redaction.sources.{s}.entities", v.entities) for s, v in named.items()]
        for where, entities in checked:
            _check_known(where, entities, known)
        if sources is not None:
            for name in named:
                if name not in sources:
                    hint = difflib.get_close_matches(name, list(sources), n=1)
                    also = f"; did you mean {hint[0]!r}?" if hint else ""
                    msg = (
                        f"redaction.sources names {name!r}, which is no source of this job "
                        f"(sources: {', '.join(sorted(sources))}){also}"
                    )
                    raise ConfigError(msg)
        policy = Policy(
            settings.entities,
            default=settings.default_action,
            sources={s: v.entities for s, v in named.items()},
        )
        env = os.environ if environ is None else environ
        raw = env.get(settings.hmac_key_env)
        key = raw.encode("utf-8") if raw else None
        return cls(detectors, policy, key=key, key_env=settings.hmac_key_env)

    @property
    def entities(self) -> list[str]:
        """Every entity type the detectors report."""
        return sorted({e for d in self.detectors for e in d.entities})

    def screen_out(self, payloads: Sequence[Mapping[str, Any]]) -> bool:
        """True when no detector can find anything in any of ``payloads`` (one pass for all).

        The strings :meth:`redact` scans (text, title, metadata leaves) of every
        payload are joined and screened at once: a batch of plain prose is ruled
        out with one ``bytes.translate``, and each of its payloads is then left
        as it is, exactly as :meth:`redact` would leave it. False says only that
        some payload *may* hold something (or that a detector declares no
        candidates): each one must then go through :meth:`redact`.
        """
        screen = self._screen
        if screen is None:
            return False
        leaves: list[str] = []
        for payload in payloads:
            text, title = payload.get("text"), payload.get("title")
            if isinstance(text, str):
                leaves.append(text)
            if isinstance(title, str):
                leaves.append(title)
            if "metadata" in payload:
                _leaves(payload["metadata"], leaves)
        return not screen(_SEP.join(leaves))

    def find(self, text: str) -> list[Span]:
        """Every entity in ``text``, overlaps resolved (earlier detectors win ties).

        A detector that fails raises :class:`~streamrag.errors.InputError` naming
        the detector and the error's type — not its message, which may quote the text.
        """
        if len(text) < _SHORTEST:
            return []
        screen = self._screen
        if screen is not None and not screen(text):
            return []  # nothing any detector looks for: the common case of plain prose
        found: list[tuple[int, Span]] = []
        for rank, detector in enumerate(self.detectors):
            try:
                spans = detector.find(text)
            except Exception as exc:  # a detector's failure is the record's letter
                msg = (
                    f"redaction detector {detector.name!r} failed ({type(exc).__name__}); the "
                    "change was not applied, so nothing of it was stored unredacted. Fix or "
                    "remove the detector (redaction.detectors) and replay the dead letter"
                )
                raise InputError(msg) from exc
            if spans:
                found.extend([(rank, s) for s in spans])
        return resolve(found) if found else []

    def redact(self, payload: Mapping[str, Any], source: str = "") -> Redacted:
        """The payload with its entities acted on, for a change of ``source``."""
        leaves: list[str] = []
        text, title = payload.get("text"), payload.get("title")
        if isinstance(text, str):
            leaves.append(text)
        if isinstance(title, str):
            leaves.append(title)
        meta_at = len(leaves)
        if "metadata" in payload:
            _leaves(payload["metadata"], leaves)
        found = self._find_each(leaves)
        if not any(found):
            return Redacted(payload, {})
        scan = _Scan(self.policy.actions(source), self.policy.default)
        done = [self._apply(leaf, spans, scan) for leaf, spans in zip(leaves, found, strict=True)]
        out = dict(payload)
        i = 0
        if isinstance(text, str):
            if done[0] is _DROP:  # the body cannot go without its document
                for entity in sorted({s.entity for s in found[0]}):
                    if scan.action(entity) == "drop_field":
                        scan.dropping[entity] = f"{entity} in the text is set to drop_field"
            else:
                out["text"] = done[0]
            i = 1
        if isinstance(title, str):
            if done[i] is _DROP:
                del out["title"]
            else:
                out["title"] = done[i]
        if "metadata" in payload:
            meta = _rebuild(payload["metadata"], iter(done[meta_at:]))
            if meta is _DROP:
                del out["metadata"]
            else:
                out["metadata"] = meta
        counts = dict(sorted(scan.counts.items()))
        if scan.dropping:
            listed = ", ".join(f"{e} ({n})" for e, n in counts.items())
            why = "; ".join(scan.dropping[e] for e in sorted(scan.dropping))
            return Redacted(
                None, counts, f"dropped by the redaction policy: contains {listed}; {why}"
            )
        if not counts:  # only entities the policy keeps
            return Redacted(payload, counts)
        out["redactions"] = counts
        return Redacted(out, counts)

    def _find_each(self, leaves: list[str]) -> list[list[Span]]:
        """The spans of each leaf, found in one pass over all of them where possible.

        The leaves are joined with a separator no detector matches across; a
        span that crosses one anyway (a detector of one's own) sends each leaf
        through the detectors on its own.
        """
        if len(leaves) <= 1:
            return [self.find(leaf) for leaf in leaves]
        joined = _SEP.join(leaves)
        spans = self.find(joined)
        out: list[list[Span]] = [[] for _ in leaves]
        if not spans:
            return out
        starts, pos = [], 0
        for leaf in leaves:
            starts.append(pos)
            pos += len(leaf) + len(_SEP)
        for span in spans:
            i = bisect.bisect_right(starts, span.start) - 1
            begin = starts[i]
            if span.end > begin + len(leaves[i]):
                return [self.find(leaf) for leaf in leaves]
            out[i].append(Span(span.start - begin, span.end - begin, span.entity))
        return out

    def _apply(self, text: str, spans: list[Span], scan: _Scan) -> Any:
        """``text`` with the actions on its spans applied; ``_DROP`` when drop_field takes it."""
        spans = [s for s in spans if scan.action(s.entity) != "keep"]
        if not spans:
            return text
        dropped = False
        for span in spans:
            scan.counts[span.entity] += 1
            action = scan.action(span.entity)
            if action == "drop_document":
                scan.dropping[span.entity] = f"{span.entity} is set to drop_document"
            dropped = dropped or action == "drop_field"
        if dropped:
            return _DROP
        return self._replace(text, spans, scan.action)

    def _replace(self, text: str, spans: list[Span], action_of: Any) -> str:
        parts: list[str] = []
        pos = 0
        for span in spans:
            parts.append(text[pos : span.start])
            parts.append(self.tag(span.entity, text[span.start : span.end], action_of(span.entity)))
            pos = span.end
        parts.append(text[pos:])
        return "".join(parts)

    def tag(self, entity: str, value: str, action: Action = "mask") -> str:
        """What replaces ``value``: ``[EMAIL]``, or with ``hash`` ``[EMAIL:3f9a1c2b7d4e]``."""
        if action != "hash" or self._key is None:
            return f"[{entity}]"
        message = f"{entity}:{_canonical(entity, value)}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).hexdigest()
        return f"[{entity}:{digest[:12]}]"

    def scrub(self, text: str) -> str:
        """``text`` with every entity masked (hashed where the job-wide policy hashes it).

        For raw records and messages, which belong to no change; entities whose
        job-wide action is ``keep`` stay. Never raises: if the detectors fail on
        the text, it is withheld whole.
        """
        try:
            spans = [s for s in self.find(text) if self.policy.action(s.entity) != "keep"]
            if not spans:
                return text

            def action_of(entity: str) -> Action:
                return "hash" if self.policy.action(entity) == "hash" else "mask"

            return self._replace(text, spans, action_of)
        except Exception as exc:  # never keep what could not be checked
            cause = exc.__cause__ or exc
            return (
                f"[withheld: the redaction failed on this text ({type(cause).__name__}), so it "
                "is not kept]"
            )

    def scrub_letter(self, letter: DeadLetter) -> DeadLetter:
        """The letter with its raw record and reason scrubbed (:meth:`scrub`)."""
        raw, reason = self.scrub(letter.raw), self.scrub(letter.reason)
        if raw is letter.raw and reason is letter.reason:
            return letter
        return replace(letter, raw=raw, reason=reason)


def _canonical(entity: str, value: str) -> str:
    """One spelling per value, so that a hash joins its spellings (case, spaces, dashes)."""
    if entity == "EMAIL":
        return value.lower()
    if entity in ("PHONE", "CARD"):
        return "".join(c for c in value if c.isdigit())
    if entity in ("IBAN", "CN_ID"):
        return value.replace(" ", "").upper()
    if entity == "IP":
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            return value
    return value


def _check_known(where: str, entities: Mapping[str, Action], known: Sequence[str]) -> None:
    for entity in entities:
        if entity not in known:
            hint = difflib.get_close_matches(entity, known, n=1)
            also = f"; did you mean {hint[0]!r}?" if hint else ""
            msg = (
                f"{where} names {entity!r}, which no configured detector reports (they report "
                f"{', '.join(known)}){also}; add its detector to redaction.detectors"
            )
            raise ConfigError(msg)
