"""`make demo` end to end: the bundled corpus, the real MiniLM model, the printed curl commands."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.slow


def test_demo_answers_its_printed_curl_queries(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    server = start_server("demo", "--workdir", str(tmp_path / "demo"))
    server.wait_ready(timeout=240)
    log = wait_for(
        lambda: "Status: curl" in server.log.read_text() and server.log.read_text(),
        30,
        "the banner",
    )
    commands = re.findall(r"(curl -s \S+/v1/retrieve .*?\\\n\s+-d '.*?')", log, re.S)
    assert len(commands) == 2, log
    answers = []
    for command in commands:
        assert "127.0.0.1" in command
        out = subprocess.run(
            ["bash", "-c", command.replace("\\\n", " ")],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        answers.append(json.loads(out))

    password, vpn = answers
    top = password["results"][0]
    assert top["doc_id"].startswith("ops/rotate-the-")
    assert "password" in top["text"].lower()
    assert top["embedder"] == "onnx/all-MiniLM-L6-v2/int8"  # --embedder auto, ONNX installed
    assert all(r["domain"] == "it-support" for r in vpn["results"])
    assert "disconnect" in vpn["results"][0]["text"].lower()

    status = server.status()
    counts = status["counts"]
    assert counts["dead_lettered"] == 5  # the corpus carries five malformed lines
    assert counts["ingested"] == counts["applied"] + counts["dead_lettered"]
    assert status["index"]["deleted_docs"] == 15
    # The stale draft that arrives last never replaced the current version.
    assert "OUTDATED" not in json.dumps(
        server.retrieve(query="OUTDATED DRAFT that must never be served", k=20)
    )
    # The README's as_of example: a page deleted on 2024-08-17 was there on 10 August.
    zoom = "it-support/zoom-keeps-disconnecting"
    then = server.retrieve(query="Zoom keeps disconnecting", k=1, as_of="2024-08-10T00:00:00Z")
    assert [r["doc_id"] for r in then["results"]] == [zoom]
    now = server.retrieve(query="Zoom keeps disconnecting", k=5, filters={"doc_id": zoom})
    assert now["results"] == []
    assert server.stop() == 0
    assert "stopped at epoch" in server.log.read_text()
