"""History: what full history costs, whether it is right, and whether long histories stay fast.

    .venv/bin/python benchmarks/history.py            # part of `make bench`, a few minutes

Three sections, all with the hashing embedder (384 dims), so the embedder is not
what is measured:

* **decade vs one day** — a 10-year history with one change a day per document
  (``--docs`` documents × 3,650 days), and the same rows with their event times
  squeezed into one day. Each is ingested by ``streamrag run``, stopped
  (SIGTERM) and started again: seconds from the process start to the first
  answered ``/v1/retrieve`` (the restart of an idle index), the files in its
  index folder, then ``/v1/retrieve`` latency over HTTP from one client, for the
  current documents and ``as_of`` a random time of the history. The ratio
  decade / one day is what the time span costs (goal ≤ 1.5×; goal restart ≤ 2 s).
* **full history vs current only** — a stream with frequent edits (each
  document edited ``--edits`` times, edits of a document close together, so
  micro-batches carry several versions of it), replayed in-process with
  ``index.history: full`` and ``current``, alternating, 3 repeats: changes per
  second and chunks embedded (what an embedding model would be asked for).
* **tldr-changes** — if ``/work/shared/data/tldr-changes`` exists: the real
  19,991-change stream with bounded lateness (``events.late``), replayed with
  full history and with current only; then ``as_of`` at the midpoint of every
  version interval of its ground truth (``versions.jsonl``), counted wrong when
  the version returned is not the one in force (or a deleted document is found).

Results: ``benchmarks/results/history.{json,md}``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from server import ServerProcess

from streamrag.config import load_settings
from streamrag.index.base import SearchFilter
from streamrag.runtime.replay import replay

HERE = Path(__file__).resolve().parent
TLDR = Path("/work/shared/data/tldr-changes")
DAY_S = 86_400
T0 = 1_420_070_400  # 2015-01-01T00:00:00Z
YEARS = 10
WORDS = [f"w{i}" for i in range(3000)]
SETTINGS: dict[str, Any] = {
    "embedder.class": "hashing",
    "embedder.args": {"dim": 384},
    "batcher.max_batch_size": 256,
    "batcher.max_delay_ms": 20,
    "index.retention_s": 12 * 365 * DAY_S,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# -- decade vs one day ---------------------------------------------------------


def history_stream(path: Path, docs: int, squeeze: bool, seed: int = 1) -> tuple[int, int]:
    """One change a day per document for ten years; returns (changes, span in seconds).

    With ``squeeze`` the same changes get event times within one day, in the same order.
    """
    rng = random.Random(seed)
    days = YEARS * 365
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for day in range(days):
            for d in range(docs):
                at = day * DAY_S + d * 60
                if squeeze:
                    at = (day * docs + d) * DAY_S // (days * docs)
                text = " ".join(rng.choice(WORDS) for _ in range(30))
                rec = {"doc_id": f"doc-{d}", "event_time": T0 + at, "text": f"day {day}: {text}"}
                fh.write(json.dumps(rec) + "\n")
                n += 1
    return n, (days * DAY_S if not squeeze else DAY_S)


def latencies(
    client: httpx.Client, url: str, n: int, span_s: int, as_of: bool, seed: int
) -> dict[str, float]:
    rng = random.Random(seed)
    took: list[float] = []
    server_ms: list[float] = []
    for i in range(n + 20):
        body: dict[str, Any] = {"query": " ".join(rng.choice(WORDS) for _ in range(4)), "k": 5}
        if as_of:
            body["as_of"] = T0 + rng.randrange(span_s)
        t = time.perf_counter()
        r = client.post(f"{url}/v1/retrieve", json=body)
        dt = (time.perf_counter() - t) * 1000
        r.raise_for_status()
        if i >= 20:  # warm-up
            took.append(dt)
            server_ms.append(r.json()["took_ms"])
    return {
        "p50_ms": pct(took, 50),
        "p99_ms": pct(took, 99),
        "server_p50_ms": pct(server_ms, 50),
        "server_p99_ms": pct(server_ms, 99),
    }


def decade_case(tmp: Path, docs: int, squeeze: bool, queries: int) -> dict[str, Any]:
    name = "one-day" if squeeze else "decade"
    work = tmp / name
    work.mkdir()
    data = work / "changes.jsonl"
    n, span = history_stream(data, docs, squeeze)
    client = httpx.Client(timeout=60)
    log(f"{name}: ingesting {n:,} changes with streamrag run")
    server = ServerProcess(work, data, SETTINGS)
    server.start()
    build_s = server.wait_caught_up(client, n, timeout=1800)
    server.stop(timeout=600)
    index_dir = work / "state" / "index"
    files = sorted(p.name for p in index_dir.iterdir())
    restarts = []
    result: dict[str, Any] = {}
    for r in range(3):
        server = ServerProcess(work, data, SETTINGS)
        server.start()
        restarts.append(server.until_serving(client))
        if r == 2:
            st = server.status(client)
            log(f"{name}: measuring {queries} queries of each kind")
            result["current"] = latencies(client, server.url, queries, span, False, seed=2)
            result["as_of"] = latencies(client, server.url, queries, span, True, seed=3)
            result["segments"] = st.get("index_health", {}).get("segments")
        server.stop(timeout=600)
    client.close()
    result.update(
        {
            "changes": n,
            "span_days": span / DAY_S,
            "build_s": build_s,
            "restart_serving_s": min(restarts),
            "restart_runs_s": restarts,
            "index_files": len(files),
            "segment_files": sum(1 for f in files if f.startswith(("seg-", "grow-"))),
        }
    )
    return result


# -- full history vs current only ------------------------------------------------


def edit_stream(path: Path, docs: int, edits: int, seed: int = 4) -> int:
    """Every document edited ``edits`` times; a document's edits a few seconds apart."""
    rng = random.Random(seed)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for burst in range(0, docs, 50):
            group = range(burst, min(docs, burst + 50))
            base = T0 + burst * 600
            for e in range(edits):
                for d in group:
                    words = " ".join(rng.choice(WORDS) for _ in range(40))
                    # A few edits arrive late: event time a little before the previous one.
                    late = rng.random() < 0.1
                    t = base + e * 5 + (-7 if late else 0)
                    rec = {"doc_id": f"doc-{d}", "event_time": t, "text": f"v{e} {words}"}
                    fh.write(json.dumps(rec) + "\n")
                    n += 1
    return n


