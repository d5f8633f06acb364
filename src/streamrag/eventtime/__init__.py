"""Stage ③ of the data path: event time — watermarks, windows and their aggregations.

* :mod:`.watermarks` — how far event time has progressed, per input and overall.
* :mod:`.windows` — tumbling, sliding, session and global windows.
* :mod:`.triggers` — when windows fire: on the watermark, every n elements, purging.
* :mod:`.aggregates` — incremental aggregations (count, sum, mean, ...).
* :mod:`.operator` — the keyed window operator: firing, allowed lateness, late output.
* :mod:`.columnar` — its window state in numpy columns, for numeric aggregations.
* :mod:`.stage` — the pipeline's event-time stage that ties them together.
"""

from streamrag.eventtime.aggregates import (
    AGGREGATORS,
    Aggregator,
    Collect,
    Count,
    Max,
    Mean,
    Min,
    Sum,
)
from streamrag.eventtime.operator import (
    Accumulation,
    LateElement,
    Timing,
    WindowedAggregation,
    WindowResult,
)
from streamrag.eventtime.stage import EventTimeStage, Mode, NamedWindow, StageOutput
from streamrag.eventtime.triggers import Trigger, TriggerKind
from streamrag.eventtime.watermarks import BoundedOutOfOrderness, WatermarkTracker
from streamrag.eventtime.windows import (
    GLOBAL_WINDOW,
    Global,
    Session,
    Sliding,
    Tumbling,
    Window,
    WindowAssigner,
)

__all__ = [
    "AGGREGATORS",
    "GLOBAL_WINDOW",
    "Accumulation",
    "Aggregator",
    "BoundedOutOfOrderness",
    "Collect",
    "Count",
    "EventTimeStage",
    "Global",
    "LateElement",
    "Max",
    "Mean",
    "Min",
    "Mode",
    "NamedWindow",
    "Session",
    "Sliding",
    "StageOutput",
    "Sum",
    "Timing",
    "Trigger",
    "TriggerKind",
    "Tumbling",
    "WatermarkTracker",
    "Window",
    "WindowAssigner",
    "WindowResult",
    "WindowedAggregation",
]
