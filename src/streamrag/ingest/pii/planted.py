"""A corpus with planted personal data and decoys, and its answer key.

How good is a detector? Count, on text where every answer is known, what it
finds (recall) and what it finds that is not there (precision). This module
writes such text: documents of prose sentences, some holding a *planted* value
of an entity type — valid by construction, from the same rules the validators
check (a Luhn digit, mod-97 check digits, a real birth date) — at a known span,
and others holding a *decoy*: something that looks like one but is not (a card
number one digit off its check digit, an IBAN with wrong check digits, an
identity number born on 30 February, ``1.2.3.4.5``, a date, an order number, a
placeholder token). A good detector finds every planted value and no decoy.

Deterministic: the same ``seed`` gives the same corpus, byte for byte.

>>> docs = planted_corpus(3, seed=7)
>>> d = docs[0]
>>> all(d.text[p.start : p.end] == p.value for p in d.planted)
True
>>> planted_corpus(3, seed=7) == docs
True
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from streamrag.ingest.pii.validators import (
    CN_MOBILE_PREFIXES,
    PRC_PROVINCES,
    iban_check_digits,
    luhn_check_digit,
    luhn_valid,
    prc_id_check_char,
)

__all__ = ["PLANTED_KINDS", "Decoy", "Planted", "PlantedDoc", "planted_corpus"]


@dataclass(frozen=True, slots=True)
class Planted:
    """A value planted at ``text[start:end]``: its entity type and how it was made."""

    start: int
    end: int
    entity: str
    kind: str
    value: str


@dataclass(frozen=True, slots=True)
class Decoy:
    """Something at ``text[start:end]`` that looks like an entity but is none."""

    start: int
    end: int
    kind: str
    value: str


@dataclass(frozen=True, slots=True)
class PlantedDoc:
    """One document of the corpus and its answer key."""

    doc_id: str
    text: str
    planted: tuple[Planted, ...]
    decoys: tuple[Decoy, ...]


_ALNUM = string.ascii_letters + string.digits
_B64URL = _ALNUM + "-_"


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def _plain_token(rng: random.Random, n: int, alphabet: str = _ALNUM) -> str:
    """``n`` random characters, as an issuer makes them (digits or not)."""
    return "".join(rng.choice(alphabet) for _ in range(n))


def _group(s: str, sizes: tuple[int, ...], sep: str) -> str:
    out, pos = [], 0
    for size in sizes:
        out.append(s[pos : pos + size])
        pos += size
    if pos < len(s):
        out.append(s[pos:])
    return sep.join(p for p in out if p)


# --- valid values ------------------------------------------------------------------

_NAMES = ["ada", "li.wei", "maria", "j.smith", "zhang_san", "o'neil", "k.tanaka", "ops-team"]
_DOMAINS = ["example.com", "mail.example.org", "corp.example.co.uk", "example.cn", "ex-ample.io"]


def _email(rng: random.Random) -> tuple[str, str]:
    local = rng.choice(_NAMES) + (str(rng.randint(1, 99)) if rng.random() < 0.5 else "")
    if rng.random() < 0.2:
        local += "+" + rng.choice(["billing", "tag", "x"])
    value = f"{local}@{rng.choice(_DOMAINS)}"
    return ("EMAIL", value.upper() if rng.random() < 0.1 else value)


_E164_PLANS = [("44", 10, (2, 4, 4)), ("1", 10, (3, 3, 4)), ("49", 11, (3, 4, 4)),
               ("33", 9, (1, 2, 2, 2, 2)), ("81", 10, (2, 4, 4)), ("91", 10, (5, 5)),
               ("61", 9, (1, 4, 4)), ("353", 9, (2, 3, 4)), ("65", 8, (4, 4)),
               ("852", 8, (4, 4))]  # fmt: skip


def _e164(rng: random.Random) -> tuple[str, str]:
    cc, n, groups = rng.choice(_E164_PLANS)
    national = str(rng.randint(2, 9)) + _digits(rng, n - 1)
    style = rng.randrange(4)
    if style == 0:
        return ("PHONE", f"+{cc}{national}")
    if style == 1 and cc == "1":
        return ("PHONE", f"+1 ({national[:3]}) {national[3:6]}-{national[6:]}")
    sep = " -."[style % 3]
    return ("PHONE", f"+{cc} {_group(national, groups, sep)}")


def _cn_mobile(rng: random.Random) -> tuple[str, str]:
    number = rng.choice(sorted(CN_MOBILE_PREFIXES)) + _digits(rng, 8)
    style = rng.randrange(4)
    if style == 0:
        return ("PHONE", number)
    if style == 1:
        return ("PHONE", f"{number[:3]} {number[3:7]} {number[7:]}")
    if style == 2:
        return ("PHONE", f"{number[:3]}-{number[3:7]}-{number[7:]}")
    return ("PHONE", f"+86 {number[:3]} {number[3:7]} {number[7:]}")


_AREAS = ["010", "020", "021", "022", "025", "027", "028", "029", "0571", "0755", "0512", "0311"]


def _cn_landline(rng: random.Random) -> tuple[str, str]:
    area = rng.choice(_AREAS)
    n = 8 if len(area) == 3 or rng.random() < 0.5 else 7
    local = str(rng.randint(2, 8)) + _digits(rng, n - 1)
    if rng.random() < 0.5:
        local = f"{local[:-4]} {local[-4:]}"
    return ("PHONE", f"({area}) {local}" if rng.random() < 0.3 else f"{area}-{local}")


_CARD_PLANS = [("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("34", 15), ("37", 15),
               ("62", 16), ("6011", 16), ("3530", 16), ("4", 19)]  # fmt: skip


def _card_digits(rng: random.Random) -> str:
    prefix, n = rng.choice(_CARD_PLANS)
    while True:
        partial = prefix + _digits(rng, n - len(prefix) - 1)
        number = partial + luhn_check_digit(partial)
        if len(set(number)) > 1:
            return number


def _format_card(rng: random.Random, number: str) -> str:
    style = rng.randrange(3)
    if style == 0:
        return number
    sep = " " if style == 1 else "-"
    sizes = (4, 6, 5) if len(number) == 15 else (4, 4, 4, 4, 3)
    return _group(number, sizes, sep)


def _card(rng: random.Random) -> tuple[str, str]:
    return ("CARD", _format_card(rng, _card_digits(rng)))


_BBAN = {"GB": "AAAA" + "9" * 14, "DE": "9" * 18, "NL": "AAAA" + "9" * 10, "FR": "9" * 23,
         "ES": "9" * 20, "IT": "A" + "9" * 22, "BE": "9" * 12, "CH": "9" * 17,
         "PL": "9" * 24, "AT": "9" * 16}  # fmt: skip
"""A BBAN pattern per country: A a letter, 9 a digit."""


def _iban_parts(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(_BBAN))
    bban = "".join(
        rng.choice(string.ascii_uppercase) if c == "A" else rng.choice(string.digits)
        for c in _BBAN[country]
    )
    return country, bban


def _format_iban(rng: random.Random, compact: str) -> str:
    return _group(compact, (4,) * 9, " ") if rng.random() < 0.6 else compact


def _iban(rng: random.Random) -> tuple[str, str]:
    country, bban = _iban_parts(rng)
    return ("IBAN", _format_iban(rng, country + iban_check_digits(country, bban) + bban))


def _birth(rng: random.Random) -> str:
    day = date(1940, 1, 1) + timedelta(days=rng.randrange(365 * 75))
    return day.strftime("%Y%m%d")


def _cn_id(rng: random.Random) -> tuple[str, str]:
    first = rng.choice(sorted(PRC_PROVINCES)) + _digits(rng, 4) + _birth(rng) + _digits(rng, 3)
    return ("CN_ID", first + prc_id_check_char(first))


def _ipv4(rng: random.Random) -> tuple[str, str]:
    first = rng.choice([10, 172, 192, 8, 34, 52, 100, 203, 185])
    rest = [rng.randint(0, 255), rng.randint(0, 255), rng.randint(1, 254)]
    return ("IP", ".".join(str(x) for x in [first, *rest]))


def _ipv6(rng: random.Random) -> tuple[str, str]:
    import ipaddress

    while True:
        groups = [0x2001, 0xDB8, *(rng.randrange(0x10000) for _ in range(6))]
        if rng.random() < 0.4:
            groups[3:6] = [0, 0, 0]
        value = str(ipaddress.IPv6Address(":".join(f"{g:x}" for g in groups)))
        if any(c.isdigit() for c in value):
            return ("IP", value)


def _jwt(rng: random.Random) -> str:
    def part(obj: object) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    claims = {"sub": _digits(rng, 10), "iat": 1_700_000_000 + rng.randrange(10**7)}
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.{_plain_token(rng, 43, _B64URL)}"


def _pem(rng: random.Random) -> str:
    body = base64.b64encode(rng.randbytes(rng.randint(120, 300))).decode()
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    label = rng.choice(["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY"])
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----"


def _secret(kind: str) -> Callable[[random.Random], tuple[str, str]]:
    def make(rng: random.Random) -> tuple[str, str]:
        if kind == "aws":
            return ("SECRET", "AKIA" + _plain_token(rng, 16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"))
        if kind == "github":
            return ("SECRET", "ghp_" + _plain_token(rng, 36))
        if kind == "slack":
            return (
                "SECRET",
                f"xoxb-{_digits(rng, 12)}-{_digits(rng, 13)}-{_plain_token(rng, 24)}",
            )
        if kind == "jwt":
            return ("SECRET", _jwt(rng))
        if kind == "sk":
            return ("SECRET", "sk-proj-" + _plain_token(rng, 48))
        if kind == "assignment":
            return ("SECRET", _plain_token(rng, 32, "0123456789abcdef"))
        return ("SECRET", _pem(rng))

    return make


# --- sentences ------------------------------------------------------------------------

_PLANTS: dict[str, tuple[Callable[[random.Random], tuple[str, str]], list[str]]] = {
    "email": (_email, ["Send the signed form to {} before Friday.",
                       "Questions go to {}, not the list."]),
    "e164": (_e164, ["The on-call phone is {} this week.", "Call {} if the pager stays silent."]),
    "cn_mobile": (_cn_mobile, ["客户手机 {}，请在工作时间联系。", "The courier's mobile is {}."]),
    "cn_landline": (_cn_landline, ["The Shanghai office answers on {}.", "前台电话：{}"]),
    "card": (_card, ["The refund went back to card {} on the 3rd.", "Card on file: {}."]),
    "iban": (_iban, ["Wire the deposit to {} with the invoice number.", "IBAN: {}"]),
    "cn_id": (_cn_id, ["身份证号 {} 已核验。", "The applicant's resident ID is {}."]),
    "ipv4": (_ipv4, ["The login came from {} at night.", "Block {} at the edge firewall."]),
    "ipv6": (_ipv6, ["The probe answered from {} twice.", "Allow {} in the security group."]),
    "aws": (_secret("aws"), ["Rotate the key {} today.", "export AWS_ACCESS_KEY_ID={}"]),
    "github": (_secret("github"), ["The CI used {} to push tags.", "Revoke {} in the settings."]),
    "slack": (_secret("slack"), ["The bot posts with {} now.", "Slack token {} was leaked."]),
    "jwt": (_secret("jwt"), ["Authorization: Bearer {}", "The session cookie held {}."]),
    "sk": (_secret("sk"), ["The notebook still has {} in it.",
                           "Replace {} with the vault lookup."]),
    "assignment": (_secret("assignment"), ["config: api_key={} for staging.", "token: {}"]),
    "pem": (_secret("pem"), ["The deploy script embeds\n{}\nand must be fixed."]),
}  # fmt: skip
"""Kind → (value maker, sentences with a slot for the value)."""

PLANTED_KINDS = tuple(_PLANTS)


def _luhn_fail(rng: random.Random) -> str:
    number = _card_digits(rng)
    wrong = str((int(number[-1]) + rng.randint(1, 9)) % 10)
    bad = number[:-1] + wrong
    assert not luhn_valid(bad)
    return _format_card(rng, bad)


def _iban_fail(rng: random.Random) -> str:
    country, bban = _iban_parts(rng)
    check = int(iban_check_digits(country, bban))  # the only valid pair: any other fails
    wrong = rng.choice([c for c in range(2, 99) if c != check])
    return _format_iban(rng, f"{country}{wrong:02d}{bban}")


def _id_checksum_fail(rng: random.Random) -> str:
    good = _cn_id(rng)[1]
    chars = [c for c in "0123456789X" if c != good[-1]]
    return good[:-1] + rng.choice(chars)


def _id_bad_date(rng: random.Random) -> str:
    day = rng.choice(["0230", "0431", "1332", "0000"])
    first = "110105" + str(rng.randint(1950, 2010)) + day + _digits(rng, 3)
    return first + prc_id_check_char(first)


_DECOYS: dict[str, tuple[Callable[[random.Random], str], list[str]]] = {
    "luhn_fail": (_luhn_fail, ["Order reference {} is not a card.", "Tracking number {}."]),
    "iban_fail": (_iban_fail, ["The typo {} bounced the transfer.", "Rejected account {}."]),
    "id_checksum_fail": (_id_checksum_fail, ["The form held {} with a typo."]),
    "id_bad_date": (_id_bad_date, ["Batch {} was generated by the test rig."]),
    "version": (lambda r: ".".join(str(r.randint(0, 20)) for _ in range(5)),
                ["Upgrade to {} before the freeze.", "Build {} fixed the leak."]),
    "version4": (lambda r: ".".join(str(r.randint(0, 20)) for _ in range(4)),
                 ["Release notes for version {} are out.", "See section {} of the guide."]),
    "date": (lambda r: f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
             ["The incident on {} lasted an hour.", "Due {}."]),
    "datetime": (lambda r: f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T"
                           f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z",
                 ["Deployed at {} by the pipeline."]),
    "time": (lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
             ["The job starts at {} every day."]),
    "order_number": (lambda r: f"ORD-2024-{_digits(r, 8)}",
                     ["Order {} shipped late.", "Refund {} is pending."]),
    "invoice": (lambda r: f"INV-{_digits(r, 8)}-{_digits(r, 4)}", ["Invoice {} is paid."]),
    "prose_number": (lambda r: f"{r.randint(1, 999)},{_digits(r, 3)},{_digits(r, 3)}",
                     ["We served {} requests in March."]),
    "money": (lambda r: f"${r.randint(1, 99)},{_digits(r, 3)}.{_digits(r, 2)}",
              ["The quote came to {} in total."]),
    "invalid_ip": (lambda r: f"{r.randint(256, 999)}.{r.randint(0, 255)}.{r.randint(0, 255)}.1",
                   ["The log shows {} which is no address."]),
    "mac": (lambda r: ":".join(f"{r.randrange(256):02x}" for _ in range(6)),
            ["The NIC {} was replaced."]),
    "uuid": (lambda r: f"{_digits(r, 8)}-e89b-12d3-a456-{_digits(r, 12)}",
             ["Request {} timed out."]),
    "timestamp_us": (lambda r: str(1_700_000_000_000_000 + r.randrange(10**12)),
                     ["The event time was {} µs."]),
    "git_sha": (lambda r: "".join(r.choice("0123456789abcdef") for _ in range(40)),
                ["Reverted {} after review."]),
    "unassigned_code": (lambda r: f"+999 {_digits(r, 4)} {_digits(r, 4)}",
                        ["The spam call came from {}."]),
    "bad_mobile_prefix": (lambda r: "154" + _digits(r, 8), ["Ticket {} was merged."]),
    "placeholder_token": (lambda r: r.choice(["ghp_" + "X" * 36, "AKIA" + "X" * 16,
                                               "sk-proj-" + "x" * 40, "api_key=<your-key-here>"]),
                          ["Put {} in your shell profile."]),
    "short_number": (lambda r: _digits(r, 6), ["Ticket #{} is closed."]),
}  # fmt: skip
"""Kind → (decoy maker, sentences with a slot for it)."""

_FILLER = [
    "The team reviewed the change on Tuesday.",
    "Nothing else in the runbook needs an update.",
    "Rollbacks take about ten minutes on the shared cluster.",
    "Owners sign off in the weekly review.",
    "Keep the defaults unless the operations team asks otherwise.",
    "这个流程每季度复核一次。",
]


def _doc(rng: random.Random, n: int) -> PlantedDoc:
    text = ""
    planted: list[Planted] = []
    decoys: list[Decoy] = []
    kinds = rng.sample(PLANTED_KINDS, rng.randint(1, 4))
    decoy_kinds = rng.sample(sorted(_DECOYS), rng.randint(1, 3))
    items = [("plant", k) for k in kinds] + [("decoy", k) for k in decoy_kinds]
    items += [("filler", "")] * rng.randint(1, 3)
    rng.shuffle(items)
    for what, kind in items:
        if text:
            text += " "
        if what == "filler":
            text += rng.choice(_FILLER)
            continue
        if what == "plant":
            make, templates = _PLANTS[kind]
            entity, value = make(rng)
        else:
            make_decoy, templates = _DECOYS[kind]
            entity, value = "", make_decoy(rng)
        head, _, tail = rng.choice(templates).partition("{}")
        start = len(text) + len(head)
        text += head + value + tail
        if what == "plant":
            planted.append(Planted(start, start + len(value), entity, kind, value))
        else:
            decoys.append(Decoy(start, start + len(value), kind, value))
    return PlantedDoc(f"planted-{n:05d}", text, tuple(planted), tuple(decoys))


def planted_corpus(n_docs: int = 300, *, seed: int = 0) -> list[PlantedDoc]:
    """``n_docs`` documents with planted values and decoys, the same for the same ``seed``."""
    rng = random.Random(seed)  # noqa: S311 - test data: reproducible, not secret
    return [_doc(rng, i) for i in range(n_docs)]
