"""What ``GET /v1/status`` says about a running job, section by section.

The counts and the uncommitted records are read at one instant
(:meth:`~streamrag.runtime.pipeline.Pipeline.counts`), so ``ingested ==
applied + dead_lettered + pending`` holds in every answer. Times are ISO-8601
for people (``None`` before anything was read, ``"end"`` after a replay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrag.index.base import ReportsRebuild, SupportsHealth
from streamrag.runtime.accounting import PipelineStats
from streamrag.sources.base import ReportsHealth
from streamrag.sources.multi import MultiSourceReader
from streamrag.timing import MAX_TIMESTAMP, MIN_TIMESTAMP, US_PER_MS, US_PER_S, format_timestamp

if TYPE_CHECKING:
    from streamrag.runtime.service import Service

__all__ = ["job_status", "tenant_status"]


def _source(settings: Any) -> dict[str, Any]:
    """The JSONL input, or the names and kinds of the configured connectors."""
    if settings.sources:
        return {"connectors": {s.name: s.kind for s in settings.sources}}
    # A missing path is read once it appears; until then nothing is ingested.
    return {"path": str(settings.source.path), "exists": settings.source.path.exists()}


def _sources(service: Service) -> dict[str, Any]:
    """Each connector's health (connected, lag, last error) and the push journal's state."""
    reader = service.pipeline.reader
    if isinstance(reader, MultiSourceReader | ReportsHealth):
        return reader.health()
    return {}


def job_status(service: Service) -> dict[str, Any]:
    """The whole status body of ``service``."""
    p = service.pipeline
    st, pending = p.counts()  # at one instant: they always add up
    idx = service.index.stats()
    now = service.clock.now_us()
    backlog = p.reader.backlog_bytes()  # stats every file: read it once
    settings = service.settings
    return {
        "epoch": idx.epoch,
        "watermark": _time(p.watermark),
        "source": _source(settings),
        "sources": _sources(service),
        "event_time": _event_time(service, now),
        "batcher": {
            "target_size": p.batcher.target_size,
            "pending_chunks": p.batcher.pending_chunks,
            "partitions": p.batcher.partitions,
            "full": p.batcher.full,
        },
        "queues": _queues(service, backlog),
        "backpressure": {"on": p.batcher.full, "paused_polls": p.paused_polls},
        "last_commit": (service.index.cursor or {}).get("audit"),
        "audit": service.audit.status() if service.audit is not None else None,
        "recovery": _recovery(service, st),
        "counts": _counts(st, pending),
        "index": {
            "live_docs": idx.live_docs,
            "live_chunks": idx.live_chunks,
            "deleted_docs": idx.deleted_docs,
            "history": settings.index.history if settings.index.kind == "lsm" else "current",
        },
        "ingest_lag": {
            "backlog_bytes": backlog,
            "pending_changes": pending,
            "caught_up": p.drained and pending == 0 and backlog == 0,
            "watermark_lag_s": _lag_s(p.watermark, now),
        },
        "freshness": _freshness(st, now),
        "embedder": service.embedder.version,
        "embedding": p.embedding.choice.status(),
        "generations": service.reindexer.status(),
        "dead_letter_path": str(settings.dead_letter_path),
        "pipeline": {
            "running": service.runner.running,
            "errors": service.runner.errors,
            "last_error": service.runner.last_error,
        },
        "uptime_s": (now - service.started_us) / 1e6,
    }


def tenant_status(service: Service, tenant: str) -> dict[str, Any]:
    """What one tenant's API key sees of the job: nothing of another tenant.

    The epoch, watermark and freshness are the job's (every query's answer names
    its epoch anyway); counts, sources, windows, paths and errors, which hold
    other tenants' names, numbers and document ids, are left out.
    """
    p = service.pipeline
    st, pending = p.counts()
    now = service.clock.now_us()
    return {
        "tenant": tenant,
        "epoch": service.index.epoch,
        "watermark": _time(p.watermark),
        "ingest_lag": {
            "caught_up": p.drained and pending == 0 and p.reader.backlog_bytes() == 0,
            "watermark_lag_s": _lag_s(p.watermark, now),
        },
        "freshness": _freshness(st, now),
        "embedder": service.embedder.version,
        "uptime_s": (now - service.started_us) / 1e6,
    }


def _event_time(service: Service, now: int) -> dict[str, Any]:
    stage = service.pipeline.event_time
    tracker, wm = stage.tracker, stage.watermark
    return {
        "watermark": _time(wm),
        "lag_s": _lag_s(wm, now),
        "max_event_time": _time(tracker.max_seen()),
        "partitions": tracker.partitions,
        "active_partitions": len(tracker.active()),
        "mode": stage.mode.value,
        "windows": {
            w.name: {"open": w.operator.open_windows, "late": late}
            for w, late in zip(stage.windows, stage.late_counts.values(), strict=True)
        },
    }


def _queues(service: Service, backlog: int) -> dict[str, Any]:
    batcher = service.pipeline.batcher
    return {
        "batcher": {
            "changes": batcher.pending,
            "chunks": batcher.pending_chunks,
            "bytes": batcher.pending_bytes,
            "max_chunks": batcher.max_pending,
            "max_bytes": batcher.max_pending_bytes,
        },
        "embedding": service.pipeline.uncommitted - batcher.pending,
        "source_backlog_bytes": backlog,
    }


def _recovery(service: Service, st: PipelineStats) -> dict[str, Any]:
    index = service.index
    return {
        "resumed_from_epoch": service.resumed_from,
        "ingested_before": service.resumed_at["ingested"],
        "waiting_at_resume": service.resumed_at["waiting"],
        "replayed": st.replayed,
        "skipped": st.skipped,
        "superseded": st.superseded,
        "wal_torn_tails": index.health().wal_torn_tails if isinstance(index, SupportsHealth) else 0,
        # Set when a damaged index was moved aside and is rebuilt from the sources.
        "rebuilt_from_source": index.rebuilt if isinstance(index, ReportsRebuild) else None,
    }


def _counts(st: PipelineStats, pending: int) -> dict[str, Any]:
    return {
        "ingested": st.ingested,
        "applied": st.applied,
        "stale": st.stale,
        "past_versions": st.past_versions,
        "dead_lettered": st.dead_lettered,
        "pending": pending,
        "chunks_embedded": st.chunks_embedded,
        "chunks_reused": st.chunks_reused,
        "commits": st.commits,
        "window_results": st.window_results,
        "window_late": st.window_late,
        "window_invalid": st.window_invalid,
        "window_errors": st.window_errors,
        "poison": st.poison,
        "embed_retries": st.embed_retries,
    }


def _freshness(st: PipelineStats, now: int) -> dict[str, Any]:
    last_batch = st.last_freshness_us
    last_commit = st.last_commit_us
    return {
        "last_batch_ms": None if last_batch is None else last_batch / US_PER_MS,
        "since_last_commit_ms": None
        if last_commit is None
        else max(0, now - last_commit) / US_PER_MS,
    }


def _lag_s(wm: int, now: int) -> float | None:
    return None if wm in (MIN_TIMESTAMP, MAX_TIMESTAMP) else (now - wm) / US_PER_S


def _time(ts: int) -> str | None:
    """A watermark or event time for people: None before anything, 'end' after a replay."""
    if ts == MIN_TIMESTAMP:
        return None
    if ts == MAX_TIMESTAMP:
        return "end"
    return format_timestamp(ts)
