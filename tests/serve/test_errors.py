"""Every error answers in OpenAI's shape, which the stock ``openai`` client reads.

``{"error": {"message", "type", "param", "code"}}`` on every route and status —
validation (422), a refused query (400), an unknown name or route (404), the
wrong method (405), a conflict (409), a body too large (413), a full journal
(429) and an internal failure (500) — plus ``errors`` on a 422, and nothing
else: no Python class name, no stack trace, no echo of what was sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.index.base import Hit
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.auth import hash_key, new_key
from streamrag.serve.errors import CODES, KINDS
from streamrag.serve.responses import RetrieveResponse, StatusResponse, WindowsResponse
from streamrag.testing import FakeEmbedder, change_line
from tests.serve.conftest import Reply, ScriptedLLM, ThreadedUvicorn, chunks

SHAPE = {"message", "type", "param", "code"}
CLASS_NAME = re.compile(r"[A-Za-z]*(Error|Exception)\b|Traceback|File \"")
"""What an error body must never show: a Python class name, a traceback, a source file."""
SECRET = "internal detail 7f3a"
"""Text of an exception raised inside the server: it must not reach the client."""


def failing_reranker(query: str, hits: list[Hit]) -> list[Hit]:
    """A reranker hook with a bug: it fails on questions that mention 'explode'."""
    if "explode" in query:
        raise KeyError(SECRET)
    return hits


class ExplodingEmbedder(FakeEmbedder):
    """The test embedder, failing (a bug, not an EmbedderError) on texts that say 'explode'."""

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if any("explode" in t for t in texts):
            raise ZeroDivisionError(SECRET)
        return super().embed_many(texts)


def make_service(tmp_path: Path, **overrides: Any) -> Service:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            change_line(f"d{i}", 1_700_000_000 + i, f"database password note {i}") + "\n"
            for i in range(5)
        )
    )
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "serve.max_body_bytes": 10_000,
            "serve.query_workers": 1,
            "push.max_backlog_bytes": 2048,
            "answer.context.reranker": f"{__name__}:failing_reranker",
            **overrides,
        },
        environ={},
    )
    svc = Service(settings, embedder=ExplodingEmbedder())
    svc.pipeline.run_until_caught_up()
    return svc


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    svc = make_service(tmp_path)
    app = create_app(svc, manage_service=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    svc.pipeline.close()


def error_of(
    r: Any, status: int, type_: str, code: str, param: str | None = None
) -> dict[str, Any]:
    """The error object of ``r``, after checking that it is exactly the one shape."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == (SHAPE | {"errors"} if status == 422 else SHAPE), err
    assert (err["type"], err["code"], err["param"]) == (type_, code, param), err
    assert isinstance(err["message"], str)
    assert len(err["message"]) > 20
    assert not CLASS_NAME.search(r.text), r.text
    assert SECRET not in r.text
    return err  # type: ignore[no-any-return]


# -- 422 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "param", "hint"),
    [
        ("/v1/retrieve", {"query": "x", "k": 0}, "k", "greater than or equal to 1"),
        ("/v1/answer", {"query": "x", "k": 0}, "k", "greater than or equal to 1"),
        ("/v1/retrieve", {"query": "x", "filters": {"tenant": " "}}, "filters.tenant", "blank"),
        ("/v1/answer", {"query": "x", "filters": {"tenant": " "}}, "filters.tenant", "blank"),
        # pydantic's union members (str, list[str]) are not fields: the param is the field
        ("/v1/retrieve", {"query": "x", "filters": {"domain": 5}}, "filters.domain", "string"),
        ("/v1/retrieve", {"query": "x", "as_of": "2024-05-01"}, "as_of", "no time zone"),
        (
            "/v1/retrieve",
            {"query": "x", "time_range": {"start": True}},
            "time_range.start",
            "found the boolean True",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "hi"}]},
            "messages[0].role",
            "'user'",
        ),
        ("/v1/embeddings", {"input": [1, "text"]}, "input", "input mixes texts and token ids"),
        ("/v1/documents", {"changes": []}, "changes", "at least 1 item"),
    ],
)
def test_a_validation_error_names_the_field_as_param(
    client: TestClient, route: str, body: dict[str, Any], param: str, hint: str
) -> None:
    err = error_of(
        client.post(route, json=body), 422, "invalid_request_error", "validation_error", param
    )
    assert err["message"].startswith(f"{param}: ")
    assert hint in err["message"]
    assert "Value error" not in err["message"]  # pydantic's prefix says nothing
    assert err["errors"][0]["param"] == param
    assert {tuple(e) for e in err["errors"]} == {("param", "message", "code")}


