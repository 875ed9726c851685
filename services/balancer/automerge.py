"""The auto-merger's policy (docs/reference/defragmentation-and-auto-merge.md), pure: which ranges of a
collection to merge now.

MongoDB's definition of mergeable chunks: two or more contiguous, non-jumbo chunks
of one collection on the same shard are mergeable when none of them has been
migrated within both `minSnapshotHistoryWindowInSeconds` and
`transactionLifetimeLimitSeconds` (merging drops the chunk history that snapshot
reads and transactions at older timestamps would route by).  We also keep a merge
inside one zone, as the balancer would split it again at the zone boundary.

A merge action is one maximal run of mergeable chunks: {"type": "merge", "ns",
"shard", "min", "max"} — the range form of MongoDB's `mergeAllChunksOnShard`,
which merges every such run of one shard.  Bounds are whatever the caller gives
(encoded shard-key bytes are best: they sort like the key and `bytes.hex()` keeps
that order in JSON); only `==` is needed, and `<` when zone ranges are given.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_OUTSTANDING = 10  # MongoDB: at most 10 mergeAllChunksOnShard actions at a time
TRANSACTION_LIFETIME_LIMIT_SECS = 60  # MongoDB's transactionLifetimeLimitSeconds default

ZoneRangeT = tuple[Any, Any, str]  # (min, max, zone)


@dataclass(frozen=True)
class ChunkInfo:
    """What the balancer's policies need of a chunk, in the collection's key order."""

    min: Any
    max: Any
    shard: str
    zone: str | None = None  # used when no zone ranges are given (see chunk_zones)
    jumbo: bool = False
    last_migrated: float | None = None  # epoch seconds of the last migration involving it; None: never
    size: int | None = None  # estimated data size in bytes, when known (defragmentation)


class Straddling:
    """The zone of a chunk that crosses a zone boundary: equal only to itself (identity), so
    such a chunk merges with nothing (the balancer must split it at the boundary first)."""

    def __repr__(self) -> str:
        return "<straddles a zone boundary>"


def chunk_zones(chunks: Sequence[ChunkInfo], zone_ranges: Iterable[ZoneRangeT] | None) -> list[Any]:
    """Each chunk's zone: from `zone_ranges` when given (None outside every range), else `chunk.zone`."""
    if zone_ranges is None:
        return [c.zone for c in chunks]
    ranges = sorted(zone_ranges, key=lambda r: r[0])  # non-overlapping, as the catalog keeps them
    mins = [r[0] for r in ranges]
    out: list[Any] = []
    for c in chunks:
        i = bisect.bisect_right(mins, c.min) - 1  # the last range starting at or before the chunk
        if i >= 0 and c.min < ranges[i][1]:
            out.append(ranges[i][2] if c.max <= ranges[i][1] else Straddling())
        elif i + 1 < len(ranges) and ranges[i + 1][0] < c.max:  # a range starts inside the chunk
            out.append(Straddling())
        else:
            out.append(None)
    return out


def history_purgeable(
    c: ChunkInfo, now: float, history_window_secs: float, txn_lifetime_secs: float = TRANSACTION_LIFETIME_LIMIT_SECS
) -> bool:
    """Never migrated, or the last migration is more than both windows ago."""
    return c.last_migrated is None or now - c.last_migrated > max(history_window_secs, txn_lifetime_secs)


def runs(chunks: Sequence[ChunkInfo], zones: Sequence[Any], eligible: Sequence[bool]) -> list[tuple[int, int]]:
    """Maximal [i, j) index runs of >= 2 eligible chunks that are contiguous, on one shard, in one zone."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(chunks):
        j = i + 1
        if eligible[i]:
            while (
                j < len(chunks)
                and eligible[j]
                and chunks[j].shard == chunks[i].shard
                and zones[j] == zones[i]
                and chunks[j - 1].max == chunks[j].min
            ):
                j += 1
            if j - i >= 2:
                out.append((i, j))
        i = j
    return out


def mergeable_runs(
    chunks: Sequence[ChunkInfo],
    zone_ranges: Iterable[ZoneRangeT] | None = None,
    *,
    now: float,
    history_window_secs: float,
    txn_lifetime_secs: float = TRANSACTION_LIFETIME_LIMIT_SECS,
) -> list[tuple[int, int]]:
    """Index runs [i, j) of mergeable chunks (MongoDB's definition); a jumbo chunk, a recently
    migrated chunk, a gap, another shard or another zone each ends a run."""
    zones = chunk_zones(chunks, zone_ranges)
    eligible = [
        not c.jumbo
        and not isinstance(z, Straddling)
        and history_purgeable(c, now, history_window_secs, txn_lifetime_secs)
        for c, z in zip(chunks, zones)
    ]
    return runs(chunks, zones, eligible)


def merge_actions(
    ns: str,
    chunks: Sequence[ChunkInfo],
    zone_ranges: Iterable[ZoneRangeT] | None = None,
    *,
    now: float,
    history_window_secs: float,
    txn_lifetime_secs: float = TRANSACTION_LIFETIME_LIMIT_SECS,
    outstanding: int = 0,
    max_outstanding: int = MAX_OUTSTANDING,
) -> list[dict[str, Any]]:
    """The merges to issue now: at most `max_outstanding - outstanding` of them, shard by shard
    as MongoDB's loop goes ("for each shard: for each namespace"), in key order within a shard."""
    found = mergeable_runs(
        chunks, zone_ranges, now=now, history_window_secs=history_window_secs, txn_lifetime_secs=txn_lifetime_secs
    )
    found.sort(key=lambda r: (chunks[r[0]].shard, r[0]))
    room = max(0, max_outstanding - outstanding)
    return [
        {"type": "merge", "ns": ns, "shard": chunks[i].shard, "min": chunks[i].min, "max": chunks[j - 1].max}
        for i, j in found[:room]
    ]


# ----------------------------------------------------------------- scheduling (MongoDB's)


def enabled(cluster_enabled: bool, collection_enabled: bool, defragmenting: bool = False) -> bool:
    """`autoMergerEnabled` cluster-wide and per collection; a collection being defragmented is
    left to the defragmentation policy, which merges it anyway."""
    return cluster_enabled and collection_enabled and not defragmenting


def scan_due(last_scan_at: float | None, now: float, interval_secs: float) -> bool:
    """Look for mergeable chunks every `autoMergerIntervalSecs` (default 1 hour)."""
    return last_scan_at is None or now - last_scan_at >= interval_secs


def throttle_wait(last_issued_at: float | None, now: float, throttling_ms: float) -> float:
    """Seconds to wait before the next auto-merge action for one collection: MongoDB spaces two
    of them `autoMergerThrottlingMS` (default 15 s) apart."""
    if last_issued_at is None:
        return 0.0
    return max(0.0, last_issued_at + throttling_ms / 1000.0 - now)


def from_collection(
    coll: Any, last_migrated: dict[bytes, float] | None = None, sizes: dict[bytes, int] | None = None
) -> tuple[list[ChunkInfo], list[ZoneRangeT]]:
    """A catalog `Collection`'s chunks and zone ranges with encoded bounds (keyed by `min_key`
    in `last_migrated` and `sizes`); map an action's bytes back with `coll.chunk_index`."""
    last_migrated, sizes = last_migrated or {}, sizes or {}
    chunks = [
        ChunkInfo(
            c.min_key,
            c.max_key,
            c.shard,
            jumbo=c.jumbo,
            last_migrated=last_migrated.get(c.min_key),
            size=sizes.get(c.min_key),
        )
        for c in coll.chunks
    ]
    return chunks, [(z.min_key, z.max_key, z.zone) for z in coll.zones]
