"""ANN library benchmark: hnswlib, usearch and FAISS HNSW on the same vectors.

    .venv/bin/python benchmarks/ann_libraries.py                  # ~10-15 min on 2 cores
    .venv/bin/python benchmarks/ann_libraries.py --n 20000 --no-wheels --name ann-quick

Data: ``--n`` (100k) clustered unit vectors × 384 (the generator of
``benchmarks/index.py``) and 1,000 queries near them (perturbed data points, as
there); ground truth by exact inner product in numpy. For each library and
``M`` in ``--ms`` (16, 32), with the same ``ef_construction`` (100):

1. **build**: insert every vector with one thread (how streamrag's maintenance
   thread builds a segment's graph: in parts of 1,024 rows), the libraries
   taking turns part by part; insert rate, and memory as the serialized size per
   vector (vectors plus links; the graphs hold about that in memory); and, on
   the first ``--mt-rows`` (25k) vectors, one thread against all threads;
2. **search**: sweep ef and take the smallest with recall@10 ≥ 0.95; at that ef,
   single-query QPS (one query per call, one thread: how streamrag calls it),
   batches of 32 on one thread, and one batch of every query on all threads;
3. **filters**: a predicate that excludes 50 % of ids, through the library's
   own filtered search where it has one (hnswlib's filter callback, FAISS's
   ``IDSelectorBitmap`` in ``SearchParametersHNSW``; usearch's Python API has
   none) and through streamrag's way (ask for ``k / share × 1.25 + 2``
   candidates, drop those that fail, ask for 4× more when short);
4. **deletes**: 10 % of ids deleted, by the library's mark-deleted
   (``mark_deleted`` / ``remove``; FAISS HNSW cannot remove, so a selector of
   the live ids stands in) and by streamrag's over-fetching; cost per delete
   and the ef, recall and QPS it takes to get back to recall 0.95;
5. **wheels**: ``pip download --only-binary=:all:`` for CPython 3.11 on the
   common platforms.

Every QPS is the median of ``--rounds`` (3) passes over the queries, the
libraries taking turns every 50 queries within a pass (the machine is shared and
noisy: load then falls on all alike); p50/p99 pool all passes. Builds are timed
once each, also taking turns (they take most of the run). Results:
``benchmarks/results/<name>.json`` and ``<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index import clustered
from run import machine_info

HERE = Path(__file__).resolve().parent
DIM = 384
K = 10
TARGET = 0.95
EFS = (10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512)
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux2014_aarch64",
    "manylinux_2_28_aarch64",
    "musllinux_1_2_x86_64",
    "macosx_11_0_arm64",
    "macosx_14_0_arm64",
    "macosx_10_15_x86_64",
    "macosx_14_0_x86_64",
    "win_amd64",
)
Search = Callable[[np.ndarray, int], np.ndarray]
"""(queries, k) -> labels (queries × k, best first, -1 or out of range where none)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- libraries -------------------------------------------------------------------


class Lib:
    """One library's HNSW graph behind a common face."""

    name = ""
    filter_api: str | None = None
    delete_api: str | None = None

    def __init__(self, m: int, ef_construction: int) -> None:
        self.m = m
        self.efc = ef_construction
        self.index: Any = None

    @property
    def label(self) -> str:
        return f"{self.name} M={self.m}"

    def new(self, n: int, dim: int) -> Any:
        """An empty graph for ``n`` vectors."""
        raise NotImplementedError

    def add(self, index: Any, data: np.ndarray, lo: int, threads: int) -> None:
        """Insert ``data`` as ids ``lo, lo + 1, ...``."""
        raise NotImplementedError

    def set_ef(self, ef: int) -> None:
        raise NotImplementedError

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        raise NotImplementedError

    def search_threads(self, q: np.ndarray, k: int, threads: int) -> np.ndarray:
        raise NotImplementedError

    def filtered(self, allowed: np.ndarray) -> Search | None:
        """The library's own filtered search over the ids ``allowed`` admits."""
        return None

    def delete(self, ids: np.ndarray) -> None:
        raise NotImplementedError

    def deleted_search(self, live: np.ndarray) -> Search:
        """Search after :meth:`delete` (a selector of live ids where it cannot delete)."""
        return self.search

    def serialized_bytes(self) -> int:
        raise NotImplementedError


