"""One error shape for every route, and the bound on request bodies.

Every error response is ``{"error": {"type", "message", "details"?}}``: ``type``
names the kind (``ValidationError``, ``QueryError``, ``RequestTooLarge``, …),
``message`` says what was expected and what to do, and ``details`` (validation
errors only) lists each field that failed — by location and reason, never with
the value sent, which may be huge, binary or secret.

>>> error_body("QueryError", "k must be positive")
{'error': {'type': 'QueryError', 'message': 'k must be positive'}}
>>> failed = [{"loc": ("body", "k"), "msg": "must be > 0", "type": "gt", "input": -1}]
>>> body = validation_body(failed)
>>> body["error"]["message"], body["error"]["details"]
('body.k: must be > 0', [{'loc': ['body', 'k'], 'msg': 'must be > 0', 'type': 'gt'}])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streamrag.errors import (
    ConfigError,
    GeneratorError,
    IndexStoreError,
    OverloadedError,
    QueryError,
    StateError,
    StreamragError,
    UnknownNameError,
)

__all__ = ["BodyLimit", "error_body", "error_response", "status_of", "validation_body"]

_JSON = [(b"content-type", b"application/json")]


def error_body(kind: str, message: str, details: list[Any] | None = None) -> dict[str, Any]:
    """The body of an error response."""
    err: dict[str, Any] = {"type": kind, "message": message}
    if details is not None:
        err["details"] = details
    return {"error": err}


_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownNameError, 404),
    (OverloadedError, 429),
    (QueryError, 400),
    (IndexStoreError, 400),
    (StateError, 409),
    (ConfigError, 400),
    (GeneratorError, 502),
    (StreamragError, 500),
)
"""HTTP status by error class, most specific first."""


def status_of(exc: BaseException) -> int:
    """The HTTP status an error answers with.

    >>> status_of(QueryError("k must be positive")), status_of(RuntimeError())
    (400, 500)
    """
    if isinstance(exc, ValidationError):
        return 422
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)


def error_response(exc: BaseException, where: str = "the request") -> tuple[int, bytes]:
    """The one mapping of an error to an HTTP answer: ``(status, JSON body)``.

    A streamrag error shows its own message; a validation error lists the
    fields that failed; anything else is an internal error whose message
    names only its type (the server logs the rest).
    """
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        body = validation_body(errors)
    elif isinstance(exc, StreamragError):
        body = error_body(type(exc).__name__, str(exc))
    else:
        body = error_body(
            "InternalError", f"{type(exc).__name__} while answering {where}; the server logged it"
        )
    return status_of(exc), msgspec.json.encode(body)


def validation_body(errors: Sequence[Any]) -> dict[str, Any]:
    """A validation error's body from pydantic's error list (values sent left out)."""
    details = [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": e.get("type"),
        }
        for e in errors
    ]
    shown = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details[:3])
    more = f" (and {len(details) - 3} more)" if len(details) > 3 else ""
    return error_body("ValidationError", shown + more, details)


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
        import msgspec

        found = f"{size:,} bytes" if size is not None else "more than that"
        body = error_body(
            "RequestTooLarge",
            f"the request body is {found}; serve.max_body_bytes allows {self.max_bytes:,}. "
            "Send a shorter body (streamrag retrieves the documents itself), or raise the limit",
        )
        await send({"type": "http.response.start", "status": 413, "headers": _JSON})
        await send({"type": "http.response.body", "body": msgspec.json.encode(body)})
