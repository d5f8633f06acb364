"""streamrag benchmarks: ingest throughput, freshness, retrieval latency, recall, memory.

Run with ``make bench`` (``.venv/bin/python benchmarks/run.py``); ``--quick`` is a
smaller smoke run. Results go to ``benchmarks/results/latest.json`` and
``latest.md``, next to a description of the machine. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from eventtime import embed_curve, window_count
from ingest import proc_status_kib
from server import ServerProcess
from serving import section_with_params
from workload import Change, Workload, WorkloadSpec, final_state, format_time, make_workload

from streamrag.config import BatcherSettings, SourceSettings

HERE = Path(__file__).resolve().parent
TLDR = Path("/work/shared/data/tldr-changes/events.late.jsonl.gz")
T0 = time.perf_counter()
DEFAULT_POLL_MS = SourceSettings().poll_interval_ms  # when the config does not set it


@dataclass(frozen=True)
class Params:
    """Sizes of one benchmark run."""

    n_docs: int = 20_000
    repeats: int = 3
    minilm_docs: int = 300
    minilm_repeats: int = 3
    probes: int = 100
    load_duration_s: float = 10.0
    load_warmup_s: float = 1.0
    concurrencies: tuple[int, ...] = (1, 16)
    recall_queries: int = 200
    k: int = 5
    max_delay_ms: int = 20
    fast_poll_ms: int = 5
    tldr_max_lines: int | None = None
    window_events: int = 2_000_000
    embed_curve_budget_s: float = 40.0
    serving_concurrencies: tuple[int, ...] = (1, 16, 64)
    serving_duration_s: float = 5.0
    serving_warmup_s: float = 1.0
    serving_raw_budget_s: float = 3.0

    @classmethod
    def quick(cls) -> Params:
        """The smoke-run sizes."""
        return cls(
            n_docs=2_000,
            repeats=1,
            minilm_docs=16,
            minilm_repeats=1,
            probes=20,
            load_duration_s=2.0,
            load_warmup_s=0.5,
            recall_queries=50,
            tldr_max_lines=3_000,
            window_events=200_000,
            embed_curve_budget_s=8.0,
            serving_duration_s=2.0,
            serving_warmup_s=0.5,
            serving_raw_budget_s=1.0,
        )


def log(section: str, msg: str) -> None:
    """Progress line on stderr."""
    print(f"[{time.perf_counter() - T0:6.1f}s] {section}: {msg}", file=sys.stderr, flush=True)


# -- machine -------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, RAM, versions and date of this run."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "ram_gib": ram_gib,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_1m_at_start": load1,
        "thread_env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
            if k in os.environ
        },
    }


# -- subprocess helpers --------------------------------------------------------


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run a helper script; its stderr passes through, its stdout's last line is JSON."""
    proc = subprocess.run(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=None, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        msg = f"{' '.join(cmd[:3])} … failed with exit code {proc.returncode}"
        raise RuntimeError(msg)
    lines = proc.stdout.decode().strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def ingest_bench(
    jsonl: Path,
    embedder: str,
    repeats: int,
    label: str,
    timeout: float,
    queries: Path | None = None,
    against: str | None = None,
) -> dict[str, Any]:
    """Embedder vs pipeline throughput, measured by benchmarks/ingest.py in its own process.

    ``against``: an index kind whose searches are compared with the default's in
    alternated rounds in that process (with ``queries``).
    """
    cmd = [sys.executable, str(HERE / "ingest.py"), "--jsonl", str(jsonl)]
    cmd += ["--embedder", embedder, "--repeats", str(repeats), "--label", label]
    if queries is not None:
        cmd += ["--queries", str(queries)]
    if against is not None:
        cmd += ["--against", against]
    return run_json(cmd, timeout)


# -- freshness -----------------------------------------------------------------


def probe_change(i: int, run_tag: str, when: datetime, wl: Workload, rng: random.Random) -> Change:
    """A new document with a word nobody else uses."""
    words = " ".join(rng.choice(wl.vocab[:2000]) for _ in range(20))
    return Change(
        doc_id=f"probe-{run_tag}-{i:05d}",
        op="upsert",
        event_time=format_time(when),
        text=f"zq{run_tag}probe{i:05d} {words}",
        domain="probe",
    )


def freshness(
    srv: ServerProcess,
    client: httpx.Client,
    source: Path,
    probes: list[Change],
    rng: random.Random,
    section: str,
    max_gap_s: float,
) -> dict[str, Any]:
    """Append each probe to the source and poll until retrieve returns it.

    Probes are spaced by a random gap of up to ``max_gap_s`` so that writes land
    at random phases of the pipeline's poll timer, as independent writers would.
    """
    url = f"{srv.url}/v1/retrieve"
    lat: list[float] = []
    polls: list[int] = []
    misses = 0
    with source.open("ab") as fh:
        for n, change in enumerate(probes):
            time.sleep(rng.uniform(0.0, max_gap_s))
            body = {
                "query": change.text.split(" ", 1)[0],
                "k": 1,
                "filters": {"doc_id": change.doc_id},
            }
            line = (change.to_json() + "\n").encode()
            t0 = time.perf_counter()
            fh.write(line)
            fh.flush()
            tries = 0
            while True:
                tries += 1
                resp = client.post(url, json=body)
                now = time.perf_counter()
                res = resp.json().get("results") or []
                if res and res[0]["doc_id"] == change.doc_id:
                    lat.append((now - t0) * 1000)
                    polls.append(tries)
                    break
                if now - t0 > 5.0:
                    misses += 1
                    break
                time.sleep(0.001)
            if (n + 1) % max(1, len(probes) // 5) == 0:
                log(section, f"{n + 1}/{len(probes)} probes, last {lat[-1] if lat else 0:.1f} ms")
    arr = np.asarray(lat)
    return {
        "probes": len(probes),
        "visible": int(arr.size),
        "misses_after_5s": misses,
        "p50_ms": float(np.percentile(arr, 50)) if arr.size else None,
        "p90_ms": float(np.percentile(arr, 90)) if arr.size else None,
        "p99_ms": float(np.percentile(arr, 99)) if arr.size else None,
        "max_ms": float(arr.max()) if arr.size else None,
        "mean_polls": float(np.mean(polls)) if polls else None,
    }


# -- recall --------------------------------------------------------------------


def recall_at_k(
    srv: ServerProcess, client: httpx.Client, changes: list[Change], queries: list[str], k: int
) -> dict[str, Any]:
    """Server top-k against exact brute force over the final live documents."""
    from streamrag.embed.hashing import HashingEmbedder

    live = final_state(changes)
    ids = list(live)
    emb = HashingEmbedder(384)
    docs = emb.embed_many([live[d].text.strip() for d in ids])
    qv = emb.embed_many(queries)
    scores = qv @ docs.T
    row_of = {d: i for i, d in enumerate(ids)}
    hits = 0
    exact_ids = 0
    max_score_diff = 0.0
    unknown = 0
    short = 0
    for qi, q in enumerate(queries):
        resp = client.post(f"{srv.url}/v1/retrieve", json={"query": q, "k": k})
        resp.raise_for_status()
        got = resp.json()["results"]
        ref = np.argpartition(-scores[qi], k - 1)[:k]
        kth = float(scores[qi, ref].min())
        ref_ids = {ids[j] for j in ref}
        if len(got) < k:
            short += 1
        got_ids = {r["doc_id"] for r in got[:k]}
        exact_ids += got_ids == ref_ids
        for r in got[:k]:
            row = row_of.get(r["doc_id"])
            if row is None:
                unknown += 1
                continue
            true = float(scores[qi, row])
            max_score_diff = max(max_score_diff, abs(true - float(r["score"])))
            if r["doc_id"] in ref_ids or true >= kth - 1e-6:
                hits += 1
    return {
        "queries": len(queries),
        "k": k,
        "live_docs_reference": len(ids),
        "recall": hits / (k * len(queries)),
        "identical_id_sets": exact_ids / len(queries),
        "results_not_live": unknown,
        "short_result_lists": short,
        "max_abs_score_diff": max_score_diff,
    }


# -- the server section --------------------------------------------------------


def loadgen(
    url: str,
    queries_file: Path,
    concurrency: int,
    p: Params,
    duration_s: float | None = None,
    warmup_s: float | None = None,
) -> dict[str, Any]:
    """Run benchmarks/loadgen.py against ``url`` as a separate process."""
    duration = p.load_duration_s if duration_s is None else duration_s
    warmup = p.load_warmup_s if warmup_s is None else warmup_s
    cmd = [sys.executable, str(HERE / "loadgen.py"), "--url", url, "--queries", str(queries_file)]
    cmd += ["--concurrency", str(concurrency), "--duration", str(duration)]
    cmd += ["--warmup", str(warmup), "-k", str(p.k)]
    return run_json(cmd, timeout=duration + warmup + 60)


def server_section(
    wl: Workload,
    pristine: Path,
    qfile: Path,
    work: Path,
    p: Params,
    poll_ms: int | None,
    full: bool,
) -> dict[str, Any]:
    """Start a server over the workload; freshness, and with ``full`` load and recall."""
    section = f"server(poll={poll_ms or 'default'})"
    work.mkdir()
    source = work / "changes.jsonl"
    shutil.copyfile(pristine, source)
    settings: dict[str, Any] = {
        "embedder.class": "hashing",
        "embedder.args": {"dim": 384},
        "batcher.max_delay_ms": p.max_delay_ms,
        "batcher.max_batch_size": 256,
    }
    if poll_ms is not None:
        settings["source.poll_interval_ms"] = poll_ms
    srv = ServerProcess(work, source, settings)
    out: dict[str, Any] = {"settings": settings, "port": srv.port}
    try:
        srv.start()
        log(section, f"started pid {srv.pid} on port {srv.port}; waiting for ingest")
        with httpx.Client(timeout=10.0) as client:
            ready = srv.wait_caught_up(client, len(wl.changes), timeout=300)
            st = srv.status(client)
            out["ready_s"] = ready
            out["status_at_ready"] = {"counts": st["counts"], "index": st["index"]}
            out["poll_interval_ms"] = poll_ms or DEFAULT_POLL_MS
            log(section, f"caught up after {ready:.1f} s: {st['index']['live_docs']} live docs")

            rng = random.Random(4242 if full else 4343)
            when = wl.last_event_time() + timedelta(hours=1)
            tag = "a" if full else "b"
            probes = [
                probe_change(i, tag, when + timedelta(seconds=i), wl, rng) for i in range(p.probes)
            ]
            gap_s = ((poll_ms or DEFAULT_POLL_MS) + p.max_delay_ms) / 1000
            out["freshness"] = freshness(srv, client, source, probes, rng, section, gap_s)
            f = out["freshness"]
            log(section, f"freshness p50 {f['p50_ms']:.1f} ms, p99 {f['p99_ms']:.1f} ms")
            if full:
                loads = []
                for c in p.concurrencies:
                    log(section, f"load at concurrency {c} for {p.load_duration_s:.0f} s")
                    r = loadgen(srv.url, qfile, c, p)
                    log(
                        section,
                        f"c={c}: {r['qps']:.0f} QPS, p50 {r.get('p50_ms', 0):.2f} ms, "
                        f"p99 {r.get('p99_ms', 0):.2f} ms, errors {r['errors']}",
                    )
                    loads.append(r)
                out["load"] = loads
                log(section, f"recall@{p.k} over {p.recall_queries} queries")
                out["recall"] = recall_at_k(
                    srv, client, wl.changes + probes, wl.queries(p.recall_queries, seed=99), p.k
                )
                log(section, f"recall@{p.k} = {out['recall']['recall']:.4f}")
            st = srv.status(client)
            out["status_at_end"] = {
                "counts": st["counts"],
                "index": st["index"],
                "pipeline": st["pipeline"],
            }
        mem = proc_status_kib(srv.pid)
        out["peak_rss_mib"] = mem.get("VmHWM", 0) / 1024
        out["rss_mib"] = mem.get("VmRSS", 0) / 1024
    finally:
        out["exit_code"] = srv.stop()
        log(section, f"stopped (exit code {out['exit_code']})")
    return out


# -- tldr ----------------------------------------------------------------------


def tldr_section(tmp: Path, p: Params) -> dict[str, Any] | None:
    """Hashing ingest over the real tldr change stream, if it is present."""
    if not TLDR.exists():
        log("tldr", f"{TLDR} not found; skipped")
        return None
    path = tmp / "tldr.jsonl"
    n = 0
    with gzip.open(TLDR, "rb") as src, path.open("wb") as dst:
        for line in src:
            if p.tldr_max_lines is not None and n >= p.tldr_max_lines:
                break
            dst.write(line)
            n += 1
    log("tldr", f"decompressed {n} lines; ingesting")
    return ingest_bench(path, "hashing", p.repeats, "tldr", timeout=300)


# -- report --------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table."""

    section: str
    metric: str
    value: float | None
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""

    def met(self) -> str:
        """``yes``/``NO`` with value/target, or empty without a target."""
        if self.target is None or self.value is None:
            return ""
        ratio = self.value / self.target if self.target else float("inf")
        ok = self.value >= self.target if self.higher_is_better else self.value <= self.target
        what = "target" if self.higher_is_better else "limit"
        return f"{'yes' if ok else '**NO**'} ({ratio:.2f}× {what})"

    def target_text(self) -> str:
        """``>= x`` or ``<= x``."""
        if self.target is None:
            return ""
        return f"{'≥' if self.higher_is_better else '≤'} {_fmt(self.target)}"


def windows_section(p: Params) -> dict[str, Any]:
    """Keyed sliding-window counts: many keys (per document) and few (per domain)."""
    return {
        "many_keys": window_count(n_events=p.window_events, n_keys=1_000, repeats=2),
        "few_keys": window_count(n_events=p.window_events, n_keys=20, repeats=2),
    }


def embed_curve_section(wl: Workload, embedder: str, p: Params) -> dict[str, Any]:
    """Embed latency and throughput by batch size, and the controller's chosen point."""
    from streamrag.embed.base import build_embedder

    emb = build_embedder(embedder, {})
    load = getattr(emb, "load", None)
    if callable(load):
        load()
    texts = [c.text for c in wl.changes if c.text][:2_000]
    target = BatcherSettings().target_embed_ms / 1000
    out = embed_curve(
        emb.embed_many, texts, target_latency_s=target, budget_s=p.embed_curve_budget_s
    )
    out["embedder"] = embedder
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


_CPU_ROLES = (
    ("pipeline_thread", "the pipeline's thread (read, commit)"),
    ("embedding_worker", "the embedding worker process"),
    ("maintenance", "index maintenance"),
    ("other_threads", "other threads"),
)
"""Where the cores went during the pipeline's replay (``benchmarks/ingest.py``)."""


def build_rows(res: dict[str, Any], p: Params) -> list[Row]:
    """The table, from the results."""
    rows: list[Row] = []
    for key, name, goal in (
        ("ingest_hashing", "hashing", 0.8),
        ("ingest_minilm", "MiniLM ONNX int8, the default", 0.9),
    ):
        r = res.get(key)
        if not r:
            continue
        sec = f"ingest ({name}, {r['changes']:,} changes)"
        rows += [
            Row(sec, "embedder alone, batches of 256", r["embedder_docs_per_s"], "docs/s"),
            Row(sec, "pipeline run_until_caught_up", r["pipeline_changes_per_s"], "changes/s"),
            Row(sec, "pipeline / embedder (time ratio)", r["ratio"], "×", goal),
            Row(sec, "same, median of paired repeats", r["ratio_paired_median"], "×"),
            Row(sec, "peak RSS of the ingest process", r["peak_rss_mib"], "MiB"),
        ]
        per_change = r.get("cpu_per_change_us", {})  # the fastest repeat's
        for role, label in _CPU_ROLES:
            if role in per_change:
                rows.append(Row(sec, f"CPU per change: {label}", per_change[role], "µs"))
        se = r.get("search")
        if se:
            sec = (
                f"in-process Service.retrieve_many, k={p.k} ({res['workload']['live_docs']:,} docs)"
            )
            rows += [
                Row(sec, "1 query per call, median", se["batch1_median_ms"], "ms"),
                Row(sec, "16 queries per call, median", se["batch16_median_ms"], "ms"),
                Row(sec, "16 per call: QPS upper bound", se["batch16_qps_bound"], "QPS"),
            ]
            ab = r.get("search_against") if key == "ingest_hashing" else None
            if ab:
                d, ex = ab["kinds"]["lsm"], ab["kinds"]["exact"]
                sec = (
                    f"default index against index.kind=exact, in-process, k={p.k}, "
                    f"{ab['rounds']} alternated rounds in one process"
                )
                rows += [
                    Row(sec, "default: 1 query per call, median", d["batch1_median_ms"], "ms"),
                    Row(sec, "exact: 1 query per call, median", ex["batch1_median_ms"], "ms"),
                    Row(sec, "default: 16 queries per call", d["batch16_median_ms"], "ms"),
                    Row(sec, "exact: 16 queries per call", ex["batch16_median_ms"], "ms"),
                    Row(
                        sec,
                        "exact time / default time, 1 query per call",
                        ex["batch1_median_ms"] / d["batch1_median_ms"],
                        "×",
                        1.0,
                    ),
                    Row(
                        sec,
                        "exact time / default time, 16 per call",
                        ex["batch16_median_ms"] / d["batch16_median_ms"],
                        "×",
                        1.0,
                    ),
                ]
    srv = res.get("server")
    if srv:
        sec = "server (hashing)"
        rows.append(Row(sec, "start + ingest until caught up", srv.get("ready_s"), "s"))
        for key in ("server", "server_fast_poll"):
            s = res.get(key)
            if not s or "freshness" not in s:
                continue
            f = s["freshness"]
            label = f"{s['poll_interval_ms']}{' (default)' if key == 'server' else ''}"
            sec = f"freshness (max_delay_ms={p.max_delay_ms}, poll_interval_ms={label})"
            limit = float(p.max_delay_ms + 10)
            rows += [
                Row(sec, "write → visible p50", f["p50_ms"], "ms"),
                Row(sec, "write → visible p99", f["p99_ms"], "ms", limit, False),
                Row(sec, "write → visible max", f["max_ms"], "ms"),
            ]
        for r in srv.get("load", []):
            c = r["concurrency"]
            sec = f"retrieve k={r['k']}, concurrency {c}"
            rows += [
                Row(sec, "throughput", r["qps"], "QPS", 1000.0 if c == 16 else None),
                Row(sec, "latency p50", r.get("p50_ms"), "ms", 2.0 if c == 1 else None, False),
                Row(sec, "latency p99", r.get("p99_ms"), "ms", 25.0 if c == 16 else None, False),
                Row(sec, "server-side took_ms p50", r.get("server_took_p50_ms"), "ms"),
                Row(sec, "server-side took_ms p99", r.get("server_took_p99_ms"), "ms"),
            ]
        rc = srv.get("recall")
        if rc:
            sec = f"recall@{rc['k']} vs numpy brute force ({rc['queries']} queries)"
            rows.append(Row(sec, "recall", rc["recall"], "", 1.0))
        rows.append(Row("memory", "server peak RSS (VmHWM)", srv.get("peak_rss_mib"), "MiB"))
    sv = res.get("serving_minilm")
    if sv:
        ceiling = sv["raw_ceiling_qps"]
        raw = sv["raw"]
        sec = (
            f"raw MiniLM embed_many + search_many ({raw['live_chunks']} chunks, "
            f"{sv['workers']} threads)"
        )
        for pt in raw["points"]:
            if pt["threads"] == sv["workers"]:
                rows.append(Row(sec, f"batches of {pt['batch']}", pt["qps"], "QPS"))
        rows.append(
            Row(
                sec,
                "1 thread, batches of 64",
                next(pt["qps"] for pt in raw["points"] if pt["threads"] == 1 and pt["batch"] == 64),
                "QPS",
            )
        )
        for mode, label in (("batching_on", "micro-batching on"), ("batching_off", "off")):
            m = sv["modes"].get(mode)
            if not m:
                continue
            for r in m["load"]:
                c = r["concurrency"]
                sec = f"retrieve over HTTP, MiniLM, {label}, concurrency {c}"
                target = 0.8 if mode == "batching_on" and c > 1 else None
                rows += [
                    Row(sec, "throughput", r["qps"], "QPS"),
                    Row(sec, "latency p50", r.get("p50_ms"), "ms"),
                    Row(sec, "latency p99", r.get("p99_ms"), "ms"),
                    Row(sec, "queries per embedding call (mean)", r.get("server_mean_batch"), ""),
                    Row(
                        sec,
                        f"QPS / raw ceiling ({ceiling:,.0f} QPS)",
                        r["ratio_to_raw"],
                        "×",
                        target,
                    ),
                ]
                own = r.get("raw_at_clients_batch_qps")
                if own and mode == "batching_on" and c > 1:
                    rows.append(
                        Row(
                            sec,
                            f"QPS / raw at {r['clients_batch']} a batch ({own:,.0f} QPS)",
                            r.get("ratio_to_raw_at_clients_batch"),
                            "×",
                        )
                    )
                cores = r.get("cores")
                if cores:
                    workers = cores.get("query workers")
                    rows.append(Row(sec, "cores used by query workers", workers, ""))
    t = res.get("tldr")
    if t:
        sec = f"tldr-changes events.late ({t['changes']:,} changes)"
        rows += [
            Row(sec, "embedder alone", t["embedder_docs_per_s"], "docs/s"),
            Row(sec, "pipeline", t["pipeline_changes_per_s"], "changes/s"),
            Row(sec, "pipeline / embedder (time ratio)", t["ratio"], "×", 0.8),
            Row(sec, "same, median of paired repeats", t["ratio_paired_median"], "×"),
            Row(
                sec, "chunks embedded by the pipeline", t["final"]["counts"]["chunks_embedded"], ""
            ),
        ]
    wres = res.get("windows")
    if wres:
        for key, label in (("many_keys", "1,000 keys"), ("few_keys", "20 keys")):
            w = wres[key]
            sec = f"keyed {w['window']} window count, {label} ({w['events']:,} events)"
            rows += [
                Row(
                    sec,
                    "streamrag operator (micro-batches + watermark)",
                    w["streamrag_events_per_s"],
                    "events/s",
                ),
                Row(sec, "numpy, one pass, same counts", w["numpy_events_per_s"], "events/s"),
                Row(sec, "operator / numpy (time ratio)", w["ratio"], "×"),
            ]
    ec = res.get("embed_curve")
    if ec:
        c = ec["controller"]
        target = c["target_latency_ms"]
        sec = f"embed by batch size ({ec['embedder']}); controller target {target:.0f} ms"
        for pt in ec["curve"]:
            mark = " ◀ controller" if pt["batch"] == c["batch"] else ""
            rows += [
                Row(sec, f"batch {pt['batch']}: latency{mark}", pt["latency_ms"], "ms"),
                Row(sec, f"batch {pt['batch']}: throughput", pt["items_per_s"], "texts/s"),
            ]
        rows += [
            Row(sec, f"controller's batch size (after {c['steps']} steps)", c["batch"], "texts"),
            Row(sec, "controller's point: latency", c["latency_ms"], "ms"),
            Row(sec, "controller's point: throughput", c["items_per_s"], "texts/s"),
        ]
    return rows


def render_md(res: dict[str, Any], rows: list[Row]) -> str:
    """The markdown report."""
    m = res["machine"]
    w = res["workload"]
    lines = [
        "# streamrag benchmark results",
        "",
        f"Run {m['date_utc']}{' (quick)' if res['quick'] else ''} in {res['elapsed_s']:.0f} s.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; "
        f"Python {m['python']}, numpy {m['numpy']}; {m['platform']}; "
        f"1-min load average {m['loadavg_1m_at_start']:.2f} at start, "
        f"{m.get('loadavg_1m_at_end', 0):.2f} at end (the machine is shared).",
        "",
        f"Workload: {w['n_docs']:,} synthetic documents of ~{w['words_per_doc']} words "
        f"(Zipf s={w['zipf_s']} over {w['vocab_size']:,} made-up words), {w['n_domains']} "
        f"domains, {w['changes']:,} changes ({w['updates']:,} updates, {w['deletes']:,} "
        f"deletes), {w['disorder']:.0%} of event times swapped locally, "
        f"{w['bytes'] / 1e6:.1f} MB JSONL, seed {w['seed']}.",
        "",
        "| section | metric | value | unit | target | met? |",
        "|---|---|---:|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.section} | {r.metric} | {_fmt(r.value)} | {r.unit} | {r.target_text()} "
            f"| {r.met()} |"
        )
    lines += [
        "",
        "Throughputs are the best of the repeats; the time ratio is embedder-alone time over "
        "pipeline time for the same texts. Freshness is measured from the append of one line to "
        "the first `/v1/retrieve` (filtered by its doc_id) that returns it.",
    ]
    if res.get("errors"):
        lines += ["", "Errors:", ""] + [f"- {e}" for e in res["errors"]]
    return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------


def _section(
    res: dict[str, Any], key: str, fn: Callable[[], dict[str, Any] | None], name: str
) -> None:
    started = time.perf_counter()
    log(name, "start")
    try:
        res[key] = fn()
    except Exception as exc:  # report what failed and go on with the other sections
        res.setdefault("errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
        log(name, f"FAILED: {type(exc).__name__}: {exc}")
    log(name, f"done in {time.perf_counter() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    """Run every section and write the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run (under a minute)")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    ap.add_argument("--no-minilm", action="store_true", help="skip the MiniLM section")
    a = ap.parse_args(argv)
    p = Params.quick() if a.quick else Params()
    res: dict[str, Any] = {"quick": a.quick, "machine": machine_info(), "params": asdict(p)}
    log("machine", json.dumps(res["machine"]))

    with tempfile.TemporaryDirectory(prefix="streamrag-bench-") as tmpdir:
        tmp = Path(tmpdir)
        spec = WorkloadSpec(n_docs=p.n_docs)
        log("workload", f"generating {spec.n_docs:,} documents")
        wl = make_workload(spec)
        pristine = tmp / "workload.jsonl"
        size = wl.write(pristine)
        res["workload"] = {
            **asdict(spec),
            "changes": len(wl.changes),
            "updates": int(spec.n_docs * spec.update_fraction),
            "deletes": int(spec.n_docs * spec.delete_fraction),
            "bytes": size,
            "live_docs": len(final_state(wl.changes)),
        }
        log("workload", f"{len(wl.changes):,} changes, {size / 1e6:.1f} MB")

        qfile = tmp / "queries.json"
        qfile.write_text(json.dumps(wl.queries(1000, seed=11)))
        _section(
            res,
            "ingest_hashing",
            lambda: ingest_bench(pristine, "hashing", p.repeats, "hashing", 300, qfile, "exact"),
            "ingest(hashing), searches against index.kind=exact",
        )
        if not a.no_minilm:
            subset = tmp / "minilm.jsonl"
            subset.write_text("".join(c.to_json() + "\n" for c in wl.changes[: p.minilm_docs]))
            _section(
                res,
                "ingest_minilm",
                # The default embedder: MiniLM through ONNX Runtime, int8.
                lambda: ingest_bench(
                    subset, "minilm-onnx", p.minilm_repeats, "minilm-onnx", timeout=600
                ),
                "ingest(minilm)",
            )
        _section(
            res,
            "server",
            lambda: server_section(wl, pristine, qfile, tmp / "srv-a", p, None, full=True),
            "server",
        )
        if p.fast_poll_ms != DEFAULT_POLL_MS:  # freshness again with a short poll interval
            _section(
                res,
                "server_fast_poll",
                lambda: server_section(
                    wl, pristine, qfile, tmp / "srv-b", p, p.fast_poll_ms, full=False
                ),
                "server(fast poll)",
            )
        if not a.no_minilm:
            _section(
                res,
                "serving_minilm",
                lambda: section_with_params(
                    tmp / "serving",
                    p,
                    a.out,
                    {"command": "benchmarks/run.py", "machine": res["machine"]},
                ),
                "serving(minilm)",
            )
        _section(res, "tldr", lambda: tldr_section(tmp, p), "tldr")
        _section(res, "windows", lambda: windows_section(p), "windows")
        _section(
            res,
            "embed_curve",
            lambda: embed_curve_section(wl, "hashing" if a.no_minilm else "minilm", p),
            "embed curve",
        )

    res["elapsed_s"] = time.perf_counter() - T0
    res["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    rows = build_rows(res, p)
    res["table"] = [{**asdict(r), "met": r.met()} for r in rows]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "latest.json").write_text(json.dumps(res, indent=2) + "\n")
    md = render_md(res, rows)
    (a.out / "latest.md").write_text(md)
    print(md)
    log("done", f"wrote {a.out / 'latest.json'} and latest.md in {res['elapsed_s']:.0f} s")
    return 1 if res.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
