"""Done-when for the PostgreSQL connector: a table and the index agree after SIGKILLs.

A private cluster (``wal_level=logical``) holds a table of tickets. A thread runs
an INSERT/UPDATE/DELETE workload on it (with primary-key changes and
multi-row transactions) while ``python -m streamrag run CFG`` streams it into
the index with the hashing embedder. The job is SIGKILLed at random moments —
the first time while it may still be reading the initial snapshot — and
restarted, and once the walsender is terminated from the server side. At the
end the job runs until the slot is confirmed past the last change (the
connector confirms only what a commit made durable), stops, and the index is
compared with a ``SELECT`` of the table: every row present with its latest text,
no deleted row present, no document twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("psycopg2")

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.runtime.cursor import Cursor
from streamrag.sources.pgoutput import SNAP_DONE
from tests.e2e.conftest import free_port
from tests.sources.pg_cluster import Cluster, pg_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
WORKLOAD_S = 45
PRELOAD = 3000


def _config(tmp: Path, cluster: Cluster, db: str) -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
sources:
  - kind: postgres
    name: pg
    dsn: "{cluster.dsn(db)}"
    tables: [public.tickets]
    slot: s_{db}
    publication: p_{db}
    status_interval_s: 0.2
    mapping: {{id: [id], text: [body]}}
embedder: {{class: hashing, args: {{dim: 64}}}}
batcher: {{max_batch_size: 64, max_delay_ms: 5, adaptive: false}}
index: {{checkpoint_every: 16, seal_rows: 1024}}
""",
        encoding="utf-8",
    )
    return cfg


def _start(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "streamrag", "run", str(cfg), "--port", str(free_port())],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


def _workload(cluster: Cluster, db: str, stop: threading.Event, seed: int) -> int:
    """Random changes until ``stop``; returns how many transactions committed."""
    rng = random.Random(seed)
    conn = cluster.connect(db)
    next_id = PRELOAD + 1
    txns = 0
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                roll = rng.random()
                text = f"rev {txns} " + " ".join(rng.choice(WORDS) for _ in range(6))
                some = rng.randrange(1, next_id)
                if roll < 0.3:
                    cur.execute("INSERT INTO tickets VALUES (%s, %s)", (next_id, text))
                    next_id += 1
                elif roll < 0.7:
                    cur.execute("UPDATE tickets SET body = %s WHERE id = %s", (text, some))
                elif roll < 0.85:
                    cur.execute("DELETE FROM tickets WHERE id = %s", (some,))
                elif roll < 0.92:  # a primary-key change
                    cur.execute(
                        "UPDATE tickets SET id = %s, body = %s WHERE id = %s",
                        (next_id, text, some),
                    )
                    next_id += 1
                else:  # several rows in one transaction
                    cur.execute("BEGIN")
                    for k in range(rng.randrange(2, 30)):
                        cur.execute(
                            "UPDATE tickets SET body = %s WHERE id = %s",
                            (f"{text} batch {k}", rng.randrange(1, next_id)),
                        )
                    cur.execute("DELETE FROM tickets WHERE id = %s", (rng.randrange(1, next_id),))
                    cur.execute("COMMIT")
                txns += 1
                time.sleep(rng.uniform(0, 0.01))
    finally:
        conn.close()
    return txns


def _wal_bytes(tmp: Path) -> int:
    total = 0
    for path in (tmp / "state" / "index").glob("wal-*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # a checkpoint removed it since the listing
            continue
    return total


def _snapshot_unfinished(tmp: Path) -> bool:
    """Whether the last commit holds a snapshot position that is not at its end."""
    settings = IndexSettings(checkpoint_every=16, seal_rows=1024)
    index = LsmIndex(64, lsm_spec(settings), path=tmp / "state" / "index")
    try:
        cursor = index.cursor
    finally:
        index.close()
    if cursor is None:
        return False
    at = Cursor.from_mapping(cursor).positions.get("postgres:pg:snapshot:public.tickets")
    return at is not None and at & SNAP_DONE != SNAP_DONE


def _confirmed(cluster: Cluster, db: str) -> int:
    rows = cluster.execute(
        "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        f"s_{db}",
    )
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def _kill_walsender(cluster: Cluster, db: str) -> bool:
    rows = cluster.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
        "WHERE slot_name = %s AND active_pid IS NOT NULL",
        f"s_{db}",
    )
    return bool(rows and rows[0][0])


