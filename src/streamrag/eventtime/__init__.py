"""Stage ③ of the data path: event time — watermarks, windows and their aggregations.

* :mod:`.watermarks` — how far event time has progressed, per input and overall.
* :mod:`.windows` — tumbling, sliding and session windows.
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
from streamrag.eventtime.watermarks import BoundedOutOfOrderness, WatermarkTracker
from streamrag.eventtime.windows import Session, Sliding, Tumbling, Window, WindowAssigner

__all__ = [
    "AGGREGATORS",
    "Accumulation",
    "Aggregator",
    "BoundedOutOfOrderness",
    "Collect",
    "Count",
    "EventTimeStage",
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
    "Tumbling",
    "WatermarkTracker",
    "Window",
    "WindowAssigner",
    "WindowResult",
    "WindowedAggregation",
]
