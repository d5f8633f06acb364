"""Answers without an LLM: the best sentences of the retrieved passages, cited.

When no LLM is configured (``llm.base_url`` unset), or the configured one
fails before it has written anything, streamrag still answers: it splits the
context's passages into sentences and scores each by how many of the question's
content words it contains, plus a share of its passage's relevance; headings
(lines without a full stop) count less. It takes the best ``n``, skipping any
that repeats the words of one already taken (templated documents say the same
sentence with another name in it), and returns them in document order, each
followed by its citation number ``[i]``. Responses say
``"generator": "extractive"``. It quotes; it does not reason.

>>> from streamrag.serve.context import Citation, Context, Passage
>>> cite = Citation("t", "faq-1", "it", 0, 0, "in.jsonl", 1, (1,), (0,), 0.8)
>>> ctx = Context([Passage("VPNs drop on sleep. Reinstall the VPN client to fix it.", cite)],
...               [12], 100, "approx", {})
>>> extractive_answer("how do I fix the VPN client?", ctx, 1)
'Reinstall the VPN client to fix it. [1]'
"""

from __future__ import annotations

from streamrag.serve.context import Context
from streamrag.serve.text import content_words, split_sentences

__all__ = ["NOTHING_FOUND", "extractive_answer"]

NOTHING_FOUND = "No indexed document matches the question."
_MAX_WORDS = 80
_HEADING_PENALTY = 0.5
_REPEAT = 0.6  # Jaccard of content words above which a sentence repeats another


def extractive_answer(question: str, context: Context, sentences: int = 3) -> str:
    """Up to ``sentences`` sentences of the context that best match ``question``, cited."""
    if not context.passages:
        return NOTHING_FOUND
    wanted = content_words(question)
    scored: list[tuple[float, int, int, str, set[str]]] = []
    for i, passage in enumerate(context.passages, start=1):
        for j, sentence in enumerate(split_sentences(passage.text)):
            words = content_words(sentence)
            overlap = len(wanted & words)
            if not overlap:
                continue
            heading = 0.0 if sentence.rstrip()[-1:] in ".!?" else _HEADING_PENALTY
            score = overlap + 0.25 * passage.score - heading
            scored.append((score, i, j, sentence, words))
    if not scored:  # nothing in common by words: the best passage's opening
        first = split_sentences(context.passages[0].text)
        text = first[0] if first else context.passages[0].text
        scored = [(0.0, 1, 0, text, content_words(text))]
    best: list[tuple[float, int, int, str, set[str]]] = []
    for cand in sorted(scored, key=lambda s: -s[0]):
        if any(_jaccard(cand[4], b[4]) >= _REPEAT for b in best):
            continue
        best.append(cand)
        if len(best) == sentences:
            break
    best.sort(key=lambda s: (s[1], s[2]))
    return " ".join(f"{_shorten(text)} [{i}]" for _, i, _, text, _ in best)


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _shorten(sentence: str) -> str:
    words = sentence.split()
    if len(words) <= _MAX_WORDS:
        return " ".join(words)
    return " ".join(words[:_MAX_WORDS]) + " …"
