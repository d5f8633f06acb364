"""``streamrag keys``: a key is shown once, only its hash is kept, a revoked key is refused."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from streamrag.cli import app
from streamrag.config import load_settings
from streamrag.serve import create_app
from streamrag.serve.auth import KEY_PREFIX, KeyRing, hash_key, new_key
from streamrag.testing import ManualClock
from tests.serve.conftest import ThreadedUvicorn
from tests.serve.test_tenancy import KEYS, keyed_service

runner = CliRunner()


def _create(*args: str) -> str:
    result = runner.invoke(app, ["keys", "create", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def test_create_prints_the_key_once_and_keeps_its_hash(tmp_path: Path) -> None:
    file = tmp_path / "keys.yaml"
    key = _create("--tenant", "acme", "--role", "writer", "--name", "acme-ci", "--file", str(file))
    assert key.startswith(KEY_PREFIX)
    assert len(key) == len(KEY_PREFIX) + 43
    text = file.read_text()
    assert key not in text
    (row,) = yaml.safe_load(text)["keys"]
    assert row["name"] == "acme-ci"
    assert row["tenant"] == "acme"
    assert row["role"] == "writer"
    assert row["sha256"] == hash_key(key)
    assert row["created"].endswith("Z")
    ring = KeyRing([], file, load_settings(environ={}).security.limits, ManualClock(0))
    principal = ring.authenticate(key)
    assert principal is not None
    assert (principal.name, principal.tenant, principal.role) == ("acme-ci", "acme", "writer")
    other = _create("--tenant", "acme shop", "--file", str(file))
    assert other != key
    names = [r["name"] for r in yaml.safe_load(file.read_text())["keys"]]
    assert names[0] == "acme-ci"
    assert names[1].startswith("acme-shop-reader-")


def test_create_refuses_what_it_cannot_keep(tmp_path: Path) -> None:
    file = str(tmp_path / "keys.yaml")
    _create("--tenant", "t", "--name", "one", "--file", file)
    for args, reason in (
        (["--tenant", "t", "--name", "one"], "already has a key named 'one'"),
        (["--tenant", "t", "--role", "root"], "expected one of reader, writer, admin"),
        (["--tenant", " t "], "without spaces"),
        (["--tenant", "t", "--name", "bad name!"], "cannot make this key"),
    ):
        result = runner.invoke(app, ["keys", "create", *args, "--file", file])
        assert result.exit_code == 2, args
        assert reason in " ".join(result.output.split()), result.output
    assert [r["name"] for r in yaml.safe_load(Path(file).read_text())["keys"]] == ["one"]


def test_list_shows_names_tenants_and_roles_never_hashes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    key = _create("--tenant", "acme", "--role", "admin", "--set", f"state_dir={state}")
    configured = {"name": "from-config", "tenant": "globex", "role": "reader"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(state),
                "security": {"keys": [{**configured, "sha256": hash_key(new_key())}]},
            }
        )
    )
    result = runner.invoke(app, ["keys", "list", "--config", str(cfg), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["name"], r["tenant"], r["role"], r["in"]) for r in rows] == [
        ("from-config", "globex", "reader", "config"),
        (rows[1]["name"], "acme", "admin", str(state / "keys.yaml")),
    ]
    table = runner.invoke(app, ["keys", "list", "--config", str(cfg)], env={"COLUMNS": "200"})
    assert "from-config" in table.output
    assert rows[1]["name"] in table.output
    for secret in (key, hash_key(key)):
        assert secret not in result.output + table.output
    refused = runner.invoke(app, ["keys", "revoke", "from-config", "--config", str(cfg)])
    assert refused.exit_code == 2
    assert "security.keys of the configuration" in " ".join(refused.output.split())


def test_a_revoked_key_is_refused_by_the_running_server(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000_000_000)
    file = tmp_path / "keys.yaml"
    svc = keyed_service(tmp_path, clock, **{"security.key_file": str(file)})
    key = _create("--tenant", "tenant-alpha", "--name", "cli-made", "--file", str(file))
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        query = ["query", "quarterly revenue forecast", "--url", server.url, "--json"]
        ok = runner.invoke(app, [*query, "--api-key", key])
        assert ok.exit_code == 0, ok.output
        body = json.loads(ok.stdout)
        assert {r["tenant"] for r in body["results"]} == {"tenant-alpha"}
        via_env = runner.invoke(app, query, env={"STREAMRAG_API_KEY": key})
        assert via_env.exit_code == 0, via_env.output
        anonymous = runner.invoke(app, query)
        assert anonymous.exit_code == 1
        assert "401" in anonymous.output
        status = runner.invoke(app, ["status", "--url", server.url, "--api-key", key])
        assert json.loads(status.stdout)["tenant"] == "tenant-alpha"
        revoked = runner.invoke(app, ["keys", "revoke", "cli-made", "--file", str(file)])
        assert revoked.exit_code == 0, revoked.output
        clock.advance_us(1_000_000)  # the server looks at the file at most once a second
        refused = runner.invoke(app, [*query, "--api-key", key])
        assert refused.exit_code == 1
        assert "not valid" in refused.output
        assert runner.invoke(app, [*query, "--api-key", KEYS["alpha-reader"][2]]).exit_code == 0
    svc.stop()
