"""The HTTP API, built by :func:`create_app` around a :class:`~streamrag.runtime.service.Service`.

=========================  ====================================================
``POST /v1/retrieve``      top-k chunks for a query, with filters and a time range
``GET  /v1/status``        epoch, watermark, counts, ingest lag, freshness
``GET  /metrics``          Prometheus text format
``GET  /healthz``          liveness: 200 while the process serves
=========================  ====================================================

Every retrieve response names the epoch it was read from; all its results come
from that one committed epoch.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from streamrag.errors import QueryError, StreamragError
from streamrag.index.base import Hit, SearchFilter
from streamrag.runtime.service import Service
from streamrag.serve.batcher import QueryBatcher
from streamrag.serve.schemas import RetrieveRequest, RetrieveResponse
from streamrag.timing import format_timestamp

__all__ = ["create_app"]

_encode = msgspec.json.Encoder().encode


def create_app(service: Service, *, manage_service: bool = True) -> FastAPI:
    """Build the FastAPI app; with ``manage_service`` it starts and stops the service too."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            service.start()
        batcher = QueryBatcher(service)
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

    @app.post("/v1/retrieve", response_model=RetrieveResponse)
    async def retrieve(body: RetrieveRequest, request: Request) -> Response:
        """Top-k chunks closest to ``query`` from one committed epoch."""
        started = time.perf_counter()
        if body.k > max_k:
            msg = f"k={body.k} is above serve.max_k={max_k}; ask for fewer results"
            raise QueryError(msg)
        flt = _filter(body)
        epoch, hits = await request.app.state.batcher.retrieve(body.query, body.k, flt)
        payload = {
            "epoch": epoch,
            "took_ms": round((time.perf_counter() - started) * 1000, 3),
            "results": [_chunk(h) for h in hits],
        }
        return Response(_encode(payload), media_type="application/json")

    @app.get("/v1/status")
    async def status() -> Response:
        """Epoch, watermark, counts (ingested, applied, dead-lettered), lag and freshness."""
        return Response(_encode(service.status().body), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics."""
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness probe."""
        return {"status": "ok"}

    return app


def _as_set(value: str | list[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    return frozenset([value] if isinstance(value, str) else value)


def _filter(body: RetrieveRequest) -> SearchFilter:
    f = body.filters
    tr = body.time_range
    return SearchFilter(
        tenant=f.tenant,
        domains=_as_set(f.domain),
        doc_ids=_as_set(f.doc_id),
        start_us=tr.start if tr else None,
        end_us=tr.end if tr else None,
    )


def _chunk(h: Hit) -> dict[str, object]:
    return {
        "chunk_id": f"{h.chunk_id & 0xFFFFFFFFFFFFFFFF:016x}",
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
    }
