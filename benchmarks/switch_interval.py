"""What a busy Python thread costs a request's hops between threads, by switch interval.

    .venv/bin/python benchmarks/switch_interval.py      # part of `make bench`, ~20 s

streamrag's queries share one interpreter lock with its ingest thread. A
request hops between threads — event loop → query worker → (a matrix product
that releases the lock) → back — and at every hop it must get the lock back.
Python hands the lock to a waiting thread only once per switch interval
(``sys.setswitchinterval``, 5 ms by default), so behind a busy writer each hop
may wait that long. This measures a request shaped like that (a hand-off to a
worker thread, some Python, a 20,000 × 384 matrix-vector product, a top-5, a
hand-off back) alone and beside a thread that runs Python without pause, for
several intervals; and how much of its work the busy thread still gets done.
``serve.switch_interval_ms`` sets the interval for the server.

Results: ``benchmarks/results/switch-interval.{json,md}``.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info

HERE = Path(__file__).resolve().parent
INTERVALS_MS = (5.0, 2.0, 1.0, 0.5)
V = np.random.default_rng(0).standard_normal((20_000, 384)).astype(np.float32)


def _busy(stop: threading.Event, done: list[int]) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i
        done[0] += 1


def _serve_one(inbox: queue.Queue[Any], outbox: queue.Queue[Any]) -> None:
    item = inbox.get()
    sum(range(2000))  # parsing, validation: Python under the lock
    scores = V @ item  # the lock is released during the product
    outbox.put(np.argpartition(-scores, 5)[:5].tolist())


def trial(interval_ms: float, writer: bool, requests: int) -> dict[str, float]:
    """Latency of ``requests`` requests, with or without the busy thread."""
    sys.setswitchinterval(interval_ms / 1000)
    stop = threading.Event()
    done = [0]
    busy = threading.Thread(target=_busy, args=(stop, done))
    vec = np.random.default_rng(1).standard_normal(384).astype(np.float32)
    lat = []
    started = time.perf_counter()
    if writer:
        busy.start()
    for _ in range(requests):
        inbox: queue.Queue[Any] = queue.Queue()
        outbox: queue.Queue[Any] = queue.Queue()
        worker = threading.Thread(target=_serve_one, args=(inbox, outbox))
        worker.start()
        t0 = time.perf_counter()
        inbox.put(vec)
        outbox.get()
        lat.append(time.perf_counter() - t0)
        worker.join()
    elapsed = time.perf_counter() - started
    stop.set()
    if writer:
        busy.join()
    ms = np.asarray(lat) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "writer_loops_per_s": done[0] / elapsed,
    }


def main() -> None:
    before = sys.getswitchinterval()
    out: dict[str, Any] = {"machine": machine_info(), "intervals": {}}
    try:
        for rnd in range(2):  # two rounds, intervals taking turns
            for ms in INTERVALS_MS:
                res = out["intervals"].setdefault(str(ms), {"alone": [], "busy": []})
                res["alone"].append(trial(ms, False, 300))
                res["busy"].append(trial(ms, True, 300))
                print(f"round {rnd + 1}: {ms} ms done", file=sys.stderr, flush=True)
    finally:
        sys.setswitchinterval(before)
    lines = [
        "# Request hops beside a busy Python thread, by switch interval",
        "",
        f"Run {out['machine']['date_utc']} with `benchmarks/switch_interval.py`; machine: "
        f"{out['machine']['cpu_count']} cores, {out['machine']['cpu_model']}. Medians of two "
        "rounds of 300 requests, the intervals taking turns.",
        "",
        "| switch interval | alone p50 / p99 | beside a busy thread p50 / p99 | busy thread's work (loops/s) |",
        "|---:|---|---|---:|",
    ]
    for ms, res in out["intervals"].items():

        def med(kind: str, key: str, r: dict[str, Any] = res) -> float:
            return float(np.median([x[key] for x in r[kind]]))

        lines.append(
            f"| {ms} ms | {med('alone', 'p50_ms'):.2f} / {med('alone', 'p99_ms'):.2f} ms | "
            f"{med('busy', 'p50_ms'):.2f} / {med('busy', 'p99_ms'):.2f} ms | "
            f"{med('busy', 'writer_loops_per_s'):,.0f} |"
        )
    text = "\n".join(lines) + "\n"
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "switch-interval.json").write_text(json.dumps(out, indent=1))
    (HERE / "results" / "switch-interval.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
