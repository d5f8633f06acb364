"""The PostgreSQL CDC reader against a real private cluster (wal_level=logical).

Every test uses its own database, slot and publication. The reader's records are
applied by a plain model of the index's rule (per primary key, the change with
the greatest ``(event time, offset)`` wins; ``r``/``c``/``u`` upsert, ``d``
deletes) and compared with a ``SELECT`` of the table.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg2")

from streamrag.sources.base import AcknowledgesCommits, ReportsHealth, Wakes
from streamrag.sources.pgoutput import SNAP_BITS, SNAP_DONE, lsn_of
from streamrag.sources.postgres import PostgresReader, PostgresSource
from tests.sources.pg_cluster import Cluster, pg_cluster  # noqa: F401

pytestmark = pytest.mark.timeout(60)
_ids = itertools.count()

Rec = tuple[str, int, dict[str, Any]]  # partition, offset, envelope


@pytest.fixture
def db(pg_cluster: Cluster) -> Iterator[tuple[Cluster, str]]:  # noqa: F811
    name = f"t{time.monotonic_ns() % 10**9}_{next(_ids)}"
    pg_cluster.create_db(name)
    pg_cluster.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, n int, f float8, ok bool, "
        "at timestamptz)",
        dbname=name,
    )
    yield pg_cluster, name
    pg_cluster.drop_db(name)


def _spec(cluster: Cluster, name: str, **kw: Any) -> PostgresSource:
    kw.setdefault("status_interval_s", 0.2)
    return PostgresSource(
        name="pg", dsn=cluster.dsn(name), tables=("public.docs",), slot=f"s_{name}",
        publication=f"p_{name}", **kw,
    )  # fmt: skip


def _poll(reader: PostgresReader, until: Callable[[list[Rec]], bool], out: list[Rec]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for batch in reader.poll(1 << 20):
            assert batch.decoder == "pg"
            assert batch.offsets == sorted(set(batch.offsets))
            assert batch.end_offset > batch.offsets[-1]
            for line, off in zip(batch.lines, batch.offsets, strict=True):
                out.append((batch.source, off, json.loads(line)))
        if until(out):
            return
        time.sleep(0.005)
    pytest.fail(f"timed out; got {len(out)} records; health {reader.health()}")


def _model(records: list[Rec]) -> dict[int, str]:
    held: dict[int, tuple[tuple[int, int], dict[str, Any] | None]] = {}
    for _, off, env in records:
        row = env["after"] if env["op"] != "d" else env["before"]
        version = (env["source"]["ts_us"], off)
        key = row["id"]
        if key not in held or version > held[key][0]:
            held[key] = (version, None if env["op"] == "d" else env["after"])
    return {k: a["body"] for k, (_, a) in held.items() if a is not None}


def _table(cluster: Cluster, name: str) -> dict[int, str]:
    return {int(k): str(v) for k, v in cluster.execute("SELECT id, body FROM docs", dbname=name)}


def _slot_lsn(cluster: Cluster, name: str) -> int:
    (text,) = cluster.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        f"s_{name}",
    )[0]
    hi, _, lo = text.partition("/")
    return int(hi, 16) << 32 | int(lo, 16)


def test_snapshot_then_inserts_updates_deletes(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    cluster.execute(
        "INSERT INTO docs SELECT i, 'row ' || i, i, i / 2.0, i % 2 = 0, "
        "'2024-01-02 03:04:05+00' FROM generate_series(1, 25) i",
        dbname=name,
    )
    reader = _spec(cluster, name, snapshot_rows=7).build()
    assert isinstance(reader, AcknowledgesCommits | ReportsHealth | Wakes)
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: len(r) >= 25, got)
        snap = "postgres:pg:snapshot:public.docs"
        assert [p for p, _, _ in got] == [snap] * 25
        assert [o for _, o, _ in got] == list(range(25))  # generation 0, in key order
        first = got[0][2]
        assert first["op"] == "r"
        assert first["before"] is None
        at = "2024-01-02T03:04:05+00:00"
        row = {"id": 1, "body": "row 1", "n": 1, "f": 0.5, "ok": False, "at": at}
        assert first["after"] == row
        assert first["source"]["connector"] == "postgresql"
        assert first["source"]["table"] == "docs"
        assert first["source"]["schema"] == "public"
        cluster.execute("INSERT INTO docs (id, body) VALUES (100, 'new')", dbname=name)
        cluster.execute("UPDATE docs SET body = 'changed' WHERE id = 3", dbname=name)
        cluster.execute("DELETE FROM docs WHERE id = 4", dbname=name)
        _poll(reader, lambda r: len(r) >= 28, got)
        assert reader.snapshot()[snap] & SNAP_DONE == SNAP_DONE
        stream = got[25:]
        assert [e["op"] for _, _, e in stream] == ["c", "u", "d"]
        assert {p for p, _, _ in stream} == {"postgres:pg:wal"}
        assert stream[2][2]["before"] == {"id": 4}  # the replica-identity key
        offsets = [o for _, o, _ in stream]
        assert offsets == sorted(offsets)
        assert offsets[0] > reader.snapshot()[snap] >> 99
        # Event time is the commit time: after the snapshot's, and near now.
        assert stream[0][2]["source"]["ts_us"] > first["source"]["ts_us"]
        assert abs(stream[0][2]["source"]["ts_us"] / 1e6 - time.time()) < 30
        assert _model(got) == _table(cluster, name)
        health = reader.health()["pg"]
        assert health["connected"]
        assert health["phase"] == "streaming"
    finally:
        reader.close()


def test_primary_key_change_is_a_delete_and_a_create(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    cluster.execute("INSERT INTO docs (id, body) VALUES (1, 'one'), (2, 'two')", dbname=name)
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: len(r) >= 2, got)
        cluster.execute("UPDATE docs SET id = 10, body = 'ten' WHERE id = 1", dbname=name)
        _poll(reader, lambda r: len(r) >= 4, got)
        (_, o1, d), (_, o2, c) = got[2:]
        assert d["op"] == "d"
        assert d["before"] == {"id": 1}
        assert d["after"] is None
        assert c["op"] == "c"
        assert c["after"]["id"] == 10
        assert c["after"]["body"] == "ten"
        assert o2 == o1 + 1
        assert lsn_of(o1) == lsn_of(o2)
        assert _model(got) == _table(cluster, name) == {2: "two", 10: "ten"}
    finally:
        reader.close()


def test_an_update_that_leaves_a_large_text_alone_still_carries_it(
    db: tuple[Cluster, str],
) -> None:
    cluster, name = db
    rng = random.Random(1)
    big = "".join(rng.choice("abcdefghij klmnop") for _ in range(40_000))
    cluster.execute("INSERT INTO docs (id, body, n) VALUES (1, %s, 1)", big, dbname=name)
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: len(r) >= 1, got)
        cluster.execute("UPDATE docs SET n = 2 WHERE id = 1", dbname=name)  # body stays in TOAST
        _poll(reader, lambda r: len(r) >= 2, got)
        update = got[1][2]
        assert update["op"] == "u"
        assert update["after"]["n"] == 2
        assert update["after"]["body"] == big
    finally:
        reader.close()


def test_an_idle_reader_wakes_the_job_when_a_change_arrives(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    reader = _spec(cluster, name, status_interval_s=10.0).build()
    event = threading.Event()
    reader.wake_on(event)
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: reader.health()["pg"]["phase"] == "streaming", got)
        for _ in range(5):  # caught up: nothing left to read
            reader.poll(1 << 20)
        event.clear()
        assert not event.wait(0.3)  # idle: no wake-up without data (the safety tick is 5 s)
        cluster.execute("INSERT INTO docs (id, body) VALUES (1, 'one')", dbname=name)
        assert event.wait(0.5)
        _poll(reader, lambda r: len(r) >= 1, got)
    finally:
        reader.close()


def test_added_and_dropped_columns_and_a_recreated_table(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        cluster.execute("INSERT INTO docs (id, body) VALUES (1, 'one')", dbname=name)
        _poll(reader, lambda r: len(r) >= 1, got)
        cluster.execute("ALTER TABLE docs ADD COLUMN tag text", dbname=name)
        cluster.execute("INSERT INTO docs (id, body, tag) VALUES (2, 'two', 'x')", dbname=name)
        cluster.execute("ALTER TABLE docs DROP COLUMN n", dbname=name)
        cluster.execute("INSERT INTO docs (id, body) VALUES (3, 'three')", dbname=name)
        _poll(reader, lambda r: len(r) >= 3, got)
        assert got[1][2]["after"]["tag"] == "x"
        assert "n" in got[1][2]["after"]
        assert "n" not in got[2][2]["after"]
        assert "tag" in got[2][2]["after"]
        # Dropped and created again under its name: read again, then followed.
        cluster.execute("DROP TABLE docs", dbname=name)
        cluster.execute("CREATE TABLE docs (id int PRIMARY KEY, body text)", dbname=name)
        cluster.execute("INSERT INTO docs VALUES (7, 'seven'), (8, 'eight')", dbname=name)
        _poll(reader, lambda r: sum(e["op"] == "r" for _, _, e in r) >= 3, got)
        again = [o for _, o, e in got if e["op"] == "r"]
        # Row 1 came in the first snapshot (the reader connects at its first poll); the
        # new table is read in a second generation, past the first one's offsets.
        assert [o >> SNAP_BITS for o in again] == [0, 1, 1]
        cluster.execute("INSERT INTO docs VALUES (9, 'nine')", dbname=name)
        _poll(reader, lambda r: any(e["after"] and e["after"]["id"] == 9 for *_, e in r), got)
        warnings = reader.health()["pg"]["warnings"]
        assert any("created again" in w for w in warnings)
        model = _model(got)
        assert {k: model[k] for k in (7, 8, 9)} == _table(cluster, name)
    finally:
        reader.close()


def test_a_killed_walsender_is_survived_and_offsets_are_the_same_again(
    db: tuple[Cluster, str],
) -> None:
    cluster, name = db
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: reader.health()["pg"]["phase"] == "streaming", got)
        start = reader.snapshot()
        for i in range(5):
            cluster.execute("INSERT INTO docs (id, body) VALUES (%s, 'x')", i, dbname=name)
        _poll(reader, lambda r: len(r) >= 5, got)
        killed = cluster.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            f"s_{name}",
        )
        assert killed == [(True,)]
        for i in range(5, 10):
            cluster.execute("INSERT INTO docs (id, body) VALUES (%s, 'y')", i, dbname=name)
        _poll(reader, lambda r: len(r) >= 10, got)
        health = reader.health()["pg"]
        assert health["failures"] >= 1
        assert health["last_error"]
        assert health["connected"]
        assert sorted(e["after"]["id"] for *_, e in got) == list(range(10))  # none twice
    finally:
        reader.close()
    # A restart from the earlier position gets the same changes at the same offsets.
    again: list[Rec] = []
    second = _spec(cluster, name).build(start)
    try:
        _poll(second, lambda r: len(r) >= 10, again)
        assert [(p, o) for p, o, _ in again] == [(p, o) for p, o, _ in got]
    finally:
        second.close()


def test_a_resume_inside_a_transaction_returns_exactly_the_rest(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: reader.health()["pg"]["phase"] == "streaming", got)
        conn = cluster.connect(name)
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            for i in range(5):
                cur.execute("INSERT INTO docs (id, body) VALUES (%s, 'in one txn')", (i,))
            cur.execute("COMMIT")
        conn.close()
        cluster.execute("INSERT INTO docs (id, body) VALUES (9, 'after')", dbname=name)
        _poll(reader, lambda r: len(r) >= 6, got)
    finally:
        reader.close()
    offsets = [o for _, o, _ in got]
    assert len({lsn_of(o) for o in offsets[:5]}) == 1  # one transaction
    # As after a crash whose commit held the first two rows of the transaction (and
    # the finished snapshot):
    again: list[Rec] = []
    second = _spec(cluster, name).build({**reader.snapshot(), "postgres:pg:wal": offsets[2]})
    try:
        _poll(second, lambda r: len(r) >= 4, again)
        assert [o for _, o, _ in again] == offsets[2:]
        assert [e for *_, e in again] == [e for *_, e in got[2:]]
    finally:
        second.close()


def test_the_slot_is_confirmed_only_after_a_commit(db: tuple[Cluster, str]) -> None:
    cluster, name = db
    reader = _spec(cluster, name).build()
    got: list[Rec] = []
    try:
        _poll(reader, lambda r: reader.health()["pg"]["phase"] == "streaming", got)
        before = _slot_lsn(cluster, name)
        for i in range(4):
            cluster.execute("INSERT INTO docs (id, body) VALUES (%s, 'x')", i, dbname=name)
        _poll(reader, lambda r: len(r) >= 4, got)
        offsets = [o for _, o, _ in got]
        for _ in range(20):  # read on: keepalives and status updates go back and forth
            reader.poll(1 << 20)
            time.sleep(0.02)
        assert _slot_lsn(cluster, name) == before  # read is not committed
        wal = "postgres:pg:wal"
        # Committed up to the end, but the third change still waits in the batcher.
        reader.committed({wal: reader.snapshot()[wal]}, {wal: [offsets[2]]})
        _poll(reader, lambda r: _slot_lsn(cluster, name) != before, got)
        assert _slot_lsn(cluster, name) == lsn_of(offsets[2])
        reader.committed({wal: reader.snapshot()[wal]}, {})
        _poll(reader, lambda r: _slot_lsn(cluster, name) > lsn_of(offsets[3]), got)
        assert reader.health()["pg"]["lag"] is not None
    finally:
        reader.close()


def test_a_crash_during_the_snapshot_reads_the_rest_again_and_misses_no_delete(
    db: tuple[Cluster, str],
) -> None:
    cluster, name = db
    cluster.execute(
        "INSERT INTO docs (id, body) SELECT i, 'v1 ' || i FROM generate_series(1, 40) i",
        dbname=name,
    )
    first = _spec(cluster, name, snapshot_rows=10).build()
    got: list[Rec] = []
    _poll(first, lambda r: len(r) >= 20, got)
    committed = first.snapshot()  # as if a commit took these and the job then died
    first.close()
    snap = "postgres:pg:snapshot:public.docs"
    assert committed[snap] < SNAP_DONE
    # Meanwhile: rows the partial snapshot read are deleted and changed, more come.
    cluster.execute("DELETE FROM docs WHERE id IN (2, 5, 30)", dbname=name)
    cluster.execute("UPDATE docs SET body = 'v2' WHERE id IN (1, 35)", dbname=name)
    cluster.execute("INSERT INTO docs (id, body) VALUES (0, 'zero'), (99, 'new')", dbname=name)
    second = _spec(cluster, name, snapshot_rows=10).build(committed)
    try:
        _poll(second, lambda r: len(r) >= 20 + 39 + 5, got)  # snapshot again, then the stream
        later = got[20:]
        gens = {o >> SNAP_BITS for p, o, _ in later if p == snap}
        assert gens == {1}  # a new generation: offsets past what was committed
        ops = ["d", "d", "d", "u", "u", "c", "c"]
        assert [e["op"] for _, _, e in later[39:]] == ops[: len(later) - 39]
        _poll(second, lambda r: len(r) >= 20 + 39 + 7, got)
        assert _model(got) == _table(cluster, name)
        assert 2 not in _model(got)
    finally:
        second.close()


def test_a_table_without_a_primary_key_is_a_clear_status(pg_cluster: Cluster) -> None:  # noqa: F811
    name = f"nopk{time.monotonic_ns() % 10**9}"
    pg_cluster.create_db(name)
    try:
        pg_cluster.execute("CREATE TABLE docs (id int, body text)", dbname=name)
        reader = _spec(pg_cluster, name).build()
        assert reader.poll(1 << 20) == []  # no exception out of poll
        health = reader.health()["pg"]
        assert not health["connected"]
        assert "no primary key" in health["last_error"]
        assert reader.poll(1 << 20) == []  # the back-off runs: no second attempt yet
        assert reader.health()["pg"]["failures"] == 1
        reader.close()
    finally:
        pg_cluster.drop_db(name)


def test_a_password_never_reaches_the_status(pg_cluster: Cluster, monkeypatch: Any) -> None:  # noqa: F811
    monkeypatch.setenv("PG_TEST_SECRET", "hunter2")
    spec = PostgresSource(
        name="pg", dsn=f"host=127.0.0.1 port={pg_cluster.port} dbname=nope user=nobody",
        tables=("public.docs",), password_env="PG_TEST_SECRET",
    )  # fmt: skip
    reader = spec.build()
    assert reader.poll(1024) == []
    report = json.dumps(reader.health())
    assert "hunter2" not in report
    assert '"connected": false' in report
    reader.close()
