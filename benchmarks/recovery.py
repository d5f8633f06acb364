"""Recovery time: from a restart to serving, and to caught up, over 100k indexed chunks.

    .venv/bin/python benchmarks/recovery.py            # part of `make bench`, ~2 minutes

A job (``streamrag run``, hashing embedder at 384 dims, so that the embedder is
not what is measured) first indexes 100,000 one-chunk documents from scratch:
the time a system without checkpoints needs on every restart. Then:

* **clean restart** — the job was stopped with SIGTERM (a final checkpoint);
  5,000 changes are appended; it is started again.
* **crash restart** — while it ingests 20,000 more changes it is killed with
  SIGKILL half-way; it is started again and resumes from the last commit's cursor
  (checkpoint + write-ahead log + the changes that were waiting).

For each restart: seconds from starting the process to the first answered
``/v1/retrieve`` (serving) and to ``/v1/status`` showing every change of the
input committed (caught up). The process start (Python and library imports) is
included: it is what an operator waits for.

Results: ``benchmarks/results/recovery.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from server import ServerProcess

HERE = Path(__file__).resolve().parent
T0 = 1_714_521_600  # 2024-05-01T00:00:00Z
WORDS = [f"w{i}" for i in range(5000)]
SETTINGS = {
    "embedder.class": "hashing",
    "embedder.args": {"dim": 384},
    "batcher.max_batch_size": 256,
    "batcher.max_delay_ms": 20,
}
STOP_TIMEOUT_S = 600.0  # a graceful stop may wait for a graph build to finish


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def append(path: Path, start: int, n: int, seed: int) -> None:
    """``n`` one-chunk upserts of new documents ``start .. start+n-1``."""
    rng = random.Random(seed)
    with path.open("a", encoding="utf-8") as fh:
        for i in range(start, start + n):
            text = " ".join(rng.choice(WORDS) for _ in range(40))
            fh.write(json.dumps({"doc_id": f"doc-{i}", "event_time": T0 + i, "text": text}) + "\n")


def start(tmp: Path, data: Path) -> ServerProcess:
    """``streamrag run`` over ``data`` with its state in ``tmp/state`` (kept across restarts)."""
    server = ServerProcess(tmp, data, SETTINGS)
    server.start()
    return server


def restart(tmp: Path, data: Path, total: int, client: httpx.Client) -> dict[str, Any]:
    server = start(tmp, data)
    serving = server.until_serving(client)
    first = server.status(client)
    caught_up = server.wait_caught_up(client, total, timeout=600)
    st = server.status(client)
    server.stop(timeout=STOP_TIMEOUT_S)
    return {
        "serving_s": serving,
        "caught_up_s": caught_up,
        "resumed_from_epoch": first["recovery"]["resumed_from_epoch"],
        "live_chunks_at_serving": first["index"]["live_chunks"],
        "changes_after_restart": total
        - first["recovery"]["ingested_before"]
        + first["recovery"]["waiting_at_resume"],
        "replayed_waiting": st["recovery"]["replayed"],
        "epoch": st["epoch"],
    }


def run(n: int, tmp: Path) -> dict[str, Any]:
    data = tmp / "changes.jsonl"
    append(data, 0, n, seed=1)
    client = httpx.Client(timeout=30)

    log(f"indexing {n:,} documents from scratch")
    server = start(tmp, data)
    build_serving = server.until_serving(client)
    build = server.wait_caught_up(client, n, timeout=1800)
    server.stop(timeout=STOP_TIMEOUT_S)

    log("clean restart with 5,000 new changes")
    append(data, n, 5_000, seed=2)
    clean = restart(tmp, data, n + 5_000, client)

    log("crash half-way through 20,000 new changes, then restart")
    total = n + 5_000 + 20_000
    append(data, n + 5_000, 20_000, seed=3)
    server = start(tmp, data)
    deadline = time.perf_counter() + 600
    while True:
        try:
            if server.status(client)["counts"]["applied"] >= n + 15_000:
                break
        except httpx.HTTPError:
            pass
        if time.perf_counter() > deadline:
            raise RuntimeError(f"no progress:\n{server.log_tail()}")
        time.sleep(0.01)
    assert server.proc is not None
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(60)
    wal = sum(p.stat().st_size for p in (tmp / "state" / "index").glob("wal-*.log"))
    crash = restart(tmp, data, total, client)
    crash["wal_bytes_at_restart"] = wal
    client.close()
    return {
        "n": n,
        "from_scratch": {"serving_s": build_serving, "caught_up_s": build},
        "clean": clean,
        "crash": crash,
    }


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    r = results["result"]
    rows = [
        ("from scratch (no checkpoint)", r["from_scratch"], f"{r['n']:,}"),
        ("clean restart", r["clean"], f"{r['clean']['changes_after_restart']:,}"),
        ("crash restart (SIGKILL)", r["crash"], f"{r['crash']['changes_after_restart']:,}"),
    ]
    lines = [
        "# streamrag recovery benchmark",
        "",
        f"Run {m['date_utc']} with `{results['command']}`.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; 1-min load average {m['loadavg_1m_at_start']} at start.",
        "",
        f"{r['n']:,} one-chunk documents indexed (hashing embedder, 384 dims). Seconds from "
        "starting `streamrag run` to the first answered `/v1/retrieve` and to every change "
        "of the input committed (process start and imports included).",
        "",
        "| restart | changes to ingest after it | to serving | to caught up |",
        "|---|---:|---:|---:|",
    ]
    for name, x, todo in rows:
        lines.append(f"| {name} | {todo} | {x['serving_s']:.2f} s | {x['caught_up_s']:.2f} s |")
    c = r["crash"]
    lines += [
        "",
        f"The crash restart resumed from epoch {c['resumed_from_epoch']} with "
        f"{c['live_chunks_at_serving']:,} chunks served at once; its write-ahead log held "
        f"{c['wal_bytes_at_restart'] / 2**20:.1f} MiB after the last checkpoint, and "
        f"{c['replayed_waiting']:,} changes that were waiting in the batcher were read again.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--name", default="recovery")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        results = {
            "command": "benchmarks/recovery.py " + " ".join(sys.argv[1:]),
            "machine": machine_info(),
            "result": run(args.n, Path(tmp)),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
