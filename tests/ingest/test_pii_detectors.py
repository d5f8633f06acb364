"""Detectors find personal data by shape *and* validation: valid values in, look-alikes out."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamrag.config.redaction import RedactionSettings
from streamrag.errors import ConfigError, MissingDependencyError, MissingModelError
from streamrag.ingest.pii import (
    CardDetector,
    CnIdDetector,
    EmailDetector,
    IbanDetector,
    IpDetector,
    PhoneDetector,
    Redactor,
    SecretDetector,
    Span,
    build_detector,
    register_detector,
    resolve,
)
from streamrag.ingest.pii.planted import PLANTED_KINDS, planted_corpus
from streamrag.ingest.pii.validators import (
    country_code,
    iban_check_digits,
    iban_valid,
    luhn_check_digit,
    luhn_valid,
    prc_id_check_char,
    prc_id_valid,
)


def _found(detector: object, text: str) -> list[str]:
    return [text[s.start : s.end] for s in detector.find(text)]  # type: ignore[attr-defined]


# --- validators ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "number", ["4111111111111111", "378282246310005", "5555555555554444", "6011111111111117"]
)
def test_published_test_card_numbers_pass_luhn(number: str) -> None:
    assert luhn_valid(number)


@given(st.text("0123456789", min_size=12, max_size=18), st.data())
def test_luhn_catches_every_single_digit_error(partial: str, data: st.DataObject) -> None:
    number = partial + luhn_check_digit(partial)
    assert luhn_valid(number)
    i = data.draw(st.integers(0, len(number) - 1))
    other = data.draw(st.sampled_from([d for d in "0123456789" if d != number[i]]))
    assert not luhn_valid(number[:i] + other + number[i + 1 :])


@pytest.mark.parametrize(
    "iban",
    [
        "GB82WEST12345698765432",
        "DE89370400440532013000",
        "FR1420041010050500013M02606",
        "NL91ABNA0417164300",
        "NO9386011117947",
    ],
)
def test_published_ibans_pass_mod_97(iban: str) -> None:
    assert iban_valid(iban)


@given(st.text("0123456789", min_size=18, max_size=18), st.data())
def test_mod_97_catches_every_single_character_error(bban: str, data: st.DataObject) -> None:
    iban = "DE" + iban_check_digits("DE", bban) + bban
    assert iban_valid(iban)
    i = data.draw(st.integers(2, len(iban) - 1))
    other = data.draw(st.sampled_from([d for d in "0123456789" if d != iban[i]]))
    assert not iban_valid(iban[:i] + other + iban[i + 1 :])


def test_an_iban_needs_its_countrys_length_and_a_known_country() -> None:
    assert not iban_valid("GB82WEST1234569876543")  # one short
    assert not iban_valid("ZZ82WEST12345698765432")
    assert not iban_valid("gb82west12345698765432")


def test_prc_identity_numbers_need_province_date_and_check_character() -> None:
    assert prc_id_valid("11010519491231002X")
    assert prc_id_valid("11010519491231002x")
    assert not prc_id_valid("110105194912310021")  # check character
    first = "11010519990230123"  # 30 February 1999
    assert not prc_id_valid(first + prc_id_check_char(first))
    first = "99010519491231002"  # no province 99
    assert not prc_id_valid(first + prc_id_check_char(first))
    first = "11010518491231002"  # born 1849: outside 1900-2099
    assert not prc_id_valid(first + prc_id_check_char(first))


def test_country_codes_are_prefix_free_and_unassigned_ones_are_refused() -> None:
    assert country_code("14155552671") == "1"
    assert country_code("35312345678") == "353"
    assert country_code("2591234567") is None  # 259 is not assigned
    assert country_code("9991234567") is None


# --- e-mail ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Write to ada+billing@mail.example.co.uk.", ["ada+billing@mail.example.co.uk"]),
        ("ADA@EXAMPLE.ORG and bob_1@ex-ample.io", ["ADA@EXAMPLE.ORG", "bob_1@ex-ample.io"]),
        ("user.email=t@example.org", ["t@example.org"]),
        ("see https://example.org/u/ada@example.org", ["ada@example.org"]),
        ("mailto:o'neil@example.com)", ["o'neil@example.com"]),
        ("<li.wei@example.cn>", ["li.wei@example.cn"]),
    ],
)  # fmt: skip
def test_email_addresses_are_found_whole(text: str, expected: list[str]) -> None:
    assert _found(EmailDetector(), text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "@mentions and user@localhost",  # no domain with a top-level label
        "a..b@example.com",
        "end.@example.com",
        "version 1@2.3",
        "x" * 70 + "@example.com",  # a local part over 64 characters
    ],
)
def test_non_addresses_are_not_found(text: str) -> None:
    assert _found(EmailDetector(), text) == []


# --- phones -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "phone",
    [
        "+44 20 7946 0958",
        "+1 (415) 555-2671",
        "+14155552671",
        "+33 6 12 34 56 78",
        "+86 138 1234 5678",
        "13812345678",
        "139-1234-5678",
        "8613812345678",
        "021-6234 5678",
        "(0571) 8888 1234",
        "010-62345678",
        "0755-8123456",
    ],
)
def test_phone_numbers_are_found(phone: str) -> None:
    assert _found(PhoneDetector(), f"Call {phone}, please.") == [phone]


def test_a_parenthesised_country_code_is_part_of_the_number() -> None:
    assert _found(PhoneDetector(), "客服 (+86) 138 1234 5678。") == ["(+86) 138 1234 5678"]


@pytest.mark.parametrize(
    "text",
    [
        "+999 1234 5678",  # no country has code 999
        "+44 12",  # too short
        "15412345678",  # 154 is no mobile prefix
        "12345678901",
        "ORD-13812345678",  # glued to an id
        "order 02112345678",  # an area code cannot be told without its separator
        "0123-4567890",  # no area code starts 01 but 010
        "on 2024-03-05 at 10:30:00",
        "ticket 4481923 and 1700000000123456",
        "v1.2.3.4.5",
    ],
)
def test_look_alike_numbers_are_not_phones(text: str) -> None:
    assert _found(PhoneDetector(), text) == []


# --- cards and accounts -----------------------------------------------------------------


@pytest.mark.parametrize(
    "card",
    [
        "4539578763621486",
        "4539 5787 6362 1486",
        "4539-5787-6362-1486",
        "3782 822463 10005",  # American Express, 4-6-5
        "5555555555554444",
        "6222021234567894",  # UnionPay
    ],
)
def test_card_numbers_are_found(card: str) -> None:
    assert luhn_valid(card.replace(" ", "").replace("-", ""))
    assert _found(CardDetector(), f"Charged to {card}.") == [card]


@pytest.mark.parametrize(
    "text",
    [
        "4539578763621487",  # Luhn fails
        "4539 5787 6362-1486",  # two kinds of separator
        "45 3957 8763 6214 86",  # not how cards are grouped
        "1234567812345670",  # passes Luhn, but no network issues 1…
        "0000000000000000",
        "ORD-4539578763621486",
        "id 94539578763621486",  # inside a longer number
        "GB55 LKIT 4539 5787 6362 1486",  # the tail of an account number
    ],
)
def test_look_alike_numbers_are_not_cards(text: str) -> None:
    assert _found(CardDetector(), text) == []


def test_ibans_are_found_grouped_or_compact_and_wrong_ones_are_not() -> None:
    det = IbanDetector()
    text = "Pay GB82 WEST 1234 5698 7654 32 or DE89370400440532013000 by Friday."
    assert _found(det, text) == ["GB82 WEST 1234 5698 7654 32", "DE89370400440532013000"]
    assert _found(det, "GB82 WEST 1234 5698 7654 32 EUR") == ["GB82 WEST 1234 5698 7654 32"]
    assert _found(det, "GB83 WEST 1234 5698 7654 32") == []  # check digits
    assert _found(det, "GB82 WEST 1234 5698 7654 321") == []  # one too long
    assert _found(det, "GB82 WE ST12 3456 9876 5432") == []  # not grouped in fours


def test_identity_numbers_are_found_and_typos_are_not() -> None:
    det = CnIdDetector()
    assert _found(det, "身份证号 11010519491231002X 已核验") == ["11010519491231002X"]
    assert _found(det, "身份证号 110105194912310021 已核验") == []
    assert _found(det, "no 911010519491231002X") == []  # inside a longer number


# --- addresses ----------------------------------------------------------------------------


def test_ip_addresses_are_validated_by_ipaddress() -> None:
    det = IpDetector()
    text = (
        "From 192.168.1.20 and 2001:db8:85a3::8a2e:370:7334, not 10.0.0.256, "
        "not 300.1.2.3, ::ffff:192.0.2.1 too."
    )
    assert _found(det, text) == ["192.168.1.20", "2001:db8:85a3::8a2e:370:7334", "::ffff:192.0.2.1"]


def test_full_ipv6_addresses_are_found_among_log_times() -> None:
    """Times put many colons in a line; an address without ``::`` is still found among them."""
    det = IpDetector()
    times = "12:00:01 12:00:02 12:00:03 "
    full = "2001:0db8:85a3:0000:0000:8a2e:0370:7334"
    mapped = "64:ff9b:0:0:0:0:192.0.2.33"  # six groups and an IPv4 address: six colons
    assert _found(det, f"{times}from {full} at 12:00:04") == [full]
    assert _found(det, f"{times}from {mapped} at 12:00:04") == [mapped]
    assert _found(det, f"{times}from 10.1.2.3 at 12:00:04.250") == ["10.1.2.3"]
    assert _found(det, f"{times}12:00:04.250 12:00:05.500 done") == []


@pytest.mark.parametrize(
    "text",
    [
        "Upgrade to 1.2.3.4.5 today.",
        "Release notes for version 2.10.3.1 are out.",
        "See section 3.1.4.1 of the guide.",
        "Bind to 127.0.0.1 or 0.0.0.0 and ::1.",
        "NIC 00:1a:2b:3c:4d:5e at 12:30:45.",
        "C++ dead::beef and std::vector",
        "v1.2.3.4",
    ],
)
def test_numberings_loopback_and_look_alikes_are_not_addresses(text: str) -> None:
    assert _found(IpDetector(), text) == []


# --- secrets ----------------------------------------------------------------------------

GITHUB = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
OPENAI = "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM\n"
    "Kq0H4cGgP5R9mQn2ZbT7\n-----END RSA PRIVATE KEY-----"
)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
        (f"push with {GITHUB} now", GITHUB),
        (f"the bot posts with {SLACK}", SLACK),
        (f"Authorization: Bearer {JWT}", JWT),
        (f"OPENAI={OPENAI}", OPENAI),
        ('api_key = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"', "9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
        (f"AWS_SECRET_ACCESS_KEY: {AWS_SECRET}", AWS_SECRET),
        ('{"token": "Zx81Qp0Lm29Vb47Tr56Ws03Ue"}', "Zx81Qp0Lm29Vb47Tr56Ws03Ue"),
        (f"the deploy key:\n{PEM}\nends here", PEM),
    ],
)  # fmt: skip
def test_secrets_are_found(text: str, secret: str) -> None:
    assert _found(SecretDetector(), text) == [secret]


@pytest.mark.parametrize(
    "text",
    [
        "ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",  # a placeholder in documentation
        "AKIAXXXXXXXXXXXXXXXX",
        "sk-proj-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "api_key=<your-key-here>",
        "password: correcthorse",  # short and plain: not what a token looks like
        "the token: it expires after thirty days",
        "eyJub3QiOiJhIGp3dCJ9.eyJzdWIiOiIxIn0.abc",  # a header without alg
        "Reverted 9fceb02d0ae598e95dc970b74767f19372d61af8 after review.",
    ],
)
def test_placeholders_and_prose_are_not_secrets(text: str) -> None:
    assert _found(SecretDetector(), text) == []


def test_a_private_key_cut_short_is_masked_to_the_end_of_its_body() -> None:
    head = PEM.split("-----END")[0].rstrip()
    assert _found(SecretDetector(), f"{head}\n\nSee the docs.") == [head]


def test_a_private_key_in_a_json_record_is_found_across_escaped_newlines() -> None:
    raw = json.dumps({"text": f"deploy with {PEM}"})
    (found,) = _found(SecretDetector(), raw)
    assert found.startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert found.endswith("-----END RSA PRIVATE KEY-----")


# --- the whole set, measured ------------------------------------------------------------------


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    made = Redactor.from_settings(RedactionSettings())
    assert made is not None
    return made


def test_every_planted_value_is_found_and_no_decoy_is(redactor: Redactor) -> None:
    docs = planted_corpus(600, seed=11)
    planted = missed = 0
    kinds = set()
    wrong: list[str] = []
    for doc in docs:
        found = {(s.start, s.end, s.entity) for s in redactor.find(doc.text)}
        key = {(p.start, p.end, p.entity) for p in doc.planted}
        planted += len(key)
        kinds |= {p.kind for p in doc.planted}
        missed += len(key - found)
        wrong += [doc.text[s:e] for s, e, _ in sorted(found - key)]
    assert kinds == set(PLANTED_KINDS)
    assert planted > 1000
    assert missed == 0  # recall 1.0 on every validated type
    assert wrong == []  # and no decoy taken for one


def test_the_bundled_sample_corpus_has_no_false_positives(redactor: Redactor) -> None:
    data = resources.files("streamrag") / "data" / "sample_changes.jsonl"
    texts = []
    for line in data.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the demo's deliberately broken lines
        texts += [str(record.get(k, "")) for k in ("text", "title", "doc_id")]
        texts += [json.dumps(record.get("metadata") or {})]
    assert len(texts) > 800
    assert [t for t in texts if redactor.find(t)] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "a" * 200_000 + "@",
        "@" * 100_000,
        "1" * 300_000,
        "1 " * 150_000,
        "1." * 150_000,
        ":" * 100_000 + "1",
        "key=" * 50_000,
        "-----BEGIN PRIVATE KEY-----" * 10_000,
        ("A" * 20 + " ") * 10_000,
    ],
)
def test_hostile_texts_take_linear_time(redactor: Redactor, text: str) -> None:
    redactor.find(text)  # no pattern backtracks without bound: this returns


# --- overlaps and the registry ----------------------------------------------------------------


def test_overlapping_finds_keep_the_longest_then_the_earlier_detector() -> None:
    spans = [(1, Span(0, 10, "CARD")), (0, Span(2, 8, "PHONE")), (0, Span(12, 16, "IP"))]
    assert resolve(spans) == [Span(0, 10, "CARD"), Span(12, 16, "IP")]
    assert resolve([(1, Span(0, 5, "B")), (0, Span(0, 5, "A"))]) == [Span(0, 5, "A")]
    many = [(0, Span(i, i + 2, "X")) for i in range(0, 200_000, 3)]
    assert len(resolve(many)) == len(many)


class _Names:
    name = "names"
    entities = ("NAME",)

    def __init__(self, names: tuple[str, ...] = ("Ada",)) -> None:
        self.names = names

    def find(self, text: str) -> list[Span]:
        out = []
        for n in self.names:
            i = text.find(n)
            if i >= 0:
                out.append(Span(i, i + len(n), "NAME"))
        return sorted(out)


def _not_a_detector() -> object:
    return object()


def test_detectors_are_built_by_name_or_import_path() -> None:
    assert isinstance(build_detector("email"), EmailDetector)
    det = build_detector("tests.ingest.test_pii_detectors:_Names", names=("Grace",))
    assert det.find("Grace Hopper") == [Span(0, 5, "NAME")]
    register_detector("test-names", _Names)
    r = Redactor([build_detector("test-names"), EmailDetector()])
    assert r.redact({"text": "Ada at ada@example.org"}).payload == {
        "text": "[NAME] at [EMAIL]",
        "redactions": {"EMAIL": 1, "NAME": 1},
    }


def test_unknown_detectors_are_refused_with_what_exists() -> None:
    with pytest.raises(ConfigError, match=r"unknown redaction detector 'emial'.*email"):
        build_detector("emial")
    with pytest.raises(ConfigError, match=r"cannot be imported"):
        build_detector("tests.nowhere:Detector")
    with pytest.raises(ConfigError, match=r"lacks the Detector interface"):
        build_detector("tests.ingest.test_pii_detectors:_not_a_detector")


# --- Presidio (the pii extra) -------------------------------------------------------------------

_HAS_PRESIDIO = importlib.util.find_spec("presidio_analyzer") is not None


@pytest.mark.skipif(not _HAS_PRESIDIO, reason="presidio-analyzer is not installed (streamrag[pii])")
def test_presidio_without_a_spacy_model_says_what_to_install() -> None:
    from streamrag.ingest.pii.presidio import PresidioDetector

    with pytest.raises(MissingModelError) as err:
        PresidioDetector(model="en_core_web_sm_not_installed")
    message = str(err.value)
    assert "en_core_web_sm_not_installed" in message
    assert "spacy download" in message
    assert "redaction.presidio.model" in message
    assert isinstance(err.value, MissingDependencyError)


@pytest.mark.skipif(not _HAS_PRESIDIO, reason="presidio-analyzer is not installed (streamrag[pii])")
def test_presidio_finds_people_organisations_and_places(tmp_path: Path) -> None:
    """Through a real spaCy pipeline saved to disk (an entity ruler: no trained model needed)."""
    import spacy

    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns(  # type: ignore[attr-defined]
        [
            {"label": "PERSON", "pattern": [{"LOWER": "ada"}, {"LOWER": "lovelace"}]},
            {"label": "ORG", "pattern": "Acme Corp"},
            {"label": "GPE", "pattern": "Shanghai"},
        ]
    )
    nlp.to_disk(tmp_path / "pipeline")
    det = build_detector("presidio", model=str(tmp_path / "pipeline"))
    redactor = Redactor([det, EmailDetector()])
    out = redactor.redact({"text": "Ada Lovelace (ada@acme.example) of Acme Corp is in Shanghai."})
    assert out.payload == {
        "text": "[PERSON] ([EMAIL]) of [ORGANIZATION] is in [LOCATION].",
        "redactions": {"EMAIL": 1, "LOCATION": 1, "ORGANIZATION": 1, "PERSON": 1},
    }
