"""Settings into parts: the only code that reads :class:`~streamrag.config.Settings` for the job.

Every unit conversion (milliseconds to the microseconds the data path counts
in, bytes, defaults that depend on other settings) happens here, once; the
parts themselves take plain values. :func:`build_pipeline` assembles the data
path of ``../ARCHITECTURE``: source, decoder, redaction, event time, splitter, batcher,
embedder retries, the index, and the pipeline over them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from streamrag.batching import AdaptiveController, MicroBatcher, PartitionKey
from streamrag.chunking import Splitter, StructuredSplitter, TokenSplitter, count_words
from streamrag.config import (
    FolderSourceSettings,
    JsonlSourceSettings,
    PostgresSourceSettings,
    Settings,
    SourceSpec,
)
from streamrag.cpus import process_cpus
from streamrag.embed.ahead import EmbedAhead, holds_gil
from streamrag.embed.base import CountsTokens, Embedder, build_embedder
from streamrag.embed.choice import EmbedderChoice
from streamrag.embed.resilient import RetryPolicy
from streamrag.errors import MissingDependencyError
from streamrag.eventtime import (
    EventTimeStage,
    Mode,
    NamedWindow,
    WatermarkTracker,
)
from streamrag.index.base import VectorIndex
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.ingest.formats import DecoderSet, RecordDecoder
from streamrag.ingest.pii import Redactor
from streamrag.ingest.schemas import schema_decoders
from streamrag.runtime.affinity import ingest_cpu
from streamrag.runtime.audit import EpochAudit, EpochAuditLog, pipeline_identity
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.pipeline import CommitHook, Pipeline
from streamrag.runtime.push import PushJournal
from streamrag.runtime.stages import RedactStage
from streamrag.sources.base import Source
from streamrag.sources.files import JsonlSource
from streamrag.sources.multi import MultiSource
from streamrag.timing import US_PER_MS, Clock

__all__ = [
    "AHEAD_PENDING",
    "build_ahead",
    "build_batcher",
    "build_choice",
    "build_decoders",
    "build_epoch_audit",
    "build_event_time",
    "build_pipeline",
    "build_redact",
    "build_source",
    "build_splitter",
    "embedder_from",
]


def build_pipeline(
    settings: Settings,
    *,
    embedder: Embedder,
    index: VectorIndex,
    clock: Clock,
    metrics: Metrics,
    source: Source | None = None,
    on_commit: Sequence[CommitHook] = (),
    cursor: Any = None,
    push: PushJournal | None = None,
    choice: EmbedderChoice | None = None,
) -> Pipeline:
    """The job's pipeline, resuming from ``cursor`` (the index's, after a restart).

    The push journal gets the pipeline's redactor: pushed changes are redacted
    before they are journaled.
    """
    emb = settings.embedder
    ahead = build_ahead(settings, embedder, clock, metrics)
    redact = build_redact(settings, metrics)
    if push is not None:
        push.redactor = redact.redactor
    return Pipeline(
        source=source or build_source(settings, push),
        embedder=embedder,
        index=index,
        # Kept across restarts; a record refused again on a replay is stored once.
        dead_letters=DeadLetterStore(settings.dead_letter_path),
        clock=clock,
        batcher=build_batcher(settings, clock, ahead=ahead is not None),
        splitter=build_splitter(settings, embedder),
        decoder=build_decoders(settings),
        event_time=build_event_time(settings, clock),
        metrics=metrics,
        on_commit=on_commit,
        cursor=cursor,
        retry=RetryPolicy(
            attempts=emb.attempts,
            backoff_s=emb.backoff_ms / 1000,
            max_backoff_s=emb.max_backoff_ms / 1000,
            timeout_s=emb.timeout_s,
        ),
        max_read_bytes=settings.source.max_read_bytes,
        commit_interval_ms=settings.batcher.commit_interval_ms,
        history=settings.index.kind == "lsm" and settings.index.history == "full",
        window_side_output=settings.event_time.late_to_dead_letter,
        choice=choice,
        redact=redact,
        ahead=ahead,
    )


BUILTIN_SOURCES = ("push", "replay", "input")
"""Policy names of the sources every job reads besides its connectors (``redaction.sources``):
pushed changes, re-injected dead letters and the JSONL input of ``source.path``."""


def build_redact(
    settings: Settings, metrics: Metrics, environ: Mapping[str, str] | None = None
) -> RedactStage:
    """The redaction stage (``redaction.*``); with redaction off it redacts nothing.

    The key of the ``hash`` action is read from ``environ`` (the process
    environment by default): a policy that hashes without one refuses to start,
    as does one that names an unknown entity type or source. Off or on, the
    stage keeps the push journal's own fields (``pushed_by``, ``redactions``)
    to changes read from the journal.
    """
    names = [*(spec.name for spec in settings.sources), *BUILTIN_SOURCES]
    redactor = Redactor.from_settings(settings.redaction, environ=environ, sources=names)
    push, replay = settings.push_dir, settings.replay_dir

    def builtin(partition: str) -> str:
        folder = Path(partition).parent
        return "push" if folder == push else "replay" if folder == replay else "input"

    return RedactStage(redactor, metrics, source_name=builtin)


def build_epoch_audit(
    settings: Settings,
    pipeline: Pipeline,
    generation: Callable[[], int],
    environ: Mapping[str, str] | None = None,
) -> EpochAudit | None:
    """The epoch audit log (``audit.*``) attached to ``pipeline``; None when it is off.

    ``generation`` says which index generation serves; the signing secret is
    read from ``environ`` (the process environment by default). Attaching
    appends what a crash left in the index first.
    """
    audit = settings.audit
    if not audit.enabled:
        return None
    key = audit.secret(os.environ if environ is None else environ)
    made = EpochAudit(
        EpochAuditLog(audit.log_path(settings.state_dir), fsync=audit.fsync),
        clock=pipeline.clock,
        generation=generation,
        pipeline=pipeline_identity(settings.model_dump(mode="json")),
        key=key,
    )
    made.attach(pipeline)
    return made


def build_source(settings: Settings, push: PushJournal | None = None) -> Source:
    """The configured connectors (or JSONL input), the push journal and the replay folder.

    The push journal (``POST /v1/documents``, ``Service.upsert``) and the folder
    that dead letters are re-injected into are read by every job, whatever
    its sources.
    """
    cap = settings.ingest.max_document_bytes + 1
    src = settings.source
    parts: list[Any] = []
    if not settings.sources:
        parts.append(JsonlSource(src.path, glob=src.glob, max_line_bytes=cap))
    for spec in settings.sources:
        parts.append(_connector(spec, cap))
    parts.append(
        push.source if push is not None else JsonlSource(settings.push_dir, max_line_bytes=cap)
    )
    parts.append(JsonlSource(settings.replay_dir, max_line_bytes=cap))
    return MultiSource(parts)


_CONNECTORS = {
    "folder": "streamrag.sources.folder:FolderSource",
    "postgres": "streamrag.sources.postgres:PostgresSource",
    "kafka": "streamrag.sources.kafka:KafkaSource",
    "nats": "streamrag.sources.nats:NatsSource",
    "redis": "streamrag.sources.redis_streams:RedisSource",
}
"""Where each connector kind lives: imported only when configured (its client is an extra)."""

_EXTRAS = {"folder": "documents"}


def _connector(spec: SourceSpec, line_cap: int) -> Any:
    if isinstance(spec, JsonlSourceSettings):
        return JsonlSource(spec.path, glob=spec.glob, max_line_bytes=line_cap, decoder=spec.name)
    module_name, _, cls_name = _CONNECTORS[spec.kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(spec.kind, spec.kind)
        purpose = f"source {spec.name!r} (kind {spec.kind})"
        raise MissingDependencyError(exc.name or extra, extra, purpose) from None
    return getattr(module, cls_name).from_settings(spec)


def build_decoders(settings: Settings) -> DecoderSet:
    """Streamrag's change decoder for JSONL, push and replay; each connector's own by name."""
    ingest = settings.ingest
    limits: dict[str, Any] = {
        "default_tenant": ingest.default_tenant,
        "max_document_bytes": ingest.max_document_bytes,
    }
    named: dict[str, RecordDecoder] = {}
    for spec in settings.sources:
        named[spec.name] = _decoder(spec, limits)
    registry = settings.schemas.load()
    if registry is not None:  # sources with versioned record schemas decode through them
        named.update(schema_decoders(registry, settings.sources, **limits))
    return DecoderSet(Decoder(**limits), named)


def _decoder(spec: SourceSpec, limits: dict[str, Any]) -> RecordDecoder:
    """The decoder of one connector's records (imported only when configured)."""
    if isinstance(spec, FolderSourceSettings):
        from streamrag.ingest.documents import DocumentDecoder

        return DocumentDecoder.from_settings(spec, **limits)
    if isinstance(spec, JsonlSourceSettings):
        return Decoder(**limits)
    if isinstance(spec, PostgresSourceSettings) or spec.format == "debezium":
        from streamrag.ingest.debezium import DebeziumDecoder

        return DebeziumDecoder.from_settings(spec, **limits)
    if spec.format == "row":
        from streamrag.ingest.rows import RowDecoder

        return RowDecoder.from_settings(spec, **limits)
    return Decoder(**limits)


