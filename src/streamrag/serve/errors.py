"""One error shape for every route — OpenAI's — and the bound on request bodies.

Every error response, and every ``error`` event of a stream, is the object
OpenAI's API answers with, so that the stock ``openai`` client (and every tool
built on it) shows the reason instead of a bare status code::

    {"error": {"message": "k=500 is above serve.max_k=100; ask for fewer results",
               "type": "invalid_request_error", "param": null, "code": "query_error"}}

* ``message`` says what was expected and what to do. It never holds a Python
  class name, a stack trace, or the value that was sent (which may be huge,
  binary or secret).
* ``type`` is the category, as OpenAI names them: ``invalid_request_error``
  (400, 413, 422), ``authentication_error`` (401), ``permission_error`` (403),
  ``not_found_error`` (404), ``conflict_error`` (409), ``rate_limit_error``
  (429), ``upstream_error`` (502: the LLM endpoint failed) and ``server_error``
  (500).
* ``code`` is a stable snake_case name of the specific error
  (``validation_error``, ``query_error``, ``request_too_large``,
  ``unknown_name``, ``overloaded``, ``invalid_api_key``, …): what a program
  matches on. :data:`KINDS` lists them all.
* ``param`` is the failing field as a path into the request body —
  ``filters.tenant``, ``k``, ``messages[0].role`` — or ``null`` when no one
  field is at fault.

A validation error (422) also carries ``errors``: every field that failed, each
as ``{"param", "message", "code"}`` (the code is pydantic's name of the check).
OpenAI's clients keep unknown keys of an error (``exc.body["errors"]`` in the
Python client) and show ``message``, which names the first three; the list is
kept because one request often fails several checks at once.

>>> error_body("k must be positive", code="query_error")
{'error': {'message': 'k must be positive', 'type': 'invalid_request_error', 'param': None, \
'code': 'query_error'}}
>>> failed = [{"loc": ("body", "k"), "msg": "must be > 0", "type": "gt", "input": -1}]
>>> err = validation_body(failed, located=True)["error"]
>>> err["message"], err["param"], err["errors"]
('k: must be > 0', 'k', [{'param': 'k', 'message': 'must be > 0', 'code': 'gt'}])
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamrag.errors import (
    AuthenticationError,
    CircuitOpenError,
    ConfigError,
    CorruptStateError,
    EmbedderError,
    GeneratorError,
    GeneratorTimeoutError,
    IndexStoreError,
    MissingDependencyError,
    OverloadedError,
    PermissionDeniedError,
    QueryError,
    QueryTimeoutError,
    RequestError,
    StateError,
    StreamragError,
    UnknownNameError,
)

__all__ = [
    "CODES",
    "KINDS",
    "BodyLimit",
    "ErrorKind",
    "error_body",
    "error_object",
    "error_response",
    "http_error",
    "kind_of",
    "status_of",
    "validation_body",
]

_JSON = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """How one kind of error answers: its HTTP status, OpenAI ``type`` and stable ``code``."""

    status: int
    type: str
    code: str


VALIDATION = ErrorKind(422, "invalid_request_error", "validation_error")
"""A request body, query or path parameter fails its schema."""
TOO_LARGE = ErrorKind(413, "invalid_request_error", "request_too_large")
"""A request body over ``serve.max_body_bytes``."""
INTERNAL = ErrorKind(500, "server_error", "internal_error")
"""Anything not raised on purpose: a bug, logged by the server."""

KINDS: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (AuthenticationError, ErrorKind(401, "authentication_error", "invalid_api_key")),
    (PermissionDeniedError, ErrorKind(403, "permission_error", "permission_denied")),
    (UnknownNameError, ErrorKind(404, "not_found_error", "unknown_name")),
    (QueryTimeoutError, ErrorKind(429, "rate_limit_error", "query_timeout")),
    (OverloadedError, ErrorKind(429, "rate_limit_error", "overloaded")),
    (RequestError, ErrorKind(400, "invalid_request_error", "invalid_value")),
    (QueryError, ErrorKind(400, "invalid_request_error", "query_error")),
    (CorruptStateError, ErrorKind(500, "server_error", "corrupt_state")),
    (IndexStoreError, ErrorKind(400, "invalid_request_error", "index_refused")),
    (StateError, ErrorKind(409, "conflict_error", "conflict")),
    (ConfigError, ErrorKind(400, "invalid_request_error", "config_error")),
    (CircuitOpenError, ErrorKind(502, "upstream_error", "llm_circuit_open")),
    (GeneratorTimeoutError, ErrorKind(502, "upstream_error", "llm_timeout")),
    (GeneratorError, ErrorKind(502, "upstream_error", "llm_error")),
    (EmbedderError, ErrorKind(500, "server_error", "embedder_error")),
    (MissingDependencyError, ErrorKind(500, "server_error", "missing_dependency")),
    (StreamragError, INTERNAL),
)
"""Status, type and code by error class, most specific first."""

CODES: dict[str, ErrorKind] = {
    k.code: k for k in (VALIDATION, TOO_LARGE, INTERNAL, *(kind for _, kind in KINDS))
}
"""Every code an error may carry, with its status and type."""

_TYPE_OF_STATUS = {k.status: k.type for _, k in reversed(KINDS)} | {422: VALIDATION.type}


def kind_of(exc: BaseException) -> ErrorKind:
    """The status, type and code an error answers with.

    >>> kind_of(QueryError("k must be positive"))
    ErrorKind(status=400, type='invalid_request_error', code='query_error')
    >>> kind_of(RuntimeError()).code
    'internal_error'
    """
    if isinstance(exc, ValidationError):
        return VALIDATION
    return next((kind for cls, kind in KINDS if isinstance(exc, cls)), INTERNAL)


def status_of(exc: BaseException) -> int:
    """The HTTP status an error answers with.

    >>> status_of(QueryError("k must be positive")), status_of(RuntimeError())
    (400, 500)
    """
    return kind_of(exc).status


def error_object(
    message: str,
    *,
    code: str,
    type: str | None = None,  # OpenAI's name for it
    param: str | None = None,
) -> dict[str, Any]:
    """The inner object of an error: ``{"message", "type", "param", "code"}``.

    ``type`` defaults to the category of ``code`` (see :data:`CODES`).
    """
    kind = type if type is not None else CODES[code].type
    return {"message": message, "type": kind, "param": param, "code": code}


def error_body(
    message: str,
    *,
    code: str,
    type: str | None = None,  # OpenAI's name for it
    param: str | None = None,
) -> dict[str, Any]:
    """The body of an error response: ``{"error": error_object(...)}``."""
    return {"error": error_object(message, code=code, type=type, param=param)}


def error_response(exc: BaseException, where: str = "the request") -> tuple[int, bytes]:
    """The one mapping of an error to an HTTP answer: ``(status, JSON body)``.

    A streamrag error shows its own message; a validation error lists the
    fields that failed; anything else is an internal error whose message says
    only where it happened (the server logs the rest).
    """
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        return VALIDATION.status, msgspec.json.encode(validation_body(errors))
    kind = kind_of(exc)
    if isinstance(exc, StreamragError):
        message = str(exc)
    else:
        message = f"the server failed while answering {where}; its log has the details"
    return kind.status, msgspec.json.encode(error_body(message, code=kind.code, type=kind.type))


def http_error(
    status: int, method: str, path: str, *, allow: str | None = None, detail: str = ""
) -> tuple[int, dict[str, Any]]:
    """The answer to an HTTP error of routing itself: ``(status, body)``.

    No such route (404), the wrong method (405, naming the methods it takes),
    or a body FastAPI could not decode at all (its 400, answered as the 422 of
    any body that is not JSON).

    >>> http_error(405, "GET", "/v1/retrieve", allow="POST")[1]["error"]["message"]
    'GET /v1/retrieve is not allowed; this path takes POST'
    """
    route = f"{method} {path}"
    if status == 404:
        message = f"there is no route {route}; the routes are listed at /docs and /openapi.json"
        return 404, error_body(message, code="no_such_route", type="not_found_error")
    if status == 405:
        message = f"{route} is not allowed; this path takes {allow or 'another method'}"
        return 405, error_body(message, code="method_not_allowed", type="invalid_request_error")
    if status == 400:  # FastAPI: "There was an error parsing the body"
        reason = {"msg": "it cannot be read as UTF-8 JSON", "type": "json_invalid"}
        return VALIDATION.status, validation_body([reason])
    kind = _TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return status, error_body(f"{route}: {detail}", code=f"http_{status}", type=kind)


# -- validation errors ---------------------------------------------------------------

_WHERE = frozenset({"body", "query", "path", "header", "cookie"})
"""The first element of a FastAPI error location: where the field was sent."""
_UNION_TAG = re.compile(
    r"^(str|int|float|bool|none|bytes|[a-z-]+\[.*\]|[A-Z][A-Za-z0-9_]*)$",
)
"""How pydantic names a member of a union in a location (``str``, ``list[str]``, ``MetaRange``)."""
_VALUE_ERROR = "Value error, "


def validation_body(errors: Sequence[Any], *, located: bool = False) -> dict[str, Any]:
    """A validation error's body from pydantic's error list (the values sent left out).

    ``located``: each location starts with where the field was sent (``body``,
    ``query``, ``path``), as FastAPI's do; that part is left out of ``param``.
    """
    paths = _params([tuple(e.get("loc", ())) for e in errors], located=located)
    fields: list[dict[str, str | None]] = []
    shown_parts: list[str] = []
    for e, param in zip(errors, paths, strict=True):
        msg = str(e.get("msg", "")).removeprefix(_VALUE_ERROR)
        if e.get("type") == "json_invalid":
            msg = _not_json(e)
        fields.append({"param": param, "message": msg, "code": str(e.get("type") or "invalid")})
        shown_parts.append(f"{param}: {msg}" if param else msg)
    shown = "; ".join(shown_parts[:3])
    more = f" (and {len(fields) - 3} more)" if len(fields) > 3 else ""
    body = error_body(
        (shown or "the request is not valid") + more,
        code=VALIDATION.code,
        type=VALIDATION.type,
        param=fields[0]["param"] if fields else None,
    )
    body["error"]["errors"] = fields
    return body


def _not_json(e: Any) -> str:
    """What to do about a body that does not parse (pydantic's words, or FastAPI's reason)."""
    ctx = e.get("ctx") or {}
    reason = str(ctx.get("error") or e.get("msg", "")).removeprefix("Invalid JSON: ")
    return f"the body is not valid JSON ({reason}); send one JSON object"


def _params(locs: list[tuple[Any, ...]], *, located: bool) -> list[str | None]:
    """Each location as a field path, without FastAPI's ``body`` and pydantic's union tags.

    A union tag (``str`` in ``("filters", "domain", "str")``) is told from a
    field or key by its form *and* by a sibling error that differs at the same
    place: pydantic reports a failed union once per member.
    """
    out: list[str | None] = []
    for loc in locs:
        parts: list[str] = []
        for i, part in enumerate(loc):
            if i == 0 and located and part in _WHERE:
                continue
            if isinstance(part, int):
                if not parts:  # a position in the raw JSON text, not a field
                    break
                parts[-1] += f"[{part}]"
            elif not _is_union_tag(loc, i, locs):
                parts.append(str(part))
        out.append(".".join(parts) or None)
    return out


def _is_union_tag(loc: tuple[Any, ...], i: int, locs: list[tuple[Any, ...]]) -> bool:
    part = loc[i]
    if not isinstance(part, str) or not _UNION_TAG.match(part):
        return False
    siblings = {o[i] for o in locs if len(o) > i and o[:i] == loc[:i]}
    return len(siblings) > 1 and all(isinstance(s, str) and _UNION_TAG.match(s) for s in siblings)


# -- the body bound --------------------------------------------------------------------


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` with a 413.

    The body is read (up to the limit) before the route sees it and handed on
    unchanged, so no route ever buffers more than the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check one request's body size; pass it on, or answer 413."""
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, int(declared))
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send, None)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        whole = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: int | None) -> None:
        found = f"{size:,} bytes" if size is not None else "more than that"
        body = error_body(
            f"the request body is {found}; serve.max_body_bytes allows {self.max_bytes:,}. "
            "Send a shorter body (streamrag retrieves the documents itself), or raise the limit",
            code=TOO_LARGE.code,
            type=TOO_LARGE.type,
        )
        await send({"type": "http.response.start", "status": 413, "headers": _JSON})
        await send({"type": "http.response.body", "body": msgspec.json.encode(body)})
