"""The pipeline's event-time stage: windows over changes, side outputs, checkpoints, modes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from streamrag.changes import Change, ChangeBatch, Op
from streamrag.config import load_settings
from streamrag.errors import ConfigError
from streamrag.eventtime import (
    Count,
    EventTimeStage,
    Global,
    Mode,
    NamedWindow,
    Sum,
    Trigger,
    Tumbling,
    WatermarkTracker,
    WindowedAggregation,
)
from streamrag.runtime.service import build_event_time
from streamrag.testing import ManualClock, ScriptedSource, change_line
from tests.conftest import PipelineFactory


def _changes(*rows: tuple[str, int, str, Any]) -> ChangeBatch:
    """(doc_id, event_time, domain, score) rows from source 's'."""
    return ChangeBatch.from_changes(
        [
            Change(
                "t", d, Op.UPSERT, ts, {"domain": dom, "text": "x", "metadata": {"n": v}}, "s", i
            )
            for i, (d, ts, dom, v) in enumerate(rows)
        ]
    )


def _stage(clock: ManualClock, *, mode: Mode = Mode.MICRO_BATCH, bound: int = 0) -> EventTimeStage:
    return EventTimeStage(
        WatermarkTracker(bound_us=bound, clock=clock),
        [
            NamedWindow("count", WindowedAggregation(Tumbling(10), Count())),
            NamedWindow(
                "sum",
                WindowedAggregation(Tumbling(10), Sum()),
                key=("tenant", "domain"),
                value="metadata.n",
            ),
        ],
        mode=mode,
    )


def test_windows_keyed_by_change_fields_fire_on_the_batch_watermark() -> None:
    stage = _stage(ManualClock(0))
    out = stage.process(_changes(("a", 1, "hr", 2), ("b", 5, "hr", 3), ("c", 12, "ops", 1.5)))
    # W moved to 11 after the batch: [0, 10) fired for both windows
    got = {(name, r.key, r.value, r.timing.value) for name, r in out.results}
    assert got == {("count", "hr", 2, "on_time"), ("sum", ("t", "hr"), 5.0, "on_time")}
    assert stage.watermark == 11
    assert stage.latest["count"][("hr", 0, 10)].value == 2


def test_micro_batch_judges_a_batch_against_w_at_its_start_per_event_does_not() -> None:
    rows = (("a", 25, "hr", 1), ("b", 3, "hr", 1))
    batch = _stage(ManualClock(0)).process(_changes(*rows))
    assert batch.late == []
    per_event = _stage(ManualClock(0), mode=Mode.PER_EVENT).process(_changes(*rows))
    assert [(name, el.index, el.event_time) for name, el in per_event.late] == [
        ("count", 1, 3),
        ("sum", 1, 3),
    ]


def test_values_that_are_not_numbers_are_reported_not_counted() -> None:
    stage = _stage(ManualClock(0))
    out = stage.process(_changes(("a", 1, "hr", "many"), ("b", 2, "hr", 4), ("c", 3, "hr", None)))
    assert [(name, row) for name, row, _ in out.invalid] == [("sum", 0), ("sum", 2)]
    assert "metadata.n" in out.invalid[0][2]
    stage.finish()
    assert stage.latest["sum"][(("t", "hr"), 0, 10)].value == 4.0
    assert stage.latest["count"][("hr", 0, 10)].value == 3


def test_checkpoint_holds_watermark_windows_and_inputs() -> None:
    """Stop after half the input, restore from the snapshot, and finish: same results."""
    batches = [
        _changes(("a", 1, "hr", 1), ("b", 4, "ops", 2)),
        _changes(("c", 8, "hr", 3), ("d", 14, "hr", 4)),
        _changes(("e", 9, "hr", 5), ("f", 31, "ops", 6)),
        _changes(("g", 2, "hr", 7)),  # late by then
    ]
    whole = _stage(ManualClock(0), bound=3)
    expected = [whole.process(b) for b in batches]

    first = _stage(ManualClock(0), bound=3)
    for b in batches[:2]:
        first.process(b)
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(first.snapshot()))
    second = _stage(ManualClock(0), bound=3)
    second.restore(saved)
    for b, exp in zip(batches[2:], expected[2:], strict=True):
        got = second.process(b)
        assert got.results == exp.results
        assert [(n, el.event_time) for n, el in got.late] == [
            (n, el.event_time) for n, el in exp.late
        ]
    assert second.snapshot() == whole.snapshot()
    assert second.watermark == whole.watermark == 27


def test_idle_source_releases_the_watermark_on_processing_time() -> None:
    clock = ManualClock(0)
    tracker = WatermarkTracker(idle_timeout_us=1_000, clock=clock)
    stage = EventTimeStage(tracker, [NamedWindow("c", WindowedAggregation(Tumbling(10), Count()))])
    stage.process(ChangeBatch.from_changes([Change("t", "a", Op.DELETE, 50, {}, "slow", 0)]))
    stage.process(ChangeBatch.from_changes([Change("t", "b", Op.DELETE, 5, {}, "fast", 0)]))
    assert stage.watermark == 49  # the first source alone set it; "fast" cannot pull it back
    clock.advance_us(500)
    stage.process(ChangeBatch.from_changes([Change("t", "c", Op.DELETE, 95, {}, "slow", 1)]))
    assert stage.watermark == 49  # held back by "fast" (4)
    clock.advance_us(600)  # "fast" has been silent for 1.1 ms: idle
    out = stage.on_processing_time(clock.now_us())
    assert stage.watermark == 94
    assert {r.window.start for _, r in out.results} == {50}


def test_window_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="needs size_ms"):
        load_settings(overrides={"event_time.windows": [{"name": "x"}]}, environ={})
    with pytest.raises(ConfigError, match="needs value"):
        load_settings(
            overrides={"event_time.windows": [{"name": "x", "size_ms": 5, "aggregate": "sum"}]},
            environ={},
        )
    s = load_settings(
        overrides={"event_time.windows": [{"name": "x", "size_ms": 5, "key": ["nope"]}]},
        environ={},
    )
    with pytest.raises(ConfigError, match="unknown change field 'nope'"):
        build_event_time(s, ManualClock(0))


def test_late_changes_go_to_the_dead_letter_store_and_are_still_indexed(
    pipeline_factory: PipelineFactory, clock: ManualClock
) -> None:
    settings = load_settings(
        overrides={"event_time.windows": [{"name": "hourly", "size_ms": 3_600_000}]}, environ={}
    )
    src = ScriptedSource()
    p = pipeline_factory(src, event_time=build_event_time(settings, clock))
    src.push(change_line("a", "2024-01-01T05:00:00Z", "five o'clock", domain="ops"))
    p.run_until_caught_up()
    src.push(change_line("b", "2024-01-01T03:30:00Z", "half past three", domain="ops"))
    p.run_until_caught_up()
    letters = list(p.dead_letters.read())
    assert [(x.stage, x.offset) for x in letters] == [("window-late:hourly", 1)]
    assert '"doc_id": "b"' in letters[0].raw
    assert p.stats.window_late == 1
    assert p.stats.dead_lettered == 0  # the change itself was applied
    assert p.index.doc_state("default", "b") is not None
    assert p.stats.ingested == p.stats.applied


def test_pipeline_cursor_resumes_reading_and_windows_together(
    pipeline_factory: PipelineFactory, clock: ManualClock, tmp_path: Any
) -> None:
    """Stop halfway, restart from the committed cursor: same window results as one run."""
    from streamrag.sources import JsonlSource

    settings = load_settings(
        overrides={
            "event_time.max_out_of_orderness_ms": 600_000,
            "event_time.windows": [
                {"name": "hourly", "size_ms": 3_600_000, "allowed_lateness_ms": 1_800_000},
                {"name": "edits", "kind": "session", "gap_ms": 900_000, "key": ["doc_id"]},
            ],
        },
        environ={},
    )
    lines = [
        change_line(f"d{i % 7}", f"2024-01-01T{(i * 7) // 60:02d}:{(i * 7) % 60:02d}:00Z", f"t {i}")
        for i in range(60)
    ]
    lines[28], lines[29] = lines[29], lines[28]  # out of order, within the bound
    lines[30], lines[31] = lines[31], lines[30]
    path = tmp_path / "in.jsonl"

    def run(upto: int, cursor: dict[str, Any] | None, results: list[Any]) -> dict[str, Any]:
        p = pipeline_factory(
            JsonlSource(path),
            event_time=build_event_time(settings, clock),
            cursor=cursor,
            on_window=[lambda name, r: results.append((name, r.key, r.window, r.value))],
        )
        path.write_text("".join(x + "\n" for x in lines[:upto]))
        p.run_until_caught_up(final=False)
        assert p.index.cursor is not None
        out: dict[str, Any] = msgspec.msgpack.decode(msgspec.msgpack.encode(p.index.cursor))
        if upto == len(lines):
            p.finish_event_time()
        p.close()
        return out

    whole: list[Any] = []
    run(len(lines), None, whole)
    parts: list[Any] = []
    half = run(30, None, parts)
    assert any(k.startswith("position:") for k in half) or half.get("positions")
    run(len(lines), half, parts)

    def finals(results: list[Any]) -> dict[Any, Any]:
        # Firings depend on where batches were cut; what each window ends with does not.
        return {(name, key, window): value for name, key, window, value in results}

    assert finals(parts) == finals(whole)
    assert len(finals(whole)) > 10
    # Without the restored window state, the second half would start from empty windows.
    fresh: list[Any] = []
    run(len(lines), {k: v for k, v in half.items() if not k.startswith("window:")}, fresh)
    assert finals(fresh) != finals(whole)


def test_a_source_watermark_fires_windows_and_never_moves_back() -> None:
    clock = ManualClock(0)
    tracker = WatermarkTracker(clock=clock, inputs=["s"])
    stage = EventTimeStage(
        tracker, [NamedWindow("count", WindowedAggregation(Tumbling(10), Count()))]
    )
    out = stage.process(_changes(("a", 1, "hr", 1), ("b", 12, "hr", 1), ("c", 25, "hr", 1)))
    assert [r.window.start for _, r in out.results] == [0, 10]  # W = 24 from the data
    out = stage.observe_watermark("s", 40)  # the source says: nothing more up to 40
    assert stage.watermark == 40
    assert [(r.window.start, r.value, r.timing.value) for _, r in out.results] == [
        (20, 1, "on_time")
    ]
    assert stage.observe_watermark("s", 30).results == []  # lower: ignored
    assert stage.watermark == 40
    out = stage.process(_changes(("d", 35, "hr", 1)))  # behind the source's watermark: late
    assert [(el.event_time, el.watermark) for _, el in out.late] == [(35, 40)]


def test_a_source_watermark_waits_for_the_other_partitions() -> None:
    clock = ManualClock(0)
    stage = EventTimeStage(
        WatermarkTracker(clock=clock, inputs=["s", "t"]),
        [NamedWindow("count", WindowedAggregation(Tumbling(10), Count()))],
    )
    stage.process(_changes(("a", 1, "hr", 1)))
    assert stage.observe_watermark("s", 50).results == []  # "t" has said nothing
    out = stage.observe_watermark("t", 9)
    assert [(r.window.start, r.value) for _, r in out.results] == [(0, 1)]
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(stage.snapshot()))
    again = EventTimeStage(
        WatermarkTracker(clock=clock, inputs=["s", "t"]),
        [NamedWindow("count", WindowedAggregation(Tumbling(10), Count()))],
    )
    again.restore(saved)
    again.process(_changes(("b", 45, "hr", 1)))
    out = again.observe_watermark("t", 60)
    assert again.watermark == 50  # "s" still holds the watermark it sent
    assert [(r.window.start, r.value) for _, r in out.results] == [(40, 1)]


def test_window_settings_build_the_operator_they_describe() -> None:
    specs: list[dict[str, Any]] = [
        {"name": "t", "size_ms": 5, "allowed_lateness_ms": 2, "early_every_ms": 1},
        {"name": "s", "kind": "sliding", "size_ms": 6, "slide_ms": 2, "offset_ms": 1},
        {"name": "g", "kind": "session", "gap_ms": 3, "aggregate": "sum", "value": "metadata.n"},
        {"name": "d", "size_ms": 5, "accumulation": "discarding", "key": ["tenant", "doc_id"]},
    ]
    settings = load_settings(overrides={"event_time.windows": specs}, environ={})
    built = [NamedWindow.from_settings(w) for w in settings.event_time.windows]
    service = build_event_time(settings, ManualClock(0)).windows
    for mine, theirs in zip(built, service, strict=True):
        assert (mine.name, mine.key, mine.value, mine.keep_results) == (
            theirs.name,
            theirs.key,
            theirs.value,
            theirs.keep_results,
        )
        for attr in ("assigner", "allowed_lateness_us", "accumulation", "early_every_us", "name"):
            assert getattr(mine.operator, attr) == getattr(theirs.operator, attr)
        assert type(mine.operator.aggregator) is type(theirs.operator.aggregator)
        assert mine.operator.trigger == Trigger()

    new: list[dict[str, Any]] = [
        {"name": "per_3", "kind": "global", "trigger": "count", "trigger_count": 3, "purge": True},
        {"name": "live", "size_ms": 5, "trigger": "every_update"},
    ]
    settings = load_settings(overrides={"event_time.windows": new}, environ={})
    per_3, live = (NamedWindow.from_settings(w) for w in settings.event_time.windows)
    assert isinstance(per_3.operator.assigner, Global)
    assert per_3.operator.trigger == Trigger.of_count(3).purging()
    assert live.operator.trigger == Trigger.every_update()
    stage = EventTimeStage(WatermarkTracker(clock=ManualClock(0)), [per_3, live])
    out = stage.process(_changes(*[(f"d{i}", i * 1_000, "hr", 1) for i in range(1, 8)]))
    counts = [r.value for name, r in out.results if name == "per_3"]
    assert counts == [3, 3]
    assert {r.timing.value for name, r in out.results if name == "live"} >= {"early", "on_time"}
