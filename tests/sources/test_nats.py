"""The NATS JetStream connector against a real server (127.0.0.1:4222, or a private one).

Each test makes its own stream (a unique name) and deletes it after. Waiting
is for the server or the reader's background loop, always with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

nats = pytest.importorskip("nats")


from streamrag.errors import ConfigError, SourceError  # noqa: E402
from streamrag.sources.base import AcknowledgesCommits, RawBatch, ReportsHealth, Wakes  # noqa: E402
from streamrag.sources.nats import NatsReader, NatsSource  # noqa: E402

pytestmark = pytest.mark.timeout(60)

SERVER = "nats://127.0.0.1:4222"
NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def _up(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


class Js:
    """A test's own JetStream client: publish, inspect the consumer, clean up (synchronous)."""

    def __init__(self, url: str = SERVER) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc: Any = self.run(
            nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        )
        self.js = self.nc.jetstream()
        self.jsm = self.nc.jsm()

    def run(self, coro: Any, timeout: float = 20) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add_stream(self, name: str) -> None:
        self.run(self.jsm.add_stream(name=name, subjects=[f"{name}.>"]))

    def publish(
        self, stream: str, *records: bytes, subject: str = "docs", **headers: str
    ) -> list[int]:
        """Publish each record; the stream sequences the server gave them."""

        async def go() -> list[int]:
            out = []
            for r in records:
                ack = await self.js.publish(f"{stream}.{subject}", r, headers=headers or None)
                out.append(ack.seq)
            return out

        return self.run(go())  # type: ignore[no-any-return]

    def consumer(self, stream: str, durable: str) -> Any:
        return self.run(self.jsm.consumer_info(stream, durable))

    def close(self, *streams: str) -> None:
        for s in streams:
            with contextlib.suppress(Exception):
                self.run(self.jsm.delete_stream(s))
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def js() -> Iterator[Js]:
    if not _up(SERVER):
        pytest.skip("no NATS server at 127.0.0.1:4222")
    client = Js()
    made: list[str] = []
    orig = client.add_stream

    def add(name: str) -> None:
        orig(name)
        made.append(name)

    client.add_stream = add  # type: ignore[method-assign]
    yield client
    client.close(*made)


@pytest.fixture
def stream(js: Js) -> str:
    name = "SR" + uuid.uuid4().hex[:10]
    js.add_stream(name)
    return name


def _records(n: int, start: int = 0) -> list[bytes]:
    return [
        json.dumps({"doc_id": f"d{i}", "event_time": 1_700_000_000 + i, "text": f"t{i}"}).encode()
        for i in range(start, start + n)
    ]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def read(
    reader: NatsReader, n: int, timeout: float = 10, max_bytes: int = 1 << 20
) -> list[RawBatch]:
    """Poll until ``n`` records came back; each poll must return at once."""
    got: list[RawBatch] = []

    def more() -> bool:
        started = time.perf_counter()
        got.extend(reader.poll(max_bytes))
        assert time.perf_counter() - started < 0.25, "poll blocked"
        return sum(len(b) for b in got) >= n

    wait_for(more, timeout, f"{n} records")
    return got


def flat(batches: list[RawBatch]) -> list[tuple[int, bytes]]:
    return [(o, line) for b in batches for o, line in zip(b.offsets, b.lines, strict=True)]


def _mk(stream: str, **kw: Any) -> NatsSource:
    kw.setdefault("durable", "dur" + uuid.uuid4().hex[:6])
    return NatsSource("q", stream, **kw)


@pytest.fixture
def readers() -> Iterator[list[NatsReader]]:
    made: list[NatsReader] = []
    yield made
    for r in made:
        r.close()


