"""Detectors: find personal data in text, by shape first and then by validation.

A :class:`Detector` has a ``name``, the ``entities`` it reports and
``find(text)``, which returns :class:`Span` s. The built-in ones each work in
three steps, cheapest first:

1. **a prefilter** that rules most texts out at C speed — no ``@``, no e-mail;
   fewer than eight digits in the text, no phone number (thirteen: no card);
   no ``.168.1``-like middle of four dotted numbers, no IPv4 address; and for
   numbers, no run of digits of the form the pattern needs in the text's
   shape (:mod:`.shapes`: seventeen digits in a row for an identity number,
   ...);
2. **a pattern** that proposes candidates, with boundaries so that a card
   number is never read out of the middle of a longer number — for cards and
   Chinese phone numbers run only over the stretches of digits and separators
   whose shape holds such a run, not over the whole text;
3. **a validator** (:mod:`.validators`, or :mod:`ipaddress` for addresses) that
   keeps only the candidates that really are one: a Luhn check digit, a mod-97
   IBAN, an identity number's birth date and check character, an assigned
   country calling code.

Before any of them, the :class:`~.policy.Redactor` asks its :class:`Screen`:
each built-in detector declares the characters every text it can find
something in holds (:class:`Candidates`: ``@``, a digit, ``_``...), and a
text with none of them all, plain prose, skips the detectors altogether.

Detectors are looked up by name in a registry (:func:`register_detector`,
:func:`build_detector`); ``redaction.detectors`` lists the names (or import
paths ``pkg.mod:Factory`` of one's own). Where finds of several detectors
overlap, :func:`resolve` keeps the longest, and between equal ones the
detector listed first.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol, runtime_checkable

from streamrag.errors import ConfigError
from streamrag.ingest.normalize import holds_any_ascii
from streamrag.ingest.pii.shapes import digit_count, shape_of, stretches
from streamrag.ingest.pii.validators import (
    CN_MOBILE_PREFIXES,
    IBAN_LENGTHS,
    PRC_PROVINCES,
    cn_area_code_valid,
    country_code,
    iban_valid,
    luhn_valid,
    prc_id_valid,
)

__all__ = [
    "Candidates",
    "CardDetector",
    "CnIdDetector",
    "Detector",
    "EmailDetector",
    "IbanDetector",
    "IpDetector",
    "PhoneDetector",
    "Screen",
    "Span",
    "build_detector",
    "build_detectors",
    "detector_names",
    "register_detector",
    "resolve",
]


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """Where one value of an entity type sits in a text: ``text[start:end]``."""

    start: int
    end: int
    entity: str


@runtime_checkable
class Detector(Protocol):
    """Finds values of its entity types in a text; never returns overlapping spans of its own."""

    name: str
    entities: tuple[str, ...]

    def find(self, text: str) -> list[Span]:
        """Every value found in ``text``, in order."""
        ...


@dataclass(frozen=True, slots=True)
class Candidates:
    """What every text a detector finds something in holds: one of the ASCII ``chars``.

    A necessary condition, never a sufficient one: a text with none of them is
    one the detector returns no span for, so it need not be asked. A detector
    declares it as its ``candidates`` attribute; one without it is always asked.
    """

    chars: str


_DIGITS = "0123456789"


class Screen:
    """The candidates of several detectors together: one pass over a text rules it out.

    Built by :meth:`of` only when every detector declares :class:`Candidates`.
    Calling it says whether the text may hold something for any of them; a text
    of plain words (no digit, no ``@``, no punctuation the detectors look for)
    is ruled out with one ``bytes.translate`` instead of a call to every detector.
    """

    def __init__(self, parts: Iterable[Candidates]) -> None:
        parts = list(parts)
        chars = sorted({c for p in parts for c in p.chars})
        if any(not c.isascii() for c in chars):
            msg = f"candidate characters must be ASCII, found {chars}"
            raise ConfigError(msg)
        self.chars = "".join(chars)
        self._bytes = self.chars.encode("ascii")

    @classmethod
    def of(cls, detectors: Iterable[object]) -> Screen | None:
        """The screen of ``detectors``; None if one of them declares no candidates."""
        parts = []
        for d in detectors:
            c = getattr(d, "candidates", None)
            if not isinstance(c, Candidates):
                return None
            parts.append(c)
        return cls(parts)

    def __call__(self, text: str) -> bool:
        """False when no detector can find anything in ``text``; True when one may."""
        return holds_any_ascii(text, self._bytes)


def resolve(found: Iterable[tuple[int, Span]]) -> list[Span]:
    """Spans without overlaps: the longest wins, then the lowest rank (detector order).

    ``found`` holds ``(rank, span)`` pairs. Spans are cut into runs that overlap
    one another, and only within a run are they weighed, so the cost stays
    ``n log n`` however many spans a text has.

    >>> resolve([(1, Span(0, 5, "B")), (0, Span(2, 4, "A")), (0, Span(6, 8, "A"))])
    [Span(start=0, end=5, entity='B'), Span(start=6, end=8, entity='A')]
    """
    ordered = sorted(found, key=lambda rs: (rs[1].start, rs[1].end, rs[0]))
    kept: list[Span] = []
    run: list[tuple[int, Span]] = []
    reach = -1
    for rank, span in [*ordered, (0, Span(1 << 62, 1 << 62, ""))]:
        if run and span.start >= reach:
            if len(run) == 1:
                kept.append(run[0][1])
            else:
                kept.extend(_weigh(run))
            run = []
        run.append((rank, span))
        reach = max(reach, span.end) if len(run) > 1 else span.end
    return kept


def _weigh(run: list[tuple[int, Span]]) -> list[Span]:
    """Within spans that overlap: longest first, then rank; keep those free of the kept."""
    ranked = sorted(run, key=lambda rs: (-(rs[1].end - rs[1].start), rs[0], rs[1].start))
    kept: list[Span] = []
    for _, span in ranked:
        if all(span.end <= k.start or span.start >= k.end for k in kept):
            kept.append(span)
    kept.sort()
    return kept


# --- e-mail ------------------------------------------------------------------

_LOCAL = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.!#$%&'*+?^_`{|}~-"
)
"""Characters of a local part (RFC 5322's atext and dots), less ``=`` and ``/``: in
``email=ada@x.org`` and ``https://x.org/u/ada@x.org`` the address starts after them."""
_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,63}(?![A-Za-z0-9-])"
)


