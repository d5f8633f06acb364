"""The HTTP API, built by :func:`create_app` around a :class:`~streamrag.runtime.service.Service`.

=========================  ====================================================
``POST /v1/retrieve``      top-k chunks for a query, with filters and a time range
``GET  /v1/status``        epoch, watermark, counts, ingest lag, freshness
``GET  /v1/windows``       the configured window aggregations and their latest results
``GET  /v1/windows/NAME``  one aggregation's latest results (``?key=`` to pick one key)
``GET  /metrics``          Prometheus text format
``GET  /healthz``          liveness: 200 while the process serves
``POST /v1/admin/rollback``  make an earlier epoch's documents current again
=========================  ====================================================

Every retrieve response names the epoch it was read from; all its results come
from that one committed epoch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from streamrag.errors import IndexStoreError, QueryError, StreamragError
from streamrag.eventtime import NamedWindow, WindowResult
from streamrag.runtime.service import Service
from streamrag.serve.batcher import QueryBatcher
from streamrag.serve.retrieve import RetrieveASGI, answer, encode_json
from streamrag.serve.schemas import RetrieveRequest, RetrieveResponse, RollbackRequest
from streamrag.timing import format_timestamp

__all__ = ["create_app"]


def create_app(service: Service, *, manage_service: bool = True) -> FastAPI:
    """Build the FastAPI app; with ``manage_service`` it starts and stops the service too."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            service.start()
        serve = service.settings.serve
        batcher = QueryBatcher(
            service,
            max_batch=serve.max_batch,
            max_wait_ms=serve.max_wait_ms,
            workers=serve.query_workers,
        )
        app.state.batcher = batcher
        try:
            yield
        finally:
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
    async def _streamrag_error(request: Request, exc: StreamragError) -> JSONResponse:
        status = 400 if isinstance(exc, QueryError) else 500
        return JSONResponse(
            {"error": {"type": type(exc).__name__, "message": str(exc)}}, status_code=status
        )

    @app.post(
        "/v1/retrieve",
        response_model=RetrieveResponse,
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
        status, data = await answer(await request.body(), request.app.state.batcher, max_k)
        return Response(data, status_code=status, media_type="application/json")

    app.add_middleware(RetrieveASGI, max_k=max_k)
    _add_schema(app, RetrieveRequest)

    @app.get("/v1/status")
    async def status() -> Response:
        """Epoch, watermark, counts (ingested, applied, dead-lettered), lag and freshness."""
        return Response(encode_json(service.status()), media_type="application/json")

    @app.get("/v1/windows")
    async def windows() -> Response:
        """Every window aggregation: its definition, watermark and latest results."""
        stage = service.pipeline.event_time
        body = {
            "watermark": service.status()["event_time"]["watermark"],
            "windows": {
                w.name: _window_body(w, stage.results(w.name), None) for w in stage.windows
            },
        }
        return Response(encode_json(body), media_type="application/json")

    @app.get("/v1/windows/{name}")
    async def window(name: str, key: str | None = None) -> Response:
        """One aggregation's latest results, oldest window first; ``key`` keeps one key."""
        stage = service.pipeline.event_time
        found = [w for w in stage.windows if w.name == name]
        if not found:
            known = ", ".join(w.name for w in stage.windows) or "none are configured"
            msg = f"no window aggregation named {name!r}; known: {known}"
            return JSONResponse({"error": {"type": "NotFound", "message": msg}}, status_code=404)
        body = _window_body(found[0], stage.results(name), key)
        return Response(encode_json(body), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/admin/rollback")
    async def rollback(body: RollbackRequest) -> Response:
        """Make epoch ``epoch``'s documents current again, as a new epoch.

        The epochs after it can no longer be read; changes after it that the
        input still holds are applied again when replayed.
        """
        undo = getattr(service.index, "rollback", None)
        if undo is None:
            err = {
                "type": "IndexStoreError",
                "message": "this index keeps no history to roll back to; use index.kind: lsm",
            }
            return JSONResponse({"error": err}, status_code=400)
        try:
            epoch = await run_in_threadpool(undo, body.epoch)
        except IndexStoreError as exc:
            err = {"type": "IndexStoreError", "message": str(exc)}
            return JSONResponse({"error": err}, status_code=400)
        return JSONResponse({"epoch": epoch, "restored_from": body.epoch})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness probe."""
        return {"status": "ok"}

    return app


def _window_body(w: NamedWindow, results: list[WindowResult], key: str | None) -> dict[str, Any]:
    """One aggregation as JSON: what it computes and its latest result per window."""
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
        "open_windows": op.open_windows,
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