def test_initial_load_then_live_messages(js: Js, stream: str, readers: list[NatsReader]) -> None:
    recs = _records(30)
    seqs = js.publish(stream, *recs[:20])
    src = _mk(stream)
    reader = src.build()
    readers.append(reader)
    wake = threading.Event()
    reader.wake_on(wake)
    assert isinstance(reader, AcknowledgesCommits | Wakes | ReportsHealth)
    assert reader.snapshot() == {}, "nothing read, no resume: no position yet"
    before = time.time() * 1e6
    got = read(reader, 20, max_bytes=200)
    assert len(got) > 1, "max_bytes cuts the queue into several polls"
    assert flat(got) == list(zip(seqs, recs[:20], strict=True))
    b = got[0]
    assert b.source == f"nats:q:{stream}"
    assert src.owns(b.source)
    assert b.decoder is None
    assert b.keys is not None
    assert set(b.keys) == {f"{stream}.docs".encode()}
    assert b.times is not None
    assert all(t is not None and before - 60e6 < t <= before for t in b.times)
    assert all(x.end_offset == x.offsets[-1] + 1 for x in got)
    assert reader.snapshot() == {b.source: seqs[-1] + 1}
    # Live: each message arrives at once, and wakes the job.
    wake.clear()
    live = js.publish(stream, *recs[20:], key="row-7")
    wait_for(wake.is_set, 5, "the wake event")
    got = read(reader, 10)
    assert flat(got) == list(zip(live, recs[20:], strict=True))
    assert got[0].keys == [b"row-7"] * len(got[0])
    assert reader.poll(1 << 20) == []
    health = reader.health()["q"]
    assert health["connected"] is True
    assert health["kind"] == "nats"
    assert health["unacked"] == 30
    assert health["queued"] == 0


