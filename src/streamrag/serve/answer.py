"""Answering a question: cache, retrieve, assemble, screen, generate — as a stream of events.

:class:`Answerer` is what ``POST /v1/answer`` and ``POST /v1/chat/completions``
share. For one :class:`Question` it

1. looks the question up in the semantic cache (exact text first);
2. retrieves ``k × answer.context.candidates`` chunks through the query batcher
   (one embedding call and one search for concurrent requests), then looks for a
   near-duplicate question in the cache with the query's vector;
3. reranks (the optional hook), merges adjacent chunks, screens passages for
   prompt injection, and selects what fits the token budget
   (:mod:`~streamrag.serve.context`, :mod:`~streamrag.serve.safety`);
4. asks the LLM (:class:`~streamrag.serve.generator.ChatClient`) — or, with
   none configured, or one that fails before its first token, the extractive
   answerer — and caches the result with the epoch it was read from.

It yields events, which the routes turn into JSON, server-sent events or
OpenAI chunks:

* ``("meta", {...})`` once, before any text: the request id, epoch, citations,
  context figures, safety decisions, the generator and whether it fell back;
* ``("delta", {"text": ...})`` for each piece of the answer;
* ``("done", {...})`` once, the whole response (the JSON body of a
  non-streamed ``/v1/answer``), with ``finish_reason`` as the LLM gave it:
  ``stop``, or ``length`` when the answer was cut at ``max_tokens``
  (an extractive answer is always whole: ``stop``);
* ``("error", {...})`` instead of ``done`` if the LLM fails after it started
  writing (text already sent cannot be replaced by a fallback): the request
  id, the text sent so far (``partial``) and ``error``, the object of every
  error response (:func:`~streamrag.serve.errors.error_object`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from streamrag.config import AnswerSettings
from streamrag.errors import GeneratorError
from streamrag.index.base import Hit, SearchFilter
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.service import Service
from streamrag.serve.batcher import QueryBatcher
from streamrag.serve.cache import CacheHit, CacheScope, SemanticCache
from streamrag.serve.context import Context, Reranker, merge_adjacent, select
from streamrag.serve.errors import error_object, kind_of
from streamrag.serve.extractive import extractive_answer
from streamrag.serve.generator import ChatClient, Delta
from streamrag.serve.prompt import build_messages
from streamrag.serve.safety import AuditLog, InjectionDetector, Screening, screen
from streamrag.serve.tokens import TokenCounter

__all__ = ["NO_LLM", "Answerer", "Event", "Question"]

Event = tuple[str, dict[str, Any]]
"""``(kind, payload)``: kind is meta, delta, done or error."""

NO_LLM = "no LLM is configured (llm.base_url): the answer quotes the best-matching sentences"


@dataclass(frozen=True, slots=True)
class Question:
    """One question and everything that shapes its answer."""

    text: str
    k: int
    flt: SearchFilter
    history: tuple[tuple[str, str], ...] = ()
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    use_cache: bool = True


class Answerer:
    """Answers questions from the index through the cache, context assembly and a generator."""

    def __init__(
        self,
        service: Service,
        batcher: QueryBatcher,
        settings: AnswerSettings,
        *,
        counter: TokenCounter,
        generator: ChatClient | None = None,
        cache: SemanticCache | None = None,
        reranker: Reranker | None = None,
        detector: InjectionDetector | None = None,
        audit: AuditLog | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.service = service
        self.batcher = batcher
        self.settings = settings
        self.counter = counter
        self.generator = generator
        self.cache = cache
        self.reranker = reranker
        self.detector = detector or InjectionDetector()
        self.audit = audit
        self.metrics = metrics
        self.max_k = service.settings.serve.max_k
        self.mode = f"llm:{generator.model}" if generator is not None else "extractive"

    async def answer(self, q: Question) -> dict[str, Any]:
        """The whole answer (the ``done`` payload); raises GeneratorError on a broken stream."""
        done: dict[str, Any] | None = None
        async for kind, payload in self.events(q, stream=False):
            if kind == "done":
                done = payload
            elif kind == "error":
                raise GeneratorError(payload["error"]["message"])
        assert done is not None
        return done

    async def events(self, q: Question, *, stream: bool = True) -> AsyncGenerator[Event, None]:
        """The answer to ``q`` as events; ``stream=False`` asks the LLM for a whole answer."""
        started = time.perf_counter()
        rid = uuid.uuid4().hex
        scope = self._scope(q)
        cache = self.cache if q.use_cache else None
        if cache is not None:
            hit = cache.lookup_exact(q.text, scope, self.service.index.epoch)
            if hit is not None:
                for event in self._cached(hit, rid, started):
                    yield event
                return
        fetch = min(q.k * self.settings.context.candidates, max(self.max_k, q.k))
        epoch, hits, vector = await self.batcher.retrieve_with_vector(q.text, fetch, q.flt)
        if cache is not None:
            hit = cache.lookup_near(q.text, vector, scope, epoch)
            if hit is not None:
                for event in self._cached(hit, rid, started):
                    yield event
                return
        screening, context = await asyncio.to_thread(self._assemble, q, hits, rid)
        meta: dict[str, Any] = {
            "id": rid,
            "epoch": epoch,
            "cached": None,
            "citations": [p.citation.to_json(i) for i, p in enumerate(context.passages, 1)],
            "context": context.summary(),
            "safety": screening.summary(),
        }
        pieces: list[str] = []
        usage: Any = None
        finish: str | None = None
        fallback: str | None = None
        deltas: AsyncGenerator[Delta, None] | None = None
        first: Delta | None = None
        model: str | None = None
        if self.generator is not None and context.passages:
            messages = build_messages(q.text, context, history=q.history, system=q.system)
            deltas = self._generate(messages, q, stream)
            try:
                first = await _first_text(deltas)
            except GeneratorError as exc:
                fallback = str(exc)
                deltas = None
            model = self.generator.model or None
        if deltas is None:
            generator = "extractive"
            note = NO_LLM if self.generator is None else None
            if fallback is not None:
                note = f"the LLM failed before answering ({fallback}); the answer is extractive"
            elif not context.passages:
                note = "nothing in the index matches the question and its filters"
        else:
            generator = "llm"
            note = None
        meta.update(generator=generator, model=model, fallback_reason=fallback, note=note)
        yield "meta", dict(meta)

        if deltas is None:
            text = extractive_answer(q.text, context, self.settings.extractive_sentences)
            for piece in _sentence_pieces(text):
                pieces.append(piece)
                yield "delta", {"text": piece}
        else:
            try:
                if first is not None:
                    model = first.model or model
                    usage = first.usage or usage
                    finish = first.finish_reason or finish
                    if first.text:
                        pieces.append(first.text)
                        yield "delta", {"text": first.text}
                    async for d in deltas:
                        usage = d.usage or usage
                        finish = d.finish_reason or finish
                        if d.text:
                            pieces.append(d.text)
                            yield "delta", {"text": d.text}
            except GeneratorError as exc:
                self._count("llm", "broken")
                kind = kind_of(exc)
                error = error_object(str(exc), code=kind.code, type=kind.type)
                yield "error", {"id": rid, "partial": "".join(pieces), "error": error}
                return
            finally:
                await deltas.aclose()
        done = {
            **meta,
            "model": model,
            "answer": "".join(pieces),
            "finish_reason": finish or "stop",
            "usage": dict(usage) if usage else None,
        }
        self._count(generator, "fallback" if fallback else "answered")
        if cache is not None and fallback is None:
            stored = {k: v for k, v in done.items() if k not in ("id", "cached", "took_ms")}
            docs = {(h.tenant, h.doc_id) for h in hits}
            cache.put(q.text, vector, scope, epoch, docs, stored)
        done["took_ms"] = round((time.perf_counter() - started) * 1000, 3)
        yield "done", done

    # -- steps -----------------------------------------------------------------------

    def _assemble(self, q: Question, hits: Sequence[Hit], rid: str) -> tuple[Screening, Context]:
        """Rerank, merge, screen and select (in a worker thread: it may count tokens remotely)."""
        if self.reranker is not None:
            hits = self.reranker.rerank(q.text, list(hits))
        passages = merge_adjacent(hits)
        screening = screen(
            passages,
            self.detector,
            self.settings.safety.injection_policy,
            query=q.text,
            request_id=rid,
            audit=self.audit,
            metrics=self.metrics,
        )
        ctx = self.settings.context
        context = select(
            screening.passages,
            k=q.k,
            budget=ctx.max_tokens,
            counter=self.counter,
            mmr_lambda=ctx.mmr_lambda,
            duplicate_similarity=ctx.duplicate_similarity,
        )
        return screening, context

    async def _generate(
        self, messages: list[dict[str, str]], q: Question, stream: bool
    ) -> AsyncGenerator[Delta, None]:
        assert self.generator is not None
        if stream:
            async for d in self.generator.stream(
                messages, max_tokens=q.max_tokens, temperature=q.temperature
            ):
                yield d
        else:
            c = await self.generator.complete(
                messages, max_tokens=q.max_tokens, temperature=q.temperature
            )
            yield Delta(c.text, c.model, c.finish_reason, c.usage)

    def _cached(self, hit: CacheHit, rid: str, started: float) -> list[Event]:
        value = dict(hit.value)
        done_only = ("answer", "finish_reason", "usage", "took_ms", "model")
        meta = {k: v for k, v in value.items() if k not in done_only}
        meta.update(id=rid, cached=hit.kind, model=value.get("model"))
        done = {
            **value,
            "id": rid,
            "cached": hit.kind,
            "took_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if hit.kind == "near":
            done["cached_question"] = hit.question
            meta["cached_question"] = hit.question
        self._count(str(value.get("generator")), "cached")
        return [("meta", meta), ("delta", {"text": value["answer"]}), ("done", done)]

    def _scope(self, q: Question) -> CacheScope:
        shape: list[Any] = [q.k, self.mode, q.max_tokens, q.temperature]
        if q.history or q.system:
            blob = json.dumps([q.system, list(q.history)], ensure_ascii=False)
            shape.append(hashlib.sha256(blob.encode()).hexdigest())
        return CacheScope(q.flt, tuple(shape))

    def _count(self, generator: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.answers.labels(generator, outcome).inc()


async def _first_text(deltas: AsyncGenerator[Delta, None]) -> Delta | None:
    """The first delta with text, or the last one when the answer is empty (None: no deltas).

    Deltas without text before it (the role announcement) are folded in.
    """
    last: Delta | None = None
    try:
        async for d in deltas:
            model = d.model or (last.model if last else None)
            last = Delta(d.text, model, d.finish_reason, d.usage)
            if d.text:
                return last
    except GeneratorError:
        await deltas.aclose()
        raise
    return last


def _sentence_pieces(text: str) -> Sequence[str]:
    """An extractive answer in pieces for streaming: each cited sentence with its marker."""
    parts = _AFTER_CITATION.split(text)
    return [p if i == 0 else " " + p for i, p in enumerate(parts) if p] or [text]


_AFTER_CITATION = re.compile(r"(?<=\])\s+")