@pytest.mark.timeout(240)
def test_sigkilled_cdc_job_ends_with_the_table(pg_cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    db = f"cdc{time.monotonic_ns() % 10**9}"
    pg_cluster.create_db(db)
    try:
        _run(pg_cluster, db, tmp_path)
    finally:
        pg_cluster.drop_db(db)


def _run(cluster: Cluster, db: str, tmp: Path) -> None:
    cluster.execute("CREATE TABLE tickets (id int PRIMARY KEY, body text NOT NULL)", dbname=db)
    cluster.execute(
        "INSERT INTO tickets SELECT i, 'first ' || i FROM generate_series(1, %s) i",
        PRELOAD,
        dbname=db,
    )
    cfg = _config(tmp, cluster, db)
    log = tmp / "job.log"
    rng = random.Random(7)
    stop = threading.Event()
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(_workload(cluster, db, stop, 3)))
    worker.start()
    kills = dropped = mid_snapshot = 0
    started = time.monotonic()
    proc: subprocess.Popen[bytes] | None = None
    try:
        while time.monotonic() - started < WORKLOAD_S or kills < 5:
            proc = _start(cfg, log)
            # Once the run has committed something (the first run: inside its snapshot,
            # which takes dozens of commits), kill it at a random moment.
            seen = _wal_bytes(tmp)
            limit = time.monotonic() + 60
            while _wal_bytes(tmp) == seen and time.monotonic() < limit:
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.01)
            life = rng.uniform(0.0, 0.2) if kills == 0 else rng.uniform(0.5, 5.0)
            deadline = time.monotonic() + life
            while time.monotonic() < deadline and proc.poll() is None:
                if kills == 2 and not dropped and time.monotonic() > deadline - life / 2:
                    dropped += _kill_walsender(cluster, db)
                time.sleep(0.01)
            assert proc.poll() is None, log.read_text()[-3000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            kills += 1
            if kills == 1:
                mid_snapshot = _snapshot_unfinished(tmp)
    finally:
        if proc is not None and proc.poll() is None:  # a check failed: end its job too
            proc.kill()
            proc.wait(30)
        stop.set()
        worker.join(30)
    assert kills >= 5
    assert done, "the workload thread failed"
    assert done[0] > 100, done
    assert dropped == 1
    assert mid_snapshot, "the first kill did not land inside the snapshot"

    # The last run: until a last change is confirmed, i.e. committed in the index.
    before = int(cluster.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")[0][0])
    cluster.execute("INSERT INTO tickets VALUES (-1, 'the last change')", dbname=db)
    proc = _start(cfg, log)
    try:
        limit = time.monotonic() + 90
        while _confirmed(cluster, db) <= before:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < limit, "the slot was never confirmed past the last change"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]

    truth = {
        f"tickets/{i}": body
        for i, body in cluster.execute("SELECT id, body FROM tickets", dbname=db)
    }
    settings = IndexSettings(checkpoint_every=16, seal_rows=1024)
    index = LsmIndex(64, lsm_spec(settings), path=tmp / "state" / "index")
    try:
        rows = index.export()
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids))
        docs: dict[str, str] = {}
        for hit, _ in rows:
            assert hit.doc_id not in docs  # one chunk per short document, none twice
            docs[hit.doc_id] = hit.text
        assert set(docs) - set(truth) == set()  # no deleted row back
        assert set(truth) - set(docs) == set()  # no row lost
        assert docs == truth  # each at its latest text
    finally:
        index.close()
