"""A job reading Kafka, killed and restarted while records arrive, ends with exactly the truth.

``python -m streamrag run CFG`` reads a three-partition topic (streamrag's
change format, keyed by document id) while a producer writes upserts, deletes
and malformed records into it. The job is SIGKILLed at random moments and
restarted, and the broker's connections are dropped once while it runs. At the
end the index must be last-writer-wins over what was produced: nothing lost,
nothing applied twice, no deleted document back, one dead letter per bad
record. After every kill the group's committed offsets in Kafka must not be
ahead of what the job's own durable cursor holds (Kafka hears a commit only
after it is durable), and at the end they reach the end of every partition.

The broker is ``STREAMRAG_TEST_KAFKA``'s or a private Tansu broker
(:mod:`tests.sources.kafka_broker`); without either the test is skipped.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Producer

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.ingest import DeadLetterStore
from streamrag.runtime.cursor import Cursor
from tests.e2e.conftest import Server, audit_records, free_port, wait_for
from tests.sources import kafka_broker
from tests.sources.kafka_broker import CLIENT, Broker

PARTS = 3
N = 2400
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
INDEX = IndexSettings(checkpoint_every=16, seal_rows=1024)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from kafka_broker.broker_fixture(tmp_path_factory.mktemp("kafka"))


def _stream(seed: int) -> tuple[list[tuple[int, bytes, bytes | None]], dict[str, Any]]:
    """The records ``(partition, key, value)`` and what the index must end with."""
    rng = random.Random(seed)
    records: list[tuple[int, bytes, bytes | None]] = []
    latest: dict[str, tuple[str, str]] = {}
    bad: list[tuple[int, int]] = []  # (partition, index within partition)
    per_part = [0] * PARTS
    for i in range(N):
        doc = f"doc-{rng.randrange(300)}"
        part = int(doc.split("-")[1]) % PARTS  # one document, one partition: its order kept
        roll = rng.random()
        value: bytes | None
        if roll < 0.015:
            value = rng.choice([b"{not json", b'{"doc_id": ""}', None])
            bad.append((part, per_part[part]))
        else:
            op = "delete" if roll < 0.12 else "upsert"
            text = f"{doc} version {i} " + " ".join(rng.choice(["alpha", "beta", "gamma"]) * 2)
            change: dict[str, Any] = {"doc_id": doc, "event_time": T0 + i, "op": op}
            if op == "upsert":
                change["text"] = text
            value = json.dumps(change).encode()
            latest[doc] = (op, text)
        records.append((part, doc.encode(), value))
        per_part[part] += 1
    live = {d: t for d, (op, t) in latest.items() if op == "upsert"}
    deleted = {d for d, (op, _) in latest.items() if op == "delete"}
    return records, {"live": live, "deleted": deleted, "bad": bad, "ends": per_part}


def _config(tmp: Path, broker: Broker, topic: str, group: str) -> Path:
    cfg = tmp / "job.yaml"
    source = {
        "kind": "kafka",
        "name": "orders",
        "brokers": broker.bootstrap,
        "topics": [topic],
        "group_id": group,
        "client": CLIENT,
    }
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
sources: [{json.dumps(source)}]
source: {{poll_interval_ms: 5, max_read_bytes: 65536}}
embedder: {{class: hashing, args: {{dim: 64}}}}
batcher: {{max_batch_size: 64, max_delay_ms: 5, adaptive: false}}
event_time: {{max_out_of_orderness_ms: 60000}}
index: {{checkpoint_every: {INDEX.checkpoint_every}, seal_rows: {INDEX.seal_rows}}}
""",
        encoding="utf-8",
    )
    return cfg


def _durable(state: Path, topic: str) -> dict[int, int]:
    """Per partition, the first offset the job's durable cursor does not hold as done."""
    index = LsmIndex(64, lsm_spec(INDEX), path=state / "index")
    try:
        cursor = index.cursor or {}
    finally:
        index.close()
    positions = Cursor.from_mapping(cursor).positions if cursor else {}
    out: dict[int, int] = {}
    for p in range(PARTS):
        name = f"kafka:orders:{topic}:{p}"
        at = positions.get(name, 0)
        waiting = cursor.get("pending", {}).get(name) or []
        out[p] = min([at, *waiting])
    return out


