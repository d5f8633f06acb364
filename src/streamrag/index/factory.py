"""Build the index a job's settings describe.

This is the one place where ``index.*`` settings (:class:`~streamrag.config.IndexSettings`)
become the LSM index's spec (:func:`lsm_spec`): the rest of the package takes an
:class:`~streamrag.index.lsm.LsmSpec` and never reads settings. ``seal_rows``
sizes both the growing segment and the compaction tiers, so it is given to both
here. The specs' own defaults equal the settings' defaults
(``lsm_spec(IndexSettings()) == LsmSpec()``, pinned by a test), so an index built
in code without settings behaves as one built from an empty configuration.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from streamrag.config import IndexSettings
from streamrag.errors import CorruptStateError
from streamrag.index.ann import AnnSpec
from streamrag.index.base import VectorIndex
from streamrag.index.compaction import CompactionSpec
from streamrag.index.exact import ExactIndex
from streamrag.index.lsm import LsmIndex, LsmSpec
from streamrag.index.search import SearchTuning
from streamrag.timing import US_PER_S, Clock

__all__ = ["build_index", "lsm_spec"]

log = logging.getLogger("streamrag.index")

_NO_ANN = 2**62
"""``ann_min_rows`` of the exact configuration: no segment is ever that large."""


def lsm_spec(settings: IndexSettings) -> LsmSpec:
    """The LSM index's spec from ``index.*`` settings.

    >>> lsm_spec(IndexSettings(history="current")).history
    False
    """
    return LsmSpec(
        seal_rows=settings.seal_rows,
        ann=AnnSpec(
            min_rows=settings.ann_min_rows if settings.ann == "auto" else _NO_ANN,
            ivfpq_min_rows=settings.ivfpq_min_rows,
            hnsw_m=settings.hnsw_m,
            hnsw_ef_construction=settings.hnsw_ef_construction,
            hnsw_ef_search=settings.hnsw_ef_search,
            ivf_nprobe=settings.ivf_nprobe,
            build_threads=settings.build_threads,
        ),
        tuning=_tuning(settings),
        compaction=CompactionSpec(
            fanout=settings.compact_fanout,
            max_segment_rows=settings.max_segment_rows,
            seal_rows=settings.seal_rows,
        ),
        retention_us=settings.retention_s * US_PER_S,
        checkpoint_every=settings.checkpoint_every,
        wal_fsync=settings.wal_fsync,
        history=settings.history == "full",
    )


def _tuning(settings: IndexSettings) -> SearchTuning:
    tuning = SearchTuning(
        scan_threads=settings.scan_threads, half_max_queries=settings.half_max_queries or None
    )
    return tuning if settings.half_copies else replace(tuning, half_min_rows=_NO_ANN)


def build_index(
    settings: IndexSettings,
    dim: int,
    *,
    state_dir: Path,
    clock: Clock,
    background: bool = True,
) -> VectorIndex:
    """The index ``settings`` describe: persistent in ``state_dir/index`` when it persists."""
    if settings.kind == "exact":
        return ExactIndex(dim, initial_capacity=settings.initial_capacity, clock=clock)
    path = state_dir / "index" if settings.persist else None
    spec = lsm_spec(settings)
    try:
        return LsmIndex(dim, spec, path=path, clock=clock, background=background)
    except CorruptStateError as exc:
        if settings.on_corruption != "rebuild" or path is None:
            raise
        aside = path.with_name(f"index.corrupt-{clock.now_us() // 1_000_000}")
        path.rename(aside)
        log.error(
            "%s — index.on_corruption is 'rebuild': the damaged index was moved to %s and is "
            "rebuilt from the sources, read again from their start",
            exc,
            aside,
        )
        index = LsmIndex(dim, spec, path=path, clock=clock, background=background)
        index.rebuilt = {"reason": str(exc), "damaged_file": exc.path, "moved_to": str(aside)}
        return index
