"""The HTTP API, built by :func:`create_app` around a :class:`~streamrag.runtime.service.Service`.

=========================  ====================================================
``POST /v1/retrieve``      top-k chunks for a query, with filters and a time range
``POST /v1/answer``        an answer with citations (JSON, or server-sent events)
``POST /v1/chat/completions``  OpenAI-compatible chat, answered with retrieval
``POST /v1/embeddings``    OpenAI-compatible embeddings from the index's embedder
``GET  /v1/models``        the model the OpenAI-compatible routes offer
``GET  /v1/status``        epoch, watermark, counts, ingest lag, freshness
``GET  /v1/windows``       the configured window aggregations and their latest results
``GET  /v1/windows/NAME``  one aggregation's latest results (``?key=`` to pick one key)
``GET  /metrics``          Prometheus text format
``GET  /healthz``          liveness: 200 while the process serves
``POST /v1/admin/rollback``  make an earlier epoch's documents current again
=========================  ====================================================

Every retrieve response names the epoch it was read from; all its results come
from that one committed epoch. Answers do too, and name the passages they cite.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from streamrag.errors import (
    IndexStoreError,
    OverloadedError,
    PermissionDeniedError,
    StateError,
    StreamragError,
)
from streamrag.eventtime import NamedWindow, WindowResult
from streamrag.index.base import SupportsRollback
from streamrag.runtime.service import Service
from streamrag.runtime.status import tenant_status
from streamrag.serve.answer import Answerer, Event, Question
from streamrag.serve.auth import (
    AuthASGI,
    KeyRing,
    Principal,
    document_security,
    key_max_k,
    principal_of,
    stamp_changes,
    window_rows,
)
from streamrag.serve.batcher import QueryBatcher
from streamrag.serve.cache import SemanticCache
from streamrag.serve.context import load_reranker
from streamrag.serve.errors import BodyLimit, error_response, http_error, validation_body
from streamrag.serve.generator import ChatClient
from streamrag.serve.limits import KeyLimiter
from streamrag.serve.openai_api import router as openai_router
from streamrag.serve.responses import (
    AnswerResponse,
    GenerationsStatus,
    Health,
    PushReceipt,
    RollbackResponse,
    StatusResponse,
    WindowAggregation,
    WindowsResponse,
    errors,
    event_stream,
)
from streamrag.serve.retrieve import RetrieveASGI, answer, check_k, encode_json, search_filter
from streamrag.serve.safety import AuditLog
from streamrag.serve.schemas import (
    AnswerRequest,
    GenerationRequest,
    PushRequest,
    ReindexRequest,
    RetrieveRequest,
    RetrieveResponse,
    RollbackRequest,
)
from streamrag.serve.sse import SSE_HEADERS, sse
from streamrag.serve.tokens import build_counter
from streamrag.timing import format_timestamp

__all__ = ["create_app"]

log = logging.getLogger("streamrag.serve")


def create_app(service: Service, *, manage_service: bool = True) -> FastAPI:
    """Build the FastAPI app; with ``manage_service`` it starts and stops the service too."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            service.start()
        serve, index = service.settings.serve, service.settings.index
        batcher = QueryBatcher(
            service,
            max_batch=serve.max_batch,
            max_wait_ms=serve.max_wait_ms,
            workers=serve.query_workers,
            min_parallel_batch=serve.min_parallel_batch,
            timeout_s=serve.query_timeout_s,
            inline_max_ms=serve.inline_query_ms,
            scans_use_all_cores=index.kind == "lsm" and index.scan_threads != 1,
        )
        app.state.batcher = batcher
        app.state.answerer = answerer = build_answerer(service, batcher)
        if answerer.cache is not None:  # cached vectors belong to the model that made them
            cache = answerer.cache
            service.on_switch.append(lambda _gen: cache.clear())
        try:
            yield
        finally:
            if answerer.generator is not None:
                await answerer.generator.aclose()
            close = getattr(answerer.counter, "close", None)
            if callable(close):
                close()
            batcher.close()
            if manage_service:
                service.stop()

    app = FastAPI(
        title="streamrag",
        summary="Retrieval over a live, versioned index of change streams.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    max_k = service.settings.serve.max_k

    @app.exception_handler(StreamragError)
    async def _streamrag_error(request: Request, exc: StreamragError) -> Response:
        status, body = error_response(exc)
        headers = None
        if isinstance(exc, OverloadedError):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return Response(body, status_code=status, media_type="application/json", headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        body = validation_body(exc.errors(), located=True)
        return Response(encode_json(body), status_code=422, media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        allow = (exc.headers or {}).get("Allow")
        status, body = http_error(
            exc.status_code, request.method, request.url.path, allow=allow, detail=str(exc.detail)
        )
        return Response(
            encode_json(body),
            status_code=status,
            media_type="application/json",
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        status, body = error_response(exc, request.url.path)
        return Response(body, status_code=status, media_type="application/json")

    @app.post(
        "/v1/retrieve",
        response_model=RetrieveResponse,
        responses=errors(400, 413, 422),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/RetrieveRequest"}}
                },
            }
        },
    )
    async def retrieve(request: Request) -> Response:
        """Top-k chunks closest to ``query`` from one committed epoch.

        Served by :class:`~streamrag.serve.retrieve.RetrieveASGI` ahead of routing;
        this route documents it and answers the same way without the middleware.
        """
        body = await request.body()
        batcher = request.app.state.batcher
        status, data, headers = await answer(body, batcher, max_k, principal_of(request))
        return Response(
            data, status_code=status, media_type="application/json", headers=dict(headers)
        )

    app.add_middleware(RetrieveASGI, max_k=max_k)
    # API keys, roles and per-key limits, ahead of the retrieve fast path and every route.
    keys = app.state.keys = KeyRing.from_settings(service.settings, service.clock)
    metrics_public = service.settings.security.metrics == "public"
    limiter = KeyLimiter(service.clock)
    app.add_middleware(AuthASGI, keys=keys, limiter=limiter, metrics_public=metrics_public)
    # Outermost: no route ever reads more than serve.max_body_bytes.
    app.add_middleware(BodyLimit, max_bytes=service.settings.serve.max_body_bytes)
    _add_schema(app, RetrieveRequest)
    document_security(app, keys)

    @app.post(
        "/v1/answer",
        response_model=AnswerResponse,
        responses={
            **event_stream("With stream: true, events meta, delta…, then done or error."),
            **errors(400, 413, 422),
        },
    )
    async def answer_question(body: AnswerRequest, request: Request) -> Response:
        """Answer ``query`` from one committed epoch, with citations.

        With ``stream: true`` the answer comes as server-sent events: ``meta``
        (epoch, citations, context, safety, generator), ``delta`` pieces of text,
        then ``done`` (the whole response) — or ``error`` if the LLM broke off.
        """
        answerer: Answerer = request.app.state.answerer
        principal = principal_of(request)
        check_k(body.k, key_max_k(principal, max_k))
        q = Question(
            body.query,
            body.k,
            search_filter(body, principal),
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            use_cache=body.cache,
        )
        if not body.stream:
            return Response(encode_json(await answerer.answer(q)), media_type="application/json")
        events = answerer.events(q, stream=True)
        first = await anext(events)  # retrieval errors become a 400 here, before any byte
        return StreamingResponse(
            _answer_events(first, events), media_type="text/event-stream", headers=SSE_HEADERS
        )

    app.include_router(openai_router)

    @app.post(
        "/v1/documents",
        status_code=202,
        response_model=PushReceipt,
        responses={
            200: {"model": PushReceipt, "description": "Committed (wait_for_commit)."},
            **errors(400, 413, 422),
        },
    )
    async def push_documents(body: PushRequest, request: Request) -> Response:
        """Upsert and delete documents: journaled (fsynced) before the answer.

        202 once journaled; with ``wait_for_commit``, 200 once committed, with
        the epoch that made the changes visible. 429 with ``Retry-After`` while
        the pipeline is too far behind; 400 naming the bad changes (none is taken).
        """
        changes = stamp_changes(principal_of(request), body.changes)  # tenant, pushed_by
        receipt = await run_in_threadpool(
            service.push,
            changes,
            wait_for_commit=body.wait_for_commit,
            timeout_s=body.timeout_s,
        )
        status = 200 if receipt.committed and body.wait_for_commit else 202
        return JSONResponse(receipt.to_json(), status_code=status)

    @app.get("/v1/status", response_model=StatusResponse, responses=errors())
    async def status(request: Request) -> Response:
        """Epoch, watermark, counts (ingested, applied, dead-lettered), lag and freshness.

        A key that is not an admin's sees its tenant's view (``tenant_status``).
        """
        principal = principal_of(request)
        if principal is not None and not principal.is_admin:
            body = tenant_status(service, principal.tenant)
            return Response(encode_json(body), media_type="application/json")
        body = service.status()
        answerer: Answerer | None = getattr(request.app.state, "answerer", None)
        if answerer is not None:
            body["answers"] = _answers_status(answerer)
        return Response(encode_json(body), media_type="application/json")

    @app.get("/v1/windows", response_model=WindowsResponse, responses=errors())
    async def windows(request: Request) -> Response:
        """Every window aggregation: its definition, watermark and latest results.

        With API keys, a key sees the rows of its tenant (windows keyed by tenant);
        windows keyed otherwise mix tenants and only admin keys see them.
        """
        stage = service.pipeline.event_time
        principal = principal_of(request)
        shown = [(w, window_rows(principal, w, stage.results(w.name))) for w in stage.windows]
        body = {
            "watermark": service.status()["event_time"]["watermark"],
            "windows": {
                w.name: _window_body(w, rows, None, principal)
                for w, rows in shown
                if rows is not None
            },
        }
        return Response(encode_json(body), media_type="application/json")

    @app.get("/v1/windows/{name}", response_model=WindowAggregation, responses=errors(404, 422))
    async def window(request: Request, name: str, key: str | None = None) -> Response:
        """One aggregation's latest results, oldest window first; ``key`` keeps one key."""
        stage = service.pipeline.event_time
        results = stage.results(name)  # an unknown name: UnknownNameError, a 404
        found = next(w for w in stage.windows if w.name == name)
        principal = principal_of(request)
        rows = window_rows(principal, found, results)
        if rows is None:
            msg = (
                f"the window {name!r} is keyed by {list(found.key)}, not by tenant: its rows "
                "mix tenants, and only admin keys may read it"
            )
            raise PermissionDeniedError(msg)
        body = _window_body(found, rows, key, principal)
        return Response(encode_json(body), media_type="application/json")

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text format.",
                "content": {"text/plain; version=0.0.4": {"schema": {"type": "string"}}},
            },
            **errors(),
        },
    )
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post(
        "/v1/admin/rollback", response_model=RollbackResponse, responses=errors(400, 413, 422)
    )
    async def rollback(body: RollbackRequest) -> Response:
        """Make epoch ``epoch``'s documents current again, as a new epoch.

        The epochs after it can no longer be read; changes after it that the
        input still holds are applied again when replayed.
        """
        index = service.index
        if not isinstance(index, SupportsRollback):
            msg = "this index keeps no history to roll back to; use index.kind: lsm"
            raise IndexStoreError(msg)
        epoch = await run_in_threadpool(service.rollback, body.epoch)  # IndexStoreError: a 400
        if epoch == body.epoch:  # it was the latest epoch already
            msg = f"epoch {epoch} is the latest epoch: there is nothing to roll back"
            return JSONResponse(
                {"epoch": epoch, "restored_from": body.epoch, "changed": False, "message": msg}
            )
        cache = app.state.answerer.cache
        if cache is not None:
            cache.clear()  # answers read before the rollback may cite what it undid
        return JSONResponse({"epoch": epoch, "restored_from": body.epoch, "changed": True})

    @app.post(
        "/v1/admin/reindex",
        status_code=202,
        response_model=GenerationsStatus,
        responses=errors(400, 409, 413, 422),
    )
    async def reindex(body: ReindexRequest) -> Response:
        """Build an index generation for another embedder while this one serves (see reindex)."""
        spec = {"class": body.embedder, "args": body.args}
        status = await run_in_threadpool(lambda: service.reindexer.start(spec, switch=body.switch))
        return JSONResponse(status, status_code=202)

    @app.get("/v1/admin/generations", response_model=GenerationsStatus, responses=errors())
    async def generations() -> Response:
        """The index generations, which one serves, and a migration's progress."""
        return JSONResponse(service.reindexer.status())

    @app.post(
        "/v1/admin/generations/switch",
        response_model=GenerationsStatus,
        responses=errors(409, 413, 422),
    )
    async def switch(body: GenerationRequest) -> Response:
        """Serve a generation from the next epoch on (the one built, by default)."""
        return JSONResponse(await run_in_threadpool(service.reindexer.switch, body.generation))

    @app.post(
        "/v1/admin/generations/rollback", response_model=GenerationsStatus, responses=errors(409)
    )
    async def rollback_generation() -> Response:
        """Serve the previous generation again."""
        return JSONResponse(await run_in_threadpool(service.reindexer.rollback))

    @app.post(
        "/v1/admin/generations/drop",
        response_model=GenerationsStatus,
        responses=errors(409, 413, 422),
    )
    async def drop_generation(body: GenerationRequest) -> Response:
        """Delete a previous or building generation."""
        if body.generation is None:
            msg = 'give the generation to drop: {"generation": N}'
            raise StateError(msg)
        return JSONResponse(await run_in_threadpool(service.reindexer.drop, body.generation))

    @app.get("/healthz", response_model=Health, responses=errors(open_route=True))
    async def healthz() -> dict[str, str]:
        """Liveness probe."""
        return {"status": "ok"}

    return app


