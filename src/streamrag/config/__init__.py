"""Configuration: one typed, frozen object, validated once.

Settings come from four layers; a later layer wins over an earlier one:

1. defaults (the values below),
2. a YAML file (``streamrag run config.yaml``),
3. ``STREAMRAG_*`` environment variables — nested keys joined by ``__``, so
   ``STREAMRAG_BATCHER__MAX_DELAY_MS=50`` sets ``batcher.max_delay_ms``; values
   are read as YAML scalars (``50`` is a number, ``{dim: 64}`` a mapping),
4. explicit arguments (CLI flags, or ``overrides`` in :func:`load_settings`),
   given as dotted keys.

A bad value raises :class:`~streamrag.errors.ConfigError` naming the key, the
value, where it came from and what is allowed. Nothing else in streamrag reads
the environment.

>>> s = load_settings(overrides={"batcher.max_delay_ms": 50}, environ={})
>>> s.batcher.max_delay_ms
50
>>> load_settings(overrides={"batcher.max_delay_ms": "soon"}, environ={})
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
streamrag.errors.ConfigError: config key 'batcher.max_delay_ms' = 'soon' (from argument): ...
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from streamrag.config.answer import (
    AnswerSettings,
    CacheSettings,
    ContextSettings,
    LLMSettings,
    SafetySettings,
)
from streamrag.config.audit import AuditSettings
from streamrag.config.base import Frozen as _Frozen
from streamrag.config.embedders import EmbedderSettings, EmbedderSpec
from streamrag.config.index import IndexSettings
from streamrag.config.redaction import RedactionSettings
from streamrag.config.schemas import SchemaSettings
from streamrag.config.security import SecuritySettings
from streamrag.config.sources import (
    FolderSourceSettings,
    JsonlSourceSettings,
    KafkaSourceSettings,
    NatsSourceSettings,
    PostgresSourceSettings,
    RecordFormat,
    RedisSourceSettings,
    RowMapping,
    SourceSpec,
)
from streamrag.errors import ArgumentError, ConfigError, SpecError

__all__ = [
    "AnswerSettings",
    "BatcherSettings",
    "CacheSettings",
    "ChunkingSettings",
    "ContextSettings",
    "EmbedderSettings",
    "EmbedderSpec",
    "EventTimeSettings",
    "FolderSourceSettings",
    "IndexSettings",
    "IngestSettings",
    "JsonlSourceSettings",
    "KafkaSourceSettings",
    "LLMSettings",
    "NatsSourceSettings",
    "PostgresSourceSettings",
    "PushSettings",
    "RecordFormat",
    "RedisSourceSettings",
    "RowMapping",
    "SafetySettings",
    "ServeSettings",
    "Settings",
    "SourceSettings",
    "SourceSpec",
    "WindowSettings",
    "load_settings",
    "parse_value",
]

ENV_PREFIX = "STREAMRAG_"


class SourceSettings(_Frozen):
    """Where changes come from: a JSONL file, or a directory of ``*.jsonl`` files, tailed."""

    path: Path = Field(
        Path("changes.jsonl"), description="A JSONL file, or a directory of JSONL files."
    )
    glob: str = Field("*.jsonl", description="Which files of a directory to read.")
    poll_interval_ms: int = Field(
        2, gt=0, description="How often an idle source looks for new data (bounds freshness)."
    )
    max_read_bytes: int = Field(
        1 << 20, gt=0, description="At most this many bytes are read per poll (backpressure)."
    )
    wake_timeout_ms: int = Field(
        1000,
        gt=0,
        description="Sources that wake the job when data arrives (files, folders, brokers) "
        "let an idle job sleep; it still looks this often (time-driven windows fire then).",
    )


class IngestSettings(_Frozen):
    """Decoding and validation of records, and where the ingest threads run."""

    dead_letter_path: Path | None = Field(
        None, description="JSONL file for bad records; default: <state_dir>/deadletter.jsonl."
    )
    max_document_bytes: int = Field(
        1_000_000, gt=0, description="Larger records are dead-lettered."
    )
    default_tenant: str = Field(
        "default", min_length=1, description="Tenant of records that name none."
    )
    share_core: bool = Field(
        True, description="Reader and committer on one CPU (Linux): cheaper turns at Python's lock."
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="How much lower the reader's and committer's CPU priority is than the "
        "process's (Linux; 0: the same): above 0 queries come first when the cores are busy.",
    )
    gc_young: int = Field(
        10_000,
        ge=0,
        description="Container allocations between two young collections of Python's cyclic "
        "garbage collector in `streamrag run` and `serve` (Python's default: 700; 0 leaves "
        "Python's setting). Fewer collections of short-lived per-change objects: ingest "
        "4-9 % faster on the bench workload (streamrag.runtime.collector).",
    )


class ChunkingSettings(_Frozen):
    """How documents are split into chunks before embedding."""

    max_tokens: int = Field(128, gt=0, description="Upper bound of tokens per chunk.")
    overlap_tokens: int = Field(16, ge=0, description="Tokens repeated between neighbours.")
    tokens: Literal["embedder", "words"] = Field(
        "embedder",
        description="Count tokens with the embedder's tokenizer when it has one, or as words.",
    )
    splitter: Literal["tokens", "structured"] = Field(
        "tokens",
        description="tokens: token windows with overlap; structured: chunks that respect "
        "Markdown/HTML sections, code blocks and sentences (needs streamrag[documents]; "
        "best for documents: docs/performance.md).",
    )
    heading_path: bool = Field(
        True,
        description="structured only: begin each chunk with its heading path "
        "('Install > Linux'), which is embedded and returned with the chunk.",
    )


class BatcherSettings(_Frozen):
    """The micro-batcher: a partition's batch is flushed at whichever limit comes first."""

    max_batch_size: int = Field(
        256, gt=0, description="Most chunks per micro-batch (a delete counts as one)."
    )
    max_batch_tokens: int | None = Field(
        32_768, gt=0, description="Most tokens per micro-batch (none: no token limit)."
    )
    max_delay_ms: int = Field(
        20, ge=0, description="Processing-time deadline from a partition's oldest change."
    )
    max_pending: int | None = Field(
        None,
        gt=0,
        description="Chunks waiting before sources pause (backpressure); default: 4 x "
        "max_batch_size (16 x with a worker that embeds ahead: embedder.ahead).",
    )
    max_pending_bytes: int = Field(
        64 << 20,
        gt=0,
        description="Bytes of text waiting before sources pause (backpressure), so memory "
        "stays bounded whatever the document sizes.",
    )
    commit_interval_ms: int = Field(
        0,
        ge=0,
        description="Group the micro-batches due within this long into one commit (one "
        "epoch, one checkpoint); 0 commits each micro-batch. Freshness grows by up to this.",
    )
    partition_key: list[str] = Field(
        default_factory=lambda: ["tenant", "domain", "date"],
        min_length=1,
        description="Fields that keep a batch topically local: tenant, domain, doc_id, "
        "source, op, date (event-time bucket) or metadata.NAME.",
    )
    date_bucket_ms: int = Field(
        86_400_000, gt=0, description="Width of the 'date' bucket in the partition key."
    )
    tick_ms: int | None = Field(
        None,
        gt=0,
        description="Also flush on processing-time ticks aligned to the epoch, so batches "
        "and window firings run on one schedule (the hybrid operator).",
    )
    adaptive: bool = Field(
        True, description="Size batches to target_embed_ms, between min and max size."
    )
    min_batch_size: int = Field(1, gt=0, description="Smallest target the controller sets.")
    target_embed_ms: float = Field(
        200.0, gt=0, description="Embed latency per batch the adaptive controller aims for."
    )


