"""The read-only `config` database, served from the router's catalog projection in MongoDB's
document shapes: config.shards, databases, collections, chunks, tags, settings, version,
mongos, changelog.  find / aggregate / count on `config.*` read `documents()`; writes are
refused with MongoDB's error (`refuse_write`).

The documents carry BSON values (datetime, ObjectId, Timestamp, MinKey/MaxKey, UUID as
binary subtype 4) built here on the router: they never go to Kafka.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid as uuidlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson import MaxKey, MinKey, ObjectId, Timestamp
from bson.binary import Binary, UuidRepresentation

from domain.catalog import Catalog, Collection
from domain.protocol import ErrorCode
from domain.settings import MB
from domain.shardkey import MAX_KEY, MIN_KEY, to_ejson
from libs.errors import CommandError
from services.router.wire.commands import COMPATIBLE_VERSION

if TYPE_CHECKING:
    from services.router.wire.edge import RouterEdge

# mongosh's sh.status() needs a config.version document; MongoDB 5.0+ writes only these fields.
CLUSTER_ID_NAMESPACE = uuidlib.UUID("6f1e3a52-7c1d-4a43-9d2e-5b1c0a9e8f10")


# ------------------------------------------------------------------ values between wire and records


def from_wire(value: Any) -> Any:
    """A wire value as records hold it: BSON's MinKey/MaxKey become Extended JSON."""
    if isinstance(value, MinKey):
        return {"$minKey": 1}
    if isinstance(value, MaxKey):
        return {"$maxKey": 1}
    if isinstance(value, dict):
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


def to_wire(value: Any) -> Any:
    """A catalog value (domain sentinels, or Extended JSON bounds) as BSON values."""
    if value is MIN_KEY:
        return MinKey()
    if value is MAX_KEY:
        return MaxKey()
    if isinstance(value, dict):
        if value == {"$minKey": 1}:
            return MinKey()
        if value == {"$maxKey": 1}:
            return MaxKey()
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    return value


def object_id(hex24: str) -> ObjectId | str:
    """Our ObjectId-like ids (24 hex) as ObjectIds; anything else stays a string."""
    try:
        return ObjectId(hex24)
    except Exception:
        return hex24


def uuid_value(text: str) -> Binary | str:
    try:
        return Binary.from_uuid(uuidlib.UUID(text), UuidRepresentation.STANDARD)
    except ValueError:
        return text


def timestamp(packed: int) -> Timestamp:
    """A packed LogicalTime (seconds << 32 | increment) as a BSON Timestamp."""
    return Timestamp(packed >> 32, packed & 0xFFFFFFFF)


def version_timestamp(major: int, minor: int) -> Timestamp:
    """A chunk version (major, minor) as mongos shows it: Timestamp(major, minor)."""
    return Timestamp(major, minor)


def epoch_time(epoch: str) -> datetime:
    """The time an ObjectId-like epoch was made (its first 4 bytes)."""
    try:
        return datetime.fromtimestamp(int(epoch[:8], 16), UTC)
    except ValueError:
        return datetime.fromtimestamp(0, UTC)


# ------------------------------------------------------------------ documents, per collection


def shard_host(edge: RouterEdge, shard: str) -> str:
    """A shard is reached through its Kafka request topic, not a host: config.shards' `host`
    names that topic in MongoDB's "<id>/<address>" form."""
    return f"{shard}/{edge.settings.topics.shard_requests(shard)}"


def shards(edge: RouterEdge, cat: Catalog) -> list[dict[str, Any]]:
    out = []
    for s in sorted(cat.shards.values(), key=lambda s: s.id):
        doc: dict[str, Any] = {"_id": s.id, "host": shard_host(edge, s.id), "state": 1}
        if s.draining:
            doc["draining"] = True
        if s.zones:
            doc["tags"] = sorted(s.zones)
        doc["topologyTime"] = timestamp(cat.topology_ts)
        doc["replSetConfigVersion"] = -1
        out.append(doc)
    return out


def databases(cat: Catalog) -> list[dict[str, Any]]:
    return [
        {
            "_id": d.name,
            "primary": d.primary,
            "version": {
                "uuid": uuid_value(d.version.uuid),
                "timestamp": timestamp(cat.config_ts),
                "lastMod": d.version.last_mod,
            },
        }
        for d in sorted(cat.databases.values(), key=lambda d: d.name)
    ]


def _coll_timestamp(coll: Collection) -> Timestamp:
    # MongoDB's collection timestamp is when its incarnation was made: our epoch's time.
    return Timestamp(int(epoch_time(coll.epoch).timestamp()), 1)


