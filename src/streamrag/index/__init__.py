"""Stage ⑧ of the data path: the versioned vector index.

:mod:`.base` defines what a commit carries and what a search returns;
:mod:`.exact` is the in-memory exact index with lock-free epochs.
"""

from streamrag.index.base import (
    CommitBatch,
    CommitResult,
    DocOp,
    DocState,
    Hit,
    IndexStats,
    SearchFilter,
    VectorIndex,
)
from streamrag.index.exact import ExactIndex, Snapshot

__all__ = [
    "CommitBatch",
    "CommitResult",
    "DocOp",
    "DocState",
    "ExactIndex",
    "Hit",
    "IndexStats",
    "SearchFilter",
    "Snapshot",
    "VectorIndex",
]
