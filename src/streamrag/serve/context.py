"""From retrieved chunks to the context of an answer: merge, deduplicate, diversify, budget.

The index returns the ``k`` chunks closest to a question. They make a poor
prompt as they are: neighbouring chunks of one document repeat their overlap,
two documents may hold the same paragraph, the five best chunks may all say the
same thing, and together they may not fit the model. Context assembly, in order:

1. **Rerank** (optional): a :class:`Reranker` — any object with
   ``rerank(query, hits)``, named by ``answer.context.reranker`` — reorders,
   rescores or drops hits (a cross-encoder, click feedback, business rules).
2. **Merge** (:func:`merge_adjacent`): chunks of the same document version at
   consecutive positions become one passage, their overlap written once.
3. **Deduplicate and diversify** (:func:`select`): passages are picked by
   *maximal marginal relevance* (Carbonell and Goldstein, 1998) — each step
   takes the passage with the best ``λ·relevance − (1−λ)·similarity`` to those
   already picked — and a passage at least ``duplicate_similarity`` similar to
   a picked one is dropped as a near-duplicate. The index returns no vectors, so
   similarity between passages is measured on their words (hashed bags of
   words): near-duplicates are, in practice, the same words.
4. **Budget**: passages are added in that order while their tokens, counted by
   a :class:`~streamrag.serve.tokens.TokenCounter` (the generator's tokenizer
   when known), fit ``max_tokens``; one that does not fit is skipped and the next
   tried. The first passage is cut to the budget rather than dropped, so a
   context is never empty while something was found.

Every passage keeps its :class:`Citation`: the document id and version
(``event_time`` in µs and source offset, the pair last-writer-wins compares),
its event time, the epoch that committed it and the chunks it came from.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from streamrag.chunking import chunk_id_text
from streamrag.embed.hashing import HashingEmbedder
from streamrag.errors import ConfigError
from streamrag.index.base import Hit
from streamrag.serve.tokens import TokenCounter
from streamrag.timing import Timestamp, format_timestamp

__all__ = [
    "Citation",
    "Context",
    "Passage",
    "Reranker",
    "load_reranker",
    "merge_adjacent",
    "select",
]

_TOKEN = re.compile(r"\S+")
_MAX_OVERLAP_WORDS = 256
_words = HashingEmbedder(dim=512)


@dataclass(frozen=True, slots=True)
class Citation:
    """Where a passage came from: enough to find, check and reproduce it."""

    tenant: str
    doc_id: str
    domain: str
    event_time: Timestamp
    offset: int
    source: str
    epoch: int
    chunk_ids: tuple[int, ...]
    positions: tuple[int, ...]
    score: float

    @property
    def version(self) -> str:
        """The document version: ``event_time_us:offset``, what last-writer-wins compares."""
        return f"{self.event_time}:{self.offset}"

    def to_json(self, index: int) -> dict[str, Any]:
        """The citation as the API returns it, numbered ``index`` (``[index]`` in answers)."""
        return {
            "index": index,
            "doc_id": self.doc_id,
            "tenant": self.tenant,
            "domain": self.domain,
            "version": self.version,
            "event_time": format_timestamp(self.event_time),
            "epoch": self.epoch,
            "chunk_ids": [chunk_id_text(c) for c in self.chunk_ids],
            "positions": list(self.positions),
            "source": self.source,
            "offset": self.offset,
            "score": round(self.score, 6),
        }


@dataclass(slots=True)
class Passage:
    """One or more adjacent chunks of one document version, and what safety found in it."""

    text: str
    citation: Citation
    flags: list[str] = field(default_factory=list)
    action: str | None = None

    @property
    def score(self) -> float:
        """Relevance: the best score of its chunks."""
        return self.citation.score


@dataclass(frozen=True, slots=True)
class Context:
    """The passages an answer may use, numbered from 1 in this order, and their token cost."""

    passages: list[Passage]
    tokens: list[int]
    budget: int
    counter: str
    dropped: dict[str, int]
    truncated: bool = False

    @property
    def total_tokens(self) -> int:
        """Tokens of all passages (as the counter counts them)."""
        return sum(self.tokens)

    def summary(self) -> dict[str, Any]:
        """Figures for the response: passages, tokens, budget, what was dropped and why."""
        return {
            "passages": len(self.passages),
            "tokens": self.total_tokens,
            "budget": self.budget,
            "tokenizer": self.counter,
            "truncated": self.truncated,
            "dropped": dict(self.dropped),
        }


@runtime_checkable
class Reranker(Protocol):
    """Reorders, rescores or filters hits for a query before the context is assembled."""

    def rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        """The hits to use, best first."""
        ...


class _FunctionReranker:
    def __init__(self, fn: Callable[[str, list[Hit]], list[Hit]]) -> None:
        self.fn = fn

    def rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        return list(self.fn(query, hits))

    def __repr__(self) -> str:
        return f"reranker {getattr(self.fn, '__qualname__', self.fn)!r}"


def load_reranker(path: str) -> Reranker:
    """The reranker at import path ``'pkg.mod:Name'``.

    It may name a class (built without arguments), an object with ``rerank``, or
    a function ``(query, hits) -> hits``.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        msg = (
            f"config key 'answer.context.reranker' = {path!r}: expected an import path "
            "'package.module:Name'"
        )
        raise ConfigError(msg)
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        msg = f"config key 'answer.context.reranker' = {path!r}: cannot import it ({exc})"
        raise ConfigError(msg) from None
    if isinstance(target, type):
        target = target()
    if isinstance(target, Reranker):
        return target
    if callable(target):
        return _FunctionReranker(target)
    msg = (
        f"config key 'answer.context.reranker' = {path!r}: not a reranker; give a class or "
        "object with rerank(query, hits), or a function (query, hits) -> hits"
    )
    raise ConfigError(msg)


