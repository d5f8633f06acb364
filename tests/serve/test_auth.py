"""API keys: hashes only, both headers, 401 and 403 on every route, reloads, bind rules."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from streamrag.cli import app as cli
from streamrag.config import load_settings
from streamrag.config.security import ROLES, ApiKeySpec, KeyFile, KeyLimitSettings
from streamrag.errors import ConfigError
from streamrag.ingest import Decoder
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.auth import (
    KEY_PREFIX,
    OPEN,
    ROUTE_ROLES,
    KeyRing,
    check_bind,
    hash_key,
    new_key,
)
from streamrag.serve.server import check_serving
from streamrag.sources.base import RawBatch
from streamrag.testing import ManualClock, change_line
from tests.serve.test_tenancy import KEYS, auth, keyed_service

runner = CliRunner()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = keyed_service(tmp_path_factory.mktemp("auth"))
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(create_app(service, manage_service=False)) as c:
        yield c


# -- keys and the key file -------------------------------------------------------------


def test_keys_are_random_tokens_kept_as_sha256() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert key.startswith(KEY_PREFIX)
        assert len(key) == len(KEY_PREFIX) + 43  # 32 bytes, URL-safe base64
    key = next(iter(keys))
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()


def test_the_key_file_holds_hashes_and_is_written_whole(tmp_path: Path) -> None:
    store = KeyFile(tmp_path / "keys.yaml")
    assert store.read() == []
    key = new_key()
    spec = ApiKeySpec(name="acme-app", tenant="acme", role="reader", sha256=hash_key(key))
    store.add(spec)
    assert key not in store.path.read_text()
    assert store.read() == [spec]
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="already has a key named 'acme-app'"):
        store.add(spec)
    assert store.remove("acme-app") == spec
    assert store.read() == []
    with pytest.raises(ConfigError, match="no key named 'acme-app'"):
        store.remove("acme-app")
    (tmp_path / "bad.yaml").write_text("keys:\n  - name: x\n    tenant: t\n    role: boss\n")
    with pytest.raises(ConfigError, match="bad entry"):
        KeyFile(tmp_path / "bad.yaml").read()


def test_a_key_is_never_stored_in_settings() -> None:
    with pytest.raises(ConfigError):
        load_settings(
            overrides={
                "security.keys": [{"name": "k", "tenant": "t", "role": "reader", "key": new_key()}]
            },
            environ={},
        )


def test_the_ring_reads_the_file_again_and_stays_closed(tmp_path: Path) -> None:
    clock = ManualClock(0)
    path = tmp_path / "keys.yaml"
    ring = KeyRing([], path, KeyLimitSettings(), clock)
    assert not ring.enabled
    key = new_key()
    KeyFile(path).add(ApiKeySpec(name="k1", tenant="t", role="writer", sha256=hash_key(key)))
    assert not ring.enabled  # looked at most once a second
    clock.advance_us(1_000_000)
    principal = ring.authenticate(key)
    assert principal is not None
    assert (principal.name, principal.tenant, principal.role) == ("k1", "t", "writer")
    assert ring.authenticate(new_key()) is None
    assert ring.authenticate(key + "x") is None
    KeyFile(path).remove("k1")
    clock.advance_us(1_000_000)
    assert ring.authenticate(key) is None  # revoked
    assert ring.enabled  # and no key at all does not open the server again
    path.write_text("keys: [")
    clock.advance_us(1_000_000)
    assert ring.enabled
    assert len(ring) == 0


def test_keys_in_config_and_file_with_one_name_are_refused(tmp_path: Path) -> None:
    spec = ApiKeySpec(name="k", tenant="t", role="reader", sha256=hash_key(new_key()))
    KeyFile(tmp_path / "keys.yaml").add(spec)
    with pytest.raises(ConfigError, match=r"both in security\.keys and in the key file"):
        KeyRing([spec], tmp_path / "keys.yaml", KeyLimitSettings(), ManualClock(0))


# -- every route: 401 without a key, 403 below its role ------------------------------------


def _routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, included routers' too."""
    found = []
    for route in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        assert isinstance(route.path, str), route
        found += [(m, route.path) for m in sorted(route.methods or ()) if m != "HEAD"]
    assert len(found) >= 20
    return found