class WindowSettings(_Frozen):
    """One window aggregation over the change stream (counts, rates, metrics).

    ``kind: global`` is one window per key that never closes by time (it fires
    on time only at the end of a bounded input), so it needs a counting
    ``trigger``. Triggers (see ``streamrag.eventtime.triggers``) add ``early``
    firings before a window's end: ``count`` every ``trigger_count`` changes,
    ``every_update`` on every change; ``purge`` clears a window after each firing
    (Flink's purging trigger, the same results as ``accumulation: discarding``).
    """

    name: str = Field(..., min_length=1, description="Name in results, metrics and the API.")
    kind: Literal["tumbling", "sliding", "session", "global"] = Field(
        "tumbling", description="Window kind (global: one window per key, never closed by time)."
    )
    size_ms: int | None = Field(None, gt=0, description="Window length (tumbling, sliding).")
    slide_ms: int | None = Field(None, gt=0, description="Start-to-start spacing (sliding).")
    gap_ms: int | None = Field(None, gt=0, description="Inactivity that ends a session.")
    offset_ms: int = Field(0, description="Shift of window starts from the epoch.")
    key: list[str] = Field(
        default_factory=lambda: ["domain"],
        min_length=1,
        description="Fields the windows are keyed by: tenant, domain, doc_id, source, op "
        "or metadata.NAME.",
    )
    aggregate: Literal["count", "sum", "min", "max", "mean", "collect"] = Field(
        "count", description="What each window computes."
    )
    value: str | None = Field(
        None, description="Field aggregated (metadata.NAME); needed for all but count."
    )
    allowed_lateness_ms: int = Field(
        0, ge=0, description="How long a fired window still accepts late changes."
    )
    accumulation: Literal["accumulating", "discarding"] = Field(
        "accumulating", description="Whether later results repeat earlier elements."
    )
    early_every_ms: int | None = Field(
        None, gt=0, description="Emit EARLY results of open windows this often."
    )
    trigger: Literal["watermark", "count", "every_update"] = Field(
        "watermark",
        description="Also fire open windows (EARLY) every trigger_count changes (count) or on "
        "every change (every_update).",
    )
    trigger_count: int | None = Field(
        None, gt=0, description="Changes between firings (trigger: count)."
    )
    purge: bool = Field(
        False, description="Clear a window after each firing (Flink's purging trigger)."
    )
    keep_results: int = Field(1000, gt=0, description="Latest results kept for the API.")

    @model_validator(mode="after")
    def _complete(self) -> WindowSettings:
        needs = {
            "tumbling": ["size_ms"],
            "sliding": ["size_ms", "slide_ms"],
            "session": ["gap_ms"],
            "global": [],
        }
        missing = [f for f in needs[self.kind] if getattr(self, f) is None]
        if missing:
            msg = f"a {self.kind} window needs {' and '.join(missing)}"
            raise SpecError(msg)
        if self.aggregate != "count" and self.value is None:
            msg = f"aggregate {self.aggregate!r} needs value: the field to aggregate"
            raise SpecError(msg)
        if self.trigger == "count" and self.trigger_count is None:
            msg = "trigger 'count' needs trigger_count: the changes between firings"
            raise SpecError(msg)
        if self.trigger != "count" and self.trigger_count is not None:
            msg = (
                f"trigger_count applies to trigger: count, found trigger: {self.trigger}; "
                "set trigger: count or drop trigger_count"
            )
            raise SpecError(msg)
        if self.kind == "global" and self.trigger == "watermark":
            msg = (
                "a global window never closes by time, so on the watermark alone it fires "
                "only at the end of a bounded input; set trigger: count (with trigger_count) "
                "or every_update"
            )
            raise SpecError(msg)
        return self


