"""The embedding service dies mid-stream: ingest goes on with the fallback, and comes back."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrag.testing import change_line
from tests.e2e.conftest import Server, free_port, wait_for

pytestmark = pytest.mark.slow

REMOTE = "openai:served:d64"
LOCAL = "hashing-blake2b-v1-d64"


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _made_by(server: Server, doc_id: str) -> list[str]:
    body = server.retrieve(query=doc_id, k=3, filters={"doc_id": doc_id})
    return [h["embedder"] for h in body["results"]]


def test_ingest_falls_back_while_the_remote_embedder_is_down(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    # The embedding service: another streamrag serving /v1/embeddings (hashing, 64 dims).
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    svc_cfg = tmp_path / "embedding-service.yaml"
    svc_cfg.write_text(
        f"source: {{path: {empty}}}\nstate_dir: {tmp_path / 'svc'}\n"
        "embedder: {class: hashing, args: {dim: 64}}\n"
    )
    port = free_port()
    remote = start_server("run", str(svc_cfg), port=port)
    remote.wait_ready()

    data = tmp_path / "changes.jsonl"
    _append(data, [change_line(f"a{i}", "2024-01-01T00:00:00Z", f"alpha {i}") for i in range(10)])
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"""
source: {{path: {data}, poll_interval_ms: 5}}
state_dir: {tmp_path / "state"}
batcher: {{max_delay_ms: 20}}
embedder:
  class: openai
  args: {{url: "http://127.0.0.1:{port}/v1", model: served, dim: 64, attempts: 1,
          timeout_s: 2, space: {LOCAL}}}
  attempts: 1
  fallback: {{class: hashing, args: {{dim: 64}}}}
  probe_every_ms: 100
"""
    )
    job = start_server("run", str(cfg))
    job.wait_ready()
    wait_for(lambda: job.status()["counts"]["applied"] == 10, 60, "the first documents")
    assert job.status()["embedding"]["role"] == "primary"
    assert _made_by(job, "a3") == [REMOTE]

    remote.stop(signal.SIGKILL)  # the embedding service dies mid-stream
    _append(data, [change_line(f"b{i}", "2024-01-01T00:01:00Z", f"beta {i}") for i in range(10)])
    wait_for(lambda: job.status()["counts"]["applied"] == 20, 60, "ingest on the fallback")
    emb = job.status()["embedding"]
    assert emb["role"] == "fallback"
    assert emb["fallback"]["circuit"] == "open"
    assert "failed" in emb["why"]
    assert _made_by(job, "b3") == [LOCAL]  # each chunk says which embedder made its vector
    assert _made_by(job, "a3") == [REMOTE]  # and queries still find the others

    back = start_server("run", str(svc_cfg), port=port)  # the service comes back
    back.wait_ready()

    def on_primary() -> bool:
        _append(data, [change_line("probe", "2024-01-01T00:02:00Z", "probe text")])
        return bool(job.status()["embedding"]["role"] == "primary")

    wait_for(on_primary, 60, "the pipeline to return to the remote embedder")
    _append(data, [change_line(f"c{i}", "2024-01-01T00:03:00Z", f"gamma {i}") for i in range(5)])
    wait_for(lambda: _made_by(job, "c4") == [REMOTE], 60, "new documents on the remote embedder")
    assert job.status()["embedding"]["fallback"]["circuit"] == "closed"
