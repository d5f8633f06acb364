"""The Redis Streams connector against a real Redis (127.0.0.1:6379, or a private server).

Every test uses its own stream key (and so its own consumer group) and deletes
it afterwards. Waiting is for Redis or for a thread, with a deadline, never a
sleep for time to pass; the reconnect back-off runs on a :class:`ManualClock`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import RedisError

from streamrag.errors import ConfigError, SourceError
from streamrag.ingest import Decoder
from streamrag.runtime.cursor import Cursor, Rewind
from streamrag.sources.base import AcknowledgesCommits, RawBatch, ReportsHealth, Wakes
from streamrag.sources.redis_streams import (
    RedisSource,
    RedisSourceReader,
    entry_offset,
    offset_id,
)
from streamrag.testing import ManualClock
from tests.e2e.conftest import free_port

pytestmark = pytest.mark.timeout(60)

REDIS_URL = "redis://127.0.0.1:6379/0"


# -- for the source contract suite -----------------------------------------------------


class RedisWriter:
    """Appends entries (the record in field ``data``) to one Redis stream.

    For ``tests/contracts/test_source_contract.py``: ``Case("redis", make_redis_case,
    partial_records=False)``. Keys it writes expire after an hour, so a run that
    is interrupted leaves nothing behind for long.
    """

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key

    def append(self, *records: bytes) -> None:
        pipe = self.client.pipeline(transaction=False)
        for record in records:
            pipe.xadd(self.key, {"data": record})
        pipe.expire(self.key, 3600)
        pipe.execute()

    def append_partial(self, head: bytes) -> None:
        raise NotImplementedError("a stream entry is always complete")

    def finish_partial(self, rest: bytes) -> None:
        raise NotImplementedError("a stream entry is always complete")

    def truncate(self) -> None:
        """Delete the stream (and its group): an operator replacing the input."""
        self.client.delete(self.key)
        self.client.xgroup_create(self.key, "truncated", id="0", mkstream=True)
        self.client.expire(self.key, 3600)


def make_redis_case(tmp: Path) -> tuple[RedisSource, RedisWriter]:
    """A Redis source over a fresh stream key, and its writer (needs Redis on 6379)."""
    key = f"streamrag-contract-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(REDIS_URL)
    return RedisSource(name="contract", streams=(key,), url=REDIS_URL), RedisWriter(client, key)


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def admin() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    yield client
    client.close()


@pytest.fixture
def stream(admin: redis.Redis) -> Iterator[str]:
    key = f"streamrag-test-{uuid.uuid4().hex[:12]}"
    yield key
    admin.delete(key)


@pytest.fixture
def readers() -> Iterator[Callable[..., RedisSourceReader]]:
    """Build readers that are closed at the end of the test."""
    opened: list[RedisSourceReader] = []

    def build(source: RedisSource, resume: dict[str, int] | None = None) -> RedisSourceReader:
        reader = source.build(resume)
        opened.append(reader)
        return reader

    yield build
    for reader in opened:
        reader.close()


def _source(key: str, **kw: Any) -> RedisSource:
    args: dict[str, Any] = {"name": "r", "streams": (key,), "url": REDIS_URL, "decoder": "r"}
    args.update(kw)
    return RedisSource(**args)


def _change(i: int, op: str = "upsert") -> bytes:
    body: dict[str, Any] = {"doc_id": f"d{i}", "event_time": 1_700_000_000 + i, "op": op}
    if op == "upsert":
        body["text"] = f"document {i}"
    return json.dumps(body).encode()


def _add(client: redis.Redis, key: str, n: int, start: int = 0) -> list[bytes]:
    return [client.xadd(key, {"data": _change(i), "key": f"k{i}"}) for i in range(start, start + n)]


def _drain(reader: RedisSourceReader, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for _ in range(1000):
        got = reader.poll(max_bytes)
        if not got:
            return out
        out += [(o, line) for b in got for o, line in zip(b.offsets, b.lines, strict=True)]
    raise AssertionError("the reader never caught up")


def _pending(client: redis.Redis, key: str, group: str = "streamrag") -> dict[str, list[int]]:
    """Pending entries per consumer: consumer → offsets."""
    out: dict[str, list[int]] = {}
    for p in client.xpending_range(key, group, "-", "+", 10_000):
        out.setdefault(p["consumer"].decode(), []).append(entry_offset(p["message_id"]))
    return out


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# -- offsets --------------------------------------------------------------------------


def test_offsets_order_like_entry_ids_and_refuse_what_cannot_be_packed() -> None:
    ids = [
        "0-1",
        "0-1048575",
        "1-0",
        "1-1",
        "1700000000000-0",
        "1700000000000-7",
        "8796093022207-9",
    ]
    offsets = [entry_offset(i) for i in ids]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(ids)
    assert [offset_id(o) for o in offsets] == ids
    assert (
        offset_id(entry_offset("0-1048575") + 1) == "1-0"
    )  # end_offset is the next id there can be
    assert max(offsets) < 2**63  # an int64 offset column holds it
    with pytest.raises(SourceError, match="1048576"):
        entry_offset("5-1048576")
    with pytest.raises(SourceError, match=r"2\*\*43"):
        entry_offset(f"{2**43}-0")


# -- reading ------------------------------------------------------------------------------


def test_initial_load_reads_what_the_stream_holds_in_order(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 30)
    admin.xadd(stream, {"other": "x"})  # no key field: key None
    source = _source(stream)
    reader = readers(source)
    assert isinstance(reader, AcknowledgesCommits)
    assert isinstance(reader, Wakes)
    assert isinstance(reader, ReportsHealth)
    assert reader.backlog_bytes() >= sum(len(_change(i)) for i in range(30))
    before = reader.health()["r"]
    assert before["lag"] == 31
    assert before["pending"] == 0
    batches = reader.poll(1 << 20)
    assert len(batches) == 1
    b = batches[0]
    assert b.source == f"redis:r:{stream}"
    assert source.owns(b.source)
    assert not _source(stream, name="other").owns(b.source)
    assert b.lines[:30] == [_change(i) for i in range(30)]
    assert b.offsets[:30] == [entry_offset(i) for i in ids]
    assert b.end_offset == b.offsets[-1] + 1
    assert b.decoder == "r"
    assert b.keys is not None
    assert b.keys[:30] == [f"k{i}".encode() for i in range(30)]
    assert b.keys[30] is None
    assert b.times is not None
    assert b.times[0] == int(ids[0].split(b"-")[0]) * 1000
    assert reader.snapshot() == {b.source: b.end_offset}
    assert reader.poll(1 << 20) == []
    assert reader.backlog_bytes() == 0
    # Nothing is acknowledged before a commit: all 31 wait in this consumer's PEL.
    assert len(_pending(admin, stream)["streamrag"]) == 31
    after = reader.health()["r"]
    assert after["connected"] is True
    assert after["lag"] == 0
    assert after["pending"] == 31
    reader.committed(reader.snapshot(), {})
    assert reader.health()["r"]["pending"] == 0


def test_live_entries_wake_the_job_and_come_in_order(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    reader = readers(_source(stream))
    assert reader.poll(1 << 20) == []
    woke = threading.Event()
    reader.wake_on(woke)
    _wait(woke.is_set, 5, "the wake thread to connect")  # it wakes once when it connects
    seen: list[tuple[int, bytes]] = []
    for round_ in range(3):
        woke.clear()
        ids = _add(admin, stream, 4, start=10 * round_)
        _wait(woke.is_set, 5, "a wake-up for the new entries")
        got = _drain(reader)
        assert got == [(entry_offset(i), _change(10 * round_ + j)) for j, i in enumerate(ids)]
        seen += got
    offsets = [o for o, _ in seen]
    assert offsets == sorted(set(offsets))
    # The wake thread consumed nothing of the group: every entry went to the poll.
    assert len(_pending(admin, stream)["streamrag"]) == 12


def test_max_bytes_bounds_a_poll_and_nothing_fetched_is_lost(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    _add(admin, stream, 25)
    reader = readers(_source(stream))
    one = reader.poll(1)
    assert [len(b.lines) for b in one] == [1]
    got = [(one[0].offsets[0], one[0].lines[0])]
    while batches := reader.poll(100):
        sizes = [len(x) for b in batches for x in b.lines]
        assert sum(sizes[:-1]) < 100
        got += [(o, x) for b in batches for o, x in zip(b.offsets, b.lines, strict=True)]
    assert [x for _, x in got] == [_change(i) for i in range(25)]


def test_an_entry_without_the_field_is_one_dead_letter_at_its_offset(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    good = admin.xadd(stream, {"data": _change(1)})
    bad = admin.xadd(stream, {"payload": _change(2), "key": "k"})
    reader = readers(_source(stream))
    batches = reader.poll(1 << 20)
    changes, letters = Decoder().decode(batches)
    assert list(changes.doc_ids) == ["d1"]
    assert list(changes.offsets) == [entry_offset(good)]
    assert len(letters) == 1
    letter = letters[0]
    assert letter.source == f"redis:r:{stream}"
    assert letter.offset == entry_offset(bad)
    assert "no field 'data'" in letter.raw
    assert "'payload'" in letter.raw
    assert offset_id(letter.offset) == bad.decode()  # the position names the entry


def test_a_pending_entry_deleted_before_its_commit_is_still_one_record(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 3)
    source = _source(stream)
    first = readers(source)
    _drain(first)
    first.close()  # crashed: nothing acknowledged
    admin.xdel(stream, ids[1])
    again = _drain(readers(source))
    assert [o for o, _ in again] == [entry_offset(i) for i in ids]
    _, letters = Decoder().decode(
        [RawBatch("p", [line for _, line in again], [o for o, _ in again], 0)]
    )
    assert [le.offset for le in letters] == [entry_offset(ids[1])]
    assert "was deleted" in letters[0].raw


def test_an_id_that_cannot_be_packed_stops_the_stream_loudly(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    admin.xadd(stream, {"data": _change(1)}, id="5-1")
    admin.xadd(stream, {"data": _change(2)}, id="5-2000000")
    admin.xadd(stream, {"data": _change(3)}, id="6-0")
    reader = readers(_source(stream))
    assert [b.lines for b in reader.poll(1 << 20)] == [[_change(1)]]  # what came before it
    with pytest.raises(SourceError, match="5-2000000"):
        reader.poll(1 << 20)
    with pytest.raises(SourceError, match="5-2000000"):  # again, not skipped
        reader.poll(1 << 20)


# -- acknowledgement ---------------------------------------------------------------------


def test_xack_only_after_the_commit_and_never_what_is_waiting(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 10)
    offs = [entry_offset(i) for i in ids]
    reader = readers(_source(stream))
    part = f"redis:r:{stream}"
    _drain(reader)
    assert _pending(admin, stream)["streamrag"] == offs  # read, not acknowledged
    # A commit that covers the first six, with the third still waiting in the batcher.
    reader.committed({part: offs[6]}, {part: [offs[2]]})
    assert _pending(admin, stream)["streamrag"] == [offs[2], *offs[6:]]
    # The next commit repeats the whole state: the third is in now, the rest is waiting.
    reader.committed({part: offs[-1] + 1}, {part: offs[8:]})
    assert _pending(admin, stream)["streamrag"] == offs[8:]
    reader.committed({part: offs[-1] + 1}, {})
    assert _pending(admin, stream) == {}
    assert reader.acked == 10
    reader.committed({part: offs[-1] + 1}, {})  # idempotent
    assert reader.acked == 10


# -- restarts ----------------------------------------------------------------------------


def test_a_restart_reads_its_own_pending_entries_again_at_the_same_offsets(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 10)
    offs = [entry_offset(i) for i in ids]
    source = _source(stream)
    part = f"redis:r:{stream}"
    first = readers(source)
    read = _drain(first, 200)
    # The commit covered all ten but 2 and 5 were waiting in the batcher; then a crash.
    first.committed({part: first.snapshot()[part]}, {part: [offs[2], offs[5]]})
    first.close()
    ids += _add(admin, stream, 3, start=10)
    cursor = Cursor(positions={part: offs[-1] + 1}, pending={part: [offs[2], offs[5]]})
    rewind = Rewind(cursor)
    second = readers(source, rewind.resume)
    assert second.snapshot() == {part: offs[2]}, "it reports where it starts"
    sifted = rewind.sift(second.poll(1 << 20))
    again = [(o, x) for b in sifted.again for o, x in zip(b.offsets, b.lines, strict=True)]
    fresh = [o for b in sifted.fresh for o in b.offsets]
    while more := second.poll(1 << 20):
        fresh += [o for b in rewind.sift(more).fresh for o in b.offsets]
    assert again == [read[2], read[5]], "the waiting entries, same offsets, same lines"
    assert fresh == [entry_offset(i) for i in ids[10:]], "then the new ones, once"
    assert rewind.waiting == 0


def test_entries_committed_but_not_acknowledged_are_skipped_and_acknowledged(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 8)
    offs = [entry_offset(i) for i in ids]
    source = _source(stream)
    part = f"redis:r:{stream}"
    _drain(readers(source))  # the commit of the first five was durable; the XACK never came
    second = readers(source, {part: offs[5]})
    assert [o for o, _ in _drain(second)] == offs[5:]
    assert _pending(admin, stream)["streamrag"] == offs[5:]


def test_a_crashed_consumers_pending_entries_are_claimed_in_order(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 10)
    offs = [entry_offset(i) for i in ids]
    # Another consumer of the group reads six and dies without acknowledging.
    admin.xgroup_create(stream, "streamrag", id="0")
    admin.xreadgroup("streamrag", "dead", {stream: ">"}, count=6)
    assert _pending(admin, stream) == {"dead": offs[:6]}
    # A reader that waits long before claiming leaves them to it.
    patient = readers(_source(stream, consumer="patient", claim_idle_ms=3_600_000))
    assert [o for o, _ in _drain(patient)] == offs[6:]
    assert _pending(admin, stream)["dead"] == offs[:6]
    patient.committed(patient.snapshot(), {})
    # One that claims after 1 ms takes them over, read in id order with its own.
    _wait(
        lambda: len(admin.xpending_range(stream, "streamrag", "-", "+", 10, "dead", idle=2)) == 6,
        5,
        "the dead consumer's entries to be idle",
    )
    heir = readers(_source(stream, consumer="heir", claim_idle_ms=1))
    got = _drain(heir)
    assert [o for o, _ in got] == offs[:6]
    assert [x for _, x in got] == [_change(i) for i in range(6)]
    pending = _pending(admin, stream)
    assert "dead" not in pending
    assert pending["heir"] == offs[:6]


def test_resume_past_the_end_of_the_stream_is_a_source_error(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 3)
    source = _source(stream)
    reader = readers(source)
    _drain(reader)
    snap = reader.snapshot()
    admin.delete(stream)  # replaced: the index holds entries the stream no longer has
    admin.xadd(stream, {"data": _change(9)}, id="1-1")
    with pytest.raises(SourceError, match="deleted or replaced"):
        readers(source, snap).poll(1 << 20)
    assert entry_offset(ids[-1]) + 1 == snap[f"redis:r:{stream}"]


# -- connections --------------------------------------------------------------------------


def _kill_clients(admin: redis.Redis, prefix: str) -> int:
    killed = 0
    for client in admin.client_list():
        if client["name"].startswith(prefix):
            killed += admin.client_kill_filter(_id=client["id"])
    return killed


def test_client_kill_of_the_readers_connections_is_survived(
    admin: redis.Redis, stream: str, readers: Callable[..., RedisSourceReader]
) -> None:
    ids = _add(admin, stream, 5)
    reader = readers(_source(stream, consumer="victim"))
    woke = threading.Event()
    reader.wake_on(woke)
    got = _drain(reader)
    _wait(lambda: any(c["name"].endswith("-wake") for c in admin.client_list()), 5, "the waker")
    assert _kill_clients(admin, "streamrag-r-victim") == 2  # the reader's and the waker's
    ids += _add(admin, stream, 5, start=5)
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        got += _drain(reader)
    assert [o for o, _ in got] == [entry_offset(i) for i in ids]  # none lost, none twice
    # The wake thread reconnected too: it wakes for an entry added after the kill.
    _wait(
        lambda: any(c["name"] == "streamrag-r-victim-wake" for c in admin.client_list()),
        10,
        "the wake thread to reconnect",
    )
    woke.clear()
    last = _add(admin, stream, 1, start=10)
    _wait(woke.is_set, 10, "a wake-up after the kill")
    assert [o for o, _ in _drain(reader)] == [entry_offset(last[0])]
    assert reader.health()["r"]["connected"] is True


def test_entries_whose_reply_was_lost_in_flight_are_read_from_the_pel_after_reconnecting(
    admin: redis.Redis,
    stream: str,
    readers: Callable[..., RedisSourceReader],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ManualClock(0)
    reader = readers(_source(stream, clock=clock))
    ids = _add(admin, stream, 3)
    got = _drain(reader)
    ids += _add(admin, stream, 4, start=3)
    client = reader._client
    real = client.xreadgroup

    def lost_reply(*args: Any, **kw: Any) -> Any:
        real(*args, **kw)  # the server delivers (into this consumer's PEL) ...
        monkeypatch.setattr(client, "xreadgroup", real)
        raise redis.ConnectionError("Connection closed by server.")  # ... the reply is lost

    monkeypatch.setattr(client, "xreadgroup", lost_reply)
    assert reader.poll(1 << 20) == []
    assert reader.health()["r"]["connected"] is False
    clock.advance_us(60_000_000)
    got += _drain(reader)
    assert [o for o, _ in got] == [entry_offset(i) for i in ids]  # none lost, none twice
    assert reader.health()["r"]["last_error"] == "ConnectionError: Connection closed by server."


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start (and restart) a password-protected redis-server of its own, with an AOF."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(tmp_path),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--requirepass",
                "hunter2-secret",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        probe = redis.Redis(port=port, password="hunter2-secret", socket_connect_timeout=0.5)
        _wait(lambda: _pings(probe), 10, "the private redis-server")
        probe.close()
        return proc

    start.port = port  # type: ignore[attr-defined]
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except RedisError:
        return False


def test_a_server_restart_backs_off_reconnects_and_keeps_the_password_secret(
    private_redis: Callable[[], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = private_redis.port  # type: ignore[attr-defined]
    server = private_redis()
    url = f"redis://127.0.0.1:{port}/0"
    writer = redis.Redis(port=port, password="hunter2-secret")
    monkeypatch.delenv("STREAMRAG_TEST_REDIS_PW", raising=False)
    with pytest.raises(ConfigError, match="STREAMRAG_TEST_REDIS_PW"):
        _source("s", url=url, password_env="STREAMRAG_TEST_REDIS_PW").build()
    monkeypatch.setenv("STREAMRAG_TEST_REDIS_PW", "hunter2-secret")
    clock = ManualClock(0)
    source = _source("s", url=url, password_env="STREAMRAG_TEST_REDIS_PW", clock=clock)
    reader = source.build()
    try:
        ids = _add(writer, "s", 3)
        got = _drain(reader)
        server.terminate()  # a clean shutdown: the AOF keeps the stream, group and PEL
        server.wait(10)
        writer.close()
        assert reader.poll(1 << 20) == []
        report = reader.health()["r"]
        assert report["connected"] is False
        assert report["failures"] >= 1
        assert report["last_error"]
        assert "hunter2-secret" not in json.dumps(report)
        failures = report["failures"]
        assert reader.poll(1 << 20) == []
        assert reader.health()["r"]["failures"] == failures
        clock.advance_us(60_000_000)  # the back-off ran out: it tries again, and fails again
        assert reader.poll(1 << 20) == []
        assert reader.health()["r"]["failures"] == failures + 1
        private_redis()
        writer = redis.Redis(port=port, password="hunter2-secret")
        ids += _add(writer, "s", 2, start=3)
        assert reader.poll(1 << 20) == [], "still backing off"
        clock.advance_us(60_000_000)
        got += _drain(reader)
        assert [o for o, _ in got] == [entry_offset(i) for i in ids]
        report = reader.health()["r"]
        assert report["connected"] is True
        assert report["retries"] == 0
        assert report["pending"] == 5
        reader.committed(reader.snapshot(), {})
        assert writer.xpending("s", "streamrag")["pending"] == 0
    finally:
        reader.close()
        writer.close()


def test_spec_is_frozen_picklable_and_built_from_settings() -> None:
    import pickle

    from streamrag.config import RedisSourceSettings

    settings = RedisSourceSettings(kind="redis", name="q", streams=["a", "b"], claim_idle_ms=5)
    spec = RedisSource.from_settings(settings)
    assert spec.streams == ("a", "b")
    assert spec.decoder == "q"
    assert spec.claim_idle_ms == 5
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert RedisSource.__doc__
    assert "XACK" in RedisSource.__doc__
    with pytest.raises(ConfigError, match="more than once"):
        RedisSource(name="q", streams=("a", "a"))
