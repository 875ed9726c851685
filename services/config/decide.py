"""The config server's decisions: a command and the current catalog in, the
events that record its effect out — or a CommandError, and no event at all.

Pure apart from minting epochs and uuids; nothing here touches Kafka or disk.
"""

from __future__ import annotations

import base64
import json
import math
import os
import time
from typing import Any, cast

from domain import clock, ddl, index_ddl
from domain.bsonvalues import from_record, to_record
from domain.catalog import Catalog, Chunk, Collection, Migration, MigrationOutcome, Shard, ZoneRange
from domain.indexes import IndexSpec
from domain.protocol import ErrorCode, check_db_name, check_shard_name, check_zone_name, split_ns
from domain.settings import ClusterSettings, CollectionSettings, validated
from domain.shardkey import (
    MIN_KEY,
    InvalidKeyPattern,
    KeyPattern,
    ShardKeyError,
    from_ejson,
    shell_form,
    shell_range,
    to_ejson,
)
from domain.versions import (
    ChunkVersion,
    hashed_split_points,
    initial_versions,
    merge_version,
    migration_versions,
    moved_primary,
    new_database_version,
    new_epoch,
    new_uuid,
    split_versions,
)
from libs import tracing
from libs.commands import CommandError, Decision
from libs.dispatch import Dispatch
from schemas import Record
from schemas import config as c
from schemas import ddl as d

MAX_INITIAL_CHUNKS_PER_SHARD = 8192

on_command: Dispatch[Catalog, Decision] = Dispatch("config command")


def decide(catalog: Catalog, cmd: Record) -> Decision:
    if not on_command.handles(cmd):
        raise CommandError(ErrorCode.CommandNotFound, f"unknown command {cmd.type!r}")
    # json.loads lets lone surrogates ("\ud800") through.  Events holding one either fail to
    # encode after the config server applied them, or (as dict keys) are written lossily.
    if not _utf8_ok(cmd.model_dump()):
        raise CommandError(ErrorCode.BadValue, "the command holds text that is not valid Unicode")
    return on_command(catalog, cmd)


