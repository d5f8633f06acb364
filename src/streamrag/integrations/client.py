r"""A small HTTP client for ``POST /v1/retrieve``, shared by the framework retrievers.

:class:`RetrieveClient` sends one query with its options — ``k``, ``filters``,
``time_range``, ``as_of``, ``epoch``, exactly as the route takes them — and
returns the :class:`Passage`\\ s found, each with its text, score and where it
came from. The LangChain and LlamaIndex retrievers of this package are thin
wrappers around it; it needs nothing but httpx, so it can be used on its own::

    client = RetrieveClient("http://127.0.0.1:8000")
    found = client.retrieve("how do I rotate the database password?", k=3,
                            filters={"domain": "ops"}, as_of="2024-08-10T00:00:00Z")
    for p in found.passages:
        print(p.score, p.doc_id, p.text)

**Times** (``as_of``, the ends of ``time_range``) are what the route takes —
ISO-8601 strings with a zone, or epoch seconds — or ``datetime``\\ s with a
``tzinfo``. ``time_range`` is a ``(start, end)`` pair (``None`` for an open
end) or a ``{"start": ..., "end": ...}`` mapping.

**Errors** come back as streamrag's own: the server's error body (OpenAI's
``{"error": {"message", "type", "param", "code"}}``) names a stable ``code``
(``query_error``, ``validation_error``, ``overloaded``, …) and the matching
class of :mod:`streamrag.errors` is raised with the server's message, followed
by where it came from. A request that fails validation on the server raises
:class:`~streamrag.errors.RequestError`; a 429 raises
:class:`~streamrag.errors.OverloadedError` with the server's ``Retry-After``;
a base URL that serves no streamrag raises :class:`~streamrag.errors.ConfigError`;
a server that cannot be reached, times out or fails inside raises
:class:`~streamrag.errors.StreamragError` naming what happened.

**Connections.** Synchronous calls share one ``httpx.Client``, made on first use
and closed by :meth:`RetrieveClient.close` (or when the client is dropped).
Asynchronous calls open a short-lived ``httpx.AsyncClient`` each, because a
client's connections belong to the event loop that opened them; pass
``http_async_client=`` (made inside your loop) to keep connections across calls,
and ``http_client=`` for proxies, TLS settings or a test transport. A client
passed in is used as it is (its own timeouts apply) and never closed here.

**The API key** (``api_key``, else the ``STREAMRAG_API_KEY`` environment
variable) is sent as ``Authorization: Bearer``; a server that does not check
keys ignores it. It never appears in ``repr`` or error messages.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from streamrag.errors import (
    ArgumentError,
    AuthenticationError,
    ConfigError,
    EmbedderError,
    GeneratorError,
    IndexStoreError,
    OverloadedError,
    PermissionDeniedError,
    QueryError,
    RequestError,
    StreamragError,
    UnknownNameError,
)

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_URL",
    "Passage",
    "RetrieveClient",
    "Retrieved",
    "TimeLike",
    "TimeRangeLike",
    "retrieve_body",
]

API_KEY_ENV = "STREAMRAG_API_KEY"
"""The environment variable an API key is read from when none is given."""
DEFAULT_URL = "http://127.0.0.1:8000"
"""Where ``streamrag serve`` listens unless told otherwise."""

TimeLike = datetime | str | int | float
"""A time as the route takes it: ISO-8601 with a zone, epoch seconds, or an aware datetime."""
TimeRangeLike = tuple[TimeLike | None, TimeLike | None] | Mapping[str, TimeLike | None]
"""``(start, end)`` or ``{"start": ..., "end": ...}``; ``None`` leaves that end open."""

_ROUTE = "/v1/retrieve"
_BODY_START = 200

_BY_CODE: dict[str, type[StreamragError]] = {
    "query_error": QueryError,
    "invalid_value": RequestError,
    "validation_error": RequestError,
    "request_too_large": RequestError,
    "unknown_name": UnknownNameError,
    "index_refused": IndexStoreError,
    "corrupt_state": IndexStoreError,
    "config_error": ConfigError,
    "embedder_error": EmbedderError,
    "llm_error": GeneratorError,
    "llm_timeout": GeneratorError,
    "llm_circuit_open": GeneratorError,
    "invalid_api_key": AuthenticationError,
    "permission_denied": PermissionDeniedError,
}
"""The streamrag error to raise for the ``code`` of a server's error body."""


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved chunk: its text, its score and where it came from.

    ``epoch`` is the epoch that committed the chunk; ``read_epoch`` the one the
    whole answer was read from (pass it as ``epoch=`` to read the same index
    again). ``metadata`` is the document's own metadata.
    """

    text: str
    score: float
    doc_id: str
    chunk_id: str
    tenant: str
    domain: str
    position: int
    event_time: str
    source: str
    offset: int
    epoch: int
    embedder: str
    read_epoch: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """Flat metadata for a framework's document: the document's own, then streamrag's.

        streamrag's names (``doc_id``, ``chunk_id``, ``tenant``, ``domain``,
        ``position``, ``score``, ``event_time``, ``source``, ``offset``,
        ``epoch``, ``read_epoch``, ``embedder``) win over a document key of
        the same name.

        >>> p = Passage("t", 0.5, "kb-1", "ab12", "default", "ops", 0,
        ...             "2024-05-01T00:00:00Z", "push", 0, 3, "hashing", 4, {"lang": "en"})
        >>> p.fields()["lang"], p.fields()["doc_id"], p.fields()["read_epoch"]
        ('en', 'kb-1', 4)
        """
        return {
            **self.metadata,
            "doc_id": self.doc_id,
            "chunk_id": self.chunk_id,
            "tenant": self.tenant,
            "domain": self.domain,
            "position": self.position,
            "score": self.score,
            "event_time": self.event_time,
            "source": self.source,
            "offset": self.offset,
            "epoch": self.epoch,
            "read_epoch": self.read_epoch,
            "embedder": self.embedder,
        }


@dataclass(frozen=True, slots=True)
class Retrieved:
    """One answer of ``/v1/retrieve``: the epoch it was read from and the passages, best first."""

    epoch: int
    took_ms: float
    passages: list[Passage]


def _time(value: TimeLike, name: str) -> str | int | float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            msg = (
                f"{name} is the naive datetime {value.isoformat()}; give it a time zone "
                "(datetime(..., tzinfo=UTC)), or pass an ISO-8601 string with a zone"
            )
            raise ArgumentError(msg)
        return value.isoformat()
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        msg = (
            f"{name} is a {type(value).__name__}; give an ISO-8601 string with a zone, "
            "epoch seconds, or an aware datetime"
        )
        raise ArgumentError(msg)
    return value


def _time_range(value: TimeRangeLike) -> dict[str, str | int | float]:
    if isinstance(value, Mapping):
        unknown = set(value) - {"start", "end"}
        if unknown:
            msg = f"time_range has the keys {sorted(unknown)}; it takes only 'start' and 'end'"
            raise ArgumentError(msg)
        start, end = value.get("start"), value.get("end")
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        start, end = value
    else:
        msg = (
            f"time_range is {value!r}; give a (start, end) pair or a mapping with 'start' "
            "and 'end' (None for an open end)"
        )
        raise ArgumentError(msg)
    out: dict[str, str | int | float] = {}
    if start is not None:
        out["start"] = _time(start, "time_range start")
    if end is not None:
        out["end"] = _time(end, "time_range end")
    return out


def retrieve_body(
    query: str,
    *,
    k: int,
    filters: Mapping[str, Any] | None = None,
    time_range: TimeRangeLike | None = None,
    as_of: TimeLike | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """The JSON body of a ``/v1/retrieve`` request (options left out when not given).

    >>> retrieve_body("vpn", k=3, filters={"domain": "it"}, time_range=(None, 1714521600))
    {'query': 'vpn', 'k': 3, 'filters': {'domain': 'it'}, 'time_range': {'end': 1714521600}}
    """
    body: dict[str, Any] = {"query": query, "k": k}
    if filters:
        body["filters"] = dict(filters)
    if time_range is not None:
        body["time_range"] = _time_range(time_range)
    if as_of is not None:
        body["as_of"] = _time(as_of, "as_of")
    if epoch is not None:
        body["epoch"] = epoch
    return body


def _base_url(url: str) -> str:
    """The server's root, also from a URL that ends in ``/v1`` or in the route."""
    base = url.rstrip("/")
    for tail in (_ROUTE, "/v1"):
        if base.endswith(tail):
            base = base[: -len(tail)]
    if not base.startswith(("http://", "https://")):
        msg = f"base_url {url!r} is not an http(s) URL; give one like {DEFAULT_URL!r}"
        raise ConfigError(msg)
    return base


