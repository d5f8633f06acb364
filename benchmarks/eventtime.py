"""Benchmarks of the event-time layer and of micro-batch sizing.

* ``window_count``: events/s through a keyed sliding-window count (the operator's
  columnar path, fed micro-batches and a watermark after each), against numpy
  computing the same counts in one pass (``np.unique`` over key × window codes) —
  the floor for this work on this machine. Both results are checked equal.
* ``embed_curve``: latency and throughput of one embed call at batch sizes 1, 4,
  16, 64, and the batch size the adaptive controller settles on for a latency
  target, measured against the same embedder in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from streamrag.batching import AdaptiveController
from streamrag.eventtime import Count, Sliding, WindowedAggregation

US = 1_000_000


def _events(n: int, n_keys: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n events over n_keys keys, ~1,000 events per second of event time, locally shuffled."""
    rng = np.random.default_rng(seed)
    keys = np.array([f"k{i}" for i in range(n_keys)])[rng.zipf(1.3, n) % n_keys]
    times = np.arange(n, dtype=np.int64) * 1_000 + rng.integers(0, 500_000, n)  # 0.5 s disorder
    return keys, times


def window_count(
    n_events: int = 2_000_000,
    n_keys: int = 1_000,
    size_s: int = 5,
    slide_s: int = 1,
    batch: int = 50_000,
    repeats: int = 3,
) -> dict[str, Any]:
    """Keyed sliding-window count: streamrag's operator vs one numpy pass."""
    keys, times = _events(n_events, n_keys, seed=3)
    size, slide = size_s * US, slide_s * US
    bound = 500_000
    key_list = keys.tolist()  # Python strings, as the pipeline hands the operator its keys

    def ours() -> dict[tuple[str, int], int]:
        op = WindowedAggregation(Sliding(size, slide), Count())
        finals: dict[tuple[str, int], int] = {}
        max_seen = -(2**63)
        for lo in range(0, n_events, batch):
            k, t = key_list[lo : lo + batch], times[lo : lo + batch]
            fired, late = op.process(k, t)
            assert not late
            max_seen = max(max_seen, int(t.max()))
            for r in [*fired, *op.advance(max_seen - bound - 1)]:
                finals[(str(r.key), r.window.start)] = r.value
        for r in op.finish():
            finals[(str(r.key), r.window.start)] = r.value
        return finals

    def raw() -> dict[tuple[str, int], int]:
        uniq, codes = np.unique(keys, return_inverse=True)
        last = times - times % slide
        per = size // slide
        starts = (last[:, None] - slide * np.arange(per)[None, :]).ravel()
        kc = np.repeat(codes, per)
        w0 = starts.min()
        combined = kc.astype(np.int64) * ((starts.max() - w0) // slide + 1) + (starts - w0) // slide
        vals, counts = np.unique(combined, return_counts=True)
        span = (starts.max() - w0) // slide + 1
        return {
            (str(uniq[v // span]), int(w0 + (v % span) * slide)): int(c)
            for v, c in zip(vals.tolist(), counts.tolist(), strict=True)
        }

    best_ours = best_raw = float("inf")
    got = want = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        got = ours()
        best_ours = min(best_ours, time.perf_counter() - t0)
        t0 = time.perf_counter()
        want = raw()
        best_raw = min(best_raw, time.perf_counter() - t0)
    assert got == want, "the operator and numpy disagree on the window counts"
    return {
        "events": n_events,
        "keys": n_keys,
        "window": f"sliding {size_s} s / {slide_s} s",
        "micro_batch": batch,
        "windows_emitted": len(got or {}),
        "streamrag_events_per_s": n_events / best_ours,
        "numpy_events_per_s": n_events / best_raw,
        "ratio": best_raw / best_ours,
    }


def embed_curve(
    embed: Callable[[Sequence[str]], Any],
    texts: Sequence[str],
    *,
    sizes: Sequence[int] = (1, 4, 16, 64),
    target_latency_s: float = 0.2,
    budget_s: float = 20.0,
    max_size: int = 256,
) -> dict[str, Any]:
    """Per-call latency and throughput by batch size; the controller's chosen point."""
    embed(list(texts[:4]))  # warm up (model load, caches)
    curve = []
    cursor = 0

    def take(n: int) -> list[str]:
        nonlocal cursor
        out = [texts[(cursor + i) % len(texts)] for i in range(n)]
        cursor += n
        return out

    per_size_budget = budget_s / (len(sizes) + 1)
    for n in sizes:
        lat: list[float] = []
        started = time.perf_counter()
        while len(lat) < 3 or (time.perf_counter() - started < per_size_budget and len(lat) < 50):
            batch = take(n)
            t0 = time.perf_counter()
            embed(batch)
            lat.append(time.perf_counter() - t0)
        med = float(np.median(lat))
        curve.append(
            {"batch": n, "calls": len(lat), "latency_ms": med * 1000, "items_per_s": n / med}
        )
    controller = AdaptiveController(
        min_size=1, max_size=max_size, target_latency_s=target_latency_s, initial=4
    )
    started = time.perf_counter()
    steps = 0
    while steps < 40 and time.perf_counter() - started < per_size_budget * 2:
        n = controller.target
        t0 = time.perf_counter()
        embed(take(n))
        controller.observe(n, time.perf_counter() - t0, queued=10**9)  # a deep backlog
        steps += 1
    tail = controller.history[-5:]
    chosen = {
        "batch": controller.target,
        "latency_ms": float(np.median([d.latency_s for d in tail])) * 1000,
        "items_per_s": float(np.median([d.batch / d.latency_s for d in tail])),
        "target_latency_ms": target_latency_s * 1000,
        "steps": steps,
        "path": [d.target for d in controller.history],
    }
    return {"curve": curve, "controller": chosen}
