"""Request and response bodies of the HTTP API, with a description and an example per field.

**Limits.** Every request is bounded, so that no single one can cost seconds of
work and hold up the others: a query of at most :data:`MAX_QUERY_CHARS`
characters, at most :data:`MAX_FILTER_KEYS` metadata conditions with at most
:data:`MAX_FILTER_VALUES` values each (the same bound for lists of document ids
and domains), at most :data:`MAX_MESSAGES` chat messages of at most
:data:`MAX_MESSAGE_CHARS` characters, at most :data:`MAX_EMBED_INPUTS` texts to
embed (or arrays of at most :data:`MAX_EMBED_TOKENS` token ids). A request over a
limit gets a 422 that names the limit. The body itself is bounded by
``serve.max_body_bytes`` (a 413).

**Types are strict**: a field takes the JSON type its schema names, and
nothing that merely converts to it (``"5"`` or ``true`` for a number), so
that what the OpenAPI description says is refused is refused. Times are the
exception that the description shows: an ISO-8601 string or epoch seconds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from streamrag.errors import RequestError
from streamrag.timing import US_PER_S, parse_timestamp

__all__ = [
    "MAX_EMBED_INPUTS",
    "MAX_EMBED_TOKENS",
    "MAX_FILTER_KEYS",
    "MAX_FILTER_VALUES",
    "MAX_MESSAGES",
    "MAX_MESSAGE_CHARS",
    "MAX_QUERY_CHARS",
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


MAX_QUERY_CHARS = 10_000
"""Longest query (characters)."""
MAX_FILTER_KEYS = 32
"""Most metadata conditions in one filter."""
MAX_FILTER_VALUES = 1_024
"""Most values in one list of a filter (document ids, domains, metadata values)."""
MAX_MESSAGES = 64
"""Most messages in one chat request."""
MAX_MESSAGE_CHARS = 65_536
"""Longest chat message (characters)."""
MAX_EMBED_INPUTS = 256
"""Most texts in one embeddings request (each at most MAX_QUERY_CHARS characters)."""
MAX_EMBED_TOKENS = 8_192
"""Most token ids in one input of an embeddings request (OpenAI's own bound)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class MetaRange(_Model):
    """A half-open numeric range ``[gte, lt)`` on one metadata key."""

    gte: float | None = Field(None, description="Lower bound (inclusive).", examples=[2020])
    lt: float | None = Field(None, description="Upper bound (exclusive).", examples=[2025])


MetaScalar = str | int | float | bool


class Filters(_Model):
    """Which documents a query may see. Applied before ranking."""

    tenant: str = Field(
        "default", min_length=1, description="Tenant to search.", examples=["default"]
    )
    domain: str | list[str] | None = Field(
        None,
        description=f"One domain or a list of up to {MAX_FILTER_VALUES:,}.",
        examples=["ops"],
    )
    doc_id: str | list[str] | None = Field(
        None,
        description=f"One document id or a list of up to {MAX_FILTER_VALUES:,}.",
        examples=["runbook-7"],
    )
    metadata: dict[str, MetaScalar | list[MetaScalar] | MetaRange] | None = Field(
        None,
        description="Conditions on the documents' metadata, all of which must hold: a value "
        "(equality), a list (any of), or {gte, lt} (numeric range).",
        examples=[{"lang": "en", "team": ["db", "sre"], "year": {"gte": 2020}}],
    )

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        if not value.strip():
            msg = "tenant is blank; omit it for the default tenant, or name a tenant"
            raise RequestError(msg)
        return value

    @field_validator("domain", "doc_id")
    @classmethod
    def _short_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_FILTER_VALUES:
            msg = (
                f"{len(value):,} values: a list holds at most {MAX_FILTER_VALUES:,}; split the "
                "request, or filter on metadata instead"
            )
            raise RequestError(msg)
        return value

    @field_validator("metadata")
    @classmethod
    def _few_keys(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if len(value) > MAX_FILTER_KEYS:
            msg = (
                f"{len(value):,} metadata conditions: a filter holds at most {MAX_FILTER_KEYS}; "
                "keep the ones that narrow the search most"
            )
            raise RequestError(msg)
        for key, cond in value.items():
            if isinstance(cond, list) and len(cond) > MAX_FILTER_VALUES:
                msg = (
                    f"metadata condition {key!r} lists {len(cond):,} values; at most "
                    f"{MAX_FILTER_VALUES:,}"
                )
                raise RequestError(msg)
        return value


_FIRST_S = -62_135_596_800
"""0001-01-01T00:00:00Z in epoch seconds: the earliest time a request may name."""
_LAST_S = 253_402_300_799
"""9999-12-31T23:59:59Z in epoch seconds: the latest."""


def _in_years_1_to_9999(us: int) -> int:
    """Refuse a time outside years 1–9999 (UTC), which no answer could show."""
    if not _FIRST_S * US_PER_S <= us < (_LAST_S + 1) * US_PER_S:
        msg = (
            f"{us / US_PER_S:.0f} epoch seconds (UTC) is outside years 1–9999; send a time "
            "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"
        )
        raise RequestError(msg)
    return us


EventTime = Annotated[
    int,
    BeforeValidator(parse_timestamp),
    AfterValidator(_in_years_1_to_9999),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "number", "minimum": _FIRST_S, "maximum": _LAST_S},
            ]
        }
    ),
]
"""An event time as requests send it: ISO-8601 with a zone, or epoch seconds (int or float).

Parsed to microseconds since the epoch (:func:`~streamrag.timing.parse_timestamp`),
within years 1–9999 in UTC; the API description shows what is sent, not the
integer it becomes.
"""