def build_answerer(service: Service, batcher: QueryBatcher) -> Answerer:
    """The answerer a service's settings describe: LLM client, cache, counter, hooks."""
    settings = service.settings
    llm = settings.llm
    generator = (
        ChatClient(llm, clock=service.clock, metrics=service.metrics) if llm.base_url else None
    )
    c = settings.answer.cache
    cache = (
        SemanticCache(
            service.epochs,
            max_entries=c.max_entries,
            lru_k=c.lru_k,
            max_hamming=c.max_hamming,
            min_similarity=c.min_similarity,
            metrics=service.metrics,
        )
        if c.enabled
        else None
    )
    reranker = settings.answer.context.reranker
    return Answerer(
        service,
        batcher,
        settings.answer,
        counter=build_counter(llm),
        generator=generator,
        cache=cache,
        reranker=load_reranker(reranker) if reranker else None,
        audit=AuditLog(settings.audit_log_path, clock=service.clock),
        metrics=service.metrics,
    )


def _answers_status(answerer: Answerer) -> dict[str, Any]:
    """How answers are made: the generator (never its key), the cache's size."""
    gen = answerer.generator
    return {
        "generator": "llm" if gen is not None else "extractive",
        "llm": None
        if gen is None
        else {"base_url": gen.base_url, "model": gen.model, "circuit": gen.breaker.state},
        "cache_entries": None if answerer.cache is None else len(answerer.cache),
        "tokenizer": answerer.counter.name,
        "injection_policy": answerer.settings.safety.injection_policy,
    }


