"""A private PostgreSQL cluster for the logical-replication tests (one per test session).

The system server on 5432 runs with ``wal_level=replica``, so the tests start
their own: ``initdb`` into a temporary directory, ``wal_level=logical``, a free
port on 127.0.0.1, ``fsync`` off, trust authentication (also for replication
connections), and ``pg_ctl stop`` — then a SIGKILL by pid if that hangs — at the
end. ``initdb`` refuses to run as root, so as root the cluster runs as the
``postgres`` user (``runuser``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BIN = Path("/usr/local/bin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A running private cluster: ``dsn(dbname)`` and a few SQL helpers."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.user = "postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(root, "postgres", "postgres")
        self.pid: int | None = None

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run(
            str(BIN / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
                "fsync = off\nfull_page_writes = off\n"
                "wal_sender_timeout = 10s\nmax_connections = 100\n"
            )
        self._run(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (subprocess.SubprocessError, OSError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname}"

    def connect(self, dbname: str = "postgres") -> Any:
        import psycopg2  # type: ignore[import-untyped]

        conn = psycopg2.connect(self.dsn(dbname))
        conn.autocommit = True
        return conn

    def execute(self, sql: str, *args: Any, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        conn = self.connect(dbname)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args or None)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def create_db(self, name: str) -> str:
        """A fresh database; returns its DSN."""
        self.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_db(self, name: str) -> None:
        """Drop the database, its slots first (a slot keeps it in use)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                for (slot,) in self.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", name
                ):
                    self.execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND active_pid IS NOT NULL",
                        slot,
                    )
                    self.execute("SELECT pg_drop_replication_slot(%s)", slot)
                self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except Exception:
                time.sleep(0.1)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One private logical-replication cluster for the test session."""
    pytest.importorskip("psycopg2")
    if not (BIN / "initdb").exists():
        pytest.skip("no /usr/local/bin/initdb")
    root = Path(tempfile.mkdtemp(prefix="streamrag-pg-"))
    cluster = Cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