def ingest_once(data: Path, state: Path, history: str) -> dict[str, Any]:
    settings = load_settings(
        overrides={
            **SETTINGS,
            "source.path": str(data),
            "state_dir": str(state),
            "index.history": history,
        },
        environ={},
    )
    t = time.perf_counter()
    result = replay(settings)
    took = time.perf_counter() - t
    st = result.service.pipeline.stats
    out = {
        "seconds": took,
        "changes_per_s": st.ingested / took,
        "chunks_embedded": st.chunks_embedded,
        "chunks_reused": st.chunks_reused,
        "past_versions": st.past_versions,
        "stale": st.stale,
        "rows": result.service.index.stats().rows,
    }
    result.service.index.close()  # type: ignore[attr-defined]
    return out


def full_vs_current(tmp: Path, data: Path, repeats: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"full": [], "current": []}
    for r in range(repeats):
        for mode in ("full", "current") if r % 2 == 0 else ("current", "full"):
            state = tmp / f"state-{mode}-{r}"
            runs[mode].append(ingest_once(data, state, mode))
            log(f"  {mode}: {runs[mode][-1]['changes_per_s']:,.0f} changes/s")
    best = {m: max(rs, key=lambda x: x["changes_per_s"]) for m, rs in runs.items()}
    return {
        "runs": runs,
        "best": best,
        "throughput_ratio": best["full"]["changes_per_s"] / best["current"]["changes_per_s"],
        "embedded_ratio": best["full"]["chunks_embedded"]
        / max(1, best["current"]["chunks_embedded"]),
    }


# -- tldr-changes --------------------------------------------------------------


