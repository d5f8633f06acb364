"""Done-when for the NATS connector: SIGKILL mid-stream, restart, and the index is exact.

A publisher sends a stream of streamrag changes (upserts, updates, deletes,
event times out of order, a few malformed messages) to a JetStream stream
while ``python -m streamrag run CFG`` reads it through a durable consumer. The
job is killed with SIGKILL several times — at random moments after it has
committed something, and once by its own embedder inside a commit — and
restarted each time. At the end the index must equal last-writer-wins over
what was published (by event time, then stream sequence): nothing lost,
nothing applied twice, no deleted document back, one dead letter per
malformed message, and every message acked at the server.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("nats")

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.ingest import DeadLetterStore
from tests.e2e.conftest import Server, audit_records, wait_for
from tests.sources.test_nats import SERVER, Js, _up

N = 4000
RATE = 250.0  # messages per second: the stream lasts ~16 s, across the kills
T0 = 1_704_067_200
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def _changes(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out: list[bytes] = []
    for i in range(N):
        t = T0 + i - rng.randrange(0, 30)  # out of order within the bound
        doc = f"doc-{rng.randrange(400)}"
        roll = rng.random()
        if roll < 0.02:
            out.append(rng.choice([b'{"doc_id": "x", "event_time": ', b"not json", b""]))
        elif roll < 0.15:
            out.append(json.dumps({"doc_id": doc, "event_time": t, "op": "delete"}).encode())
        else:
            text = f"{doc} revision {i} " + " ".join(rng.choice(WORDS) for _ in range(6))
            out.append(json.dumps({"doc_id": doc, "event_time": t, "text": text}).encode())
    return out


def _expected(
    published: list[tuple[int, bytes]],
) -> tuple[dict[str, tuple[int, str]], set[str], list[int]]:
    """Last-writer-wins over (event time, sequence): live docs, deleted docs, malformed seqs."""
    latest: dict[str, tuple[int, int, str, str]] = {}
    malformed: list[int] = []
    for seq, data in published:
        try:
            rec = json.loads(data)
        except ValueError:
            malformed.append(seq)
            continue
        t = rec["event_time"] * 1_000_000
        op = rec.get("op", "upsert")
        held = latest.get(rec["doc_id"])
        if held is None or (t, seq) > (held[0], held[1]):
            latest[rec["doc_id"]] = (t, seq, op, rec.get("text", ""))
    live = {d: (t, text) for d, (t, _, op, text) in latest.items() if op == "upsert"}
    deleted = {d for d, (_, _, op, _) in latest.items() if op == "delete"}
    return live, deleted, sorted(malformed)


class Publisher(threading.Thread):
    """Publishes the changes at a steady rate; records the sequence of each."""

    def __init__(self, js: Js, stream: str, changes: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.js, self.stream, self.changes = js, stream, changes
        self.published: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            for i in range(0, len(self.changes), 25):
                part = self.changes[i : i + 25]
                seqs = self.js.publish(self.stream, *part)
                self.published.extend(zip(seqs, part, strict=True))
                ahead = started + (i + 25) / RATE - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # the publisher's pace, not a wait in the test
        except BaseException as exc:  # reported by the test
            self.error = exc


def _config(tmp: Path, stream: str, durable: str) -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
sources: [{{kind: nats, name: q, stream: {stream}, durable: {durable}, servers: ["{SERVER}"]}}]
embedder: {{class: "tests.runtime.embedders:SelfKilling", args: {{dim: 64}}}}
batcher: {{max_batch_size: 64, max_delay_ms: 5, adaptive: false}}
event_time: {{max_out_of_orderness_ms: 60000}}
index: {{checkpoint_every: 16, seal_rows: 1024}}
""",
        encoding="utf-8",
    )
    return cfg


