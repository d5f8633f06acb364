"""Two tenants, each with confidential text: no route ever shows one tenant's content to the other.

A real service (the hashing embedder, the LSM index with history, windows,
the answer cache) holds the documents of ``tenant-alpha`` and ``tenant-bravo``,
written so that every query of one tenant would rank the other's documents
too if the tenant were not enforced. Every byte of every response to alpha's
keys is checked for ``bravo``: its tenant name, its document ids and its text
all carry the word. Queries try every way out of the tenant: naming the other
tenant, its document ids, a time range or ``as_of`` over its documents, an
earlier ``epoch``, the answer cache, and window keys.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.ingest import Decoder
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.auth import hash_key, new_key
from streamrag.sources.base import RawBatch
from streamrag.testing import change_line
from streamrag.timing import Clock
from tests.serve.conftest import ThreadedUvicorn

ALPHA, BRAVO = "tenant-alpha", "tenant-bravo"

KEYS = {
    "alpha-reader": (ALPHA, "reader", new_key()),
    "alpha-writer": (ALPHA, "writer", new_key()),
    "alpha-admin": (ALPHA, "admin", new_key()),
    "bravo-reader": (BRAVO, "reader", new_key()),
}
"""name: (tenant, role, key) — the keys are made here; the service gets only their hashes."""


def auth(name: str) -> dict[str, str]:
    """The header a request of key ``name`` carries."""
    return {"Authorization": f"Bearer {KEYS[name][2]}"}


def key_specs(**limits: Any) -> list[dict[str, Any]]:
    """``security.keys`` for :data:`KEYS`, with ``limits`` set on every key."""
    return [
        {"name": n, "tenant": t, "role": r, "sha256": hash_key(k), **limits}
        for n, (t, r, k) in KEYS.items()
    ]


FIRST = [
    change_line(
        "alpha-plan",
        "2024-01-10T00:00:00Z",
        "Quarterly revenue forecast and database password rotation: alpha expects 41 million.",
        tenant=ALPHA,
        domain="finance",
        metadata={"year": 2024},
    ),
    change_line(
        "alpha-ops",
        "2024-02-10T00:00:00Z",
        "Database password rotation runbook of alpha: rotate it in the vault every month.",
        tenant=ALPHA,
        domain="ops",
    ),
    change_line(
        "bravo-plan",
        "2024-01-12T00:00:00Z",
        "Quarterly revenue forecast and database password rotation: bravo expects 97 million.",
        tenant=BRAVO,
        domain="finance",
        metadata={"year": 2024},
    ),
    change_line(
        "bravo-ops",
        "2024-02-12T00:00:00Z",
        "Database password rotation runbook of bravo: the bravo password is hunter2.",
        tenant=BRAVO,
        domain="ops",
    ),
]
SECOND = [
    change_line(
        "bravo-plan",
        "2024-03-12T00:00:00Z",
        "Quarterly revenue forecast revised: bravo now expects 12 million, database password too.",
        tenant=BRAVO,
        domain="finance",
        metadata={"year": 2024},
    ),
    change_line(
        "alpha-plan",
        "2024-03-10T00:00:00Z",
        "Quarterly revenue forecast revised: alpha now expects 44 million, database password too.",
        tenant=ALPHA,
        domain="finance",
        metadata={"year": 2024},
    ),
]
WINDOWS = [
    {"name": "per_tenant", "size_ms": 86_400_000, "key": ["tenant"]},
    {"name": "per_tenant_domain", "size_ms": 86_400_000, "key": ["tenant", "domain"]},
    {"name": "per_domain", "size_ms": 86_400_000, "key": ["domain"]},
]
Q = "quarterly revenue forecast database password rotation"
FIRST_EPOCH: dict[Path, int] = {}
"""The epoch after the first documents, by state directory."""


def keyed_service(tmp_path: Path, clock: Clock | None = None, **overrides: Any) -> Service:
    """Both tenants' documents in two epochs (alpha and bravo each updated in the second)."""
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(FIRST) + "\n")
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "serve.query_workers": 1,
            "index.retention_s": 365 * 86_400,
            "event_time.windows": WINDOWS,
            "security.keys": key_specs(),
            # Dozens of tests share one service and its keys on the system clock: the
            # default 20 requests/s (burst 40) is what test_limits.py tests, not this file.
            "security.limits": {"rate_per_s": 100_000, "burst": 100_000},
            **overrides,
        },
        environ={},
    )
    svc = Service(settings, clock=clock)
    svc.pipeline.run_until_caught_up()
    FIRST_EPOCH[svc.settings.state_dir] = svc.index.epoch
    with source.open("a") as fh:
        fh.write("\n".join(SECOND) + "\n")
    svc.pipeline.run_until_caught_up()
    return svc


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = keyed_service(tmp_path_factory.mktemp("tenancy"))
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(create_app(service, manage_service=False)) as c:
        yield c


