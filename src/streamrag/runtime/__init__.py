"""Stage ⑨ of the data path: wiring and running the pipeline.

:mod:`.pipeline` wires the stages in data-path order and commits micro-batches;
:mod:`.executor` runs it in a thread; :mod:`.service` builds a whole job from
settings; :mod:`.metrics` holds its Prometheus instruments.
"""

from streamrag.runtime.executor import PipelineRunner
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.pipeline import Pipeline, PipelineStats
from streamrag.runtime.service import Service

__all__ = ["Metrics", "Pipeline", "PipelineRunner", "PipelineStats", "Service"]