def _utf8_ok(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


# ------------------------------------------------------------------ names


def _shard(catalog: Catalog, shard: str) -> Shard:
    s = catalog.shards.get(shard)
    if s is None:
        raise CommandError(ErrorCode.ShardNotFound, f"shard {shard!r} does not exist")
    return s


def _collection(catalog: Catalog, ns: str) -> Collection:
    """The sharded collection `ns`, for a change of its chunks, zones or settings: none while a
    DDL coordinator holds it."""
    split_ns(ns)
    _not_in_ddl(catalog, ns)
    coll = catalog.collections.get(ns)
    if coll is None:
        raise CommandError(ErrorCode.NamespaceNotFound, f"collection {ns!r} is not sharded")
    return coll


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    return True


def _bound(coll: Collection, raw: Any, what: str) -> tuple[dict[str, Any], bytes]:
    if not isinstance(raw, dict):
        raise CommandError(
            ErrorCode.BadValue, f"{what} must be a shard key document like {shell_form(coll.pattern.global_min())}"
        )
    try:
        b = coll.pattern.validate_bound(raw)
        key = coll.pattern.encode_bound(b)
    except ShardKeyError as e:
        raise CommandError(ErrorCode.BadValue, f"{what}: {e}") from None
    # The events are JSON, which writes Infinity and NaN as null: the config server would keep
    # the bound it decided while every reader of config.events got a different one.
    if not _finite(b):
        raise CommandError(ErrorCode.BadValue, f"{what}: Infinity and NaN cannot be chunk or zone bounds")
    return b, key


# ----------------------------------------------------------------- shards


def least_loaded_shard(catalog: Catalog) -> str:
    """The shard with the least data, ties by name.  Until shards report data
    sizes, "data" is counted in chunks, then databases the shard is primary of."""
    active = catalog.active_shards()
    if not active:
        raise CommandError(ErrorCode.ShardNotFound, "the cluster has no shard to place data on: add one with add-shard")
    chunks = {s: 0 for s in active}
    for coll in catalog.collections.values():
        for ch in coll.chunks:
            if ch.shard in chunks:
                chunks[ch.shard] += 1
    primaries = {s: len(catalog.primary_of(s)) for s in active}
    return min(active, key=lambda s: (chunks[s], primaries[s], s))


@on_command.register(c.AddShard)
def add_shard(catalog: Catalog, cmd: c.AddShard) -> Decision:
    check_shard_name(cmd.shard)
    if cmd.shard in catalog.shards:
        raise CommandError(ErrorCode.ShardAlreadyExists, f"a shard named {cmd.shard!r} already exists")
    return Decision([c.ShardAdded(shard=cmd.shard)], {"shardAdded": cmd.shard})


@on_command.register(c.RemoveShard)
def remove_shard(catalog: Catalog, cmd: c.RemoveShard) -> Decision:
    s = _shard(catalog, cmd.shard)
    chunks, dbs = catalog.chunk_count(s.id), catalog.primary_of(s.id)
    if not s.draining and len(catalog.active_shards()) == 1 and len(catalog.shards) == 1:
        raise CommandError(ErrorCode.IllegalOperation, f"cannot remove {s.id!r}: it is the last shard of the cluster")
    if not s.draining:
        _not_last_of_a_zone_in_use(catalog, s.id)
    if chunks == 0 and not dbs:
        return Decision([c.ShardRemoved(shard=s.id)], {"state": "completed", "shard": s.id})
    remaining = {"chunks": chunks, "dbs": dbs}
    if s.draining:
        return Decision([], {"state": "ongoing", "shard": s.id, "remaining": remaining})
    if not [x for x in catalog.active_shards() if x != s.id]:
        raise CommandError(ErrorCode.IllegalOperation, f"cannot drain {s.id!r}: no other shard could take its data")
    return Decision([c.ShardDraining(shard=s.id)], {"state": "started", "shard": s.id, "remaining": remaining})


def _not_last_of_a_zone_in_use(catalog: Catalog, shard: str) -> None:
    """MongoDB's removeShard refuses a shard that is the only one of a zone with key ranges:
    the zone's data could go nowhere, and the drain would never end."""
    for zone in sorted(catalog.shards[shard].zones):
        if catalog.zone_in_use(zone) and not catalog.zone_targets(zone, exclude=shard):
            ranges = [
                f"{ns} [{json.dumps(to_ejson(z.min))}, {json.dumps(to_ejson(z.max))})"
                for ns, coll in sorted(catalog.collections.items())
                for z in coll.zones
                if z.zone == zone
            ]
            raise CommandError(
                ErrorCode.ZoneStillInUse,
                f"cannot remove {shard!r}: it is the only shard of zone {zone!r}, which still has key ranges "
                f"({'; '.join(ranges)}); add another shard to the zone or remove the ranges first",
            )


# -------------------------------------------------------------- databases


def _create_database_events(catalog: Catalog, db: str, primary: str | None) -> list[Record]:
    if primary is None:
        primary = least_loaded_shard(catalog)
    elif _shard(catalog, primary).draining:
        raise CommandError(ErrorCode.ShardNotFound, f"shard {primary!r} is draining and cannot be a primary")
    v = new_database_version()
    return [c.DatabaseCreated(db=db, primary=primary, uuid=v.uuid, lastMod=v.last_mod)]


@on_command.register(c.CreateDatabase)
def create_database(catalog: Catalog, cmd: c.CreateDatabase) -> Decision:
    check_db_name(cmd.db)
    _not_in_ddl(catalog, cmd.db)
    existing = catalog.databases.get(cmd.db)
    if existing is not None:
        if cmd.primary not in (None, existing.primary):
            raise CommandError(
                ErrorCode.NamespaceExists, f"database {cmd.db!r} already exists with primary {existing.primary!r}"
            )
        return Decision([], {"db": cmd.db, "primary": existing.primary, "created": False})
    events = _create_database_events(catalog, cmd.db, cmd.primary)
    return Decision(events, {"db": cmd.db, "primary": cast(c.DatabaseCreated, events[0]).primary, "created": True})


# ------------------------------------------------------------ collections


@on_command.register(c.CreateCollection)
def create_collection(catalog: Catalog, cmd: c.CreateCollection) -> Decision:
    db, _ = split_ns(cmd.ns)
    if cmd.ns in catalog.collections or (db in catalog.databases and cmd.ns in catalog.databases[db].collections):
        return Decision([], {"ns": cmd.ns, "created": False})
    _not_in_ddl(catalog, cmd.ns)
    events: list[Record] = []
    if db not in catalog.databases:
        events += _create_database_events(catalog, db, None)
    events.append(c.CollectionCreated(ns=cmd.ns, uuid=new_uuid()))
    return Decision(events, {"ns": cmd.ns, "created": True})


@on_command.register(c.ShardCollection)
def shard_collection(catalog: Catalog, cmd: c.ShardCollection) -> Decision:
    db, _ = split_ns(cmd.ns)
    _not_in_ddl(catalog, cmd.ns)
    try:
        pattern = KeyPattern.parse(cmd.key)
    except InvalidKeyPattern as e:
        raise CommandError(ErrorCode.InvalidOptions, f"invalid shard key: {e}") from None
    if (coll := catalog.collections.get(cmd.ns)) is not None:
        # As MongoDB: the same key and unique again is ok (idempotent); anything else is refused.
        if pattern != coll.pattern or cmd.unique != coll.unique:
            raise CommandError(
                ErrorCode.AlreadyInitialized,
                f"sharding already enabled for collection {cmd.ns} with options "
                f"{{ key: {json.dumps(coll.pattern.spec)}, unique: {json.dumps(coll.unique)} }}",
            )
        primary = catalog.databases[db].primary
        return Decision(
            [],
            {
                "ns": cmd.ns,
                "epoch": coll.epoch,
                "chunks": len(coll.chunks),
                "primary": primary,
                "existing": True,
                "alreadySharded": True,
            },
        )
    if cmd.unique and pattern.is_hashed:
        raise CommandError(ErrorCode.InvalidOptions, "a hashed shard key cannot be unique")
    for index in catalog.indexes.get(cmd.ns, []):  # seed 003: uniqueness is only kept per shard
        if index.unique and (pattern.is_hashed or list(index.paths[: len(pattern.fields)]) != list(pattern.fields)):
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"can't shard collection '{cmd.ns}' with unique index on {shell_form(dict(index.key))} and "
                f"proposed shard key {shell_form(pattern.spec)}. Uniqueness can't be maintained unless "
                "shard key is a prefix",
            )
    hashed_prefix = pattern.hashed_field == pattern.fields[0]
    if cmd.numInitialChunks is not None and not hashed_prefix:
        raise CommandError(ErrorCode.InvalidOptions, "numInitialChunks is only for a shard key with a hashed prefix")
    events: list[Record] = []
    if db not in catalog.databases:  # sharding a collection creates its database, as in MongoDB
        events += _create_database_events(catalog, db, None)
    primary = cast(c.DatabaseCreated, events[0]).primary if events else catalog.databases[db].primary

    epoch = new_epoch()
    # A collection already written to may hold documents, all on its primary: it starts as
    # one chunk there (as in MongoDB, presplitting is for empty collections only).
    tracked = not events and cmd.ns in catalog.databases[db].collections
    if tracked and cmd.numInitialChunks is not None:
        raise CommandError(
            ErrorCode.InvalidOptions,
            f"numInitialChunks is only for an empty collection; {cmd.ns} already exists unsharded",
        )
    zones = _zones_for_key(catalog, cmd.ns, pattern)
    if zones and not tracked:
        chunks = _initial_chunks_for_zones(catalog, pattern, zones, primary, epoch)
    elif hashed_prefix and not tracked:
        shards = catalog.active_shards()
        n = cmd.numInitialChunks or 2 * len(shards)
        if not 1 <= n <= MAX_INITIAL_CHUNKS_PER_SHARD * len(shards):
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"numInitialChunks must be between 1 and {MAX_INITIAL_CHUNKS_PER_SHARD * len(shards)}, got {n}",
            )
        chunks = hashed_initial_chunks(pattern, shards, n, epoch)
    else:
        lo, hi = pattern.global_min(), pattern.global_max()
        chunks = [c.ChunkDoc(min=to_ejson(lo), max=to_ejson(hi), shard=primary, version=(1, 0))]
    events.append(
        c.CollectionSharded(ns=cmd.ns, key=pattern.spec, unique=cmd.unique, epoch=epoch, uuid=new_uuid(), chunks=chunks)
    )
    return Decision(
        events, {"ns": cmd.ns, "epoch": epoch, "chunks": len(chunks), "primary": primary, "existing": tracked}
    )


def _zones_for_key(catalog: Catalog, ns: str, pattern: KeyPattern) -> list[ZoneRange]:
    """The zone ranges assigned to `ns` before it is sharded, checked against its shard key: as
    MongoDB's shardCollection, refused when one names other fields (or, for the hashed field,
    values that are no hashes)."""
    zones = catalog.unsharded_zones.get(ns, [])
    for z in zones:
        try:
            if tuple(z.min) != pattern.fields:
                raise ShardKeyError("other fields")
            pattern.validate_bound(to_ejson(z.min))
            pattern.validate_bound(to_ejson(z.max))
        except ShardKeyError as e:
            raise CommandError(
                ErrorCode.InvalidOptions,
                f"the proposed shard key {shell_form(pattern.spec)} does not match the existing zone "
                f"{z.zone!r} {shell_range(z.min, z.max)} ({e}): remove the range or shard on its fields",
            ) from None
    return zones