async def _answer_events(first: Event, events: AsyncGenerator[Event, None]) -> AsyncIterator[bytes]:
    """Answer events as server-sent events."""
    try:
        yield sse(first[1], event=first[0])
        async for kind, payload in events:
            yield sse(payload, event=kind)
    finally:
        await events.aclose()


def _window_body(
    w: NamedWindow, results: list[WindowResult], key: str | None, principal: Principal | None
) -> dict[str, Any]:
    """One aggregation as JSON: what it computes and its latest result per window.

    ``open_windows`` counts every tenant's windows: a key that is not an admin's gets None.
    """
    rows = []
    for r in results:
        shown = list(r.key) if isinstance(r.key, tuple) else r.key
        # A compound key is matched as its parts joined by "/": ?key=acme/hr
        text = "/".join(map(str, shown)) if isinstance(shown, list) else str(shown)
        if key is not None and text != key:
            continue
        rows.append(
            {
                "key": shown,
                "start": format_timestamp(r.window.start),
                "end": format_timestamp(r.window.end),
                "value": r.value,
                "timing": r.timing.value,
                "pane": r.pane,
            }
        )
    op = w.operator
    return {
        "aggregate": op.aggregator.name,
        "key": list(w.key),
        "value": w.value,
        "allowed_lateness_ms": op.allowed_lateness_us / 1000,
        "open_windows": op.open_windows if principal is None or principal.is_admin else None,
        "results": rows,
    }


def _add_schema(app: FastAPI, model: type[RetrieveRequest]) -> None:
    """Put ``model``'s JSON schema into the OpenAPI components (the route reads raw bytes)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            defs = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(defs.pop("$defs", {}))
            components[model.__name__] = defs
        return app.openapi_schema or original()

    app.openapi = openapi  # type: ignore[method-assign]
