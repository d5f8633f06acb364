"""Stage ⑧ of the data path: the versioned vector index.

:mod:`.base` defines what a commit carries and what a search returns;
:mod:`.lsm` is the default index — every change a version of its document
(:mod:`.versions`, rows written through :mod:`.pending`), segments sized by rows
with bitemporal stamps (:mod:`.segment`), ANN structures for sealed segments
(:mod:`.ann`), immutable manifests per epoch (:mod:`.manifest`), the query path
(:mod:`.search`), compaction (:mod:`.compaction`), the write-ahead log
(:mod:`.wal`) and files (:mod:`.store`); :mod:`.exact` is the simple in-memory
exact index.
"""

from streamrag.index.base import (
    Closeable,
    CommitBatch,
    CommitResult,
    DocOp,
    DocState,
    Hit,
    IndexStats,
    MetaPredicate,
    ReportsRebuild,
    SearchFilter,
    SupportsHealth,
    SupportsRollback,
    VectorIndex,
)
from streamrag.index.exact import ExactIndex, Snapshot
from streamrag.index.lsm import IndexHealth, LsmIndex, LsmSpec
from streamrag.index.manifest import Manifest

__all__ = [
    "Closeable",
    "CommitBatch",
    "CommitResult",
    "DocOp",
    "DocState",
    "ExactIndex",
    "Hit",
    "IndexHealth",
    "IndexStats",
    "LsmIndex",
    "LsmSpec",
    "Manifest",
    "MetaPredicate",
    "ReportsRebuild",
    "SearchFilter",
    "Snapshot",
    "SupportsHealth",
    "SupportsRollback",
    "VectorIndex",
]
