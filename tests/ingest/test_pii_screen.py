"""The detectors' screen: a text it rules out is one no detector finds anything in.

The :class:`~streamrag.ingest.pii.Redactor` skips its detectors for a text that
holds none of their candidates (:class:`~streamrag.ingest.pii.detectors.Screen`).
These tests fail if the screen ever rules out a text with a real finding.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.config.redaction import RedactionSettings
from streamrag.errors import ConfigError
from streamrag.ingest.pii import Redactor, Span, detectors, shapes
from streamrag.ingest.pii.detectors import Candidates, Screen, build_detector
from streamrag.ingest.pii.planted import planted_corpus

BUILT_IN = ("secrets", "email", "cn_id", "iban", "card", "phone", "ip")

PROSE = "dene zemaibe dibo kagou staimi laira mefube gasto vairi mapo maizo"
"""Lower-case words and spaces: nothing any detector looks for."""


def _redactors() -> tuple[Redactor, Redactor]:
    """The default redactor, and the same without its screen (every detector asked)."""
    screened = Redactor.from_settings(RedactionSettings())
    unscreened = Redactor.from_settings(RedactionSettings())
    assert screened is not None
    assert unscreened is not None
    assert screened._screen is not None
    unscreened._screen = None
    return screened, unscreened


def _bare_values() -> list[str]:
    """Every planted value of the corpus, alone between plain words (no other candidate)."""
    out = []
    for doc in planted_corpus(200, seed=3):
        for p in doc.planted:
            out.append(f"{PROSE} {p.value} {PROSE}")
        for d in doc.decoys:
            out.append(f"{PROSE} {d.value} {PROSE}")
    return out


HAND_MADE = [
    "AKIAQWERTYUIOPASDFGH",  # an AWS key id: its only candidate is the A
    "ghp_" + "aZ3kQ9xLm2Pq7Rt5Vw8Yb1Cd4Ef6Gh0JkLmN",
    "github_pat_"
    + "A1b2C3d4E5f6G7h8I9j0K1"
    + "_"
    + "x" * 10
    + "Q7w8E9r0T1y2U3i4O5p6" * 2
    + "abcdefghi",
    "xoxb-123456789012-1234567890123-aZ3kQ9xLm2Pq7Rt5Vw8Yb1Cd",
    "https://hooks.slack.com/services/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",
    "sk-proj-aZ3kQ9xLm2Pq7Rt5Vw8Yb1Cd4Ef6Gh0JkLmNpQrStUv",
    "sk_live_aZ3kQ9xLm2Pq7Rt5Vw8Yb1Cd4Ef",
    "rk_live_aZ3kQ9xLm2Pq7Rt5Vw8Yb1Cd4Ef",
    "authorization bearer qwzrtx9pvkmnbgfdshjlcyaeiou",  # a digit makes it random
    "AUTHORIZATION BEARER qwzrtx9pvkmnbgfdshjlcyaeiou",
    "password = hZ3kQ9xLm2Pq7Rt5Vw8Yb1",
    "write to ada@example.org",
    "call 13812345678",
    "ip 8.8.4.4 answered",
    "ip 2001:db8::1 answered",
    "card 4111111111111111",
    "iban GB82WEST12345698765432",
    "id 11010519491231002X",
]


@pytest.mark.parametrize("text", HAND_MADE)
def test_the_screen_lets_every_real_finding_through(text: str) -> None:
    screened, unscreened = _redactors()
    found = unscreened.find(f"{PROSE} {text} {PROSE}")
    assert screened.find(f"{PROSE} {text} {PROSE}") == found


def test_hand_made_samples_hold_findings() -> None:
    """The samples above are real findings (else the test before proves nothing)."""
    _, unscreened = _redactors()
    missing = [t for t in HAND_MADE if not unscreened.find(f"{PROSE} {t} {PROSE}")]
    assert missing == []


def test_planted_values_alone_are_found_as_without_the_screen() -> None:
    screened, unscreened = _redactors()
    texts = _bare_values()
    found = 0
    for text in texts:
        expected = unscreened.find(text)
        found += bool(expected)
        assert screened.find(text) == expected, text
    assert found > len(texts) // 3  # the corpus's planted values are found


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_detector_finds_only_in_texts_its_candidates_admit(name: str) -> None:
    detector = build_detector(name)
    screen = Screen.of([detector])
    assert screen is not None
    for text in [*_bare_values(), *(f"{PROSE} {t} {PROSE}" for t in HAND_MADE)]:
        if detector.find(text):
            assert screen(text), (name, text)


def test_plain_prose_is_ruled_out_and_finds_nothing() -> None:
    screened, unscreened = _redactors()
    assert screened._screen is not None
    assert not screened._screen(PROSE)
    assert not screened._screen("déjà vu ça naïve 你好 世界 prose")  # non-ASCII letters
    assert screened.find(PROSE) == unscreened.find(PROSE) == []


class _Own:
    """A detector of one's own, with no candidates: the screen must not skip it."""

    name = "own"
    entities = ("WORD",)

    def find(self, text: str) -> list[Span]:
        i = text.find("zemaibe")
        return [] if i < 0 else [Span(i, i + 7, "WORD")]


def test_a_detector_without_candidates_turns_the_screen_off() -> None:
    assert Screen.of([build_detector("email"), _Own()]) is None
    red = Redactor([build_detector("email"), _Own()])
    assert red.find(PROSE) == [Span(5, 12, "WORD")]


