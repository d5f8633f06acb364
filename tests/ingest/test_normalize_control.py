"""Control characters come out of ASCII and other text alike (byte search and regex agree)."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.ingest.normalize import normalize_text

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _reference(text: str) -> str:
    return _CONTROL.sub("", unicodedata.normalize("NFC", text)).strip()


def test_every_ascii_character_is_kept_or_removed_as_before() -> None:
    for i in range(128):
        c = chr(i)
        assert normalize_text(f"a{c}b") == _reference(f"a{c}b"), i
        assert normalize_text(f"a{c}b é") == _reference(f"a{c}b é"), i  # not ASCII


def test_controls_are_removed_and_the_rest_kept() -> None:
    assert normalize_text("line\x00one\x07\ttab\nnext\x7f ") == "lineone\ttab\nnext"
    assert normalize_text("plain words only") == "plain words only"
    # A lone surrogate (JSON's "\\ud800" decodes to one) beside a control character.
    assert normalize_text("a\ud800\x01b") == _reference("a\ud800\x01b") == "a\ud800b"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40))
def test_ascii_text_as_the_regex_has_it(text: str) -> None:
    assert normalize_text(text) == _reference(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_as_the_regex_has_it(text: str) -> None:
    assert normalize_text(text) == _reference(text)