class EmailDetector:
    """E-mail addresses: a local part, ``@``, a domain of labels and an alphabetic TLD.

    The text is searched for ``@`` (none: nothing to do); from each one the
    local part is read backwards and the domain forwards, so the work is linear
    in the text whatever it holds.
    """

    name: str = "email"
    entities: tuple[str, ...] = ("EMAIL",)
    candidates: Candidates = Candidates("@")

    def find(self, text: str) -> list[Span]:
        """Every address in ``text``."""
        out: list[Span] = []
        at = text.find("@")
        while at >= 0:
            start = at
            while start > 0 and at - start <= 64 and text[start - 1] in _LOCAL:
                start -= 1
            # A full stop before the address ends a sentence; it is not part of it.
            local = text[start:at].lstrip(".")
            bounded = start == 0 or text[start - 1] not in _LOCAL  # not cut at 64
            start = at - len(local)
            m = _DOMAIN.match(text, at + 1)
            if (
                m is not None
                and bounded
                and local
                and not local.endswith(".")
                and ".." not in local
                and len(m.group()) <= 253
            ):
                out.append(Span(start, m.end(), "EMAIL"))
                at = text.find("@", m.end())
            else:
                at = text.find("@", at + 1)
        return out


# --- numbers -------------------------------------------------------------------


def _digits(s: str) -> str:
    return "".join(c for c in s if "0" <= c <= "9")


_GROUP_BEFORE = re.compile(r"(?:^|[^0-9A-Za-z])(?:[0-9A-Z]{4} ){1,2}$")


def _continues_a_group(text: str, start: int) -> bool:
    """Whether a number at ``start`` continues a run of four-character groups to its left.

    ``DE12 0717 4362 6356 00`` and ``GB55 LKIT 5013 4684 9911 24`` are one IBAN
    each (or an account number of that shape), not a country code and a bank
    followed by a phone or card number.
    """
    before = text[max(0, start - 11) : start]
    m = _GROUP_BEFORE.search(before)
    return m is not None and any(c.isdigit() for c in m.group())


