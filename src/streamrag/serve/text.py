r"""Small text helpers shared by the answer cache and the extractive answerer.

>>> normalize("  How do I rotate the DB password?! ")
'how do i rotate the db password'
>>> sorted(content_words("How do I rotate the database passwords?"))
['database', 'password', 'rotate']
>>> split_sentences("First one. Second one!\nA title")
['First one.', 'Second one!', 'A title']
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["FUNCTION_WORDS", "content_words", "normalize", "split_sentences"]

_WORD = re.compile(r"[\w']+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n+\s*")

FUNCTION_WORDS = frozenset(
    " ".join(
        [
            "a an the of to in on for and or is are was were be been am do does did i you we",
            "they my your our their how what which who whom when where why can could should",
            "would will shall may might must please me us it its this that these those with",
            "at by from as there here about",
        ]
    ).split()
)
"""Common English function words: they carry little of what a question is about."""


def normalize(text: str) -> str:
    """NFKC, case-folded, words only (apostrophes kept), single spaces."""
    text = unicodedata.normalize("NFKC", text).casefold().replace("\u2019", "'")
    return " ".join(_WORD.findall(text))


def content_words(text: str) -> set[str]:
    """The words of ``text`` that are not function words, crudely singularized."""
    out = set()
    for w in normalize(text).split():
        if w in FUNCTION_WORDS or len(w) < 2:
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.add(w)
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences and lines of ``text``, stripped, empty ones left out."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]
