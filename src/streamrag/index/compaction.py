"""Compaction: merge small sealed segments and drop history nobody can read any more.

Sealing leaves many segments of ``seal_rows`` rows. Each one costs a search per
query, so compaction merges them, tier by tier: a segment's *tier* is how many
times ``fanout`` its size is over ``seal_rows``, and ``fanout`` segments of one
tier that are neighbours in event time become one segment of the next. Every
row is therefore rewritten about log_fanout(N / seal_rows) times, and the index
keeps a few segments per tier — however many years of event time they cover.
Merging neighbours keeps each segment's range of event times narrow, so time
ranges and ``as_of`` reads still skip most segments from their bounds.

While merging, compaction drops the rows no query can see any more: rows whose
interval ends before the retained history (their ``valid_to`` is before the
history floor and their stamp before the epoch floor, see :mod:`.manifest`),
rows replaced by a copy before the epoch floor, and rows a rollback undid. A
segment where such rows make up ``drop_ratio`` of its rows is rewritten on its
own even without partners.

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

from streamrag.index.segment import Segment

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

    A row with an end ``v`` from epoch ``s`` is seen by a read at epoch ``N`` as
    of ``T`` only if ``N < s`` or ``T < v``, and a row killed at epoch ``d`` only
    if ``N < d``; reads need ``N ≥ epoch_floor`` and ``T ≥ history_floor``. A row
    a rollback undid carries ``dead == created`` and is seen by no read at all.
    """
    sup, dead = seg.sup[:n], seg.dead[:n]
    gone = (sup < epoch_floor) & (seg.valid_to[:n] < history_floor_us)
    if seg.killed:
        gone |= (dead <= epoch_floor) | (dead == seg.created[:n])
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

    Segments are taken in event-time order (by the earliest event time each
    holds), so a group's members are neighbours in time. With ``force`` they
    are merged into as few segments as the size cap allows.
    """
    segs = sorted((s for s in segments if s.sealed and s.n), key=lambda s: (s.min_valid_from, s.id))
    groups: list[list[Segment]] = []
    if force:
        group: list[Segment] = []
        total = 0
        for s in segs:
            if group and total + s.n > spec.max_segment_rows:
                if len(group) > 1 or _dead_share(group[0], history_floor_us, epoch_floor):
                    groups.append(group)
                group, total = [], 0
            group.append(s)
            total += s.n
        if len(group) > 1 or (group and _dead_share(group[0], history_floor_us, epoch_floor)):
            groups.append(group)
        return groups
    taken: set[int] = set()
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
        if s.id not in taken and _dead_share(s, history_floor_us, epoch_floor) >= spec.drop_ratio:
            groups.append([s])
    return groups


def _dead_share(seg: Segment, history_floor_us: int, epoch_floor: int) -> float:
    if not seg.stamped:
        return 0.0
    return float(np.count_nonzero(droppable(seg, seg.n, history_floor_us, epoch_floor))) / seg.n