# Patterns begin with a literal or a character set and test what stands before the
# match after it (or in Python, with _GLUE): a leading look-behind would keep the
# regex engine from skipping ahead to the characters a match can begin with.
_GLUE = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+_/.-")
"""Characters that glue a number to what stands before it (an id, a path, a version)."""
_E164 = re.compile(r"\+(?<![0-9A-Za-z+_/.\-]\+)[1-9](?:[ .\-]?\(?[0-9]\)?){6,16}(?![0-9])")
_CN_MOBILE = re.compile(
    r"(?:1(?<![0-9A-Za-z+_/.\-]1)|(?:0086|86)(?<![0-9A-Za-z+_/.\-]86)[ \-]?1)"
    r"([3-9][0-9])[ \-]?([0-9]{4})[ \-]?([0-9]{4})(?![0-9])"
)
_CN_RUNS = (b"0000000", b"000s0000")
"""What the shape of every Chinese phone number holds: seven digits in a row, or three and
four after one separator (:func:`stretches`)."""
_CN_LANDLINE = re.compile(
    r"(?:\((0[1-9][0-9]{1,2})\)[ \-]?|(0[1-9][0-9]{1,2})[ \-])([2-8][0-9]{2,3}[ \-]?[0-9]{4})"
    r"(?![0-9])"
)


def _free(text: str, start: int) -> bool:
    """Whether nothing glues the match at ``start`` to the text before it."""
    return start == 0 or text[start - 1] not in _GLUE


def _e164_valid(candidate: str, opened: bool) -> bool:
    """An international number; ``opened``: a "(" stands just before its "+" ("(+86) 138…")."""
    if candidate.count("(") + opened != candidate.count(")") or candidate.count(")") > 1:
        return False
    digits = _digits(candidate)
    cc = country_code(digits)
    return cc is not None and 8 <= len(digits) <= 15 and len(digits) - len(cc) >= 6


class PhoneDetector:
    """Phone numbers: international (E.164, ``+`` and a country calling code), and China's.

    * international: ``+``, an assigned country code (the ITU list), 8 to 15
      digits in all, single spaces, dots, dashes or one pair of parentheses
      between them;
    * mainland China mobile: 11 digits with an allocated ``1xx`` prefix, in one
      run or grouped 3-4-4, optionally after ``+86``/``86``;
    * mainland China landline: an area code (010, 02x, 03xx-09xx; in parentheses
      or followed by a space or dash) and a 7- or 8-digit local number that
      starts with 2-8. Without the separator an area code cannot be told from
      the start of any other number, so none is assumed.
    """

    name: str = "phone"
    entities: tuple[str, ...] = ("PHONE",)
    candidates: Candidates = Candidates(_DIGITS)  # its prefilter wants eight digits or more

    def find(self, text: str) -> list[Span]:
        """Every phone number in ``text``."""
        if digit_count(text) < 8:
            return []
        found: list[tuple[int, Span]] = []
        # Where Chinese numbers can be: among digits, spaces, dashes and parentheses.
        at = stretches(text, shape_of(text), _CN_RUNS, b"0sp")
        if not at and "+" not in text:
            return []
        if "+" in text:
            for m in _E164.finditer(text):
                start = m.start()
                opened = start > 0 and text[start - 1] == "("
                if _e164_valid(m.group(), opened):
                    found.append((0, Span(start - opened, m.end(), "PHONE")))
        for lo, hi in at:
            # Up to the stretch's end: what follows it is no digit, as at a text's end.
            for m in _CN_MOBILE.finditer(text, lo, hi):
                start = m.start()
                if "1" + m.group(1) in CN_MOBILE_PREFIXES and not _continues_a_group(text, start):
                    found.append((1, Span(start, m.end(), "PHONE")))
            for m in _CN_LANDLINE.finditer(text, lo, hi):
                area = m.group(1) or m.group(2)
                local = _digits(m.group(3))
                # 010 and 02x are followed by 8 digits; the other areas by 7 or 8.
                if (
                    cn_area_code_valid(area)
                    and (len(area) == 4 or len(local) == 8)
                    and _free(text, m.start())
                    and not _continues_a_group(text, m.start())
                ):
                    found.append((2, Span(m.start(), m.end(), "PHONE")))
        return resolve(found)


