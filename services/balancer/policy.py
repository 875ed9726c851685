"""The balancer's chunk-selection policy (docs/reference/balancer.md), pure: no I/O.

`plan(snapshot)` turns a cluster snapshot into one round's actions: the splits that zone
boundaries require, then the migrations.  `violations(snapshot, ns)` lists everything
that keeps one collection from being balanced (for `balancer collection-status`).  The
service and the CLI call the same functions, so `shardlog balancer plan` prints what a
round would issue.

The rules, per collection and in this order (docs/reference/balancer.md, "Chunk selection"):

1. ``drain``: a chunk on a draining shard moves, whole, to the least loaded shard its
   zone allows.  Jumbo chunks too: a ``drain`` migration is issued with ``forceJumbo``,
   since a shard cannot be removed otherwise (docs/reference/balancer.md, "Jumbo chunks").
2. ``zoneViolation``: a chunk inside a zone range but on a shard outside the zone moves,
   whole, to the least loaded shard of the zone.  Jumbo chunks are left where they are.
3. ``chunksImbalance``: per zone (the named ones, then the unzoned ranges), from the
   donor to the recipient when their loads differ by at least 3 × the max chunk size
   (a difference below that stops the zone), the donor holds more than its ideal and the
   recipient less than its ideal rounded down to a whole byte.  Shards are compared by
   their data of the *whole* collection, wherever it lies (this zone, other zones, no
   zone), as MongoDB's ``_getMostOverloadedShard`` / ``_getLeastLoadedReceiverShard``
   read a shard's data size of the collection.  The donor is the available shard holding
   the most, whatever zones it is in; the recipient the available shard holding the
   least among those that may hold the zone's data (in the zone, not draining).  What
   moves is a range of the zone being balanced: from the min of the donor's first
   non-jumbo chunk in the zone, with ``max: null`` (the donor cuts up to one max chunk
   size of data from there: moveRange without max).  A donor with no chunk it may give
   in the zone (only jumbo ones, or none there) is passed over for the next most loaded
   shard (MongoDB gives up on the zone instead).

Splits: a chunk that crosses a zone boundary is split at the
boundary; it is not moved in the same round (its zone is only known once it is split).

Each shard takes part in at most one migration per round (as in MongoDB, a shard is
available only if no migration chosen earlier in the same
round involves it, and it runs one migration at a time), so at most ⌊n/2⌋ run in
parallel (docs/reference/balancer.md).  A shard marked ``available: false`` is already busy this round.

Load: a shard's data divided by its capacity weight (default 1, MongoDB's behaviour: a
weight-2 shard aims for twice the data).  Rules 1 and 2 send a chunk to the shard of its
zone with the least data of the collection *in that zone*; rule 3 reads the shard's data
of the whole collection.  The zone's shards are the shards in the zone (every shard for
the unzoned ranges), draining and busy ones included; the ideal of a shard for a zone is
(the collection's data on the zone's shards) × weight / (their total weight): with
weights of 1, that data divided by the number of the zone's shards (MongoDB's
``idealDataSizePerShardForZone``).  The max chunk size is the collection's when set,
else the cluster's.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import ValidationError, model_validator

from domain.shardkey import KeyPattern, from_ejson
from schemas import balancer_policy as _schema
from schemas.balancer_policy import (
    MB,
    Bound,
    ChunkDoc,
    ChunkRange,
    CollectionDoc,
    Migration,
    MigrationReason,
    Plan,
    Settings,
    ShardInfo,
    Split,
    ZoneRangeDoc,
)

__all__ = [
    "MB",
    "Bound",
    "ChunkDoc",
    "ChunkRange",
    "CollectionDoc",
    "Migration",
    "Plan",
    "Settings",
    "ShardInfo",
    "Snapshot",
    "SnapshotError",
    "Split",
    "Violation",
    "ZoneRangeDoc",
    "describe",
    "plan",
    "violations",
]

IMBALANCE_CHUNKS = 3  # MongoDB: a zone is balanced once donor and recipient differ by less than 3 max chunk sizes

# ------------------------------------------------------------------------ the snapshot


class Snapshot(_schema.Snapshot):
    """The snapshot's shape (schemas/balancer_policy.py) and what makes it a routing table:
    known and unique shards and collections, a valid shard key, chunk bounds naming its
    fields, zone ranges that parse and do not overlap."""

    @model_validator(mode="after")
    def _consistent(self) -> Snapshot:
        ids = set()
        for i, s in enumerate(self.shards):
            if s.id in ids:
                raise ValueError(f"shards.{i}.id: duplicate shard {s.id!r}")
            ids.add(s.id)
        names = set()
        for ci, coll in enumerate(self.collections):
            where = f"collections.{ci}"
            if coll.ns in names:
                raise ValueError(f"{where}.ns: duplicate collection {coll.ns!r}")
            names.add(coll.ns)
            try:
                coll._pattern = pattern = KeyPattern.parse(coll.key)
            except ValueError as e:
                raise ValueError(f"{where}.key: {e}") from None
            coll._zones = _zone_ranges(coll, pattern, where)
            fields = pattern.fields
            for i, c in enumerate(coll.chunks):  # cheap per-chunk checks only: bounds are encoded lazily
                if c["shard"] not in ids:
                    raise ValueError(f"{where}.chunks.{i}.shard: unknown shard {c['shard']!r}")
                for end in ("min", "max"):
                    if tuple(c[end]) != fields:
                        raise ValueError(
                            f"{where}.chunks.{i}.{end}: must name exactly the shard key fields "
                            f"{list(fields)} in that order"
                        )
        return self


def _zone_ranges(coll: CollectionDoc, pattern: KeyPattern, where: str) -> list[tuple[bytes, bytes, ZoneRangeDoc]]:
    out = []
    for i, z in enumerate(coll.zones):
        try:
            lo = pattern.encode_bound(pattern.validate_bound(z.min))
            hi = pattern.encode_bound(pattern.validate_bound(z.max))
        except ValueError as e:
            raise ValueError(f"{where}.zones.{i}: {e}") from None
        if lo >= hi:
            raise ValueError(f"{where}.zones.{i}: min must sort below max")
        out.append((lo, hi, z))
    out.sort(key=lambda t: t[0])
    for (_, prev_hi, prev), (lo, _, z) in zip(out, out[1:]):
        if lo < prev_hi:
            raise ValueError(f"{where}.zones: ranges of zones {prev.zone!r} and {z.zone!r} overlap")
    return out


def describe(error: ValidationError) -> str:
    """The first problem of a snapshot in one line, naming the field."""
    err = error.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


class SnapshotError(ValueError):
    """A snapshot that parses but cannot be a routing table (overlapping chunks...)."""


# ---------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Violation:
    """Why a collection is not balanced; `min`/`max` name a chunk (None for an imbalance)."""

    reason: Literal["draining", "zoneViolation", "zoneBoundary", "chunksImbalance", "jumbo"]
    shard: str
    zone: str | None
    min: Bound | None
    max: Bound | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------- chunk layout


def _j(bound: Bound) -> str:
    return json.dumps(bound, separators=(",", ":"))


class _LazyMins(Sequence[bytes]):
    """Encoded chunk minimums, computed when read: a bisect reads O(log n) of them, and
    encoding all 100k bounds would cost more than the rest of the round."""

    _memo: dict[int, bytes]

    def __init__(self, chunks: list[ChunkDoc], encode: Callable[[Bound], bytes]) -> None:
        self._chunks, self._encode, self._memo = chunks, encode, {}

    def __len__(self) -> int:
        return len(self._chunks)

    def __getitem__(self, i: int) -> bytes:  # type: ignore[override]  # only ints (bisect's use), no slices
        if (k := self._memo.get(i)) is None:
            k = self._memo[i] = self._encode(self._chunks[i]["min"])
        return k


def _in_key_order(coll: CollectionDoc) -> tuple[list[ChunkDoc], Sequence[bytes], Callable[[int], bytes]]:
    """The chunks in key order, their encoded mins, and the encoded max of chunk i."""
    pattern: KeyPattern = coll._pattern

    def encode(b: Bound) -> bytes:
        return pattern.encode_bound(from_ejson(b))

    chunks = coll.chunks
    lo = {f: {"$minKey": 1} for f in pattern.fields}
    hi = {f: {"$maxKey": 1} for f in pattern.fields}
    # The routing table's shape (what the catalog gives): a chain from MinKey to MaxKey,
    # hence ascending, unless a chunk had min >= max, which no catalog holds.  Comparing
    # the JSON bounds is ~200x cheaper than encoding them.
    if (
        chunks
        and chunks[0]["min"] == lo
        and chunks[-1]["max"] == hi
        and all(a["max"] == b["min"] for a, b in zip(chunks, chunks[1:]))
    ):
        return chunks, _LazyMins(chunks, encode), lambda i: encode(chunks[i]["max"])
    keyed = sorted(((encode(c["min"]), encode(c["max"]), c) for c in chunks), key=lambda t: t[0])
    for k_lo, k_hi, c in keyed:
        if k_lo >= k_hi:
            raise SnapshotError(f"{coll.ns}: chunk {_j(c['min'])} .. {_j(c['max'])}: min must sort below max")
    for (_, prev_hi, prev), (k_lo, _, c) in zip(keyed, keyed[1:]):
        if k_lo < prev_hi:
            raise SnapshotError(f"{coll.ns}: chunks from {_j(prev['min'])} and from {_j(c['min'])} overlap")
    maxes = [t[1] for t in keyed]
    return [t[2] for t in keyed], [t[0] for t in keyed], maxes.__getitem__


class _Layout:
    """One collection's chunks grouped by zone and shard, in one pass over the chunks.

    A chunk belongs to the zone holding its min.  A chunk crossing a zone boundary
    counts in that zone's data but is never moved (it is split first)."""

    def __init__(self, coll: CollectionDoc, snap: Snapshot):
        self.coll = coll
        self.max_chunk = coll.max_chunk_size(snap.settings)
        self.shards = snap.shards
        self.chunks, mins, max_of = _in_key_order(coll)
        n = len(self.chunks)

        # Zone ranges -> runs of chunks (by index) whose min lies in them.
        self.segments: list[tuple[int, int, str | None]] = []
        pos = 0
        for z_lo, z_hi, z in coll._zones:
            lo, hi = bisect.bisect_left(mins, z_lo), bisect.bisect_left(mins, z_hi)
            if lo > pos:
                self.segments.append((pos, lo, None))
            if hi > lo:
                self.segments.append((lo, hi, z.zone))
            pos = max(pos, hi)
        if pos < n:
            self.segments.append((pos, n, None))

        # A boundary strictly inside a chunk: that chunk must be split there.
        self.crossing: dict[int, list[tuple[bytes, Bound]]] = {}
        bounds = {k: b for lo, hi, z in coll._zones for k, b in ((lo, z.min), (hi, z.max))}
        for k in sorted(bounds):
            i = bisect.bisect_right(mins, k) - 1
            if i >= 0 and mins[i] < k < max_of(i):
                self.crossing.setdefault(i, []).append((k, bounds[k]))

        self.zone_names = sorted({z.zone for z in coll.zones})
        self.members = {z: {s.id for s in self.shards if z in s.zones} for z in self.zone_names}
        draining = {s.id for s in self.shards if s.draining}

        # The one pass: data per zone and shard, and the first chunk each rule may pick.
        self.sizes: dict[str | None, dict[str, int]] = {}
        self.movable: dict[str | None, dict[str, int]] = {}  # imbalance: per shard, first non-jumbo chunk
        self.drain: dict[str, dict[str | None, int]] = {}  # per draining shard, first chunk per zone
        self.misplaced: dict[str, dict[str | None, int]] = {}  # per shard, first non-jumbo chunk per violated zone
        crossing, chunks = self.crossing, self.chunks
        for lo, hi, zone in self.segments:
            size = self.sizes.setdefault(zone, {})
            first = self.movable.setdefault(zone, {})
            allowed = self.members.get(zone) if zone is not None else None
            for i in range(lo, hi):
                c = chunks[i]
                s = c["shard"]
                size[s] = size.get(s, 0) + c["sizeBytes"]
                if i in crossing:
                    continue  # split first: its zone is only known then
                if s in draining:
                    self.drain.setdefault(s, {}).setdefault(zone, i)
                elif allowed is not None and s not in allowed and not c.get("jumbo"):
                    self.misplaced.setdefault(s, {}).setdefault(zone, i)
                if s not in first and not c.get("jumbo"):
                    first[s] = i  # whatever zones s is in: rule 3 gives a range of this zone
        # Rule 3 reads each shard's data of the whole collection, whatever zones it lies in.
        self.totals: dict[str, int] = {}
        for size in self.sizes.values():
            for s, b in size.items():
                self.totals[s] = self.totals.get(s, 0) + b
        self._ideal: dict[str | None, float] = {}

    # -- shards

    def eligible(self, zone: str | None) -> list[ShardInfo]:
        """Shards that may hold the zone's data: not draining, and in the zone if it has one."""
        return [s for s in self.shards if not s.draining and (zone is None or zone in s.zones)]

    def load(self, zone: str | None, s: ShardInfo) -> float:
        """Rules 1 and 2: the shard's data of the collection in `zone`, per unit of weight."""
        return self.sizes.get(zone, {}).get(s.id, 0) / s.weight

    def least_loaded(self, zone: str | None, available: set[str]) -> str | None:
        best, best_load = None, float("inf")
        for s in self.eligible(zone):
            if s.id in available and (load := self.load(zone, s)) < best_load:
                best, best_load = s.id, load
        return best

    def data(self, s: ShardInfo) -> int:
        """The shard's data of the whole collection (rule 3), whatever zones it lies in."""
        return self.totals.get(s.id, 0)

    def total_load(self, s: ShardInfo) -> float:
        return self.data(s) / s.weight

    def ideal_per_weight(self, zone: str | None) -> float:
        """The collection's data on the zone's shards (every shard for the unzoned ranges;
        draining and busy ones too) over their total weight: with weights of 1, that data
        divided by their number (MongoDB's idealDataSizePerShardForZone)."""
        if (ideal := self._ideal.get(zone)) is None:
            members = [s for s in self.shards if zone is None or zone in s.zones]
            weight = sum(s.weight for s in members)
            ideal = self._ideal[zone] = sum(self.data(s) for s in members) / weight if weight else 0.0
        return ideal

    def ideal(self, zone: str | None, s: ShardInfo) -> float:
        return self.ideal_per_weight(zone) * s.weight

    def imbalance(
        self, zone: str | None, donors: list[ShardInfo], recipients: list[ShardInfo]
    ) -> tuple[ShardInfo, ShardInfo] | None:
        """(donor, recipient) if rule 3 asks for a move in `zone`: the shard of `donors`
        (available, whatever zones) with the most data of the collection per unit of weight
        and the shard of `recipients` (available, eligible for the zone) with the least, at
        least 3 max chunk sizes apart, the donor above its ideal and the recipient below it
        (rounded down, as MongoDB divides integers)."""
        if not donors or not recipients:
            return None
        donor = max(donors, key=self.total_load)
        recipient = min(recipients, key=self.total_load)
        if donor is recipient:
            return None
        if self.total_load(donor) - self.total_load(recipient) < IMBALANCE_CHUNKS * self.max_chunk:
            return None  # MongoDB stops only below 3 max chunk sizes: exactly 3 still moves
        if self.data(donor) <= self.ideal(zone, donor):
            return None
        if self.data(recipient) >= math.floor(self.ideal(zone, recipient)):
            return None
        return donor, recipient

    def balance_zones(self) -> list[str | None]:
        # MongoDB: the named zones, then the ranges outside every zone.
        return [*self.zone_names, None]

    # -- actions

    def migration(self, i: int, to: str, reason: MigrationReason, whole: bool = True) -> Migration:
        c = self.chunks[i]
        return Migration(
            ns=self.coll.ns,
            donor=c["shard"],
            recipient=to,
            min=c["min"],
            max=c["max"] if whole else None,
            reason=reason,
        )

    def splits(self) -> list[Split]:
        return [
            Split(
                ns=self.coll.ns,
                chunk=ChunkRange(min=self.chunks[i]["min"], max=self.chunks[i]["max"]),
                at=[b for _, b in at],
            )
            for i, at in sorted(self.crossing.items())
        ]