def clean(r: httpx.Response, status: int = 200) -> Any:
    """The response, checked for its status and for any trace of bravo."""
    assert r.status_code == status, r.text
    assert "bravo" not in r.text.lower(), r.text
    return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text


def docs(body: dict[str, Any]) -> list[str]:
    return sorted({r["doc_id"] for r in body["results"]})


# -- the documents are there, for each tenant ----------------------------------------


def test_both_tenants_hold_matching_documents(client: TestClient) -> None:
    """Without enforcement bravo's documents would rank: they match every query as well."""
    bravo = client.post("/v1/retrieve", json={"query": Q, "k": 10}, headers=auth("bravo-reader"))
    assert bravo.status_code == 200
    assert docs(bravo.json()) == ["bravo-ops", "bravo-plan"]
    assert "hunter2" in bravo.text
    alpha = clean(
        client.post("/v1/retrieve", json={"query": Q, "k": 10}, headers=auth("alpha-reader"))
    )
    assert docs(alpha) == ["alpha-ops", "alpha-plan"]
    assert {r["tenant"] for r in alpha["results"]} == {ALPHA}


# -- retrieve: every way to name bravo's documents -------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"filters": {"tenant": ALPHA}},
        {"filters": {"doc_id": ["bravo-plan", "bravo-ops", "alpha-ops"]}},
        {"filters": {"domain": "finance"}},
        {"filters": {"metadata": {"year": 2024}}},
        {"time_range": {"start": "2024-01-11T00:00:00Z", "end": "2024-01-13T00:00:00Z"}},
        {"time_range": {"start": "2023-01-01T00:00:00Z"}},
        {"as_of": "2024-01-31T00:00:00Z"},
        {"as_of": "2024-12-31T00:00:00Z", "filters": {"doc_id": "bravo-plan"}},
        {"epoch": 1},
        {"epoch": 1, "filters": {"doc_id": "bravo-plan"}, "as_of": "2024-01-20T00:00:00Z"},
    ],
)
def test_retrieve_never_leaves_the_keys_tenant(client: TestClient, options: dict[str, Any]) -> None:
    for name in ("alpha-reader", "alpha-admin"):  # admin keys are bound to their tenant too
        body = clean(
            client.post("/v1/retrieve", json={"query": Q, "k": 10, **options}, headers=auth(name))
        )
        assert set(docs(body)) <= {"alpha-ops", "alpha-plan"}


def test_history_reads_are_the_tenants_own(client: TestClient, service: Service) -> None:
    past = clean(
        client.post(
            "/v1/retrieve",
            json={"query": Q, "k": 10, "as_of": "2024-01-31T00:00:00Z"},
            headers=auth("alpha-reader"),
        )
    )
    assert docs(past) == ["alpha-plan"]
    first = FIRST_EPOCH[service.settings.state_dir]
    assert "41 million" in past["results"][0]["text"]
    pinned = clean(
        client.post(
            "/v1/retrieve", json={"query": Q, "k": 10, "epoch": first}, headers=auth("alpha-reader")
        )
    )
    assert pinned["epoch"] == first
    assert "41 million" in pinned["results"][0]["text"] + pinned["results"][-1]["text"]
    assert docs(pinned) == ["alpha-ops", "alpha-plan"]