_CARD = re.compile(
    r"[0-9](?<![0-9A-Za-z_+\-.][0-9])(?:[ \-]?[0-9]){12,18}(?![0-9A-Za-z_]|[\-.][0-9])"
)
_CARD_RUNS = (b"0000000000000", b"0000s0000")
"""What the shape of every card number holds: thirteen digits in a row, or printed groups
(each starts 4-4 or 4-6; :func:`stretches`)."""
_CARD_GROUPS = {(4, 4, 4, 4), (4, 6, 5), (4, 6, 4), (4, 4, 4, 4, 3), (4, 4, 4, 1), (4, 4, 4, 2)}


def _card_network_ok(d: str) -> bool:
    """Whether an issuer prefix (IIN) of a card network starts ``d`` at a length it issues."""
    n, p2, p4 = len(d), int(d[:2]), int(d[:4])
    if d[0] == "4":
        return n in (13, 16, 19)  # Visa
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16  # Mastercard
    if p2 in (34, 37):
        return n == 15  # American Express
    if 2200 <= p4 <= 2204:
        return 16 <= n <= 19  # Mir
    if p4 == 6011 or 644 <= int(d[:3]) <= 649 or p2 in (62, 65):
        return 16 <= n <= 19  # Discover, UnionPay
    if 3528 <= p4 <= 3589:
        return 16 <= n <= 19  # JCB
    if 300 <= int(d[:3]) <= 305 or p2 in (36, 38, 39):
        return 14 <= n <= 19  # Diners Club
    if p2 == 50 or 56 <= p2 <= 69:
        return 13 <= n <= 19  # Maestro
    return False


def _id_shaped(digits: str) -> bool:
    """Whether 18 digits hold a province code and a birth date.

    Such a number is an identity number (or a typo of one), which the
    ``cn_id`` detector judges; it is not read as a card.
    """
    if len(digits) != 18 or digits[:2] not in PRC_PROVINCES:
        return False
    try:
        date(int(digits[6:10]), int(digits[10:12]), int(digits[12:14]))
    except ValueError:
        return False
    return 1900 <= int(digits[6:10]) <= 2099


def _card_valid(candidate: str) -> bool:
    seps = {c for c in candidate if c in " -"}
    if len(seps) > 1:
        return False
    digits = _digits(candidate)
    if _id_shaped(digits):
        return False
    if seps:
        groups = tuple(len(g) for g in candidate.split(seps.pop()))
        if groups not in _CARD_GROUPS:
            return False
    return len(set(digits)) > 1 and _card_network_ok(digits) and luhn_valid(digits)


class CardDetector:
    """Payment card numbers: 13-19 digits, an issuer prefix, the Luhn check digit.

    Digits run together or in the groups cards are printed in (4-4-4-4, 4-6-5
    for American Express, ...), one kind of separator throughout. A number
    inside a longer run of digits, or glued to letters (``ORD-4111...``), is
    not read as a card.
    """

    name: str = "card"
    entities: tuple[str, ...] = ("CARD",)
    candidates: Candidates = Candidates(_DIGITS)  # its prefilter wants thirteen digits or more

    def find(self, text: str) -> list[Span]:
        """Every card number in ``text``."""
        if digit_count(text) < 13:
            return []
        end = len(text)
        return [
            Span(m.start(), m.end(), "CARD")
            for lo, hi in stretches(text, shape_of(text), _CARD_RUNS, b"0s")
            # Two characters past the stretch: what the pattern's look-ahead reads.
            for m in _CARD.finditer(text, lo, min(end, hi + 2))
            if m.start() < hi and _card_valid(m.group()) and not _continues_a_group(text, m.start())
        ]


_IBAN = re.compile(r"[A-Z](?<![0-9A-Za-z][A-Z])[A-Z][0-9]{2}(?: ?[0-9A-Z]){11,30}")


