"""Shared fixtures: a manual clock, JSONL inputs and pipelines wired for tests."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamrag.batching import MicroBatcher
from streamrag.chunking import TokenSplitter
from streamrag.embed.base import Embedder
from streamrag.index import ExactIndex
from streamrag.ingest import DeadLetterStore
from streamrag.runtime import Pipeline
from streamrag.runtime.service import Service
from streamrag.sources import JsonlSource
from streamrag.testing import CountingEmbedder, FakeEmbedder, ManualClock, ScriptedSource

BATCHER_ARGS = (
    "max_batch_size",
    "max_delay_ms",
    "max_batch_tokens",
    "max_pending",
    "max_pending_bytes",
    "partition",
    "controller",
    "tick_us",
)


def with_batcher(kwargs: dict[str, Any], clock: ManualClock) -> dict[str, Any]:
    """Pipeline arguments with the batcher's own (``max_batch_size``, ...) made into one."""
    args = {k: kwargs.pop(k) for k in BATCHER_ARGS if k in kwargs}
    args.setdefault("max_batch_size", 256)
    args.setdefault("max_delay_ms", 20)
    kwargs["batcher"] = MicroBatcher(clock=clock, **args)
    return kwargs


@pytest.fixture(autouse=True)
def _restore_the_collector() -> Iterator[None]:
    """Undo what a test's ``streamrag run`` did to Python's garbage collector (process-wide)."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.fixture(autouse=True)
def _stop_forgotten_services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stop every Service a test made and did not stop, when the test ends.

    A service's sources hold files and folder-watch threads (an inotify
    instance each, of 128 per user by default): left open by hundreds of tests
    they exhaust the limit and later tests see "too many open files".
    """
    made: list[Service] = []
    stopped: set[int] = set()
    init, stop = Service.__init__, Service.stop

    def tracked_init(self: Service, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    def tracked_stop(self: Service) -> None:
        stopped.add(id(self))
        stop(self)

    monkeypatch.setattr(Service, "__init__", tracked_init)
    monkeypatch.setattr(Service, "stop", tracked_stop)
    yield
    for svc in made:
        if id(svc) not in stopped:
            with contextlib.suppress(Exception):  # the test is over: only resources matter
                stop(svc)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000_000)


@pytest.fixture
def jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Append lines to a JSONL file (created on first use) and return its path."""
    path = tmp_path / "changes.jsonl"

    def write(*lines: str, name: str | None = None) -> Path:
        target = tmp_path / name if name else path
        with open(target, "a", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        return target

    return write


PipelineFactory = Callable[..., Pipeline]


@pytest.fixture
def pipeline_factory(tmp_path: Path, clock: ManualClock) -> PipelineFactory:
    """Build a pipeline over a source with the fake embedder and a manual clock."""

    def build(
        source: JsonlSource | ScriptedSource,
        *,
        embedder: Embedder | None = None,
        **kwargs: Any,
    ) -> Pipeline:
        emb = embedder or CountingEmbedder(FakeEmbedder())
        kwargs.setdefault("splitter", TokenSplitter(max_tokens=32, overlap_tokens=4))
        return Pipeline(
            source=source,
            embedder=emb,
            index=ExactIndex(emb.dim, initial_capacity=4, clock=clock),
            dead_letters=DeadLetterStore(tmp_path / "dead.jsonl", truncate=True),
            clock=clock,
            **with_batcher(kwargs, clock),
        )

    return build
