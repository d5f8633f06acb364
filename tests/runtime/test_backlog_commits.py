"""A backlog shares commits: due micro-batches go into one epoch within the latency target.

While a backlog waits and batches are as large as ``max_batch_size`` allows,
one commit takes as many due micro-batches as the embedder gets through in the
adaptive controller's latency target (:meth:`~streamrag.runtime.flush.Flusher._backlog_room`);
each is still embedded in calls of at most the batch size. A change that
arrives alone still commits alone, at its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.batching import AdaptiveController
from streamrag.chunking import TokenSplitter
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.ingest import DeadLetterStore
from streamrag.runtime import Pipeline
from streamrag.runtime.replay import index_digest
from streamrag.testing import FakeEmbedder, ListSink, ManualClock, ScriptedSource, change_line
from tests.conftest import PipelineFactory, with_batcher

T0 = "2024-01-01T00:00:00Z"


class Timed(FakeEmbedder):
    """The fake embedder taking ``us_per_text`` of the manual clock per text; keeps call sizes."""

    def __init__(self, clock: ManualClock, us_per_text: int) -> None:
        super().__init__()
        self.clock = clock
        self.us_per_text = us_per_text
        self.calls: list[int] = []

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        self.clock.advance_us(self.us_per_text * len(texts))
        return super().embed_many(texts)


def _pipeline(
    factory: PipelineFactory,
    clock: ManualClock,
    src: ScriptedSource,
    sink: ListSink,
    *,
    latency_s: float = 0.2,
    adaptive: bool = True,
) -> tuple[Pipeline, Timed]:
    emb = Timed(clock, us_per_text=1000)  # 1000 texts/s: 200 in 0.2 s
    ctl = AdaptiveController(min_size=1, max_size=4, target_latency_s=latency_s, initial=4)
    p = factory(
        src,
        embedder=emb,
        max_batch_size=4,
        max_pending=16,
        controller=ctl if adaptive else None,
        on_commit=[sink.on_commit],
    )
    return p, emb


def _lines(n: int, start: int = 0) -> list[str]:
    return [change_line(f"d{i}", T0, f"text number {i}") for i in range(start, start + n)]


def _caught_up(
    factory: PipelineFactory, clock: ManualClock, lines: list[str], **kw: Any
) -> tuple[Pipeline, ListSink]:
    """A pipeline that has read and committed ``lines``, and what it committed."""
    src, sink = ScriptedSource(), ListSink()
    p, _ = _pipeline(factory, clock, src, sink, **kw)
    src.push(*lines)
    p.run_until_caught_up()
    return p, sink


def test_a_backlog_commits_several_micro_batches_per_epoch(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src, sink = ScriptedSource(), ListSink()
    p, emb = _pipeline(pipeline_factory, clock, src, sink)
    src.push(*_lines(40))
    p.run_until_caught_up()
    sizes = [len(b.docs) for b, _ in sink.commits]
    assert sum(sizes) == 40
    assert sizes[0] == 4  # no rate measured yet: one micro-batch
    assert max(sizes) > 4  # then the backlog shares commits
    assert len(sizes) < 10
    assert max(emb.calls) <= 4  # each embed call is still one micro-batch at most
    assert p.stats.applied == 40
    assert p.stats.commits == len(sizes)
    assert p.index.epoch == len(sizes)
    assert p.uncommitted == 0


def test_a_lone_change_still_commits_alone_at_its_deadline(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src, sink = ScriptedSource(), ListSink()
    p, _ = _pipeline(pipeline_factory, clock, src, sink)
    src.push(*_lines(16))
    p.run_until_caught_up()  # the embedder's rate is known now
    commits = len(sink.commits)
    src.push(*_lines(1, start=100))
    p.step()
    assert len(sink.commits) == commits  # not due: waits for its deadline
    clock.advance_ms(20)
    p.step()
    assert len(sink.commits) == commits + 1
    assert [d.doc_id for d in sink.commits[-1][0].docs] == ["d100"]
    assert p.stats.last_freshness_us == 21_000  # its deadline, and 1 ms embedding it


def test_batches_the_controller_still_sizes_commit_one_each(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    # 2 ms per batch at most: the controller keeps batches at 2 texts, under max_batch_size.
    p, sink = _caught_up(pipeline_factory, clock, _lines(20), latency_s=0.002)
    assert p.batcher.target_size < p.batcher.max_batch_size
    assert max(len(b.docs) for b, _ in sink.commits) <= 4
    assert p.stats.applied == 20


def test_without_the_controller_one_micro_batch_per_commit(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    _, sink = _caught_up(pipeline_factory, clock, _lines(20), adaptive=False)
    assert [len(b.docs) for b, _ in sink.commits] == [4, 4, 4, 4, 4]


def _hostile(n_docs: int = 8, versions: int = 6) -> list[str]:
    """Many versions per document, late ones among them, deletes, and lines that cannot be read."""
    rng = np.random.default_rng(5)
    lines = []
    for v in range(versions):
        for i in rng.permutation(n_docs).tolist():
            t = 1_704_067_200 + 10 * v + int(rng.integers(-25, 5))  # often older than what is in
            if rng.random() < 0.15:
                lines.append(change_line(f"d{i}", t, op="delete"))
            else:
                lines.append(change_line(f"d{i}", t, f"doc {i} version {v} " * 3))
        lines.append("{not json")  # a hostile line between versions
        lines.append(change_line("", 1_704_067_200, "no id"))
    return lines


def _history_run(
    tmp_path: Path, clock: ManualClock, lines: list[str], adaptive: bool, name: str
) -> tuple[Pipeline, LsmIndex, ListSink]:
    """The same small batches as above, into an index that keeps every version."""
    src, sink = ScriptedSource(), ListSink()
    emb = Timed(clock, us_per_text=1000)
    index = LsmIndex(emb.dim, LsmSpec(seal_rows=16, wal_fsync=False), clock=clock, background=False)
    ctl = AdaptiveController(min_size=1, max_size=4, target_latency_s=0.2, initial=4)
    p = Pipeline(
        source=src,
        embedder=emb,
        index=index,
        dead_letters=DeadLetterStore(tmp_path / f"dead-{name}.jsonl", truncate=True),
        clock=clock,
        on_commit=[sink.on_commit],
        splitter=TokenSplitter(max_tokens=32, overlap_tokens=4),
        **with_batcher(
            {"max_batch_size": 4, "max_pending": 16, "controller": ctl if adaptive else None},
            clock,
        ),
    )
    src.push(*lines)
    p.run_until_caught_up()
    return p, index, sink


def test_a_hostile_backlog_shares_commits_and_keeps_every_version(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Shared commits hold what one micro-batch per commit holds: now, and as of any time."""
    lines = _hostile()
    shared, shared_index, shared_sink = _history_run(tmp_path, clock, lines, True, "a")
    single, single_index, single_sink = _history_run(tmp_path, clock, lines, False, "b")
    assert len(shared_sink.commits) < len(single_sink.commits), "no commit was shared"
    assert max(len(b.docs) for b, _ in shared_sink.commits) > 4
    for p in (shared, single):
        assert p.stats.dead_lettered == 12  # both unreadable lines of every round
        assert p.stats.applied + p.stats.stale + p.stats.dead_lettered == p.stats.ingested
        assert p.uncommitted == 0
    assert index_digest(shared_index) == index_digest(single_index)
    query = shared.embedder.embed_many(["doc version"])
    for t in range(1_704_067_170, 1_704_067_260, 3):
        flt = SearchFilter(as_of_us=t * 1_000_000)
        got = [(h.doc_id, h.text) for h in shared_index.search_many(query, 50, flt)[1][0]]
        want = [(h.doc_id, h.text) for h in single_index.search_many(query, 50, flt)[1][0]]
        assert sorted(got) == sorted(want), t
