"""A model migration survives SIGKILL: the restarted job resumes the backfill where it was."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrag.testing import change_line
from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.slow

DOCS = 300


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_sigkill_during_a_migration_resumes_it(
    tmp_path: Path, start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "changes.jsonl"
    _append(
        data,
        [change_line(f"d{i}", "2024-01-01T00:00:00Z", f"document {i} text") for i in range(DOCS)],
    )
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"source: {{path: {data}, poll_interval_ms: 5}}\nstate_dir: {tmp_path / 'state'}\n"
        "embedder: {class: hashing, args: {dim: 64}}\nbatcher: {max_delay_ms: 20}\n"
    )
    # The new model's embedder kills the process on the backfill's second call.
    monkeypatch.setenv("KILLTEST_BACKFILL_CALL", "2")
    first = start_server("run", str(cfg))
    first.wait_ready()
    wait_for(lambda: first.status()["counts"]["applied"] == DOCS, 60, "the documents")
    spec = {"class": "tests.runtime.embedders:BackfillKiller", "args": {"dim": 48}}
    r = first.http.post("/v1/admin/reindex", json={**spec, "switch": False})
    assert r.status_code == 202, r.text
    assert r.json()["building"]["generation"] == 2
    wait_for(lambda: first.proc.poll() is not None, 60, "the SIGKILL during the backfill")
    assert first.proc.returncode == -signal.SIGKILL

    monkeypatch.delenv("KILLTEST_BACKFILL_CALL")
    second = start_server("run", str(cfg))
    second.wait_ready()
    _append(data, [change_line(f"n{i}", "2024-01-02T00:00:00Z", f"new {i}") for i in range(20)])

    def filled() -> dict[str, object] | None:
        building = second.http.get("/v1/admin/generations").json().get("building")
        return building if building and building["backfill"]["done"] else None

    building = wait_for(filled, 60, "the resumed backfill")
    fill = building["backfill"]
    # Resumed, not restarted: what was committed before the kill is skipped.
    assert fill["docs_skipped"] >= 256
    assert fill["docs_done"] + fill["docs_skipped"] == fill["docs_total"]
    wait_for(lambda: second.status()["counts"]["applied"] == DOCS + 20, 60, "the new documents")
    assert second.retrieve(query="document 7")["generation"] == 1  # not switched yet

    switched = second.http.post("/v1/admin/generations/switch", json={}).json()
    assert switched["serving"] == 2
    body = second.retrieve(query="document 7", k=3, filters={"doc_id": "d7"})
    assert body["generation"] == 2
    assert [h["embedder"] for h in body["results"]] == ["hashing-blake2b-v1-d48"]
    gens = {g["number"]: g for g in switched["generations"]}
    # Nothing lost or doubled: each generation holds every document once.
    assert gens[1]["live_docs"] == gens[2]["live_docs"] == DOCS + 20
    assert second.status()["index"]["live_chunks"] == DOCS + 20

    rolled = second.http.post("/v1/admin/generations/rollback", json={}).json()
    assert rolled["serving"] == 1
    assert second.retrieve(query="document 7")["generation"] == 1