class RetrieveClient:
    """Queries a streamrag server's ``POST /v1/retrieve`` (see the module's docs).

    Args:
        base_url: The server, ``http://HOST:PORT`` (a trailing ``/v1`` is fine).
        api_key: Sent as a bearer token; ``None`` reads ``STREAMRAG_API_KEY``.
        timeout_s: Limit for connecting and for each read and write, in seconds.
        http_client: An ``httpx.Client`` to send synchronous requests with.
        http_async_client: An ``httpx.AsyncClient`` to send asynchronous ones with.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        http_client: httpx.Client | None = None,
        http_async_client: httpx.AsyncClient | None = None,
    ) -> None:
        if not timeout_s > 0:
            msg = f"timeout_s={timeout_s!r}; give a positive number of seconds"
            raise ArgumentError(msg)
        self.base_url = _base_url(base_url)
        self.url = self.base_url + _ROUTE
        self.timeout_s = timeout_s
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._headers = {"authorization": f"Bearer {key}"} if key else {}
        self._given = http_client
        self._given_async = http_async_client
        self._own: httpx.Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        key = "set" if self._headers else "none"
        return f"RetrieveClient(base_url={self.base_url!r}, api_key={key})"

    def retrieve(
        self,
        query: str,
        *,
        k: int = 5,
        filters: Mapping[str, Any] | None = None,
        time_range: TimeRangeLike | None = None,
        as_of: TimeLike | None = None,
        epoch: int | None = None,
    ) -> Retrieved:
        """The ``k`` chunks closest to ``query`` that the options let through, best first."""
        body = retrieve_body(
            query, k=k, filters=filters, time_range=time_range, as_of=as_of, epoch=epoch
        )
        try:
            response = self._client().post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        return self._read(response)

    async def aretrieve(
        self,
        query: str,
        *,
        k: int = 5,
        filters: Mapping[str, Any] | None = None,
        time_range: TimeRangeLike | None = None,
        as_of: TimeLike | None = None,
        epoch: int | None = None,
    ) -> Retrieved:
        """:meth:`retrieve`, without blocking the event loop."""
        body = retrieve_body(
            query, k=k, filters=filters, time_range=time_range, as_of=as_of, epoch=epoch
        )
        try:
            if self._given_async is not None:
                response = await self._given_async.post(self.url, json=body, headers=self._headers)
            else:
                async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                    response = await client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        return self._read(response)

    def close(self) -> None:
        """Close the connections this client opened (not those of a client passed in)."""
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.close()

    def _client(self) -> httpx.Client:
        if self._given is not None:
            return self._given
        with self._lock:
            if self._own is None:
                self._own = httpx.Client(timeout=self.timeout_s)
                # Closed with this client too when it is dropped without close().
                weakref.finalize(self, self._own.close)
            return self._own

    def _unreachable(self, exc: httpx.HTTPError) -> StreamragError:
        if isinstance(exc, httpx.TimeoutException):
            what = f"did not answer within timeout_s={self.timeout_s:g}"
            todo = "raise timeout_s, or ask for fewer results"
        else:
            what = f"could not be reached ({type(exc).__name__}: {exc})"
            todo = "check that `streamrag serve` runs there and that base_url names it"
        return StreamragError(f"streamrag at {self.base_url} {what}; {todo}")

    def _read(self, response: httpx.Response) -> Retrieved:
        if response.status_code != 200:
            raise self._error(response)
        try:
            payload = response.json()
            read_epoch = int(payload["epoch"])
            passages = [_passage(hit, read_epoch) for hit in payload["results"]]
            return Retrieved(read_epoch, float(payload.get("took_ms", 0.0)), passages)
        except (ValueError, KeyError, TypeError) as exc:
            start = response.text[:_BODY_START]
            msg = (
                f"{self.url} answered 200 with a body that is not a streamrag retrieve "
                f"response ({type(exc).__name__}: {exc}; it starts {start!r}); point base_url "
                "at a streamrag server"
            )
            raise StreamragError(msg) from exc

    def _error(self, response: httpx.Response) -> StreamragError:
        """The streamrag error an error response stands for, with the server's message."""
        status = response.status_code
        where = f"streamrag at {self.base_url} answered {status}"
        try:
            err = response.json()["error"]
            code, message = str(err["code"]), str(err["message"])
        except (ValueError, KeyError, TypeError):
            code, message = "", ""
        if not message or code in ("no_such_route", "method_not_allowed"):
            return self._foreign(response)  # a streamrag server, but base_url is off
        cls = _BY_CODE.get(code)
        if cls is AuthenticationError:
            message += f"; give the server's API key as api_key or in {API_KEY_ENV}"
        text = f"{message} ({where} {code})"
        if status == 429 or code == "overloaded":
            return OverloadedError(text, _retry_after(response))
        if cls is None:
            cls = QueryError if 400 <= status < 500 else StreamragError
        return cls(text)

    def _foreign(self, response: httpx.Response) -> StreamragError:
        """An error without streamrag's error body: something else answered."""
        status = response.status_code
        start = response.text[:_BODY_START]
        if status in (401, 403):
            msg = (
                f"{self.base_url} refused the request ({status}): give the server's API key as "
                f"api_key or in {API_KEY_ENV}"
            )
            return ConfigError(msg)
        if status in (404, 405):
            msg = (
                f"{self.url} is not there ({status}); base_url should name a streamrag server, "
                f"like {DEFAULT_URL!r}"
            )
            return ConfigError(msg)
        msg = f"{self.url} answered {status} with {start!r}; the server's log says why"
        return StreamragError(msg)


def _retry_after(response: httpx.Response) -> int:
    value = response.headers.get("retry-after", "")
    return int(value) if value.isdigit() else 1


def _passage(hit: Mapping[str, Any], read_epoch: int) -> Passage:
    return Passage(
        text=str(hit["text"]),
        score=float(hit["score"]),
        doc_id=str(hit["doc_id"]),
        chunk_id=str(hit["chunk_id"]),
        tenant=str(hit["tenant"]),
        domain=str(hit.get("domain") or ""),
        position=int(hit["position"]),
        event_time=str(hit["event_time"]),
        source=str(hit.get("source") or ""),
        offset=int(hit.get("offset") or 0),
        epoch=int(hit["epoch"]),
        embedder=str(hit.get("embedder") or ""),
        read_epoch=read_epoch,
        metadata=dict(hit.get("metadata") or {}),
    )