@pytest.mark.parametrize("tenant", [BRAVO, "default", f" {ALPHA}", "TENANT-ALPHA"])
def test_naming_another_tenant_is_refused(client: TestClient, tenant: str) -> None:
    body = {"query": Q, "filters": {"tenant": tenant}}
    r = client.post("/v1/retrieve", json=body, headers=auth("alpha-reader"))
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["type"] == "permission_error"
    assert "alpha-reader" in err["message"]
    assert ALPHA in err["message"]
    for path, payload in (
        ("/v1/answer", body),
        ("/v1/chat/completions", _chat(streamrag={"filters": {"tenant": tenant}})),
    ):
        refused = client.post(path, json=payload, headers=auth("alpha-reader"))
        assert refused.status_code == 403, refused.text


# -- answers, chat, the cache ------------------------------------------------------------


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "streamrag", "messages": [{"role": "user", "content": Q}], **extra}


def test_answers_and_chat_cite_only_the_tenant(client: TestClient) -> None:
    for body in (
        {"query": Q},
        {"query": Q, "filters": {"doc_id": "bravo-ops"}},
        {"query": Q, "epoch": 1},
    ):
        answer = clean(client.post("/v1/answer", json=body, headers=auth("alpha-reader")))
        assert {c["doc_id"] for c in answer["citations"]} <= {"alpha-ops", "alpha-plan"}
    streamed = clean(
        client.post("/v1/answer", json={"query": Q, "stream": True}, headers=auth("alpha-reader"))
    )
    assert "event: done" in streamed
    assert "alpha" in streamed
    chat = clean(client.post("/v1/chat/completions", json=_chat(), headers=auth("alpha-reader")))
    assert {c["doc_id"] for c in chat["streamrag"]["citations"]} <= {"alpha-ops", "alpha-plan"}
    chunks = clean(
        client.post(
            "/v1/chat/completions",
            json=_chat(stream=True, streamrag={"filters": {"doc_id": ["bravo-plan", "bravo-ops"]}}),
            headers=auth("alpha-reader"),
        )
    )
    assert chunks.rstrip().endswith("data: [DONE]")


def test_a_cached_answer_never_crosses_tenants(client: TestClient) -> None:
    question = {"query": "what does the quarterly revenue forecast expect?", "k": 3}
    first = clean(client.post("/v1/answer", json=question, headers=auth("alpha-reader")))
    again = clean(client.post("/v1/answer", json=question, headers=auth("alpha-reader")))
    assert again["cached"]
    assert again["answer"] == first["answer"]
    bravo = client.post("/v1/answer", json=question, headers=auth("bravo-reader"))
    assert bravo.status_code == 200
    assert not bravo.json()["cached"]
    assert "alpha" not in bravo.text.lower()
    assert {c["doc_id"] for c in bravo.json()["citations"]} <= {"bravo-plan", "bravo-ops"}
    near = {"query": "What does the quarterly revenue forecast expect", "k": 3}
    assert (
        "alpha"
        not in client.post("/v1/answer", json=near, headers=auth("bravo-reader")).text.lower()
    )


# -- windows, status, embeddings, models -------------------------------------------------


