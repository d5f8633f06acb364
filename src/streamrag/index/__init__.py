"""Stage ⑧ of the data path: the versioned vector index.

:mod:`.base` defines what a commit carries and what a search returns, the
:class:`VectorIndex` contract and the optional capabilities
(:class:`SupportsRollback`, :class:`SupportsHealth`, :class:`Closeable`,
:class:`ReportsRebuild`); :mod:`.versions` states which version of a document
wins and keeps every document's versions. :mod:`.lsm` is the default index,
assembled by role from :mod:`.lsm_state`, :mod:`.lsm_writer`,
:mod:`.lsm_persistence`, :mod:`.lsm_maintenance`, :mod:`.lsm_rollback` and
:mod:`.lsm_reads` — rows written through :mod:`.pending`, segments sized by rows
with bitemporal stamps (:mod:`.segment`), ANN structures for sealed segments
(:mod:`.ann`), immutable manifests per epoch (:mod:`.manifest`), the query path
(:mod:`.search`), compaction (:mod:`.compaction`), the write-ahead log
(:mod:`.wal`), files (:mod:`.store`) and the checkpoint manifest
(:mod:`.checkpoint`); :mod:`.exact` is the simple in-memory exact index, and
:mod:`.factory` builds either from settings.
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
from streamrag.index.hits import Hits
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
    "Hits",
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
