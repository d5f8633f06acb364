"""The Kafka connector: settings, offset arithmetic and seeks, then against a real broker.

The first part needs no broker: the config → consumer settings mapping, the
offsets :meth:`KafkaReader.committed` sends, and the seeks of the rebalance
callbacks, driven through a stand-in that has confluent-kafka's ``Consumer``
methods and calls the callbacks the way librdkafka does (inside ``consume``).
The rest runs against a Kafka-protocol broker (:mod:`tests.sources.kafka_broker`):
``STREAMRAG_TEST_KAFKA``'s, else a private Tansu broker, else those tests are
skipped. Each test uses its own topics and group.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    KafkaError,
    TopicPartition,
)

from streamrag.config import KafkaSourceSettings
from streamrag.errors import ConfigError
from streamrag.sources.base import (
    AcknowledgesCommits,
    RawBatch,
    ReportsHealth,
    SourceReader,
    Wakes,
)
from streamrag.sources.kafka import KafkaReader, KafkaSource, consumer_config
from tests.sources import kafka_broker
from tests.sources.kafka_broker import CLIENT, Broker

pytestmark = pytest.mark.timeout(90)


def _settings(**kw: Any) -> KafkaSourceSettings:
    base: dict[str, Any] = {"kind": "kafka", "name": "orders", "topics": ["t"]}
    return KafkaSourceSettings(**{**base, **kw})


# -- a stand-in for confluent_kafka.Consumer (no broker needed) ------------------


class FakeMessage:
    """confluent_kafka.Message's accessors."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        value: bytes | None = b"{}",
        error: KafkaError | None = None,
    ):
        self._t, self._p, self._o, self._v, self._e = topic, partition, offset, value, error

    def error(self) -> KafkaError | None:
        return self._e

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes | None:
        return self._v

    def key(self) -> bytes | None:
        return b"k%d" % self._o

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + self._o)