_MAKES_MODEL_FILES = ("minilm-onnx", "streamrag.embed.onnx:OnnxEmbedder")
"""Embedders that make model files once and keep them (in ``<state_dir>/models``)."""


def embedder_from(settings: Settings, class_path: str, args: Mapping[str, Any]) -> Embedder:
    """An embedder by name and arguments; one that makes model files keeps them in the state dir."""
    kwargs = dict(args)
    if class_path in _MAKES_MODEL_FILES:
        kwargs.setdefault("cache_dir", str(settings.state_dir / "models"))
    return build_embedder(class_path, kwargs)


def build_choice(settings: Settings, primary: Embedder, clock: Clock) -> EmbedderChoice:
    """The configured embedder with its fallback and fast variant (``embedder.*``)."""
    emb = settings.embedder
    fallback = None
    if emb.fallback is not None:
        fallback = embedder_from(settings, emb.fallback.class_, emb.fallback.args)
    fast = None if emb.fast is None else embedder_from(settings, emb.fast.class_, emb.fast.args)
    return EmbedderChoice(
        primary,
        clock=clock,
        fallback=fallback,
        fast=fast,
        probe_every_s=emb.probe_every_ms / 1000,
        fast_above_lag_us=emb.fast_above_lag_ms * US_PER_MS,
    )