def tldr_case(tmp: Path, repeats: int) -> dict[str, Any]:
    events = tmp / "tldr.jsonl"
    seq_offset: dict[int, int] = {}
    offset_ts: dict[int, int] = {}
    at = 0
    with gzip.open(TLDR / "events.late.jsonl.gz", "rb") as src, events.open("wb") as dst:
        for raw in src:
            event = json.loads(raw)
            seq_offset[event["source_seq"]] = at
            offset_ts[at] = event["event_ts"]
            dst.write(raw)
            at += len(raw)
    log("tldr: full history vs current only")
    ingest = full_vs_current(tmp / "tldr-runs", events, repeats)
    log("tldr: as_of at the midpoint of every version interval")
    settings = load_settings(
        overrides={
            **SETTINGS,
            "source.path": str(events),
            "state_dir": str(tmp / "tldr-check"),
            "index.ann": "exact",
        },
        environ={},
    )
    service = replay(settings).service
    index = service.index
    q = np.zeros((1, index.dim), dtype=np.float32)
    q[0, 0] = 1.0
    checked = wrong = ties = 0
    examples: list[dict[str, Any]] = []
    took: list[float] = []
    with gzip.open(TLDR / "versions.jsonl.gz", "rt") as fh:
        for line in fh:
            v = json.loads(line)
            end = v["valid_to_ts"] if v["valid_to_ts"] is not None else v["valid_from_ts"] + DAY_S
            if end <= v["valid_from_ts"]:
                continue  # a version with an empty interval (shadowed at the same second)
            mid_us = (v["valid_from_ts"] + end) * 500_000
            flt = SearchFilter(doc_ids=frozenset([v["doc_id"]]), as_of_us=mid_us)
            t = time.perf_counter()
            _, hits = index.search_many(q, 64, flt)
            took.append((time.perf_counter() - t) * 1000)
            offsets = {h.offset for h in hits[0]}
            want = set() if v["op"] == "delete" else {seq_offset[v["source_seq"]]}
            checked += 1
            if offsets != want:
                if len(offsets) == 1 and offset_ts[min(offsets)] == v["valid_from_ts"]:
                    # Two changes at the same second: the ground truth breaks the tie on
                    # the repository's order (source_seq), streamrag on arrival order.
                    ties += 1
                    continue
                wrong += 1
                if len(examples) < 5:
                    examples.append({"version": v, "got_offsets": sorted(offsets)})
    index.close()  # type: ignore[attr-defined]
    return {
        "changes": len(seq_offset),
        "ingest": ingest,
        "as_of_checked": checked,
        "as_of_wrong": wrong,
        "as_of_ties_broken_by_arrival": ties,
        "as_of_examples": examples,
        "as_of_in_process_p50_ms": pct(took, 50),
    }