# ------------------------------------------------------------------------ the policy


def parse(snapshot: Snapshot | dict[str, Any]) -> Snapshot:
    return snapshot if isinstance(snapshot, Snapshot) else Snapshot.model_validate(snapshot)


def plan(snapshot: Snapshot | dict[str, Any]) -> Plan:
    """One balancing round (MongoDB's ChunkSelectionPolicy): splits, then migrations.
    Raises pydantic's ValidationError or SnapshotError on a bad snapshot."""
    snap = parse(snapshot)
    available = {s.id for s in snap.shards if s.available}
    splits: list[Split] = []
    migrations: list[Migration] = []
    for coll in snap.collections:
        if not (coll.balancerEnabled and coll.allowMigrations):
            continue
        lay = _Layout(coll, snap)
        splits += lay.splits()
        migrations += _drain(lay, available)
        migrations += _zone_violations(lay, available)
        migrations += _imbalance(lay, available)
    return Plan(splits=splits, migrations=migrations)


def _take(available: set[str], *shards: str) -> None:
    available.difference_update(shards)  # one migration per shard per round


def _drain(lay: _Layout, available: set[str]) -> list[Migration]:
    """Rule 1: per draining shard, its first chunk (in key order) that has a recipient."""
    return _first_movable(lay, available, lay.drain, "drain")