def test_candidates_are_ascii() -> None:
    with pytest.raises(ConfigError, match="ASCII"):
        Screen([Candidates("é")])


_ALPHABET = "ab ABKISCeyJxoghprkstuvw_-/.:=@0123456789\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ALPHABET, min_size=0, max_size=120))
def test_screened_and_unscreened_find_the_same(text: str) -> None:
    screened, unscreened = _redactors()
    assert screened.find(text) == unscreened.find(text)


def test_random_mixes_of_values_and_prose_agree() -> None:
    screened, unscreened = _redactors()
    values = _bare_values()
    rng = random.Random(11)
    for _ in range(300):
        parts = rng.sample(values, 2)
        text = " ".join(p[len(PROSE) + 1 : len(p) - len(PROSE) - 1] for p in parts)
        assert screened.find(text) == unscreened.find(text)


# -- the number detectors' shape test (shapes.shape_of) -------------------------------

NUMBERS = ("cn_id", "iban", "card", "phone")
"""The detectors that look at a text's shape before running their pattern."""

_EVERY_SHAPE = b"00000000000000000s0000s0000AA00"
"""A shape that holds every run the number detectors look for: with it they run their
patterns on every text, as before the shape test."""


def _whole(text: str, shape: bytes, runs: object, chars: bytes) -> list[tuple[int, int]]:
    return [(0, len(text))]


def _without_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every number detector runs its patterns over the whole of every text."""
    monkeypatch.setattr(detectors, "shape_of", lambda text: _EVERY_SHAPE)
    monkeypatch.setattr(detectors, "stretches", _whole)


def _numbers_in_context() -> list[str]:
    """Planted numbers, alone and amid short numbers, capitals and separators."""
    rng = random.Random(5)
    noise = ["w123", "4567", "12-34", "(0)", "+1", "GB", "AB12", "v1.2.3", "10:20:30", "-", "x"]
    out = []
    for text in [*_bare_values(), *HAND_MADE]:
        out.append(text)
        words = [rng.choice(noise) for _ in range(6)]
        out.append(" ".join([*words[:3], text, *words[3:]]))
    return out


@pytest.mark.parametrize("name", NUMBERS)
def test_the_shape_test_hides_no_finding(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a detector finds with the shape test equals what its pattern finds alone."""
    detector = build_detector(name)
    texts = _numbers_in_context()
    with_shapes = [detector.find(t) for t in texts]
    _without_shapes(monkeypatch)
    without = [detector.find(t) for t in texts]
    assert with_shapes == without
    assert sum(map(bool, without)) >= 20, name  # the corpus holds values of this kind


def _assert_same_with_and_without_shapes(text: str) -> None:
    """Every number detector finds in ``text`` what its pattern alone finds."""
    detectors_ = [build_detector(n) for n in NUMBERS]
    with_shapes = [d.find(text) for d in detectors_]
    with pytest.MonkeyPatch.context() as mp:
        _without_shapes(mp)
        assert with_shapes == [d.find(text) for d in detectors_]


_NUMBERISH = "0123456789 -+().ABGX"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_NUMBERISH, min_size=0, max_size=60))
def test_the_shape_test_agrees_on_number_soup(text: str) -> None:
    _assert_same_with_and_without_shapes(text)


def _values() -> list[str]:
    return [v[len(PROSE) + 1 : len(v) - len(PROSE) - 1] for v in _bare_values()]


_GLUE = [" ", "-", "(", ")", "+", ".", "0", "12", "345", "x", "A", "GB", "é", "\n", "  "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_GLUE) | st.sampled_from(_values()), max_size=8))
def test_the_shape_test_agrees_on_values_glued_together(parts: list[str]) -> None:
    """Planted values next to each other, to digits, separators and letters, or non-ASCII."""
    _assert_same_with_and_without_shapes("".join(parts))


def test_short_numbers_are_ruled_out_by_their_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Words with short numbers in them (log lines, ids) never reach the patterns."""
    text = " ".join(f"w{i} {i * 37 % 1000}" for i in range(60))
    calls: list[str] = []

    class Spy:
        def __init__(self, pattern: Any) -> None:
            self.pattern = pattern

        def finditer(self, t: str, *span: int) -> Any:
            calls.append(self.pattern.pattern)
            return self.pattern.finditer(t, *span)

    for attr in ("_CN_ID", "_IBAN", "_CARD", "_CN_MOBILE", "_CN_LANDLINE"):
        monkeypatch.setattr(detectors, attr, Spy(getattr(detectors, attr)))
    for name in NUMBERS:
        assert build_detector(name).find(text) == []
    assert calls == []
    assert build_detector("phone").find(text + " call 13812345678") != []
    assert len(calls) == 2  # the mobile and landline patterns ran for the number


def test_threads_asking_for_shapes_in_turn_each_get_their_own() -> None:
    """The shape is remembered for the last text, which threads share: each gets its own."""
    pool = ["call 138-1234 5678", "card 4111 1111 1111 1111", "w12 w345 6789", "id 110105"]
    fresh = type(shapes.shape_of)  # an instance of its own: nothing remembered
    expected = [(fresh()(t), sum(c.isdigit() for c in t)) for t in pool]
    wrong: list[int] = []

    def work(k: int) -> None:
        for n in range(20_000):
            i = (n + k) % len(pool)
            if (shapes.shape_of(pool[i]), shapes.digit_count(pool[i])) != expected[i]:
                wrong.append(i)

    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the interpreter over as often as it can
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(saved)
    assert wrong == []