def _initial_chunks_for_zones(
    catalog: Catalog, pattern: KeyPattern, zones: list[ZoneRange], primary: str, epoch: str
) -> list[c.ChunkDoc]:
    """An empty collection with zone ranges starts split at their bounds (MongoDB's
    SingleChunkPerTag): one chunk per range, on a shard of its zone (round robin over the
    zone's shards), and the gaps between ranges as chunks on the primary."""
    ranges = sorted(((pattern.encode_bound(z.min), pattern.encode_bound(z.max), z) for z in zones), key=lambda r: r[0])
    pieces: list[tuple[dict[str, Any], dict[str, Any], str]] = []
    lo: dict[str, Any] = pattern.global_min()
    lo_key = pattern.encode_bound(lo)
    turn: dict[str, int] = {}
    for z_lo, z_hi, z in ranges:
        if lo_key < z_lo:
            pieces.append((lo, z.min, primary))
        targets = catalog.zone_targets(z.zone)
        if not targets:
            raise CommandError(
                ErrorCode.ZoneNotFound, f"zone {z.zone!r} has no shard to place {shell_range(z.min, z.max)} on"
            )
        n = turn.get(z.zone, 0)
        turn[z.zone] = n + 1
        pieces.append((z.min, z.max, targets[n % len(targets)]))
        lo, lo_key = z.max, z_hi
    if lo_key < pattern.encode_bound(pattern.global_max()):
        pieces.append((lo, pattern.global_max(), primary))
    versions = initial_versions(epoch, len(pieces))
    return [
        c.ChunkDoc(min=to_ejson(a), max=to_ejson(b), shard=s, version=v.pair) for (a, b, s), v in zip(pieces, versions)
    ]


