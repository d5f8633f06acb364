"""Every request has limits, every error one shape, and no error echoes what was sent.

Requests that used to cost tens of seconds (a filter with 10,000 keys, 100,000
document ids, a 10 MB chat message) are refused at once with a 4xx that names
the limit; a NaN temperature is a 422, not a 500; a blank query or tenant is
refused rather than answered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.schemas import MAX_FILTER_KEYS, MAX_FILTER_VALUES, MAX_MESSAGE_CHARS
from streamrag.testing import change_line


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            change_line(
                f"d{i}", 1_700_000_000 + i, f"database password note {i}", metadata={"n": i}
            )
            + "\n"
            for i in range(30)
        )
    )
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "serve.max_body_bytes": 200_000,
        },
        environ={},
    )
    svc = Service(settings)
    svc.pipeline.run_until_caught_up()
    with TestClient(create_app(svc, manage_service=False)) as c:
        yield c
    svc.pipeline.close()


def _error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body  # one shape for every error
    assert {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]  # type: ignore[no-any-return]


def test_a_nan_temperature_is_a_422_not_a_500(client: TestClient) -> None:
    raw = b'{"query": "database", "temperature": NaN}'
    err = _error(
        client.post("/v1/answer", content=raw, headers={"content-type": "application/json"}), 422
    )
    assert (err["type"], err["code"]) == ("invalid_request_error", "validation_error")
    assert err["param"] == "temperature"
    assert "temperature" in err["message"]


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        ({"query": "   "}, "query is blank"),
        ({"query": "x", "filters": {"tenant": ""}}, "tenant"),
        ({"query": "x", "filters": {"tenant": "  "}}, "tenant is blank"),
        (
            {"query": "x", "filters": {"metadata": {f"k{i}": i for i in range(10_000)}}},
            f"at most {MAX_FILTER_KEYS}",
        ),
        (
            {"query": "x", "filters": {"doc_id": [f"d{i}" for i in range(MAX_FILTER_VALUES + 1)]}},
            f"at most {MAX_FILTER_VALUES:,}",
        ),
        (
            {"query": "x", "filters": {"metadata": {"n": list(range(MAX_FILTER_VALUES + 1))}}},
            "metadata condition 'n' lists",
        ),
    ],
)
def test_limits_and_blanks_are_422s_that_say_what_to_do(
    client: TestClient, body: dict[str, Any], hint: str
) -> None:
    started = time.perf_counter()
    err = _error(client.post("/v1/retrieve", json=body), 422)
    assert hint in err["message"]
    assert time.perf_counter() - started < 5  # refused up front, not after the work


def test_the_error_for_a_bad_body_does_not_echo_it(client: TestClient) -> None:
    junk = {"query": "x", "k": "many", "filters": {"domain": "y" * 100_000}}
    r = client.post("/v1/retrieve", json=junk)
    err = _error(r, 422)
    assert len(r.content) < 2_000  # not the 100 kB sent back, base64 or not
    assert "yyyy" not in r.text
    assert err["param"] == "k"
    assert err["errors"][0]["param"] == "k"


def test_a_reversed_time_range_names_the_times_sent(client: TestClient) -> None:
    body = {
        "query": "x",
        "time_range": {"start": "2024-05-02T00:00:00Z", "end": "2024-05-01T00:00:00Z"},
    }
    err = _error(client.post("/v1/retrieve", json=body), 400)
    assert "2024-05-02T00:00:00Z" in err["message"]
    assert "2024-05-01T00:00:00Z" in err["message"]
    assert "µs" not in err["message"]


def test_a_body_over_the_limit_is_a_413_on_every_route(client: TestClient) -> None:
    big = json.dumps({"query": "x" * 250_000}).encode()
    for route in ("/v1/retrieve", "/v1/answer", "/v1/chat/completions", "/v1/embeddings"):
        err = _error(
            client.post(route, content=big, headers={"content-type": "application/json"}), 413
        )
        assert (err["type"], err["code"]) == ("invalid_request_error", "request_too_large")
        assert "serve.max_body_bytes allows 200,000" in err["message"]


def test_a_chat_message_over_the_limit_is_refused(client: TestClient) -> None:
    long = "word " * (MAX_MESSAGE_CHARS // 5 + 1)  # over the per-message limit, under the body's
    body = {"messages": [{"role": "user", "content": long}]}
    err = _error(client.post("/v1/chat/completions", json=body), 422)
    assert f"at most {MAX_MESSAGE_CHARS:,} per message" in err["message"]


def test_normal_requests_still_work(client: TestClient) -> None:
    r = client.post("/v1/retrieve", json={"query": "database password", "k": 3})
    assert r.status_code == 200
    assert len(r.json()["results"]) == 3
    flt = {"metadata": {"n": {"gte": 5, "lt": 8}}, "doc_id": [f"d{i}" for i in range(20)]}
    r = client.post("/v1/retrieve", json={"query": "note", "k": 10, "filters": flt})
    assert sorted(h["doc_id"] for h in r.json()["results"]) == ["d5", "d6", "d7"]