def _url(path: str) -> str:
    return path.replace("{name}", "per_tenant")


def test_every_route_declares_its_role(client: TestClient) -> None:
    paths = {p for _, p in _routes(client)}
    assert paths - set(ROUTE_ROLES) == set(), "give each new route its role in ROUTE_ROLES"
    assert {"/v1/retrieve", "/v1/admin/rollback", "/v1/documents", "/metrics"} <= paths


def test_every_route_needs_a_key_and_its_role(client: TestClient) -> None:
    for method, path in _routes(client):
        needed = ROUTE_ROLES[path]
        if needed is OPEN:
            assert client.request(method, _url(path)).status_code == 200, path
            continue
        for headers in ({}, {"Authorization": f"Bearer {new_key()}"}, {"X-API-Key": "wrong"}):
            r = client.request(method, _url(path), json={}, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"]["type"] == "authentication_error"
            if headers:
                assert "not valid" in r.json()["error"]["message"]
        for name in ("alpha-reader", "alpha-writer", "alpha-admin"):
            role = KEYS[name][1]
            r = client.request(method, _url(path), json={}, headers=auth(name))
            if ROLES.index(role) < ROLES.index(needed):
                assert r.status_code == 403, (method, path, name, r.text)
                assert r.json()["error"]["type"] == "permission_error"
            else:
                assert r.status_code not in (401, 403), (method, path, name, r.text)


def test_both_headers_carry_a_key(client: TestClient) -> None:
    key = KEYS["alpha-reader"][2]
    for headers in (
        {"Authorization": f"Bearer {key}"},
        {"Authorization": f"bearer   {key}"},
        {"X-API-Key": key},
        {"Authorization": "Basic dXNlcjpwYXNz", "X-API-Key": key},
    ):
        assert client.get("/v1/models", headers=headers).status_code == 200, headers
    assert client.get("/v1/models", headers={"Authorization": key}).status_code == 401


def test_a_route_without_a_declared_role_needs_an_admin_key(service: Service) -> None:
    app = create_app(service, manage_service=False)

    @app.get("/v1/new-thing")
    async def new_thing() -> dict[str, str]:
        return {"secret": "everyone's"}

    with TestClient(app) as c:
        assert c.get("/v1/new-thing").status_code == 401
        assert c.get("/v1/new-thing", headers=auth("alpha-writer")).status_code == 403
        assert c.get("/v1/new-thing", headers=auth("alpha-admin")).status_code == 200
        assert c.get("/v1/no-such-route").status_code == 401  # no probing without a key
        assert c.get("/v1/no-such-route", headers=auth("alpha-reader")).status_code == 404


def test_metrics_are_for_admins_unless_public(tmp_path: Path, client: TestClient) -> None:
    assert client.get("/metrics", headers=auth("alpha-reader")).status_code == 403
    assert "streamrag_" in client.get("/metrics", headers=auth("alpha-admin")).text
    svc = keyed_service(tmp_path, **{"security.metrics": "public"})
    with TestClient(create_app(svc, manage_service=False)) as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("/v1/status").status_code == 401
    svc.stop()


def test_the_api_description_names_the_keys_when_there_are_some(
    client: TestClient, tmp_path: Path
) -> None:
    schema = client.get("/openapi.json").json()
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    retrieve = schema["paths"]["/v1/retrieve"]["post"]
    assert retrieve["security"] == [{"bearer": []}, {"apiKey": []}]
    assert {"401", "403", "429"} <= set(retrieve["responses"])
    assert "security" not in schema["paths"]["/healthz"]["get"]
    open_svc = _plain_service(tmp_path)
    with TestClient(create_app(open_svc, manage_service=False)) as c:
        plain = c.get("/openapi.json").json()
        assert "securitySchemes" not in plain.get("components", {})
        assert "security" not in plain["paths"]["/v1/retrieve"]["post"]
    open_svc.stop()


# -- without keys: as before, and loopback only ------------------------------------------


def _plain_service(tmp_path: Path) -> Service:
    source = tmp_path / "in.jsonl"
    source.write_text(
        change_line("a1", 0, "alpha text", tenant="a")
        + "\n"
        + change_line("b1", 0, "bravo text", tenant="b")
        + "\n"
    )
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
        },
        environ={},
    )
    svc = Service(settings)
    svc.pipeline.run_until_caught_up()
    return svc