def hashed_initial_chunks(pattern: KeyPattern, shards: list[str], n: int, epoch: str) -> list[c.ChunkDoc]:
    """n chunks evenly over the hash space; each shard gets a contiguous run of them."""
    points = hashed_split_points(n)
    rest = {f: MIN_KEY for f in pattern.fields[1:]}
    bounds = [pattern.global_min()] + [{pattern.fields[0]: p, **rest} for p in points] + [pattern.global_max()]
    versions = initial_versions(epoch, n)
    # Shard j gets chunks [j*n/S, (j+1)*n/S): contiguous runs whose sizes differ by at most one.
    # (i // (n // S)) % S wrapped around when S does not divide n, e.g. a a b b a for 5 on 2.
    return [
        c.ChunkDoc(
            min=to_ejson(bounds[i]),
            max=to_ejson(bounds[i + 1]),
            shard=shards[i * len(shards) // n],
            version=versions[i].pair,
        )
        for i in range(n)
    ]


@on_command.register(c.SplitChunk)
def split_chunk(catalog: Catalog, cmd: c.SplitChunk) -> Decision:
    coll = _collection(catalog, cmd.ns)
    if not cmd.at:
        raise CommandError(ErrorCode.BadValue, "give at least one split point")
    points = [_bound(coll, p, f"split point {i + 1}") for i, p in enumerate(cmd.at)]
    keys = [k for _, k in points]
    if any(a >= b for a, b in zip(keys, keys[1:])):
        raise CommandError(ErrorCode.BadValue, "split points must be sorted ascending and distinct")
    chunk = coll.chunks[coll.chunk_index(keys[0])]
    _not_migrating(catalog, coll, chunk.min_key, chunk.max_key)
    for p, k in points:
        if not chunk.min_key < k < chunk.max_key:
            raise CommandError(
                ErrorCode.BadValue,
                f"split point {shell_form(p)} is not strictly inside the chunk {shell_range(chunk.min, chunk.max)}",
            )
    event = _split_event(coll, chunk, [p for p, _ in points])
    return Decision([event], {"ns": coll.ns, "chunks": [d.model_dump() for d in event.chunks]})


def _split_event(
    coll: Collection, chunk: Chunk, points: list[dict[str, Any]], version: ChunkVersion | None = None
) -> c.ChunkSplit:
    """`chunk` cut at `points` (sorted, strictly inside): the pieces take the next minors."""
    bounds = [chunk.min] + points + [chunk.max]
    versions = split_versions(version or coll.version(), len(points) + 1)
    new = [
        c.ChunkDoc(min=to_ejson(bounds[i]), max=to_ejson(bounds[i + 1]), shard=chunk.shard, version=versions[i].pair)
        for i in range(len(bounds) - 1)
    ]
    return c.ChunkSplit(ns=coll.ns, epoch=coll.epoch, min=to_ejson(chunk.min), max=to_ejson(chunk.max), chunks=new)


@on_command.register(c.MergeChunks)
def merge_chunks(catalog: Catalog, cmd: c.MergeChunks) -> Decision:
    coll = _collection(catalog, cmd.ns)
    lo, lo_key = _bound(coll, cmd.min, "min")
    hi, hi_key = _bound(coll, cmd.max, "max")
    if lo_key >= hi_key:
        raise CommandError(ErrorCode.BadValue, "min must be below max")
    first = coll.chunk_index(lo_key)
    if coll.chunks[first].min_key != lo_key:
        raise CommandError(ErrorCode.BadValue, f"min {shell_form(lo)} is not the lower bound of a chunk")
    last = coll.chunk_index(hi_key) if hi_key < coll.chunks[-1].max_key else len(coll.chunks) - 1
    if coll.chunks[last].min_key == hi_key:
        last -= 1
    if coll.chunks[last].max_key != hi_key:
        raise CommandError(ErrorCode.BadValue, f"max {shell_form(hi)} is not the upper bound of a chunk")
    run = coll.chunks[first : last + 1]
    _not_migrating(catalog, coll, lo_key, hi_key)
    if len(run) == 1:
        return Decision([], {"ns": coll.ns, "merged": 0, "chunk": run[0].doc().model_dump()})
    owners = sorted({ch.shard for ch in run})
    if len(owners) > 1:
        raise CommandError(
            ErrorCode.IllegalOperation,
            f"chunks in {shell_range(lo, hi)} are on several shards ({', '.join(owners)}); merge needs them on one",
        )
    merged = c.ChunkDoc(min=to_ejson(lo), max=to_ejson(hi), shard=owners[0], version=merge_version(coll.version()).pair)
    return Decision(
        [c.ChunksMerged(ns=coll.ns, epoch=coll.epoch, chunk=merged)],
        {"ns": coll.ns, "merged": len(run), "chunk": merged.model_dump()},
    )


# ------------------------------------------------------------------ zones


@on_command.register(c.AddShardToZone)
def add_shard_to_zone(catalog: Catalog, cmd: c.AddShardToZone) -> Decision:
    s = _shard(catalog, cmd.shard)
    check_zone_name(cmd.zone)
    if cmd.zone in s.zones:
        return Decision([], {"shard": s.id, "zones": sorted(s.zones)})
    return Decision(
        [c.ShardZoneAdded(shard=s.id, zone=cmd.zone)], {"shard": s.id, "zones": sorted(s.zones | {cmd.zone})}
    )


@on_command.register(c.RemoveShardFromZone)
def remove_shard_from_zone(catalog: Catalog, cmd: c.RemoveShardFromZone) -> Decision:
    s = _shard(catalog, cmd.shard)
    if cmd.zone not in s.zones:
        return Decision([], {"shard": s.id, "zones": sorted(s.zones)})
    others = [x for x in catalog.shards.values() if x.id != s.id and cmd.zone in x.zones]
    if not others and catalog.zone_in_use(cmd.zone):
        raise CommandError(
            ErrorCode.ZoneStillInUse,
            f"{s.id!r} is the last shard of zone {cmd.zone!r}, which still has key ranges: remove those first",
        )
    return Decision(
        [c.ShardZoneRemoved(shard=s.id, zone=cmd.zone)], {"shard": s.id, "zones": sorted(s.zones - {cmd.zone})}
    )


def _unsharded_range(catalog: Catalog, ns: str, raw_lo: Any, raw_hi: Any) -> tuple[Any, bytes, Any, bytes]:
    """The bounds of a zone range of a namespace not (yet) sharded, as MongoDB 4.0.2+ takes them:
    documents naming the same fields in the same order, min below max (ordered as an ascending
    key over those fields); the shard key is checked against them when the collection is sharded."""
    split_ns(ns)
    _not_in_ddl(catalog, ns)
    if not isinstance(raw_lo, dict) or not isinstance(raw_hi, dict) or not raw_lo or tuple(raw_lo) != tuple(raw_hi):
        raise CommandError(
            ErrorCode.BadValue,
            f"min {shell_form(raw_lo)} and max {shell_form(raw_hi)} must be documents naming the same fields "
            "in the same order (the shard key's, once the collection is sharded)",
        )
    try:
        pattern = KeyPattern.parse(dict.fromkeys(raw_lo, 1))
    except InvalidKeyPattern as e:
        raise CommandError(ErrorCode.BadValue, f"zone range bounds: {e}") from None
    out: list[Any] = []
    for raw, what in ((raw_lo, "min"), (raw_hi, "max")):
        try:
            b = pattern.validate_bound(raw)
        except ShardKeyError as e:
            raise CommandError(ErrorCode.BadValue, f"{what}: {e}") from None
        if not _finite(b):
            raise CommandError(ErrorCode.BadValue, f"{what}: Infinity and NaN cannot be chunk or zone bounds")
        out += [b, pattern.encode_bound(b)]
    if out[1] >= out[3]:
        raise CommandError(ErrorCode.BadValue, "min must be below max")
    zones = catalog.unsharded_zones.get(ns, [])
    if zones and tuple(zones[0].min) != pattern.fields:
        raise CommandError(
            ErrorCode.BadValue,
            f"the zone ranges of {ns} name the fields {', '.join(zones[0].min)}; "
            f"{shell_range(out[0], out[2])} names {', '.join(pattern.fields)}",
        )
    return out[0], out[1], out[2], out[3]


@on_command.register(c.AssignZoneRange)
def assign_zone_range(catalog: Catalog, cmd: c.AssignZoneRange) -> Decision:
    coll = _collection(catalog, cmd.ns) if cmd.ns in catalog.collections else None
    check_zone_name(cmd.zone)
    if not any(cmd.zone in s.zones for s in catalog.shards.values()):
        raise CommandError(ErrorCode.ZoneNotFound, f"zone {cmd.zone!r} has no shard: add a shard to it first")
    if coll is None:  # unsharded or not existing: recorded for when it is sharded, as MongoDB 4.0.2+ does
        lo, lo_key, hi, hi_key = _unsharded_range(catalog, cmd.ns, cmd.min, cmd.max)
    else:
        lo, lo_key = _bound(coll, cmd.min, "min")
        hi, hi_key = _bound(coll, cmd.max, "max")
    if lo_key >= hi_key:
        raise CommandError(ErrorCode.BadValue, "min must be below max")
    for z in catalog.zone_ranges(cmd.ns):
        if z.min_key == lo_key and z.max_key == hi_key and z.zone == cmd.zone:
            return Decision([], {"ns": cmd.ns, "zone": cmd.zone})
        if z.min_key < hi_key and lo_key < z.max_key:
            raise CommandError(
                ErrorCode.RangeOverlapConflict,
                f"{shell_range(lo, hi)} overlaps the range {shell_range(z.min, z.max)} of zone {z.zone!r}",
            )
    return Decision(
        [c.ZoneRangeAssigned(ns=cmd.ns, min=to_ejson(lo), max=to_ejson(hi), zone=cmd.zone)],
        {"ns": cmd.ns, "zone": cmd.zone},
    )


@on_command.register(c.RemoveZoneRange)
def remove_zone_range(catalog: Catalog, cmd: c.RemoveZoneRange) -> Decision:
    if cmd.ns in catalog.collections:
        coll = _collection(catalog, cmd.ns)
        lo, lo_key = _bound(coll, cmd.min, "min")
        hi, hi_key = _bound(coll, cmd.max, "max")
    else:
        lo, lo_key, hi, hi_key = _unsharded_range(catalog, cmd.ns, cmd.min, cmd.max)
    for z in catalog.zone_ranges(cmd.ns):
        if z.min_key == lo_key and z.max_key == hi_key:
            return Decision(
                [c.ZoneRangeRemoved(ns=cmd.ns, min=to_ejson(lo), max=to_ejson(hi))], {"ns": cmd.ns, "zone": z.zone}
            )
    return Decision([], {"ns": cmd.ns, "zone": None})  # nothing to remove: ok, as MongoDB answers


# --------------------------------------------------------------- settings


@on_command.register(c.SetSetting)
def set_setting(catalog: Catalog, cmd: c.SetSetting) -> Decision:
    model: type[ClusterSettings | CollectionSettings]
    current: ClusterSettings | CollectionSettings
    if cmd.ns is None:
        model, current = ClusterSettings, catalog.settings
    else:
        model, current = CollectionSettings, _collection(catalog, cmd.ns).settings
    try:
        new = validated(model, current, cmd.key, cmd.value)
    except ValueError as e:
        raise CommandError(ErrorCode.BadValue, str(e)) from None
    value = new.model_dump()[cmd.key]
    if cmd.key == "balancerWindow" and value is not None and value["start"] == value["stop"]:
        # [start, stop) would be empty: the balancer would never run.  Refused rather than read
        # as "always" or as one minute (MongoDB's inclusive stop): --clear says "any time".
        raise CommandError(
            ErrorCode.BadValue,
            f"balancerWindow: start and stop are both {value['start']}, an empty window that never balances "
            "(clear the window to balance at any time)",
        )
    aborts: list[c.MigrationAborted] = []
    if cmd.ns is not None and cmd.key == "allowMigrations" and value is False:
        aborts = _abort_migrations_of(catalog, cmd.ns)
    if value == current.model_dump()[cmd.key]:
        return Decision(list(aborts), {"key": cmd.key, "value": value, "ns": cmd.ns, "changed": False})
    return Decision(
        [c.SettingChanged(key=cmd.key, value=None if cmd.value is None else value, ns=cmd.ns), *aborts],
        {"key": cmd.key, "value": value, "ns": cmd.ns, "changed": True}
        | ({"aborted": [e.id for e in aborts]} if cmd.key == "allowMigrations" else {}),
    )


def _abort_migrations_of(catalog: Catalog, ns: str) -> list[c.MigrationAborted]:
    """setAllowMigrations(false) ends the collection's running migrations at once, as MongoDB's
    commit refuses them (ConflictingOperationInProgress): the donor notices the outcome at its
    next step, and a commit it sends later is refused, so nothing is half moved."""
    return [
        c.MigrationAborted(
            id=m.id,
            ns=m.ns,
            reason=f"migrations of {ns} were disallowed (setAllowMigrations false) during migration {m.id}",
            code=ErrorCode.ConflictingOperationInProgress,
        )
        for m in catalog.migrations.values()
        if m.kind == "range" and m.ns == ns
    ]


# ------------------------------------------------------------- migrations


def _migration_chunk_index(coll: Collection, m: Migration) -> int:
    return coll.chunk_index(coll.pattern.encode_bound(from_ejson(m.min)))


def _not_migrating(catalog: Catalog, coll: Collection, lo: bytes, hi: bytes) -> None:
    """Splits and merges wait for a migration of the chunks they touch (MongoDB holds the
    collection's DDL lock for the migration)."""
    for m in catalog.migrations.values():
        if m.ns != coll.ns:
            continue
        ch = coll.chunks[_migration_chunk_index(coll, m)]
        if ch.min_key < hi and lo < ch.max_key:
            raise CommandError(
                ErrorCode.ConflictingOperationInProgress,
                f"migration {m.id} of [{_ej(ch.min)}, {_ej(ch.max)}) is in progress; try again when it is done",
            )


def _ej(bound: dict[str, Any]) -> str:
    return json.dumps(to_ejson(bound), separators=(",", ":"))


@on_command.register(c.MoveRange)
def move_range(catalog: Catalog, cmd: c.MoveRange) -> Decision:
    coll = _collection(catalog, cmd.ns)
    lo, lo_key = _bound(coll, cmd.min, "min")
    chunk = coll.chunks[coll.chunk_index(lo_key)]
    if cmd.max is not None:
        hi, hi_key = _bound(coll, cmd.max, "max")
        if hi_key <= lo_key:
            raise CommandError(ErrorCode.BadValue, "min must be below max")
        if hi_key > chunk.max_key:
            raise CommandError(
                ErrorCode.BadValue,
                f"[{_ej(lo)}, {_ej(hi)}) spans several chunks; a range must lie within "
                f"one chunk, here [{_ej(chunk.min)}, {_ej(chunk.max)})",
            )
    target = _shard(catalog, cmd.to)
    if chunk.shard == cmd.to:
        return Decision([], {"ns": cmd.ns, "moved": False, "reason": f"the range is already on {cmd.to}"})
    if target.draining:
        raise CommandError(ErrorCode.ShardNotFound, f"shard {cmd.to!r} is draining and cannot receive data")
    if not coll.settings.allowMigrations:
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"migrations of {cmd.ns} are not allowed (set-allow-migrations {cmd.ns} true)",
        )
    if chunk.jumbo and not cmd.forceJumbo:
        raise CommandError(
            ErrorCode.ChunkTooBig, f"chunk [{_ej(chunk.min)}, {_ej(chunk.max)}) is jumbo; move it with --force-jumbo"
        )
    want = (cmd.ns, to_ejson(lo), to_ejson(hi) if cmd.max is not None else None, chunk.shard, cmd.to)
    for shard in (chunk.shard, cmd.to):
        m = catalog.migration_of(shard)
        if m is None:
            continue
        if (m.ns, m.min, m.max, m.donor, m.recipient) == want:  # a retry joins the migration under way
            return Decision(
                [],
                {"ns": cmd.ns, "id": m.id, "donor": m.donor, "recipient": m.recipient, "joined": True, "moved": True},
            )
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"shard {shard} already takes part in migration {m.id} ({m.ns} {m.donor} -> {m.recipient});"
            f" a shard runs one migration at a time",
        )
    mid = new_uuid()
    event = c.MigrationRequested(
        id=mid,
        ns=cmd.ns,
        epoch=coll.epoch,
        min=want[1],
        max=want[2],
        donor=chunk.shard,
        recipient=cmd.to,
        forceJumbo=cmd.forceJumbo,
        # The request's trace (this command's span): the migration's steps on donor and recipient continue it.
        traceparent=tracing.traceparent(),
    )
    return Decision([event], {"ns": cmd.ns, "id": mid, "donor": chunk.shard, "recipient": cmd.to, "moved": True})