def test_windows_show_only_the_tenants_rows(client: TestClient, service: Service) -> None:
    stage = service.pipeline.event_time
    for name in ("per_tenant", "per_tenant_domain"):  # bravo's rows are there
        assert "bravo" in json.dumps([str(r.key) for r in stage.results(name)])
    body = clean(client.get("/v1/windows", headers=auth("alpha-reader")))
    assert set(body["windows"]) == {"per_tenant", "per_tenant_domain"}  # per_domain mixes tenants
    assert {r["key"] for r in body["windows"]["per_tenant"]["results"]} == {ALPHA}
    assert {r["key"][0] for r in body["windows"]["per_tenant_domain"]["results"]} == {ALPHA}
    assert body["windows"]["per_tenant"]["open_windows"] is None  # a count over every tenant
    for params in ({"key": BRAVO}, {"key": f"{BRAVO}/finance"}, {}):
        one = clean(
            client.get("/v1/windows/per_tenant", params=params, headers=auth("alpha-reader"))
        )
        assert one["results"] == [] if params else one["results"]
        clean(
            client.get("/v1/windows/per_tenant_domain", params=params, headers=auth("alpha-reader"))
        )
    hidden = client.get("/v1/windows/per_domain", headers=auth("alpha-reader"))
    assert hidden.status_code == 403
    assert "admin" in hidden.json()["error"]["message"]
    admin = clean(client.get("/v1/windows", headers=auth("alpha-admin")))
    assert set(admin["windows"]) == {"per_tenant", "per_tenant_domain", "per_domain"}
    assert {r["key"] for r in admin["windows"]["per_domain"]["results"]} == {"finance", "ops"}


def test_status_is_the_tenants_view_for_non_admins(client: TestClient, service: Service) -> None:
    for name in ("alpha-reader", "alpha-writer"):
        body = clean(client.get("/v1/status", headers=auth(name)))
        assert body["tenant"] == ALPHA
        assert body["epoch"] == service.index.epoch
        assert not {"counts", "sources", "source", "event_time", "index", "pipeline"} & set(body)
    full = client.get("/v1/status", headers=auth("alpha-admin"))
    assert full.status_code == 200
    assert full.json()["counts"]["applied"] == 6


def test_embeddings_and_models_need_a_key_and_carry_no_tenant(client: TestClient) -> None:
    emb = clean(
        client.post("/v1/embeddings", json={"input": ["hello"]}, headers=auth("alpha-reader"))
    )
    assert len(emb["data"]) == 1
    assert (
        client.get("/v1/models", headers=auth("alpha-reader")).json()["data"][0]["id"]
        == "streamrag"
    )
    assert client.post("/v1/embeddings", json={"input": ["hello"]}).status_code == 401
    assert client.get("/v1/models").status_code == 401


# -- pushing and administering -------------------------------------------------------------


def test_pushes_are_stamped_with_the_key(tmp_path: Path) -> None:
    svc = keyed_service(tmp_path)
    with TestClient(create_app(svc, manage_service=False)) as c:
        change = {"doc_id": "alpha-new", "text": "alpha pushed this", "pushed_by": "someone-else"}
        assert (
            c.post(
                "/v1/documents", json={"changes": [change]}, headers=auth("alpha-reader")
            ).status_code
            == 403
        )
        other = {"doc_id": "bravo-new", "text": "pushed into bravo", "tenant": BRAVO}
        refused = c.post(
            "/v1/documents", json={"changes": [change, other]}, headers=auth("alpha-writer")
        )
        assert refused.status_code == 403
        assert "change 1" in refused.json()["error"]["message"]
        journal = sorted((tmp_path / "state" / "push").glob("journal-*.jsonl"))
        assert all(p.read_text() == "" for p in journal)  # nothing of a refused push is taken
        own = {"doc_id": "alpha-own", "text": "named alpha itself", "tenant": ALPHA}
        ok = c.post("/v1/documents", json={"changes": [change, own]}, headers=auth("alpha-writer"))
        assert ok.status_code == 202, ok.text
    lines = [
        ln
        for p in sorted((tmp_path / "state" / "push").glob("journal-*.jsonl"))
        for ln in p.read_bytes().splitlines()
    ]
    records = [json.loads(ln) for ln in lines]
    assert [(r["tenant"], r["pushed_by"]) for r in records] == [(ALPHA, "alpha-writer")] * 2
    batch, letters = Decoder().decode([RawBatch("push", lines, [0, 1], sum(map(len, lines)))])
    assert not letters
    assert list(batch.tenants) == [ALPHA, ALPHA]
    assert [p["pushed_by"] for p in batch.payloads] == ["alpha-writer", "alpha-writer"]
    svc.stop()


