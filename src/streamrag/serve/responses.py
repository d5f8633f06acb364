"""Response bodies of the HTTP API, as the OpenAPI description shows them.

The routes encode their answers themselves (msgspec, for speed), so these
models are not used to build responses: they *describe* them, and the API's
conformance test (schemathesis against the served description) checks that
every response a route really sends fits its model. Bodies that are open by
nature — the job's status, an LLM's token usage, the generations' switch log —
allow keys beyond the ones listed (``extra="allow"``); the rest list every key.

:data:`ERRORS` holds the error responses (OpenAI's error object, see
:mod:`streamrag.serve.errors`) a route declares with ``responses=errors(...)``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from streamrag.serve.schemas import RetrievedChunk, RetrieveResponse

__all__ = [
    "ERRORS",
    "AnswerResponse",
    "ChatCompletion",
    "EmbeddingsResponse",
    "ErrorResponse",
    "GenerationsStatus",
    "Health",
    "ModelList",
    "PushReceipt",
    "RetrieveResponse",
    "RetrievedChunk",
    "RollbackResponse",
    "StatusResponse",
    "ValidationErrorResponse",
    "WindowAggregation",
    "WindowsResponse",
    "errors",
    "event_stream",
]


class _Closed(BaseModel):
    """A body whose keys are all listed."""

    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A body that may carry keys beyond the ones listed."""

    model_config = ConfigDict(extra="allow")


# -- errors -------------------------------------------------------------------------

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "upstream_error",
    "server_error",
]


class ErrorObject(_Closed):
    """What went wrong: OpenAI's error object."""

    message: str = Field(..., description="What was expected and what to do.")
    type: ErrorType = Field(..., description="The category of the error.")
    param: str | None = Field(
        ..., description="The field at fault, as a path (filters.tenant, messages[0].role)."
    )
    code: str = Field(..., description="A stable name of the error.", examples=["query_error"])


class FieldError(_Closed):
    """One field that failed validation."""

    param: str | None = Field(..., description="The field, as a path; null for the whole body.")
    message: str
    code: str = Field(..., description="The check that failed (pydantic's name for it).")


class ValidationErrorObject(ErrorObject):
    """A validation error: the first failing field, and every one in ``errors``."""

    errors: list[FieldError]


class ErrorResponse(_Closed):
    """Every error answer (and every ``error`` event of a stream)."""

    error: ErrorObject


class ValidationErrorResponse(_Closed):
    """A 422: the request does not fit its schema."""

    error: ValidationErrorObject


_WHEN = {
    400: "The request is well-formed but cannot be answered as asked.",
    401: "No API key, or one the server does not know.",
    403: "The API key may not do this (its role, or another tenant).",
    404: "The name in the path does not exist.",
    409: "The request conflicts with the job's state.",
    413: "The body is over serve.max_body_bytes.",
    422: "The request does not fit its schema.",
    429: "Too busy, or over the key's limits: retry after Retry-After seconds.",
    500: "The server failed; its log has the details.",
    502: "The LLM endpoint failed.",
}


def _error_response(status: int) -> dict[str, Any]:
    model = ValidationErrorResponse if status == 422 else ErrorResponse
    out: dict[str, Any] = {"model": model, "description": _WHEN[status]}
    if status == 429:
        out["headers"] = {
            "Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}
        }
    if status == 401:
        out["headers"] = {
            "WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}
        }
    return out


ERRORS: dict[int, dict[str, Any]] = {s: _error_response(s) for s in _WHEN}
"""The OpenAPI response of each error status."""

_EVERY_ROUTE = (401, 403, 429, 500)
"""What any route behind the key check may answer."""