@on_command.register(c.CommitMigration)
def commit_migration(catalog: Catalog, cmd: c.CommitMigration) -> Decision:
    m = catalog.migrations.get(cmd.id)
    if m is not None and m.kind != "range":
        raise CommandError(ErrorCode.BadValue, f"{cmd.id} is a primary move: commit it with CommitPrimaryMove")
    if m is None:
        outcome = catalog.outcomes.get(cmd.id)
        if outcome == "committed":  # a retried commit
            return Decision([], {"id": cmd.id, "outcome": outcome})
        raise CommandError(ErrorCode.NoSuchMigration, f"migration {cmd.id} is not active ({outcome or 'unknown'})")
    coll = catalog.collections.get(m.ns)
    if coll is None or coll.epoch != m.epoch:
        raise CommandError(ErrorCode.StaleEpoch, f"{m.ns} was dropped or resharded during migration {m.id}")
    _not_in_ddl(catalog, m.ns)  # a DDL froze the collection's migrations: this one aborts
    if not coll.settings.allowMigrations:
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress, f"migrations of {m.ns} were disallowed during {m.id}"
        )
    lo, lo_key = _bound(coll, cmd.min, "min")
    hi, hi_key = _bound(coll, cmd.max, "max")
    i = coll.chunk_index(lo_key)
    chunk = coll.chunks[i]
    if chunk.shard != m.donor or not lo_key < hi_key <= chunk.max_key or to_ejson(lo) != m.min:
        raise CommandError(
            ErrorCode.BadValue, f"[{_ej(lo)}, {_ej(hi)}) is not a range of {m.donor} requested by {m.id}"
        )
    events: list[Record] = []
    version = coll.version()
    control_min: dict[str, Any] | None
    points = [p for p, k in ((lo, lo_key), (hi, hi_key)) if chunk.min_key < k < chunk.max_key]
    if points:  # a sub-range of the chunk: split first, then move the piece [lo, hi)
        split = _split_event(coll, chunk, points)
        events.append(split)
        pieces = split.chunks
        version = max((ChunkVersion(*d.version, coll.epoch) for d in pieces), key=lambda v: v.pair)
        moving = next(d for d in pieces if d.min == to_ejson(lo))
        donor_keeps = True
        control_min = next(d.min for d in pieces if d.min != moving.min)
    else:
        moving = chunk.doc()
        others = [ch for ch in coll.chunks if ch.shard == m.donor and ch is not chunk]
        donor_keeps = bool(others)
        control_min = to_ejson(others[0].min) if others else None
    moved_v, control_v = migration_versions(version, donor_keeps)
    chunks = [moving.model_copy(update={"shard": m.recipient, "version": moved_v.pair, "jumbo": False})]
    if control_v is not None:
        control = next((d for d in (split.chunks if points else []) if d.min == control_min), None)
        if control is None:
            ch = coll.chunks[coll.chunk_index(coll.pattern.encode_bound(from_ejson(control_min)))]
            control = ch.doc()
        chunks.append(control.model_copy(update={"version": control_v.pair}))
    events.append(
        c.MigrationCommitted(id=m.id, ns=m.ns, epoch=m.epoch, donor=m.donor, recipient=m.recipient, chunks=chunks)
    )
    return Decision(events, {"id": m.id, "outcome": "committed", "chunks": [d.model_dump() for d in chunks]})


