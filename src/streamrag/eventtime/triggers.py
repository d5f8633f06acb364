"""Triggers: when a window emits, besides the watermark passing its end.

Where an element goes (the window assigner), when its window emits (the
trigger) and what happens to a late one (allowed lateness and the late side
output) are three separate things, as in Apache Beam. Every window fires
``ON_TIME`` once when the watermark reaches its end, and re-fires ``LATE`` for
elements that arrive within the allowed lateness; a :class:`Trigger` adds
firings before that:

* **on the watermark** (the default): no firings before the end; with
  ``early_every_us`` on the operator, ``EARLY`` results on processing time.
* **count** ``n``: the window also fires every ``n`` elements it receives,
  counted since its last firing (Flink's ``CountTrigger``).
* **every update**: a count of 1 — the window fires on every element, even
  within one micro-batch (Beam's ``Repeatedly.forever(AfterPane.elementCountAtLeast(1))``,
  Quix's ``.current()``).
* **purging** (any of the above): after each firing the window's contents are
  cleared, so the next result carries only what arrived since (Flink's
  ``PurgingTrigger``). It is Beam's *discarding* accumulation under Flink's name;
  the operator treats the two alike.

Count firings happen while the watermark is still before the window's end, so
they are marked ``EARLY`` — Beam's ``PaneInfo.Timing.EARLY``, "fired before the
input watermark had reached the end of the window"
(https://beam.apache.org/releases/javadoc/current/org/apache/beam/sdk/transforms/windowing/PaneInfo.Timing.html).
Once the watermark has passed the end, late elements re-fire the window at once
(``LATE``) as with the default trigger; the count governs the early phase only.
This is Beam's ``AfterWatermark.pastEndOfWindow().withEarlyFirings(AfterCount(n))``.
Flink's ``CountTrigger`` on an event-time window *replaces* the watermark trigger
instead; streamrag keeps the on-time firing, so every window still ends with a
complete ``ON_TIME`` result.

With the **global window** (:class:`~.windows.Global`: one window per key that
never closes by time) a count trigger gives Flink's count windows: with
``purging``, each result holds ``n`` elements. The watermark reaches the global
window's end only at the end of a bounded input, where it fires ``ON_TIME``
once more with what remains.

Counting triggers keep per-window state the columnar store does not have, so an
operator with one runs on the per-window path; the default and purging
watermark triggers keep the columnar path.

>>> Trigger.of_count(100).purging()
Trigger(count=100, purge=True)
>>> Trigger.every_update().kind, Trigger().kind
('every_update', 'watermark')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from streamrag.errors import SpecError

__all__ = ["ON_WATERMARK", "Trigger", "TriggerKind"]

TriggerKind = Literal["watermark", "count", "every_update"]


@dataclass(frozen=True, slots=True)
class Trigger:
    """When a window fires before the watermark passes its end, and whether it purges.

    ``count``: fire every this many elements (None: on the watermark only);
    ``purge``: clear the window's contents after each firing.
    """

    count: int | None = None
    purge: bool = False

    def __post_init__(self) -> None:
        if self.count is not None and (isinstance(self.count, bool) or self.count <= 0):
            msg = (
                f"a trigger's count must be a positive number of elements, found {self.count!r}; "
                "use Trigger.every_update() to fire on every element"
            )
            raise SpecError(msg)

    @classmethod
    def on_watermark(cls) -> Trigger:
        """The default: fire when the watermark passes the window's end (and late ones)."""
        return cls()

    @classmethod
    def of_count(cls, count: int) -> Trigger:
        """Also fire every ``count`` elements, counted since the window last fired."""
        return cls(count=count)

    @classmethod
    def every_update(cls) -> Trigger:
        """Also fire on every element: a count of 1."""
        return cls(count=1)

    def purging(self) -> Trigger:
        """The same trigger, clearing the window's contents after each firing."""
        return replace(self, purge=True)

    @property
    def kind(self) -> TriggerKind:
        """``watermark``, ``count`` or ``every_update`` (the config's names)."""
        if self.count is None:
            return "watermark"
        return "every_update" if self.count == 1 else "count"


ON_WATERMARK = Trigger()
"""The default trigger: on the watermark, accumulating."""