AHEAD_PENDING = 16
"""Batches the batcher holds by default while a worker embeds ahead (else 4)."""


def build_ahead(
    settings: Settings, embedder: Embedder, clock: Clock, metrics: Metrics
) -> EmbedAhead | None:
    """The worker that embeds queued chunks ahead of their commit (``embedder.ahead``), or None.

    ``auto`` takes one for an embedder that holds the interpreter lock — it
    says so, or, when it says nothing, a measurement at the first backlog
    shows it — when the process may use two CPUs or more; with
    ``ingest.share_core`` the worker runs on the CPUs the ingest threads leave.
    """
    mode = settings.embedder.ahead
    cpus = process_cpus()
    said = holds_gil(embedder)
    if mode == "off" or (mode == "auto" and (said is False or len(cpus) < 2)):
        return None
    shared = ingest_cpu() if settings.ingest.share_core else None
    b = settings.batcher
    pending = b.max_pending or AHEAD_PENDING * b.max_batch_size
    taken = metrics.embed_ahead
    return EmbedAhead(
        embedder,
        limit=2 * pending,
        request_size=b.max_batch_size,
        cpus=cpus - {shared} if shared is not None else None,
        eager=mode == "process",
        measure=mode == "auto" and said is None,
        clock=clock,
        on_taken=lambda outcome, n: taken.labels(outcome=outcome).inc(n),
    )


def build_batcher(settings: Settings, clock: Clock, *, ahead: bool = False) -> MicroBatcher:
    """The micro-batcher: its bounds, partition key, deadline, ticks and controller.

    With a worker that embeds ahead, the batcher holds more (``AHEAD_PENDING``
    batches by default): what waits in it is what the worker can embed while
    the job commits.
    """
    b = settings.batcher
    return MicroBatcher(
        max_batch_size=b.max_batch_size,
        max_delay_ms=b.max_delay_ms,
        clock=clock,
        max_batch_tokens=b.max_batch_tokens,
        max_pending=b.max_pending or (AHEAD_PENDING if ahead else 4) * b.max_batch_size,
        max_pending_bytes=b.max_pending_bytes,
        partition=PartitionKey(tuple(b.partition_key), b.date_bucket_ms * US_PER_MS),
        controller=build_controller(settings),
        tick_us=None if b.tick_ms is None else b.tick_ms * US_PER_MS,
    )


def build_splitter(settings: Settings, embedder: Embedder) -> Splitter:
    """Chunk in the embedder's own tokens when it can count them."""
    chunking = settings.chunking
    count = count_words
    if chunking.tokens != "words" and isinstance(embedder, CountsTokens):
        count = embedder.count_tokens
    if chunking.splitter == "structured":
        return StructuredSplitter(
            chunking.max_tokens,
            chunking.overlap_tokens,
            count_tokens=count,
            headers=chunking.heading_path,
        )
    return TokenSplitter(chunking.max_tokens, chunking.overlap_tokens, count_tokens=count)


def build_controller(settings: Settings) -> AdaptiveController | None:
    b = settings.batcher
    if not b.adaptive:
        return None
    low = min(b.min_batch_size, b.max_batch_size)
    return AdaptiveController(
        min_size=low,
        max_size=b.max_batch_size,
        target_latency_s=b.target_embed_ms / 1000,
        initial=max(low, min(b.max_batch_size, 16)),
    )


def build_event_time(settings: Settings, clock: Clock) -> EventTimeStage:
    """The event-time stage from settings: the watermark tracker and the windows."""
    et = settings.event_time
    tracker = WatermarkTracker(
        bound_us=et.max_out_of_orderness_ms * US_PER_MS,
        idle_timeout_us=None if et.idle_timeout_ms is None else et.idle_timeout_ms * US_PER_MS,
        clock=clock,
    )
    windows = [NamedWindow.from_settings(w) for w in et.windows]
    tick = settings.batcher.tick_ms
    return EventTimeStage(
        tracker, windows, mode=Mode(et.mode), tick_us=None if tick is None else tick * US_PER_MS
    )
