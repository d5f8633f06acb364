"""Closed-loop HTTP load generator for ``POST /v1/retrieve``, run as its own process.

``concurrency`` workers share one keep-alive connection pool; each sends a query,
waits for the answer and sends the next. Throughput counts the answers that
arrive within the measured window (after the warm-up, ``duration`` seconds
long), so that slow answers are not left out of it; latency is taken from the
requests that also started within the window. The result is one JSON object on
stdout::

    python benchmarks/loadgen.py --url http://127.0.0.1:8000 --queries q.json \
        --concurrency 16 --duration 10 --warmup 1 -k 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    queries: list[str],
    k: int,
    rng: random.Random,
    start_at: float,
    stop_at: float,
    lat: list[float],
    took: list[float],
    errors: list[str],
    completed: list[int],
) -> None:
    while True:
        t0 = time.perf_counter()
        if t0 >= stop_at:
            return
        body = {"query": rng.choice(queries), "k": k}
        try:
            async with session.post(url, json=body) as resp:
                data = await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        t1 = time.perf_counter()
        if t1 < start_at or t1 > stop_at:
            continue
        if not ok:
            errors.append(data[:200].decode("utf-8", "replace"))
            continue
        completed.append(1)
        if t0 >= start_at:
            lat.append(t1 - t0)
            took.append(float(json.loads(data)["took_ms"]))


async def run_load(
    url: str,
    queries: list[str],
    concurrency: int,
    duration: float,
    warmup: float,
    k: int,
    seed: int,
) -> dict[str, Any]:
    """Drive the server for ``warmup + duration`` seconds; return throughput and latency."""
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    lat: list[float] = []
    took: list[float] = []
    errors: list[str] = []
    completed: list[int] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        now = time.perf_counter()
        start_at, stop_at = now + warmup, now + warmup + duration
        await asyncio.gather(
            *(
                _worker(
                    session,
                    url,
                    queries,
                    k,
                    random.Random(seed + i),
                    start_at,
                    stop_at,
                    lat,
                    took,
                    errors,
                    completed,
                )
                for i in range(concurrency)
            )
        )
    arr = np.asarray(lat, dtype=np.float64) * 1000
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "duration_s": duration,
        "warmup_s": warmup,
        "k": k,
        "requests": len(completed),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "qps": len(completed) / duration,
    }
    if arr.size:
        out.update(
            p50_ms=float(np.percentile(arr, 50)),
            p90_ms=float(np.percentile(arr, 90)),
            p99_ms=float(np.percentile(arr, 99)),
            max_ms=float(arr.max()),
            mean_ms=float(arr.mean()),
            server_took_p50_ms=float(np.percentile(took, 50)),
            server_took_p99_ms=float(np.percentile(took, 99)),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the load, print the JSON result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--queries", type=Path, required=True, help="JSON file: a list of strings")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)
    if not a.url.startswith(("http://127.0.0.1", "http://localhost")):
        print("loadgen only targets 127.0.0.1", file=sys.stderr)
        return 2
    queries = json.loads(a.queries.read_text())
    result = asyncio.run(
        run_load(
            a.url.rstrip("/") + "/v1/retrieve",
            queries,
            a.concurrency,
            a.duration,
            a.warmup,
            a.k,
            a.seed,
        )
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