class EventTimeSettings(_Frozen):
    """Watermarks and window aggregations."""

    max_out_of_orderness_ms: int = Field(
        0, ge=0, description="How late a change may arrive behind the newest one seen."
    )
    idle_timeout_ms: int | None = Field(
        60_000,
        gt=0,
        description="A source partition silent this long stops holding the watermark back.",
    )
    mode: Literal["micro_batch", "per_event"] = Field(
        "micro_batch",
        description="Move the watermark once per batch (checkpoint-consistent) or per change.",
    )
    windows: list[WindowSettings] = Field(
        default_factory=list, description="Window aggregations to run."
    )
    late_to_dead_letter: bool = Field(
        True, description="Keep late changes (and ones missing a window's value) there."
    )


class ServeSettings(_Frozen):
    """The HTTP API."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    max_k: int = Field(100, gt=0, description="Largest k a query may ask for.")
    max_body_bytes: int = Field(
        1 << 20, gt=0, description="Largest request body; a larger one gets a 413."
    )
    query_workers: int = Field(
        2,
        ge=1,
        description="Threads that embed and search query batches (one per core); while the "
        "embedder holds the interpreter lock (hashing) and scans use every core "
        "(index.scan_threads), one of them at a time.",
    )
    max_batch: int = Field(64, ge=1, description="Most queries answered by one search.")
    max_wait_ms: float = Field(
        2.0,
        ge=0,
        description="Under concurrency, how long a batch waits for more queries; "
        "a lone query never waits, nor one whose embedding calls cost little beyond their "
        "queries (MiniLM in int8).",
    )
    min_parallel_batch: int = Field(
        8,
        ge=1,
        description="While one query worker embeds, another starts only with at least this "
        "many queries (else it keeps gathering): fewer, larger embedding calls when the "
        "embedder is the bottleneck (MiniLM through PyTorch; not where a call costs little "
        "beyond its queries, as MiniLM in int8); 1 = start at once.",
    )
    inline_query_ms: float = Field(
        5.0,
        ge=0,
        description="A lone query (none other in flight or arriving with it, recent batches "
        "alone too) with an embedder that computes in the process is answered on the event "
        "loop, without the hand-off to a query worker and back (0.6-1.4 ms at one client over "
        "20,000 documents on a 2-core host), while lone queries lately took at most this long; "
        "0 = always hand off.",
    )
    query_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a query waits for its answer from the query workers; past it "
        "the request gets a 429 (query_timeout) with Retry-After, and no request waits forever.",
    )
    switch_interval_ms: float = Field(
        1.0,
        gt=0,
        le=100,
        description="How long a thread may hold Python's interpreter lock while another waits "
        "for it (sys.setswitchinterval; Python's default: 5 ms). Each hop of a query (event "
        "loop, query worker, back) can wait this long behind the ingest thread.",
    )


class PushSettings(_Frozen):
    """Changes pushed over ``POST /v1/documents`` or from Python (``Service.upsert``)."""

    max_backlog_bytes: int = Field(
        64 << 20,
        gt=0,
        description="Pushed bytes the pipeline has not read yet before pushes get 429 "
        "(Retry-After).",
    )
    max_changes: int = Field(1000, gt=0, description="Changes per push request.")
    wait_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a push with wait_for_commit waits for its epoch (then 202).",
    )


class Settings(_Frozen):
    """Every setting of a streamrag job."""

    state_dir: Path = Field(Path(".streamrag"), description="Where streamrag keeps its files.")
    blas_threads: int = Field(
        1,
        ge=1,
        description="Threads per matrix product (OpenBLAS). One is fastest on small shared "
        "hosts: parallelism comes from concurrent requests and pipeline stages.",
    )
    stop_timeout_s: float = Field(
        5.0,
        ge=0,
        description="How long a graceful stop (SIGTERM, Ctrl-C) may spend committing what is "
        "pending; changes not embedded by then are read again on restart (nothing is lost).",
    )
    source: SourceSettings = SourceSettings()
    sources: list[SourceSpec] = Field(
        default_factory=list,
        description="Connectors to read (each with a kind and a name); when empty, the "
        "JSONL input of source.path is read.",
    )
    push: PushSettings = PushSettings()
    ingest: IngestSettings = IngestSettings()
    redaction: RedactionSettings = RedactionSettings()
    schemas: SchemaSettings = SchemaSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    batcher: BatcherSettings = BatcherSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    index: IndexSettings = IndexSettings()
    audit: AuditSettings = AuditSettings()
    event_time: EventTimeSettings = EventTimeSettings()
    serve: ServeSettings = ServeSettings()
    llm: LLMSettings = LLMSettings()
    answer: AnswerSettings = AnswerSettings()
    security: SecuritySettings = SecuritySettings()

    @model_validator(mode="after")
    def _unique_source_names(self) -> Settings:
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            msg = f"source names must be unique; {', '.join(dup)} appear more than once"
            raise ArgumentError(msg)
        return self

    @property
    def push_dir(self) -> Path:
        """Where changes pushed over HTTP or Python are journaled before the pipeline reads them."""
        return self.state_dir / "push"

    @property
    def dead_letter_path(self) -> Path:
        """The dead-letter file, defaulting into ``state_dir``."""
        return self.ingest.dead_letter_path or self.state_dir / "deadletter.jsonl"

    @property
    def replay_dir(self) -> Path:
        """Where ``streamrag deadletter replay`` writes records to re-inject; always read."""
        return self.state_dir / "replay"

    @property
    def audit_log_path(self) -> Path:
        """The prompt-safety audit log, defaulting into ``state_dir``."""
        return self.answer.safety.audit_log or self.state_dir / "audit.jsonl"


def load_settings(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build :class:`Settings` from defaults, a YAML file, environment and overrides.

    ``environ`` is the environment to read (pass ``os.environ``; tests pass a
    dict). ``overrides`` maps dotted keys to values and wins over everything.
    """
    data: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if path is not None:
        _merge(data, origins, _read_yaml(Path(path)), f"file {path}")
    env_layer: dict[str, Any] = {}
    for name, raw in sorted((environ or {}).items()):
        if not name.startswith(ENV_PREFIX):
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        _merge(env_layer, origins, _unflatten({dotted: parse_value(raw)}), f"env {name}")
    _merge(data, {}, env_layer, "")
    if overrides:
        _merge(data, origins, _unflatten(dict(overrides)), "argument")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, data, origins) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = f"config file {str(path)!r} does not exist; pass the path of a YAML file"
        raise ConfigError(msg) from None
    except yaml.YAMLError as exc:
        msg = f"config file {str(path)!r} is not valid YAML: {exc}"
        raise ConfigError(msg) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        msg = (
            f"config file {str(path)!r} must hold a mapping of keys, found {type(loaded).__name__}"
        )
        raise ConfigError(msg)
    return loaded


