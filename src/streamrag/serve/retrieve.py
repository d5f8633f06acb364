"""``POST /v1/retrieve``: validate, batch, search, encode — on a lean ASGI path.

Retrieval is the hot request. FastAPI's per-request machinery (dependency
injection, routing, several middleware layers) cost about a millisecond per
request on a 2-core host, more than the search itself. :class:`RetrieveASGI`
sits early in the middleware stack and answers ``POST /v1/retrieve`` directly: the body is
validated by the same pydantic model (``model_validate_json``), the query goes
through the :class:`~streamrag.serve.batcher.QueryBatcher`, and the response is
encoded with msgspec. Every other path falls through to FastAPI, which also
documents this route in its OpenAPI description and answers it the same way
(:func:`answer`) should the lean path be left out.
"""

from __future__ import annotations

import time

import msgspec
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from streamrag.chunking import chunk_id_text
from streamrag.errors import OverloadedError, PermissionDeniedError, QueryError
from streamrag.index.base import Hit, MetaPredicate, SearchFilter
from streamrag.serve.auth import Principal, key_max_k, principal_of, request_tenant
from streamrag.serve.batcher import QueryBatcher
from streamrag.serve.errors import error_response
from streamrag.serve.schemas import MetaRange, RetrievalOptions, RetrieveRequest
from streamrag.timing import format_timestamp

__all__ = ["RetrieveASGI", "answer", "check_k", "encode_json", "search_filter"]

encode_json = msgspec.json.Encoder().encode
"""Fast JSON encoding for responses (msgspec)."""
_JSON = [(b"content-type", b"application/json")]


async def answer(
    body: bytes, batcher: QueryBatcher, max_k: int, principal: Principal | None
) -> tuple[int, bytes, list[tuple[str, str]]]:
    """Answer one retrieve request body, as ``principal`` may.

    Returns the HTTP status, the JSON bytes and the headers an error adds
    (``Retry-After`` when the query timed out).
    """
    started = time.perf_counter()
    try:
        req = RetrieveRequest.model_validate_json(body)
        check_k(req.k, key_max_k(principal, max_k))
        flt = search_filter(req, principal)
        # A QueryError here is found at search time: an epoch or as_of outside history.
        epoch, hits, _, generation = await batcher.retrieve_read(req.query, req.k, flt)
    except (ValidationError, QueryError, PermissionDeniedError) as exc:
        return (*error_response(exc), [])
    except OverloadedError as exc:
        return (*error_response(exc), [("retry-after", str(exc.retry_after_s))])
    payload = {
        "epoch": epoch,
        "generation": generation,
        "took_ms": round((time.perf_counter() - started) * 1000, 3),
        "results": [_chunk(h) for h in hits],
    }
    return 200, encode_json(payload), []


class RetrieveASGI:
    """Middleware that serves ``POST /v1/retrieve`` itself and passes the rest on.

    Installed with ``app.add_middleware``, it runs inside Starlette's error and
    body-size guards but before routing and dependency injection.
    """

    def __init__(self, app: ASGIApp, max_k: int) -> None:
        self.app = app
        self.max_k = max_k

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI event."""
        if scope["type"] != "http" or scope["path"] != "/v1/retrieve" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        batcher: QueryBatcher = scope["app"].state.batcher  # set by Starlette before middleware
        status, data, extra = await answer(
            b"".join(chunks), batcher, self.max_k, principal_of(scope)
        )
        headers = _JSON + [(k.encode(), v.encode()) for k, v in extra] if extra else _JSON
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _as_set(value: str | list[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset([value] if isinstance(value, str) else value)


def check_k(k: int, max_k: int) -> None:
    """Refuse a ``k`` above ``serve.max_k`` with what to do."""
    if k > max_k:
        msg = f"k={k} is above serve.max_k={max_k}; ask for fewer results"
        raise QueryError(msg)


def search_filter(req: RetrievalOptions, principal: Principal | None) -> SearchFilter:
    """The index filter a request's options describe (raises QueryError when impossible).

    With an API key (``principal``) the tenant is the key's, whatever the request
    says (:func:`~streamrag.serve.auth.request_tenant`); without one, the request's.
    """
    f = req.filters
    tr = req.time_range
    return SearchFilter(
        tenant=request_tenant(principal, f),
        domains=_as_set(f.domain),
        doc_ids=_as_set(f.doc_id),
        start_us=tr.start if tr else None,
        end_us=tr.end if tr else None,
        as_of_us=req.as_of,
        epoch=req.epoch,
        metadata=_predicates(f.metadata),
    )


def _predicates(
    conditions: dict[str, str | int | float | bool | list[str | int | float | bool] | MetaRange]
    | None,
) -> tuple[MetaPredicate, ...]:
    if not conditions:
        return ()
    preds = []
    for key, cond in sorted(conditions.items()):
        if isinstance(cond, MetaRange):
            preds.append(MetaPredicate(key, gte=cond.gte, lt=cond.lt))
        elif isinstance(cond, list):
            preds.append(MetaPredicate(key, values=frozenset(cond)))
        else:
            preds.append(MetaPredicate(key, values=frozenset([cond])))
    return tuple(preds)


def _chunk(h: Hit) -> dict[str, object]:
    return {
        "chunk_id": chunk_id_text(h.chunk_id),
        "doc_id": h.doc_id,
        "tenant": h.tenant,
        "domain": h.domain,
        "position": h.position,
        "score": round(h.score, 6),
        "text": h.text,
        "event_time": format_timestamp(h.event_time),
        "source": h.source,
        "offset": h.offset,
        "epoch": h.epoch,
        "embedder": h.embedder_version,
        "metadata": h.metadata,
    }
