"""Helpers to run streamrag as a real process on 127.0.0.1 and wait for conditions."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def audit_records(state: Path) -> int:
    """Epochs the job has committed, as lines of its append-only audit log under ``state``.

    A commit proxy that only grows: the log of the index shrinks at each
    checkpoint, so its size may stay below an earlier reading across many commits.
    """
    path = state / "audit" / "epochs.jsonl"
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except httpx.TransportError:
            value = None
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


class Server:
    """A ``streamrag`` process and an HTTP client for it."""

    def __init__(self, args: list[str], port: int, cwd: Path, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        # The repository on the path: configs may name test embedders (tests.runtime...).
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=root)
        self._log = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamrag", *args],
            cwd=cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def wait_ready(self, timeout: float = 60) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"streamrag exited early:\n{self.log.read_text()}")
            return self.http.get("/healthz").status_code == 200

        wait_for(up, timeout, "the server to answer /healthz")

    def status(self) -> dict[str, Any]:
        return self.http.get("/v1/status").json()  # type: ignore[no-any-return]

    def retrieve(self, **body: Any) -> dict[str, Any]:
        r = self.http.post("/v1/retrieve", json=body)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def stop(self, sig: signal.Signals = signal.SIGINT) -> int:
        """Send Ctrl-C (SIGINT) or another signal and return the exit code."""
        self.http.close()
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        finally:
            self._log.close()
        return int(self.proc.returncode)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*args: str, port: int | None = None) -> Server:
        port = port or free_port()
        server = Server(
            [*args, "--port", str(port)], port, tmp_path, tmp_path / f"server-{len(started)}.log"
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
