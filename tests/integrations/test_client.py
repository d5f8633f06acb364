"""How ``RetrieveClient`` maps what comes back, for answers a healthy test server never gives.

The retrievers' tests run against a real ``streamrag serve``; the answers here
— a 429 with ``Retry-After``, an internal error, a proxy's 401, a body that is
not streamrag's, a timeout — come from ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from streamrag.errors import (
    AuthenticationError,
    ConfigError,
    OverloadedError,
    PermissionDeniedError,
    QueryError,
    StreamragError,
)
from streamrag.integrations.client import RetrieveClient

URL = "http://streamrag.test:8000"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> RetrieveClient:
    transport = httpx.MockTransport(handler)
    return RetrieveClient(
        URL,
        http_client=httpx.Client(transport=transport),
        http_async_client=httpx.AsyncClient(transport=transport),
    )


def error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    kind = {
        401: "authentication_error",
        403: "permission_error",
        429: "rate_limit_error",
        500: "server_error",
    }.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return httpx.Response(status, content=json.dumps(body), headers=headers)


def test_a_full_server_is_an_overloaded_error_with_its_retry_after() -> None:
    c = client(lambda _: error(429, "overloaded", "the job is busy", **{"Retry-After": "7"}))
    with pytest.raises(OverloadedError, match="the job is busy") as info:
        c.retrieve("q")
    assert info.value.retry_after_s == 7


def test_an_internal_error_is_a_streamrag_error_and_not_the_querys_fault() -> None:
    msg = "the server failed while answering /v1/retrieve; its log has the details"
    c = client(lambda _: error(500, "internal_error", msg))
    with pytest.raises(StreamragError, match="its log has the details") as info:
        c.retrieve("q")
    assert not isinstance(info.value, QueryError)
    assert f"streamrag at {URL} answered 500 internal_error" in str(info.value)


def test_a_refused_key_is_an_authentication_error_that_says_where_the_key_goes() -> None:
    msg = "no API key was sent; send it as Authorization: Bearer <key>"
    c = client(lambda _: error(401, "invalid_api_key", msg))
    with pytest.raises(AuthenticationError, match="give the server's API key as api_key or in"):
        c.retrieve("q")
    c = client(lambda _: error(403, "permission_denied", "this key reads tenant acme only"))
    with pytest.raises(PermissionDeniedError, match=r"acme only \(streamrag at .* 403 permission"):
        c.retrieve("q")


def test_answers_from_something_else_say_what_to_fix() -> None:
    c = client(lambda _: httpx.Response(401, text="Unauthorized"))
    with pytest.raises(ConfigError, match="STREAMRAG_API_KEY"):
        c.retrieve("q")
    c = client(lambda _: httpx.Response(200, json={"hello": "world"}))
    with pytest.raises(StreamragError, match="not a streamrag retrieve response"):
        c.retrieve("q")
    c = client(lambda _: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(StreamragError, match=r"answered 502 with '<html>Bad Gateway"):
        c.retrieve("q")


def test_a_timeout_names_the_limit_sync_and_async() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    c = client(hang)
    with pytest.raises(StreamragError, match="did not answer within timeout_s=10"):
        c.retrieve("q")
    with pytest.raises(StreamragError, match="did not answer within timeout_s=10"):
        asyncio.run(c.aretrieve("q"))


def test_the_body_sent_is_the_routes() -> None:
    seen: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"epoch": 3, "took_ms": 0.5, "results": []})

    c = client(answer)
    found = c.retrieve(
        "q", k=2, filters={"tenant": "acme"}, time_range={"end": 1714521600}, as_of=1.5, epoch=3
    )
    assert (found.epoch, found.passages) == (3, [])
    assert seen == [
        {
            "query": "q",
            "k": 2,
            "filters": {"tenant": "acme"},
            "time_range": {"end": 1714521600},
            "as_of": 1.5,
            "epoch": 3,
        }
    ]
    assert repr(RetrieveClient(URL, api_key="sk-secret")) == (
        f"RetrieveClient(base_url={URL!r}, api_key=set)"
    )