class Hnswlib(Lib):
    name = "hnswlib"
    filter_api = "knn_query(filter=callback)"
    delete_api = "mark_deleted"

    def new(self, n: int, dim: int) -> Any:
        import hnswlib

        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=n, M=self.m, ef_construction=self.efc, random_seed=0)
        index.set_num_threads(1)
        return index

    def add(self, index: Any, data: np.ndarray, lo: int, threads: int) -> None:
        index.add_items(data, np.arange(lo, lo + data.shape[0]), num_threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return self.index.knn_query(q, k=k, num_threads=1)[0]  # type: ignore[no-any-return]

    def search_threads(self, q: np.ndarray, k: int, threads: int) -> np.ndarray:
        return self.index.knn_query(q, k=k, num_threads=threads)[0]  # type: ignore[no-any-return]

    def filtered(self, allowed: np.ndarray) -> Search:
        ok = allowed.tolist().__getitem__  # called once per candidate, under the GIL

        def run(q: np.ndarray, k: int) -> np.ndarray:
            return self.index.knn_query(q, k=k, num_threads=1, filter=ok)[0]  # type: ignore[no-any-return]

        return run

    def delete(self, ids: np.ndarray) -> None:
        for i in ids.tolist():
            self.index.mark_deleted(i)

    def serialized_bytes(self) -> int:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "g.hnsw"
            self.index.save_index(str(path))
            return path.stat().st_size


def _faiss() -> Any:
    import faiss

    faiss.omp_set_num_threads(1)
    return faiss


class FaissHnsw(Lib):
    name = "faiss"
    filter_api = "SearchParametersHNSW(sel=IDSelectorBitmap)"
    delete_api = None  # IndexHNSW.remove_ids is not implemented

    def new(self, n: int, dim: int) -> Any:
        faiss = _faiss()
        index = faiss.IndexHNSWFlat(dim, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.efc
        return index

    def add(self, index: Any, data: np.ndarray, lo: int, threads: int) -> None:
        faiss = _faiss()
        faiss.omp_set_num_threads(threads)
        try:
            index.add(data)
        finally:
            faiss.omp_set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        self.index.hnsw.efSearch = ef

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return self.index.search(q, k)[1]  # type: ignore[no-any-return]

    def search_threads(self, q: np.ndarray, k: int, threads: int) -> np.ndarray:
        faiss = _faiss()
        faiss.omp_set_num_threads(threads)
        try:
            return self.index.search(q, k)[1]  # type: ignore[no-any-return]
        finally:
            faiss.omp_set_num_threads(1)

    def filtered(self, allowed: np.ndarray) -> Search:
        faiss = _faiss()
        bits = np.packbits(allowed, bitorder="little")
        sel = faiss.IDSelectorBitmap(allowed.size, faiss.swig_ptr(bits))

        def run(q: np.ndarray, k: int) -> np.ndarray:
            params = faiss.SearchParametersHNSW(efSearch=self.index.hnsw.efSearch, sel=sel)
            return self.index.search(q, k, params=params)[1]  # type: ignore[no-any-return]

        run.keep = (bits, sel)  # type: ignore[attr-defined]
        return run

    def delete(self, ids: np.ndarray) -> None:
        try:
            self.index.remove_ids(ids.astype(np.int64))
        except RuntimeError:
            pass  # not implemented for HNSW: searches take a selector of the live ids
        else:  # pragma: no cover - a FAISS that can
            self.delete_api = "remove_ids"

    def deleted_search(self, live: np.ndarray) -> Search:
        if self.delete_api is not None:  # pragma: no cover
            return self.search
        return self.filtered(live)

    def serialized_bytes(self) -> int:
        return int(_faiss().serialize_index(self.index).nbytes)


class Usearch(Lib):
    name = "usearch"
    filter_api = None  # the C++ core takes a predicate; the Python binding does not
    delete_api = "remove"

    def __init__(self, m: int, ef_construction: int, dtype: str = "f32") -> None:
        super().__init__(m, ef_construction)
        self.dtype = dtype
        if dtype != "f32":
            self.name = f"usearch-{dtype}"

    def new(self, n: int, dim: int) -> Any:
        from usearch.index import Index

        return Index(
            ndim=dim,
            metric="ip",
            dtype=self.dtype,
            connectivity=self.m,
            expansion_add=self.efc,
            expansion_search=64,
        )

    def add(self, index: Any, data: np.ndarray, lo: int, threads: int) -> None:
        keys = np.arange(lo, lo + data.shape[0], dtype=np.uint64)
        index.add(keys, data, threads=threads)

    def set_ef(self, ef: int) -> None:
        self.index.expansion_search = ef

    def search(self, q: np.ndarray, k: int) -> np.ndarray:
        return self.index.search(q, k, threads=1).keys.reshape(q.shape[0], -1)  # type: ignore[no-any-return]

    def search_threads(self, q: np.ndarray, k: int, threads: int) -> np.ndarray:
        return self.index.search(q, k, threads=threads).keys.reshape(q.shape[0], -1)  # type: ignore[no-any-return]

    def delete(self, ids: np.ndarray) -> None:
        self.index.remove(ids.astype(np.uint64))

    def serialized_bytes(self) -> int:
        return int(self.index.serialized_length)


def postfilter(lib: Lib, allowed: np.ndarray) -> Search:
    """streamrag's way: over-fetch by the share that passes, drop the rest, widen when short."""
    n = allowed.size
    share = float(np.count_nonzero(allowed)) / n

    def run(q: np.ndarray, k: int) -> np.ndarray:
        want = min(n, max(k, math.ceil(k / share * 1.25) + 2))
        out = np.full((q.shape[0], k), -1, dtype=np.int64)
        todo = np.arange(q.shape[0])
        while todo.size:
            labels = lib.search(q[todo], want).astype(np.int64)
            valid = (labels >= 0) & (labels < n)
            ok = allowed[np.where(valid, labels, 0)] & valid
            short = np.count_nonzero(ok, axis=1) < k
            for j, row in enumerate(todo.tolist()):
                keep = labels[j][ok[j]][:k]
                out[row, : keep.size] = keep
            if not short.any() or want >= n:
                break
            todo = todo[short]
            want = min(n, want * 4)
        return out

    return run


# -- measuring -------------------------------------------------------------------


def build_all(
    libs: list[Lib], data: np.ndarray, threads: int, part: int, keep: bool
) -> dict[str, float]:
    """Build every library's graph over ``data``, taking turns part by part; inserts/s each.

    Taking turns spreads the load of a shared machine evenly over the libraries.
    """
    n, dim = data.shape
    graphs = {lib.label: lib.new(n, dim) for lib in libs}
    spent = dict.fromkeys(graphs, 0.0)
    for j, lo in enumerate(range(0, n, part)):
        chunk = data[lo : lo + part]
        for lib in libs[j % len(libs) :] + libs[: j % len(libs)]:
            t = time.perf_counter()
            lib.add(graphs[lib.label], chunk, lo, threads)
            spent[lib.label] += time.perf_counter() - t
    if keep:
        for lib in libs:
            lib.index = graphs[lib.label]
    return {label: n / s for label, s in spent.items()}


def exact_topk(data: np.ndarray, queries: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    out = np.empty((queries.shape[0], K), dtype=np.int64)
    for lo in range(0, queries.shape[0], 100):
        s = queries[lo : lo + 100] @ data.T
        if allowed is not None:
            s[:, ~allowed] = -np.inf
        out[lo : lo + 100] = np.argpartition(-s, K - 1, axis=1)[:, :K]
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(
        len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found[:, :K], truth, strict=True)
    )
    return hits / truth.size


def sweep(lib: Lib, fn: Search, queries: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Recall per ef (batched, one thread) up to the first ef that reaches the target."""
    curve: dict[int, float] = {}
    for ef in EFS:
        lib.set_ef(ef)
        found = np.vstack([fn(queries[i : i + 100], K) for i in range(0, len(queries), 100)])
        curve[ef] = recall(found, truth)
        if curve[ef] >= TARGET:
            return {"ef": ef, "recall": curve[ef], "curve": curve}
    return {"ef": None, "recall": max(curve.values()), "curve": curve}


def single_qps(
    cases: list[tuple[str, Lib, Search, int]], queries: np.ndarray, rounds: int, block: int = 50
) -> dict[str, dict[str, float]]:
    """Single-query QPS per case: median of ``rounds`` passes over every query.

    Within a pass the cases take turns every ``block`` queries (the first in turn
    rotating), so that a shared machine's load falls on all of them alike.
    """
    lat: dict[str, list[list[float]]] = {key: [] for key, *_ in cases}
    for _ in range(rounds):
        for key in lat:
            lat[key].append([])
        for j, lo in enumerate(range(0, queries.shape[0], block)):
            turn = cases[j % len(cases) :] + cases[: j % len(cases)]
            for key, lib, fn, ef in turn:
                lib.set_ef(ef)
                out = lat[key][-1]
                for i in range(lo, min(lo + block, queries.shape[0])):
                    q = queries[i : i + 1]
                    t = time.perf_counter()
                    fn(q, K)
                    out.append(time.perf_counter() - t)
    res = {}
    for key, runs in lat.items():
        pooled = np.concatenate([np.asarray(r) for r in runs])
        per_round = [len(r) / sum(r) for r in runs]
        res[key] = {
            "qps": float(np.median(per_round)),
            "qps_rounds": per_round,
            "p50_us": float(np.percentile(pooled, 50) * 1e6),
            "p99_us": float(np.percentile(pooled, 99) * 1e6),
        }
    return res


def batched_qps(
    cases: list[tuple[Lib, int]], queries: np.ndarray, rounds: int, threads: int
) -> dict[str, dict[str, float]]:
    """Batches of 32 on one thread, and every query in one call on all threads (taking turns)."""
    b32: dict[str, list[float]] = {lib.label: [] for lib, _ in cases}
    every: dict[str, list[float]] = {lib.label: [] for lib, _ in cases}
    for r in range(rounds):
        for lib, ef in cases[r % len(cases) :] + cases[: r % len(cases)]:
            lib.set_ef(ef)
            t = time.perf_counter()
            for i in range(0, queries.shape[0], 32):
                lib.search(queries[i : i + 32], K)
            b32[lib.label].append(queries.shape[0] / (time.perf_counter() - t))
            t = time.perf_counter()
            lib.search_threads(queries, K, threads)
            every[lib.label].append(queries.shape[0] / (time.perf_counter() - t))
    return {
        label: {
            "batch32_1t_qps": float(np.median(b32[label])),
            "batch_all_threads_qps": float(np.median(every[label])),
        }
        for label in b32
    }


def wheels(specs: list[str]) -> dict[str, dict[str, str | None]]:
    """The wheel file pip finds per platform for CPython 3.11 (None: no wheel)."""
    out: dict[str, dict[str, str | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            out[spec] = {}
            for plat in PLATFORMS:
                dest = Path(tmp) / f"{spec}-{plat}"
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
                cmd += ["--platform", plat, "--python-version", "3.11", spec, "-d", str(dest)]
                cmd += ["--quiet", "--disable-pip-version-check"]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
                got = sorted(p.name for p in dest.glob("*.whl")) if dest.exists() else []
                out[spec][plat] = got[0] if done.returncode == 0 and got else None
                log(f"wheel {spec} {plat}: {out[spec][plat]}")
    return out


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("hnswlib", "usearch", "numkong", "faiss-cpu", "numpy")}


# -- the run ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--ms", default="16,32")
    ap.add_argument("--ef-construction", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mt-rows", type=int, default=25_000, help="rows of the all-threads builds")
    ap.add_argument("--no-quantized", action="store_true", help="skip usearch i8 / f16")
    ap.add_argument("--no-wheels", action="store_true")
    ap.add_argument("--name", default="ann-libraries")
    a = ap.parse_args(argv)
    threads = os.cpu_count() or 1
    res: dict[str, Any] = {
        "command": " ".join(
            ["benchmarks/ann_libraries.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine_info(),
        "versions": versions(),
        "params": {
            "n": a.n,
            "dim": DIM,
            "queries": a.queries,
            "k": K,
            "target_recall": TARGET,
            "ef_construction": a.ef_construction,
            "rounds": a.rounds,
            "threads": threads,
            "mt_rows": min(a.n, a.mt_rows),
        },
    }
    log(json.dumps(res["machine"]))
    n = a.n
    data = clustered(n, DIM, seed=1)
    noise = clustered(a.queries, DIM, seed=2, centers=max(64, n // 1000))
    rng = np.random.default_rng(3)
    queries = data[rng.choice(n, a.queries, replace=False)] + 0.5 * noise / np.sqrt(DIM) * 4
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    half = rng.random(n) < 0.5  # the filter admits ~50 % of ids, scattered
    gone = np.sort(rng.choice(n, n // 10, replace=False))  # 10 % deleted
    live = np.ones(n, dtype=bool)
    live[gone] = False
    log("exact ground truth")
    truth = {
        "plain": exact_topk(data, queries, None),
        "filter50": exact_topk(data, queries, half),
        "deleted10": exact_topk(data, queries, live),
    }

    libs: list[Lib] = []
    for m in (int(x) for x in a.ms.split(",")):
        libs += [Hnswlib(m, a.ef_construction), Usearch(m, a.ef_construction)]
        if not a.no_quantized:
            libs += [Usearch(m, a.ef_construction, "f16"), Usearch(m, a.ef_construction, "i8")]
        libs.append(FaissHnsw(m, a.ef_construction))

    builds: dict[str, dict[str, Any]] = {}
    # One thread, in parts of 1,024 rows as streamrag's maintenance thread builds,
    # the libraries taking turns part by part; these graphs serve the searches.
    rates = build_all(libs, data, 1, 1024, keep=True)
    for lib in libs:
        builds[lib.label] = {
            "insert_per_s_1t": rates[lib.label],
            "subset_insert_per_s_1t": None,
            "subset_insert_per_s_all_threads": None,
            "serialized_bytes_per_vector": lib.serialized_bytes() / n,
            "usearch_memory_usage_per_vector": (
                lib.index.memory_usage / n if isinstance(lib, Usearch) else None
            ),
        }
    log("one thread: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
    # One thread against all threads on the first --mt-rows vectors, thrown away.
    sub = data[: min(n, a.mt_rows)]
    plain_libs = [lib for lib in libs if lib.name in ("hnswlib", "usearch", "faiss")]
    for key, th in (("subset_insert_per_s_1t", 1), ("subset_insert_per_s_all_threads", threads)):
        for label, rate in build_all(plain_libs, sub, th, 8192, keep=False).items():
            builds[label][key] = rate
    log(
        f"{sub.shape[0]:,} rows, 1 / {threads} threads: "
        + ", ".join(
            f"{k} {v['subset_insert_per_s_1t']:,.0f} / {v['subset_insert_per_s_all_threads']:,.0f}"
            for k, v in builds.items()
            if v["subset_insert_per_s_1t"] is not None
        )
    )
    res["build"] = builds

    # Plain search.
    sweeps = {lib.label: sweep(lib, lib.search, queries, truth["plain"]) for lib in libs}
    log("plain sweeps: " + ", ".join(f"{k} ef={v['ef']}" for k, v in sweeps.items()))
    ok = [lib for lib in libs if sweeps[lib.label]["ef"] is not None]
    timed = single_qps(
        [(lib.label, lib, lib.search, sweeps[lib.label]["ef"]) for lib in ok], queries, a.rounds
    )
    batched = batched_qps(
        [(lib, sweeps[lib.label]["ef"]) for lib in ok], queries, a.rounds, threads
    )
    plain: dict[str, Any] = {}
    for lib in libs:
        s = sweeps[lib.label]
        row: dict[str, Any] = {"ef": s["ef"], "recall": s["recall"], "curve": s["curve"]}
        if s["ef"] is not None:
            row |= timed[lib.label] | batched[lib.label]
        plain[lib.label] = row
    res["search"] = plain
    log("plain search timed")

    # Filtered search (50 % of ids pass).
    res["filter50"] = modes(libs, "filter50", half, queries, truth["filter50"], a.rounds)
    # Deletes: streamrag's over-fetching first (the graphs untouched), then each library's own.
    post = modes(libs, "deleted10", live, queries, truth["deleted10"], a.rounds, native=False)
    costs: dict[str, float] = {}
    for lib in libs:
        t = time.perf_counter()
        lib.delete(gone)
        costs[lib.label] = (time.perf_counter() - t) / gone.size * 1e6
    native = modes(
        libs, "deleted10", live, queries, truth["deleted10"], a.rounds, post_filter=False
    )
    for lib in libs:
        native[lib.label]["native"]["delete_us_each"] = costs[lib.label]
        native[lib.label]["postfilter"] = post[lib.label]["postfilter"]
    res["deleted10"] = native
    log("filters and deletes timed")

    if not a.no_wheels:
        v = res["versions"]
        res["wheels"] = wheels(
            [
                f"hnswlib=={v['hnswlib']}",
                f"usearch=={v['usearch']}",
                f"numkong=={v['numkong']}",
                f"faiss-cpu=={v['faiss-cpu']}",
            ]
        )
    res["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{a.name}.md").write_text(markdown(res))
    log(f"wrote {out / a.name}.json and .md")
    return 0


def modes(
    libs: list[Lib],
    case: str,
    allowed: np.ndarray,
    queries: np.ndarray,
    truth: np.ndarray,
    rounds: int,
    native: bool = True,
    post_filter: bool = True,
) -> dict[str, dict[str, Any]]:
    """Each library's own mechanism and streamrag's over-fetching, at recall ≥ 0.95."""
    fns: list[tuple[str, Lib, Search, str]] = []
    out: dict[str, dict[str, Any]] = {lib.label: {} for lib in libs}
    for lib in libs:
        if native:
            fn = lib.filtered(allowed) if case == "filter50" else lib.deleted_search(allowed)
            api = lib.filter_api if case == "filter50" else lib.delete_api
            if fn is not None:
                fns.append((lib.label, lib, fn, "native"))
                out[lib.label]["native"] = {"api": api or lib.filter_api}
            else:
                out[lib.label]["native"] = {"api": None}
        if post_filter:
            fns.append((lib.label, lib, postfilter(lib, allowed), "postfilter"))
            out[lib.label]["postfilter"] = {"api": "over-fetch and drop"}
    cases = []
    for label, lib, fn, how in fns:
        s = sweep(lib, fn, queries, truth)
        out[label][how] |= {"ef": s["ef"], "recall": s["recall"], "curve": s["curve"]}
        if s["ef"] is not None:
            cases.append((f"{label}/{how}", lib, fn, s["ef"]))
    for key, t in single_qps(cases, queries, rounds).items():
        label, how = key.rsplit("/", 1)
        out[label][how] |= t
    log(f"{case}: " + ", ".join(f"{c[0]} ef={c[3]}" for c in cases))
    return out


# -- report ----------------------------------------------------------------------


def _tag(wheel: str | None) -> str:
    """A wheel's platform tag (the newest it needs), or none."""
    return "**none**" if wheel is None else wheel.removesuffix(".whl").rsplit("-", 1)[1]


def ratios(res: dict[str, Any]) -> list[str]:
    """hnswlib's single-query QPS over each other library's, each at its smallest ef ≥ target."""
    out = [
        "hnswlib ÷ the others, single-query QPS at recall@10 ≥ 0.95 (above 1: hnswlib faster):",
        "",
    ]
    plain = res["search"]
    for label, r in plain.items():
        if not label.startswith("hnswlib ") or "qps" not in r:
            continue
        m = label.split(" ", 1)[1]
        for other, o in plain.items():
            if other.endswith(m) and not other.startswith("hnswlib") and "qps" in o:
                rounds = [a / b for a, b in zip(r["qps_rounds"], o["qps_rounds"], strict=True)]
                out.append(
                    f"- {label} ÷ {other}: {r['qps'] / o['qps']:.2f} "
                    f"(per pass {', '.join(f'{x:.2f}' for x in rounds)})"
                )
    return out


def _bytes(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f} B"


def _n(v: float | None, fmt: str = ",.0f") -> str:
    return "—" if v is None else format(v, fmt)


def markdown(res: dict[str, Any]) -> str:
    m, p, v = res["machine"], res["params"], res["versions"]
    vers = ", ".join(f"{k} {x}" for k, x in v.items())
    lines = [
        "# ANN libraries: hnswlib, usearch, FAISS HNSW",
        "",
        f"Run {m['date_utc']} with `{res['command']}`.",
        "",
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; {vers}. 1-min load average {m['loadavg_1m_at_start']:.2f} at start, "
        f"{m['loadavg_1m_at_end']:.2f} at end (the machine is shared: compare libraries within "
        "this run).",
        "",
        f"{p['n']:,} clustered unit vectors × {p['dim']} (float32), {p['queries']:,} queries "
        "near them, exact ground truth by inner product. Every graph: inner product, the same M "
        f"and ef_construction {p['ef_construction']}. QPS: median of {p['rounds']} passes "
        "over the queries, the libraries taking turns every 50 queries; builds take turns every "
        "1,024 rows (8,192 in the thread comparison). ef: the smallest of "
        f"{', '.join(map(str, EFS))} with recall@10 ≥ {p['target_recall']}. "
        "usearch-f16 / -i8 store vectors in half precision / 8-bit integers (their scores are "
        "approximate: streamrag would re-score their candidates).",
        "",
        "## Search (one query per call, one thread: how streamrag calls it)",
        "",
        "| library | ef | recall@10 | single QPS | p50 / p99 µs | batch 32, 1 thread | "
        f"one batch, {p['threads']} threads |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for label, r in res["search"].items():
        if r["ef"] is None:
            lines.append(f"| {label} | — | {r['recall']:.3f} (max) | — | — | — | — |")
            continue
        lines.append(
            f"| {label} | {r['ef']} | {r['recall']:.3f} | {r['qps']:,.0f} | "
            f"{r['p50_us']:.0f} / {r['p99_us']:.0f} | {r['batch32_1t_qps']:,.0f} | "
            f"{r['batch_all_threads_qps']:,.0f} |"
        )
    lines += ["", *ratios(res)]
    lines += [
        "",
        "## Build",
        "",
        f"| library | insert/s, 1 thread, {p['n']:,} | insert/s, 1 / {p['threads']} threads, "
        f"first {p['mt_rows']:,} | serialized / vector | usearch's memory_usage / vector |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, b in res["build"].items():
        mt = "—"
        if b["subset_insert_per_s_1t"] is not None:
            mt = f"{b['subset_insert_per_s_1t']:,.0f} / {b['subset_insert_per_s_all_threads']:,.0f}"
        lines.append(
            f"| {label} | {b['insert_per_s_1t']:,.0f} | {mt} | "
            f"{_bytes(b['serialized_bytes_per_vector'])} | "
            f"{_bytes(b['usearch_memory_usage_per_vector'])} |"
        )
    for case, title in (
        ("filter50", "Filtered search: a predicate admits 50 % of ids"),
        ("deleted10", "Deletes: 10 % of ids deleted"),
    ):
        extra = " | µs per delete" if case == "deleted10" else ""
        lines += [
            "",
            f"## {title}",
            "",
            "Native: the library's own mechanism. Over-fetch: streamrag's search path (ask for "
            "k / share × 1.25 + 2 candidates, drop those that fail, ask for 4× more when short), "
            "which works with any library.",
            "",
            f"| library | mechanism | ef | recall@10 | single QPS | p50 / p99 µs{extra} |",
            "|---|---|---:|---:|---:|---|" + ("---:|" if extra else ""),
        ]
        for label, r in res[case].items():
            for how in ("native", "postfilter"):
                x = r.get(how)
                if x is None:
                    continue
                cost = ""
                if extra:
                    cost = " | " + (_n(x.get("delete_us_each"), ",.2f") if how == "native" else "0")
                if x.get("api") is None:
                    lines.append(f"| {label} | none in the Python API | — | — | — | —{cost} |")
                    continue
                if x.get("ef") is None:
                    lines.append(
                        f"| {label} | {x['api']} | — | {x['recall']:.3f} (max) | — | —{cost} |"
                    )
                    continue
                lines.append(
                    f"| {label} | {x['api']} | {x['ef']} | {x['recall']:.3f} | {x['qps']:,.0f} | "
                    f"{x['p50_us']:.0f} / {x['p99_us']:.0f}{cost} |"
                )
    if "wheels" in res:
        lines += [
            "",
            "## Wheels for CPython 3.11 (`pip download --only-binary=:all: --platform P`)",
            "",
            "| package | " + " | ".join(PLATFORMS) + " |",
            "|---|" + "---|" * len(PLATFORMS),
        ]
        for spec, row in res["wheels"].items():
            cells = [_tag(row[plat]) for plat in PLATFORMS]
            lines.append(f"| {spec} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(
            "A cell names the wheel's platform tag: the oldest system it runs on (manylinux_2_28: "
            "glibc 2.28, e.g. Debian 10, RHEL 8; manylinux2014 is glibc 2.17). **none**: pip "
            "would build from the source distribution, which needs a C++ compiler. numkong is a "
            "dependency of usearch (its SIMD kernels)."
        )
    lines += ["", "## Recall per ef (plain search)", ""]
    efs = sorted({int(e) for r in res["search"].values() for e in r["curve"]})
    lines += [
        "| library | " + " | ".join(str(e) for e in efs) + " |",
        "|---|" + "---:|" * len(efs),
    ]
    for label, r in res["search"].items():
        curve = {int(e): x for e, x in r["curve"].items()}
        cells = [f"{curve[e]:.3f}" if e in curve else "" for e in efs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
