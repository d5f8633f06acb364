from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from streamrag.batching import MicroBatcher
from streamrag.chunking import TokenSplitter
from streamrag.errors import EmbedderError
from streamrag.index import SearchFilter
from streamrag.runtime import Pipeline
from streamrag.sources import JsonlSource
from streamrag.testing import (
    CountingEmbedder,
    FakeEmbedder,
    ListSink,
    ManualClock,
    ScriptedSource,
    change_line,
)
from tests.conftest import PipelineFactory

T0 = "2024-01-01T00:00:00Z"
T1 = "2024-01-02T00:00:00Z"
T2 = "2024-01-03T00:00:00Z"


def _texts(p: Pipeline, query: str, k: int = 10, **flt: object) -> list[str]:
    vec = p.embedder.embed_many([query])
    _, hits = p.index.search_many(vec, k, SearchFilter(**flt))  # type: ignore[arg-type]
    return [h.text for h in hits[0]]


def test_micro_batches_commit_at_size_or_deadline(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src = ScriptedSource()
    sink = ListSink()
    p = pipeline_factory(src, max_batch_size=3, max_delay_ms=20, on_commit=[sink.on_commit])
    src.push(*(change_line(f"d{i}", T0, f"text {i}") for i in range(4)))
    p.step()  # reads 4: one full batch of 3 commits at once
    assert sink.epochs == [1]
    assert p.batcher.pending == 1
    clock.advance_ms(19)
    assert not p.step()
    assert sink.epochs == [1]
    clock.advance_ms(1)
    assert p.step()
    assert sink.epochs == [1, 2]
    assert p.stats.last_freshness_us == 20_000
    assert [len(b.docs) for b, _ in sink.commits] == [3, 1]


def test_update_replaces_delete_removes_late_older_is_ignored(
    pipeline_factory: PipelineFactory,
) -> None:
    src = ScriptedSource()
    p = pipeline_factory(src)
    src.push(
        change_line("a", T0, "the old wording about invoices"),
        change_line("b", T0, "shipping times for parcels"),
    )
    p.run_until_caught_up()
    src.push(change_line("a", T1, "the new wording about refunds"))
    p.run_until_caught_up()
    a, b = frozenset({"a"}), frozenset({"b"})
    assert _texts(p, "old wording invoices", doc_ids=a) == ["the new wording about refunds"]
    src.push(change_line("a", T0, "a stale draft about wording"))  # older, arrives late
    p.run_until_caught_up()
    assert _texts(p, "stale draft", doc_ids=a) == ["the new wording about refunds"]
    assert _texts(p, "shipping parcels", doc_ids=b) == ["shipping times for parcels"]
    src.push(change_line("b", T2, op="delete"))
    p.run_until_caught_up()
    assert _texts(p, "shipping parcels", doc_ids=b) == []
    src.push(change_line("b", T1, "resurrected parcels"))  # older than the delete
    p.run_until_caught_up()
    assert _texts(p, "parcels", doc_ids=b) == []
    assert _texts(p, "parcels") == ["the new wording about refunds"]
    assert p.stats.applied == p.stats.ingested == 6
    assert p.stats.stale == 2


def test_unchanged_chunks_are_not_embedded_again(pipeline_factory: PipelineFactory) -> None:
    src = ScriptedSource()
    emb = CountingEmbedder(FakeEmbedder())
    p = pipeline_factory(src, embedder=emb, splitter=TokenSplitter(max_tokens=4, overlap_tokens=0))
    v1 = "alpha beta gamma\n\ndelta epsilon zeta\n\neta theta iota"
    v2 = "alpha beta gamma\n\ndelta CHANGED zeta\n\neta theta iota"
    src.push(change_line("doc", T0, v1))
    p.run_until_caught_up()
    assert len(emb.texts) == 3
    src.push(change_line("doc", T1, v2))
    p.run_until_caught_up()
    assert emb.texts[3:] == ["delta CHANGED zeta"]  # only the edited paragraph
    assert p.stats.chunks_reused == 2
    _, hits = p.index.search_many(p.embedder.embed_many(["eta theta iota"]), 1, SearchFilter())
    assert hits[0][0].text == "eta theta iota"
    assert hits[0][0].score == pytest.approx(1.0)
    assert hits[0][0].event_time > 0
    assert sorted(
        h.position
        for h in p.index.search_many(p.embedder.embed_many(["alpha"]), 5, SearchFilter())[1][0]
    ) == [0, 1, 2]


def test_bad_lines_are_dead_lettered_and_counted(
    pipeline_factory: PipelineFactory,
    jsonl,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    path = jsonl(
        change_line("a", T0, "good one"),
        "{not json",
        json.dumps({"doc_id": "b", "event_time": T0}),
        change_line("c", "2024-01-01", "naive time"),
        change_line("d", T0, "good two"),
    )
    p = pipeline_factory(JsonlSource(path))
    p.run_until_caught_up()
    letters = list(p.dead_letters.read())
    assert [(d.offset, d.stage) for d in letters] == [
        (len(change_line("a", T0, "good one")) + 1, "decode"),
        (letters[1].offset, "decode"),
        (letters[2].offset, "decode"),
    ]
    assert "not a JSON object" in letters[0].reason
    assert "non-empty 'text'" in letters[1].reason
    assert "no time zone" in letters[2].reason
    assert letters[0].raw == "{not json"
    st = p.stats
    assert (st.ingested, st.applied, st.dead_lettered) == (5, 2, 3)
    assert st.ingested == st.applied + st.dead_lettered + p.batcher.pending


def test_a_full_batcher_pushes_back_on_the_source(pipeline_factory: PipelineFactory) -> None:
    src = ScriptedSource()
    p = pipeline_factory(src, max_batch_size=2, max_delay_ms=1000, max_read_bytes=1)
    src.push(*(change_line(f"d{i}", T0, "x") for i in range(10)))
    assert p.poll() == 1
    assert p.poll() == 1
    assert p.batcher.full
    assert p.poll() == 0  # the source is not read while a full batch waits
    assert p.reader.backlog_bytes() > 0


class FlakyEmbedder(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def embed_many(self, texts):  # type: ignore[no-untyped-def]
        if self.fail:
            raise TimeoutError("embedding service timed out")
        return super().embed_many(texts)


def test_embedder_failure_keeps_the_batch_pending(pipeline_factory: PipelineFactory) -> None:
    src = ScriptedSource()
    emb = FlakyEmbedder()
    p = pipeline_factory(src, embedder=emb, max_delay_ms=0)
    src.push(change_line("a", T0, "hello world"))
    with pytest.raises(EmbedderError, match="TimeoutError: embedding service timed out"):
        p.step()
    assert p.batcher.pending == 1
    assert p.index.epoch == 0
    emb.fail = False
    p.step()
    assert p.index.epoch == 1
    assert p.stats.applied == 1


class BrokenSplitter(TokenSplitter):
    def split_counted(self, text: str) -> tuple[list[str], int]:
        if "poison" in text:
            raise RuntimeError("cannot split this")
        return super().split_counted(text)


def test_a_stage_error_dead_letters_one_record_not_the_batch(
    pipeline_factory: PipelineFactory,
) -> None:
    src = ScriptedSource()
    p = pipeline_factory(src, splitter=BrokenSplitter())
    src.push(change_line("a", T0, "fine text"), change_line("b", T0, "poison pill"))
    p.run_until_caught_up()
    assert _texts(p, "fine text") == ["fine text"]
    letters = list(p.dead_letters.read())
    assert [(x.stage, x.offset) for x in letters] == [("chunk", 1)]
    assert "cannot split this" in letters[0].reason
    assert (p.stats.applied, p.stats.dead_lettered) == (1, 1)


def _index_state(p: Pipeline) -> list[tuple[str, int, str, int, bytes]]:
    snap = p.index.pin()
    c = snap.cols
    rows = np.flatnonzero(snap.alive)
    return sorted(
        (
            c.doc_ids[r],
            int(c.positions[r]),
            c.texts[r],
            int(c.event_times[r]),
            c.vectors[r].tobytes(),
        )
        for r in rows
    )


def test_stream_equals_batch_whatever_the_arrival_order(tmp_path: Path, clock: ManualClock) -> None:
    rng = random.Random(7)
    lines = []
    for _ in range(300):
        doc = f"doc{rng.randrange(60)}"
        t = f"2024-02-{1 + rng.randrange(28):02d}T{rng.randrange(24):02d}:00:00Z"
        if rng.random() < 0.15:
            lines.append(change_line(doc, t, op="delete"))
        else:
            words = " ".join(f"w{rng.randrange(500)}" for _ in range(rng.randrange(5, 60)))
            lines.append(change_line(doc, t, words, domain=rng.choice(["a", "b"])))
    # Distinct versions per document, so the outcome cannot depend on offsets.
    seen: set[tuple[str, str]] = set()
    unique = []
    for line in lines:
        rec = json.loads(line)
        if (rec["doc_id"], rec["event_time"]) not in seen:
            seen.add((rec["doc_id"], rec["event_time"]))
            unique.append(line)

    def build(order: list[str], batch: int) -> Pipeline:
        src = ScriptedSource()
        from streamrag.index import ExactIndex
        from streamrag.ingest import DeadLetterStore

        emb = FakeEmbedder()
        p = Pipeline(
            source=src,
            embedder=emb,
            index=ExactIndex(emb.dim),
            clock=clock,
            dead_letters=DeadLetterStore(tmp_path / f"dl{batch}.jsonl", truncate=True),
            splitter=TokenSplitter(max_tokens=16, overlap_tokens=4),
            batcher=MicroBatcher(max_batch_size=batch, max_delay_ms=20, clock=clock),
            max_read_bytes=200,
        )
        for line in order:
            src.push(line)
            p.step()
        p.run_until_caught_up()
        p.close()
        return p

    batch_run = build(sorted(unique, key=lambda ln: json.loads(ln)["event_time"]), 10_000)
    shuffled = unique[:]
    rng.shuffle(shuffled)
    live_run = build(shuffled, 7)
    assert live_run.index.epoch > batch_run.index.epoch
    assert _index_state(live_run) == _index_state(batch_run)
    assert len(_index_state(batch_run)) > 20


def test_runner_survives_a_failing_step_and_commits_on_stop(
    pipeline_factory: PipelineFactory,
) -> None:
    import threading

    from streamrag.runtime import PipelineRunner

    src = ScriptedSource()
    emb = FlakyEmbedder()
    p = pipeline_factory(src, embedder=emb, max_delay_ms=0)
    committed = threading.Event()
    p.on_commit.append(lambda batch, result: committed.set())
    runner = PipelineRunner(p, poll_interval_ms=1, max_backoff_s=0.01)
    src.push(change_line("a", T0, "hello world"))
    runner.start()
    try:
        import time

        give_up = time.monotonic() + 10
        while runner.errors < 2 and time.monotonic() < give_up:
            time.sleep(0.005)  # waiting for the runner thread's retries, not for time
        assert runner.running
        assert "embedding service timed out" in (runner.last_error or "")
        emb.fail = False
        assert committed.wait(10)
    finally:
        runner.stop()
    assert not runner.running
    assert p.index.epoch == 1


def test_a_failed_commit_loses_nothing(pipeline_factory: PipelineFactory) -> None:
    src = ScriptedSource()
    p = pipeline_factory(src, max_delay_ms=0)
    real_commit = p.index.commit
    calls = {"n": 0}

    def flaky_commit(batch):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk full")
        return real_commit(batch)

    p.index.commit = flaky_commit  # type: ignore[method-assign]
    src.push(change_line("a", T0, "first"), change_line("b", T0, "second"))
    with pytest.raises(OSError, match="disk full"):
        p.step()
    assert p.uncommitted == 2
    assert p.index.epoch == 0
    p.step()
    assert p.index.epoch == 1
    assert sorted(_texts(p, "first second")) == ["first", "second"]
    assert (p.stats.ingested, p.stats.applied) == (2, 2)


def test_the_deadline_counts_from_the_last_empty_poll(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src = ScriptedSource()
    sink = ListSink()
    p = pipeline_factory(src, max_delay_ms=20, on_commit=[sink.on_commit])
    assert not p.step()  # nothing there at t=0
    clock.advance_ms(2)
    src.push(change_line("a", T0, "written between two polls"))
    assert p.step()  # found at t=2 ms; it landed after t=0
    clock.advance_ms(17)
    assert not p.step()
    assert sink.epochs == []
    clock.advance_ms(1)  # t=20 ms after the last empty poll
    assert p.step()
    assert sink.epochs == [1]
    assert p.stats.last_freshness_us == 18_000  # freshness counts from the read, at t=2 ms


def test_freshness_does_not_count_the_idle_time_before_a_change(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    """A job that slept until a source woke it reports the time from the read to the commit."""
    src = ScriptedSource()
    p = pipeline_factory(src, max_batch_size=1, max_delay_ms=20)
    assert not p.step()  # nothing there at t=0; the job sleeps until woken
    clock.advance_ms(250)
    src.push(change_line("a", T0, "written after a quiet spell"))
    assert p.step()  # read at t=250 ms and committed at once (the batch is full)
    assert p.index.epoch == 1
    assert p.stats.last_freshness_us == 0
    observed = p.metrics.registry.get_sample_value("streamrag_commit_freshness_seconds_sum")
    assert observed == 0.0  # not the 250 ms the job slept


class BlockingEmbedder(FakeEmbedder):
    """Holds every embed call until released, and says when one has started."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.entered = threading.Event()
        self.release = threading.Event()

    def embed_many(self, texts):  # type: ignore[no-untyped-def]
        self.entered.set()
        assert self.release.wait(10)
        return super().embed_many(texts)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_batch_is_read_and_chunked_while_one_embeds(
    pipeline_factory: PipelineFactory, overlap: bool
) -> None:
    import time

    from streamrag.runtime import PipelineRunner

    src = ScriptedSource()
    emb = BlockingEmbedder()
    p = pipeline_factory(src, embedder=emb, max_delay_ms=0)
    runner = PipelineRunner(p, poll_interval_ms=1, overlap=overlap)
    src.push(change_line("a", T0, "first batch"))
    runner.start()
    try:
        assert emb.entered.wait(10)  # the committer is inside the embedder now
        src.push(change_line("b", T0, "second"), change_line("c", T0, "third"))
        give_up = time.monotonic() + (5 if overlap else 0.3)
        while p.batcher.pending < 2 and time.monotonic() < give_up:
            time.sleep(0.002)  # waiting for the reader thread, not for time
        # With two threads the next changes are decoded, chunked and queued meanwhile;
        # with one, nothing is read until the embed call returns.
        assert p.batcher.pending == (2 if overlap else 0)
        emb.release.set()
        give_up = time.monotonic() + 10
        while p.stats.applied < 3 and time.monotonic() < give_up:
            time.sleep(0.002)
    finally:
        runner.stop()
    assert p.stats.applied == 3
    assert sorted(_texts(p, "first batch second third")) == ["first batch", "second", "third"]


def test_hybrid_schedule_batches_and_window_firings_share_the_tick(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    """A 1 s tick over a 5 s sliding window: the index and the aggregate refresh together."""
    from streamrag.config import load_settings
    from streamrag.runtime.service import build_event_time
    from streamrag.timing import format_timestamp

    settings = load_settings(
        overrides={
            "batcher.tick_ms": 1000,
            "event_time.windows": [
                {"name": "rate", "kind": "sliding", "size_ms": 5000, "slide_ms": 1000}
            ],
        },
        environ={},
    )
    commits: list[int] = []
    firings: list[tuple[int, int]] = []
    src = ScriptedSource()
    p = pipeline_factory(
        src,
        max_delay_ms=5000,
        tick_us=1_000_000,
        event_time=build_event_time(settings, clock),
        on_commit=[lambda batch, result: commits.append(clock.now_us())],
        on_window=[lambda name, r: firings.append((clock.now_us(), r.window.end))],
    )
    start = clock.now_us()
    assert start % 1_000_000 == 0
    for i in range(24):  # a change every 250 ms for 6 s, event time 100 ms behind the clock
        src.push(change_line(f"d{i}", format_timestamp(clock.now_us() - 100_000), f"e {i}"))
        p.step()
        clock.advance_ms(250)
        p.step()
    assert commits, "nothing was committed"
    assert firings, "no window fired"
    # Both happen only on tick boundaries, and on the same ticks.
    assert all(t % 1_000_000 == 0 for t in commits)
    assert all(t % 1_000_000 == 0 for t, _ in firings)
    assert {t for t, _ in firings} <= set(commits)
    assert len(set(commits)) >= 5


class SlowerWithSizeEmbedder(FakeEmbedder):
    """A synthetic embedder: each call takes 4 ms + 1 ms per text, on the manual clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.sizes: list[int] = []

    def embed_many(self, texts):  # type: ignore[no-untyped-def]
        self.sizes.append(len(texts))
        self.clock.advance_us(4_000 + 1_000 * len(texts))
        return super().embed_many(texts)


def test_adaptive_batch_size_converges_in_the_pipeline(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    """Target 40 ms: the controller should settle at 36 texts per call (4 + 36 = 40 ms)."""
    from streamrag.batching import AdaptiveController

    emb = SlowerWithSizeEmbedder(clock)
    src = ScriptedSource()
    controller = AdaptiveController(min_size=1, max_size=512, target_latency_s=0.040, initial=2)
    p = pipeline_factory(
        src,
        embedder=emb,
        max_batch_size=512,
        max_pending=100_000,
        max_delay_ms=10_000,
        controller=controller,
    )
    src.push(*(change_line(f"d{i}", T0, f"text number {i}") for i in range(1500)))
    p.poll()  # everything is queued: the backlog is deep
    while p.batcher.pending:
        p.flush(force=True)
    assert emb.sizes[0] == 2
    assert abs(controller.target - 36) <= 1
    assert all(abs(n - 36) <= 1 for n in emb.sizes[-10:-1]), str(emb.sizes)  # -1: the rest
    assert p.stats.applied == 1500
    text = p.metrics.render().decode()
    assert 'streamrag_batch_controller_decisions_total{action="grow"}' in text
    assert (
        "streamrag_batch_target_chunks 36.0" in text or "streamrag_batch_target_chunks 35.0" in text
    )


class PoisonEmbedder(FakeEmbedder):
    """Refuses any batch that holds the word 'poison'."""

    def embed_many(self, texts):  # type: ignore[no-untyped-def]
        if any("poison" in t for t in texts):
            raise ValueError("model produced garbage")
        return super().embed_many(texts)


def test_a_text_the_embedder_refuses_is_dead_lettered_and_the_batch_commits(
    pipeline_factory: PipelineFactory,
) -> None:
    src = ScriptedSource()
    waits: list[float] = []
    p = pipeline_factory(src, embedder=PoisonEmbedder(), max_delay_ms=0, sleep=waits.append)
    src.push(
        change_line("a", T0, "alpha document"),
        change_line("b", T0, "this one is poison for the model"),
        change_line("c", T0, "gamma document"),
    )
    p.step()
    assert p.index.epoch == 1  # the stream goes on
    assert p.batcher.pending == 0
    assert p.index.doc_state("default", "b") is None  # never half-written
    assert p.index.doc_state("default", "a") is not None
    assert p.index.doc_state("default", "c") is not None
    letters = list(p.dead_letters.read())
    assert [(x.stage, json.loads(x.raw)["doc_id"]) for x in letters] == [("embed", "b")]
    assert "model produced garbage" in letters[0].reason
    assert p.stats.dead_lettered == 1
    assert p.stats.applied == 2
    assert p.stats.ingested == p.stats.applied + p.stats.dead_lettered
    assert waits  # the whole batch was retried with backoff before it was split


def test_a_watermark_the_source_carries_fires_windows_without_later_data(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    """Events within one hour, then the source says the hour is over: the window fires."""
    from streamrag.config import load_settings
    from streamrag.runtime.build import build_event_time
    from streamrag.testing import WATERMARK

    settings = load_settings(
        overrides={"event_time.windows": [{"name": "hourly", "size_ms": 3_600_000}]},
        environ={},
    )
    hour = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
    fired: list[tuple[int, int]] = []
    src = ScriptedSource()
    p = pipeline_factory(
        src,
        event_time=build_event_time(settings, clock),
        on_window=[lambda name, r: fired.append((r.window.end, r.value))],
    )
    src.push(*(change_line(f"d{i}", (hour + i * 60_000_000) // 10**6, f"e {i}") for i in range(3)))
    p.run_until_caught_up(final=False)
    assert fired == []  # the derived watermark is still inside the hour
    src.push(WATERMARK(hour + 3_600_000_000))
    p.run_until_caught_up(final=False)
    assert fired == [(hour + 3_600_000_000, 3)]
    assert (p.stats.ingested, p.stats.applied) == (3, 3)  # a watermark is not a record


def test_a_global_window_with_a_count_trigger_runs_from_settings(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    """``kind: global`` with ``trigger: count``: one result per three changes of a key."""
    from streamrag.config import load_settings
    from streamrag.runtime.build import build_event_time

    settings = load_settings(
        overrides={
            "event_time.windows": [
                {"name": "every3", "kind": "global", "trigger": "count", "trigger_count": 3}
            ]
        },
        environ={},
    )
    fired: list[int] = []
    src = ScriptedSource()
    p = pipeline_factory(
        src,
        event_time=build_event_time(settings, clock),
        on_window=[lambda name, r: fired.append(int(r.value))],
    )
    src.push(*(change_line(f"d{i}", 1_704_067_200 + i, f"e {i}") for i in range(7)))
    p.run_until_caught_up(final=False)
    assert fired == [3, 6]  # accumulating: the count so far, at every third change


def test_a_source_hears_what_each_commit_made_durable_and_nothing_before(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    src = ScriptedSource()
    emb = FlakyEmbedder()
    p = pipeline_factory(src, embedder=emb, max_batch_size=100, max_delay_ms=1000)
    src.push(*(change_line(f"d{i}", T0, f"text {i}") for i in range(3)))
    p.poll()
    assert p.flush() == 0  # not due yet: nothing is durable, nothing acknowledged
    assert src.acked == []
    with pytest.raises(EmbedderError):
        p.flush(force=True)  # the embedder fails: no commit, no acknowledgement
    assert src.acked == []
    emb.fail = False
    src.push(change_line("d9", T0, "later"))
    assert p.flush(force=True) == 1
    assert src.acked == [(3, ())]  # the three committed; d9 is not read yet
    p.poll()
    clock.advance_ms(1000)
    assert p.flush() == 1
    assert src.acked[-1] == (4, ())


def test_a_failing_acknowledgement_never_undoes_a_commit(
    pipeline_factory: PipelineFactory,
) -> None:
    class Refusing(ScriptedSource):
        def build(self, resume=None):  # type: ignore[no-untyped-def]
            reader = super().build(resume)

            def refuse(positions, waiting):  # type: ignore[no-untyped-def]
                raise ConnectionError("the queue is away")

            reader.committed = refuse  # type: ignore[method-assign]
            return reader

    src = Refusing()
    p = pipeline_factory(src)
    src.push(change_line("d1", T0, "one"))
    p.run_until_caught_up()
    assert p.index.epoch == 1
    assert p.stats.applied == 1
    assert p.flusher.ack_errors == 1


def test_an_acknowledgement_leaves_out_the_changes_still_waiting(
    pipeline_factory: PipelineFactory,
) -> None:
    """Three ops changes fill a batch; two hr changes wait: they are read, not durable."""
    from streamrag.batching import PartitionKey

    src = ScriptedSource()
    p = pipeline_factory(
        src, max_batch_size=3, max_delay_ms=10_000, partition=PartitionKey(("domain",))
    )
    src.push(
        change_line("o1", T0, "a", domain="ops"),
        change_line("h1", T0, "b", domain="hr"),
        change_line("o2", T0, "c", domain="ops"),
        change_line("h2", T0, "d", domain="hr"),
        change_line("o3", T0, "e", domain="ops"),
    )
    p.poll()
    assert p.flush() == 1  # the full ops batch
    assert src.acked == [(5, (1, 3))]  # every position below 5, except the waiting hr ones