def collections(cat: Catalog) -> list[dict[str, Any]]:
    out = []
    for ns in sorted(cat.collections):
        coll = cat.collections[ns]
        doc: dict[str, Any] = {
            "_id": ns,
            "lastmodEpoch": object_id(coll.epoch),
            "lastmod": epoch_time(coll.epoch),
            "timestamp": _coll_timestamp(coll),
            "uuid": uuid_value(coll.uuid),
            "key": dict(coll.pattern.spec),
            "unique": coll.unique,
            "noBalance": not coll.settings.balancerEnabled,
        }
        if coll.settings.maxChunkSizeBytes is not None:
            doc["maxChunkSizeBytes"] = coll.settings.maxChunkSizeBytes
        if not coll.settings.allowMigrations:
            doc["permitMigrations"] = False
        if not coll.settings.autoMergerEnabled:
            doc["enableAutoMerge"] = False
        out.append(doc)
    return out


def chunks(cat: Catalog) -> list[dict[str, Any]]:
    """One document per chunk, ordered by collection then min (MongoDB's `ns_1_min_1` order)."""
    out = []
    for ns in sorted(cat.collections):
        coll = cat.collections[ns]
        uuid = uuid_value(coll.uuid)
        created = _coll_timestamp(coll)
        for ch in coll.chunks:
            # Newest first; the oldest entry's time is when the remembered history begins
            # (the collection's incarnation, or the oldest migration forgotten past the window).
            history = [
                {"validAfter": Timestamp(t >> 32, t & 0xFFFFFFFF) if t else created, "shard": shard}
                for t, shard in coll.chunk_history(ch)
            ]
            out.append(
                {
                    "_id": chunk_id(ns, ch.min),
                    "uuid": uuid,
                    "min": to_wire(ch.min),
                    "max": to_wire(ch.max),
                    "shard": ch.shard,
                    "lastmod": version_timestamp(*ch.version.pair),
                    "onCurrentShardSince": history[0]["validAfter"],
                    "history": history,
                    **({"jumbo": True} if ch.jumbo else {}),
                }
            )
    return out


def chunk_id(ns: str, lo: dict[str, Any]) -> ObjectId:
    """MongoDB 5.0+ chunk ids are ObjectIds: ours are derived from (ns, min), so one chunk
    keeps its id across reads (until a split or merge changes its min)."""
    text = json.dumps([ns, to_ejson(lo)], separators=(",", ":"), default=str)
    return ObjectId(hashlib.sha1(text.encode()).digest()[:12])


def tags(cat: Catalog) -> list[dict[str, Any]]:
    out = []
    for ns in sorted({*cat.collections, *cat.unsharded_zones}):
        for z in cat.zone_ranges(ns):
            out.append(
                {
                    "_id": {"ns": ns, "min": to_wire(z.min)},
                    "ns": ns,
                    "min": to_wire(z.min),
                    "max": to_wire(z.max),
                    "tag": z.zone,
                }
            )
    return out


