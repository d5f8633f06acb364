"""Stage ⑥ of the data path: micro-batching for the embedder.

* :mod:`.partition` — the semantic partition key that keeps a batch topically local.
* :mod:`.batcher` — per-partition queues flushed by size, deadline, watermark or tick.
* :mod:`.adaptive` — the controller that sizes batches to a latency target.
"""

from streamrag.batching.adaptive import AdaptiveController, Decision
from streamrag.batching.batcher import MicroBatcher, PendingBatch
from streamrag.batching.partition import DAY_US, PartitionKey

__all__ = [
    "DAY_US",
    "AdaptiveController",
    "Decision",
    "MicroBatcher",
    "PartitionKey",
    "PendingBatch",
]
