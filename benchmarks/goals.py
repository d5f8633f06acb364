"""The engine's cost against its goals: one table from the results of one `make bench`.

    .venv/bin/python benchmarks/goals.py     # last step of `make bench`

Reads what the other benchmarks of the run wrote under ``benchmarks/results/``
(``latest.json`` from run.py, ``serving.json`` (from its serving section, or
``serving.py section`` alone), ``index.json``, ``contention.json``, and
``freshness-1m.json``, which is run by hand) and, when it
is there, the side-by-side run with the peer (``side-by-side/*.json``, made by
``../shared/peer-bench/pathway/run_t2.sh``, see benchmarks/README.md). Every
goal is a ratio measured within one benchmark's run (the machine is shared and
noisy; a ratio of two figures taken minutes apart on it means little). A goal
whose figure is missing from these files is listed as "not measured", never
left out. Writes ``results/goals.{json,md}``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from run import Row, _fmt

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _goal(
    goal: str, value: float | None, bound: float, higher: bool, source: str, unit: str = "×"
) -> Row:
    """One goal as a row of run.py's table: the figure, its bound, where it comes from."""
    return Row(source, goal, value, unit, bound, higher)


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _get(d: Any, *keys: Any) -> Any:
    for key in keys:
        if d is None:
            return None
        d = d[key] if isinstance(d, list) else d.get(key)
    return d


def _side_by_side() -> dict[str, dict[str, float]]:
    """Median of each figure per engine label over the side-by-side runs."""
    folder = RESULTS / "side-by-side"
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*-r*.json")):
        data = json.loads(path.read_text())
        label = data["label"].rsplit("-n", 1)[0]
        runs[label].extend(data.get("runs", []))
    figures = {
        "ingest": ("ingest", "docs_per_s"),
        "fresh_p99": ("freshness_ms", "p99"),
        "c1_p50": ("query_c1_ms", "p50"),
        "c16_qps": ("query_c16_ms", "qps"),
    }
    out: dict[str, dict[str, float]] = {}
    for label, items in runs.items():
        row: dict[str, float] = {}
        for name, path in figures.items():
            vals = [v for v in (_get(r, *path) for r in items) if isinstance(v, int | float)]
            if vals:
                row[name] = statistics.median(vals)
        out[label] = row
    return out


