"""Prometheus metrics, one registry per running job (no process globals).

Counters follow the data path: records ingested, changes applied (stale ones
included, since last-writer-wins made them no-ops), dead letters by stage,
personal data redacted by entity type, chunks embedded versus reused, commits.
Histograms time the commit freshness (oldest change read → visible), embedding
and queries. The answer side counts
semantic-cache lookups by outcome and the near hits its guards refused, LLM
calls by outcome and the circuit breaker's state, answers by generator, and
retrieved chunks flagged as prompt injection. CPU time by thread
(:mod:`.thread_cpu`) shows which part of the process took the cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamrag.runtime.thread_cpu import ThreadCpuCollector

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The instruments of one streamrag job, in their own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._ingest(r)
        self._index(r)
        self._batching(r)
        self._queries(r)
        self._answers(r)
        self._llm(r)
        r.register(ThreadCpuCollector())

    def _ingest(self, r: CollectorRegistry) -> None:
        """Records along the data path: read, applied, refused, embedded, committed."""
        self.ingested = Counter(
            "streamrag_changes_ingested", "Records read from sources.", registry=r
        )
        self.applied = Counter(
            "streamrag_changes_applied", "Changes committed (stale no-ops included).", registry=r
        )
        self.stale = Counter(
            "streamrag_changes_stale",
            "Changes that changed nothing a read can see (held already, or too old to keep).",
            registry=r,
        )
        self.past_versions = Counter(
            "streamrag_changes_past_versions",
            "Changes older than their document's current version, kept in its history.",
            registry=r,
        )
        self.dead_letters = Counter(
            "streamrag_dead_letters",
            "Records sent to the dead-letter store.",
            ["stage"],
            registry=r,
        )
        self.chunks_embedded = Counter(
            "streamrag_chunks_embedded", "Chunks sent to the embedder.", registry=r
        )
        self.chunks_reused = Counter(
            "streamrag_chunks_reused", "Unchanged chunks that kept their vector.", registry=r
        )
        self.commits = Counter("streamrag_commits", "Micro-batches committed.", registry=r)
        self.redactions = Counter(
            "streamrag_redactions",
            "Personal data found in changes read, by entity type (masked, hashed or dropped; "
            "never the values).",
            ["entity"],
            registry=r,
        )

    def _index(self, r: CollectorRegistry) -> None:
        """The index and event time: epoch, size, watermark, windows."""
        self.epoch = Gauge("streamrag_index_epoch", "Latest committed epoch.", registry=r)
        self.live_chunks = Gauge("streamrag_index_live_chunks", "Searchable chunks.", registry=r)
        self.live_docs = Gauge("streamrag_index_live_docs", "Searchable documents.", registry=r)
        self.pending = Gauge(
            "streamrag_pending_changes", "Changes read but not committed.", registry=r
        )
        self.watermark = Gauge(
            "streamrag_watermark_seconds", "Event-time watermark (Unix seconds).", registry=r
        )
        self.watermark_lag = Gauge(
            "streamrag_watermark_lag_seconds",
            "Processing time minus the watermark: how far event time trails the clock.",
            registry=r,
        )
        self.window_results = Counter(
            "streamrag_window_results",
            "Window results emitted, by window and timing (early, on_time, late).",
            ["window", "timing"],
            registry=r,
        )
        self.window_late = Counter(
            "streamrag_window_late_changes",
            "Changes that arrived after every window they belong to expired.",
            ["window"],
            registry=r,
        )

    def _batching(self, r: CollectorRegistry) -> None:
        """Micro-batches, embedding and backpressure."""
        self.batch_chunks = Histogram(
            "streamrag_batch_chunks",
            "Chunks per committed micro-batch.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.batch_reasons = Counter(
            "streamrag_batches",
            "Micro-batches cut, by what cut them (size, deadline, watermark, forced).",
            ["reason"],
            registry=r,
        )
        self.batch_target = Gauge(
            "streamrag_batch_target_chunks",
            "The adaptive controller's target batch size.",
            registry=r,
        )
        self.batch_decisions = Counter(
            "streamrag_batch_controller_decisions",
            "Adaptive controller steps, by action (grow, shrink, hold).",
            ["action"],
            registry=r,
        )
        self.freshness = Histogram(
            "streamrag_commit_freshness_seconds",
            "Processing time from reading the oldest change of a batch to its commit.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.embed_seconds = Histogram(
            "streamrag_embed_seconds",
            "Time per embed_many call.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.embed_retries = Counter(
            "streamrag_embed_retries_total",
            "Embedder calls repeated after a failure (retries and bisection).",
            registry=r,
        )
        self.embed_fallbacks = Counter(
            "streamrag_embed_fallbacks_total",
            "Embed calls the fallback made because the configured embedder failed.",
            registry=r,
        )
        self.embed_ahead = Counter(
            "streamrag_embed_ahead_texts_total",
            "Texts a commit asked the embedding worker for: outcome ahead (its vectors "
            "were taken) or missed (the commit embedded them itself).",
            ["outcome"],
            registry=r,
        )
        self.backpressure = Gauge(
            "streamrag_backpressure",
            "1 while the batcher is full and sources are paused, else 0.",
            registry=r,
        )

    def _queries(self, r: CollectorRegistry) -> None:
        """Retrieval latency and query batching."""
        self.query_seconds = Histogram(
            "streamrag_query_seconds",
            "Time to answer a retrieval batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        self.query_batch = Histogram(
            "streamrag_query_batch_size",
            "Queries answered by one embedding call and one search.",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.queries_inline = Counter(
            "streamrag_queries_inline",
            "Lone queries answered on the server's event loop, without the hand-off to a "
            "query worker (serve.inline_query_ms).",
            registry=r,
        )

    def _answers(self, r: CollectorRegistry) -> None:
        """The answer cache and the answers by generator."""
        self.cache_lookups = Counter(
            "streamrag_answer_cache_lookups",
            "Answer-cache lookups by result: exact, near (a near-duplicate question) or miss.",
            ["result"],
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "streamrag_answer_cache_hit_ratio",
            "Hits (exact and near) over lookups since the start.",
            registry=r,
        )
        self.cache_guard_rejections = Counter(
            "streamrag_answer_cache_guard_rejections",
            "Near-duplicate candidates refused by a guard: similarity (embeddings too far "
            "apart), negation (one question negates the other) or numbers (they differ).",
            ["reason"],
            registry=r,
        )
        self.cache_invalidations = Counter(
            "streamrag_answer_cache_invalidations",
            "Cached answers dropped because a later epoch changed what they were read from.",
            registry=r,
        )
        self.cache_evictions = Counter(
            "streamrag_answer_cache_evictions", "Cached answers evicted (LRU-K).", registry=r
        )
        self.cache_entries = Gauge(
            "streamrag_answer_cache_entries", "Answers in the cache.", registry=r
        )
        self.answers = Counter(
            "streamrag_answers",
            "Answers given, by generator (llm, extractive) and outcome: answered, cached, "
            "fallback (the LLM failed before answering) or broken (it failed mid-answer).",
            ["generator", "outcome"],
            registry=r,
        )

    def _llm(self, r: CollectorRegistry) -> None:
        """Calls to the LLM endpoint, its retries, latency and circuit, and flagged chunks."""
        self.llm_calls = Counter(
            "streamrag_llm_calls",
            "Calls to the LLM endpoint by outcome: ok, error, timeout, circuit_open.",
            ["outcome"],
            registry=r,
        )
        self.llm_retries = Counter(
            "streamrag_llm_retries", "Calls to the LLM endpoint that were retried.", registry=r
        )
        self.llm_seconds = Histogram(
            "streamrag_llm_seconds",
            "Time of one LLM call, to the last token.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.llm_circuit = Gauge(
            "streamrag_llm_circuit_state",
            "The LLM circuit breaker: 0 closed, 1 half-open (one trial call), 2 open.",
            registry=r,
        )
        self.injections = Counter(
            "streamrag_prompt_injection_flags",
            "Retrieved chunks flagged as holding instructions, by the action taken.",
            ["action"],
            registry=r,
        )

    def watch_index(self, health: Callable[[], Any] | None) -> None:
        """Export the index's maintenance gauges, read once per scrape from ``health()``.

        ``health`` returns an :class:`~streamrag.index.lsm.IndexHealth`; None (an
        index without maintenance) exports nothing.
        """
        if health is not None:
            self.registry.register(_IndexCollector(health))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _IndexCollector(Collector):
    """Segments, tombstones, bytes and compactions of the LSM index, at scrape time."""

    _GAUGES = (
        ("segments", "streamrag_index_segments", "Segments in the latest manifest."),
        ("growing_segments", "streamrag_index_growing_segments", "Segments still growing."),
        ("ann_segments", "streamrag_index_ann_segments", "Sealed segments with an ANN structure."),
        ("ann_pending", "streamrag_index_ann_pending", "Sealed segments waiting for their ANN."),
        (
            "half_segments",
            "streamrag_index_half_segments",
            "Sealed segments scanned exactly through a half-precision copy of their vectors.",
        ),
        (
            "ann_recall_min",
            "streamrag_index_ann_recall_min",
            "Lowest recall@10 of an ANN structure on recent queries (1 when none measured).",
        ),
        (
            "exact_by_measurement",
            "streamrag_index_exact_segments_by_recall",
            "Sealed segments scanned exactly: their ANN structure missed the recall target.",
        ),
        ("rows", "streamrag_index_rows", "Stored chunk rows, superseded ones included."),
        ("tombstoned_rows", "streamrag_index_tombstoned_rows", "Rows superseded or deleted."),
        ("tombstone_ratio", "streamrag_index_tombstone_ratio", "Tombstoned rows / rows."),
        ("bytes", "streamrag_index_bytes", "Memory held by segments and ANN structures."),
        ("compactions", "streamrag_index_compactions", "Compactions since the index was created."),
        (
            "wal_torn_tails",
            "streamrag_index_wal_torn_tails",
            "Torn last write-ahead-log records cut off when the index opened.",
        ),
    )

    def __init__(self, health: Callable[[], Any]) -> None:
        self._health = health

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        h = self._health()
        for attr, name, doc in self._GAUGES:
            yield GaugeMetricFamily(name, doc, value=float(getattr(h, attr)))
        last = h.last_compaction_us
        yield GaugeMetricFamily(
            "streamrag_index_last_compaction_seconds",
            "When the last compaction finished (Unix seconds; 0: never).",
            value=0.0 if last is None else last / 1e6,
        )
