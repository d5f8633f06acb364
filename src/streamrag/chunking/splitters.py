r"""Split documents into chunks small enough for the embedder.

Chunks follow the document's own structure: paragraphs (blank-line separated)
are packed greedily into chunks of at most ``max_tokens``; a paragraph longer
than that is cut into windows of ``max_tokens`` that overlap by
``overlap_tokens``. Because boundaries sit on paragraphs, editing one paragraph
leaves the other chunks' text — and so their content hash and vector — as it was.

Tokens are counted by a ``count_tokens`` function. The default counts
whitespace-separated words, a fast approximation: MiniLM's WordPiece tokenizer
gives about 1.3 pieces per English word, so the default ``max_tokens=128``
stays well inside its 256-piece input. Pass a real tokenizer's counter for
exact budgets.

>>> TokenSplitter(max_tokens=4, overlap_tokens=1).split("a b c d e f g")
['a b c d', 'd e f g']
>>> TokenSplitter(max_tokens=5, overlap_tokens=0).split("a b\n\nc d\n\ne f g")
['a b\n\nc d', 'e f g']
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TokenSplitter", "count_words"]

_PARAGRAPH = re.compile(r"\n\s*\n")


def count_words(text: str) -> int:
    """Count whitespace-separated words: the default token approximation."""
    return len(text.split())


@dataclass(frozen=True, slots=True)
class TokenSplitter:
    """Paragraph-aware, token-bounded splitting with overlap for long paragraphs."""

    max_tokens: int = 128
    overlap_tokens: int = 16
    count_tokens: Callable[[str], int] = count_words

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            msg = f"max_tokens must be positive, found {self.max_tokens}"
            raise ValueError(msg)
        if not 0 <= self.overlap_tokens < self.max_tokens:
            msg = (
                f"overlap_tokens must be in [0, max_tokens={self.max_tokens}), "
                f"found {self.overlap_tokens}"
            )
            raise ValueError(msg)

    def split(self, text: str) -> list[str]:
        """Return the chunks of ``text`` in order (one chunk for a short text)."""
        count = self.count_tokens
        if count(text) <= self.max_tokens:
            return [text] if text.strip() else []
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
        words = para.split()
        step = self.max_tokens - self.overlap_tokens
        out = []
        for start in range(0, len(words), step):
            out.append(" ".join(words[start : start + self.max_tokens]))
            if start + self.max_tokens >= len(words):
                break
        return out