def _iban_end(text: str, start: int, length: int) -> int | None:
    """Where the IBAN at ``start`` ends: after ``length`` letters and digits, spaced in fours."""
    count, i = 0, start
    while i < len(text) and count < length:
        ch = text[i]
        if ch == " " and count % 4 == 0 and count > 0 and text[i - 1] != " ":
            i += 1
            continue
        if not (ch.isascii() and (ch.isdigit() or ch.isupper())):
            return None
        count += 1
        i += 1
    if count < length or (i < len(text) and text[i].isalnum()):
        return None
    return i


class IbanDetector:
    """IBANs: a country code, two check digits and the account, by country length and mod 97.

    Upper case, run together or in groups of four (``GB82 WEST 1234 5698 7654 32``).
    """

    name: str = "iban"
    entities: tuple[str, ...] = ("IBAN",)
    candidates: Candidates = Candidates(_DIGITS)  # its prefilter wants eight digits or more

    def find(self, text: str) -> list[Span]:
        """Every IBAN in ``text``."""
        if digit_count(text) < 8 or b"AA00" not in shape_of(text):  # "GB82..."
            return []
        out: list[Span] = []
        for m in _IBAN.finditer(text):
            length = IBAN_LENGTHS.get(m.group()[:2])
            if length is None:
                continue
            end = _iban_end(text, m.start(), length)
            if end is not None and iban_valid(text[m.start() : end].replace(" ", "")):
                out.append(Span(m.start(), end, "IBAN"))
        return out


_CN_ID = re.compile(
    r"[1-8](?<![0-9A-Za-z][1-8])[0-9]{5}(?:19|20)[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])"
    r"[0-9]{3}[0-9Xx](?![0-9A-Za-z])"
)


class CnIdDetector:
    """PRC resident identity numbers: 18 characters, a province, a birth date, a check character."""

    name: str = "cn_id"
    entities: tuple[str, ...] = ("CN_ID",)
    candidates: Candidates = Candidates(_DIGITS)  # its prefilter wants seventeen digits or more

    def find(self, text: str) -> list[Span]:
        """Every identity number in ``text``."""
        if digit_count(text) < 17 or b"00000000000000000" not in shape_of(text):  # 17 in a row
            return []
        return [
            Span(m.start(), m.end(), "CN_ID")
            for m in _CN_ID.finditer(text)
            if prc_id_valid(m.group())
        ]


# --- addresses -----------------------------------------------------------------

_IPV4 = re.compile(
    r"[0-9](?<![0-9A-Za-z.][0-9])[0-9]{0,2}\.(?:[0-9]{1,3}\.){2}[0-9]{1,3}(?![0-9A-Za-z]|\.[0-9])"
)
_QUAD_MIDDLE = re.compile(r"\.[0-9]{1,3}\.[0-9]")
"""The middle of four dotted numbers (``.168.1`` of ``192.168.1.7``): the test before the
address pattern. It begins with a literal, so the search skips from dot to dot, where the
address pattern is tried at every digit (a log line's times and counts)."""
_SIX_COLONS = re.compile(
    r":[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:"
)
"""Six colons with a group between each two: every IPv6 address not shortened by ``::``
holds them (eight groups, or six and an IPv4 address), and times (``12:34:56``) do not."""
_IPV6 = re.compile(
    r"(?<![0-9A-Za-z:.])(?=[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:)[0-9A-Fa-f:]{2,39}"
    r"(?:(?<=:)(?:[0-9]{1,3}\.){3}[0-9]{1,3})?(?![0-9A-Za-z:]|\.[0-9])"
)
_NUMBERED = ("version ", "release ", "section ", "chapter ", "step ", "figure ", "table ")
"""Words after which four dotted numbers are a numbering, not an address."""