def goals() -> list[Row]:
    """Every goal, measured or not."""
    latest = _load("latest.json")
    index = _load("index.json")
    contention = _load("contention.json")
    peers = _side_by_side()
    out: list[Row] = []
    run = "run.py (latest.json)"
    out.append(
        _goal(
            "ingest, hashing embedder: pipeline / bare embedder",
            _get(latest, "ingest_hashing", "ratio"),
            0.8,
            True,
            run,
        )
    )
    out.append(
        _goal(
            "ingest, the default embedder (MiniLM, ONNX int8): pipeline / bare embedder",
            _get(latest, "ingest_minilm", "ratio"),
            0.9,
            True,
            run,
        )
    )
    # Both indexes over the same documents in one process, searched in alternated rounds.
    kinds = _get(latest, "ingest_hashing", "search_against", "kinds")
    default_ms = _get(kinds, "lsm", "batch1_median_ms")
    exact_ms = _get(kinds, "exact", "batch1_median_ms")
    out.append(
        _goal(
            "20k documents, one query: exact index time / default index time",
            exact_ms / default_ms if default_ms and exact_ms else None,
            1.0,
            True,
            run + ", in-process, alternated",
        )
    )
    c1 = next((r for r in _get(latest, "server", "load") or [] if r.get("concurrency") == 1), None)
    out.append(
        _goal(
            "single query over HTTP, p50",
            None if c1 is None else c1.get("p50_ms"),
            2.0,
            False,
            run,
            "ms",
        )
    )
    serving = _load("serving.json")
    emb = _get(serving, "serving", "embedder") or "minilm"  # files before it was named: torch
    emb_name = {"minilm-onnx": "MiniLM, ONNX int8, the default", "minilm": "MiniLM, PyTorch"}
    for c in (16, 64):
        load = _get(serving, "serving", "modes", "batching_on", "load") or []
        r = next((x for x in load if x.get("concurrency") == c), None)
        out.append(
            _goal(
                f"serving with {emb_name.get(emb, emb)}, {c} clients: "
                "QPS / raw embed+search ceiling",
                None if r is None else r.get("ratio_to_raw"),
                0.8,
                True,
                "serving.py (serving.json)",
            )
        )
    for name in ("hashing", "minilm"):
        out.append(
            _goal(
                f"query p99 while ingest runs flat out / at rest "
                f"({_get(contention, 'cases', name, 'embedder') or name})",
                _get(contention, "cases", name, "p99_ratio"),
                1.5,
                False,
                "contention.py",
            )
        )
    size = _get(index, "sizes", 0)
    for mode, bound in (("single", 0.9), ("batch32", 0.95)):
        out.append(
            _goal(
                f"ANN, {mode}: streamrag QPS / raw library on the same graph "
                "(median over alternating rounds)",
                _get(size, "search", mode, "ratio", "qps_paired_median"),
                bound,
                True,
                "index.py",
            )
        )
    ours = peers.get("streamrag-tail-default", {})
    pw = [v for k, v in peers.items() if k.startswith("pathway")]

    def best(name: str, higher: bool) -> float | None:
        vals = [p[name] for p in pw if name in p]
        if not vals:
            return None
        return max(vals) if higher else min(vals)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    sbs = "side-by-side with the peer (side-by-side/)"
    out.append(
        _goal(
            "ingest docs/s / the peer's best",
            ratio(ours.get("ingest"), best("ingest", True)),
            3.0,
            True,
            sbs,
        )
    )
    out.append(
        _goal(
            "QPS at 16 clients / the peer's best",
            ratio(ours.get("c16_qps"), best("c16_qps", True)),
            4.0,
            True,
            sbs,
        )
    )
    out.append(
        _goal(
            "freshness p99 / the peer's best",
            ratio(ours.get("fresh_p99"), best("fresh_p99", False)),
            0.5,
            False,
            sbs,
        )
    )
    big = _load("freshness-1m.json")
    out.append(
        _goal(
            "freshness p99 while 1,500 upserts/s stream into a 1M-row index",
            _get(big, "result", "p99_ms"),
            250.0,
            False,
            "freshness_1m.py (run by hand, ~15 min)",
            "ms",
        )
    )
    return out


def markdown(items: list[Row]) -> str:
    """The table."""
    latest = _load("latest.json") or {}
    m = latest.get("machine", {})
    lines = [
        "# streamrag: the engine's cost against its goals",
        "",
        f"From the results of `make bench` (run.py of {m.get('date_utc', '?')}); machine: "
        f"{m.get('cpu_count', '?')} cores, {m.get('cpu_model', '?')}, {m.get('ram_gib', '?')} GiB "
        "RAM, shared. Each figure is a ratio within one benchmark's run.",
        "",
        "When each file was made: "
        + "; ".join(
            f"{name} {_get(data, 'machine', 'date_utc') or '?'}"
            for name in ("latest.json", "serving.json", "index.json", "contention.json")
            if (data := _load(name)) is not None
        )
        + " (the side-by-side run: side-by-side/README.md).",
        "",
        "| goal | measured | bound | met? | from |",
        "|---|---:|---:|---|---|",
    ]
    for g in items:
        value = "not measured" if g.value is None else f"{_fmt(g.value)} {g.unit}"
        bound = f"{g.target_text()} {g.unit}"
        lines.append(f"| {g.metric} | {value} | {bound} | {g.met() or '—'} | {g.section} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    items = goals()
    (RESULTS / "goals.json").write_text(
        json.dumps([{**asdict(g), "met": g.met()} for g in items], indent=1)
    )
    text = markdown(items)
    (RESULTS / "goals.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
