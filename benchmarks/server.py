"""Start a ``streamrag run`` server as a subprocess on a free local port, and stop it."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "MAINTENANCE_THREAD",
    "ROLES",
    "ServerProcess",
    "children_cpu",
    "cores_during",
    "cpu_by_role",
    "free_port",
    "process_cpu",
    "wait_idle",
]

MAINTENANCE_THREAD = "streamrag-index-maintenance"

ROLES = (
    ("ingest", ("streamrag-read", "streamrag-commit", "streamrag-pipeline", "streamrag-watch")),
    ("maintenance", ("streamrag-index-maintenance",)),
    ("query workers", ("streamrag-query-",)),
    ("event loop", ("MainThread",)),
)
"""The server's threads by role (their name prefixes); the rest are "other threads"."""


def cpu_by_role(threads: dict[str, float]) -> dict[str, float]:
    """CPU seconds by thread, summed by the role of each thread (:data:`ROLES`)."""
    out: dict[str, float] = {}
    for thread, seconds in threads.items():
        role = next((r for r, names in ROLES if thread.startswith(names)), "other threads")
        out[role] = out.get(role, 0.0) + seconds
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used, its threads together."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def children_cpu() -> float:
    """CPU seconds of the child processes waited for so far (a load generator)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cores_during(
    server: ServerProcess, client: httpx.Client, run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``run()``'s result with ``cores``: what each role of the server used, and the children.

    Cores are CPU seconds over the wall time of ``run``; the load generator is
    the child processes this process waited for meanwhile.
    """
    cpu0, kids0, t0 = cpu_by_role(server.thread_cpu(client)), children_cpu(), time.perf_counter()
    result = run()
    cpu1 = cpu_by_role(server.thread_cpu(client))
    kids1, wall = children_cpu(), time.perf_counter() - t0
    cores = {role: (cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) / wall for role in cpu1}
    cores["load generator"] = (kids1 - kids0) / wall
    result["cores"] = cores
    return result


def wait_idle(cpu_seconds: Callable[[], float], timeout: float = 120) -> float | None:
    """Wait until a thread is idle; return the seconds waited (None: timed out).

    ``cpu_seconds`` reads the thread's CPU time so far. Idle: under 5 % of a
    core over the last second (for index maintenance: no merge, graph or copy
    is being built, so none is left to build).
    """
    started = time.perf_counter()
    prev = (started, cpu_seconds())
    while time.perf_counter() - started < timeout:
        time.sleep(0.2)
        now = time.perf_counter()
        if now - prev[0] < 1.0:
            continue
        cpu = cpu_seconds()
        if (cpu - prev[1]) / (now - prev[0]) < 0.05:
            return now - started
        prev = (now, cpu)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _streamrag_command() -> list[str]:
    exe = Path(sys.executable).parent / "streamrag"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "streamrag"]


class ServerProcess:
    """One ``streamrag run CONFIG --port N`` subprocess with its config in ``workdir``."""

    def __init__(self, workdir: Path, source: Path, settings: dict[str, Any]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config: dict[str, Any] = {
            "state_dir": str(workdir / "state"),
            "source": {"path": str(source)},
            "serve": {"host": "127.0.0.1"},
        }
        for dotted, value in settings.items():
            node = config
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        self.config_path = workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        """Launch the server (it ingests its source before it starts serving)."""
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        cmd = [*_streamrag_command(), "run", str(self.config_path), "--port", str(self.port)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.started_at = time.perf_counter()

    @property
    def pid(self) -> int:
        """Process id of the server."""
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 2000) -> str:
        """The end of the server's output."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def status(self, client: httpx.Client) -> dict[str, Any]:
        """``GET /v1/status``."""
        resp = client.get(f"{self.url}/v1/status")
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def until_serving(self, client: httpx.Client, timeout: float = 600) -> float:
        """Wait for the first answered ``/v1/retrieve``; return seconds since the start."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                msg = f"streamrag exited:\n{self.log_tail()}"
                raise RuntimeError(msg)
            try:
                r = client.post(f"{self.url}/v1/retrieve", json={"query": "w1 w2 w3", "k": 5})
                if r.status_code == 200:
                    return time.perf_counter() - self.started_at
            except httpx.TransportError:
                pass
            time.sleep(0.005)
        msg = f"not serving after {timeout:.0f} s:\n{self.log_tail()}"
        raise RuntimeError(msg)

    def wait_caught_up(self, client: httpx.Client, expect_ingested: int, timeout: float) -> float:
        """Wait until the server answers and has nothing pending; return seconds since start."""
        deadline = time.perf_counter() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                msg = f"server exited with {self.proc.returncode}:\n{self.log_tail()}"
                raise RuntimeError(msg)
            if time.perf_counter() > deadline:
                msg = f"server not caught up after {timeout:.0f} s:\n{self.log_tail()}"
                raise RuntimeError(msg)
            try:
                st = self.status(client)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if (
                st["counts"]["pending"] == 0
                and st["ingest_lag"]["backlog_bytes"] == 0
                and st["counts"]["ingested"] >= expect_ingested
            ):
                return time.perf_counter() - self.started_at
            time.sleep(0.02)

    def thread_cpu(self, client: httpx.Client) -> dict[str, float]:
        """The server's CPU seconds so far by thread (``streamrag_thread_cpu_seconds_total``)."""
        text = client.get(f"{self.url}/metrics").text
        return {
            sample.labels["thread"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "streamrag_thread_cpu_seconds"
            for sample in family.samples
        }

    def wait_settled(self, client: httpx.Client, timeout: float = 120) -> float | None:
        """Wait until index maintenance is idle (:func:`wait_idle`); the seconds waited."""
        return wait_idle(lambda: self.thread_cpu(client).get(MAINTENANCE_THREAD, 0.0), timeout)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the server (by pid), SIGKILL it after ``timeout`` s; return its exit code."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            return proc.wait(timeout=15)
