"""Answers without an LLM: the best sentences of the retrieved passages, cited.

When no LLM is configured (``llm.base_url`` unset), or the configured one
fails before it has written anything, streamrag still answers: it splits the
context's passages into sentences, scores each by the question's content words
it contains (divided by the square root of its length, so that long sentences
do not win by size) plus a share of its passage's relevance, and returns the
best ``n`` in document order, each followed by its citation number ``[i]``.
Responses say ``"generator": "extractive"``. It quotes; it does not reason.

>>> from streamrag.serve.context import Citation, Context, Passage
>>> cite = Citation("t", "faq-1", "it", 0, 0, "in.jsonl", 1, (1,), (0,), 0.8)
>>> ctx = Context([Passage("VPNs drop on sleep. Reinstall the VPN client to fix it.", cite)],
...               [12], 100, "approx", {})
>>> extractive_answer("how do I fix the VPN client?", ctx, 1)
'Reinstall the VPN client to fix it. [1]'
"""

from __future__ import annotations

import math

from streamrag.serve.context import Context
from streamrag.serve.text import content_words, split_sentences

__all__ = ["NOTHING_FOUND", "extractive_answer"]

NOTHING_FOUND = "No indexed document matches the question."
_MAX_WORDS = 80


def extractive_answer(question: str, context: Context, sentences: int = 3) -> str:
    """Up to ``sentences`` sentences of the context that best match ``question``, cited."""
    if not context.passages:
        return NOTHING_FOUND
    wanted = content_words(question)
    scored: list[tuple[float, int, int, str]] = []
    for i, passage in enumerate(context.passages, start=1):
        for j, sentence in enumerate(split_sentences(passage.text)):
            words = content_words(sentence)
            overlap = len(wanted & words)
            if not overlap:
                continue
            score = overlap / math.sqrt(len(words) + 1) + 0.25 * passage.score
            scored.append((score, i, j, sentence))
    if not scored:  # nothing in common by words: the best passage's opening
        first = split_sentences(context.passages[0].text)
        scored = [(0.0, 1, 0, first[0] if first else context.passages[0].text)]
    best = sorted(scored, key=lambda s: -s[0])[:sentences]
    best.sort(key=lambda s: (s[1], s[2]))
    return " ".join(f"{_shorten(text)} [{i}]" for _, i, _, text in best)


def _shorten(sentence: str) -> str:
    words = sentence.split()
    if len(words) <= _MAX_WORDS:
        return " ".join(words)
    return " ".join(words[:_MAX_WORDS]) + " …"