def _commit_after(state: Path, timeout: float, what: str) -> None:
    """Wait until the job commits another epoch."""
    seen = audit_records(state)
    wait_for(lambda: audit_records(state) > seen, timeout, what)


def _producer(broker: Broker, topic: str, records: list[Any], stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i, (part, key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=part)
        producer.poll(0)
        if i % 20 == 19:  # about a minute in all: the kills and the drop land mid-stream
            producer.flush(30)
            if stop.wait(0.5):
                break
    assert producer.flush(30) == 0


@pytest.mark.timeout(420)
def test_kill_restart_and_a_dropped_connection_end_with_last_writer_wins(
    tmp_path: Path, broker: Broker
) -> None:
    topic = broker.create_topic(f"e2e-{uuid.uuid4().hex[:8]}", partitions=PARTS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    records, expected = _stream(seed=3)
    cfg = _config(tmp_path, broker, topic, group)
    state = tmp_path / "state"
    rng = random.Random(7)
    stop = threading.Event()
    writer = threading.Thread(target=_producer, args=(broker, topic, records, stop))
    writer.start()
    servers: list[Server] = []

    def start() -> Server:
        port = free_port()
        log = tmp_path / f"server-{len(servers)}.log"
        server = Server(["run", str(cfg), "--port", str(port)], port, tmp_path, log)
        servers.append(server)
        server.wait_ready()
        return server

    try:
        kills = 0
        cut = False
        while kills < 4 and writer.is_alive():
            server = start()
            _commit_after(state, 60, "the job to commit")
            if not cut and broker.can_cut:
                # The broker drops every connection; the job reports it and goes on.
                cut = True
                broker.cut()

                def down(server: Server = server) -> bool:
                    return server.status()["sources"]["orders"]["connected"] is False

                wait_for(down, 20, "the job to see the broker gone")
                time.sleep(1.0)
                broker.restore()

                def up(server: Server = server) -> bool:
                    return server.status()["sources"]["orders"]["connected"] is True

                wait_for(up, 30, "the job to reconnect")
                _commit_after(state, 60, "a commit after the drop")
            time.sleep(rng.uniform(0.0, 0.4))
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
            kills += 1
            # Kafka never heard of more than the job had made durable.
            committed = broker.group_offsets(group, topic, PARTS)
            durable = _durable(state, topic)
            for p in range(PARTS):
                assert committed[p] <= durable[p], (p, committed, durable)
        assert kills >= 3, f"only {kills} kills landed while records were being written"
        assert cut or not broker.can_cut
        writer.join(120)
        assert not writer.is_alive()

        final = start()

        def done() -> dict[str, Any] | None:
            st = final.status()
            c = st["counts"]
            return st if c["ingested"] >= N and c["pending"] == 0 else None

        status = wait_for(done, 120, "the job to read every record")
        counts = status["counts"]
        assert counts["ingested"] == N
        assert counts["dead_lettered"] == len(expected["bad"])
        assert counts["applied"] == N - len(expected["bad"])
        # Kafka hears the end of every partition once it is durable.
        ends = dict(enumerate(expected["ends"]))
        wait_for(
            lambda: broker.group_offsets(group, topic, PARTS) == ends, 30, "the group's offsets"
        )
        assert final.stop(signal.SIGINT) == 0
    finally:
        stop.set()
        writer.join(60)
        for server in servers:
            if server.proc.poll() is None:
                server.stop(signal.SIGKILL)
        broker.delete_topic(topic)

    index = LsmIndex(64, lsm_spec(INDEX), path=state / "index")
    try:
        rows = index.export()
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids))  # nothing applied twice
        docs: dict[str, str] = {}
        for hit, _ in rows:
            assert hit.doc_id not in docs  # one chunk per (short) document
            docs[hit.doc_id] = hit.text
        assert set(docs) == set(expected["live"])  # nothing lost, nothing resurrected
        assert docs == expected["live"]  # each at its newest version
        for doc in expected["deleted"]:
            st = index.doc_state("default", doc)
            assert st is not None
            assert st.deleted
    finally:
        index.close()

    letters = list(DeadLetterStore(state / "deadletter.jsonl").read())
    got = sorted((le.source, le.offset) for le in letters)
    want = sorted((f"kafka:orders:{topic}:{p}", off) for p, off in expected["bad"])
    assert got == want  # one dead letter per bad record, whatever the restarts
