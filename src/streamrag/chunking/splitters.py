r"""Split documents into chunks small enough for the embedder.

Chunks follow the document's own structure: paragraphs (blank-line separated)
are packed greedily into chunks of at most ``max_tokens``; a paragraph longer
than that is cut into windows of ``max_tokens`` that overlap by
``overlap_tokens``. Because boundaries sit on paragraphs, editing one paragraph
leaves the other chunks' text — and so their content hash and vector — as it was.

Tokens are counted by a ``count_tokens`` function. A job uses its embedder's
own tokenizer when the embedder offers one (MiniLM does: WordPiece pieces, the
unit of its 256-piece input limit). Otherwise whitespace-separated words are
counted, a fast approximation (English averages about 1.3 WordPiece pieces per
word).

>>> TokenSplitter(max_tokens=4, overlap_tokens=1).split("a b c d e f g")
['a b c d', 'd e f g']
>>> TokenSplitter(max_tokens=5, overlap_tokens=0).split("a b\n\nc d\n\ne f g")
['a b\n\nc d', 'e f g']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from streamrag.errors import ArgumentError

__all__ = ["TokenSplitter", "count_words"]

_PARAGRAPH = re.compile(r"\n\s*\n")


_ASCII_SPACE = frozenset(i for i in range(128) if chr(i).isspace())
_WORD_MARKS = bytes(0x20 if i in _ASCII_SPACE else 0x78 for i in range(256))
"""Byte table: ASCII whitespace (as ``str.split`` sees it) to ``b" "``, other bytes to ``b"x"``."""


def count_words(text: str) -> int:
    """Count whitespace-separated words: the default token approximation.

    The same count as ``len(text.split())``. An ASCII text is counted without
    splitting it: its bytes become spaces and marks, and a word is a mark at
    the start or after a space.
    """
    if not text.isascii():
        return len(text.split())
    marks = text.encode("ascii").translate(_WORD_MARKS)
    return marks.count(b" x") + (marks[:1] == b"x")


def check_bounds(max_tokens: int, overlap_tokens: int) -> None:
    """Refuse chunk bounds no splitter can keep: ``0 <= overlap_tokens < max_tokens``."""
    if max_tokens <= 0:
        msg = f"max_tokens must be positive, found {max_tokens}"
        raise ArgumentError(msg)
    if not 0 <= overlap_tokens < max_tokens:
        msg = f"overlap_tokens must be in [0, max_tokens={max_tokens}), found {overlap_tokens}"
        raise ArgumentError(msg)


@dataclass(frozen=True, slots=True)
class TokenSplitter:
    """Paragraph-aware, token-bounded splitting with overlap for long paragraphs."""

    max_tokens: int = 128
    overlap_tokens: int = 16
    count_tokens: Callable[[str], int] = count_words

    def __post_init__(self) -> None:
        check_bounds(self.max_tokens, self.overlap_tokens)

    def split(self, text: str) -> list[str]:
        """Return the chunks of ``text`` in order (one chunk for a short text)."""
        return self.split_counted(text)[0]

    def split_counted(self, text: str) -> tuple[list[str], int]:
        """The chunks of ``text`` and its token count (chunk overlap not included)."""
        total = self.count_tokens(text)
        if total <= self.max_tokens:
            return ([text] if text.strip() else []), total
        return self._split_long(text), total

    def _split_long(self, text: str) -> list[str]:
        count = self.count_tokens
        chunks: list[str] = []
        current: list[str] = []
        size = 0
        for para in _PARAGRAPH.split(text):
            para = para.strip()
            if not para:
                continue
            n = count(para)
            if n > self.max_tokens:
                if current:
                    chunks.append("\n\n".join(current))
                    current, size = [], 0
                chunks.extend(self._windows(para))
                continue
            if size + n > self.max_tokens and current:
                chunks.append("\n\n".join(current))
                current, size = [], 0
            current.append(para)
            size += n
        if current:
            chunks.append("\n\n".join(current))
        return chunks

    def _windows(self, para: str) -> list[str]:
        """Cut a long paragraph into overlapping windows of at most ``max_tokens``."""
        count = self.count_tokens
        words = para.split()
        out = []
        start = 0
        while start < len(words):
            # A word is at least one token, so max_tokens words is an upper bound;
            # shrink by a tenth until the window fits.
            end = min(len(words), start + self.max_tokens)
            window = " ".join(words[start:end])
            tokens = count(window)
            while tokens > self.max_tokens and end > start + 1:
                end = start + max(1, (end - start) * 9 // 10)
                window = " ".join(words[start:end])
                tokens = count(window)
            out.append(window)
            if end >= len(words):
                break
            # Step back about overlap_tokens worth of words.
            back = self.overlap_tokens * (end - start) // max(1, tokens)
            start = max(start + 1, end - back)
        return out