class FakeConsumer:
    """confluent_kafka.Consumer's methods the reader uses; rebalances run inside consume."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.assigned: dict[tuple[str, int], int] = {}
        self.assign_calls: list[list[tuple[str, int, int]]] = []
        self.commits: list[list[tuple[str, int, int]]] = []
        self.pending: list[Callable[[], None]] = []
        self.log: dict[tuple[str, int], list[FakeMessage]] = {}
        self.paused: set[tuple[str, int]] = set()

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.topics, self.on_assign, self.on_revoke = topics, on_assign, on_revoke

    def rebalance(self, new: list[tuple[str, int]]) -> None:
        """The group changes: revoke everything, then assign ``new`` (eager protocol)."""

        def run() -> None:
            if self.assigned:
                self.on_revoke(self, [TopicPartition(t, p) for t, p in self.assigned])
            self.on_assign(self, [TopicPartition(t, p) for t, p in new])

        self.pending.append(run)

    def assign(self, parts: list[TopicPartition]) -> None:
        self.assign_calls.append([(tp.topic, tp.partition, tp.offset) for tp in parts])
        self.assigned = {(tp.topic, tp.partition): tp.offset for tp in parts}

    incremental_assign = assign

    def seek(self, tp: TopicPartition) -> None:
        self.assigned[(tp.topic, tp.partition)] = tp.offset
        self.paused.discard((tp.topic, tp.partition))

    def pause(self, parts: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in parts}

    def unassign(self) -> None:
        self.assigned = {}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        while self.pending:
            self.pending.pop(0)()
        out: list[FakeMessage] = []
        for (t, p), at in list(self.assigned.items()):
            if (t, p) in self.paused:
                continue
            low, high = self.get_watermark_offsets(TopicPartition(t, p))
            at = low if at == OFFSET_BEGINNING else at
            if not low <= at <= high:  # auto.offset.reset=error: librdkafka says so, once
                err = KafkaError(KafkaError._AUTO_OFFSET_RESET, "offset out of range")
                out.append(FakeMessage(t, p, at, None, err))
                self.paused.add((t, p))
                continue
            got = [m for m in self.log.get((t, p), []) if m.offset() >= at][:num_messages]
            if got:
                self.assigned[(t, p)] = got[-1].offset() + 1
            out += got
        return out

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        log = self.log.get((tp.topic, tp.partition), [])
        return (log[0].offset(), log[-1].offset() + 1) if log else (0, 0)

    def close(self) -> None:
        self.assigned = {}


def _fake_reader(
    resume: dict[str, int] | None = None, **client: str
) -> tuple[KafkaReader, FakeConsumer]:
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf))
        return made[-1]

    spec = KafkaSource("orders", "b:9092", ("t",), "g", client=tuple(client.items()))
    reader = spec.build(resume, consumer_factory=factory)
    return reader, made[0]


def test_settings_become_consumer_settings_with_secrets_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_PW", "hunter2-secret")
    spec = KafkaSource.from_settings(
        _settings(
            brokers="k1:9092,k2:9092",
            group_id="search",
            client={"security.protocol": "SASL_SSL", "sasl.username": "app"},
            client_env={"sasl.password": "KAFKA_PW"},
        )
    )
    conf = consumer_config(spec)
    assert conf["bootstrap.servers"] == "k1:9092,k2:9092"
    assert conf["group.id"] == "search"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.password"] == "hunter2-secret"
    assert conf["enable.auto.commit"] == conf["enable.auto.offset.store"] == "false"
    assert spec.decoder == "orders"
    # The spec (pickled into job plans, shown in logs) holds the variable's name only.
    assert "hunter2" not in repr(spec)
    assert ("sasl.password", "KAFKA_PW") in spec.client_env

    reader = spec.build(consumer_factory=FakeConsumer)
    consumer = reader._consumer
    assert consumer.conf["sasl.password"] == "hunter2-secret"
    assert consumer.conf["auto.offset.reset"] == "error"  # our seeks decide, not a silent jump
    # A client error that echoes the secret is reported without it.
    consumer.conf["error_cb"](
        KafkaError(KafkaError._AUTHENTICATION, "SASL auth failed for password hunter2-secret")
    )
    text = json.dumps(reader.health())
    assert "hunter2" not in text
    assert "_AUTHENTICATION" in text
    assert reader.health()["orders"]["connected"] is False


def test_settings_that_would_break_the_contract_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = KafkaSource.from_settings(_settings(client={"enable.auto.commit": "true"}))
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit"):
        consumer_config(spec)
    monkeypatch.delenv("NOPE_KAFKA", raising=False)
    missing = KafkaSource.from_settings(_settings(client_env={"sasl.password": "NOPE_KAFKA"}))
    with pytest.raises(ConfigError, match="NOPE_KAFKA"):
        consumer_config(missing)
    with pytest.raises(ConfigError, match=r"auto\.offset\.reset"):
        consumer_config(KafkaSource.from_settings(_settings(client={"auto.offset.reset": "x"})))
    with pytest.raises(ConfigError, match="both"):
        KafkaSource.from_settings(_settings(client={"a": "1"}, client_env={"a": "A"}))


def test_partition_names_are_prefixed_and_owned() -> None:
    spec = KafkaSource.from_settings(_settings(topics=["orders.v1", "b"]))
    name = spec.partition("orders.v1", 7)
    assert name == "kafka:orders:orders.v1:7"
    assert spec.owns(name)
    assert not spec.owns("kafka:orders2:b:0")
    assert not spec.owns("/data/orders.jsonl")
    assert spec.topic_partition(name) == ("orders.v1", 7)


def test_assignment_seeks_to_streamrags_positions_not_kafkas() -> None:
    reader, consumer = _fake_reader({"kafka:orders:t:0": 5})
    consumer.log = {("t", p): [FakeMessage("t", p, o) for o in range(10)] for p in (0, 1)}
    consumer.rebalance([("t", 0), ("t", 1)])
    batches = {b.source: b for b in reader.poll(1 << 20)}
    # Partition 0 from the cursor; partition 1, never read, from the beginning.
    assert consumer.assign_calls[0] == [("t", 0, 5), ("t", 1, OFFSET_BEGINNING)]
    assert batches["kafka:orders:t:0"].offsets == [5, 6, 7, 8, 9]
    assert batches["kafka:orders:t:1"].offsets == list(range(10))
    assert batches["kafka:orders:t:0"].end_offset == 10
    assert batches["kafka:orders:t:0"].keys == [b"k5", b"k6", b"k7", b"k8", b"k9"]
    assert batches["kafka:orders:t:0"].times == [
        (1_700_000_000_000 + o) * 1000 for o in range(5, 10)
    ]
    # A rebalance takes both away and gives partition 0 back: our position, 10.
    consumer.rebalance([("t", 0)])
    consumer.log[("t", 0)].append(FakeMessage("t", 0, 10))
    again = reader.poll(1 << 20)
    assert consumer.assign_calls[1] == [("t", 0, 10)]
    assert reader.health()["orders"]["started_at"] == {
        "kafka:orders:t:0": 10,
        "kafka:orders:t:1": "beginning",
    }
    assert [b.offsets for b in again] == [[10]]
    assert reader.snapshot() == {"kafka:orders:t:0": 11, "kafka:orders:t:1": 10}


def test_latest_starts_unknown_partitions_at_the_end_and_cooperative_assigns_incrementally() -> (
    None
):
    reader, consumer = _fake_reader(
        {"kafka:orders:t:1": 3},
        **{"auto.offset.reset": "latest", "partition.assignment.strategy": "cooperative-sticky"},
    )
    assert reader._incremental
    consumer.pending.append(
        lambda: consumer.on_assign(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    )
    reader.poll(100)
    assert consumer.assign_calls == [[("t", 0, OFFSET_END), ("t", 1, 3)]]


def test_committed_sends_the_first_offset_not_yet_durable_per_assigned_partition() -> None:
    reader, consumer = _fake_reader()
    consumer.rebalance([("t", 0), ("t", 1)])
    reader.poll(100)
    positions = {"kafka:orders:t:0": 40, "kafka:orders:t:1": 12, "kafka:orders:t:9": 99}
    waiting = {"kafka:orders:t:0": [31, 35, 39]}
    reader.committed(positions, waiting)
    # Partition 0: 31 (records 31, 35, 39 are still in the batcher); 1: all of it;
    # 9 is not ours (never assigned): never committed.
    assert consumer.commits == [[("t", 0, 31), ("t", 1, 12)]]
    # Kafka confirms: the same state is not sent again, a change is.
    consumer.conf["on_commit"](None, [TopicPartition("t", 0, 31), TopicPartition("t", 1, 12)])
    reader.committed({**positions, "kafka:orders:t:1": 15}, waiting)
    assert consumer.commits[-1] == [("t", 1, 15)]
    # A revoked partition is not committed by us any more (its new owner does).
    consumer.rebalance([("t", 1)])
    reader.poll(100)
    reader.committed({"kafka:orders:t:0": 50, "kafka:orders:t:1": 20}, {})
    assert consumer.commits[-1] == [("t", 1, 20)]


def test_a_poll_is_bounded_by_max_bytes_and_keeps_the_rest_in_order() -> None:
    reader, consumer = _fake_reader()
    consumer.log = {("t", 0): [FakeMessage("t", 0, o, b"x" * 100) for o in range(20)]}
    consumer.rebalance([("t", 0)])
    first = reader.poll(250)
    assert [len(b) for b in first] == [3]  # 102 bytes each (value and key): over 250 after 3
    assert reader.backlog_bytes() >= 17 * 102
    assert reader.poll(1)[0].offsets == [3]  # at least one record, however small the budget
    rest = reader.poll(1 << 20)
    assert rest[0].offsets == list(range(4, 20))
    assert reader.backlog_bytes() == 0


def test_an_offset_outside_the_log_skips_a_retention_gap_or_pauses_past_the_end() -> None:
    """librdkafka's answer to a position outside the log (auto.offset.reset=error).

    The broker here (Tansu) never gives that answer, so a stand-in does.
    """
    reader, consumer = _fake_reader({"kafka:orders:t:0": 2, "kafka:orders:t:1": 50})
    consumer.log = {
        ("t", 0): [FakeMessage("t", 0, o) for o in range(5, 10)],  # 0..4 deleted by retention
        ("t", 1): [FakeMessage("t", 1, o) for o in range(10)],  # made again: ends at 10
    }
    consumer.rebalance([("t", 0), ("t", 1)])
    got = {b.source: b.offsets for _ in range(3) for b in reader.poll(1 << 20)}
    assert got == {"kafka:orders:t:0": [5, 6, 7, 8, 9]}
    h = reader.health()["orders"]
    assert h["paused"] == ["kafka:orders:t:1"]
    assert "past the end" in h["last_error"]
    assert any("2..4 were deleted" in g for g in h["gaps"])
    assert reader.snapshot() == {"kafka:orders:t:0": 10, "kafka:orders:t:1": 50}


# -- against a broker ------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from kafka_broker.broker_fixture(tmp_path_factory.mktemp("kafka"))


@pytest.fixture
def topic(broker: Broker) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions=3)
    yield name
    broker.delete_topic(name)


def _spec(broker: Broker, topic: str, group: str | None = None, **client: str) -> KafkaSource:
    return KafkaSource.from_settings(
        KafkaSourceSettings(
            kind="kafka",
            name="k",
            brokers=broker.bootstrap,
            topics=[topic],
            group_id=group or f"g-{uuid.uuid4().hex[:8]}",
            client={**CLIENT, **client},
        )
    )


def _records(topic: str, start: int, n: int, parts: int = 3) -> list[tuple[int, bytes, bytes]]:
    return [
        (i % parts, f"doc-{i}".encode(), json.dumps({"doc_id": f"doc-{i}", "n": i}).encode())
        for i in range(start, start + n)
    ]


def _drain(
    reader: KafkaReader,
    want: int,
    seen: dict[str, list[int]],
    timeout: float = 30,
    max_bytes: int = 1 << 20,
) -> list[RawBatch]:
    """Poll until ``want`` more records came; collect offsets per partition into ``seen``."""
    got: list[RawBatch] = []
    deadline = time.monotonic() + timeout
    count = 0
    while count < want:
        assert time.monotonic() < deadline, f"got {count} of {want}; {reader.health()}"
        for b in reader.poll(max_bytes):
            got.append(b)
            seen.setdefault(b.source, []).extend(b.offsets)
            count += len(b)
        time.sleep(0.01)
    return got


def _contiguous(seen: dict[str, list[int]], ends: dict[int, int], topic: str) -> None:
    """Every offset of every partition exactly once, in order."""
    for p, end in ends.items():
        assert seen.get(f"kafka:k:{topic}:{p}", []) == list(range(end)), p


def test_reads_every_partition_with_keys_times_and_offsets(broker: Broker, topic: str) -> None:
    broker.produce(topic, _records(topic, 0, 30), timestamp_ms=1_700_000_123_456)
    reader = _spec(broker, topic).build()
    assert isinstance(reader, SourceReader | AcknowledgesCommits | ReportsHealth | Wakes)
    try:
        seen: dict[str, list[int]] = {}
        batches = _drain(reader, 30, seen)
        _contiguous(seen, {0: 10, 1: 10, 2: 10}, topic)
        b = next(b for b in batches if b.source == f"kafka:k:{topic}:1")
        first = json.loads(b.lines[0])
        assert b.keys is not None
        assert b.keys[0] == f"doc-{first['n']}".encode()
        assert b.times == [1_700_000_123_456_000] * len(b)
        assert b.decoder == "k"
        assert b.end_offset == b.offsets[-1] + 1
        assert reader.snapshot() == {f"kafka:k:{topic}:{p}": 10 for p in range(3)}
        h = reader.health()["k"]
        assert h["connected"] is True
        assert sorted(h["assigned"]) == [f"kafka:k:{topic}:{p}" for p in range(3)]
        assert reader.poll(1 << 20) == []
    finally:
        reader.close()


def test_live_records_wake_the_job(broker: Broker, topic: str) -> None:
    reader = _spec(broker, topic).build()
    event = threading.Event()
    reader.wake_on(event)
    try:
        deadline = time.monotonic() + 30
        while not reader.health()["k"]["assigned"]:
            assert time.monotonic() < deadline
            reader.poll(1 << 20)
            time.sleep(0.05)
        time.sleep(0.3)
        reader.poll(1 << 20)
        event.clear()
        assert not event.wait(0.5)  # idle and caught up: the job may sleep
        broker.produce(topic, _records(topic, 0, 3))
        assert event.wait(10), "no wake for new records"
        seen: dict[str, list[int]] = {}
        _drain(reader, 3, seen)
        assert sum(len(v) for v in seen.values()) == 3
    finally:
        reader.close()


def test_resume_comes_from_the_cursor_and_kafka_offsets_follow_commits(
    broker: Broker, topic: str
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    broker.produce(topic, _records(topic, 0, 30))
    first = _spec(broker, topic, group).build()
    try:
        _drain(first, 30, {})
        # Nothing durable yet: nothing committed to Kafka.
        time.sleep(0.5)
        first.poll(100)
        assert set(broker.group_offsets(group, topic, 3).values()) == {-1001}
        p = f"kafka:k:{topic}:"
        first.committed({p + "0": 10, p + "1": 10, p + "2": 10}, {p + "0": [4, 7]})
        deadline = time.monotonic() + 10
        while first.health()["k"]["kafka_committed"] != {p + "0": 4, p + "1": 10, p + "2": 10}:
            assert time.monotonic() < deadline, first.health()
            first.poll(100)  # serves the commit's answer
            time.sleep(0.1)
        assert broker.group_offsets(group, topic, 3) == {0: 4, 1: 10, 2: 10}
    finally:
        first.close()
    # A restart resumes where streamrag's cursor says (2 and 6 here), not at
    # the group's offsets (4, 10, 10), and a partition it never read from the start.
    again = _spec(broker, topic, group).build({p + "0": 2, p + "1": 6})
    try:
        seen: dict[str, list[int]] = {}
        _drain(again, 8 + 4 + 10, seen)
        assert seen[p + "0"] == list(range(2, 10))
        assert seen[p + "1"] == list(range(6, 10))
        assert seen[p + "2"] == list(range(10))
    finally:
        again.close()


def _pump(reader: KafkaReader, seen: dict[str, list[int]]) -> None:
    for batch in reader.poll(1 << 20):
        seen.setdefault(batch.source, []).extend(batch.offsets)


@pytest.mark.parametrize("strategy", ["roundrobin", "cooperative-sticky"])
def test_a_second_member_joins_and_leaves_and_nothing_is_lost_or_doubled(
    broker: Broker, topic: str, strategy: str
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    assigning = {"partition.assignment.strategy": strategy}
    a = _spec(broker, topic, group, **assigning).build()
    b: KafkaReader | None = None
    seen_a: dict[str, list[int]] = {}
    seen_b: dict[str, list[int]] = {}
    try:
        broker.produce(topic, _records(topic, 0, 30))
        _drain(a, 30, seen_a)
        # Kafka hears less than A has read: 3 records of each partition still wait.
        a.committed({n: 10 for n in a.snapshot()}, {n: [7, 8, 9] for n in a.snapshot()})
        b = _spec(broker, topic, group, **assigning).build()
        deadline = time.monotonic() + 40
        while not (b.health()["k"]["assigned"] and len(a.health()["k"]["assigned"]) < 3):
            assert time.monotonic() < deadline, (a.health(), b.health())
            _pump(a, seen_a)
            _pump(b, seen_b)
            time.sleep(0.02)
        moved = b.health()["k"]["assigned"]
        kept = a.health()["k"]["assigned"]
        assert kept
        assert not set(moved) & set(kept)
        # While B holds some partitions, more records arrive.
        broker.produce(topic, _records(topic, 30, 30))
        deadline = time.monotonic() + 20
        while sum(len(seen_b.get(n, [])) for n in moved) < 20 * len(moved) or sum(
            len(seen_a[n]) for n in kept
        ) < 20 * len(kept):
            assert time.monotonic() < deadline, (seen_a, seen_b)
            _pump(a, seen_a)
            _pump(b, seen_b)
            time.sleep(0.02)
        b.close()
        b = None
        # A gets every partition back and reads on from its own position (10 for
        # the moved ones), not from Kafka's committed 7: every offset once, in order.
        deadline = time.monotonic() + 40
        while sum(len(v) for v in seen_a.values()) < 60:
            assert time.monotonic() < deadline, (seen_a, a.health())
            _pump(a, seen_a)
            time.sleep(0.02)
        time.sleep(0.5)
        _pump(a, seen_a)
        _contiguous(seen_a, {0: 20, 1: 20, 2: 20}, topic)
        assert a.health()["k"]["rebalances"] >= 3
        started = a.health()["k"]["started_at"]
        assert {n: started[n] for n in moved} == dict.fromkeys(moved, 10)
        # B, another member (another index), read its partitions from their start.
        for name in moved:
            assert seen_b[name] == list(range(20))
    finally:
        a.close()
        if b is not None:
            b.close()


def test_connection_drop_is_reported_and_survived(broker: Broker, topic: str) -> None:
    if not broker.can_cut:
        pytest.skip("the connection can be cut only for the private broker")
    reader = _spec(broker, topic).build()
    seen: dict[str, list[int]] = {}
    try:
        broker.produce(topic, _records(topic, 0, 9))
        _drain(reader, 9, seen)
        broker.cut()
        deadline = time.monotonic() + 20
        while reader.health()["k"]["connected"]:
            assert time.monotonic() < deadline, "the drop was not noticed"
            assert reader.poll(1 << 20) == []  # never raises, nothing to return
            time.sleep(0.05)
        h = reader.health()["k"]
        assert h["retries"] >= 1
        assert any(code in h["last_error"] for code in ("_TRANSPORT", "_ALL_BROKERS_DOWN"))
        for _ in range(20):
            assert reader.poll(1 << 20) == []
            time.sleep(0.05)
        broker.restore()
        broker.produce(topic, _records(topic, 9, 9))
        _drain(reader, 9, seen, timeout=40)
        _contiguous(seen, {0: 6, 1: 6, 2: 6}, topic)
        deadline = time.monotonic() + 10
        while not reader.health()["k"]["connected"]:
            assert time.monotonic() < deadline
            reader.poll(1 << 20)
            time.sleep(0.05)
    finally:
        reader.close()


def test_the_source_config_builds_this_reader(tmp_path: Path) -> None:
    """``sources: [{kind: kafka}]`` reaches this class through the connector table."""
    from streamrag.config import Settings
    from streamrag.runtime.build import build_source
    from streamrag.sources.multi import MultiSource

    settings = Settings.model_validate(
        {
            "state_dir": str(tmp_path),
            "sources": [{"kind": "kafka", "name": "k", "topics": ["x"], "format": "row"}],
        }
    )
    source = build_source(settings)
    assert isinstance(source, MultiSource)
    kafka = [s for s in source.sources if isinstance(s, KafkaSource)]
    assert kafka == [KafkaSource("k", "127.0.0.1:9092", ("x",), "streamrag", decoder="k")]


def test_a_broker_restart_is_survived_and_a_lost_log_is_not_taken_for_new_records(
    tmp_path: Path,
) -> None:
    """Tansu keeps its log in memory: restarted, it has lost the topic and the group.

    The reader reports the broker gone, rejoins the group when it is back, and
    resumes at its own position (6) on the topic made again: the new topic's
    offsets 0 and 1 are other records, never returned as if they came next.
    (Apache Kafka answers a fetch past the log end with OFFSET_OUT_OF_RANGE,
    and the reader then pauses the partition and says why; Tansu answers with
    no records, so that branch is not reached here.)
    """
    if kafka_broker.tansu_binary() is None:
        pytest.skip(kafka_broker.SKIP)
    broker, proc = kafka_broker.start(tmp_path / "broker.log")
    topic = "comes-back"
    reader: KafkaReader | None = None
    try:
        broker.create_topic(topic, partitions=1)
        broker.produce(topic, [(0, b"a", b"x%d" % i) for i in range(6)])
        reader = _spec(broker, topic).build()
        seen: dict[str, list[int]] = {}
        _drain(reader, 6, seen)
        rebalances = reader.health()["k"]["rebalances"]
        proc = kafka_broker.restart(broker, proc, tmp_path / "broker.log")
        deadline = time.monotonic() + 30
        while reader.health()["k"]["connected"]:
            assert time.monotonic() < deadline, "the restart was not noticed"
            _pump(reader, seen)
            time.sleep(0.05)
        broker.create_topic(topic, partitions=1)
        broker.produce(topic, [(0, b"b", b"y%d" % i) for i in range(2)])
        deadline = time.monotonic() + 60
        while (
            reader.health()["k"]["rebalances"] == rebalances
            or not reader.health()["k"]["connected"]
        ):
            assert time.monotonic() < deadline, json.dumps(reader.health())
            _pump(reader, seen)
            time.sleep(0.05)
        for _ in range(20):
            _pump(reader, seen)
            time.sleep(0.05)
        name = f"kafka:k:{topic}:0"
        assert seen[name] == list(range(6))
        assert reader.snapshot()[name] == 6
        assert reader.health()["k"]["assigned"] == [name]
        assert reader.health()["k"]["failures"] >= 1
    finally:
        if reader is not None:
            reader.close()
        assert broker.relay is not None
        broker.relay.cut()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


# -- for the Source contract suite -----------------------------------------------


class KafkaWriter:
    """Appends records to a topic (round robin over its partitions), for a contract case.

    Kafka is not read synchronously: a record produced now is fetched by the
    reader milliseconds later, and a new group member gets its partitions only
    after a few seconds, so an empty poll does not mean "caught up" and the
    backlog is known only once the client has fetched. The contract suite's
    checks that take the first empty poll as the end (``_drain``), or expect
    the backlog at once after a write, need a deadline loop for this case.
    """

    def __init__(self, broker: Broker, topic: str, partitions: int) -> None:
        from confluent_kafka import Producer

        self.broker, self.topic, self.partitions = broker, topic, partitions
        self._producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        self._next = 0
        self.written = 0

    def append(self, *records: bytes) -> None:
        for record in records:
            self._producer.produce(self.topic, value=record, partition=self._next % self.partitions)
            self._next += 1
        assert self._producer.flush(15) == 0
        self.written += len(records)

    def append_partial(self, head: bytes) -> None:
        raise NotImplementedError("a Kafka record is written whole or not at all")

    def finish_partial(self, rest: bytes) -> None:
        raise NotImplementedError("a Kafka record is written whole or not at all")

    def truncate(self) -> None:
        self.broker.delete_topic(self.topic)
        self.broker.create_topic(self.topic, self.partitions)
        self._next = 0


def make_kafka(broker: Broker, tmp: Path) -> tuple[KafkaSource, KafkaWriter]:
    """A contract case: a fresh three-partition topic and its own group."""
    del tmp
    topic = broker.create_topic(f"contract-{uuid.uuid4().hex[:10]}", partitions=3)
    return _spec(broker, topic), KafkaWriter(broker, topic, 3)
