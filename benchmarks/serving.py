"""Serving with MiniLM: retrieval under load, micro-batching on and off, against the raw ceiling.

The query path's cost is the embedder: one MiniLM query takes 2.5-3 ms on a
core here through ONNX Runtime in int8 (the default embedder, ``minilm-onnx``;
13 ms through PyTorch, ``--embedder minilm``), a search over this index well
under a millisecond. Micro-batching exists to spend the per-call costs once for
many queries. This section measures

* the **raw batched throughput**: in its own process, nothing else running,
  ``Service.retrieve_many`` (one ``embed_many`` call and one batched search)
  over batches of 1, 8, 16, 32 and 64 queries, on one thread and on
  ``serve.query_workers`` threads at once; the best batch size on that many
  threads is the ceiling (8 is what 16 clients split over two workers make);
* the **server**: ``streamrag run`` with the same embedder over the bundled sample corpus,
  driven by ``loadgen.py`` (its own process, keep-alive connections, closed
  loop) at concurrency 1, 16 and 64, once with micro-batching on
  (``serve.max_batch`` 64, ``serve.max_wait_ms`` 2) and once off
  (``serve.max_batch`` 1: every query embedded and searched alone);

and reports QPS, p50/p99 latency and achieved QPS / raw QPS (goal ≥ 0.8), and
the cores the server's threads (by role) and the load generator used under
each load.
The two servers share one index directory: the second reopens what the first
built. ``python benchmarks/serving.py raw --config C --queries Q`` is the raw
measurement on its own (one JSON object on stdout); ``python benchmarks/serving.py
section [--embedder minilm]`` runs this whole section on its own.

Results: ``benchmarks/results/serving.{json,md}`` (``make bench`` writes them
too, and ``latest.json`` holds the same section).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml
from server import ServerProcess, cores_during

HERE = Path(__file__).resolve().parent
WORKERS = 2
EMBEDDERS: dict[str, dict[str, Any]] = {
    # One intra-op thread each: the query workers are the parallelism.
    "minilm-onnx": {"precision": "int8", "threads": 1},  # the default embedder
    "minilm": {"threads": 1},  # through PyTorch
}


def sample_corpus(dest: Path) -> tuple[Path, list[str]]:
    """The bundled sample corpus copied to ``dest``, and questions about its documents."""
    with resources.as_file(resources.files("streamrag") / "data" / "sample_changes.jsonl") as src:
        shutil.copyfile(src, dest)
    titles: list[str] = []
    for line in dest.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the corpus carries a few malformed lines on purpose
        title = rec.get("title") if isinstance(rec, dict) else None
        if title and title not in titles:
            titles.append(title)
    forms = ("{}", "how do I handle {}?", "what is the policy on {}?")
    queries = [f.format(t.lower() if i else t) for t in titles for i, f in enumerate(forms)]
    return dest, queries


def settings_for(state: Path, max_batch: int, embedder: str = "minilm-onnx") -> dict[str, Any]:
    """The server's settings (dotted keys)."""
    return {
        "embedder.class": embedder,
        "embedder.args": EMBEDDERS[embedder],
        "serve.query_workers": WORKERS,
        "serve.max_batch": max_batch,
        "serve.max_wait_ms": 2.0,
        "state_dir": str(state),
        "answer.cache.enabled": False,
    }


def raw_throughput(config: Path, queries: list[str], budget_s: float, k: int) -> dict[str, Any]:
    """Service.retrieve_many QPS by batch size, on one thread and on WORKERS threads."""
    from streamrag.config import load_settings
    from streamrag.index.base import SearchFilter
    from streamrag.runtime.service import Service

    service = Service(load_settings(config, environ={}))
    load = getattr(service.embedder, "load", None)
    if callable(load):
        load()
    service.pipeline.run_until_caught_up()  # reopens the index the servers built
    flt = SearchFilter()
    service.retrieve_many(queries[:8], k, flt)  # warm up

    def run(batch: int, threads: int) -> float:
        done = [0] * threads
        stop_at = time.perf_counter() + budget_s

        def loop(t: int) -> None:
            rng = random.Random(t)  # random queries, as the load generator sends them
            while time.perf_counter() < stop_at:
                service.retrieve_many(rng.choices(queries, k=batch), k, flt)
                done[t] += batch

        started = time.perf_counter()
        pool = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        return sum(done) / (time.perf_counter() - started)

    points = []
    for threads in (1, WORKERS):
        for batch in (1, 8, 16, 32, 64):
            qps = run(batch, threads)
            points.append({"batch": batch, "threads": threads, "qps": qps})
            print(f"raw: batch {batch}, {threads} thread(s): {qps:.0f} QPS", file=sys.stderr)
    best = max(points, key=lambda p: p["qps"])
    service.stop()
    return {
        "points": points,
        "best": best,
        "live_chunks": service.index.stats().live_chunks,
        "embedder": service.embedder.version,
    }


