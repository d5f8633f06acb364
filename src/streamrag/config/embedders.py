"""The ``embedder`` section: the configured embedder, its fallback and its fast variant."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from streamrag.config.base import Frozen as _Frozen

__all__ = ["EmbedderSettings", "EmbedderSpec"]


class EmbedderSpec(_Frozen):
    """Another embedder (a fallback, or a faster variant): its class and arguments."""

    class_: str = Field(
        alias="class",
        description="A registered name ('minilm-onnx', 'minilm', 'tei', ...) or an import path.",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")


class EmbedderSettings(_Frozen):
    """Which embedder to use: a registered name or an import path ``pkg.mod:Name``.

    ``fallback`` and ``fast`` name other embedders of the same vector space
    (the same model; a precision variant qualifies where its vectors agree with
    the model's, cosine ≥ 0.99): the pipeline embeds with ``fallback`` while
    the configured one fails, and with ``fast`` while changes wait longer than
    ``fast_above_lag_ms``. Changing to another model is a re-index
    (``streamrag reindex``), never a fallback.
    """

    class_: str = Field(
        "minilm-onnx",
        alias="class",
        description="'minilm-onnx' (MiniLM through ONNX Runtime; args precision int8|fp32), "
        "'minilm' (through PyTorch), 'hashing', 'openai' (any OpenAI-compatible /v1/embeddings: "
        "args url, model, api_key_env), 'tei' (Text Embeddings Inference: args url), or an "
        "import path such as 'mypkg.emb:MyEmbedder'.",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")
    attempts: int = Field(
        3, ge=1, description="Tries per batch before it is split to isolate a bad text."
    )
    backoff_ms: float = Field(50.0, ge=0, description="Wait before the first retry; doubles.")
    max_backoff_ms: float = Field(2000.0, ge=0, description="Longest wait between retries.")
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Longest one embed call may take before it counts as failed (none: no "
        "limit; set it for remote embedders).",
    )
    fallback: EmbedderSpec | None = Field(
        None,
        description="Embed with this one while the configured embedder fails (endpoint down, "
        "timeouts); the configured one is probed every probe_every_ms and used again once it "
        "answers. Must make vectors in the same space (the same model).",
    )
    probe_every_ms: int = Field(
        5000, gt=0, description="While on the fallback: how often the configured embedder is tried."
    )
    fast: EmbedderSpec | None = Field(
        None,
        description="A faster variant of the same model (for example minilm-onnx with "
        "precision int8), used while the oldest waiting change is older than fast_above_lag_ms.",
    )
    fast_above_lag_ms: int = Field(
        2000,
        gt=0,
        description="With fast: switch to it above this wait, back below half of it.",
    )
    ahead: Literal["auto", "process", "off"] = Field(
        "auto",
        description="Embed queued chunks ahead of their commit in a worker process, so that "
        "an embedder that computes in Python runs beside the job instead of taking turns "
        "with it. auto: once a whole batch waits, with two CPUs or more, for an embedder "
        "that holds the interpreter lock (hashing says so; one that says nothing is "
        "measured); process: from the first change, for any embedder that pickles; off: "
        "never. Queries always embed in the serving process.",
    )

    @field_validator("ahead", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML reads a bare ``off`` as false (and ``on`` as true): take them as meant."""
        if value is False:
            return "off"
        if value is True:
            return "process"
        return value
