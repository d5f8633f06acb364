"""Vector index benchmark: streamrag's LSM index against the raw ANN library, same graph.

    .venv/bin/python benchmarks/index.py --sizes 100000            # part of `make bench`
    nice .venv/bin/python benchmarks/index.py --sizes 1000000 --name index-1m   # ~15 min

For each size N (× 384 dims, clustered unit vectors):

1. commit N single-chunk documents in micro-batches (commit throughput), seal and
   compact them into one segment; its HNSW graph is built once (build time);
2. pick the smallest ``ef`` at which FAISS's own ``search`` on that graph
   reaches recall@10 ≥ 0.95 against exact numpy search;
3. at that ``ef``, time single queries and batches of 32 through
   ``LsmIndex.search_many`` and through FAISS's ``search`` on the same graph
   (alternating rounds, best round kept), and report the ratio of the best
   rounds and the median over rounds of each round's ratio (the figure the
   goals use: on a shared machine it moves less than the best rounds);
4. commit updates from a writer thread while queries run (throughput and
   latency under writes);
5. time-range queries over one day of a 30-day index against the whole index
   (at min(N, 100k));
6. memory per vector (RSS growth and the index's own accounting).

Results: ``benchmarks/results/<name>.json`` and ``<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info

from streamrag.changes import Op
from streamrag.index import CommitBatch, DocOp, SearchFilter
from streamrag.index.compaction import CompactionSpec
from streamrag.index.lsm import LsmIndex, LsmSpec

HERE = Path(__file__).resolve().parent
DIM = 384
K = 10
DAY_US = 86_400 * 1_000_000
T0_US = 1_714_521_600 * 1_000_000  # 2024-05-01T00:00:00Z
EFS = (16, 24, 32, 48, 64, 96, 128, 192, 256)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def clustered(n: int, dim: int, seed: int, centers: int | None = None) -> np.ndarray:
    """Unit vectors around ``centers`` random directions (like embeddings of topics)."""
    rng = np.random.default_rng(seed)
    c = centers or max(64, n // 1000)
    mu = rng.standard_normal((c, dim)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    step = 65_536
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        which = rng.integers(0, c, hi - lo)
        out[lo:hi] = mu[which] + 0.9 * rng.standard_normal((hi - lo, dim)).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def exact_topk(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for lo in range(0, queries.shape[0], 64):
        s = queries[lo : lo + 64] @ data.T
        top = np.argpartition(-s, k - 1, axis=1)[:, :k]
        out[lo : lo + 64] = top
    return out


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    hits = sum(len(set(f) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size


def batch_of(ids: range, vectors: np.ndarray, times: np.ndarray, offset0: int) -> CommitBatch:
    docs = [
        DocOp("default", f"d{i}", Op.UPSERT, int(times[j]), offset0 + j, "bench", "", j, 1)
        for j, i in enumerate(ids)
    ]
    m = len(ids)
    return CommitBatch(
        docs=docs,
        chunk_ids=np.arange(ids.start, ids.stop, dtype=np.int64),
        positions=np.zeros(m, dtype=np.int32),
        texts=[""] * m,
        hashes=[b""] * m,
        vectors=vectors,
        embedder_version="bench",
    )


def load(index: LsmIndex, data: np.ndarray, times: np.ndarray, batch: int) -> float:
    started = time.perf_counter()
    for lo in range(0, data.shape[0], batch):
        hi = min(data.shape[0], lo + batch)
        index.commit(batch_of(range(lo, hi), data[lo:hi], times[lo:hi], lo))
    return time.perf_counter() - started


def timed(fn: Any, items: list[Any]) -> tuple[list[float], list[Any]]:
    lat, out = [], []
    for item in items:
        t = time.perf_counter()
        out.append(fn(item))
        lat.append(time.perf_counter() - t)
    return lat, out


def summary(lat: list[float], per_call: int) -> dict[str, float]:
    a = np.asarray(lat)
    return {
        "qps": per_call * len(a) / a.sum(),
        "p50_ms": float(np.percentile(a, 50) * 1e3),
        "p99_ms": float(np.percentile(a, 99) * 1e3),
    }


def compare(
    index: LsmIndex,
    raw: Any,
    chunk_ids: np.ndarray,
    queries: np.ndarray,
    truth: np.ndarray,
    rounds: int,
) -> dict[str, Any]:
    """Single and batched queries: streamrag vs the raw graph, alternating rounds.

    The raw call returns graph labels (row numbers); they are mapped to chunk ids
    after timing, for recall.
    """
    flt = SearchFilter()
    singles = [queries[i : i + 1] for i in range(queries.shape[0])]
    batches = [queries[i : i + 32] for i in range(0, queries.shape[0] - 31, 32)]

    def ours(q: np.ndarray) -> list[np.ndarray]:
        return [hits.chunk_ids for hits in index.search_many(q, K, flt)[1]]

    def theirs(q: np.ndarray) -> Any:
        return raw.search(np.ascontiguousarray(q, dtype=np.float32), K)[1]

    out: dict[str, Any] = {}
    for mode, items, per in (("single", singles, 1), ("batch32", batches, 32)):
        best: dict[str, dict[str, float]] = {}
        paired: list[float] = []
        for r in range(rounds):
            qps: dict[str, float] = {}
            # Who goes first alternates: the second of a pair runs with warmer caches.
            order = (("raw", theirs), ("streamrag", ours))
            for name, fn in order if r % 2 == 0 else order[::-1]:
                lat, res = timed(fn, items)
                # Both return arrays per call; they become lists of chunk ids after timing.
                if name == "raw":
                    res = [chunk_ids[labels.astype(np.int64)].tolist() for labels in res]
                else:
                    res = [[ids.tolist() for ids in per_query] for per_query in res]
                s = summary(lat, per)
                s["recall"] = recall([x for xx in res for x in xx], truth[: len(items) * per])
                qps[name] = s["qps"]
                if name not in best or s["qps"] > best[name]["qps"]:
                    best[name] = s
            paired.append(qps["streamrag"] / qps["raw"])
        best["ratio"] = {
            "qps": best["streamrag"]["qps"] / best["raw"]["qps"],
            "qps_paired_median": float(np.median(paired)),
            "rounds": len(paired),
        }
        out[mode] = best
    return out


def pick_ef(
    raw: Any, chunk_ids: np.ndarray, queries: np.ndarray, truth: np.ndarray
) -> tuple[int, float]:
    r = 0.0
    for ef in EFS:
        raw.hnsw.efSearch = ef
        labels = raw.search(np.ascontiguousarray(queries, dtype=np.float32), K)[1]
        r = recall(chunk_ids[labels.astype(np.int64)].tolist(), truth)
        if r >= 0.95:
            return ef, r
    return EFS[-1], r


def under_writes(
    index: LsmIndex, data: np.ndarray, queries: np.ndarray, seconds: float, rate: float | None
) -> dict[str, Any]:
    """A writer commits updates of existing documents while this thread queries.

    ``rate`` caps the writer at that many changes/s (None: as fast as it can,
    which on 2 cores mostly measures the two threads sharing the interpreter).
    """
    stop = threading.Event()
    done = {"commits": 0, "changes": 0}
    n = data.shape[0]
    rng = np.random.default_rng(5)

    def writer() -> None:
        offset = 10 * n
        while not stop.is_set():
            ids = rng.choice(n, 256, replace=False)
            docs = [
                DocOp(
                    "default",
                    f"d{i}",
                    Op.UPSERT,
                    T0_US + 1 + offset + j,
                    offset + j,
                    "bench",
                    "",
                    j,
                    1,
                )
                for j, i in enumerate(ids.tolist())
            ]
            vecs = data[ids]
            index.commit(
                CommitBatch(
                    docs=docs,
                    chunk_ids=ids.astype(np.int64),
                    positions=np.zeros(256, np.int32),
                    texts=[""] * 256,
                    hashes=[b""] * 256,
                    vectors=vecs,
                    embedder_version="bench",
                )
            )
            offset += 256
            done["commits"] += 1
            done["changes"] += 256
            if rate is not None:
                ahead = done["changes"] / rate - (time.perf_counter() - started)
                if ahead > 0:
                    stop.wait(ahead)

    thread = threading.Thread(target=writer)
    lat: list[float] = []
    flt = SearchFilter()
    started = time.perf_counter()
    thread.start()
    i = 0
    while time.perf_counter() - started < seconds:
        t = time.perf_counter()
        index.search_many(queries[i % queries.shape[0] : i % queries.shape[0] + 1], K, flt)
        lat.append(time.perf_counter() - t)
        i += 1
    stop.set()
    thread.join()
    elapsed = time.perf_counter() - started
    return {
        "writer_rate_cap": rate,
        "seconds": elapsed,
        "commits_per_s": done["commits"] / elapsed,
        "changes_per_s": done["changes"] / elapsed,
        "queries": summary(lat, 1),
        "segments_after": index.health().segments,
    }


def time_range_case(n: int, rounds: int) -> dict[str, Any]:
    """One day of a 30-day index against the whole index (exact search below the ANN size)."""
    data = clustered(n, DIM, seed=11)
    times = T0_US + (np.arange(n) * (30 * DAY_US // n)).astype(np.int64)
    index = LsmIndex(DIM, LsmSpec())
    load(index, data, times, 1024)
    index.seal_all()
    while index.maintain():  # the segments maintenance leaves: neighbours in time merged
        pass
    queries = clustered(256, DIM, seed=12)
    day = SearchFilter(start_us=T0_US + 10 * DAY_US, end_us=T0_US + 11 * DAY_US)
    whole = SearchFilter()
    out: dict[str, Any] = {"rows": n, "days": 30, "segments": index.health().segments}
    for name, flt in (("one_day", day), ("whole", whole)):
        best = None
        for _ in range(rounds):
            lat, _ = timed(
                lambda q, f=flt: index.search_many(q, K, f),
                [queries[i : i + 1] for i in range(256)],
            )
            s = summary(lat, 1)
            if best is None or s["qps"] > best["qps"]:
                best = s
        out[name] = best
    out["speedup"] = out["one_day"]["qps"] / out["whole"]["qps"]
    return out


def half_case(n: int, rounds: int) -> dict[str, Any]:
    """Exact scans of many sealed segments: float32 against their half-precision copies.

    ``n`` rows in segments of ``seal_rows`` (8,192), none merged: the state a
    bulk load leaves until maintenance catches up, and what an index keeps
    below the ANN size. Single queries, the two ways taking turns, the same
    queries; the hits must be the same.
    """
    data = clustered(n, DIM, seed=21)
    times = np.full(n, T0_US, dtype=np.int64)
    index = LsmIndex(DIM, LsmSpec(compaction=CompactionSpec(fanout=10**6)), background=False)
    load(index, data, times, 1024)
    index.seal_all()
    while index.maintain():
        pass
    segs = [v.segment for v in index.pin().views if v.rows]
    copies = [s.half for s in segs]
    queries = clustered(256, DIM, seed=22)
    items = [queries[i : i + 1] for i in range(256)]
    flt = SearchFilter()

    def ours(q: np.ndarray) -> list[int]:
        ids: list[int] = index.search_many(q, K, flt)[1][0].chunk_ids.tolist()
        return ids

    best: dict[str, dict[str, float]] = {}
    found: dict[str, list[Any]] = {}
    for _ in range(rounds):
        for name in ("float32", "half"):
            for seg, copy in zip(segs, copies, strict=True):
                seg.half = copy if name == "half" else None
            lat, res = timed(ours, items)
            found[name] = res
            s = summary(lat, 1)
            if name not in best or s["qps"] > best[name]["qps"]:
                best[name] = s
    return {
        "rows": n,
        "segments": len(segs),
        "with_copy": sum(c is not None for c in copies),
        "float32": best["float32"],
        "half": best["half"],
        "speedup": best["half"]["qps"] / best["float32"]["qps"],
        "same_hits": found["half"] == found["float32"],
    }


def run_size(n: int, n_queries: int, search_rounds: int, write_seconds: float) -> dict[str, Any]:
    log(f"N={n:,}: generating data")
    data = clustered(n, DIM, seed=1)
    queries = clustered(n_queries, DIM, seed=2, centers=max(64, n // 1000))
    # Queries near the data: perturbed data points.
    rng = np.random.default_rng(3)
    queries = data[rng.choice(n, n_queries, replace=False)] + 0.5 * queries / np.sqrt(DIM) * 4
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    log("exact ground truth")
    truth = exact_topk(data, queries, K)
    times = np.full(n, T0_US, dtype=np.int64)
    rss0 = rss_bytes()
    index = LsmIndex(DIM, LsmSpec())
    log("committing")
    commit_s = load(index, data, times, 1024)
    log(f"committed {n / commit_s:,.0f} chunks/s; sealing and compacting into one segment")
    index.seal_all()
    t = time.perf_counter()
    index.compact(force=True)
    build_s = time.perf_counter() - t
    health = index.health()
    segs = [v.segment for v in index.pin().views]
    assert len(segs) == 1, segs
    assert segs[0].ann is not None, segs
    raw = segs[0].ann.index  # type: ignore[attr-defined]
    rss1 = rss_bytes()
    log(f"one segment, HNSW built in {build_s:.0f} s; choosing ef")
    chunk_ids = segs[0].chunk_ids[: segs[0].n].copy()
    ef, raw_recall = pick_ef(raw, chunk_ids, queries, truth)
    log(f"ef={ef} (raw recall {raw_recall:.3f}); timing")
    result: dict[str, Any] = {
        "n": n,
        "dim": DIM,
        "queries": n_queries,
        "k": K,
        "commit_chunks_per_s": n / commit_s,
        "compact_and_build_s": build_s,
        "build_vectors_per_s": n / build_s,
        "hnsw": {
            "M": index.spec.ann.hnsw_m,
            "ef_construction": index.spec.ann.hnsw_ef_construction,
            "ef": ef,
        },
        "raw_recall_at_ef": raw_recall,
        "search": compare(index, raw, chunk_ids, queries, truth, search_rounds),
        "memory": {
            "rss_growth_bytes_per_vector": (rss1 - rss0) / n,
            "index_bytes_per_vector": health.bytes / n,
        },
    }
    log("queries under writes")
    result["idle_single"] = result["search"]["single"]["streamrag"]
    result["under_writes"] = under_writes(index, data, queries, write_seconds, 2000.0)
    result["under_writes_unthrottled"] = under_writes(index, data, queries, write_seconds, None)
    return result


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# streamrag index benchmark",
        "",
        f"Run {m['date_utc']} with `{results['command']}`.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}, numpy {m['numpy']}; 1-min load average {m['loadavg_1m_at_start']} at "
        "start (the machine is shared: compare ratios from the same run).",
        "",
        "Clustered unit vectors × 384 dims, k = 10, one thread per call. streamrag's search "
        "(`LsmIndex.search_many`: pin a manifest, prune, filter tombstones and tenant, re-score "
        "candidates exactly, build hits) against FAISS's own `search` on the very same graph.",
        "",
        "| N | mode | ef | raw QPS | streamrag QPS | ratio of best rounds | median ratio over rounds | raw p50 / p99 ms | streamrag p50 / p99 ms | raw recall@10 | streamrag recall@10 |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in results["sizes"]:
        for mode in ("single", "batch32"):
            s = r["search"][mode]
            raw, ours = s["raw"], s["streamrag"]
            lines.append(
                f"| {r['n']:,} | {mode} | {r['hnsw']['ef']} | {raw['qps']:,.0f} | {ours['qps']:,.0f} | "
                f"{s['ratio']['qps']:.2f} | "
                f"{s['ratio']['qps_paired_median']:.2f} ({s['ratio']['rounds']} rounds) | "
                f"{raw['p50_ms']:.3f} / {raw['p99_ms']:.3f} | "
                f"{ours['p50_ms']:.3f} / {ours['p99_ms']:.3f} | {raw['recall']:.3f} | {ours['recall']:.3f} |"
            )
    lines += [
        "",
        "| N | commit, no queries (chunks/s) | compact + HNSW build | RSS growth / vector | index bytes / vector |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in results["sizes"]:
        lines.append(
            f"| {r['n']:,} | {r['commit_chunks_per_s']:,.0f} | {r['compact_and_build_s']:.0f} s "
            f"({r['build_vectors_per_s']:,.0f}/s) | {r['memory']['rss_growth_bytes_per_vector']:,.0f} B | "
            f"{r['memory']['index_bytes_per_vector']:,.0f} B |"
        )
    lines += [
        "",
        "Writes while queries run (a writer thread commits updates of 256 existing documents per "
        "epoch; the main thread sends single queries):",
        "",
        "| N | writer | changes/s | commits/s | queries/s | query p50 ms | query p99 ms | idle queries/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["sizes"]:
        for key in ("under_writes", "under_writes_unthrottled"):
            w = r[key]
            cap = (
                "unthrottled"
                if w["writer_rate_cap"] is None
                else f"capped at {w['writer_rate_cap']:,.0f}/s"
            )
            lines.append(
                f"| {r['n']:,} | {cap} | {w['changes_per_s']:,.0f} | {w['commits_per_s']:,.1f} | "
                f"{w['queries']['qps']:,.0f} | {w['queries']['p50_ms']:.3f} | {w['queries']['p99_ms']:.2f} | "
                f"{r['idle_single']['qps']:,.0f} |"
            )
    tr = results.get("time_range")
    if tr:
        lines += [
            "",
            f"Time range, {tr['rows']:,} chunks over 30 days ({tr['segments']} segments, each covering the event times of its rows), single queries:",
            "",
            "| query | QPS | p50 ms | p99 ms |",
            "|---|---:|---:|---:|",
            f"| one day (`time_range`) | {tr['one_day']['qps']:,.0f} | {tr['one_day']['p50_ms']:.3f} | {tr['one_day']['p99_ms']:.3f} |",
            f"| whole index | {tr['whole']['qps']:,.0f} | {tr['whole']['p50_ms']:.3f} | {tr['whole']['p99_ms']:.3f} |",
            "",
            f"One day is {tr['speedup']:.1f}× faster: segments outside the day are pruned from their time bounds before any vector is read, and the rest pre-filtered by event time.",
        ]
    hc = results.get("half")
    if hc:
        lines += [
            "",
            f"Exact scans of {hc['rows']:,} chunks in {hc['segments']} sealed segments of 8,192 "
            f"rows, none merged ({hc['with_copy']} with a half-precision copy), single queries:",
            "",
            "| scan | QPS | p50 ms | p99 ms |",
            "|---|---:|---:|---:|",
            f"| float32 vectors | {hc['float32']['qps']:,.0f} | {hc['float32']['p50_ms']:.3f} | {hc['float32']['p99_ms']:.3f} |",
            f"| half-precision copies, re-scored in float32 | {hc['half']['qps']:,.0f} | {hc['half']['p50_ms']:.3f} | {hc['half']['p99_ms']:.3f} |",
            "",
            f"The copies answer {hc['speedup']:.2f}× as fast, with "
            + ("the same hits." if hc["same_hits"] else "**different hits**."),
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search-rounds", type=int, default=15)
    ap.add_argument("--write-seconds", type=float, default=5.0)
    ap.add_argument("--time-range-rows", type=int, default=100_000)
    ap.add_argument("--half-rows", type=int, default=100_000)
    ap.add_argument("--name", default="index")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    results: dict[str, Any] = {
        "command": "benchmarks/index.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "sizes": [],
    }
    for n in [int(s) for s in args.sizes.split(",") if s]:
        results["sizes"].append(run_size(n, args.queries, args.search_rounds, args.write_seconds))
    if args.time_range_rows:
        log("time range case")
        results["time_range"] = time_range_case(args.time_range_rows, args.rounds)
    if args.half_rows:
        log("half-precision copies case")
        results["half"] = half_case(args.half_rows, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