@pytest.mark.timeout(150)
def test_sigkill_mid_stream_ends_with_the_published_state(
    tmp_path: Path,
    start_server: Callable[..., Server],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not _up(SERVER):
        pytest.skip("no NATS server at 127.0.0.1:4222")
    stream = "SRE" + uuid.uuid4().hex[:10]
    durable = "job"
    js = Js()
    try:
        js.add_stream(stream)
        changes = _changes(seed=7)
        # Some of the stream is there before the job first starts (the initial load).
        head = 300
        publisher = Publisher(js, stream, changes[head:])
        publisher.published.extend(
            zip(js.publish(stream, *changes[:head]), changes[:head], strict=True)
        )
        cfg = _config(tmp_path, stream, durable)
        state = tmp_path / "state"
        rng = random.Random(3)
        kills = recreated = 0
        started_publishing = False
        for round_ in range(5):
            if round_ == 3:  # this one dies inside a commit, by its own embedder
                monkeypatch.setenv("KILLTEST_AT_CALL", "4")
                monkeypatch.setenv("KILLTEST_AFTER_US", "500")
            server = start_server("run", str(cfg))
            if not started_publishing:
                publisher.start()
                started_publishing = True
            seen = audit_records(state)
            wait_for(
                lambda: server.proc.poll() is not None or audit_records(state) > seen,  # noqa: B023
                60,
                "a commit",
            )
            if round_ != 3:
                server.wait_ready()
                recreated += server.status()["sources"]["q"]["recreated"]
                time.sleep(rng.uniform(0.2, 1.5))
                server.proc.send_signal(signal.SIGKILL)
            code = server.proc.wait(60)
            server.stop()
            assert code == -signal.SIGKILL, server.log.read_text()[-2000:]
            kills += 1
            monkeypatch.delenv("KILLTEST_AT_CALL", raising=False)
            monkeypatch.delenv("KILLTEST_AFTER_US", raising=False)
        publisher.join(60)
        assert not publisher.is_alive()
        assert publisher.error is None, publisher.error
        assert kills == 5
        # A restart after a kill finds messages delivered and unacked at the durable: it is
        # made again at the oldest waiting sequence instead of waiting out ack_wait.
        assert recreated >= 1
        assert len(publisher.published) == N
        live, deleted, malformed = _expected(publisher.published)

        final = start_server("run", str(cfg))
        final.wait_ready()

        def caught_up() -> dict[str, Any] | None:
            status = final.status()
            counts = status["counts"]
            done = counts["ingested"] == N and counts["pending"] == 0
            return status if done else None

        status = wait_for(caught_up, 60, "the job to apply the whole stream")
        counts = status["counts"]
        assert counts["dead_lettered"] == len(malformed)
        assert counts["applied"] == N - len(malformed)
        assert status["recovery"]["resumed_from_epoch"] is not None
        health = status["sources"]["q"]
        assert health["kind"] == "nats"
        assert health["connected"] is True
        # Every message is acked once its commit is in (a killed job's acks are made good).
        wait_for(lambda: js.consumer(stream, durable).num_ack_pending == 0, 30, "every ack")
        assert js.consumer(stream, durable).ack_floor.stream_seq == publisher.published[-1][0]
        assert final.stop() == 0
    finally:
        js.close(stream)

    settings = IndexSettings(checkpoint_every=16, seal_rows=1024)
    index = LsmIndex(64, lsm_spec(settings), path=state / "index")
    try:
        rows = index.export()
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids)), "nothing applied twice"
        docs: dict[str, tuple[int, str]] = {}
        for hit, _ in rows:
            assert hit.doc_id not in docs  # one chunk per (short) document
            docs[hit.doc_id] = (hit.event_time, hit.text)
        assert set(docs) == set(live), "nothing lost, nothing resurrected"
        assert docs == live, "each at its newest version"
        for doc in deleted:
            held = index.doc_state("default", doc)
            assert held is not None
            assert held.deleted
    finally:
        index.close()
    letters = list(DeadLetterStore(state / "deadletter.jsonl").read())
    assert sorted(le.offset for le in letters) == malformed, "one dead letter per malformed message"