def _zone_violations(lay: _Layout, available: set[str]) -> list[Migration]:
    """Rule 2: per shard, its first non-jumbo chunk of a zone it is not in that has a recipient."""
    return _first_movable(lay, available, lay.misplaced, "zoneViolation")


def _first_movable(
    lay: _Layout, available: set[str], candidates: dict[str, dict[str | None, int]], reason: MigrationReason
) -> list[Migration]:
    """Per available shard, its first candidate chunk (zone -> chunk index) with an available recipient."""
    out = []
    for s in lay.shards:
        if s.id not in available or s.id not in candidates:
            continue
        for zone, i in sorted(candidates[s.id].items(), key=lambda zi: zi[1]):
            if (to := lay.least_loaded(zone, available)) is not None:
                out.append(lay.migration(i, to, reason))
                _take(available, s.id, to)
                break
    return out


def _imbalance(lay: _Layout, available: set[str]) -> list[Migration]:
    """Rule 3: per zone, most loaded -> least loaded available shard while the zone is imbalanced."""
    return [m for zone in lay.balance_zones() for m in _zone_imbalance(lay, zone, available)]


def _zone_imbalance(lay: _Layout, zone: str | None, available: set[str]) -> Iterator[Migration]:
    """Rule 3 for one zone, taking the shards it uses out of `available` as it goes."""
    eligible = lay.eligible(zone)
    if not eligible or not lay.ideal_per_weight(zone):
        return  # no shard may hold the zone's data, or its shards hold nothing
    stuck: set[str] = set()  # donors with nothing they may give in the zone (jumbo chunks only, or none)
    while True:
        donors = [s for s in lay.shards if s.id in available and s.id not in stuck]
        recipients = [s for s in eligible if s.id in available and s.id not in stuck]
        if (pair := lay.imbalance(zone, donors, recipients)) is None:
            return
        donor, recipient = pair
        i = lay.movable.get(zone, {}).get(donor.id)
        if i is None:
            # MongoDB gives up on the zone here; the next most loaded shard may still move.
            stuck.add(donor.id)
            continue
        _take(available, donor.id, recipient.id)
        yield lay.migration(i, recipient.id, "chunksImbalance", whole=False)