# -- report --------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# streamrag history benchmark",
        "",
        f"Run {m['date_utc']} with `{results['command']}`.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; 1-min load average {m['loadavg_1m_at_start']} at start. Hashing "
        "embedder (384 dims) throughout.",
        "",
    ]
    dec = results.get("decade")
    if dec:
        a, b = dec["decade"], dec["one-day"]
        lines += [
            "## A decade of history against the same rows in one day",
            "",
            f"{a['changes']:,} changes: {dec['docs']} documents, one change a day each for "
            f"ten years (decade), and the same changes within one day (one day). Latency of "
            f"`/v1/retrieve` over HTTP from one client ({dec['queries']} queries each, k = 5), "
            "after a restart; the server's own `took_ms` in brackets.",
            "",
            "| | decade | one day | decade / one day | goal |",
            "|---|---:|---:|---:|---|",
        ]
        for kind in ("current", "as_of"):
            for q in ("p50", "p99"):
                x, y = a[kind][f"{q}_ms"], b[kind][f"{q}_ms"]
                sx, sy = a[kind][f"server_{q}_ms"], b[kind][f"server_{q}_ms"]
                lines.append(
                    f"| {kind} {q} | {x:.1f} ms ({sx:.1f}) | {y:.1f} ms ({sy:.1f}) | "
                    f"{x / y:.2f}× | ≤ 1.5× |"
                )
        lines += [
            f"| restart to serving (best of 3) | {a['restart_serving_s']:.2f} s | "
            f"{b['restart_serving_s']:.2f} s | {a['restart_serving_s'] / b['restart_serving_s']:.2f}× "
            "| decade ≤ 2 s |",
            f"| files in the index folder | {a['index_files']} | {b['index_files']} | | |",
            f"| segment files | {a['segment_files']} | {b['segment_files']} | | |",
            f"| ingest (streamrag run, to caught up) | {a['build_s']:.1f} s | {b['build_s']:.1f} s | | |",
            "",
        ]
    fvc = results.get("full_vs_current")
    if fvc:
        lines += _ingest_table(
            "Full history against current only (frequent edits)",
            f"{fvc['changes']:,} changes: {fvc['docs']:,} documents edited {fvc['edits']} times "
            "each, a document's edits seconds apart (10 % arrive a little late). In-process "
            "replay, best of 3 alternating repeats.",
            fvc,
        )
    tl = results.get("tldr")
    if tl:
        lines += _ingest_table(
            "tldr-changes (real, bounded lateness)",
            f"{tl['changes']:,} changes of tldr-pages over 11 years (`events.late`), in-process "
            "replay, best of 3 alternating repeats.",
            tl["ingest"],
        )
        lines += [
            f"`as_of` at the midpoint of every version interval of the ground truth: "
            f"**{tl['as_of_wrong']} wrong of {tl['as_of_checked']:,}**; "
            f"{tl['as_of_ties_broken_by_arrival']} answered with the other of two changes made "
            "at the same second (the ground truth breaks such ties on the repository's order, "
            "`source_seq`; streamrag on arrival order, as documented). In-process search p50 "
            f"{tl['as_of_in_process_p50_ms']:.2f} ms, filtered to the document.",
            "",
        ]
    elif "tldr_skipped" in results:
        lines += [f"tldr-changes: skipped ({results['tldr_skipped']}).", ""]
    return "\n".join(lines) + "\n"


def _ingest_table(title: str, what: str, x: dict[str, Any]) -> list[str]:
    f, c = x["best"]["full"], x["best"]["current"]
    return [
        f"## {title}",
        "",
        what,
        "",
        "| | full history | current only | full / current |",
        "|---|---:|---:|---:|",
        f"| changes per second | {f['changes_per_s']:,.0f} | {c['changes_per_s']:,.0f} | "
        f"{x['throughput_ratio']:.2f}× |",
        f"| chunks embedded | {f['chunks_embedded']:,} | {c['chunks_embedded']:,} | "
        f"{x['embedded_ratio']:.2f}× |",
        f"| chunks reused (not embedded) | {f['chunks_reused']:,} | {c['chunks_reused']:,} | |",
        f"| versions filed in the past | {f['past_versions']:,} | {c['past_versions']:,} | |",
        f"| rows in the index | {f['rows']:,} | {c['rows']:,} | |",
        "",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=6, help="documents of the decade history")
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--edit-docs", type=int, default=2000)
    ap.add_argument("--edits", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="history")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--skip", nargs="*", default=[], choices=["decade", "edits", "tldr"])
    args = ap.parse_args()
    results: dict[str, Any] = {
        "command": "benchmarks/history.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
    }
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp_name:
        tmp = Path(tmp_name)
        if "decade" not in args.skip:
            results["decade"] = {
                "docs": args.docs,
                "queries": args.queries,
                "decade": decade_case(tmp, args.docs, False, args.queries),
                "one-day": decade_case(tmp, args.docs, True, args.queries),
            }
        if "edits" not in args.skip:
            data = tmp / "edits.jsonl"
            n = edit_stream(data, args.edit_docs, args.edits)
            log(f"full history vs current only over {n:,} changes")
            results["full_vs_current"] = {
                "changes": n,
                "docs": args.edit_docs,
                "edits": args.edits,
                **full_vs_current(tmp / "edit-runs", data, args.repeats),
            }
        if "tldr" not in args.skip:
            if (TLDR / "events.late.jsonl.gz").exists():
                results["tldr"] = tldr_case(tmp, args.repeats)
            else:
                results["tldr_skipped"] = f"{TLDR} not found"
    results["machine"]["loadavg_1m_at_end"] = machine_info()["loadavg_1m_at_start"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1, default=str))
    (args.out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
