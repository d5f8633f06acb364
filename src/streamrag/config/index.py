"""``index.*``: the vector index (segments, ANN structures, history, persistence)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrag.config.base import Frozen

__all__ = ["IndexSettings"]


class IndexSettings(Frozen):
    """The vector index: an LSM of segments with epochs, history and persistence."""

    kind: Literal["lsm", "exact"] = Field(
        "lsm",
        description="'lsm': segments, ANN, as_of/epoch reads, persistence in <state_dir>/index; "
        "'exact': the in-memory exact index (no history, rebuilt on every start).",
    )
    persist: bool = Field(
        True, description="Keep the LSM index in <state_dir>/index and reopen it on start."
    )
    ann: Literal["auto", "exact"] = Field(
        "auto",
        description="'auto': HNSW for mid-size sealed segments, IVF-PQ for large ones; "
        "'exact': scan every segment exactly.",
    )
    history: Literal["full", "current"] = Field(
        "full",
        description="'full': every change is a version (as_of reads answer what the documents "
        "said at any time within retention_s); 'current': keep only each document's newest "
        "version (cheaper: superseded changes are not embedded; no as_of).",
    )
    seal_rows: int = Field(
        8192, gt=0, description="Rows of a growing (exactly searched) segment before it is sealed."
    )
    ann_min_rows: int = Field(
        32_768,
        gt=0,
        description="Sealed segments of at least this many rows get an ANN structure; smaller "
        "ones are scanned exactly (32k rows: ~1.5 ms a query here, and never wrong).",
    )
    half_copies: bool = Field(
        True,
        description="Once the vectors scanned exactly pass 16 MiB, segments scanned exactly "
        "keep a half-precision copy (the growing one of its first rows), through which single "
        "queries scan half the bytes, still exactly (1.5x here; 50% more memory for those "
        "vectors).",
    )
    half_max_queries: int = Field(
        0,
        ge=0,
        description="Calls of up to this many queries scan through the half-precision copies, "
        "larger ones in one float32 matrix product; 0 = measured on this CPU once per process, "
        "when it is quiet (as it starts, or once a bulk load is done; 6 until then) "
        "(3-6 on 2-core AMD EPYC hosts; streamrag.index.half_limit).",
    )
    scan_threads: int = Field(
        0,
        ge=0,
        description="Threads one query's exact scan may split its rows across while they are "
        "idle (never waiting for a busy one): 0 = one per CPU the process may use; 1 = never "
        "split.",
    )
    ivfpq_min_rows: int = Field(
        2_000_000,
        gt=0,
        description="Sealed segments of at least this many rows get IVF-PQ, not HNSW.",
    )
    hnsw_m: int = Field(32, gt=1, description="HNSW links per node.")
    hnsw_ef_construction: int = Field(100, gt=0, description="HNSW beam width while building.")
    hnsw_ef_search: int = Field(
        64, gt=0, description="HNSW beam width per query (recall@10 ≥ 0.95 up to 1M rows)."
    )
    ivf_nprobe: int = Field(16, gt=0, description="IVF lists probed per query.")
    build_threads: int = Field(
        0,
        ge=0,
        description="Threads that build an HNSW graph in the background while no query or "
        "commit comes in, as after a bulk load (0: every CPU the index's maintenance thread may "
        "use, normally all of the process's); one while "
        "they do. 1 builds the same graph every time.",
    )
    compact_fanout: int = Field(
        4, ge=2, description="Segments of one size tier merged into one by compaction."
    )
    max_segment_rows: int = Field(
        4_000_000, gt=0, description="Compaction never builds a larger segment."
    )
    retention_s: int = Field(
        7 * 86_400,
        ge=0,
        description="History kept for as_of and epoch reads, back from the newest event time.",
    )
    checkpoint_every: int = Field(
        256, gt=0, description="Commits between checkpoints (the write-ahead log covers the rest)."
    )
    on_corruption: Literal["refuse", "rebuild"] = Field(
        "refuse",
        description="When a state file fails its checksum on start: 'refuse' to open (the error "
        "names the file); 'rebuild': move the damaged index aside and rebuild it by reading the "
        "sources again from their start (files can be; a queue whose messages were acked "
        "cannot).",
    )
    wal_fsync: bool = Field(
        True,
        description="fsync the write-ahead log on every commit (off: faster, but a power "
        "loss may lose the last commits).",
    )
    initial_capacity: int = Field(
        1024, gt=0, description="'exact' index only: rows allocated up front; grows x2."
    )