def serving_section(
    work: Path,
    *,
    concurrencies: tuple[int, ...],
    duration_s: float,
    warmup_s: float,
    raw_budget_s: float,
    k: int,
    loadgen: Callable[[str, Path, int], dict[str, Any]],
    log: Callable[[str, str], None],
    run_json: Callable[[list[str], float], dict[str, Any]],
    embedder: str = "minilm-onnx",
    out_dir: Path | None = None,
    head: dict[str, Any] | None = None,
    name: str = "serving",
) -> dict[str, Any]:
    """Both servers under load, then the raw ceiling; QPS ratios per concurrency.

    With ``out_dir`` (and ``head``: the command and machine), also writes
    ``<name>.{json,md}`` there (``serving``: what the goals table reads).
    """
    section = f"serving({embedder})"
    # The same environment as the raw measurement (run.py's helper processes).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work.mkdir()
    source, queries = sample_corpus(work / "changes.jsonl")
    qfile = work / "queries.json"
    qfile.write_text(json.dumps(queries))
    state = work / "state"
    out: dict[str, Any] = {
        "embedder": embedder,
        "embedder_args": EMBEDDERS[embedder],
        "queries": len(queries),
        "k": k,
        "workers": WORKERS,
        "modes": {},
    }
    for mode, max_batch in (("batching_on", 64), ("batching_off", 1)):
        (work / mode).mkdir()
        srv = ServerProcess(work / mode, source, settings_for(state, max_batch, embedder))
        loads = []
        ready = None
        try:
            srv.start()
            log(section, f"{mode}: started pid {srv.pid} on port {srv.port}; waiting for ingest")
            with httpx.Client(timeout=30.0) as client:
                ready = srv.wait_caught_up(client, 1, timeout=600)
                chunks = srv.status(client)["index"]["live_chunks"]
                log(section, f"{mode}: ready after {ready:.1f} s, {chunks} chunks")
                for c in concurrencies:
                    before = _batches(client, srv.url)
                    r = cores_during(srv, client, functools.partial(loadgen, srv.url, qfile, c))
                    after = _batches(client, srv.url)
                    n = after[1] - before[1]
                    r["server_batches"] = n
                    r["server_mean_batch"] = (after[0] - before[0]) / n if n else None
                    log(
                        section,
                        f"{mode} c={c}: {r['qps']:.0f} QPS, p50 {r.get('p50_ms', 0):.1f} ms, "
                        f"p99 {r.get('p99_ms', 0):.1f} ms, mean batch "
                        f"{r['server_mean_batch'] or 0:.1f}, errors {r['errors']}",
                    )
                    loads.append(r)
        finally:
            code = srv.stop()
        out["modes"][mode] = {"max_batch": max_batch, "ready_s": ready, "load": loads, "exit": code}
    log(section, "raw batched embedder + index throughput (own process)")
    raw_config = work / "raw.yaml"
    raw_config.write_text(
        yaml.safe_dump(_nested({"source.path": str(source), **settings_for(state, 64, embedder)}))
    )
    cmd = [sys.executable, str(HERE / "serving.py"), "raw", "--config", str(raw_config)]
    cmd += ["--queries", str(qfile), "--budget", str(raw_budget_s), "-k", str(k)]
    raw = run_json(cmd, 600)
    out["raw"] = raw
    # The ceiling: the same embedder and index called directly, in batches, on
    # as many threads as the server has query workers; the best batch size.
    ceiling = max(p["qps"] for p in raw["points"] if p["threads"] == WORKERS)
    out["raw_ceiling_qps"] = ceiling
    # What the clients' own batch size allows: c closed-loop clients over WORKERS
    # workers make batches of c / WORKERS at most, slower a query than the best size.
    at_batch = {p["batch"]: p["qps"] for p in raw["points"] if p["threads"] == WORKERS}
    for mode in out["modes"].values():
        for r in mode["load"]:
            r["ratio_to_raw"] = r["qps"] / ceiling if ceiling else None
            r["clients_batch"] = size = max(1, r["concurrency"] // WORKERS)
            own = at_batch.get(size)
            r["raw_at_clients_batch_qps"] = own
            r["ratio_to_raw_at_clients_batch"] = r["qps"] / own if own else None
    log(section, f"raw ceiling {ceiling:.0f} QPS (best batch size on {WORKERS} threads)")
    if out_dir is not None:
        write_results(out_dir, name, out, head or {})
    return out


def _batches(client: httpx.Client, url: str) -> tuple[float, float]:
    """The server's query batch-size histogram: (sum, count) so far."""
    total = count = 0.0
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("streamrag_query_batch_size_sum "):
            total = float(line.split()[1])
        elif line.startswith("streamrag_query_batch_size_count "):
            count = float(line.split()[1])
    return total, count


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def write_results(out_dir: Path, name: str, section: dict[str, Any], head: dict[str, Any]) -> None:
    """``<name>.json`` (``head`` — machine, date, command — and the section) and ``<name>.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps({**head, "serving": section}, indent=1))
    m = head["machine"]
    lines = [
        f"# Serving with {section['embedder']}: the server against the raw ceiling",
        "",
        f"Run {m['date_utc']} with `{head['command']}`; machine: {m.get('cpu_count')} cores, "
        f"{m.get('cpu_model')}, shared. The embedder: `{section['embedder']}` "
        f"{json.dumps(section['embedder_args'])}; {section['workers']} query workers; "
        f"k = {section['k']}; {section['raw']['live_chunks']} chunks.",
        "",
        "Raw `Service.retrieve_many` (its own process, nothing else running), QPS by batch size:",
        "",
        "| batch | 1 thread | " + f"{section['workers']} threads |",
        "|---:|---:|---:|",
    ]
    pts = {(pt["batch"], pt["threads"]): pt["qps"] for pt in section["raw"]["points"]}
    for b in sorted({b for b, _ in pts}):
        one, all_ = pts.get((b, 1), 0), pts.get((b, section["workers"]), 0)
        lines.append(f"| {b} | {one:,.0f} | {all_:,.0f} |")
    lines += [
        "",
        f"Ceiling (best batch on {section['workers']} threads): "
        f"{section['raw_ceiling_qps']:,.0f} queries/s.",
        "",
        "| micro-batching | clients | QPS | p50 ms | p99 ms | queries per call | "
        "QPS / ceiling | QPS / raw at the clients' batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, label in (("batching_on", "on"), ("batching_off", "off")):
        for r in section["modes"].get(mode, {}).get("load", []):
            at = r.get("ratio_to_raw_at_clients_batch")
            lines.append(
                f"| {label} | {r['concurrency']} | {r['qps']:,.0f} | {r.get('p50_ms', 0):.1f} | "
                f"{r.get('p99_ms', 0):.1f} | {r.get('server_mean_batch') or 0:.1f} | "
                f"{r['ratio_to_raw']:.3f} | {'' if at is None else f'{at:.3f}'} |"
            )
    (out_dir / f"{name}.md").write_text("\n".join(lines) + "\n")


def section_with_params(
    work: Path,
    p: Any,
    out_dir: Path,
    head: dict[str, Any],
    embedder: str = "minilm-onnx",
    name: str = "serving",
) -> dict[str, Any]:
    """:func:`serving_section` with run.py's load generator and parameters ``p`` (its Params)."""
    from run import loadgen, log, run_json

    return serving_section(
        work,
        concurrencies=p.serving_concurrencies,
        duration_s=p.serving_duration_s,
        warmup_s=p.serving_warmup_s,
        raw_budget_s=p.serving_raw_budget_s,
        k=p.k,
        loadgen=lambda url, q, c: loadgen(url, q, c, p, p.serving_duration_s, p.serving_warmup_s),
        log=log,
        run_json=run_json,
        embedder=embedder,
        out_dir=out_dir,
        head=head,
        name=name,
    )


def _section_alone(embedder: str, out_dir: Path, name: str, argv: list[str]) -> int:
    """This section on its own, with run.py's load generator and parameters."""
    import tempfile

    from run import Params, machine_info

    head = {"command": "benchmarks/serving.py " + " ".join(argv), "machine": machine_info()}
    with tempfile.TemporaryDirectory(prefix="streamrag-serving-") as tmp:
        section_with_params(Path(tmp) / "serving", Params(), out_dir, head, embedder, name)
    print((out_dir / f"{name}.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``raw``: the raw batched throughput as JSON on stdout; ``section``: the whole section."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    raw = sub.add_parser("raw")
    raw.add_argument("--config", type=Path, required=True)
    raw.add_argument("--queries", type=Path, required=True)
    raw.add_argument("--budget", type=float, default=3.0, help="seconds per point")
    raw.add_argument("-k", type=int, default=5)
    whole = sub.add_parser("section")
    whole.add_argument("--embedder", choices=sorted(EMBEDDERS), default="minilm-onnx")
    whole.add_argument("--name", default="serving")
    whole.add_argument("--out", type=Path, default=HERE / "results")
    a = p.parse_args(argv)
    if a.command == "section":
        return _section_alone(a.embedder, a.out, a.name, argv)
    queries = json.loads(a.queries.read_text())
    print(json.dumps(raw_throughput(a.config, queries, a.budget, a.k)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
