"""Python's cyclic garbage collector, set for a long-running streamrag process.

CPython frees most objects by reference counting; the *cyclic* collector only
finds reference cycles. It runs a young collection each time allocations
outnumber deallocations of container objects by ``threshold0`` (700 by
default), and every so often a full collection that walks every tracked object
in the process.

A streamrag process allocates many short-lived containers per change (decoded
records, chunk lists, per-document plans) and keeps a few per document for as
long as the index holds it (its version states). With the default threshold
the collector ran every ~700 allocations of the ingest loop, each time over
young objects that reference counting was about to free anyway. Measured on
the 20,000-document bench workload (hashing embedder, 2-core Intel Xeon,
alternated): ``benchmarks/ingest.py``, three runs each of three repeats, the
pipeline's best 14,500–15,600 changes a second with Python's default against
15,700–16,300 at 10,000 (its ratio to the bare embedder 0.445–0.466 against
0.473–0.493); four pipelines in one process each, 14,900–16,800 against
15,900–17,900.

:func:`tune_collector` sets the young threshold (``ingest.gc_young``) and
*freezes* what the process holds when it is called
(:func:`gc.freeze`: imported modules, loaded models, a recovered index), so
that later full collections no longer walk it. The process owner calls it:
``streamrag run`` and ``streamrag serve`` do once their service has started;
a program that embeds :class:`~streamrag.runtime.service.Service` may call it
too, or leave its own collector settings alone. A higher threshold only lets
the rare reference cycle live a little longer. A frozen object is never
collected, though: what the started service held and later drops inside a
cycle (the index of a generation switched away from, say) stays allocated
until the process ends; reference counting still frees everything else.
"""

from __future__ import annotations

import gc

from streamrag.config import IngestSettings

__all__ = ["tune_collector"]


def tune_collector(ingest: IngestSettings) -> None:
    """Freeze what the process holds now and collect young objects less often.

    ``ingest.gc_young`` 0 leaves the collector as it is. Calling it again
    freezes what was added since (a frozen object is never collected; nothing
    frozen here is garbage: it is collected first).
    """
    young = ingest.gc_young
    if young == 0:
        return
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