def parse_value(raw: str) -> Any:
    """Read a value given as text (environment, ``--set``) as a YAML scalar or mapping.

    >>> parse_value("50"), parse_value("{dim: 64}"), parse_value("docs/")
    (50, {'dim': 64}, 'docs/')
    """
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        parts = dotted.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _merge(
    into: dict[str, Any],
    origins: dict[str, str],
    layer: Mapping[str, Any],
    origin: str,
    prefix: str = "",
) -> None:
    for key, value in layer.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(into.get(key), dict) and key != "args":
            _merge(into[key], origins, value, origin, dotted + ".")
        elif isinstance(value, Mapping) and key != "args":
            into[key] = {}
            _merge(into[key], origins, value, origin, dotted + ".")
        else:
            into[key] = value
            if origin:
                origins[dotted] = origin


def _config_error(
    exc: ValidationError, data: Mapping[str, Any], origins: Mapping[str, str]
) -> ConfigError:
    lines = []
    for err in exc.errors():
        dotted = ".".join(str(p) for p in err["loc"])
        origin = origins.get(dotted) or next(
            # A section (a mapping) has no origin of its own: its keys do.
            (o for k, o in origins.items() if k.startswith(dotted + ".")),
            "defaults",
        )
        if err["type"] == "extra_forbidden":
            parent, _, leaf = dotted.rpartition(".")
            known = _known_keys(parent)
            hint = difflib.get_close_matches(leaf, known, n=1)
            suggestion = (
                f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(known)}"
            )
            lines.append(f"unknown config key {dotted!r} (from {origin}){suggestion}")
        else:
            lines.append(
                f"config key {dotted!r} = {err.get('input')!r} (from {origin}): {err['msg']}"
            )
    return ConfigError("\n".join(lines))


