"""Freshness at scale: write → visible while 1,500 upserts a second stream into a 1M-row index.

    nice .venv/bin/python benchmarks/freshness_1m.py             # by hand, ~15 minutes
    .venv/bin/python benchmarks/freshness_1m.py --rows 100000    # a smaller one

Vespa and FreshDiskANN publish this class of figure: how soon a new document is
searchable while the index is large and a steady stream of writes keeps it busy.
A job (``streamrag run``, the hashing embedder at 384 dims, so that the model is
not what is measured, and the default index) first ingests ``--rows`` documents
of ``--words`` words and lets its maintenance finish sealing, compacting and
building the ANN structures of the big segments. Then a writer appends
``--rate`` upserts a second (updates of random existing documents and new
ones, in bursts every 100 ms) for ``--seconds``, and meanwhile probes — new
documents with a word nobody else uses — are appended at random moments. Each
probe's freshness is the time from its append to the first ``/v1/retrieve``
(filtered to its doc_id) that returns it. The job's own rate during the stream
is reported too: freshness bought by falling behind the writer would not count.
Before each probe one unfiltered query over the whole index is timed as well:
what a search costs in the index as the bulk load left it.

Results: ``benchmarks/results/freshness-1m.{json,md}`` (``--name``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from server import ServerProcess

HERE = Path(__file__).resolve().parent
T0 = 1_714_521_600
WORDS = [f"w{i}" for i in range(5000)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _line(doc: str, t: int, rng: random.Random, words: int) -> str:
    text = " ".join(rng.choices(WORDS, k=words))
    return json.dumps({"doc_id": doc, "event_time": T0 + t, "text": text}) + "\n"


def seed(path: Path, rows: int, words: int) -> None:
    rng = random.Random(1)
    with path.open("w", encoding="utf-8") as fh:
        for lo in range(0, rows, 10_000):
            fh.write(
                "".join(_line(f"d{i}", i, rng, words) for i in range(lo, min(rows, lo + 10_000)))
            )


class Writer:
    """Appends ``rate`` upserts a second in bursts every 100 ms; ``lock`` guards the file."""

    def __init__(self, path: Path, rows: int, rate: int, words: int) -> None:
        self.path = path
        self.rows = rows
        self.rate = rate
        self.words = words
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.written = 0
        self.t = rows

    def run(self) -> None:
        rng = random.Random(2)
        started = time.perf_counter()
        with self.path.open("a", encoding="utf-8") as fh:
            while not self.stop.is_set():
                due = int((time.perf_counter() - started) * self.rate) - self.written
                if due > 0:
                    lines = []
                    for _ in range(due):
                        self.t += 1
                        # Half updates of existing documents, half new ones.
                        doc = f"d{rng.randrange(self.rows)}" if rng.random() < 0.5 else f"n{self.t}"
                        lines.append(_line(doc, self.t, rng, self.words))
                    with self.lock:
                        fh.write("".join(lines))
                        fh.flush()
                    self.written += due
                self.stop.wait(0.1)

    def probe(self, i: int) -> tuple[str, str, float]:
        """Append probe ``i``; return its doc_id, its word and the time it was appended."""
        doc, word = f"probe-{i}", f"zq{i}x"
        with self.lock:
            self.t += 1
            with self.path.open("a", encoding="utf-8") as fh:
                line = json.dumps({"doc_id": doc, "event_time": T0 + self.t, "text": word}) + "\n"
                t0 = time.perf_counter()
                fh.write(line)
        return doc, word, t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="streamrag-fresh1m-") as tmpdir:
        tmp = Path(tmpdir)
        data = tmp / "changes.jsonl"
        log(f"writing {args.rows:,} documents")
        seed(data, args.rows, args.words)
        server = ServerProcess(tmp, data, {"embedder.class": "hashing", "stop_timeout_s": 5})
        client = httpx.Client(timeout=60)
        try:
            server.start()
            ready = server.wait_caught_up(client, args.rows, timeout=args.timeout)
            log(f"caught up with {args.rows:,} in {ready:.0f} s; waiting for maintenance")
            settled = _wait_maintenance(server, client, args.timeout)
            health = server.status(client)["index"]
            health["metrics"] = _index_gauges(server, client)
            writer = Writer(data, args.rows, args.rate, args.words)
            thread = threading.Thread(target=writer.run, daemon=True)
            before = server.status(client)["counts"]["applied"]
            started = time.perf_counter()
            thread.start()
            lat: list[float] = []
            whole: list[float] = []  # unfiltered queries over the whole index, meanwhile
            misses = 0
            rng = random.Random(3)
            url = f"{server.url}/v1/retrieve"
            i = 0
            while time.perf_counter() - started < args.seconds:
                time.sleep(rng.expovariate(args.probe_rate))
                q0 = time.perf_counter()
                words = f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
                client.post(url, json={"query": words, "k": 5})
                whole.append((time.perf_counter() - q0) * 1000)
                doc, word, t0 = writer.probe(i)
                i += 1
                body = {"query": word, "k": 1, "filters": {"doc_id": doc}}
                while True:
                    res = client.post(url, json=body).json().get("results") or []
                    now = time.perf_counter()
                    if res and res[0]["doc_id"] == doc:
                        lat.append((now - t0) * 1000)
                        break
                    if now - t0 > 10:
                        misses += 1
                        break
                    time.sleep(0.002)
            took = time.perf_counter() - started
            writer.stop.set()
            thread.join()
            st = server.status(client)
            applied = st["counts"]["applied"] - before
        finally:
            client.close()
            server.stop(timeout=120)
    arr = np.asarray(lat)
    wq = np.asarray(whole)
    return {
        "whole_index_query_p50_ms": float(np.percentile(wq, 50)),
        "whole_index_query_p99_ms": float(np.percentile(wq, 99)),
        "rows": args.rows,
        "words": args.words,
        "rate": args.rate,
        "seconds": took,
        "ready_s": ready,
        "maintenance_settled_s": settled,
        "index_before_stream": health,
        "written_per_s": writer.written / took,
        "applied_per_s": applied / took,
        "backlog_bytes_at_end": st["queues"]["source_backlog_bytes"],
        "probes": i,
        "misses_after_10s": misses,
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
        "max_ms": float(arr.max()),
    }


def _index_gauges(server: ServerProcess, client: httpx.Client) -> dict[str, float]:
    """The index gauges of ``/metrics`` (segments, ANN segments, bytes, ...)."""
    out: dict[str, float] = {}
    for line in client.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("streamrag_index_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _wait_maintenance(server: ServerProcess, client: httpx.Client, timeout: float) -> float:
    """Wait until the index's segment gauges hold still for 10 s.

    That is not the end of maintenance: a compaction that builds a large graph
    runs for minutes without changing a gauge. The report says how many
    segments and ANN structures the index had when the stream started.
    """
    started = time.perf_counter()
    last: dict[str, float] | None = None
    since = time.perf_counter()
    while time.perf_counter() - started < timeout:
        seen = {
            name: value
            for name, value in _index_gauges(server, client).items()
            if name.startswith(("streamrag_index_segments", "streamrag_index_ann"))
        }
        if seen != last:
            last, since = seen, time.perf_counter()
        elif time.perf_counter() - since > 10:
            break
        time.sleep(0.5)
    return time.perf_counter() - started


def markdown(res: dict[str, Any]) -> str:
    m, r = res["machine"], res["result"]
    gauges = r["index_before_stream"].get("metrics", {})
    return (
        "# streamrag: freshness while upserts stream into a large index\n\n"
        f"Run {m['date_utc']} with `{res['command']}`.\n\n"
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; 1-min load average {m['loadavg_1m_at_start']} at start. The writer "
        "and the prober run on the same cores.\n\n"
        f"{r['rows']:,} documents of {r['words']} words ingested (in {r['ready_s']:.0f} s; "
        f"the segment gauges held still for 10 s {r['maintenance_settled_s']:.0f} s later, with "
        f"{gauges.get('streamrag_index_segments', 0):.0f} segments, "
        f"{gauges.get('streamrag_index_ann_segments', 0):.0f} of them with an ANN structure, "
        f"{gauges.get('streamrag_index_compactions', 0):.0f} compactions done), then "
        f"{r['written_per_s']:,.0f} upserts/s appended for {r['seconds']:.0f} s (half updates, "
        f"half new documents); the job applied {r['applied_per_s']:,.0f} changes/s meanwhile "
        f"(backlog at the end: {r['backlog_bytes_at_end']:,} bytes).\n\n"
        "| probes | write → visible p50 | p90 | p99 (goal ≤ 250 ms) | max | missed (10 s) |\n"
        "|---:|---:|---:|---:|---:|---:|\n"
        f"| {r['probes']} | {r['p50_ms']:.1f} ms | {r['p90_ms']:.1f} ms | {r['p99_ms']:.1f} ms | "
        f"{r['max_ms']:.1f} ms | {r['misses_after_10s']} |\n"
        + (
            f"\nMeanwhile, before each probe, one unfiltered query (k = 5, two random words) "
            f"over the whole index: p50 {r['whole_index_query_p50_ms']:.1f} ms, p99 "
            f"{r['whole_index_query_p99_ms']:.1f} ms.\n"
            if "whole_index_query_p50_ms" in r
            else ""
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--words", type=int, default=30)
    ap.add_argument("--rate", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--probe-rate", type=float, default=4.0, help="probes a second (Poisson)")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--name", default="freshness-1m")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    res = {
        "command": "benchmarks/freshness_1m.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "result": run(args),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(res, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