def settings(cat: Catalog) -> list[dict[str, Any]]:
    """config.settings as MongoDB shapes it: `balancer` (stopped, mode, activeWindow),
    `chunksize` (value in MB), `autosplit`, `automerge`."""
    st = cat.settings
    balancer: dict[str, Any] = {"_id": "balancer", "mode": "full" if st.balancerEnabled else "off"}
    balancer["stopped"] = not st.balancerEnabled
    if st.balancerWindow is not None:
        # MongoDB's window is in the config server's local time; ours carries its zone.
        balancer["activeWindow"] = {
            "start": st.balancerWindow.start,
            "stop": st.balancerWindow.stop,
            "timeZone": st.balancerWindow.timeZone,
        }
    return [
        balancer,
        {"_id": "chunksize", "value": st.maxChunkSizeBytes // MB},
        {"_id": "autosplit", "enabled": False},  # shardlog splits in the balancer, as MongoDB 6.0+
        {"_id": "automerge", "enabled": st.autoMergerEnabled},
    ]


def version(edge: RouterEdge) -> list[dict[str, Any]]:
    """One document: the cluster's id, stable for a cluster name (sh.status() needs it)."""
    ident = uuidlib.uuid5(CLUSTER_ID_NAMESPACE, edge.settings.cluster)
    return [{"_id": 1, "clusterId": ObjectId(ident.bytes[:12])}]


def this_router_id(edge: RouterEdge) -> str:
    port = edge.server.port if edge.server is not None else 0
    return f"{socket.gethostname()}:{port}"


def mongos(edge: RouterEdge) -> list[dict[str, Any]]:
    """Live routers: this one, and the others whose readiness file (same data directory) names
    a live process.  `ping` is when this router last saw it alive: now."""
    now = datetime.now(UTC)
    up = int(time.time() - edge.started)
    mine = {
        "_id": this_router_id(edge),
        "advisoryHostFQDNs": [],
        "mongoVersion": COMPATIBLE_VERSION,
        "ping": now,
        "up": up,
        "waiting": True,
    }
    out = [mine]
    for path in sorted(edge.settings.data_dir.glob("router*.ready")):
        try:
            info = json.loads(path.read_text())
            pid, uri = int(info["pid"]), info.get("uri")
            if pid == os.getpid() or not uri:
                continue
            os.kill(pid, 0)  # alive?
        except (OSError, ValueError, KeyError, TypeError):
            continue
        addr = str(uri).removeprefix("mongodb://").rstrip("/")
        out.append(
            {
                "_id": addr,
                "advisoryHostFQDNs": [],
                "mongoVersion": COMPATIBLE_VERSION,
                "ping": now,
                "up": int(time.time() - path.stat().st_mtime),
                "waiting": True,
            }
        )
    return out


async def changelog(edge: RouterEdge) -> list[dict[str, Any]]:
    """config.changelog from config.events: what, ns, time, details (read from the log, once
    per call: the projection keeps state, not history)."""
    from libs.bus import read_to_end
    from schemas import config as schema

    out: list[dict[str, Any]] = []
    host = this_router_id(edge)

    async def take(records: list[Any]) -> None:
        for rec in records:
            try:
                e = schema.events.decode(rec.value)
            except Exception:
                continue
            entry = changelog_entry(e)
            if entry is None:
                continue
            what, ns, details = entry
            out.append(
                {
                    "_id": f"{host}-{rec.offset}",
                    "server": host,
                    "time": datetime.fromtimestamp(rec.timestamp / 1000, UTC),
                    "what": what,
                    "ns": ns,
                    "details": to_wire(details),
                }
            )

    await read_to_end(edge.settings.bus, edge.settings.topics.config_events, take, client_id="router-changelog")
    return out


def changelog_entry(e: Any) -> tuple[str, str, dict[str, Any]] | None:
    """MongoDB's changelog `what` for a config event, with its namespace and details."""
    t = e.type
    if t == "ShardAdded":
        return "addShard", "", {"name": e.shard}
    if t == "ShardDraining":
        return "removeShard.start", "", {"shard": e.shard}
    if t == "ShardRemoved":
        return "removeShard", "", {"shard": e.shard}
    if t == "DatabaseCreated":
        return "createDatabase", e.db, {"primary": e.primary}
    if t == "CollectionSharded":
        return "shardCollection.end", e.ns, {"key": e.key, "unique": e.unique, "numChunks": len(e.chunks)}
    if t == "ChunkSplit":
        what = "split" if len(e.chunks) == 2 else "multi-split"
        return what, e.ns, {"before": {"min": e.min, "max": e.max}, "number": len(e.chunks)}
    if t == "ChunksMerged":
        return "merge", e.ns, {"merged": {"min": e.chunk.min, "max": e.chunk.max}, "owningShard": e.chunk.shard}
    if t == "MigrationRequested":
        return "moveChunk.start", e.ns, {"min": e.min, "max": e.max, "from": e.donor, "to": e.recipient}
    if t == "MigrationCommitted":
        return "moveChunk.commit", e.ns, {"from": e.donor, "to": e.recipient}
    if t == "MigrationAborted":
        return "moveChunk.error", getattr(e, "ns", ""), {"errmsg": e.reason}
    if t == "PrimaryMoved":
        return "movePrimary.commit", e.db, {"primary": e.primary}
    if t == "ZoneRangeAssigned":
        return "updateZoneKeyRange", e.ns, {"min": e.min, "max": e.max, "zone": e.zone}
    if t == "ZoneRangeRemoved":
        return "updateZoneKeyRange", e.ns, {"min": e.min, "max": e.max, "zone": None}
    return None


SYNC: dict[str, Callable[[RouterEdge, Catalog], list[dict[str, Any]]]] = {
    "shards": shards,
    "databases": lambda edge, cat: databases(cat),
    "collections": lambda edge, cat: collections(cat),
    "chunks": lambda edge, cat: chunks(cat),
    "tags": lambda edge, cat: tags(cat),
    "settings": lambda edge, cat: settings(cat),
    "version": lambda edge, cat: version(edge),
    "mongos": lambda edge, cat: mongos(edge),
}

COLLECTIONS = (*SYNC, "changelog")


async def documents(edge: RouterEdge, collection: str) -> list[dict[str, Any]]:
    """Every document of `config.<collection>` as MongoDB shapes it, in its natural order
    (an unknown collection has none, as in MongoDB).  Callers filter, sort and project."""
    if collection == "changelog":
        return await changelog(edge)
    build = SYNC.get(collection)
    return [] if build is None else build(edge, edge.follower.catalog)


def refuse_write(collection: str) -> CommandError:
    """The error for a write to `config.<collection>` (crud.py raises it): the config database
    is the catalog's projection, changed only by config commands."""
    return CommandError(
        ErrorCode.IllegalOperation,
        f"cannot write to 'config.{collection}': shardlog's config database is read-only "
        "(use the sharding commands: addShard, shardCollection, moveRange, ...)",
    )