@on_command.register(c.AbortMigration)
def abort_migration(catalog: Catalog, cmd: c.AbortMigration) -> Decision:
    m = catalog.migrations.get(cmd.id)
    if m is None:  # already decided: tell the caller which way
        return Decision([], {"id": cmd.id, "outcome": catalog.outcomes.get(cmd.id, "unknown")})
    outcome = MigrationOutcome(False, cmd.code, cmd.reason).text()
    if m.kind == "primary":
        return Decision(
            [c.PrimaryMoveAborted(id=m.id, db=m.ns, reason=cmd.reason, code=cmd.code)],
            {"id": m.id, "outcome": outcome},
        )
    events: list[Record] = [c.MigrationAborted(id=m.id, ns=m.ns, reason=cmd.reason, code=cmd.code)]
    coll = catalog.collections.get(m.ns)
    if cmd.jumbo and coll is not None and coll.epoch == m.epoch:
        events.insert(
            0,
            c.ChunkMarkedJumbo(ns=m.ns, epoch=m.epoch, min=to_ejson(coll.chunks[_migration_chunk_index(coll, m)].min)),
        )
    return Decision(events, {"id": m.id, "outcome": outcome})


@on_command.register(c.GetMigration)
def get_migration(catalog: Catalog, cmd: c.GetMigration) -> Decision:
    if cmd.id is not None:
        m = catalog.migrations.get(cmd.id)
        state = "active" if m else catalog.outcomes.get(cmd.id, "unknown")
        extra: dict[str, Any] = {"migration": m.record()} if m else {}
        if (outcome := catalog.outcome(cmd.id)) is not None and not outcome.committed:
            extra.update(code=outcome.code, reason=outcome.reason)  # why, as fields (state says it in one line)
        return Decision([], {"id": cmd.id, "state": state, **extra})
    return Decision(
        [], {"active": [m.record() for m in catalog.migrations.values() if cmd.ns is None or m.ns == cmd.ns]}
    )


@on_command.register(c.MarkJumbo)
def mark_jumbo(catalog: Catalog, cmd: c.MarkJumbo) -> Decision:
    coll = _collection(catalog, cmd.ns)
    _, key = _bound(coll, cmd.min, "min")
    chunk = coll.chunks[coll.chunk_index(key)]
    if chunk.jumbo:
        return Decision([], {"ns": cmd.ns, "jumbo": True, "marked": False})
    return Decision(
        [c.ChunkMarkedJumbo(ns=cmd.ns, epoch=coll.epoch, min=to_ejson(chunk.min))],
        {"ns": cmd.ns, "jumbo": True, "marked": True},
    )


# ----------------------------------------------------------- movePrimary


@on_command.register(c.MovePrimary)
def move_primary(catalog: Catalog, cmd: c.MovePrimary) -> Decision:
    check_db_name(cmd.db)
    db = catalog.databases.get(cmd.db)
    if db is None:
        raise CommandError(ErrorCode.NamespaceNotFound, f"database {cmd.db!r} does not exist")
    if (running := catalog.ddl_of_database(cmd.db)) is not None:
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"{running.op} of {running.ns} ({running.id}) holds database {cmd.db}; try again when it is done",
        )
    target = _shard(catalog, cmd.to)
    if db.primary == cmd.to:
        return Decision([], {"db": cmd.db, "moved": False, "reason": f"{cmd.to} is already the primary"})
    if target.draining:
        raise CommandError(ErrorCode.ShardNotFound, f"shard {cmd.to!r} is draining and cannot be a primary")
    for shard in (db.primary, cmd.to):
        m = catalog.migration_of(shard)
        if m is None:
            continue
        if (m.kind, m.ns, m.donor, m.recipient) == ("primary", cmd.db, db.primary, cmd.to):
            return Decision(
                [],
                {"db": cmd.db, "id": m.id, "moved": True, "joined": True, "donor": m.donor, "recipient": m.recipient},
            )
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"shard {shard} already takes part in migration {m.id}; a shard runs one migration at a time",
        )
    mid = new_uuid()
    return Decision(
        [c.PrimaryMoveRequested(id=mid, db=cmd.db, donor=db.primary, recipient=cmd.to)],
        {"db": cmd.db, "id": mid, "moved": True, "donor": db.primary, "recipient": cmd.to},
    )


@on_command.register(c.CommitPrimaryMove)
def commit_primary_move(catalog: Catalog, cmd: c.CommitPrimaryMove) -> Decision:
    m = catalog.migrations.get(cmd.id)
    if m is None or m.kind != "primary":
        outcome = catalog.outcomes.get(cmd.id)
        if outcome == "committed":
            return Decision([], {"id": cmd.id, "outcome": outcome})
        raise CommandError(ErrorCode.NoSuchMigration, f"primary move {cmd.id} is not active ({outcome or 'unknown'})")
    if (running := catalog.ddl_of_database(m.ns)) is not None:
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"{running.op} of {running.ns} ({running.id}) froze {m.ns}'s moves",
        )
    db = catalog.databases[m.ns]
    v = moved_primary(db.version)
    return Decision(
        [c.PrimaryMoved(id=m.id, db=m.ns, primary=m.recipient, lastMod=v.last_mod)],
        {"id": m.id, "outcome": "committed", "primary": m.recipient},
    )


