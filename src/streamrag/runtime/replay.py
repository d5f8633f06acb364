"""Replay: the pipeline over a bounded input, as a batch job, with the same stage code.

A live job and a replay of the same input must end with the same index and the
same final window results (invariant 3, stream = batch): same chunk ids, same
versions, same vectors for a deterministic embedder, whatever the arrival order
within the lateness bound. :func:`replay` reads the input to its end, sets the
watermark to +inf so every window fires, commits everything and returns the
service. :func:`index_digest` lists the index in a canonical order, so two runs
can be compared chunk by chunk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamrag.chunking import chunk_id_text
from streamrag.config import Settings
from streamrag.embed.base import Embedder, Loadable
from streamrag.eventtime import WindowResult
from streamrag.index.base import VectorIndex
from streamrag.runtime.service import Service
from streamrag.sources.base import Source
from streamrag.timing import Clock, format_timestamp

__all__ = ["ReplayResult", "index_digest", "replay", "window_finals"]


@dataclass
class ReplayResult:
    """A finished replay: the service (index, stats) and every window result in order."""

    service: Service
    windows: list[tuple[str, WindowResult]] = field(default_factory=list)


def replay(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    source: Source | None = None,
    clock: Clock | None = None,
) -> ReplayResult:
    """Run the configured pipeline over its input to the end, then fire every window."""
    service = Service(settings, embedder=embedder, source=source, clock=clock)
    result = ReplayResult(service)
    pipeline = service.pipeline
    pipeline.on_window.append(lambda name, r: result.windows.append((name, r)))
    if isinstance(service.embedder, Loadable):
        service.embedder.load()
    pipeline.run_until_caught_up(final=True)
    pipeline.finish_event_time()
    pipeline.close()
    return result


def index_digest(index: VectorIndex) -> list[dict[str, Any]]:
    """Every live chunk, canonically ordered, with a hash of its vector's bytes.

    Epochs, offsets and sources are left out: they depend on how the input was
    cut into batches and files, not on what the index holds.
    """
    rows = []
    for hit, vector in index.export():
        rows.append(
            {
                "tenant": hit.tenant,
                "doc_id": hit.doc_id,
                "position": hit.position,
                "chunk_id": chunk_id_text(hit.chunk_id),
                "event_time": format_timestamp(hit.event_time),
                "domain": hit.domain,
                "text": hit.text,
                "embedder_version": hit.embedder_version,
                "vector_sha256": hashlib.sha256(vector.astype("<f4").tobytes()).hexdigest(),
            }
        )
    rows.sort(key=lambda r: (r["tenant"], r["doc_id"], r["position"]))
    return rows


def window_finals(results: Sequence[tuple[str, WindowResult]]) -> list[dict[str, Any]]:
    """The last result of every window: what an accumulating window finally says."""
    last: dict[tuple[str, str, int, int], WindowResult] = {}
    for name, r in results:
        last[(name, repr(r.key), r.window.start, r.window.end)] = r
    return [
        {
            "window": name,
            "key": r.key if not isinstance(r.key, tuple) else list(r.key),
            "start": format_timestamp(r.window.start),
            "end": format_timestamp(r.window.end),
            "value": r.value,
        }
        for (name, _, _, _), r in sorted(last.items())
    ]
