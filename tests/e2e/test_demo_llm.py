"""`streamrag demo --llm local`: the demo answering through llama.cpp on 127.0.0.1."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from streamrag.serve.local_llm import SMOLLM2_FILE
from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parents[2] / ".models" / SMOLLM2_FILE


def test_demo_with_a_local_llm_answers_with_citations(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run `make models` (make test does it)")
    server = start_server(
        "demo",
        "--workdir",
        str(tmp_path / "demo"),
        "--embedder",
        "hashing",
        "--llm",
        "local",
        "--llm-model",
        str(MODEL),
    )
    server.wait_ready(timeout=120)
    log = wait_for(
        lambda: "Status: curl" in server.log.read_text() and server.log.read_text(), 30, "banner"
    )
    assert re.search(r"Answers: the LLM at http://127\.0\.0\.1:\d+/v1", log), log
    assert "/v1/answer" in log
    llm = [p for p in psutil.Process(server.proc.pid).children(recursive=True)]
    assert llm, "the local LLM runs as a child process"

    r = server.http.post(
        "/v1/answer",
        json={"query": "how do I rotate the database password?", "k": 2, "max_tokens": 8},
        timeout=120,
    )
    body = r.json()
    assert r.status_code == 200, body
    assert body["generator"] == "llm", body
    assert body["context"]["tokenizer"] == "server"
    assert body["context"]["tokens"] <= 384
    assert body["citations"][0]["doc_id"].startswith("ops/rotate-the-")
    assert 0 < body["usage"]["completion_tokens"] <= 8

    assert server.stop() == 0
    _gone, alive = psutil.wait_procs(llm, timeout=20)
    assert not alive, "stopping the demo stops its LLM"
    with pytest.raises(httpx.TransportError):
        httpx.get(log.split("Answers: the LLM at ")[1].split("/v1")[0] + "/health", timeout=2)
