"""Read Kafka topics in a consumer group (confluent-kafka, i.e. librdkafka).

Each topic partition is one streamrag partition, ``kafka:<name>:<topic>:<partition>``,
and a record's offset is its Kafka offset: assigned once by the broker, the
same on every read, strictly increasing within the partition (with gaps where
a topic is compacted or holds transaction markers). A batch's ``end_offset``
is the last offset + 1, so the resume position of a partition is "the next
offset to read" — exactly what Kafka itself calls the committed offset.

**streamrag's cursor is the resume position; Kafka's committed offsets are a
courtesy.** On every assignment the reader seeks each partition it is given to
its own position (from the cursor it was built with, then from what it has
read since); only a partition it has never read starts elsewhere: at the
beginning (``auto.offset.reset`` earliest, the default), or at the end
(latest). The group's committed offset is never read back, so a job whose
state directory was deleted replays the topics from the start into its new
index instead of starting where the old index stopped. After each durable
streamrag commit the reader commits, per assigned partition, the offset of the
first record that is not yet durable — ``min(position, oldest waiting)`` —
asynchronously, so consumer-lag tools see real progress.

**Delivery and rebalances.** Within one job every record of a partition is
applied exactly once and in order: a partition that is revoked and given back
(the group rebalanced because a member joined or left, or this member's
session timed out) resumes at the reader's own position, not at the committed
Kafka offset (which trails it by the records waiting in the batcher), so the
records read before the revocation are neither read again nor skipped. Records
fetched but not yet handed to the pipeline when a partition is revoked are
dropped and fetched again on the next assignment.

A consumer group shared by *several* jobs (several indexes) splits the
partitions between them: each index holds the documents of the partitions it
owns. When a partition moves from job A to job B, B starts where B's own
cursor left it (the start, if B never had it) and applies every record from
there into B's index; A keeps the documents it had applied. "Never lost, never
doubled" then holds per index and per partition, but a document whose key
moved with its partition stays (stale) in A's index. Run one job per group
(one index per group id) unless that is what you want.

**Failures.** librdkafka reconnects to brokers by itself; the reader reports
what it says (``_TRANSPORT``, ``_ALL_BROKERS_DOWN``, authentication, unknown
topics) in :meth:`KafkaReader.health`, and ``poll`` returns ``[]`` meanwhile,
never raises for a connection problem. A position outside the partition's log
(records deleted by retention before they were read) is moved to the log start
and the gap is reported; a position past the log end (the topic was recreated)
is reported and that partition is paused: replay into a fresh state directory.
A fatal client error closes the consumer; a new one is made after a back-off.
Settings from ``client`` are passed through, ``client_env`` values are read
from the environment when the reader is built and never logged or reported.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from streamrag.errors import ConfigError, SourceError
from streamrag.sources.base import RawBatch
from streamrag.sources.health import ConnectionHealth, redact
from streamrag.timing import US_PER_MS, Clock, Timestamp

if TYPE_CHECKING:
    from streamrag.config import KafkaSourceSettings

__all__ = ["KafkaReader", "KafkaSource", "consumer_config"]

log = logging.getLogger("streamrag.sources.kafka")

_CHUNK = 500
"""Messages taken from the client per ``consume`` call."""
_WAKE_TICK_S = 0.01
"""How often the wake thread looks at the cached high watermarks."""
_FORCED = {"enable.auto.commit": "false", "enable.auto.offset.store": "false"}
"""Settings streamrag relies on: Kafka never moves the committed offset by itself."""
_EARLIEST = {"earliest", "smallest", "beginning"}
_LATEST = {"latest", "largest", "end"}
_START = {OFFSET_BEGINNING: "beginning", OFFSET_END: "end"}
_DOWN = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}

ConsumerFactory = Callable[[dict[str, Any]], Any]
"""Makes the client from its settings (``confluent_kafka.Consumer`` unless a test says)."""


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """Topics read by consumer group ``group_id``; one partition per topic partition.

    **Resume position** of ``kafka:<name>:<topic>:<partition>``: the Kafka
    offset of the next record to read (``end_offset`` = offset + 1), taken from
    streamrag's cursor on every assignment. **Delivery**: each record of a
    partition is applied once, in offset order, by the job that reads it (a
    crash resumes at the cursor; a rebalance that gives a partition back resumes
    at the reader's own position). **Acknowledgement**: after each durable
    commit, the group's offset of every assigned partition is committed to
    Kafka as the first offset not yet durable; it is never read back. See the
    module docstring for groups shared by several jobs.
    """

    name: str
    brokers: str
    topics: tuple[str, ...]
    group_id: str
    client: tuple[tuple[str, str], ...] = ()
    """librdkafka settings passed through (no secrets)."""
    client_env: tuple[tuple[str, str], ...] = ()
    """librdkafka setting → environment variable that holds its value."""
    decoder: str | None = None
    """The decoder its batches name (the source's name)."""

    @classmethod
    def from_settings(cls, spec: KafkaSourceSettings) -> KafkaSource:
        """The source a ``kind: kafka`` entry of ``sources:`` describes."""
        clash = sorted(k for k in spec.client if k in spec.client_env)
        if clash:
            msg = f"source {spec.name!r}: {clash} set both in client and in client_env"
            raise ConfigError(msg)
        return cls(
            name=spec.name,
            brokers=spec.brokers,
            topics=tuple(spec.topics),
            group_id=spec.group_id,
            client=tuple(sorted(spec.client.items())),
            client_env=tuple(sorted(spec.client_env.items())),
            decoder=spec.name,
        )

    @property
    def prefix(self) -> str:
        """What every partition name of this source starts with."""
        return f"kafka:{self.name}:"

    def owns(self, partition: str) -> bool:
        """Whether a partition name is one of this source's."""
        return partition.startswith(self.prefix)

    def partition(self, topic: str, number: int) -> str:
        """The streamrag partition name of a topic partition."""
        return f"{self.prefix}{topic}:{number}"

    def topic_partition(self, partition: str) -> tuple[str, int]:
        """The topic and partition number a partition name stands for."""
        topic, _, number = partition[len(self.prefix) :].rpartition(":")
        if not self.owns(partition) or not topic or not number.isdigit():
            msg = f"{partition!r} is not a partition of Kafka source {self.name!r}"
            raise SourceError(msg)
        return topic, int(number)

    def build(
        self,
        resume: Mapping[str, int] | None = None,
        *,
        consumer_factory: ConsumerFactory | None = None,
        clock: Clock | None = None,
    ) -> KafkaReader:
        """Open a reader that seeks each partition to ``resume`` when it is assigned."""
        return KafkaReader(self, dict(resume or {}), consumer_factory or Consumer, clock)


def consumer_config(spec: KafkaSource, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The librdkafka settings of ``spec``: defaults, ``client``, ``client_env`` from ``env``.

    >>> s = KafkaSource("k", "b:9092", ("t",), "g", client_env=(("sasl.password", "PW"),))
    >>> c = consumer_config(s, {"PW": "hunter2"})
    >>> c["group.id"], c["enable.auto.commit"], c["sasl.password"]
    ('g', 'false', 'hunter2')
    """
    env = os.environ if env is None else env
    conf: dict[str, str] = {
        "bootstrap.servers": spec.brokers,
        "group.id": spec.group_id,
        "client.id": f"streamrag-{spec.name}",
        "auto.offset.reset": "earliest",
        "statistics.interval.ms": "1000",
    }
    for key, value in spec.client:
        if key in _FORCED and str(value).lower() != _FORCED[key]:
            msg = (
                f"source {spec.name!r}: client setting {key}={value} is not allowed; streamrag "
                "commits offsets to Kafka itself, after each durable commit"
            )
            raise ConfigError(msg)
        conf[key] = str(value)
    for key, var in spec.client_env:
        if var not in env:
            msg = (
                f"source {spec.name!r}: client setting {key} is to come from the environment "
                f"variable {var}, which is not set"
            )
            raise ConfigError(msg)
        conf[key] = env[var]
    conf.update(_FORCED)
    reset = conf["auto.offset.reset"].lower()
    if reset not in _EARLIEST | _LATEST:
        msg = f"source {spec.name!r}: auto.offset.reset={reset} (take earliest or latest)"
        raise ConfigError(msg)
    return conf


class _Part:
    """What one poll gathers for one partition."""

    __slots__ = ("keys", "lines", "offsets", "times")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.times: list[Timestamp | None] = []


class KafkaReader:
    """A consumer-group member: polls without blocking, seeks on assignment, commits after."""

    def __init__(
        self,
        spec: KafkaSource,
        resume: dict[str, int],
        factory: ConsumerFactory,
        clock: Clock | None = None,
    ) -> None:
        self.spec = spec
        conf = consumer_config(spec)
        self._secrets = tuple(conf[k] for k, _ in spec.client_env if conf[k])
        self.health_state = ConnectionHealth("kafka", clock=clock, secrets=self._secrets)
        reset = conf.pop("auto.offset.reset").lower()
        self._initial = OFFSET_BEGINNING if reset in _EARLIEST else OFFSET_END
        # Our own seeks decide where a partition starts; an offset out of the log
        # comes back as an error instead of a silent jump.
        conf["auto.offset.reset"] = "error"
        strategy = conf.get("partition.assignment.strategy", "")
        self._incremental = "cooperative" in strategy or conf.get("group.protocol") == "consumer"
        self._conf = conf
        self._factory = factory
        self._lock = threading.Lock()
        self._positions: dict[str, int] = dict(resume)
        """Partition → next offset to hand on (the cursor's, then what was returned)."""
        self._assigned: set[tuple[str, int]] = set()
        self._watched: tuple[tuple[TopicPartition, str], ...] = ()
        """The assigned partitions as the wake thread looks at them."""
        self._paused: set[tuple[str, int]] = set()
        self._held: deque[Any] = deque()
        """Messages taken from the client but not returned yet (over a poll's budget)."""
        self._held_bytes = 0
        self._acked: dict[str, int] = {}
        """Offsets Kafka confirmed committing (partition → offset)."""
        self._record_bytes = 0
        self._records = 0
        self._assignments = 0
        self._started: dict[str, int | str] = {}
        """Where each partition was sought on its last assignment."""
        self._commit_error: str | None = None
        self._gaps: list[str] = []
        self._wake: threading.Event | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._fatal = False
        self._connect()

    # -- the client --------------------------------------------------------------

    def _connect(self) -> None:
        conf: dict[str, Any] = dict(self._conf)
        conf["error_cb"] = self._on_error
        conf["stats_cb"] = self._on_stats
        conf["on_commit"] = self._on_commit
        try:
            consumer = self._factory(conf)
            consumer.subscribe(
                list(self.spec.topics),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._INVALID_ARG:
                msg = f"source {self.spec.name!r}: {self._redact(err.str())}"
                raise ConfigError(msg) from None
            self.health_state.failed(SourceError(self._redact(str(exc))))
            return
        self._consumer = consumer

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def _name(self, topic: str, partition: int) -> str:
        return self.spec.partition(topic, partition)

    # -- rebalance callbacks (they run inside consume, on the polling thread) ----

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                pos = self._positions.get(self._name(tp.topic, tp.partition))
                tp.offset = self._initial if pos is None else pos
                self._started[self._name(tp.topic, tp.partition)] = _START.get(tp.offset, tp.offset)
                self._assigned.add((tp.topic, tp.partition))
                self._paused.discard((tp.topic, tp.partition))
            self._drop_held({(tp.topic, tp.partition) for tp in partitions})
            self._assignments += 1
            self._rewatch()
        self.health_state.ok()
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        log.info(
            "%s: assigned %s",
            self.spec.name,
            ", ".join(f"{tp.topic}:{tp.partition}@{tp.offset}" for tp in partitions) or "nothing",
        )

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        with self._lock:
            self._assigned -= gone
            self._drop_held(gone)
            self._rewatch()
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("%s: lost %d partitions (session timed out)", self.spec.name, len(partitions))
        self._on_revoke(consumer, partitions)

    def _rewatch(self) -> None:
        self._watched = tuple(
            (TopicPartition(t, p), self._name(t, p)) for t, p in sorted(self._assigned)
        )

    def _drop_held(self, parts: set[tuple[str, int]]) -> None:
        """Forget fetched messages of ``parts``: they are fetched again from our position."""
        kept: deque[Any] = deque()
        for msg in self._held:
            if (msg.topic(), msg.partition()) in parts:
                self._held_bytes -= _size(msg)
            else:
                kept.append(msg)
        self._held = kept

    # -- client callbacks --------------------------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        exc = SourceError(f"Kafka {err.name()}: {self._redact(err.str())}")
        self.health_state.failed(exc)
        if err.fatal():
            log.error("%s: fatal client error, the consumer is made anew: %s", self.spec.name, exc)
            self._fatal = True  # closed by poll, outside the client's own call
        elif err.code() in _DOWN and self.health_state.retries == 1:
            log.warning("%s: %s (librdkafka reconnects by itself)", self.spec.name, exc)

    def _on_stats(self, raw: str) -> None:
        try:
            stats = json.loads(raw)
        except ValueError:
            return
        brokers = stats.get("brokers", {}).values()
        up = any(b.get("nodeid", -1) >= 0 and b.get("state") == "UP" for b in brokers)
        if up and not self.health_state.connected:
            self.health_state.ok()

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:
            self._commit_error = f"Kafka {err.name()}: {self._redact(err.str())}"
            return
        with self._lock:
            for tp in partitions:
                if tp.error is None and tp.offset >= 0:
                    self._acked[self._name(tp.topic, tp.partition)] = tp.offset
        self._commit_error = None

    # -- reading -----------------------------------------------------------------

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """What the client has fetched, up to about ``max_bytes``; never waits."""
        del final  # a topic has no last line to finish
        if self._consumer is None:
            if not self.health_state.due():
                return []
            self._connect()
            if self._consumer is None:
                return []
        parts: dict[str, _Part] = {}
        budget = max_bytes
        got = 0
        while self._held and (budget > 0 or got == 0):
            with self._lock:
                if not self._held:
                    break
                msg = self._held.popleft()
                self._held_bytes -= _size(msg)
            n = self._take(msg, parts)
            got += n > 0
            budget -= n
        while budget > 0 or got == 0:
            consumer = self._consumer
            if consumer is None:
                break
            try:
                msgs = consumer.consume(num_messages=_CHUNK, timeout=0)
            except (KafkaException, RuntimeError) as exc:
                self.health_state.failed(SourceError(self._redact(str(exc))))
                break
            if self._fatal:
                self._fatal = False
                self._close_consumer()
                break
            if not msgs:
                break
            for msg in msgs:
                if budget > 0 or got == 0:
                    n = self._take(msg, parts)
                    got += n > 0
                    budget -= n
                elif msg.error() is None:
                    with self._lock:
                        self._held.append(msg)
                        self._held_bytes += _size(msg)
                else:
                    self._take(msg, parts)
        return [
            RawBatch(
                name,
                p.lines,
                p.offsets,
                p.offsets[-1] + 1,
                decoder=self.spec.decoder,
                keys=p.keys,
                times=p.times,
            )
            for name, p in parts.items()
        ]

    def _take(self, msg: Message, parts: dict[str, _Part]) -> int:
        """Add one message to the poll's batches; its size (0 for an error or a skip)."""
        err = msg.error()
        if err is not None:
            self._message_error(msg, err)
            return 0
        topic, number, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or number is None or offset is None:
            return 0
        name = self._name(topic, number)
        with self._lock:
            if (topic, number) not in self._assigned:
                return 0  # revoked while it waited: fetched again on the next assignment
            at = self._positions.get(name)
            if at is not None and offset < at:
                return 0  # below our position (a fetch that predates our seek)
            self._positions[name] = offset + 1
        value = msg.value() or b""
        key = msg.key()
        kind, ms = msg.timestamp()
        part = parts.get(name)
        if part is None:
            part = parts[name] = _Part()
        part.lines.append(value)
        part.offsets.append(offset)
        part.keys.append(key)
        part.times.append(None if kind == TIMESTAMP_NOT_AVAILABLE else ms * US_PER_MS)
        size = max(1, len(value) + len(key or b""))
        self._records += 1
        self._record_bytes += size
        if not self.health_state.connected:
            self.health_state.ok()
        return size

    def _message_error(self, msg: Message, err: KafkaError) -> None:
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return
        topic, number = msg.topic(), msg.partition()
        if code == KafkaError._AUTO_OFFSET_RESET and topic is not None and number is not None:
            self._out_of_range(topic, number)
            return
        where = (
            f" ({topic}:{number})"
            if topic is not None and number is not None and number >= 0
            else ""
        )
        self.health_state.failed(
            SourceError(f"Kafka {err.name()}{where}: {self._redact(err.str())}")
        )

    def _out_of_range(self, topic: str, number: int) -> None:
        """Our position is outside the partition's log: skip to its start, or stop there."""
        name = self._name(topic, number)
        tp = TopicPartition(topic, number)
        consumer = self._consumer
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=1.0)
        except (KafkaException, RuntimeError) as exc:
            self.health_state.failed(SourceError(self._redact(str(exc))))
            return
        at = self._positions.get(name, self._initial)
        if 0 <= at < low:
            note = (
                f"{name}: offsets {at}..{low - 1} were deleted (retention) before they were "
                f"read; reading on from {low}"
            )
            log.error("%s", note)
            self._gaps.append(note)
            with self._lock:
                self._positions[name] = low
            consumer.seek(TopicPartition(topic, number, low))
            return
        note = (
            f"{name}: position {at} is past the end of the partition ({high}); was the topic "
            "deleted and made again? The partition is paused: replay the topic into a fresh "
            "state directory"
        )
        log.error("%s", note)
        self._gaps.append(note)
        self.health_state.failed(SourceError(note))
        with self._lock:
            self._paused.add((topic, number))
        consumer.pause([tp])

    # -- acknowledgement ---------------------------------------------------------

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Commit to Kafka, per assigned partition, the first offset not yet durable."""
        offsets = self.commit_offsets(positions, waiting)
        consumer = self._consumer
        if not offsets or consumer is None:
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
        except (KafkaException, RuntimeError) as exc:  # closed meanwhile; the next commit repeats
            self._commit_error = self._redact(str(exc))

    def commit_offsets(
        self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]
    ) -> list[TopicPartition]:
        """The offsets :meth:`committed` sends: assigned partitions whose offset moved."""
        out: list[TopicPartition] = []
        with self._lock:
            for topic, number in sorted(self._assigned):
                name = self._name(topic, number)
                at = positions.get(name)
                if at is None:
                    continue
                held = waiting.get(name)
                if held:
                    at = min(at, min(held))
                if self._acked.get(name) != at:
                    out.append(TopicPartition(topic, number, at))
        return out

    # -- where things stand ------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        """Resume position of every partition read (or resumed) so far."""
        with self._lock:
            return dict(self._positions)

    def lag(self) -> dict[str, int]:
        """Records behind the high watermark, per assigned partition (as last fetched)."""
        consumer = self._consumer
        out: dict[str, int] = {}
        if consumer is None:
            return out
        with self._lock:
            assigned = sorted(self._assigned)
            positions = dict(self._positions)
        for topic, number in assigned:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, number), cached=True
                )
            except (KafkaException, RuntimeError):
                continue
            if high < 0:
                continue
            name = self._name(topic, number)
            out[name] = max(0, high - positions.get(name, max(low, 0)))
        return out

    def backlog_bytes(self) -> int:
        """Bytes fetched but not returned, plus the lag at the average record size."""
        behind = sum(self.lag().values())
        avg = self._record_bytes // self._records if self._records else 1
        return self._held_bytes + behind * max(1, avg)

    def health(self) -> dict[str, Any]:
        """The connector's entry in ``/v1/status``: connection, lag, assignment, commits."""
        lag = self.lag()
        with self._lock:
            assigned = sorted(self._name(t, p) for t, p in self._assigned)
            paused = sorted(self._name(t, p) for t, p in self._paused)
            acked = dict(self._acked)
        return {
            self.spec.name: self.health_state.report(
                lag=sum(lag.values()) if lag else None,
                partitions=lag,
                assigned=assigned,
                paused=paused,
                kafka_committed=acked,
                commit_error=self._commit_error,
                gaps=self._gaps[-5:],
                rebalances=self._assignments,
                started_at=dict(self._started),
                topics=list(self.spec.topics),
                group_id=self.spec.group_id,
            )
        }

    # -- waking the job ----------------------------------------------------------

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` when the client has fetched past our position (or may have news)."""
        self._wake = event
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name=f"streamrag-kafka-{self.spec.name}", daemon=True
            )
            self._thread.start()

    def _watch(self) -> None:
        ticks = 0
        while not self._stop.wait(_WAKE_TICK_S):
            ticks += 1
            event = self._wake
            if event is None:
                continue
            try:
                news = self._news()
            except Exception:  # a closed client: the next poll says why
                news = True
            # Without a known backlog, a poll every few ticks serves the client's
            # callbacks (assignment, errors) anyway.
            if news or (ticks % 20 == 0 and not self._caught_up()):
                event.set()

    def _news(self) -> bool:
        consumer = self._consumer
        if self._held or consumer is None:
            return True
        positions = self._positions
        for tp, name in self._watched:
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            if high > positions.get(name, max(low, 0)):
                return True
        return False

    def _caught_up(self) -> bool:
        with self._lock:
            return bool(self._assigned) and self.health_state.connected

    # -- the end -----------------------------------------------------------------

    def _close_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        with self._lock:
            self._assigned.clear()
            self._watched = ()
            self._held.clear()
            self._held_bytes = 0
        if consumer is not None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("%s: closing the consumer: %s", self.spec.name, self._redact(str(exc)))

    def close(self) -> None:
        """Leave the group and stop the wake thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._close_consumer()


def _size(msg: Any) -> int:
    value = msg.value()
    key = msg.key()
    return max(1, len(value or b"") + len(key or b""))
