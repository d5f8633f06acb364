"""Backpressure: a source far faster than the embedder, for a minute, in bounded memory.

A writer appends over 1 MB/s of changes while the job's embedder manages 400
texts a second. Without backpressure the reader would pull the whole growing
file into memory (well over 100 MB of JSON in a minute, several times that as
Python objects). With it, the batcher fills up to its bound, the reader pauses,
and the process stays within a fixed memory budget while committing exactly as
fast as the embedder allows. ``/v1/status`` says so while it happens.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Server, rss_mib

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EMBED_RATE = 400.0  # texts per second the slow embedder manages
RUN_S = 60.0
WARMUP_S = 10.0
RSS_BOUND_MIB = 300  # the process' memory budget for this job
READ_BYTES = 262_144
T0 = 1_704_067_200


def _writer(path: Path, stop: threading.Event, written: list[int]) -> None:
    """Append one-chunk upserts (over 1 MB/s) until told to stop."""
    rng = random.Random(3)
    words = ["ledger", "invoice", "refund", "ticket", "deploy", "rollback", "vpn", "quota"]
    i = 0
    with open(path, "a", encoding="utf-8") as fh:
        while not stop.is_set():
            block = []
            for _ in range(500):
                text = f"change {i} " + " ".join(rng.choice(words) for _ in range(70))
                block.append(
                    json.dumps({"doc_id": f"d{i % 5000}", "event_time": T0 + i, "text": text})
                )
                i += 1
            data = "\n".join(block) + "\n"
            fh.write(data)
            fh.flush()
            written[0] += len(data)
            stop.wait(0.2)  # up to 2,500 changes (2.5 MB) a second


def test_a_slow_embedder_pauses_the_source_and_memory_stays_bounded(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    data = tmp_path / "changes.jsonl"
    data.touch()
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp_path / "state"}
source: {{path: {data}, max_read_bytes: {READ_BYTES}}}
embedder: {{class: "tests.runtime.embedders:Slow", args: {{dim: 64, texts_per_s: {EMBED_RATE}}}}}
batcher: {{max_batch_size: 64, max_pending: 512, max_pending_bytes: 1048576}}
chunking: {{max_tokens: 128, tokens: words}}
index: {{retention_s: 1}}
""",
        encoding="utf-8",
    )
    server = start_server("run", str(cfg))
    proc, http = server.proc, server.http
    stop = threading.Event()
    written = [0]
    writer = threading.Thread(target=_writer, args=(data, stop, written), daemon=True)
    try:
        server.wait_ready(60)
        writer.start()
        started = time.monotonic()
        samples: list[tuple[float, float, dict[str, Any]]] = []
        while (elapsed := time.monotonic() - started) < RUN_S:
            assert proc.poll() is None, server.log.read_text()[-3000:]
            samples.append((elapsed, rss_mib(proc.pid), http.get("/v1/status").json()))
            time.sleep(1.0)  # sampling interval of a one-minute soak
        stop.set()
        writer.join()
    finally:
        stop.set()
        server.stop(signal.SIGTERM)

    steady = [s for s in samples if s[0] >= WARMUP_S]
    first, last = steady[0], steady[-1]
    # The source is far ahead: a growing backlog the job has not read.
    assert last[2]["queues"]["source_backlog_bytes"] > 40 * 2**20
    assert written[0] > 60 * 2**20
    # Backpressure is on and visible; the queue stays within its bounds.
    assert sum(s[2]["backpressure"]["on"] for s in steady) >= len(steady) // 2
    assert last[2]["backpressure"]["paused_polls"] > 0
    for _, _, st in steady:
        # The bound is checked before each read and a read is cut to the room
        # left (64 KiB at least), so at most one read lands past it.
        q = st["queues"]["batcher"]
        assert q["bytes"] <= q["max_bytes"] + 65_536  # reads shrink to the room left
        assert q["chunks"] <= q["max_chunks"] + READ_BYTES // 400
    # Memory stays under the budget and flat while the backlog grows by 100+ MB.
    peak = max(rss for _, rss, _ in steady)
    assert peak < RSS_BOUND_MIB, [round(rss) for _, rss, _ in samples]
    assert last[1] - first[1] < 60, [round(rss) for _, rss, _ in samples]
    # Throughput is the embedder's: the pipeline is never what holds it back.
    done = last[2]["counts"]["chunks_embedded"] - first[2]["counts"]["chunks_embedded"]
    rate = done / (last[0] - first[0])
    assert 0.85 * EMBED_RATE <= rate <= 1.05 * EMBED_RATE, rate
