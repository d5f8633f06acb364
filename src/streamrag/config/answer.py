"""Settings of the answer side: the LLM endpoint, the answer cache, context and safety.

Part of :class:`streamrag.config.Settings` (``llm`` and ``answer``); see that
module for how settings are loaded and validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from streamrag.config.base import Frozen as _Frozen

__all__ = ["AnswerSettings", "CacheSettings", "ContextSettings", "LLMSettings", "SafetySettings"]


class LLMSettings(_Frozen):
    """The LLM that writes answers: any OpenAI-compatible ``/chat/completions`` endpoint.

    Without ``base_url`` answers are extractive (the best sentences of the
    retrieved chunks). The API key is best given in the environment
    (``STREAMRAG_LLM__API_KEY``); it is sent as a bearer token and never logged
    or shown.
    """

    base_url: str | None = Field(
        None,
        description="Endpoint root that ends before /chat/completions, such as "
        "https://api.deepseek.com/v1 or http://127.0.0.1:8080/v1; none: extractive answers.",
    )
    model: str = Field("", description="Model name sent with each request.")
    api_key: SecretStr | None = Field(
        None, description="Bearer token (prefer STREAMRAG_LLM__API_KEY); never logged."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Time to open a connection.")
    read_timeout_s: float = Field(
        30.0, gt=0, description="Longest silence while waiting for the answer or the next token."
    )
    total_timeout_s: float = Field(
        120.0, gt=0, description="Longest time for one answer, retries included."
    )
    max_retries: int = Field(
        2, ge=0, description="Retries of a failed call (connection errors, 429, 5xx)."
    )
    backoff_ms: float = Field(
        250.0, ge=0, description="First retry delay; doubles per retry, with jitter."
    )
    breaker_failures: int = Field(
        5, ge=1, description="Failed calls in a row that open the circuit breaker."
    )
    breaker_reset_s: float = Field(
        30.0, gt=0, description="How long an open breaker refuses calls before one trial call."
    )
    max_concurrency: int = Field(
        4, ge=1, description="Calls in flight at once; more wait for a slot."
    )
    max_tokens: int = Field(512, gt=0, description="Longest answer, in the model's tokens.")
    temperature: float = Field(0.2, ge=0, le=2, description="Sampling temperature.")
    tokenizer: str = Field(
        "approx",
        description="How context tokens are counted: 'approx' (an estimate by character "
        "class, for English and code), 'server' (the endpoint's llama.cpp /tokenize), or the "
        "path of the model's tokenizer.json (Hugging Face tokenizers).",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _key_as_text(cls, value: Any) -> Any:
        # A key read from YAML or the environment may look like a number.
        return value if value is None or isinstance(value, SecretStr) else str(value)


class CacheSettings(_Frozen):
    """The semantic answer cache: exact and near-duplicate questions, epoch-aware."""

    enabled: bool = Field(True, description="Serve repeated questions from the cache.")
    max_entries: int = Field(10_000, gt=0, description="Answers kept; LRU-K evicts beyond.")
    lru_k: int = Field(
        2, ge=1, description="K of LRU-K: evict by the K-th most recent use (1 = plain LRU)."
    )
    max_hamming: int = Field(
        6, ge=0, le=16, description="Most differing bits of two questions' 64-bit SimHash."
    )
    min_similarity: float = Field(
        0.95,
        ge=0,
        le=1,
        description="Least cosine similarity of two questions' embeddings for a near hit.",
    )


class ContextSettings(_Frozen):
    """How retrieved chunks become the context of an answer."""

    max_tokens: int = Field(
        1024, gt=0, description="Token budget of the retrieved context in the prompt."
    )
    candidates: int = Field(
        2,
        ge=1,
        description="Chunks retrieved per chunk kept (k x this): room for merging, "
        "deduplication and diversity.",
    )
    mmr_lambda: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Maximal marginal relevance: 1 ranks by relevance only, lower values "
        "favour chunks unlike those already chosen.",
    )
    duplicate_similarity: float = Field(
        0.97,
        gt=0,
        le=1,
        description="Passages at least this similar (cosine of hashed word counts) to one "
        "already chosen are dropped as near-duplicates.",
    )
    reranker: str | None = Field(
        None,
        description="Import path of a reranker, 'pkg.mod:Name', called with (query, hits) "
        "before assembly; none: keep the index order.",
    )


class SafetySettings(_Frozen):
    """Indirect prompt injection: instructions hidden in retrieved text."""

    injection_policy: Literal["neutralize", "drop", "allow"] = Field(
        "neutralize",
        description="What happens to a chunk that holds instructions: 'neutralize' (the "
        "instructions are blanked), 'drop' (the chunk is left out) or 'allow' (flagged only).",
    )
    audit_log: Path | None = Field(
        None, description="JSONL of flagged chunks and decisions; default: <state_dir>/audit.jsonl."
    )


class AnswerSettings(_Frozen):
    """``/v1/answer`` and ``/v1/chat/completions``: cache, context and prompt safety."""

    extractive_sentences: int = Field(
        3, ge=1, description="Sentences in an extractive answer (no LLM configured)."
    )
    cache: CacheSettings = CacheSettings()
    context: ContextSettings = ContextSettings()
    safety: SafetySettings = SafetySettings()
