"""``count_words`` counts as ``len(text.split())`` does, on ASCII text by bytes and on any other."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.chunking.splitters import count_words

_ASCII_WS = "".join(chr(i) for i in range(128) if chr(i).isspace())
_SOME = _ASCII_WS + "ab.\x00\x7f-" + "\u00a0\u2003\u3000é漢"  # with non-ASCII spaces too


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=_SOME, max_size=40))
def test_counts_as_split_does(text: str) -> None:
    assert count_words(text) == len(text.split())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_counts_as_split_does_on_any_text(text: str) -> None:
    assert count_words(text) == len(text.split())


def test_every_ascii_whitespace_separates_words() -> None:
    for ws in _ASCII_WS:
        text = f"{ws}one{ws}{ws}two{ws}three{ws}"
        assert count_words(text) == 3, repr(ws)
    assert count_words("") == 0
    assert count_words("   ") == 0
    assert count_words("word") == 1
    assert count_words("a\x00b c") == 2  # a control character is no space