def test_a_validation_error_lists_every_field_and_echoes_no_value(client: TestClient) -> None:
    body = {"query": "", "k": "many", "epoch": -1, "filters": {"domain": "y" * 5000}}
    r = client.post("/v1/retrieve", json=body)
    err = error_of(r, 422, "invalid_request_error", "validation_error", "k")
    assert [e["param"] for e in err["errors"]] == ["k", "epoch", "query"]
    assert [e["code"] for e in err["errors"]] == [
        "int_type",
        "greater_than_equal",
        "string_too_short",
    ]
    assert "yyyy" not in r.text
    assert "many" not in r.text


def test_json_that_does_not_parse_is_a_422_without_a_param(client: TestClient) -> None:
    for route in ("/v1/retrieve", "/v1/answer"):
        r = client.post(route, content=b"{bad", headers={"content-type": "application/json"})
        err = error_of(r, 422, "invalid_request_error", "validation_error", None)
        assert err["message"].startswith("the body is not valid JSON (")
        assert err["message"].endswith("); send one JSON object")


# -- 400, 404, 405, 409, 413, 429, 500 --------------------------------------------------


def test_a_refused_query_is_a_400_query_error(client: TestClient) -> None:
    for route in ("/v1/retrieve", "/v1/answer"):
        err = error_of(
            client.post(route, json={"query": "x", "k": 1000}),
            400,
            "invalid_request_error",
            "query_error",
        )
        assert err["message"] == "k=1000 is above serve.max_k=100; ask for fewer results"
    later = {"query": "x", "epoch": 10_000}
    err = error_of(
        client.post("/v1/retrieve", json=later), 400, "invalid_request_error", "query_error"
    )
    assert "epoch 10000 is not committed yet" in err["message"]


def test_an_unknown_name_or_route_is_a_404(client: TestClient) -> None:
    err = error_of(client.get("/v1/windows/nope"), 404, "not_found_error", "unknown_name")
    assert "nope" in err["message"]
    err = error_of(client.get("/v1/nowhere"), 404, "not_found_error", "no_such_route")
    assert err["message"] == (
        "there is no route GET /v1/nowhere; the routes are listed at /docs and /openapi.json"
    )


def test_the_wrong_method_is_a_405_naming_the_right_one(client: TestClient) -> None:
    r = client.get("/v1/retrieve")
    err = error_of(r, 405, "invalid_request_error", "method_not_allowed")
    assert err["message"] == "GET /v1/retrieve is not allowed; this path takes POST"
    assert r.headers["allow"] == "POST"


def test_a_conflict_with_the_jobs_state_is_a_409(client: TestClient) -> None:
    r = client.post("/v1/admin/generations/drop", json={})
    err = error_of(r, 409, "conflict_error", "conflict")
    assert err["message"] == 'give the generation to drop: {"generation": N}'
    r = client.post("/v1/admin/generations/switch", json={})
    error_of(r, 409, "conflict_error", "conflict")


def test_a_body_over_the_limit_is_a_413(client: TestClient) -> None:
    big = json.dumps({"query": "x" * 20_000}).encode()
    for route in ("/v1/retrieve", "/v1/answer", "/v1/documents"):
        r = client.post(route, content=big, headers={"content-type": "application/json"})
        err = error_of(r, 413, "invalid_request_error", "request_too_large")
        assert "serve.max_body_bytes allows 10,000" in err["message"]


def test_a_full_journal_is_a_429_rate_limit_error_with_retry_after(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    with TestClient(create_app(svc)) as c:
        svc.runner.stop()  # nothing reads the journal: it fills up
        changes = [{"doc_id": f"p{i}", "text": "word " * 60} for i in range(5)]
        assert c.post("/v1/documents", json={"changes": changes}).status_code == 202
        r = c.post("/v1/documents", json={"changes": changes})
        err = error_of(r, 429, "rate_limit_error", "overloaded")
        assert int(r.headers["retry-after"]) >= 1
        assert "retry after" in err["message"]


def test_an_internal_failure_is_a_500_that_names_only_the_route(client: TestClient) -> None:
    # A bug in a hook (the reranker) on a FastAPI route, and in the embedder on the
    # retrieve fast path: the client learns where, the server's log has the rest.
    r = client.post("/v1/answer", json={"query": "explode the database"})
    err = error_of(r, 500, "server_error", "internal_error")
    assert err["message"] == (
        "the server failed while answering /v1/answer; its log has the details"
    )
    r = client.post("/v1/retrieve", json={"query": "explode"})
    err = error_of(r, 500, "server_error", "internal_error")
    assert "/v1/retrieve" in err["message"]
    assert client.post("/v1/retrieve", json={"query": "database"}).status_code == 200


def test_every_error_class_has_a_category_a_code_and_one_status() -> None:
    categories = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        409: "conflict_error",
        429: "rate_limit_error",
        500: "server_error",
        502: "upstream_error",
    }
    for cls, kind in KINDS:
        assert categories[kind.status] == kind.type, cls
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", kind.code), kind.code
    assert CODES["invalid_api_key"].status == 401
    assert CODES["permission_denied"].status == 403