class IpDetector:
    """IPv4 and IPv6 addresses, each candidate checked by :mod:`ipaddress`.

    Loopback and unspecified addresses (``127.0.0.1``, ``::1``, ``0.0.0.0``)
    name no one and are left alone. Dotted numbers inside a longer dotted run
    (``1.2.3.4.5``) or after a word that makes them a numbering ("version
    1.2.3.4", "section 2.1.3.4") are not addresses. An IPv6 candidate needs a
    decimal digit, so ``dead::beef`` in code is left alone.
    """

    name: str = "ip"
    entities: tuple[str, ...] = ("IP",)
    candidates: Candidates = Candidates(_DIGITS)  # its prefilter wants two digits or more

    def find(self, text: str) -> list[Span]:
        """Every address in ``text``."""
        if digit_count(text) < 2:  # an IPv6 address needs a digit too (see above)
            return []
        out: list[tuple[int, Span]] = []
        if text.count(".") >= 3 and _QUAD_MIDDLE.search(text) is not None:
            for m in _IPV4.finditer(text):
                if self._v4(text, m):
                    out.append((1, Span(m.start(), m.end(), "IP")))
        if "::" in text or (text.count(":") >= 7 and _SIX_COLONS.search(text) is not None):
            for m in _IPV6.finditer(text):
                if self._v6(m.group()):
                    out.append((0, Span(m.start(), m.end(), "IP")))
        return resolve(out) if out else []  # ::ffff:192.0.2.1 holds an IPv4 address

    @staticmethod
    def _v4(text: str, m: re.Match[str]) -> bool:
        try:
            addr = ipaddress.IPv4Address(m.group())
        except ValueError:
            return False
        if addr.is_loopback or addr.is_unspecified:
            return False
        before = text[max(0, m.start() - 10) : m.start()].lower()
        return not before.endswith(_NUMBERED)

    @staticmethod
    def _v6(candidate: str) -> bool:
        if not any(c.isdigit() for c in candidate):
            return False
        try:
            addr = ipaddress.IPv6Address(candidate)
        except ValueError:
            return False
        return not (addr.is_loopback or addr.is_unspecified)


# --- the registry ----------------------------------------------------------------

DetectorFactory = Callable[..., Detector]

_REGISTRY: dict[str, DetectorFactory | str] = {
    "email": EmailDetector,
    "phone": PhoneDetector,
    "card": CardDetector,
    "iban": IbanDetector,
    "cn_id": CnIdDetector,
    "ip": IpDetector,
    "secrets": "streamrag.ingest.pii.secrets:SecretDetector",
    "presidio": "streamrag.ingest.pii.presidio:PresidioDetector",
}
"""Name → factory, or the import path of one (imported only when it is configured)."""


def register_detector(name: str, factory: DetectorFactory) -> None:
    """Make ``factory`` (a class or function returning a :class:`Detector`) known as ``name``."""
    _REGISTRY[name] = factory


def detector_names() -> list[str]:
    """The registered detector names."""
    return sorted(_REGISTRY)


def _import(path: str) -> DetectorFactory:
    module_name, _, attr = path.partition(":")
    try:
        factory: DetectorFactory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        msg = (
            f"redaction detector {path!r} cannot be imported ({type(exc).__name__}: {exc}); "
            f"name a registered detector ({', '.join(detector_names())}) or an import path "
            "'pkg.module:Factory'"
        )
        raise ConfigError(msg) from None
    return factory


def build_detector(name: str, **options: Any) -> Detector:
    """The detector registered as ``name`` (or at import path ``pkg.mod:Factory``)."""
    factory = _REGISTRY.get(name)
    if factory is None and ":" not in name:
        msg = (
            f"unknown redaction detector {name!r}; registered: {', '.join(detector_names())} "
            "(or give an import path 'pkg.module:Factory')"
        )
        raise ConfigError(msg)
    if factory is None or isinstance(factory, str):
        factory = _import(factory or name)
    detector = factory(**options)
    if not isinstance(detector, Detector):
        msg = (
            f"redaction detector {name!r} made a {type(detector).__name__}, which lacks the "
            "Detector interface: a name, the entities it reports and find(text) -> list[Span]"
        )
        raise ConfigError(msg)
    return detector


def build_detectors(names: Sequence[str], options: dict[str, dict[str, Any]]) -> list[Detector]:
    """The detectors ``names`` lists, each with its options (by name)."""
    return [build_detector(n, **options.get(n, {})) for n in names]