def test_without_keys_requests_name_their_tenant(tmp_path: Path) -> None:
    svc = _plain_service(tmp_path)
    with TestClient(create_app(svc, manage_service=False)) as c:
        r = c.post("/v1/retrieve", json={"query": "text", "filters": {"tenant": "b"}})
        assert [h["doc_id"] for h in r.json()["results"]] == ["b1"]
        assert c.post("/v1/admin/rollback", json={"epoch": svc.index.epoch}).status_code == 200
        change = {"doc_id": "c1", "text": "pushed", "pushed_by": "someone"}
        assert c.post("/v1/documents", json={"changes": [change]}).status_code == 202
    line = next((tmp_path / "state" / "push").glob("journal-*.jsonl")).read_bytes().strip()
    assert b"pushed_by" not in line  # a client cannot claim to be a key
    svc.stop()


def test_the_decoder_keeps_pushed_by_in_the_payload() -> None:
    lines = [
        b'{"doc_id": "d", "event_time": 0, "text": "t", "pushed_by": "k1"}',
        b'{"doc_id": "d", "event_time": 1, "op": "delete", "pushed_by": "k2"}',
        b'{"doc_id": "e", "event_time": 0, "text": "t"}',
    ]
    batch, letters = Decoder().decode([RawBatch("s", lines, [0, 1, 2], 99)])
    assert not letters
    assert [p.get("pushed_by") for p in batch.payloads] == ["k1", "k2", None]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_without_keys_loopback_is_served_with_a_note(host: str) -> None:
    note = check_bind(host, keys=False)
    assert note is not None
    assert "no API keys" in note


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
def test_without_keys_other_addresses_are_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"refusing to listen on .*streamrag keys create"):
        check_bind(host, keys=False)
    warning = check_bind(host, keys=False, insecure=True)
    assert warning is not None
    assert warning.startswith("INSECURE")
    assert check_bind(host, keys=True) is None


def test_serve_refuses_another_address_without_keys_before_starting(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ["serve", "--host", "0.0.0.0", "--port", "1", "--set", f"state_dir={state}"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert "refusing to listen on 0.0.0.0" in result.output
    assert not (state / "index").exists()  # refused before anything was opened
    made = runner.invoke(cli, ["keys", "create", "--tenant", "t", "--set", f"state_dir={state}"])
    assert made.exit_code == 0, made.output
    settings = load_settings(
        overrides={"state_dir": str(state), "serve.host": "0.0.0.0"}, environ={}
    )
    assert check_serving(settings) is None  # keys in <state_dir>/keys.yaml: any address


def test_roles_hold_behind_a_proxy_prefix(service: Service) -> None:
    """Behind ``--root-path /api`` paths hold the prefix: routes are found as the router does."""
    app = create_app(service, manage_service=False)

    async def main() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, root_path="/api")
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                reader = auth("alpha-reader")
                return [
                    await c.post("/api/v1/admin/rollback", json={"epoch": 1}, headers=reader),
                    await c.get("/api/v1/status"),
                    await c.get("/api/healthz"),
                    await c.post("/api/v1/retrieve", json={"query": "forecast"}, headers=reader),
                    await c.get("/api/v1/windows/per_domain", headers=reader),
                ]

    rollback, status, health, retrieve, window = asyncio.run(main())
    assert rollback.status_code == 403, rollback.text
    assert status.status_code == 401
    assert health.status_code == 200
    assert retrieve.status_code == 200, retrieve.text
    assert retrieve.json()["results"]
    assert "bravo" not in retrieve.text
    assert window.status_code == 403
