"""A Redis stream into the index, through SIGKILLs: no change lost, none twice, none back.

A writer thread XADDs streamrag changes (upserts, deletes, a few malformed
records and a few entries without the ``data`` field) to a fresh stream while
``python -m streamrag run CFG`` reads it in a consumer group. The job is killed
with SIGKILL six times mid-stream and restarted: three times a moment after a
commit, three times by its own embedder in the middle of a commit, when read
entries are sure to be waiting uncommitted. At the end it is stopped gracefully
and the index is compared with last-writer-wins over what was added; every bad
entry is one dead letter at its entry's offset, the counts add up, and the
group has nothing left unacknowledged.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.exceptions import RedisError

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.ingest import DeadLetterStore
from streamrag.sources.redis_streams import entry_offset
from tests.e2e.conftest import Server, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

REDIS_URL = "redis://127.0.0.1:6379/0"
N = 2400
CHUNK = 30
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


@dataclass
class Truth:
    """What was added, and by a plain model what the index must end with."""

    latest: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # doc -> (op, t, text)
    bad: list[int] = field(default_factory=list)  # offsets of the entries that dead-letter
    added: int = 0


def _entries(seed: int) -> list[tuple[dict[str, bytes], str | None, tuple[str, int, str] | None]]:
    """(fields, doc, outcome) per entry; event times rise, so the last added wins."""
    rng = random.Random(seed)
    out: list[tuple[dict[str, bytes], str | None, tuple[str, int, str] | None]] = []
    for i in range(N):
        doc = f"doc-{rng.randrange(300)}"
        t = T0 + i
        roll = rng.random()
        if roll < 0.02:
            out.append(({"data": b'{"doc_id": "x", "event_time": '}, None, None))
        elif roll < 0.03:
            out.append(({"payload": b"{}", "key": doc.encode()}, None, None))
        elif roll < 0.18:
            body = {"doc_id": doc, "event_time": t, "op": "delete"}
            out.append(({"data": json.dumps(body).encode()}, doc, ("delete", t, "")))
        else:
            text = f"{doc} revision {i} " + " ".join(rng.choice(WORDS) for _ in range(6))
            body = {"doc_id": doc, "event_time": t, "text": text}
            out.append(
                ({"data": json.dumps(body).encode(), "key": doc.encode()}, doc, ("upsert", t, text))
            )
    return out


def _write(client: redis.Redis, key: str, truth: Truth, done: threading.Event) -> None:
    try:
        entries = _entries(seed=7)
        for start in range(0, N, CHUNK):
            pipe = client.pipeline(transaction=False)
            chunk = entries[start : start + CHUNK]
            for fields, _, _ in chunk:
                pipe.xadd(key, fields)
            ids = pipe.execute()
            for entry_id, (_, doc, outcome) in zip(ids, chunk, strict=True):
                if doc is None:
                    truth.bad.append(entry_offset(entry_id))
                else:
                    assert outcome is not None
                    truth.latest[doc] = outcome
            truth.added += len(chunk)
            time.sleep(0.2)  # about 16 s of writing: the kills land mid-stream
    finally:
        done.set()


@pytest.fixture
def stream() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    key = f"streamrag-e2e-{uuid.uuid4().hex[:12]}"
    yield client, key
    client.delete(key)
    client.close()


def _config(tmp: Path, key: str) -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
source: {{poll_interval_ms: 5}}
sources:
  - {{kind: redis, name: r, streams: [{key}], group: e2e, consumer: job, claim_idle_ms: 1000}}
embedder: {{class: "tests.runtime.embedders:SelfKilling", args: {{dim: 64}}}}
batcher: {{max_batch_size: 64, max_delay_ms: 5, adaptive: false}}
index: {{checkpoint_every: 16, seal_rows: 1024}}
""",
        encoding="utf-8",
    )
    return cfg


def _log_state(state: Path) -> tuple[tuple[str, ...], int]:
    """The index's manifests and log size: any commit changes one of them."""
    index = state / "index"
    manifests = tuple(sorted(p.name for p in index.glob("manifest-*.json")))
    return manifests, _wal_bytes(state)


def _wal_bytes(state: Path) -> int:
    index = state / "index"
    return sum(p.stat().st_size for p in index.glob("wal-*.log")) if index.exists() else 0