def merge_adjacent(hits: Sequence[Hit]) -> list[Passage]:
    """Passages from hits: consecutive chunks of one document version joined, best first.

    >>> from streamrag.index.base import Hit
    >>> def hit(pos, text, score):
    ...     return Hit(score, pos, "t", "doc", "ops", pos, text, 0, "in.jsonl", 0, 1, "e")
    >>> [p.text for p in merge_adjacent([hit(1, "c d e f", 0.8), hit(0, "a b c d", 0.9)])]
    ['a b c d e f']
    """
    groups: dict[tuple[str, str, int, int], list[Hit]] = {}
    for h in hits:
        groups.setdefault((h.tenant, h.doc_id, h.event_time, h.offset), []).append(h)
    passages: list[Passage] = []
    for chunks in groups.values():
        chunks.sort(key=lambda h: h.position)
        run = [chunks[0]]
        for h in chunks[1:]:
            if h.position == run[-1].position + 1:
                run.append(h)
            elif h.position != run[-1].position:  # the same chunk twice: keep one
                passages.append(_passage(run))
                run = [h]
        passages.append(_passage(run))
    passages.sort(key=lambda p: -p.score)
    return passages


def _passage(run: list[Hit]) -> Passage:
    text = run[0].text
    for h in run[1:]:
        text = _join(text, h.text)
    first = run[0]
    return Passage(
        text,
        Citation(
            tenant=first.tenant,
            doc_id=first.doc_id,
            domain=first.domain,
            event_time=first.event_time,
            offset=first.offset,
            source=first.source,
            epoch=max(h.epoch for h in run),
            chunk_ids=tuple(h.chunk_id for h in run),
            positions=tuple(h.position for h in run),
            score=max(h.score for h in run),
        ),
    )


def _join(a: str, b: str) -> str:
    """``a`` then ``b``, writing once the words that end ``a`` and start ``b`` (their overlap)."""
    aw = a.split()
    bw = b.split()
    longest = min(len(aw), len(bw), _MAX_OVERLAP_WORDS)
    for m in range(longest, 0, -1):
        if aw[-m:] == bw[:m]:
            ends = [t.end() for t in _TOKEN.finditer(b)]
            rest = b[ends[m - 1] :].lstrip()
            return f"{a} {rest}" if rest else a
    return f"{a}\n\n{b}"


def select(
    passages: Sequence[Passage],
    *,
    k: int,
    budget: int,
    counter: TokenCounter,
    mmr_lambda: float = 0.7,
    duplicate_similarity: float = 0.97,
) -> Context:
    """At most ``k`` passages by maximal marginal relevance that fit ``budget`` tokens."""
    dropped = {"duplicate": 0, "budget": 0}
    if not passages:
        return Context([], [], budget, counter.name, dropped)
    texts = [p.text for p in passages]
    tokens = counter.count_many(texts)
    vecs = _words.embed_many(texts)
    sims = vecs @ vecs.T
    rel = np.asarray([p.score for p in passages], dtype=np.float64)
    remaining = list(range(len(passages)))
    picked: list[int] = []
    picked_tokens: list[int] = []
    out: list[Passage] = []
    used = 0
    truncated = False
    while remaining and len(picked) < k:
        if picked:
            redundancy = sims[np.ix_(remaining, picked)].max(axis=1)
        else:
            redundancy = np.zeros(len(remaining))
        mmr = mmr_lambda * rel[remaining] - (1 - mmr_lambda) * redundancy
        j = int(np.argmax(mmr))
        i = remaining.pop(j)
        if picked and redundancy[j] >= duplicate_similarity:
            dropped["duplicate"] += 1
            continue
        cost = tokens[i]
        passage = passages[i]
        if used + cost > budget:
            if picked:
                dropped["budget"] += 1
                continue
            passage, cost = _truncate(passage, budget, counter)
            truncated = True
        picked.append(i)
        picked_tokens.append(cost)
        out.append(passage)
        used += cost
    # What was never considered because k was reached is not "dropped": it ranked lower.
    return Context(out, picked_tokens, budget, counter.name, dropped, truncated)


def _truncate(passage: Passage, budget: int, counter: TokenCounter) -> tuple[Passage, int]:
    """The longest word prefix of a passage that fits ``budget`` tokens (binary search)."""
    spans = [m.end() for m in _TOKEN.finditer(passage.text)]
    lo, hi = 0, len(spans)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count_many([passage.text[: spans[mid - 1]]])[0] <= budget:
            lo = mid
        else:
            hi = mid - 1
    text = passage.text[: spans[lo - 1]] if lo else ""
    cut = Passage(text, passage.citation, list(passage.flags), passage.action)
    return cut, counter.count_many([text])[0] if text else 0