def errors(*statuses: int, open_route: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: these error statuses, and those every route may answer.

    ``open_route``: served without a key (only a 500 is added).
    """
    common = (500,) if open_route else _EVERY_ROUTE
    return {s: ERRORS[s] for s in sorted({*statuses, *common})}


SSE_EVENT = {
    "type": "object",
    "description": "One server-sent event: its name and its data (a JSON document, or [DONE]).",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}
"""One event of a ``text/event-stream`` body: before OpenAPI 3.2 (``itemSchema``), a
sequential media type's ``schema`` describes each event, not the whole stream."""


def event_stream(description: str) -> dict[int | str, dict[str, Any]]:
    """A 200 that may also come as server-sent events (``text/event-stream``)."""
    return {
        200: {
            "description": description,
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        }
    }


# -- /v1/answer ----------------------------------------------------------------------


class Citation(_Closed):
    """A passage an answer cites as ``[index]``: where it came from, to find and check it."""

    index: int
    doc_id: str
    tenant: str
    domain: str
    version: str = Field(..., description="The document version: event_time_us:offset.")
    event_time: str
    epoch: int
    chunk_ids: list[str]
    positions: list[int]
    source: str
    offset: int
    score: float


class ContextFigures(_Closed):
    """How the context was assembled."""

    passages: int
    tokens: int
    budget: int
    tokenizer: str
    truncated: bool
    dropped: dict[str, int] = Field(..., description="Passages left out, by reason.")


class Safety(_Closed):
    """What prompt-injection screening found and did."""

    policy: str
    flagged: list[dict[str, Any]]


class _AnswerMeta(_Closed):
    id: str = Field(..., description="The request id (also in the safety audit log).")
    epoch: int = Field(..., description="The index epoch every citation was read from.")
    cached: Literal["exact", "near"] | None = Field(
        ..., description="Whether the answer came from the semantic cache, and how."
    )
    cached_question: str | None = Field(
        None, description="The question a near-duplicate cache hit answered."
    )
    citations: list[Citation]
    context: ContextFigures
    safety: Safety
    generator: Literal["llm", "extractive"]
    model: str | None
    fallback_reason: str | None = Field(..., description="Why the LLM was not used, if it failed.")
    note: str | None


class AnswerResponse(_AnswerMeta):
    """``POST /v1/answer``: an answer with its citations (also the ``done`` event of a stream)."""

    answer: str
    finish_reason: str = Field(
        ..., description="Why the answer ended: stop, or length (cut at max_tokens)."
    )
    usage: dict[str, Any] | None = Field(..., description="Token usage as the LLM reported it.")
    took_ms: float


# -- OpenAI-compatible routes ---------------------------------------------------------


class StreamragBlock(_Closed):
    """What streamrag adds to an OpenAI response: citations, epoch, safety, generator."""

    id: str
    epoch: int
    cached: Literal["exact", "near"] | None
    citations: list[Citation]
    context: ContextFigures
    safety: Safety
    generator: Literal["llm", "extractive"]
    fallback_reason: str | None
    note: str | None


class AssistantMessage(_Closed):
    """The answer, as a message."""

    role: Literal["assistant"]
    content: str


class Choice(_Closed):
    """The one choice of a completion."""

    index: int
    message: AssistantMessage
    finish_reason: str = Field(..., description="stop, or length (cut at max_tokens).")


class CompletionUsage(_Closed):
    """Tokens of the prompt and of the completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Closed):
    """``POST /v1/chat/completions``: OpenAI's chat completion, with a ``streamrag`` block."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    streamrag: StreamragBlock


class Embedding(_Closed):
    """One vector: floats, or base64 of little-endian float32."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(_Closed):
    """Tokens embedded."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(_Closed):
    """``POST /v1/embeddings``: one vector per input, in order."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Model(_Closed):
    """A model this server offers."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Closed):
    """``GET /v1/models``."""

    object: Literal["list"]
    data: list[Model]


# -- the job --------------------------------------------------------------------------


class PushReceipt(_Open):
    """``POST /v1/documents``: what was taken, and the epoch once committed."""

    accepted: int = Field(..., description="Changes journaled now.")
    duplicates: int = Field(..., description="Changes whose idempotency key was seen before.")
    committed: bool
    epoch: int | None = Field(..., description="The epoch that made them visible (when waited).")


class StatusResponse(_Open):
    """``GET /v1/status``: epoch, watermark, counts, lag and freshness (more keys as they come).

    A key that is not an admin's gets its tenant's view: ``tenant``, and none of
    the keys that hold other tenants' names or numbers (counts, index, sources).
    """

    epoch: int
    watermark: str | None
    ingest_lag: dict[str, Any]
    freshness: dict[str, Any]
    embedder: str
    uptime_s: float
    tenant: str | None = Field(None, description="The key's tenant, in a tenant's view.")
    counts: dict[str, Any] | None = Field(None, description="Ingested, applied, dead-lettered.")
    index: dict[str, Any] | None = Field(None, description="Live and deleted documents.")
    answers: dict[str, Any] | None = Field(None, description="How answers are made.")


class WindowRow(_Closed):
    """One window's latest result for one key."""

    key: Any = Field(..., description="The key: one value, or a list for a compound key.")
    start: str
    end: str
    value: Any
    timing: str = Field(..., description="early, on_time or late.")
    pane: int = Field(..., description="The window's firings so far, from 0.")


class WindowAggregation(_Closed):
    """``GET /v1/windows/NAME``: what an aggregation computes, and its latest results."""

    aggregate: str
    key: list[str]
    value: str | None
    allowed_lateness_ms: float
    open_windows: int | None = Field(
        ..., description="Windows still open, every tenant's (admin keys, or no keys)."
    )
    results: list[WindowRow]


class WindowsResponse(_Closed):
    """``GET /v1/windows``: every window aggregation."""

    watermark: str | None
    windows: dict[str, WindowAggregation]


class RollbackResponse(_Closed):
    """``POST /v1/admin/rollback``: the new epoch, and whether anything changed."""

    epoch: int
    restored_from: int
    changed: bool
    message: str | None = Field(None, description="Why nothing changed, when nothing did.")


class GenerationsStatus(_Open):
    """``/v1/admin/generations``: the index generations, the one serving, a migration's progress."""

    serving: int
    generations: list[dict[str, Any]]
    switches: list[dict[str, Any]]
    building: dict[str, Any] | None = Field(None, description="The generation being built.")


class Health(_Closed):
    """``GET /healthz``."""

    status: Literal["ok"]