def test_admin_routes_need_an_admin_key(client: TestClient) -> None:
    for name in ("alpha-reader", "alpha-writer"):
        r = client.post("/v1/admin/rollback", json={"epoch": 1}, headers=auth(name))
        assert r.status_code == 403
        assert "admin key" in r.json()["error"]["message"]
    assert client.post("/v1/admin/rollback", json={"epoch": 1}).status_code == 401
    assert client.get("/v1/admin/generations", headers=auth("alpha-admin")).status_code == 200


# -- the stock openai client over a real socket --------------------------------------------


def test_the_openai_client_works_with_a_key(service: Service) -> None:
    with ThreadedUvicorn(create_app(service, manage_service=False)) as server:
        url = f"{server.url}/v1"
        alpha = openai.OpenAI(base_url=url, api_key=KEYS["alpha-reader"][2], max_retries=0)
        done = alpha.chat.completions.create(
            model="streamrag", messages=[{"role": "user", "content": Q}]
        )
        text = done.model_dump_json()
        assert "alpha" in text
        assert "bravo" not in text.lower()
        streamed = alpha.chat.completions.create(
            model="streamrag",
            messages=[{"role": "user", "content": Q}],
            stream=True,
            extra_body={"streamrag": {"filters": {"doc_id": "bravo-ops"}}},
        )
        pieces = [c.model_dump_json() for c in streamed]
        assert pieces
        assert "bravo" not in "".join(pieces).lower()
        assert len(alpha.embeddings.create(model="x", input=["hello"]).data) == 1
        assert [m.id for m in alpha.models.list()] == ["streamrag"]
        with pytest.raises(openai.PermissionDeniedError, match=ALPHA):
            alpha.chat.completions.create(
                model="streamrag",
                messages=[{"role": "user", "content": Q}],
                extra_body={"streamrag": {"filters": {"tenant": BRAVO}}},
            )
        stranger = openai.OpenAI(base_url=url, api_key=new_key(), max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="not valid"):
            stranger.models.list()
        alpha.close()
        stranger.close()


def test_the_other_tenant_stays_out_while_it_ingests_many_versions(tmp_path: Path) -> None:
    """Live ingest beside the reads: bravo pushes versions out of order while alpha queries.

    Each push holds several versions of each bravo document, newest first; the
    alpha reader queries all the while, naming bravo's new documents by id.
    Every answer is alpha's alone, and the epochs it read moved under it.
    """
    svc = keyed_service(tmp_path)
    svc.start()
    ids = [f"bravo-live-{i}" for i in range(6)]
    rounds = 12

    def write() -> None:
        for r in range(rounds):
            svc.push(
                [
                    {
                        "doc_id": doc,
                        "tenant": BRAVO,
                        "event_time": 1_710_000_000 + 10 * r + v,
                        "text": f"bravo secret {r}.{v}: quarterly revenue forecast, database "
                        "password rotation",
                    }
                    for doc in ids
                    for v in (2, 0, 1)  # the newest version first, two older ones after it
                ],
                wait_for_commit=r == rounds - 1,
            )

    epochs: set[int] = set()
    writer = threading.Thread(target=write, name="bravo-writer")
    try:
        with (
            ThreadedUvicorn(create_app(svc, manage_service=False)) as server,
            httpx.Client(base_url=server.url, headers=auth("alpha-reader")) as c,
        ):
            writer.start()
            asked = 0
            while writer.is_alive() or asked < 20:
                body = {"query": Q, "k": 10, "filters": {"doc_id": [*ids, "alpha-plan"]}}
                found = clean(c.post("/v1/retrieve", json=body))
                epochs.add(found["epoch"])
                assert {hit["doc_id"] for hit in found["results"]} == {"alpha-plan"}
                asked += 1
            writer.join()
            after = clean(c.post("/v1/retrieve", json={"query": Q, "k": 50}))
    finally:
        writer.join()
        svc.stop()
    assert len(epochs) > 1, "ingest did not move while alpha read: nothing was concurrent"
    assert {hit["tenant"] for hit in after["results"]} == {ALPHA}
    bravo = svc.index.doc_state(BRAVO, ids[0])
    assert bravo is not None, "bravo's pushes were not committed"
