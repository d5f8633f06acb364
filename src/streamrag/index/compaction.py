"""Compaction: merge small sealed segments and drop history nobody can read any more.

Sealing leaves many segments of ``seal_rows`` rows. Each one costs a search per
query, so compaction merges them, tier by tier, within an event-time bucket: a
segment's *tier* is how many times ``fanout`` its size is over ``seal_rows``,
and when a bucket holds ``fanout`` segments of one tier they become one segment
of the next. Every row is therefore rewritten about log_fanout(N / seal_rows)
times, and each bucket keeps a few segments per tier.

While merging, compaction drops the rows no query can see any more: rows
superseded before the retained history (their ``valid_to`` is before the
history floor and their stamp before the epoch floor, see
:mod:`.manifest`), and rows a rollback undid. A segment where such rows make
up ``drop_ratio`` of its rows is rewritten on its own even without partners.

Compaction runs on the maintenance thread, off the commit path: it reads
sealed segments (immutable) and builds the merged one and its ANN structure
without any lock; only the final swap — copying the stamps written meanwhile
and publishing a manifest — takes the writer lock for a moment.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamrag.index.segment import NEVER, Segment

__all__ = ["CompactionSpec", "droppable", "plan"]


@dataclass(frozen=True, slots=True)
class CompactionSpec:
    """When segments are merged."""

    fanout: int = 4
    max_segment_rows: int = 4_000_000
    drop_ratio: float = 0.3
    seal_rows: int = 8192


def droppable(
    seg: Segment, n: int, history_floor_us: int, epoch_floor: int
) -> npt.NDArray[np.bool_]:
    """Rows of ``[0, n)`` that no readable version can see.

    A row superseded at epoch ``s`` with ``valid_to`` ``v`` is seen by a read at
    epoch ``N`` as of ``T`` only if ``N < s`` or ``T < v``; reads need ``N ≥
    epoch_floor`` and ``T ≥ history_floor``. A row a rollback undid carries
    ``sup == created`` and is seen by no read at all.
    """
    sup = seg.sup[:n]
    gone = (sup < epoch_floor) & (seg.valid_to[:n] < history_floor_us)
    gone |= sup == seg.created[:n]
    gone &= sup != NEVER
    return gone


def tier(rows: int, spec: CompactionSpec) -> int:
    """Size class of a segment: 0 up to ``fanout × seal_rows`` rows, then one per factor."""
    return max(0, int(math.log(max(rows, 1) / spec.seal_rows, spec.fanout)))


def plan(
    segments: Sequence[Segment],
    spec: CompactionSpec,
    history_floor_us: int,
    epoch_floor: int,
    *,
    force: bool = False,
) -> list[list[Segment]]:
    """Groups of sealed segments to merge (a group of one is a rewrite that drops rows).

    With ``force`` every bucket's sealed segments become one (up to the size cap).
    """
    by_bucket: dict[int, list[Segment]] = defaultdict(list)
    for seg in segments:
        if seg.sealed and seg.n:
            by_bucket[seg.bucket].append(seg)
    groups: list[list[Segment]] = []
    for bucket in sorted(by_bucket):
        segs = sorted(by_bucket[bucket], key=lambda s: (s.n, s.id))
        taken: set[int] = set()
        if force:
            group: list[Segment] = []
            total = 0
            for s in segs:
                if group and total + s.n > spec.max_segment_rows:
                    if len(group) > 1:
                        groups.append(group)
                    group, total = [], 0
                group.append(s)
                total += s.n
            if len(group) > 1 or (group and _dead_share(group[0], history_floor_us, epoch_floor)):
                groups.append(group)
            continue
        tiers: dict[int, list[Segment]] = defaultdict(list)
        for s in segs:
            tiers[tier(s.n, spec)].append(s)
        for members in tiers.values():
            while len(members) >= spec.fanout:
                group = members[: spec.fanout]
                members = members[spec.fanout :]
                if sum(s.n for s in group) <= spec.max_segment_rows:
                    groups.append(group)
                    taken.update(s.id for s in group)
        for s in segs:
            if (
                s.id not in taken
                and _dead_share(s, history_floor_us, epoch_floor) >= spec.drop_ratio
            ):
                groups.append([s])
    return groups


def _dead_share(seg: Segment, history_floor_us: int, epoch_floor: int) -> float:
    if not seg.stamped:
        return 0.0
    return float(np.count_nonzero(droppable(seg, seg.n, history_floor_us, epoch_floor))) / seg.n
