"""POST /v1/documents over a real HTTP server: journaled, visible at the epoch it names."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from tests.e2e.conftest import free_port, wait_for


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[httpx.Client, Service]]:
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "push.max_backlog_bytes": 2048,
        },
        environ={},
    )
    svc = Service(settings)
    port = free_port()
    config = uvicorn.Config(create_app(svc), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    wait_for(lambda: client.get("/healthz").status_code == 200, 30, "the server")
    try:
        yield client, svc
    finally:
        client.close()
        srv.should_exit = True
        thread.join(30)


def _top(client: httpx.Client, query: str, **extra: object) -> list[str]:
    r = client.post("/v1/retrieve", json={"query": query, "k": 5, **extra})
    assert r.status_code == 200, r.text
    return [hit["doc_id"] for hit in r.json()["results"]]


def test_a_push_that_waits_names_the_epoch_that_shows_it(
    server: tuple[httpx.Client, Service],
) -> None:
    client, _ = server
    body = {
        "changes": [
            {"doc_id": "kb-1", "text": "hold the reset button for ten seconds"},
            {"doc_id": "kb-2", "text": "the warranty lasts two years", "tenant": "default"},
        ],
        "wait_for_commit": True,
    }
    r = client.post("/v1/documents", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["committed"]
    assert out["accepted"] == 2
    assert out["epoch"] >= 1
    assert "kb-1" in _top(client, "reset button", epoch=out["epoch"])


def test_a_push_that_does_not_wait_is_accepted_and_later_visible(
    server: tuple[httpx.Client, Service],
) -> None:
    client, _ = server
    r = client.post("/v1/documents", json={"changes": [{"doc_id": "n", "text": "late news"}]})
    assert r.status_code == 202
    assert r.json()["accepted"] == 1
    wait_for(lambda: "n" in _top(client, "late news"), 30, "the pushed document")
    d = client.post(
        "/v1/documents",
        json={"changes": [{"doc_id": "n", "op": "delete"}], "wait_for_commit": True},
    )
    assert d.status_code == 200
    assert "n" not in _top(client, "late news", epoch=d.json()["epoch"])


def test_a_retried_push_with_the_same_key_applies_once(
    server: tuple[httpx.Client, Service],
) -> None:
    client, svc = server
    change = {"doc_id": "k", "text": "only once", "idempotency_key": "k@1"}
    first = client.post("/v1/documents", json={"changes": [change], "wait_for_commit": True})
    retry = client.post("/v1/documents", json={"changes": [change], "wait_for_commit": True})
    assert first.json()["accepted"] == 1
    assert retry.status_code == 200
    assert (retry.json()["accepted"], retry.json()["duplicates"]) == (0, 1)
    assert svc.status()["counts"]["ingested"] == 1


def test_bad_changes_get_the_one_error_shape_and_nothing_is_taken(
    server: tuple[httpx.Client, Service],
) -> None:
    client, svc = server
    r = client.post(
        "/v1/documents", json={"changes": [{"doc_id": "ok", "text": "fine"}, {"doc_id": "x"}]}
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_value")
    assert "change 1" in err["message"]
    assert "non-empty 'text'" in err["message"]
    assert client.post("/v1/documents", json={"changes": []}).status_code == 422
    assert svc.status()["sources"]["push"]["unread_bytes"] == 0


def test_a_full_journal_answers_429_with_retry_after(
    server: tuple[httpx.Client, Service],
) -> None:
    client, svc = server
    svc.runner.stop()  # the pipeline stops reading: the journal fills up
    big = [{"doc_id": f"d{i}", "text": "word " * 60} for i in range(5)]
    assert client.post("/v1/documents", json={"changes": big}).status_code == 202
    r = client.post("/v1/documents", json={"changes": big})
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert r.json()["error"]["code"] == "overloaded"
