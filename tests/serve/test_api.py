"""The HTTP API in-process (Starlette's TestClient runs the app's lifespan)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.testing import FakeEmbedder, ManualClock, change_line


def _service(tmp_path: Path, source: Path, *, embedder=None, clock=None, **overrides) -> Service:  # type: ignore[no-untyped-def]
    """A hashing-embedder service over ``source``, caught up."""
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            **overrides,
        },
        environ={},
    )
    svc = Service(settings, embedder=embedder, clock=clock)
    svc.pipeline.run_until_caught_up()
    return svc


def _top_docs_concurrently(app: FastAPI, queries: list[str]) -> list[str]:
    """Send every query at once through the app (lifespan included); the top doc_id of each."""

    async def main() -> list[str]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                rs = await asyncio.gather(
                    *(c.post("/v1/retrieve", json={"query": q, "k": 1}) for q in queries)
                )
        return [r.json()["results"][0]["doc_id"] for r in rs]

    return asyncio.run(main())


@pytest.fixture
def service(tmp_path: Path) -> Service:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join(
            [
                change_line(
                    "runbook-1",
                    "2024-01-01T00:00:00Z",
                    "rotate the database password",
                    domain="ops",
                ),
                change_line(
                    "faq-1",
                    "2024-03-01T00:00:00Z",
                    "the database is backed up nightly",
                    domain="it",
                ),
                change_line(
                    "hr-1",
                    "2024-03-02T00:00:00Z",
                    "parental leave policy",
                    domain="hr",
                    tenant="acme",
                ),
                "garbage",
            ]
        )
        + "\n"
    )
    svc = _service(
        tmp_path,
        path,
        embedder=FakeEmbedder(),
        clock=ManualClock(1_800_000_000_000_000),
        **{"serve.max_k": 20, "serve.query_workers": 1},
    )
    return svc


@pytest.fixture
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(create_app(service, manage_service=False)) as c:
        yield c


def test_retrieve_returns_scored_chunks_from_one_epoch(client: TestClient) -> None:
    r = client.post("/v1/retrieve", json={"query": "database password", "k": 2})
    assert r.status_code == 200
    body = r.json()
    # three partitions (tenant, domain, day): three micro-batches, three epochs
    assert body["epoch"] == 3
    assert [x["doc_id"] for x in body["results"]] == ["runbook-1", "faq-1"]
    top = body["results"][0]
    assert top["score"] > body["results"][1]["score"]
    assert top["event_time"] == "2024-01-01T00:00:00Z"
    assert top["domain"] == "ops"
    assert top["epoch"] == 1
    assert top["source"].endswith("in.jsonl")
    assert top["offset"] == 0
    assert len(top["chunk_id"]) == 16
    assert top["embedder"].startswith("hashing")


def test_filters_and_time_range(client: TestClient) -> None:
    def ids(body: dict) -> list[str]:  # type: ignore[type-arg]
        r = client.post("/v1/retrieve", json=body)
        assert r.status_code == 200, r.text
        return [x["doc_id"] for x in r.json()["results"]]

    assert ids({"query": "database", "filters": {"domain": "it"}}) == ["faq-1"]
    assert ids({"query": "database", "filters": {"domain": ["it", "ops"]}}) == [
        "runbook-1",
        "faq-1",
    ]
    assert ids({"query": "database", "time_range": {"start": "2024-02-01T00:00:00Z"}}) == ["faq-1"]
    assert ids({"query": "database", "time_range": {"end": 1706745600}}) == ["runbook-1"]
    assert "hr-1" not in ids({"query": "leave"})  # another tenant's document
    assert ids({"query": "leave", "filters": {"tenant": "acme"}}) == ["hr-1"]


@pytest.mark.parametrize(
    ("body", "status", "hint"),
    [
        ({"query": ""}, 422, "query"),
        ({"query": "x", "k": 0}, 422, "k"),
        ({"query": "x", "k": 21}, 400, "serve.max_k=20"),
        ({"query": "x", "filters": {"colour": "red"}}, 422, "colour"),
        ({"query": "x", "time_range": {"start": "2024-01-01"}}, 422, "no time zone"),
        ({"query": "x", "time_range": {"start": 10, "end": 5}}, 400, "time_range is empty"),
    ],
)
def test_bad_requests_say_what_to_fix(
    client: TestClient,
    body: dict,
    status: int,  # type: ignore[type-arg]
    hint: str,
) -> None:
    r = client.post("/v1/retrieve", json=body)
    assert r.status_code == status
    assert hint in r.text


def test_status_counts_add_up(client: TestClient) -> None:
    body = client.get("/v1/status").json()
    assert body["epoch"] == 3  # one commit per partition
    c = body["counts"]
    assert (c["ingested"], c["applied"], c["dead_lettered"], c["pending"]) == (4, 3, 1, 0)
    assert c["ingested"] == c["applied"] + c["dead_lettered"] + c["pending"]
    assert body["watermark"] == "2024-03-01T23:59:59.999999Z"
    assert body["index"] == {
        "live_docs": 3,
        "live_chunks": 3,
        "deleted_docs": 0,
        "history": "full",
    }
    assert body["ingest_lag"]["backlog_bytes"] == 0
    # The manual clock reads 2027-01-15T08:00:00Z; the watermark is 2024-03-01T23:59:59.999999Z.
    assert body["ingest_lag"]["watermark_lag_s"] == pytest.approx(90_662_400.000001)
    assert body["freshness"]["last_batch_ms"] == 0.0


def test_metrics_and_health(client: TestClient) -> None:
    client.post("/v1/retrieve", json={"query": "database"})
    text = client.get("/metrics").text
    assert "streamrag_changes_ingested_total 4.0" in text
    assert 'streamrag_dead_letters_total{stage="decode"} 1.0' in text
    assert "streamrag_index_epoch 3.0" in text
    assert "streamrag_query_seconds_count 1.0" in text
    assert client.get("/healthz").json() == {"status": "ok"}


def test_concurrent_queries_are_answered_in_batches(service: Service) -> None:
    import time

    calls: list[int] = []
    gen = service.pin()  # a batch embeds with the generation it pins
    original = gen.embed_many

    def spy(queries):  # type: ignore[no-untyped-def]
        if not calls:
            # Hold the first batch until all other requests are queued behind it.
            deadline = time.monotonic() + 10
            queue = app.state.batcher._queue
            while len(queries) + queue.qsize() < 25 and time.monotonic() < deadline:
                time.sleep(0.001)
        calls.append(len(queries))
        return original(queries)

    gen.embed_many = spy  # type: ignore[method-assign]
    app = create_app(service, manage_service=False)

    got = _top_docs_concurrently(app, ["database password"] * 20 + ["parental leave"] * 5)
    assert got[:20] == ["runbook-1"] * 20
    assert "hr-1" not in got[20:]  # each request got its own answer, in its own tenant
    # Whatever queued while the first call was held went into one more call: 25
    # requests, at most two embedding calls and two searches.
    assert len(calls) <= 2
    assert sum(calls) == 25


def test_openapi_documents_the_retrieve_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/retrieve"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/RetrieveRequest"}
    props = spec["components"]["schemas"]["RetrieveRequest"]["properties"]
    assert {"query", "k", "filters", "time_range"} <= set(props)
    assert "Filters" in spec["components"]["schemas"]


def test_several_query_workers_answer_each_request_correctly(tmp_path: Path) -> None:

    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            change_line(f"d{i}", "2024-01-01T00:00:00Z", f"topic{i} alpha{i} beta{i}") + "\n"
            for i in range(30)
        )
    )
    svc = _service(tmp_path, path, **{"serve.query_workers": 3, "serve.max_wait_ms": 0})
    app = create_app(svc, manage_service=False)

    queries = [f"topic{i % 30} alpha{i % 30} beta{i % 30}" for i in range(120)]
    assert _top_docs_concurrently(app, queries) == [f"d{i % 30}" for i in range(120)]


def test_window_results_are_served(tmp_path: Path, service: Service) -> None:
    svc = _service(
        tmp_path / "w",
        service.settings.source.path,
        embedder=FakeEmbedder(),
        **{
            "event_time.windows": [
                {"name": "per_domain_daily", "size_ms": 86_400_000},
                {"name": "per_tenant", "size_ms": 86_400_000, "key": ["tenant", "domain"]},
            ]
        },
    )
    with TestClient(create_app(svc, manage_service=False)) as c:
        body = c.get("/v1/windows").json()
        assert body["watermark"] == "2024-03-01T23:59:59.999999Z"
        daily = body["windows"]["per_domain_daily"]
        assert daily["aggregate"] == "count"
        assert daily["open_windows"] == 1  # hr's day (2024-03-02) is still open
        assert [(r["key"], r["start"], r["value"], r["timing"]) for r in daily["results"]] == [
            ("ops", "2024-01-01T00:00:00Z", 1, "on_time"),
            ("it", "2024-03-01T00:00:00Z", 1, "on_time"),
        ]
        one = c.get("/v1/windows/per_tenant", params={"key": "default/it"}).json()
        assert [r["key"] for r in one["results"]] == [["default", "it"]]
        missing = c.get("/v1/windows/nope")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        assert missing.json()["error"]["code"] == "unknown_name"
        assert "per_domain_daily" in missing.json()["error"]["message"]
        status = c.get("/v1/status").json()["event_time"]
        assert status["windows"]["per_domain_daily"] == {"open": 1, "late": 0}
        assert status["mode"] == "micro_batch"


def test_rollback_answers_in_the_one_error_shape(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(change_line("d1", "2024-01-01T00:00:00Z", "one") + "\n")
    exact = _service(tmp_path / "exact", path, embedder=FakeEmbedder(), **{"index.kind": "exact"})
    with TestClient(create_app(exact, manage_service=False)) as c:
        refused = c.post("/v1/admin/rollback", json={"epoch": 0})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "index_refused"
        assert "index.kind: lsm" in refused.json()["error"]["message"]
    lsm = _service(tmp_path / "lsm", path, embedder=FakeEmbedder())
    with TestClient(create_app(lsm, manage_service=False)) as c:
        beyond = c.post("/v1/admin/rollback", json={"epoch": 99})
        assert beyond.status_code == 400
        assert beyond.json()["error"]["code"] == "index_refused"
        assert (
            c.post("/v1/admin/rollback", json={"epoch": lsm.index.epoch}).json()["changed"] is False
        )
    lsm.stop()