# -- the stock openai client ------------------------------------------------------------


def test_the_openai_client_shows_the_reason_of_a_422_and_a_400(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        messages: Any = [{"role": "user", "content": "database password"}]
        with pytest.raises(openai.UnprocessableEntityError) as bad:
            client.chat.completions.create(
                model="streamrag", messages=messages, extra_body={"streamrag": {"k": 0}}
            )
        assert str(bad.value) == (
            "Error code: 422 - streamrag.k: Input should be greater than or equal to 1"
        )
        assert (bad.value.type, bad.value.code) == ("invalid_request_error", "validation_error")
        assert bad.value.param == "streamrag.k"
        with pytest.raises(openai.UnprocessableEntityError, match=r"messages\[0\]\.role: "):
            client.chat.completions.create(
                model="streamrag",
                messages=[{"role": "robot", "content": "x"}],  # type: ignore[list-item,misc]
            )
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="streamrag", messages=messages, extra_body={"streamrag": {"k": 1000}}
            )
        assert str(refused.value) == (
            "Error code: 400 - k=1000 is above serve.max_k=100; ask for fewer results"
        )
        assert refused.value.code == "query_error"
        with pytest.raises(openai.NotFoundError, match="no route POST /v1/completions"):
            client.completions.create(model="streamrag", prompt="x")
        client.close()


def test_a_stream_that_breaks_off_ends_with_the_same_error_object(
    tmp_path: Path, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.script(Reply(stream=chunks("Rotate", " it", " now"), break_after=3))
    svc = make_service(tmp_path, **{"llm.base_url": scripted_llm.url})
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        r = httpx.post(
            f"{server.url}/v1/answer", json={"query": "database", "stream": True}, timeout=30
        )
        last = [line for line in r.text.splitlines() if line.startswith("event:")][-1]
        assert last == "event: error"
        data = json.loads(r.text.rstrip().splitlines()[-1].removeprefix("data: "))
        assert set(data) == {"id", "partial", "error"}
        assert set(data["error"]) == SHAPE
        assert (data["error"]["type"], data["error"]["code"]) == ("upstream_error", "llm_error")
        assert data["error"]["message"].startswith(f"{scripted_llm.url}/chat/completions")

        scripted_llm.script(Reply(stream=chunks("Rotate", " it", " now"), break_after=3))
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model="streamrag",
            messages=[{"role": "user", "content": "database"}],
            stream=True,
            extra_body={"streamrag": {"filters": {"tenant": "default"}}},
        )
        with pytest.raises(openai.APIError, match="ended its stream") as broken:
            list(stream)
        assert broken.value.code == "llm_error"
        assert broken.value.type == "upstream_error"
        client.close()


# -- API keys --------------------------------------------------------------------------


def test_a_missing_or_unknown_key_is_a_401_and_a_role_too_low_a_403(tmp_path: Path) -> None:
    key = new_key()
    spec = {"name": "reader-1", "tenant": "default", "role": "reader", "sha256": hash_key(key)}
    windows = [{"name": "per_tenant", "size_ms": 86_400_000, "key": ["tenant", "domain"]}]
    svc = make_service(tmp_path, **{"security.keys": [spec], "event_time.windows": windows})
    reader = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(svc, manage_service=False)) as c:
        for headers in ({}, {"Authorization": "Bearer sr_not-a-key"}):
            r = c.post("/v1/retrieve", json={"query": "database"}, headers=headers)
            error_of(r, 401, "authentication_error", "invalid_api_key")
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert "sr_not-a-key" not in r.text
        r = c.post("/v1/admin/rollback", json={"epoch": 0}, headers=reader)
        error_of(r, 403, "permission_error", "permission_denied")
        other = {"query": "database", "filters": {"tenant": "someone-else"}}
        error_of(
            c.post("/v1/answer", json=other, headers=reader),
            403,
            "permission_error",
            "permission_denied",
        )
        # What a reader sees of the job is what the description says it gets.
        StatusResponse.model_validate(c.get("/v1/status", headers=reader).json())
        WindowsResponse.model_validate(c.get("/v1/windows", headers=reader).json())
        found = c.post("/v1/retrieve", json={"query": "database"}, headers=reader)
        RetrieveResponse.model_validate(found.json())


def test_an_unreachable_llm_is_explained_in_words(tmp_path: Path, closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}/v1"
    svc = make_service(tmp_path, **{"llm.base_url": url, "llm.max_retries": 0})
    with TestClient(create_app(svc, manage_service=False)) as c:
        body = c.post("/v1/answer", json={"query": "database password"}).json()
    assert body["fallback_reason"].startswith(f"cannot reach the LLM endpoint {url}: ")
    assert not CLASS_NAME.search(body["fallback_reason"]), body["fallback_reason"]
