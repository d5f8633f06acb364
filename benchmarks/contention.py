"""Queries while ingest runs: latency during an ingest burst against the same queries at rest.

    .venv/bin/python benchmarks/contention.py          # part of `make bench`, ~7 minutes

For the hashing embedder and for MiniLM (the default: ONNX Runtime, int8):
``streamrag run`` over a seed corpus;
once it has caught up and index maintenance has built the graphs and copies
of what it ingested, ``loadgen.py`` (its own process) sends random 3–6-word
queries from ``--concurrency`` closed-loop clients for ``--duration`` seconds —
at rest. Then a writer appends changes (2,000 a second for hashing, 150 for
MiniLM: several times what it embeds, so there ingest runs flat out) and the same
load runs again — during ingest — and once more at rest when the writer has
stopped and the job has caught up (and maintenance settled again). The index
grows during the burst, and a bigger index costs more per query, so the burst
is compared with the mean of the two rests around it. The figure is p99 during
ingest over p99 at rest (goal ≤ 1.5×; Qdrant and seekdb publish the same
comparison, seekdb claims 1.1×). The job's changes per second during the burst
are reported too: serving must not be bought by stopping ingest. Where the
cores went in each phase comes from the server's
``streamrag_thread_cpu_seconds_total`` (its threads by role) and the load
generator's own CPU time, in cores used over the phase.

With ``--ingest-apart`` the burst goes to a second server process over its
own copy of the seed corpus while the load goes to the first: ingest and
queries then share the cores but not an interpreter, which is what serving
from processes apart from the writer could gain at most (the queried index
does not grow meanwhile; the ingesting process's cores are reported too).

Results: ``benchmarks/results/contention.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from server import ROLES, ServerProcess, cores_during, process_cpu

HERE = Path(__file__).resolve().parent
T0 = 1_714_521_600
WORDS = [f"w{i}" for i in range(2000)]
EMBEDDERS: dict[str, dict[str, Any]] = {
    # The writer's rate: above what the job embeds for MiniLM (ingest runs flat out), and
    # a burst the job catches up with in about a minute once it stops.
    "hashing": {"seed_docs": 50_000, "rate": 2000, "settings": {"embedder.class": "hashing"}},
    # MiniLM as configured by default: ONNX Runtime, int8 (~2.2x PyTorch's ingest here).
    "minilm": {"seed_docs": 200, "rate": 150, "settings": {"embedder.class": "minilm-onnx"}},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _docs(path: Path, start: int, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("a", encoding="utf-8") as fh:
        for i in range(start, start + n):
            text = " ".join(rng.choice(WORDS) for _ in range(60))
            fh.write(json.dumps({"doc_id": f"doc-{i}", "event_time": T0 + i, "text": text}) + "\n")


def _writer(path: Path, stop: threading.Event, start: int, rate: int) -> None:
    """Append ``rate`` changes a second until told to stop."""
    i = start
    step = max(1, rate // 10)
    while not stop.is_set():
        _docs(path, i, step, seed=i)
        i += step
        stop.wait(0.1)


def _phase(
    client: httpx.Client,
    server: ServerProcess,
    queries: Path,
    concurrency: int,
    duration: float,
    apart: ServerProcess | None = None,
) -> dict[str, Any]:
    """One load run, with the cores each part of the server and the load generator used.

    ``apart``: a second server that ingests meanwhile; its process's cores are reported too.
    """
    cpu0, t0 = (process_cpu(apart.pid) if apart else 0.0), time.perf_counter()
    out = cores_during(server, client, lambda: _load(server.url, queries, concurrency, duration))
    if apart:
        out["cores"]["ingest process"] = (process_cpu(apart.pid) - cpu0) / (
            time.perf_counter() - t0
        )
    return out


def _load(url: str, queries: Path, concurrency: int, duration: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "loadgen.py"),
            "--url",
            url,
            "--queries",
            str(queries),
            "--concurrency",
            str(concurrency),
            "--duration",
            str(duration),
            "--warmup",
            "1",
            "-k",
            "5",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration + 120,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def case(
    tmp: Path,
    name: str,
    spec: dict[str, Any],
    concurrency: int,
    duration: float,
    extra: dict[str, Any] | None = None,
    apart: bool = False,
) -> dict[str, Any]:
    extra = extra or {}
    work = tmp / name
    work.mkdir()
    data = work / "changes.jsonl"
    seed = spec["seed_docs"]
    _docs(data, 0, seed, seed=1)
    rng = random.Random(2)
    qfile = work / "queries.json"
    qfile.write_text(
        json.dumps(
            [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 7))) for _ in range(500)]
        )
    )
    server = ServerProcess(work, data, {**spec["settings"], **extra, "stop_timeout_s": 2})
    # ``apart``: the burst goes to a second server over its own copy of the seed
    # corpus, so that ingest and queries share the cores but not an interpreter.
    ingester, ingest_data = server, data
    if apart:
        (work / "apart").mkdir()
        ingest_data = work / "apart" / "changes.jsonl"
        _docs(ingest_data, 0, seed, seed=1)
        ingester = ServerProcess(
            work / "apart", ingest_data, {**spec["settings"], **extra, "stop_timeout_s": 2}
        )
    servers = [server, ingester] if apart else [server]
    other = ingester if apart else None
    client = httpx.Client(timeout=60)
    try:
        for s in servers:
            s.start()
            s.wait_caught_up(client, seed, timeout=900)
        # At rest means maintenance too: the graphs and copies of the seed load built.
        waits = [s.wait_settled(client, timeout=300) for s in servers]
        settled = None if None in waits else max(w for w in waits if w is not None)
        log(f"{name}: at rest")
        rest = _phase(client, server, qfile, concurrency, duration, other)
        stop = threading.Event()
        writer = threading.Thread(
            target=_writer, args=(ingest_data, stop, seed, spec["rate"]), daemon=True
        )
        writer.start()
        time.sleep(3)  # ingest is under way
        before = ingester.status(client)["counts"]["applied"]
        started = time.perf_counter()
        log(f"{name}: during an ingest burst" + (" in another process" if apart else ""))
        busy = _phase(client, server, qfile, concurrency, duration, other)
        took = time.perf_counter() - started
        st = ingester.status(client)
        stop.set()
        writer.join()
        total = int(ingest_data.read_bytes().count(b"\n"))
        ingester.wait_caught_up(client, total, timeout=900)
        settled_after = ingester.wait_settled(client, timeout=300)
        log(f"{name}: at rest again")
        after = _phase(client, server, qfile, concurrency, duration, other)
    finally:
        client.close()
        for s in servers:
            s.stop(timeout=120)
    rest_p50 = (rest["p50_ms"] + after["p50_ms"]) / 2
    rest_p99 = (rest["p99_ms"] + after["p99_ms"]) / 2
    return {
        "embedder": spec["settings"]["embedder.class"],
        "ingest_apart": apart,
        "seed_docs": seed,
        "concurrency": concurrency,
        "at_rest": rest,
        "during_ingest": busy,
        "at_rest_after": after,
        "docs_after": total,
        "maintenance_settled_s": [settled, settled_after],
        "ingest_changes_per_s": (st["counts"]["applied"] - before) / took,
        "backlog_bytes_at_end": st["queues"]["source_backlog_bytes"],
        "p50_ratio": busy["p50_ms"] / rest_p50,
        "p99_ratio": busy["p99_ms"] / rest_p99,
    }


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# streamrag: queries during ingest",
        "",
        f"Run {m['date_utc']} with `{results['command']}`.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; 1-min load average {m['loadavg_1m_at_start']} at start. The load "
        "generator runs on the same cores.",
        "",
        "`/v1/retrieve` (k = 5, random 3–6-word queries) from closed-loop clients, at rest and "
        "while a writer appends changes far faster than the job embeds them.",
        "",
        "| embedder | clients | documents | at rest before: p50 / p99 | during ingest | at rest after | p99 during / at rest (goal ≤ 1.5×) | QPS before / during / after | ingest during the burst |",
        "|---|---:|---|---|---|---|---:|---|---:|",
    ]
    for name, r in results["cases"].items():
        a, b, c = r["at_rest"], r["during_ingest"], r["at_rest_after"]
        label = f"{name}, ingest in another process" if r.get("ingest_apart") else name
        lines.append(
            f"| {label} | {r['concurrency']} | {r['seed_docs']:,} → {r['docs_after']:,} | "
            f"{a['p50_ms']:.1f} / {a['p99_ms']:.1f} ms | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} ms | "
            f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f} ms | {r['p99_ratio']:.2f}× | "
            f"{a['qps']:.0f} / {b['qps']:.0f} / {c['qps']:.0f} | "
            f"{r['ingest_changes_per_s']:,.0f} changes/s |"
        )
    lines += [
        "",
        "Cores used in each phase (CPU seconds over the phase's wall time; the server's by "
        "thread, from `streamrag_thread_cpu_seconds_total`):",
        "",
        "| embedder | phase | "
        + " | ".join(r for r, _ in ROLES)
        + " | other threads | load generator | ingest process apart |",
        "|---|---|" + "---:|" * (len(ROLES) + 3),
    ]
    for name, r in results["cases"].items():
        for label, key in (
            ("at rest", "at_rest"),
            ("during ingest", "during_ingest"),
            ("at rest after", "at_rest_after"),
        ):
            cores = r[key].get("cores", {})
            cells = [f"{cores.get(role, 0.0):.2f}" for role, _ in ROLES]
            cells += [
                f"{cores.get('other threads', 0.0):.2f}",
                f"{cores.get('load generator', 0.0):.2f}",
                f"{cores['ingest process']:.2f}" if "ingest process" in cores else "—",
            ]
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--embedders", nargs="*", default=list(EMBEDDERS))
    ap.add_argument("--name", default="contention")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for the server (dotted key, YAML value), e.g. serve.switch_interval_ms=5",
    )
    ap.add_argument(
        "--ingest-apart",
        action="store_true",
        help="the burst goes to a second server process, queries to the first (what serving "
        "apart from the writer's interpreter could gain)",
    )
    args = ap.parse_args()
    extra = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    results: dict[str, Any] = {
        "command": "benchmarks/contention.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.embedders:
            results["cases"][name] = case(
                Path(tmp),
                name,
                EMBEDDERS[name],
                args.concurrency,
                args.duration,
                extra,
                args.ingest_apart,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