@on_command.register(c.AbortPrimaryMove)
def abort_primary_move(catalog: Catalog, cmd: c.AbortPrimaryMove) -> Decision:
    m = catalog.migrations.get(cmd.id)
    if m is None:
        return Decision([], {"id": cmd.id, "outcome": catalog.outcomes.get(cmd.id, "unknown")})
    return Decision(
        [c.PrimaryMoveAborted(id=m.id, db=m.ns, reason=cmd.reason, code=cmd.code)],
        {"id": m.id, "outcome": MigrationOutcome(False, cmd.code, cmd.reason).text()},
    )


# ---------------------------------------------------------- cluster-time keys


@on_command.register(c.RotateClusterTimeKeys)
def rotate_cluster_time_keys(catalog: Catalog, cmd: c.RotateClusterTimeKeys, now: float | None = None) -> Decision:
    """The signing keys that are due (one valid now, the next in advance), with fresh random
    material; nothing when both exist (the timer may ask more often than needed)."""
    due = clock.keys_to_create(
        catalog.keys, time.time() if now is None else now, catalog.settings.KeysRotationIntervalSec
    )
    events: list[Record] = [
        c.ClusterTimeKeyCreated(keyId=key_id, key=base64.b64encode(os.urandom(20)).decode(), expiresAt=expires)
        for key_id, expires in due
    ]
    return Decision(events, {"created": [e.keyId for e in events]})  # type: ignore[attr-defined]


# ------------------------------------------------------- DDL coordinators


def _not_in_ddl(catalog: Catalog, ns: str) -> None:
    """Catalog changes to a namespace (or database) a DDL coordinator holds wait for it: the
    caller retries (ConflictingOperationInProgress), as MongoDB's operations wait for the DDL lock."""
    c = catalog.ddl_holding(ns)
    if c is not None:
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"{c.op} of {c.ns} ({c.id}, phase {c.phase}) holds {ns}; try again when it is done",
        )


def _exists(catalog: Catalog, ns: str) -> bool:
    db = catalog.databases.get(ns.partition(".")[0])
    return ns in catalog.collections or (db is not None and ns in db.collections)


@on_command.register(
    d.DropCollection,
    d.DropDatabase,
    d.RenameCollection,
    d.RefineCollectionShardKey,
    d.CreateCollectionIndexes,
    d.DropCollectionIndexes,
)
def start_ddl(catalog: Catalog, cmd: Record, now: float | None = None) -> Decision:
    """A DDL request: a new coordinator (its state document first), the running one joined, a
    no-op, or refused — before anything is recorded."""
    req = ddl.request_of(cmd)
    running = catalog.ddl_of_database(req.locks[0])
    reply: dict[str, Any] = {"op": req.op, "ns": req.ns}
    if req.op == "dropCollection" and _exists(catalog, req.ns):  # what mongos's drop answers: the indexes it had
        reply["nIndexesWas"] = len(catalog.index_list(req.ns))
    events: list[Record] = []
    if (
        running is not None
        and (running.op, running.ns) == ("dropIndexes", req.ns) == (req.op, req.ns)
        and running.params.get("index") == req.params["index"]
    ):  # joined even once its commit has dropped the names from the catalog
        return Decision([], {**reply, "id": running.id, "started": True, "joined": True})
    if req.op in ("createIndexes", "dropIndexes") and (running is None or (running.op, running.ns) == (req.op, req.ns)):
        # What the request does depends on the indexes listed (unchanged while one runs: it
        # holds the namespace), so it is planned first; its params are what a joiner matches.
        req, events, more = _plan_index_ddl(catalog, req, creating=running is None)
        reply.update(more)
        if running is None and not req.params:
            return Decision(events, {**reply, "id": None, "started": False})
    if running is not None:
        if running.same_request(req.op, req.ns, req.params):
            return Decision([], {**reply, "id": running.id, "started": True, "joined": True})
        raise CommandError(
            ErrorCode.ConflictingOperationInProgress,
            f"{running.op} of {running.ns} ({running.id}, phase {running.phase}) holds database "
            f"{running.db}; one DDL runs at a time per database: try again when it is done",
        )
    if req.op == "dropCollection" and not _exists(catalog, req.ns):
        return Decision([], {**reply, "id": None, "started": False, "dropped": False})  # MongoDB answers ok
    if req.op == "dropDatabase" and req.ns not in catalog.databases:
        return Decision([], {**reply, "id": None, "started": False, "dropped": False})
    if req.op == "renameCollection":
        _check_rename(catalog, req.ns, req.params["to"], req.params["dropTarget"])
    if req.op == "refineCollectionShardKey":
        _check_refine(catalog, req.ns, req.params["key"])
    cid = new_uuid()
    events.append(
        d.DDLStarted(
            id=cid,
            op=req.op,  # type: ignore[arg-type]
            ns=req.ns,
            params=req.params,
            locks=req.locks,
            phase=ddl.Phase.FREEZE,
            shards=sorted(catalog.shards),
            startedAt=time.time() if now is None else now,
        )
    )
    return Decision(events, {**reply, "id": cid, "started": True, "joined": False})


def _plan_index_ddl(
    catalog: Catalog, req: ddl.Request, creating: bool
) -> tuple[ddl.Request, list[Record], dict[str, Any]]:
    """createIndexes / dropIndexes against the indexes `req.ns` lists: the request with what it
    will do as its params (empty: nothing to do), the events that come first (createIndexes
    creates a missing collection, as MongoDB does), and what the reply says besides."""
    coll = catalog.collections.get(req.ns)
    key, unique = (coll.pattern.spec, coll.unique) if coll is not None else (None, False)
    listed = catalog.index_list(req.ns)
    if req.op == "dropIndexes":
        if not _exists(catalog, req.ns):
            raise CommandError(ErrorCode.NamespaceNotFound, f"ns not found {req.ns}")
        names = index_ddl.plan_drop(req.ns, listed, req.params["index"], key, unique)
        params = {**req.params, "names": names, "nIndexesWas": len(listed)} if names else {}
        return ddl.Request(req.op, req.ns, params, req.locks), [], {"nIndexesWas": len(listed), "names": names}
    events: list[Record] = []
    created = False
    if not _exists(catalog, req.ns) and creating:
        db = req.locks[0]
        if db not in catalog.databases:
            events += _create_database_events(catalog, db, None)
        events.append(c.CollectionCreated(ns=req.ns, uuid=new_uuid()))
        created = True
    new = index_ddl.plan_create(listed, [IndexSpec.parse(from_record(r)) for r in req.params["indexes"]], key)
    before = len(listed)
    more: dict[str, Any] = {"createdCollectionAutomatically": created, "numIndexesBefore": before}
    if not new:
        more.update(numIndexesAfter=before, note=index_ddl.ALREADY_EXIST)
    params = {"indexes": [to_record(s.to_mongo()) for s in new], "numIndexesBefore": before} if new else {}
    return ddl.Request(req.op, req.ns, params, req.locks), events, more


