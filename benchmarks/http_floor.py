"""Where a served query's time goes: the HTTP floor, streamrag's own path, and the search.

    .venv/bin/python benchmarks/http_floor.py        # ~2 minutes

The same load generator (``loadgen.py``, its own process, closed loop) at 1
and 16 clients against three servers on this machine, in turn:

1. **bare uvicorn**: a plain ASGI app on the same uvicorn, uvloop and httptools
   that answers every request with a canned five-hit JSON body — the cost of
   HTTP itself and of the load generator;
2. **streamrag, 200 documents**: the whole request path (middleware, auth,
   validation, the query batcher's hop to a worker thread and back, embedding,
   encoding) over an index whose search costs next to nothing;
3. **streamrag, 20,000 documents**: the benchmark workload of ``run.py``, where
   each query also scans ~21,000 rows exactly.

The differences between the rows are what each layer costs. Results:
``benchmarks/results/http-floor.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from server import ServerProcess, free_port
from workload import WorkloadSpec, make_workload

HERE = Path(__file__).resolve().parent

_BARE_APP = """
import msgspec
HIT = {"chunk_id": "0" * 16, "doc_id": "doc-1", "tenant": "default", "domain": "d",
       "position": 0, "score": 0.5, "text": "w " * 300, "event_time": "2024-05-01T00:00:00Z",
       "source": "changes.jsonl", "offset": 1, "epoch": 1, "embedder": "e", "metadata": None}
BODY = msgspec.json.encode({"epoch": 1, "generation": 1, "took_ms": 0.01, "results": [HIT] * 5})
HEADERS = [(b"content-type", b"application/json")]

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load(url: str, queries: Path, concurrency: int, duration: float) -> dict[str, Any]:
    """One loadgen.py run."""
    cmd = [sys.executable, str(HERE / "loadgen.py"), "--url", url, "--queries", str(queries)]
    cmd += ["--concurrency", str(concurrency), "--duration", str(duration), "--warmup", "1"]
    cmd += ["-k", "5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def bare(work: Path, queries: Path, duration: float) -> list[dict[str, Any]]:
    """The plain ASGI app on uvicorn."""
    (work / "bare_app.py").write_text(_BARE_APP)
    port = free_port()
    uvicorn = Path(sys.executable).parent / "uvicorn"
    cmd = [str(uvicorn), "bare_app:app", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=2) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.post(f"{url}/v1/retrieve", json={"query": "x"})
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        return [load(url, queries, c, duration) for c in (1, 16)]
    finally:
        proc.terminate()
        proc.wait(15)


def streamrag(
    work: Path, source: Path, changes: int, queries: Path, duration: float
) -> list[dict[str, Any]]:
    """``streamrag run`` with the hashing embedder over ``source``, once caught up."""
    work.mkdir()
    settings = {
        "embedder.class": "hashing",
        "embedder.args": {"dim": 384},
        "batcher.max_delay_ms": 20,
        "batcher.max_batch_size": 256,
    }
    srv = ServerProcess(work, source, settings)
    srv.start()
    try:
        with httpx.Client(timeout=10) as client:
            srv.wait_caught_up(client, changes, timeout=300)
            if srv.wait_settled(client) is None:
                log("maintenance did not settle; measuring anyway")
        return [load(srv.url, queries, c, duration) for c in (1, 16)]
    finally:
        srv.stop()


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        "# Where a served query's time goes",
        "",
        f"Run {m['date_utc']} with `benchmarks/http_floor.py`; machine: {m['cpu_count']} cores, "
        f"{m['cpu_model']}; the load generator shares them. `/v1/retrieve` (k = 5), closed loop, "
        f"{res['duration_s']:.0f} s per point.",
        "",
        "| server | c=1 p50 / p99 ms | c=1 QPS | c=1 server took_ms p50 | c=16 QPS "
        "| c=16 p50 / p99 ms |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, label in (
        ("bare", "bare uvicorn app, canned answer"),
        ("tiny", "streamrag, 200 documents"),
        ("full", "streamrag, 20,000 documents (21,200 rows)"),
    ):
        one, sixteen = res[name]
        took = None if name == "bare" else one.get("server_took_p50_ms")
        lines.append(
            f"| {label} | {one['p50_ms']:.2f} / {one['p99_ms']:.2f} | {one['qps']:,.0f} | "
            f"{'-' if took is None else f'{took:.2f}'} | {sixteen['qps']:,.0f} | "
            f"{sixteen['p50_ms']:.1f} / {sixteen['p99_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    res: dict[str, Any] = {"machine": machine_info(), "duration_s": args.duration}
    tmp = Path(tempfile.mkdtemp(prefix="streamrag-floor-"))
    try:
        wl = make_workload(WorkloadSpec(n_docs=20_000))
        full = tmp / "changes.jsonl"
        wl.write(full)
        tiny = tmp / "tiny.jsonl"
        tiny.write_text("".join(c.to_json() + "\n" for c in wl.changes[:200]))
        queries = tmp / "queries.json"
        queries.write_text(json.dumps(wl.queries(1000, seed=11)))
        log("bare uvicorn")
        res["bare"] = bare(tmp, queries, args.duration)
        log("streamrag, 200 documents")
        res["tiny"] = streamrag(tmp / "tiny", tiny, 200, queries, args.duration)
        log("streamrag, 20,000 documents")
        res["full"] = streamrag(tmp / "full", full, len(wl.changes), queries, args.duration)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "http-floor.json").write_text(json.dumps(res, indent=1))
    (args.out / "http-floor.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