def _known_keys(parent: str) -> list[str]:
    model: type[BaseModel] = Settings
    for part in [p for p in parent.split(".") if p]:
        field = model.model_fields.get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        if not issubclass(field.annotation, BaseModel):
            return []
        model = field.annotation
    return [f.alias or name for name, f in model.model_fields.items()]


def _union_members(inner: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The models of a ``list[Annotated[A | B, discriminator]]`` field's items, else none."""
    if len(inner) != 1 or get_origin(inner[0]) is not Annotated:
        return []
    return [m for m in get_args(get_args(inner[0])[0]) if issubclass(m, BaseModel)]


def reference_markdown() -> str:
    """The configuration reference as a Markdown table (the README embeds it; a test checks)."""
    rows = ["| key | default | description |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, key + ".")
                continue
            if field.is_required():
                shown = "required"
            else:
                default = field.get_default(call_default_factory=True)
                shown = str(default) if not isinstance(default, str) else repr(default)
            rows.append(f"| `{key}` | `{shown}` | {field.description or ''} |")
            inner: tuple[Any, ...] = getattr(ann, "__args__", ())
            if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
                walk(inner[0], key + "[].")
            for member in _union_members(inner):  # sources: one block per kind
                kind = get_args(member.model_fields["kind"].annotation)[0]
                walk(member, f"{key}[kind={kind}].")

    walk(Settings, "")
    return "\n".join(rows)
