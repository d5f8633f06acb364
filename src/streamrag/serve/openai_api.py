"""OpenAI-compatible routes, so that existing clients and tools talk to streamrag as they are.

=============================  ===============================================
``POST /v1/chat/completions``  a chat completion, answered with retrieval (RAG)
``POST /v1/embeddings``        vectors from the index's own embedder
``GET  /v1/models``            the one model this server offers
=============================  ===============================================

Point the stock ``openai`` client at ``http://HOST:PORT/v1`` and it works,
streaming included. The last user message is the question: streamrag retrieves
for it, assembles the context and answers through the configured LLM (or
extractively); earlier messages go to the LLM as the conversation so far.
Retrieval options ride in an extra body field::

    client.chat.completions.create(
        model="streamrag",
        messages=[{"role": "user", "content": "how do I rotate the database password?"}],
        extra_body={"streamrag": {"k": 3, "filters": {"domain": "ops"}}},
    )

Responses carry the citations, epoch and safety decisions in an extra
``streamrag`` field (on the first chunk of a stream, and on the last one).
``/v1/embeddings`` exists because some OpenAI-compatible LLM providers
(DeepSeek, for one) have none, and a RAG application needs one that matches its
index. It takes a text or a list of texts and answers floats or base64.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from streamrag.embed.base import CountsTokens
from streamrag.errors import QueryError
from streamrag.serve.answer import Answerer, Event, Question
from streamrag.serve.retrieve import check_k, encode_json, search_filter
from streamrag.serve.schemas import ChatCompletionRequest, EmbeddingsRequest
from streamrag.serve.sse import SSE_HEADERS, sse

__all__ = ["MODEL_ID", "router"]

MODEL_ID = "streamrag"
MAX_EMBED_INPUTS = 2048

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI's chat completion, answered from the index (streamed with ``stream: true``)."""
    answerer: Answerer = request.app.state.answerer
    check_k(body.streamrag.k, answerer.max_k)
    q = _question(body)
    created = int(time.time())
    model = body.model or MODEL_ID
    if not body.stream:
        done = await answerer.answer(q)
        return Response(
            encode_json(_completion(done, model, created)), media_type="application/json"
        )
    events = answerer.events(q, stream=True)
    first = await anext(events)  # retrieval errors become a 400 here, before any byte is sent
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(
        _chunks(first, events, model, created, include_usage),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """Embed a text or a list of texts with the index's embedder."""
    service = request.app.state.service
    texts = _texts(body)
    if body.dimensions is not None and body.dimensions != service.embedder.dim:
        return _error(
            f"dimensions={body.dimensions}: this embedder makes {service.embedder.dim}-dimensional "
            "vectors; leave dimensions out",
            "dimensions",
        )
    vectors = await run_in_threadpool(service.embed_many, texts)
    emb = service.embedder
    tokens = sum(
        emb.count_tokens(t) if isinstance(emb, CountsTokens) else len(t.split()) for t in texts
    )
    data = []
    for i, row in enumerate(vectors):
        if body.encoding_format == "base64":
            vec: Any = base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()
        else:
            vec = row.tolist()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    payload = {
        "object": "list",
        "data": data,
        "model": body.model or service.embedder.version,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(encode_json(payload), media_type="application/json")


@router.get("/v1/models")
async def models() -> dict[str, Any]:
    """The model this server offers (the configured LLM answers behind it)."""
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "streamrag"}],
    }


def _question(body: ChatCompletionRequest) -> Question:
    last_user = max((i for i, m in enumerate(body.messages) if m.role == "user"), default=None)
    if last_user is None or not body.messages[last_user].text().strip():
        msg = "messages hold no user message with text; the last user message is the question"
        raise QueryError(msg)
    system = "\n\n".join(
        m.text() for m in body.messages if m.role in ("system", "developer") and m.text()
    )
    history = tuple(
        (m.role, m.text())
        for m in body.messages[:last_user]
        if m.role in ("user", "assistant") and m.text()
    )
    opts = body.streamrag
    return Question(
        text=body.messages[last_user].text(),
        k=opts.k,
        flt=search_filter(opts),
        history=history,
        system=system or None,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
    )


def _texts(body: EmbeddingsRequest) -> list[str]:
    raw = body.input
    texts = [raw] if isinstance(raw, str) else raw
    if not texts:
        msg = "input is empty; give a text or a list of texts"
        raise QueryError(msg)
    if not all(isinstance(t, str) for t in texts):
        msg = "input holds token ids; this endpoint embeds text: send strings"
        raise QueryError(msg)
    if len(texts) > MAX_EMBED_INPUTS:
        msg = f"input holds {len(texts)} texts; send at most {MAX_EMBED_INPUTS} per request"
        raise QueryError(msg)
    return [str(t) for t in texts]


def _streamrag_block(payload: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id",
        "epoch",
        "cached",
        "citations",
        "context",
        "safety",
        "generator",
        "fallback_reason",
        "note",
    )
    return {k: payload.get(k) for k in keys}


def _usage(done: dict[str, Any]) -> dict[str, int]:
    u = done.get("usage") or {}
    prompt = int(u.get("prompt_tokens", 0))
    completion = int(u.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(done: dict[str, Any], model: str, created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{done['id']}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done["answer"]},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(done),
        "streamrag": _streamrag_block(done),
    }


async def _chunks(
    first: Event,
    events: AsyncGenerator[Event, None],
    model: str,
    created: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Answer events as ``chat.completion.chunk`` server-sent events, then ``[DONE]``."""
    meta = first[1]
    cid = f"chatcmpl-{meta['id']}"

    def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return sse(body)

    yield chunk({"role": "assistant", "content": ""}, None, streamrag=_streamrag_block(meta))
    try:
        async for kind, payload in events:
            if kind == "delta":
                yield chunk({"content": payload["text"]}, None)
            elif kind == "done":
                yield chunk({}, "stop", streamrag=_streamrag_block(payload))
                if include_usage:
                    yield sse(
                        {
                            "id": cid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": _usage(payload),
                        }
                    )
            elif kind == "error":
                yield sse({"error": {"message": payload["message"], "type": "generator_error"}})
    finally:
        await events.aclose()
    yield sse("[DONE]")


def _error(message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param}},
        status_code=400,
    )
