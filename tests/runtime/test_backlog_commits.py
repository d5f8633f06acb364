"""A backlog shares commits: due micro-batches go into one epoch within the latency target.

While a backlog waits and batches are as large as ``max_batch_size`` allows,
one commit takes as many due micro-batches as the embedder gets through in the
adaptive controller's latency target (:meth:`~streamrag.runtime.flush.Flusher._backlog_room`);
each is still embedded in calls of at most the batch size. A change that
arrives alone still commits alone, at its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from streamrag.batching import AdaptiveController
from streamrag.runtime import Pipeline
from streamrag.testing import FakeEmbedder, ListSink, ManualClock, ScriptedSource, change_line
from tests.conftest import PipelineFactory

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
    src, sink = ScriptedSource(), ListSink()
    # 2 ms per batch at most: the controller keeps batches at 2 texts, under max_batch_size.
    p, _ = _pipeline(pipeline_factory, clock, src, sink, latency_s=0.002)
    src.push(*_lines(20))
    p.run_until_caught_up()
    assert p.batcher.target_size < p.batcher.max_batch_size
    assert max(len(b.docs) for b, _ in sink.commits) <= 4
    assert p.stats.applied == 20


def test_without_the_controller_one_micro_batch_per_commit(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src, sink = ScriptedSource(), ListSink()
    p, _ = _pipeline(pipeline_factory, clock, src, sink, adaptive=False)
    src.push(*_lines(20))
    p.run_until_caught_up()
    assert [len(b.docs) for b, _ in sink.commits] == [4, 4, 4, 4, 4]