def violations(snapshot: Snapshot | dict[str, Any], ns: str) -> list[Violation]:
    """Everything that keeps `ns` from being balanced, not just the first: chunks on
    draining shards, zone violations, chunks crossing a zone boundary, per-zone imbalance
    (a zone is imbalanced exactly when rule 3 of `plan` would move in it with every shard
    free: busy shards and the shards rules 1 and 2 take are ignored), and jumbo chunks;
    in that order."""
    snap = parse(snapshot)
    coll = next((c for c in snap.collections if c.ns == ns), None)
    if coll is None:
        raise KeyError(f"collection {ns!r} is not in the snapshot")
    lay = _Layout(coll, snap)
    draining = {s.id for s in snap.shards if s.draining}
    found: dict[str, list[Violation]] = {r: [] for r in ("draining", "zoneViolation", "zoneBoundary", "jumbo")}
    for lo, hi, zone in lay.segments:
        allowed = lay.members.get(zone) if zone is not None else None
        for i in range(lo, hi):
            c = lay.chunks[i]
            s = c["shard"]
            if s in draining:
                found["draining"].append(Violation("draining", s, zone, c["min"], c["max"], f"on draining shard {s}"))
            elif allowed is not None and s not in allowed:
                found["zoneViolation"].append(
                    Violation(
                        "zoneViolation",
                        s,
                        zone,
                        c["min"],
                        c["max"],
                        f"in zone {zone!r} but on {s}, which is not in the zone",
                    )
                )
            if i in lay.crossing:
                at = ", ".join(_j(b) for _, b in lay.crossing[i])
                found["zoneBoundary"].append(
                    Violation(
                        "zoneBoundary",
                        s,
                        zone,
                        c["min"],
                        c["max"],
                        f"crosses zone boundaries at {at}: split before it can move",
                    )
                )
            if c.get("jumbo"):
                found["jumbo"].append(
                    Violation(
                        "jumbo",
                        s,
                        zone,
                        c["min"],
                        c["max"],
                        "the balancer does not move it (except off a draining shard)",
                    )
                )
    # Exactly what rule 3 of `plan` would move in each zone were every shard free.
    imbalanced = []
    every = {s.id for s in snap.shards}
    by_id = {s.id: s for s in snap.shards}
    for zone in lay.balance_zones():
        if (m := next(_zone_imbalance(lay, zone, set(every)), None)) is not None:
            donor, recipient = by_id[m.donor], by_id[m.recipient]
            name = "the ranges outside every zone" if zone is None else f"zone {zone!r}"
            imbalanced.append(
                Violation(
                    "chunksImbalance",
                    donor.id,
                    zone,
                    None,
                    None,
                    f"balancing {name}: {donor.id} holds {lay.data(donor)} bytes of the collection "
                    f"(ideal {lay.ideal(zone, donor):.0f}), {recipient.id} holds {lay.data(recipient)} "
                    f"(ideal {lay.ideal(zone, recipient):.0f}): at least {IMBALANCE_CHUNKS} × max chunk size "
                    f"({lay.max_chunk}) apart",
                )
            )
    return [*found["draining"], *found["zoneViolation"], *found["zoneBoundary"], *imbalanced, *found["jumbo"]]