def _start(cfg: Path, tmp: Path, n: int) -> Server:
    port = free_port()
    return Server(["run", str(cfg), "--port", str(port)], port, tmp, tmp / f"job-{n}.log")


def test_sigkill_mid_stream_ends_with_the_stream_last_writer_wins(
    tmp_path: Path, stream: tuple[redis.Redis, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, key = stream
    cfg = _config(tmp_path, key)
    state = tmp_path / "state"
    truth, done = Truth(), threading.Event()
    writer = threading.Thread(target=_write, args=(client, key, truth, done), daemon=True)
    rng = random.Random(3)

    kills = mid_stream = in_commit = 0
    writer.start()
    while kills < 6:
        by_embedder = kills % 2 == 1  # every second kill lands inside a commit, by design
        if by_embedder:
            monkeypatch.setenv("KILLTEST_AT_CALL", str(rng.randrange(2, 8)))
            monkeypatch.setenv("KILLTEST_AFTER_US", str(rng.choice([0, 200, 1000, 3000])))
        server = _start(cfg, tmp_path, kills)
        monkeypatch.delenv("KILLTEST_AT_CALL", raising=False)
        monkeypatch.delenv("KILLTEST_AFTER_US", raising=False)
        if by_embedder:
            wait_for(lambda s=server: s.proc.poll() is not None, 60, "the embedder to kill its job")
        else:
            # A commit grows the log or, at a checkpoint, truncates it and adds a manifest;
            # once the stream is written there may be nothing left to commit.
            seen = _log_state(state)
            wait_for(
                lambda s=server, n=seen: (
                    s.proc.poll() is not None or _log_state(state) != n or done.is_set()
                ),
                60,
                "a commit",
            )
            assert server.proc.poll() is None, (tmp_path / f"job-{kills}.log").read_text()[-3000:]
            time.sleep(rng.uniform(0.0, 0.3))
        mid_stream += not done.is_set()
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        kills += 1
        in_commit += by_embedder
    writer.join(60)
    assert done.is_set()
    assert mid_stream >= 4, f"only {mid_stream} kills landed while the stream was written"
    assert in_commit == 3

    final = _start(cfg, tmp_path, kills)
    try:
        final.wait_ready()

        def caught_up() -> bool:
            status = final.status()
            counts = status["counts"]
            return counts["ingested"] == N and counts["pending"] == 0

        wait_for(caught_up, 60, "the job to catch up")
        status = final.status()
        health = status["sources"]["r"]
        assert health["connected"] is True
        assert health["lag"] == 0
    finally:
        assert final.stop(signal.SIGINT) == 0, (tmp_path / f"job-{kills}.log").read_text()[-3000:]

    # The accounting: every entry read once, applied or refused once.
    counts = status["counts"]
    assert counts["dead_lettered"] == len(truth.bad)
    assert counts["applied"] == N - len(truth.bad)
    assert status["recovery"]["resumed_from_epoch"] is not None

    # The index: last-writer-wins over what was added.
    live = {d: (t * 1_000_000, text) for d, (op, t, text) in truth.latest.items() if op == "upsert"}
    deleted = {d for d, (op, _, _) in truth.latest.items() if op == "delete"}
    index = LsmIndex(
        64, lsm_spec(IndexSettings(checkpoint_every=16, seal_rows=1024)), path=state / "index"
    )
    try:
        rows = index.export()
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids))  # nothing applied twice
        docs: dict[str, tuple[int, str]] = {}
        for hit, _ in rows:
            assert hit.doc_id not in docs  # one chunk per (short) document
            docs[hit.doc_id] = (hit.event_time, hit.text)
        assert set(docs) == set(live)  # nothing lost, nothing resurrected
        assert docs == live  # each at its newest version
        for doc in deleted:
            doc_state = index.doc_state("default", doc)
            assert doc_state is not None
            assert doc_state.deleted
    finally:
        index.close()

    # One dead letter per bad entry, at the entry's offset, whatever the restarts.
    letters = list(DeadLetterStore(state / "deadletter.jsonl").read())
    assert sorted(le.offset for le in letters) == sorted(truth.bad)
    assert any("no field 'data'" in le.raw for le in letters)
    # Acknowledged once committed: the graceful stop's last commit acknowledged the rest.
    assert client.xpending(key, "e2e")["pending"] == 0
