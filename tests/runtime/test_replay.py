"""Stream = batch: a live run over input shuffled within the bound equals `streamrag replay`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from streamrag.cli import app
from streamrag.config import load_settings
from streamrag.eventtime import WindowResult
from streamrag.runtime.replay import index_digest, window_finals
from streamrag.runtime.service import Service
from streamrag.testing import ManualClock, change_line
from streamrag.timing import US_PER_S, format_timestamp

MINUTE = 60 * US_PER_S
T0 = 1_714_521_600 * US_PER_S  # 2024-05-01T00:00:00Z
BOUND = 10 * MINUTE
WORDS = [
    *("alpha", "beta", "gamma", "delta", "epsilon", "zeta"),
    *("eta", "theta", "iota", "kappa", "lambda", "mu"),
]

CONFIG: dict[str, Any] = {
    "embedder": {"class": "hashing", "args": {"dim": 64}},
    "chunking": {"max_tokens": 12, "overlap_tokens": 2, "tokens": "words"},
    "batcher": {"max_batch_size": 16, "max_delay_ms": 20},
    "event_time": {
        "max_out_of_orderness_ms": BOUND // 1000,
        "windows": [
            {"name": "per_domain_hourly", "kind": "tumbling", "size_ms": 3_600_000},
            {
                "name": "score_2h",
                "kind": "sliding",
                "size_ms": 7_200_000,
                "slide_ms": 1_800_000,
                "aggregate": "sum",
                "value": "metadata.score",
            },
            {"name": "edits", "kind": "session", "gap_ms": 1_200_000, "key": ["doc_id"]},
        ],
    },
}


def _corpus(seed: int) -> list[tuple[int, str]]:
    """300 versions and deletes of 40 documents over 12 hours, at distinct event times.

    They are about 2.4 minutes apart: a 10-minute bound reorders them heavily.
    """
    rng = random.Random(seed)
    times = rng.sample(range(0, 12 * 60), 300)
    lines = []
    for i, minute in enumerate(sorted(times)):
        doc = f"doc-{rng.randrange(40)}"
        ts = T0 + minute * MINUTE + i  # distinct, so no tie is broken by offset
        when = format_timestamp(ts)
        if rng.random() < 0.1:
            lines.append((ts, change_line(doc, when, op="delete")))
            continue
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40)))
        domain = rng.choice(["ops", "hr", "it"])
        meta = {"score": rng.randrange(10)} if rng.random() < 0.9 else {}
        lines.append((ts, change_line(doc, when, text, domain=domain, metadata=meta)))
    return lines


def _shuffled_within_bound(lines: list[tuple[int, str]], seed: int) -> list[str]:
    rng = random.Random(seed)
    keyed = [(ts + rng.randrange(BOUND), i, line) for i, (ts, line) in enumerate(lines)]
    return [line for _, _, line in sorted(keyed)]


def _live(path: Path, arrival: list[str], state: Path) -> tuple[Service, list[Any]]:
    settings = load_settings(
        overrides={
            **_flat(CONFIG),
            "source.path": str(path),
            "state_dir": str(state),
        },
        environ={},
    )
    clock = ManualClock(1_800_000_000 * US_PER_S)
    service = Service(settings, clock=clock)
    results: list[tuple[str, WindowResult]] = []
    service.pipeline.on_window.append(lambda name, r: results.append((name, r)))
    rng = random.Random(3)
    path.write_text("")
    at = 0
    while at < len(arrival):
        n = rng.randrange(1, 9)
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in arrival[at : at + n]))
        at += n
        for _ in range(rng.randrange(1, 3)):
            clock.advance_ms(rng.randrange(0, 30))
            service.pipeline.step()
    service.pipeline.run_until_caught_up(final=True)
    service.pipeline.finish_event_time()
    service.pipeline.close()
    return service, results


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in ("args",):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _replay_cli(tmp: Path, data: Path, name: str) -> tuple[list[Any], list[Any]]:
    cfg = tmp / "config.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = tmp / name
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(data),
            "--config",
            str(cfg),
            "--out",
            str(out),
            "--state",
            str(tmp / (name + "-state")),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (out / "index.jsonl").read_text().splitlines()]
    wins = [json.loads(x) for x in (out / "windows.jsonl").read_text().splitlines()]
    return rows, wins


def test_live_run_shuffled_within_the_bound_equals_replay(tmp_path: Path) -> None:
    corpus = _corpus(seed=11)
    arrival = _shuffled_within_bound(corpus, seed=5)
    in_order = [line for _, line in corpus]
    moved = sum(a != b for a, b in zip(arrival, in_order, strict=True))
    assert moved > len(corpus) // 2  # really out of order
    live_file = tmp_path / "live.jsonl"
    service, results = _live(live_file, arrival, tmp_path / "live-state")
    live_index = index_digest(service.index)
    live_windows = json.loads(json.dumps(window_finals(results)))
    assert service.pipeline.stats.window_late == 0  # within the bound nothing is late
    assert service.pipeline.stats.commits > 5  # it really ran as many micro-batches
    assert len(live_index) > 40
    assert {w["window"] for w in live_windows} == {"per_domain_hourly", "score_2h", "edits"}

    # The same file, replayed as one bounded batch: the same index, chunk by chunk.
    rows, wins = _replay_cli(tmp_path, live_file, "same")
    assert rows == live_index
    assert wins == live_windows

    # The input in event-time order, in another file: still the same.
    ordered = tmp_path / "ordered.jsonl"
    ordered.write_text("".join(line + "\n" for _, line in corpus))
    rows, wins = _replay_cli(tmp_path, ordered, "ordered")
    assert rows == live_index
    assert wins == live_windows