def _check_rename(catalog: Catalog, ns: str, to: str, drop_target: bool) -> None:
    if not _exists(catalog, ns):
        raise CommandError(ErrorCode.NamespaceNotFound, f"source namespace {ns} does not exist")
    if _exists(catalog, to) and not drop_target:
        raise CommandError(ErrorCode.NamespaceExists, f"target namespace {to} exists (use dropTarget to replace it)")


def _check_refine(catalog: Catalog, ns: str, key: dict[str, Any]) -> KeyPattern:
    coll = catalog.collections.get(ns)
    if coll is None:
        if _exists(catalog, ns):
            raise CommandError(ErrorCode.NamespaceNotSharded, f"{ns} is not sharded: there is no shard key to refine")
        raise CommandError(ErrorCode.NamespaceNotFound, f"collection {ns} does not exist")
    return ddl.refined_pattern(coll.pattern, key)


def _commit_events(catalog: Catalog, c: ddl.Coordinator) -> list[Record]:
    """The catalog change at the coordinator's point of no return (re-checked: a DDL that can
    no longer commit rolls back)."""
    if c.op == "createIndexes":
        if not _exists(catalog, c.ns):
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {c.ns} is gone: its indexes are not listed")
        return [d.IndexesCreated(ns=c.ns, indexes=[from_record(r) for r in c.params["indexes"]])]
    if c.op == "dropIndexes":
        held = {s.name for s in catalog.indexes.get(c.ns, [])}
        names = [n for n in c.params["names"] if n in held]
        return [d.IndexesDropped(ns=c.ns, names=names)] if names else []
    if c.op == "dropCollection":
        return [d.CollectionDropped(ns=c.ns)] if _exists(catalog, c.ns) else []
    if c.op == "dropDatabase":
        return [d.DatabaseDropped(db=c.ns)] if c.ns in catalog.databases else []
    if c.op == "renameCollection":
        to = c.params["to"]
        _check_rename(catalog, c.ns, to, c.params["dropTarget"])
        epoch = new_epoch() if c.ns in catalog.collections else None
        return [d.CollectionRenamed(ns=c.ns, to=to, epoch=epoch)]
    pattern = _check_refine(catalog, c.ns, c.params["key"])
    return [d.ShardKeyRefined(ns=c.ns, key=pattern.spec, epoch=new_epoch())]


def _ddl_result(catalog: Catalog, c: ddl.Coordinator) -> dict[str, Any]:
    if c.op == "createIndexes":
        before = int(c.params["numIndexesBefore"])
        return {
            "ns": c.ns,
            "numIndexesBefore": before,
            "numIndexesAfter": before + len(c.params["indexes"]),
            "indexes": [r["name"] for r in c.params["indexes"]],
            "shards": catalog.index_shards(c.ns),
        }
    if c.op == "dropIndexes":
        return {"ns": c.ns, "nIndexesWas": c.params["nIndexesWas"], "dropped": c.params["names"]}
    if c.op == "dropCollection":
        return {"ns": c.ns, "dropped": True}
    if c.op == "dropDatabase":
        return {"db": c.ns, "dropped": True}
    if c.op == "renameCollection":
        return {"ns": c.ns, "to": c.params["to"]}
    return {"ns": c.ns, "key": c.params["key"]}


@on_command.register(d.AdvanceDDL)
def advance_ddl(catalog: Catalog, cmd: d.AdvanceDDL) -> Decision:
    """The coordinator's checkpoint (domain/ddl.py's table).  A checkpoint already recorded
    answers with the phase the coordinator is in (a retry, or a restarted driver)."""
    c = catalog.ddl.get(cmd.id)
    if c is None:
        if (out := catalog.ddl_outcomes.get(cmd.id)) is not None:
            return Decision([], {"id": cmd.id, "phase": ddl.Phase.DONE, "ok": out["ok"]})
        raise CommandError(ErrorCode.NoSuchKey, f"no DDL coordinator {cmd.id}")
    try:
        at, to = ddl.Phase(cmd.phase), ddl.Phase(cmd.to)
    except ValueError:
        raise CommandError(ErrorCode.BadValue, f"unknown DDL phase in {cmd.phase!r} -> {cmd.to!r}") from None
    if c.phase != at:  # recorded already: say where the coordinator is
        return Decision([], {"id": c.id, "phase": c.phase})
    if to == ddl.Phase.ROLLBACK:
        if not ddl.before_point_of_no_return(at, c.op):
            raise CommandError(
                ErrorCode.IllegalOperation, f"{c.id} is past its point of no return: it only goes forward"
            )
        event = d.DDLPhaseReached(id=c.id, phase=to, code=cmd.code, reason=cmd.reason, info=cmd.result or None)
        return Decision([event], {"id": c.id, "phase": to})
    if to != ddl.next_phase(at, c.op):
        raise CommandError(
            ErrorCode.IllegalOperation, f"{c.id} is in phase {at}: the next is {ddl.next_phase(at, c.op)}"
        )
    commit = to == ddl.point_of_no_return(c.op) and at != ddl.Phase.ROLLBACK
    events: list[Record] = _commit_events(catalog, c) if commit else []
    if to == ddl.Phase.DONE:
        if at == ddl.Phase.ROLLBACK:
            done = d.DDLFinished(id=c.id, ok=False, code=c.code, reason=c.reason, result=c.info or {})
        else:
            done = d.DDLFinished(id=c.id, ok=True, result=_ddl_result(catalog, c))
        return Decision([*events, done], {"id": c.id, "phase": to, "ok": done.ok})
    events.append(d.DDLPhaseReached(id=c.id, phase=to))
    return Decision(events, {"id": c.id, "phase": to})


@on_command.register(d.GetDDL)
def get_ddl(catalog: Catalog, cmd: d.GetDDL) -> Decision:
    if cmd.id is None:
        return Decision([], {"running": [c.record() for c in catalog.ddl.values()]})
    if (c := catalog.ddl.get(cmd.id)) is not None:
        return Decision([], c.record())
    if (out := catalog.ddl_outcomes.get(cmd.id)) is not None:
        return Decision([], out)
    return Decision([], {"id": cmd.id, "state": "unknown"})
