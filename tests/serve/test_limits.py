"""Every request has limits, every error one shape, and no error echoes what was sent.

Requests that used to cost tens of seconds (a filter with 10,000 keys, 100,000
document ids, a 10 MB chat message) are refused at once with a 4xx that names
the limit; a NaN temperature is a 422, not a 500; a blank query or tenant is
refused rather than answered. Each API key has its own limits too: a token
bucket (429 with ``Retry-After``), bounds on its requests and answers in
flight, and its own ``max_k``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.schemas import MAX_FILTER_KEYS, MAX_FILTER_VALUES, MAX_MESSAGE_CHARS
from streamrag.testing import ManualClock, change_line
from tests.e2e.conftest import wait_for
from tests.serve.conftest import Reply, ScriptedLLM, ThreadedUvicorn, completion
from tests.serve.test_tenancy import KEYS, auth, key_specs, keyed_service


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


# -- per API key: a token bucket, requests in flight, k ---------------------------------


def _limited(tmp_path: Path, clock: ManualClock, **overrides: Any) -> Service:
    """The two-tenant service, alpha-reader's key with the limits in ``overrides``."""
    specs = key_specs()
    for spec in specs:
        if spec["name"] == "alpha-reader":
            spec.update(overrides)
    return keyed_service(tmp_path, clock, **{"security.keys": specs})


def test_a_key_over_its_rate_gets_429_with_retry_after(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000_000_000)
    svc = _limited(tmp_path, clock, rate_per_s=0.5, burst=2)
    query = {"query": "quarterly revenue", "k": 1}
    with TestClient(create_app(svc, manage_service=False)) as c:
        assert c.post("/v1/retrieve", json=query, headers=auth("alpha-reader")).status_code == 200
        assert c.get("/v1/models", headers=auth("alpha-reader")).status_code == 200  # any route
        over = c.post("/v1/retrieve", json=query, headers=auth("alpha-reader"))
        assert over.status_code == 429
        assert over.headers["retry-after"] == "2"  # one token at 0.5 a second
        err = over.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_error", "overloaded")
        assert "alpha-reader" in err["message"]
        assert "0.5 requests/s" in err["message"]
        # Other keys have their own buckets (the default limits).
        for _ in range(5):
            assert (
                c.post("/v1/retrieve", json=query, headers=auth("bravo-reader")).status_code == 200
            )
        clock.advance_us(1_000_000)
        again = c.post("/v1/answer", json=query, headers=auth("alpha-reader"))
        assert again.status_code == 429
        assert again.headers["retry-after"] == "1"  # half a token earned
        clock.advance_us(1_000_000)
        assert c.post("/v1/answer", json=query, headers=auth("alpha-reader")).status_code == 200
        assert c.post("/v1/answer", json=query, headers=auth("alpha-reader")).status_code == 429
        clock.advance_us(3_600_000_000)  # a long idle refills to the burst, no more
        codes = [c.get("/v1/models", headers=auth("alpha-reader")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
    svc.stop()


def test_the_openai_client_sees_the_rate_limit(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000_000_000)
    svc = _limited(tmp_path, clock, rate_per_s=0.25, burst=1)
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        key = KEYS["alpha-reader"][2]
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        client.models.list()
        with pytest.raises(openai.RateLimitError) as caught:
            client.models.list()
        assert caught.value.response.headers["retry-after"] == "4"
        client.close()
    svc.stop()


def test_a_key_has_bounds_on_requests_and_answers_in_flight(
    tmp_path: Path, scripted_llm: ScriptedLLM
) -> None:
    gate = threading.Event()
    held_reply = Reply(body=completion("Held [1]"), gate=gate)
    scripted_llm.script(held_reply, held_reply, Reply(body=completion()))
    specs = key_specs()
    for spec in specs:
        if spec["name"] == "alpha-reader":
            spec["max_in_flight"] = 1
        if spec["name"] == "alpha-writer":
            spec["max_answers_in_flight"] = 1
    svc = keyed_service(
        tmp_path,
        ManualClock(1_700_000_000_000_000),
        **{"security.keys": specs, "llm.base_url": scripted_llm.url, "llm.max_retries": 0},
    )
    question = {"query": "quarterly revenue forecast", "k": 2, "cache": False}
    lookup = {"query": "quarterly revenue forecast", "k": 2}
    chat = {"messages": [{"role": "user", "content": "forecast"}]}
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        reader, writer, bravo = (
            httpx.Client(base_url=server.url, timeout=30, headers=auth(name))
            for name in ("alpha-reader", "alpha-writer", "bravo-reader")
        )
        held: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda c=c: held.append(c.post("/v1/answer", json=question)))
            for c in (reader, writer)
        ]
        try:
            threads[0].start()
            wait_for(lambda: scripted_llm.in_flight == 1, 10, "alpha-reader's answer at the LLM")
            busy = reader.post("/v1/retrieve", json=lookup)
            assert busy.status_code == 429
            assert busy.headers["retry-after"] == "1"
            assert "max_in_flight=1" in busy.json()["error"]["message"]
            threads[1].start()
            wait_for(lambda: scripted_llm.in_flight == 2, 10, "alpha-writer's answer at the LLM")
            for path, body in (("/v1/answer", question), ("/v1/chat/completions", chat)):
                r = writer.post(path, json=body)
                assert r.status_code == 429
                assert "max_answers_in_flight=1" in r.json()["error"]["message"]
            assert writer.post("/v1/retrieve", json=lookup).status_code == 200  # not an answer
            assert bravo.post("/v1/retrieve", json=lookup).status_code == 200  # another key
        finally:
            gate.set()  # a failed check must not leave the held answers waiting
        for t in threads:
            t.join(30)
        assert [r.status_code for r in held] == [200, 200]
        assert reader.post("/v1/retrieve", json=lookup).status_code == 200  # slots freed
        assert writer.post("/v1/answer", json=question).status_code == 200
        for c in (reader, writer, bravo):
            c.close()
    svc.stop()


def test_a_key_may_have_a_lower_max_k(tmp_path: Path) -> None:
    svc = _limited(tmp_path, ManualClock(1_700_000_000_000_000), max_k=3)
    with TestClient(create_app(svc, manage_service=False)) as c:
        ok = c.post(
            "/v1/retrieve", json={"query": "forecast", "k": 3}, headers=auth("alpha-reader")
        )
        assert ok.status_code == 200
        for path in ("/v1/retrieve", "/v1/answer"):
            r = c.post(path, json={"query": "forecast", "k": 4}, headers=auth("alpha-reader"))
            assert r.status_code == 400
            assert "k=4 is above" in r.json()["error"]["message"]
        other = c.post(
            "/v1/retrieve", json={"query": "forecast", "k": 4}, headers=auth("bravo-reader")
        )
        assert other.status_code == 200
    svc.stop()
