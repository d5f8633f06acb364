from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamrag.chunking import TokenSplitter, chunk_id, content_hash


def test_short_text_is_one_chunk_verbatim() -> None:
    text = "Line one.\n\nLine two."
    assert TokenSplitter(max_tokens=10, overlap_tokens=0).split(text) == [text]


def test_paragraphs_are_packed_and_long_ones_windowed() -> None:
    s = TokenSplitter(max_tokens=4, overlap_tokens=1)
    text = "a b\n\nc d\n\ne f g h i j\n\nk"
    assert s.split(text) == ["a b\n\nc d", "e f g h", "h i j", "k"]


def test_editing_one_paragraph_keeps_the_other_chunks() -> None:
    s = TokenSplitter(max_tokens=5, overlap_tokens=0)
    before = s.split("alpha beta gamma\n\ndelta epsilon zeta\n\neta theta iota")
    after = s.split("alpha beta gamma\n\ndelta CHANGED zeta\n\neta theta iota")
    assert before[0] == after[0]
    assert before[2] == after[2]
    assert before[1] != after[1]


@given(st.lists(st.text(alphabet="abc \n", min_size=0, max_size=30), max_size=20))
def test_every_chunk_fits_and_no_word_is_lost(paragraphs: list[str]) -> None:
    s = TokenSplitter(max_tokens=6, overlap_tokens=2)
    text = "\n\n".join(paragraphs)
    chunks = s.split(text)
    assert all(1 <= len(c.split()) <= 6 for c in chunks)
    words = text.split()
    covered = [w for c in chunks for w in c.split()]
    assert set(covered) == set(words)
    assert len(covered) >= len(words)


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_bad_parameters_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="must"):
        TokenSplitter(max_tokens=max_tokens, overlap_tokens=overlap)


def test_ids_are_stable_and_distinct() -> None:
    ids = {chunk_id(t, d, p) for t in ("a", "b") for d in ("x", "y") for p in range(50)}
    assert len(ids) == 200
    assert chunk_id("a", "x", 3) == chunk_id("a", "x", 3)
    # Separator-safe: ("a", "bc") and ("ab", "c") differ.
    assert chunk_id("a", "bc", 0) != chunk_id("ab", "c", 0)
    assert content_hash("x") != content_hash("y")


def _letters(text: str) -> int:
    """A stand-in tokenizer: one token per three letters, as subword tokenizers do."""
    return sum(-(-len(w) // 3) for w in text.split())


@given(st.lists(st.text(alphabet="abcdefgh ", min_size=1, max_size=60), min_size=1, max_size=8))
def test_windows_respect_a_real_token_counter(paragraphs: list[str]) -> None:
    s = TokenSplitter(max_tokens=8, overlap_tokens=2, count_tokens=_letters)
    text = "\n\n".join(paragraphs)
    chunks = s.split(text)
    for chunk in chunks:
        assert _letters(chunk) <= 8 or len(chunk.split()) == 1  # one huge word stays whole
    assert set(w for c in chunks for w in c.split()) == set(text.split())
