"""Request and response bodies of the HTTP API, with a description and an example per field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from streamrag.timing import parse_timestamp

__all__ = [
    "AnswerRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "EmbeddingsRequest",
    "Filters",
    "MetaRange",
    "RetrievalOptions",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrievedChunk",
    "RollbackRequest",
    "TimeRange",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetaRange(_Model):
    """A half-open numeric range ``[gte, lt)`` on one metadata key."""

    gte: float | None = Field(None, description="Lower bound (inclusive).", examples=[2020])
    lt: float | None = Field(None, description="Upper bound (exclusive).", examples=[2025])


MetaScalar = str | int | float | bool


class Filters(_Model):
    """Which documents a query may see. Applied before ranking."""

    tenant: str = Field("default", description="Tenant to search.", examples=["default"])
    domain: str | list[str] | None = Field(
        None, description="One domain or a list of domains.", examples=["ops"]
    )
    doc_id: str | list[str] | None = Field(
        None, description="One document id or a list.", examples=["runbook-7"]
    )
    metadata: dict[str, MetaScalar | list[MetaScalar] | MetaRange] | None = Field(
        None,
        description="Conditions on the documents' metadata, all of which must hold: a value "
        "(equality), a list (any of), or {gte, lt} (numeric range).",
        examples=[{"lang": "en", "team": ["db", "sre"], "year": {"gte": 2020}}],
    )


class TimeRange(_Model):
    """A half-open range ``[start, end)`` on the documents' event time."""

    start: int | None = Field(
        None,
        description="ISO-8601 time with a zone, or epoch seconds; omitted = unbounded.",
        examples=["2024-05-01T00:00:00Z"],
    )
    end: int | None = Field(
        None,
        description="ISO-8601 time with a zone, or epoch seconds; omitted = unbounded.",
        examples=["2024-06-01T00:00:00Z"],
    )

    @field_validator("start", "end", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> int | None:
        if value is None:
            return None
        return parse_timestamp(value)


class RetrievalOptions(_Model):
    """What a query may see and how many chunks it gets: ``k``, filters, time, version."""

    k: int = Field(5, ge=1, description="How many chunks to return.", examples=[5])
    filters: Filters = Field(default_factory=Filters, description="Tenant, domain, doc id.")
    time_range: TimeRange | None = Field(None, description="Event-time range of documents.")
    as_of: int | None = Field(
        None,
        description="Answer with the documents as they were at this event time (ISO-8601 with "
        "a zone, or epoch seconds), within the index's retained history.",
        examples=["2024-06-01T00:00:00Z"],
    )
    epoch: int | None = Field(
        None,
        ge=0,
        description="Read this exact committed epoch (reproducible answers).",
        examples=[42],
    )

    @field_validator("as_of", mode="before")
    @classmethod
    def _parse_as_of(cls, value: Any) -> int | None:
        if value is None:
            return None
        return parse_timestamp(value)


class RetrieveRequest(RetrievalOptions):
    """``POST /v1/retrieve``: find the chunks closest to a query."""

    query: str = Field(
        ...,
        min_length=1,
        max_length=10_000,
        description="Question or keywords.",
        examples=["how do I rotate the database password?"],
    )


class AnswerRequest(RetrieveRequest):
    """``POST /v1/answer``: answer a question from the index, with citations.

    ``k`` is the most passages the answer may draw on.
    """

    stream: bool = Field(
        False, description="Send the answer as server-sent events (meta, delta…, done)."
    )
    max_tokens: int | None = Field(
        None, gt=0, description="Longest answer in tokens (default: llm.max_tokens)."
    )
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature (default: llm.temperature)."
    )
    cache: bool = Field(True, description="Allow an answer from the semantic cache.")


class RetrievedChunk(_Model):
    """One chunk, its score and where it came from."""

    chunk_id: str = Field(..., description="Stable id (hex) of (tenant, doc_id, position).")
    doc_id: str
    tenant: str
    domain: str
    position: int = Field(..., description="Index of the chunk within its document.")
    score: float = Field(..., description="Inner product of unit vectors (cosine).")
    text: str
    event_time: str = Field(..., description="Event time of the document version (UTC).")
    source: str = Field(..., description="Where the change was read.")
    offset: int = Field(..., description="Offset of the change in its source.")
    epoch: int = Field(..., description="Epoch that committed this chunk.")
    embedder: str = Field(..., description="Embedder version that made its vector.")
    metadata: dict[str, Any] | None = Field(None, description="The document's metadata.")


class RetrieveResponse(_Model):
    """The chunks found, read from one committed epoch."""

    epoch: int = Field(..., description="The index epoch every result was read from.")
    took_ms: float
    results: list[RetrievedChunk]


class RollbackRequest(_Model):
    """``POST /v1/admin/rollback``: make an earlier epoch's documents current again."""

    epoch: int = Field(..., ge=0, description="The epoch to restore.", examples=[41])


class _OpenAIModel(BaseModel):
    """OpenAI-compatible bodies accept and ignore parameters streamrag does not use."""

    model_config = ConfigDict(extra="ignore")


class ContentPart(_OpenAIModel):
    """One part of a message's content; only text parts are used."""

    type: str = "text"
    text: str | None = None


class ChatMessage(_OpenAIModel):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(_OpenAIModel):
    """``stream_options``: whether the last chunk carries token usage."""

    include_usage: bool = False


class ChatCompletionRequest(_OpenAIModel):
    """``POST /v1/chat/completions``: OpenAI's request, answered with retrieval.

    The last user message is the question. Retrieval options go in the extra
    field ``streamrag`` (``extra_body={"streamrag": {...}}`` with the openai client).
    """

    model: str = Field("streamrag", description="Echoed back; the configured LLM answers.")
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    streamrag: RetrievalOptions = Field(
        default_factory=RetrievalOptions,
        description="k, filters, time_range, as_of, epoch of the retrieval.",
    )


class EmbeddingsRequest(_OpenAIModel):
    """``POST /v1/embeddings``: vectors from the index's own embedder."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="A text or a list of texts (token arrays are not accepted)."
    )
    model: str = Field("", description="Echoed back; the configured embedder is used.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)