class TimeRange(_Model):
    """A half-open range ``[start, end)`` on the documents' event time."""

    start: EventTime | None = Field(
        None,
        description="ISO-8601 time with a zone, or epoch seconds; omitted = unbounded.",
        examples=["2024-05-01T00:00:00Z"],
    )
    end: EventTime | None = Field(
        None,
        description="ISO-8601 time with a zone, or epoch seconds; omitted = unbounded.",
        examples=["2024-06-01T00:00:00Z"],
    )


class RetrievalOptions(_Model):
    """What a query may see and how many chunks it gets: ``k``, filters, time, version."""

    k: int = Field(5, ge=1, description="How many chunks to return.", examples=[5])
    filters: Filters = Field(default_factory=Filters, description="Tenant, domain, doc id.")
    time_range: TimeRange | None = Field(None, description="Event-time range of documents.")
    as_of: EventTime | None = Field(
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


class RetrieveRequest(RetrievalOptions):
    """``POST /v1/retrieve``: find the chunks closest to a query."""

    query: str = Field(
        ...,
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        description=f"Question or keywords (at most {MAX_QUERY_CHARS:,} characters).",
        examples=["how do I rotate the database password?"],
    )

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            msg = "query is blank; send a question or keywords"
            raise RequestError(msg)
        return value


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
    generation: int = Field(
        1, description="The index generation (embedding model) every result was read from."
    )
    took_ms: float
    results: list[RetrievedChunk]


class RollbackRequest(_Model):
    """``POST /v1/admin/rollback``: make an earlier epoch's documents current again."""

    epoch: int = Field(..., ge=0, description="The epoch to restore.", examples=[20])


class ReindexRequest(_Model):
    """``POST /v1/admin/reindex``: build a generation for another embedding model."""

    embedder: str = Field(
        ..., alias="class", description="The new embedder: a registered name or an import path."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Its keyword arguments.")
    switch: bool = Field(True, description="Serve the new generation as soon as it is filled.")


class GenerationRequest(_Model):
    """``POST /v1/admin/generations/switch`` or ``.../drop``: act on one generation."""

    generation: int | None = Field(
        None, ge=1, description="Its number (switch: the one being built, by default)."
    )


class PushRequest(_Model):
    """``POST /v1/documents``: upserts and deletes, journaled before the answer.

    Each change is a streamrag change (``doc_id``, ``op`` upsert or delete,
    ``text``, ``event_time`` — now when left out —, ``tenant``, ``title``,
    ``domain``, ``metadata``) and may carry an ``idempotency_key``: a change
    whose key was seen before is not applied again.
    """

    changes: list[dict[str, Any]] = Field(
        ...,
        min_length=1,
        description="The changes, in order.",
        examples=[[{"doc_id": "kb-1", "text": "Reset the router.", "idempotency_key": "kb-1@v3"}]],
    )
    wait_for_commit: bool = Field(
        False,
        description="Answer only once the changes are committed, with the epoch that made "
        "them visible (200); else at once, once they are journaled (202).",
    )
    timeout_s: float | None = Field(
        None, gt=0, le=300, description="Longest wait for the commit (push.wait_timeout_s)."
    )


class _OpenAIModel(BaseModel):
    """OpenAI-compatible bodies accept and ignore parameters streamrag does not use."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class ContentPart(_OpenAIModel):
    """One part of a message's content; only text parts are used."""

    type: str = "text"
    text: str | None = None


class ChatMessage(_OpenAIModel):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> ChatMessage:
        size = len(self.text())
        if size > MAX_MESSAGE_CHARS:
            msg = (
                f"a message of {size:,} characters: at most {MAX_MESSAGE_CHARS:,} per message; "
                "send the question, not the documents (streamrag retrieves those)"
            )
            raise RequestError(msg)
        return self

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
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=MAX_MESSAGES)
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
    """``POST /v1/embeddings``: vectors from the index's own embedder.

    ``input`` takes what OpenAI's route takes: a text, a list of texts, one
    array of token ids, or a list of them. Token ids are cl100k_base's (what
    OpenAI's embedding models, and so LangChain's ``OpenAIEmbeddings``, send);
    the route decodes them to text (the ``tiktoken`` extra). Here only the
    shape is checked; whether each id exists is the route's check (a 400).
    """

    input: str | list[str] | list[int] | list[list[int]] = Field(
        ...,
        description=f"A text, a list of up to {MAX_EMBED_INPUTS} texts of up to "
        f"{MAX_QUERY_CHARS:,} characters, an array of up to {MAX_EMBED_TOKENS:,} cl100k_base "
        f"token ids, or a list of up to {MAX_EMBED_INPUTS} such arrays.",
        examples=["rotate the database password", [[5564, 279, 4729, 3636]]],
    )

    @field_validator("input", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        if isinstance(value, str) or not isinstance(value, list):
            return value  # a text, or a type pydantic refuses with its own message
        kinds = {_input_kind(v) for v in value}
        if kinds <= {"text"} or kinds == {"id"} or kinds == {"ids"}:
            return value
        bad = next((i for i, v in enumerate(value) if _input_kind(v) == "other"), None)
        if bad is not None:
            found = _input_kind_name(value[bad])
            msg = (
                f"input[{bad}] is {found}; input is a text, a list of texts, an array of "
                "token ids (integers) or a list of such arrays"
            )
        else:
            msg = (
                "input mixes " + " and ".join(sorted(_KIND_NAMES[k] for k in kinds)) + "; send "
                "one kind: texts, one array of token ids, or a list of token-id arrays"
            )
        raise RequestError(msg)

    @field_validator("input")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if isinstance(value, str):
            inputs: list[Any] = [value]
        elif value and isinstance(value[0], int):
            inputs = [value]  # one array of token ids
        else:
            inputs = value
        if len(inputs) > MAX_EMBED_INPUTS:
            msg = f"{len(inputs):,} inputs: at most {MAX_EMBED_INPUTS} per request"
            raise RequestError(msg)
        for i, t in enumerate(inputs):
            if isinstance(t, str) and len(t) > MAX_QUERY_CHARS:
                msg = f"an input of {len(t):,} characters: at most {MAX_QUERY_CHARS:,}"
                raise RequestError(msg)
            if isinstance(t, list) and len(t) > MAX_EMBED_TOKENS:
                msg = (
                    f"input {i} holds {len(t):,} token ids: at most {MAX_EMBED_TOKENS:,} per "
                    "input; split it into shorter windows"
                )
                raise RequestError(msg)
        return value

    model: str = Field("", description="Echoed back; the configured embedder is used.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, gt=0)


_KIND_NAMES = {"text": "texts", "id": "token ids", "ids": "arrays of token ids"}


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _input_kind(value: Any) -> str:
    """What one item of a list ``input`` is: a text, a token id, an array of ids, or other."""
    if isinstance(value, str):
        return "text"
    if _is_id(value):
        return "id"
    if isinstance(value, list) and all(_is_id(v) for v in value):
        return "ids"
    return "other"


def _input_kind_name(value: Any) -> str:
    """How an error message names an item that is neither a text nor a token id."""
    if isinstance(value, list):
        bad = next(v for v in value if not _is_id(v))
        return f"an array holding {_input_kind_name(bad)}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, float):
        return f"the number {value!r}"
    return "null" if value is None else f"a {type(value).__name__}"