def test_acks_only_after_the_commit_and_never_the_waiting(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    seqs = js.publish(stream, *_records(10))
    src = _mk(stream)
    reader = src.build()
    readers.append(reader)
    part = src.partition
    read(reader, 10)
    info = js.consumer(stream, src.durable)
    assert info.num_ack_pending == 10, "read is not acked"
    assert info.ack_floor.stream_seq == 0
    reader.committed({part: seqs[6]}, {part: [seqs[2], seqs[4]]})  # 1..6 committed, 3 and 5 wait

    def acked(pending: int, floor: int) -> bool:
        i = js.consumer(stream, src.durable)
        return bool(i.num_ack_pending == pending and i.ack_floor.stream_seq == floor)

    wait_for(lambda: acked(6, seqs[1]), 5, "1, 2, 4, 6 acked")
    reader.committed({part: seqs[-1] + 1}, {})
    wait_for(lambda: acked(0, seqs[-1]), 5, "everything acked")
    assert reader.health()["q"]["acked"] == 10
    reader.committed({"someone-else": 99}, {})  # other partitions: nothing to do


def test_a_redelivery_is_never_returned_twice(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    recs = _records(5)
    js.publish(stream, *recs)
    src = _mk(stream, ack_wait_s=1.0)
    reader = src.build()
    readers.append(reader)
    first = flat(read(reader, 5))
    # The records wait in the batcher past ack_wait: the server delivers them again.
    wait_for(lambda: reader.redelivered >= 5, 10, "the redeliveries")
    assert reader.poll(1 << 20) == [], "a redelivered record is not read again"
    reader.committed({src.partition: first[-1][0] + 1}, {})
    wait_for(lambda: js.consumer(stream, src.durable).num_ack_pending == 0, 5, "the acks")
    # Acked is acked: nothing comes again, and a later message reads as usual.
    seq = js.publish(stream, b'{"late": 1}')[0]
    assert flat(read(reader, 1)) == [(seq, b'{"late": 1}')]


def test_restart_resumes_at_the_oldest_waiting_offset_at_once(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    recs = _records(10)
    seqs = js.publish(stream, *recs)
    src = _mk(stream)  # ack_wait 60 s: a restart that waited for redelivery would time out
    part = src.partition
    a = src.build()
    readers.append(a)
    read(a, 10)
    # Commit 1..7 with 5 still waiting; 8..10 were read and then the process died.
    a.committed({part: seqs[6] + 1}, {part: [seqs[4]]})
    wait_for(lambda: js.consumer(stream, src.durable).num_ack_pending == 4, 5, "the acks")
    a.close()
    assert js.consumer(stream, src.durable).num_ack_pending == 4, "a crash acks nothing"
    started = time.monotonic()
    b = src.build({part: seqs[4]})  # what the cursor's Rewind asks for: the oldest waiting
    readers.append(b)
    assert b.snapshot() == {part: seqs[4]}, "a reader that has not read reports its start"
    again = flat(read(b, 6, timeout=5))
    assert time.monotonic() - started < 5
    assert again == list(zip(seqs[4:], recs[4:], strict=True)), "the same offsets, the same bytes"
    assert b.health()["q"]["recreated"] == 1
    b.committed({part: seqs[-1] + 1}, {})
    wait_for(lambda: js.consumer(stream, src.durable).num_ack_pending == 0, 5, "acks after restart")
    b.close()
    # The server drops a closed connection's pull requests a moment after the close;
    # a message published before that is delivered to the dead request (and the next
    # reader, finding it unacked, rightly recreates the durable). Wait for the server.
    wait_for(lambda: js.consumer(stream, src.durable).num_waiting == 0, 5, "b's pulls to end")
    # A clean stop keeps the durable as it is, and the next reader continues after it.
    c = src.build({part: seqs[-1] + 1})
    readers.append(c)
    more = js.publish(stream, *_records(2, start=50))
    assert [o for o, _ in flat(read(c, 2))] == more
    assert c.health()["q"]["recreated"] == 0


def test_a_new_job_reads_the_stream_from_its_start(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    """No resume position (an empty state directory): everything, even what a durable acked."""
    seqs = js.publish(stream, *_records(4))
    src = _mk(stream)
    a = src.build()
    readers.append(a)
    read(a, 4)
    a.committed({src.partition: seqs[-1] + 1}, {})
    wait_for(lambda: js.consumer(stream, src.durable).num_ack_pending == 0, 5, "the acks")
    a.close()
    b = src.build()
    readers.append(b)
    assert [o for o, _ in flat(read(b, 4))] == seqs


def test_backpressure_bounds_what_is_pulled(js: Js, stream: str, readers: list[NatsReader]) -> None:
    js.publish(stream, *_records(200))
    src = _mk(stream, max_queue_messages=16, pull_batch=8)
    reader = src.build()
    readers.append(reader)
    wait_for(lambda: reader.health()["q"]["queued"] == 16, 5, "a full queue")
    # The server answers a pull at once: had the reader asked for more, it would have it.
    info = js.consumer(stream, src.durable)
    assert info.delivered.stream_seq == 16, "the server keeps the rest"
    assert info.num_pending == 184
    assert reader.health()["q"]["queued"] == 16
    got = read(reader, 200, timeout=20)
    assert [o for o, _ in flat(got)] == list(range(1, 201))


def test_resume_past_the_end_of_the_stream_is_a_source_error(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    js.publish(stream, *_records(3))
    src = _mk(stream)
    reader = src.build({src.partition: 50})
    readers.append(reader)

    def raised() -> bool:
        try:
            reader.poll(1 << 20)
        except SourceError as exc:
            errors.append(str(exc))
            return True
        return False

    errors: list[str] = []
    wait_for(raised, 5, "the SourceError")
    assert "deleted and made again" in errors[0]


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SR_NATS_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="SR_NATS_TOKEN"):
        NatsSource("q", "S", token_env="SR_NATS_TOKEN").build()


# -- a private server: auth, and a connection that drops ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """``nats-server -js`` on a free port with a file store in ``store``."""

    def __init__(self, store: Path, *extra: str) -> None:
        self.port = _free_port()
        self.store = store
        self.extra = extra
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                NATS_SERVER,
                "-js",
                "-sd",
                str(self.store),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _up(self.url), 10, "nats-server to listen")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Callable[..., PrivateServer]]:
    if not os.path.exists(NATS_SERVER):
        pytest.skip("no nats-server binary")
    made: list[PrivateServer] = []

    def make(*extra: str) -> PrivateServer:
        server = PrivateServer(tmp_path / f"js{len(made)}", *extra)
        made.append(server)
        server.start()
        return server

    yield make
    for s in made:
        s.kill()


@pytest.mark.parametrize("attempts", [20, 2], ids=["client-reconnects", "client-gives-up"])
def test_a_server_restart_is_survived_without_loss(
    attempts: int, private: Callable[..., PrivateServer], readers: list[NatsReader]
) -> None:
    server = private()
    js = Js(server.url)
    try:
        js.add_stream("DROP")
        recs = _records(20)
        first = js.publish("DROP", *recs[:10])
        src = NatsSource(
            "q",
            "DROP",
            servers=(server.url,),
            durable="d",
            reconnect_attempts=attempts,
            ack_wait_s=2,
        )
        reader = src.build()
        readers.append(reader)
        got = flat(read(reader, 10))
        reader.committed({src.partition: first[5] + 1}, {})  # 1..6 committed
        server.kill()
        wait_for(lambda: not reader.health()["q"]["connected"], 10, "the reader to see the drop")
        assert reader.poll(1 << 20) == [], "a lost connection is no error out of poll"
        if attempts == 2:  # down until the client gives up and the reader takes over
            wait_for(lambda: reader.health()["q"]["failures"] >= 2, 20, "the client to give up")
        server.start()
        wait_for(lambda: reader.health()["q"]["connected"], 20, "the reconnect")
        health = reader.health()["q"]
        assert health["last_error"]
        assert health["failures"] >= 1
        second = js.publish("DROP", *recs[10:])
        got += flat(read(reader, 10, timeout=20))
        assert got == list(zip(first + second, recs, strict=True)), "nothing lost, nothing twice"
        reader.committed({src.partition: second[-1] + 1}, {})
        # Acks the killed server had not written yet are lost with it: those messages
        # come again after ack_wait, and being committed already they are acked at once.
        wait_for(lambda: js.consumer("DROP", "d").num_ack_pending == 0, 15, "every ack")
    finally:
        js.close("DROP")


def test_token_auth_from_the_environment_and_never_shown(
    private: Callable[..., PrivateServer],
    readers: list[NatsReader],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = private("--auth", "s3cret-tok")
    monkeypatch.setenv("SR_NATS_TOKEN", "wrong-tok")
    bad = NatsSource("q", "AUTH", servers=(server.url,), token_env="SR_NATS_TOKEN").build()
    readers.append(bad)
    wait_for(lambda: bad.health()["q"]["last_error"], 10, "the refused connection")
    assert "wrong-tok" not in json.dumps(bad.health())
    assert bad.poll(1 << 20) == []
    monkeypatch.setenv("SR_NATS_TOKEN", "s3cret-tok")
    js = Js(f"nats://s3cret-tok@127.0.0.1:{server.port}")
    try:
        js.add_stream("AUTH")
        seqs = js.publish("AUTH", *_records(2))
        good = NatsSource("q", "AUTH", servers=(server.url,), token_env="SR_NATS_TOKEN").build()
        readers.append(good)
        assert [o for o, _ in flat(read(good, 2))] == seqs
        assert "s3cret-tok" not in json.dumps(good.health())
    finally:
        js.close("AUTH")


def test_from_settings_names_the_decoder_and_pickles() -> None:
    import pickle

    from streamrag.config import NatsSourceSettings

    spec = NatsSource.from_settings(
        NatsSourceSettings(kind="nats", name="q", stream="S", durable="dd", subject="S.a")
    )
    assert spec.decoder == "q"
    assert spec.durable == "dd"
    assert spec.subject == "S.a"
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert spec.owns("nats:q:S")
    assert not spec.owns("nats:q:T")


def test_a_subject_filter_reads_only_its_messages_at_their_sequences(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    a1 = js.publish(stream, b'{"a": 1}', subject="a")
    js.publish(stream, b'{"b": 1}', subject="b")
    a2 = js.publish(stream, b'{"a": 2}', subject="a")
    src = _mk(stream, subject=f"{stream}.a")
    reader = src.build()
    readers.append(reader)
    assert flat(read(reader, 2)) == [(a1[0], b'{"a": 1}'), (a2[0], b'{"a": 2}')]
    assert reader.snapshot() == {src.partition: a2[0] + 1}


def test_messages_gone_before_they_were_read_are_counted_and_reading_goes_on(
    js: Js, stream: str, readers: list[NatsReader]
) -> None:
    seqs = js.publish(stream, *_records(5))
    js.run(js.jsm.purge_stream(stream))  # 1..5 gone; the stream keeps its sequence
    src = _mk(stream)
    reader = src.build({src.partition: seqs[2]})  # 3, 4, 5 were never read
    readers.append(reader)
    wait_for(lambda: reader.health()["q"]["connected"], 5, "the connection")
    assert reader.health()["q"]["expired"] == 3
    later = js.publish(stream, b'{"after": 1}')
    assert flat(read(reader, 1)) == [(later[0], b'{"after": 1}')]


def test_ack_subjects_of_both_forms_are_read() -> None:
    from streamrag.sources.nats import _ack_fields

    assert _ack_fields("$JS.ACK.S.dur.1.42.7.1700000000123456789.3") == (42, 1700000000123456, 3)
    v2 = "$JS.ACK.dom.ACCHASH.S.dur.2.42.8.1700000000123456789.0.tok"
    assert _ack_fields(v2) == (42, 1700000000123456, 0)
    with pytest.raises(SourceError):
        _ack_fields("_INBOX.abc")


# -- for the Source contract suite (tests/contracts/test_source_contract.py) --------

_CONTRACT_JS: list[Js] = []


class NatsWriter:
    """Publishes records to a JetStream stream (one message each).

    Fits the suite's ``Writer``: a message is always whole (no partial records),
    and ``truncate`` deletes the stream and makes it again, as an operator
    replacing it would (its sequences start over, below a reader's resume position).
    """

    def __init__(self, js: Js, stream: str) -> None:
        self.js, self.stream = js, stream

    def append(self, *records: bytes) -> None:
        self.js.publish(self.stream, *records)

    def append_partial(self, head: bytes) -> None:
        raise NotImplementedError("a NATS message is always whole")

    def finish_partial(self, rest: bytes) -> None:
        raise NotImplementedError("a NATS message is always whole")

    def truncate(self) -> None:
        self.js.run(self.js.jsm.delete_stream(self.stream))
        _add_contract_stream(self.js, self.stream)


def _add_contract_stream(js: Js, name: str) -> None:
    # Nobody deletes the suite's streams: they expire after ten minutes.
    js.run(js.jsm.add_stream(name=name, subjects=[f"{name}.>"], max_age=600))


def make_nats_case(tmp: Path) -> tuple[NatsSource, NatsWriter]:
    """A new stream on 127.0.0.1:4222 and a source over it (a ``Case.make`` for the suite)."""
    if not _up(SERVER):
        pytest.skip("no NATS server at 127.0.0.1:4222")
    if not _CONTRACT_JS:
        _CONTRACT_JS.append(Js())
    js = _CONTRACT_JS[0]
    stream = "SRC" + uuid.uuid4().hex[:10]
    _add_contract_stream(js, stream)
    return NatsSource("contract", stream, durable="c" + uuid.uuid4().hex[:8]), NatsWriter(
        js, stream
    )
