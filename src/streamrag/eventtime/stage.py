"""The event-time stage of the pipeline: watermarks and window aggregations over changes.

Every decoded micro-batch of changes passes through here before it is chunked
and embedded. The stage

1. feeds each configured window aggregation (per-domain change counts, feedback
   rates, a metric's mean...) with a key and a value taken from each change,
2. records the newest event time per source partition and recomputes the
   pipeline watermark (minimum over active partitions, never decreasing); a
   source that carries watermarks of its own passes them to
   :meth:`EventTimeStage.observe_watermark`,
3. advances every aggregation to that watermark, which fires the windows it
   completes.

**Micro-batch mode** (the default) judges every change of a batch against the
watermark as it stood when the batch arrived, then moves the watermark once —
as Spark Structured Streaming does. It is the default because a batch is the
unit streamrag commits and checkpoints: the watermark stored with a commit is
then exactly the one its changes were judged against, so a replay after a crash
classifies every change the same way. **Per-event mode** moves the watermark
after every change, as Flink does; it costs a Python call per change and exists
for parity. With a processing-time tick (``batcher.tick_ms``) the watermark
moves only on the ticks that also cut micro-batches, so window results and
index commits run on one schedule.

Late changes (all their windows expired) come back as the late side output.
They are still applied to the index — last-writer-wins makes a late version
harmless there — but they are not counted in any window.

Key and value fields name a column of the change: ``tenant``, ``domain``,
``doc_id``, ``source``, ``op``, or ``metadata.NAME`` for a field of the
document's metadata.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.changes import ChangeBatch, Op
from streamrag.config import WindowSettings
from streamrag.errors import ConfigError, UnknownNameError
from streamrag.eventtime.aggregates import AGGREGATORS
from streamrag.eventtime.operator import (
    Accumulation,
    LateElement,
    WindowedAggregation,
    WindowResult,
)
from streamrag.eventtime.triggers import Trigger
from streamrag.eventtime.watermarks import WatermarkTracker
from streamrag.eventtime.windows import Global, Session, Sliding, WindowAssigner
from streamrag.timing import US_PER_MS, Timestamp

__all__ = ["EventTimeStage", "Mode", "NamedWindow", "StageOutput", "field_column"]

_COLUMNS = ("tenant", "domain", "doc_id", "source", "op")


class Mode(StrEnum):
    """When the watermark moves: once per micro-batch, or after every change."""

    MICRO_BATCH = "micro_batch"
    PER_EVENT = "per_event"


@dataclass(frozen=True, slots=True)
class NamedWindow:
    """A window aggregation of the pipeline: its name, key fields and value field."""

    name: str
    operator: WindowedAggregation
    key: tuple[str, ...] = ("domain",)
    value: str | None = None
    keep_results: int = 1000

    @classmethod
    def from_settings(cls, settings: WindowSettings) -> NamedWindow:
        """The window aggregation one entry of the ``event_time.windows`` config describes.

        >>> from streamrag.config import WindowSettings
        >>> w = NamedWindow.from_settings(
        ...     WindowSettings(name="per_100", kind="global", trigger="count", trigger_count=100)
        ... )
        >>> w.operator.trigger, type(w.operator.assigner).__name__
        (Trigger(count=100, purge=False), 'Global')
        """
        ms = US_PER_MS
        assigner: WindowAssigner
        if settings.kind == "global":
            assigner = Global()
        elif settings.kind == "session":
            assert settings.gap_ms is not None  # checked by the settings
            assigner = Session(settings.gap_ms * ms)
        else:
            assert settings.size_ms is not None
            slide = settings.size_ms if settings.kind == "tumbling" else settings.slide_ms
            assert slide is not None
            assigner = Sliding(settings.size_ms * ms, slide * ms, settings.offset_ms * ms)
        count = {"watermark": None, "count": settings.trigger_count, "every_update": 1}
        op = WindowedAggregation(
            assigner,
            AGGREGATORS[settings.aggregate](),
            allowed_lateness_us=settings.allowed_lateness_ms * ms,
            accumulation=Accumulation(settings.accumulation),
            early_every_us=None
            if settings.early_every_ms is None
            else settings.early_every_ms * ms,
            trigger=Trigger(count=count[settings.trigger], purge=settings.purge),
            name=settings.name,
        )
        return cls(settings.name, op, tuple(settings.key), settings.value, settings.keep_results)


@dataclass(slots=True)
class StageOutput:
    """What one call of the stage produced."""

    results: list[tuple[str, WindowResult]]
    late: list[tuple[str, LateElement]]
    invalid: list[tuple[str, int, str]] = field(default_factory=list)
    """(window, row, reason) for changes whose value field is missing or not a number."""


def _check_field(name: str) -> None:
    if name in _COLUMNS or (name.startswith("metadata.") and len(name) > len("metadata.")):
        return
    msg = (
        f"unknown change field {name!r}; use one of {', '.join(_COLUMNS)} "
        "or metadata.NAME for a field of the document's metadata"
    )
    raise ConfigError(msg)


def field_column(changes: ChangeBatch, name: str) -> list[Any]:
    """One field of every change, by its name (see the module docs)."""
    if name == "tenant":
        return list(changes.tenants)
    if name == "doc_id":
        return list(changes.doc_ids)
    if name == "source":
        return list(changes.sources)
    if name == "op":
        return ["delete" if o == Op.DELETE else "upsert" for o in changes.ops.tolist()]
    if name == "domain":
        return [str(p.get("domain", "")) for p in changes.payloads]
    _check_field(name)
    meta_key = name[len("metadata.") :]
    out = []
    for p in changes.payloads:
        meta = p.get("metadata")
        out.append(meta.get(meta_key) if isinstance(meta, dict) else None)
    return out


class EventTimeStage:
    """Watermark tracking plus the pipeline's window aggregations."""

    def __init__(
        self,
        tracker: WatermarkTracker,
        windows: Sequence[NamedWindow] = (),
        *,
        mode: Mode = Mode.MICRO_BATCH,
        tick_us: int | None = None,
    ) -> None:
        names = [w.name for w in windows]
        if len(set(names)) != len(names):
            msg = f"window names must be unique, found {names}"
            raise ConfigError(msg)
        for w in windows:
            for f in (*w.key, *([w.value] if w.value else [])):
                _check_field(f)
        if tick_us is not None and tick_us <= 0:
            msg = f"tick must be positive, found {tick_us} µs"
            raise ConfigError(msg)
        self.tracker = tracker
        self.windows = list(windows)
        self.mode = Mode(mode)
        self.tick_us = tick_us
        self._next_tick: Timestamp | None = None
        self.late_counts: dict[str, int] = {w.name: 0 for w in windows}
        self.latest: dict[str, OrderedDict[tuple[Hashable, int, int], WindowResult]] = {
            w.name: OrderedDict() for w in windows
        }
        self._latest_lock = threading.Lock()
        # Bumped whenever a window's state may have changed: a checkpoint writes
        # only the windows whose version moved since the last one (incremental).
        self.versions: dict[str, int] = {w.name: 0 for w in windows}
        self._advanced_to: Timestamp | None = None

    def results(self, name: str) -> list[WindowResult]:
        """The latest result of each recent window of one aggregation, oldest first.

        Safe to call from another thread while the stage runs.
        """
        if name not in self.latest:
            known = ", ".join(sorted(self.latest)) or "none are configured"
            msg = f"no window aggregation named {name!r}; known: {known}"
            raise UnknownNameError(msg)
        with self._latest_lock:
            return list(self.latest[name].values())

    @property
    def watermark(self) -> Timestamp:
        """The pipeline watermark."""
        return self.tracker.watermark

    def process(self, changes: ChangeBatch) -> StageOutput:
        """Feed a decoded batch through the windows and move the watermark."""
        out = StageOutput([], [])
        n = len(changes)
        if n == 0:
            return out
        if self.mode is Mode.PER_EVENT:
            for i in range(n):
                self._process(changes.slice(i, i + 1), out, offset=i)
        else:
            self._process(changes, out, offset=0)
        return out

    def _process(self, changes: ChangeBatch, out: StageOutput, *, offset: int) -> None:
        for w in self.windows:
            keys = self._keys(changes, w.key)
            times = changes.event_times
            values: list[Any] | npt.NDArray[np.float64] | None = None
            rows = None
            if w.value is not None:
                values = field_column(changes, w.value)
                if hasattr(w.operator.aggregator, "ufunc"):  # a numeric aggregation
                    rows, refused, values = _numbers(values)
                    reason = f"window {w.name!r} needs a number in {w.value}, found none"
                    out.invalid.extend((w.name, i + offset, reason) for i in refused)
                    keys = [keys[i] for i in rows]
                    times = times[rows]
            fired, late = w.operator.process(keys, times, values)
            self.versions[w.name] += 1
            self._emit(w, fired, out)
            for el in late:
                self.late_counts[w.name] += 1
                index = el.index if rows is None else rows[el.index]
                out.late.append((w.name, _moved(el, index + offset)))
        newest: dict[str, int] = {}
        for source, ts in zip(changes.sources, changes.event_times.tolist(), strict=True):
            if ts > newest.get(source, ts - 1):
                newest[source] = ts
        for source, ts in newest.items():
            self.tracker.observe(source, ts)
        if self._on_tick():
            self._advance(out)

    def observe_watermark(self, partition: str, watermark: Timestamp) -> StageOutput:
        """Take a watermark that a source sent itself for one of its partitions.

        Kafka and Flink sources can carry watermarks of their own (a partition
        that knows it has delivered everything up to some time, or a heartbeat of
        a quiet one). ``partition`` is the input's name as the stage sees it: the
        ``source`` column of that partition's changes. The watermark raises that
        input's own (bounded out-of-orderness) one — never lowers it: a lower
        watermark is ignored — and counts as a sign of life for idleness. The
        pipeline watermark then moves as after a batch (at once, or at the next
        tick), firing the windows it passes; their results come back here.

        Call it after :meth:`process` of the batch the watermark came with, so
        that the batch's changes are judged against the watermark before it.
        """
        out = StageOutput([], [])
        self.tracker.observe_watermark(partition, watermark)
        if self._on_tick():
            self._advance(out)
        return out

    def _on_tick(self) -> bool:
        """Whether the watermark may move now: always, or at the next processing-time tick.

        With a tick (the hybrid schedule) the watermark moves once per tick, so
        windows fire on the same schedule as the micro-batches are cut.
        """
        if self.tick_us is None:
            return True
        now = self.tracker.clock.now_us()
        if self._next_tick is None:
            self._next_tick = now - now % self.tick_us + self.tick_us
            return False
        if now < self._next_tick:
            return False
        self._next_tick = now - now % self.tick_us + self.tick_us
        return True

    def on_processing_time(self, now_us: Timestamp) -> StageOutput:
        """Let processing time act: idle partitions release the watermark; early firings."""
        out = StageOutput([], [])
        if self._on_tick():
            self._advance(out)
        for w in self.windows:
            fired = w.operator.on_processing_time(now_us)
            if fired:
                self.versions[w.name] += 1
            self._emit(w, fired, out)
        return out

    def finish(self) -> StageOutput:
        """End of a bounded input: the watermark goes to +inf and every window fires."""
        self.tracker.finish()
        out = StageOutput([], [])
        self._advance(out)
        return out

    def _advance(self, out: StageOutput) -> None:
        wm = self.tracker.advance()
        moved = wm != self._advanced_to
        self._advanced_to = wm
        for w in self.windows:
            if moved:  # windows may fire or be purged
                self.versions[w.name] += 1
            self._emit(w, w.operator.advance(wm), out)

    def _emit(self, w: NamedWindow, results: list[WindowResult], out: StageOutput) -> None:
        if not results:
            return
        table = self.latest[w.name]
        with self._latest_lock:
            for r in results:
                out.results.append((w.name, r))
                slot = (r.key, r.window.start, r.window.end)
                table[slot] = r
                table.move_to_end(slot)
                while len(table) > w.keep_results:
                    table.popitem(last=False)

    @staticmethod
    def _keys(changes: ChangeBatch, fields: tuple[str, ...]) -> list[Hashable]:
        if len(fields) == 1:
            return field_column(changes, fields[0])
        columns = [field_column(changes, f) for f in fields]
        return list(zip(*columns, strict=True))

    # -- checkpoints -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Per-input maximum times, the watermark, and every window's state, as plain data."""
        return {
            "watermarks": self.tracker.snapshot(),
            "mode": self.mode.value,
            "windows": {w.name: w.operator.snapshot() for w in self.windows},
            "late": dict(self.late_counts),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`snapshot` (windows missing from it start empty)."""
        self.tracker.restore(state["watermarks"])
        for w in self.windows:
            saved = state["windows"].get(w.name)
            if saved is not None:
                w.operator.restore(saved)
        self.late_counts.update({k: int(v) for k, v in state.get("late", {}).items()})


def _moved(el: LateElement, index: int) -> LateElement:
    """The late element, numbered by its row in the whole batch."""
    if index == el.index:
        return el
    return LateElement(index, el.key, el.event_time, el.value, el.watermark)


def _numbers(values: list[Any]) -> tuple[list[int], list[int], npt.NDArray[np.float64]]:
    """The rows holding a finite number (bools excluded), the other rows, and the numbers."""
    rows: list[int] = []
    refused: list[int] = []
    for i, v in enumerate(values):
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        (rows if ok else refused).append(i)
    return rows, refused, np.asarray([values[i] for i in rows], dtype=np.float64)
