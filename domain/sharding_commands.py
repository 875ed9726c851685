"""Sharding administration as mongos offers it (`addShard`, `shardCollection`, `moveRange`,
the balancer and zone commands, ...) and as the CLI sends it: ONE implementation of each
command's input (a mongos command document, or the CLI's options) -> the config command
record, with MongoDB's error codes for bad input, and of the config server's result ->
mongos's reply.  Pure: the wire edge (services/router/wire/admin.py) and the CLI (cli/*.py)
both send what these functions build and shape what comes back with them.

Values in command documents are plain Python values (the wire edge turns BSON's MinKey /
MaxKey into Extended JSON before calling); bounds in records are Extended JSON, as always.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from domain import ddl
from domain.bsonvalues import type_name
from domain.catalog import Catalog, Chunk, Collection
from domain.index_ddl import check_drop_target, list_documents
from domain.indexes import KNOWN_OPTIONS as KNOWN_INDEX_OPTIONS
from domain.protocol import RESERVED_DBS, ErrorCode, check_db_name, check_shard_name, valid_collection_name
from domain.settings import MB
from domain.shardkey import InvalidKeyPattern, KeyPattern, ShardKeyError, from_ejson, shell_range, to_ejson
from libs.errors import CommandError
from schemas import Record
from schemas import config as c
from schemas import ddl as d
from schemas import shard as s

# Fields any command may carry (MongoDB's generic arguments): never "unknown".
GENERIC_FIELDS = frozenset(
    {
        "$db",
        "$readPreference",
        "$clusterTime",
        "lsid",
        "txnNumber",
        "autocommit",
        "startTransaction",
        "comment",
        "maxTimeMS",
        "writeConcern",
        "readConcern",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "$audit",
        "$client",
        "mayBypassWriteBlocking",
    }
)


# ------------------------------------------------------------------ reading command documents


def only_fields(cmd: Mapping[str, Any], allowed: set[str]) -> None:
    """MongoDB's IDL: an unknown field is an error (IDLUnknownField, 40415)."""
    name = next(iter(cmd))
    for k in cmd:
        if k != name and k not in allowed and k not in GENERIC_FIELDS:
            raise CommandError(ErrorCode.IDLUnknownField, f"BSON field '{name}.{k}' is an unknown field.")


def not_implemented(command: str, field: str, what: str) -> CommandError:
    """NotImplemented (238): an option MongoDB defines and shardlog does not have (issue 38 §1:
    refused, never accepted and ignored), worded as services/router/wire/options.py words it."""
    return CommandError(
        ErrorCode.NotImplemented, f"BSON field '{command}.{field}': {what} is not supported by shardlog"
    )


def no_collection_uuid(cmd: Mapping[str, Any]) -> None:
    """`collectionUUID` (MongoDB 6.0: CollectionUUIDMismatch when the collection's UUID differs)
    is not checked by shardlog: refused rather than ignored."""
    if "collectionUUID" in cmd:
        raise not_implemented(next(iter(cmd)), "collectionUUID", "checking the collection's UUID")


def required(cmd: Mapping[str, Any], field: str) -> Any:
    if field not in cmd:
        name = next(iter(cmd))
        raise CommandError(ErrorCode.IDLFailedToParse, f"BSON field '{name}.{field}' is missing but a required field")
    return cmd[field]


def typed(cmd: Mapping[str, Any], field: str, kind: type | tuple[type, ...], what: str, default: Any = None) -> Any:
    """cmd[field] if it has the type (bool is not an int here); TypeMismatch (14) otherwise."""
    if field not in cmd:
        return default
    v = cmd[field]
    bad_bool = isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(v, kind) or bad_bool:
        name = next(iter(cmd))
        raise CommandError(
            ErrorCode.TypeMismatch, f"BSON field '{name}.{field}' is the wrong type '{type_name(v)}', expected {what}"
        )
    return v


def namespace(cmd: Mapping[str, Any]) -> str:
    """The "db.coll" a collection command names (its first field): InvalidNamespace (73) otherwise."""
    name = next(iter(cmd))
    ns = cmd[name]
    if not isinstance(ns, str):
        raise CommandError(ErrorCode.InvalidNamespace, f"'{name}' must be of type String, not {type_name(ns)}")
    db, dot, coll = ns.partition(".")
    if not db or not dot or not valid_collection_name(coll):
        raise CommandError(ErrorCode.InvalidNamespace, f"Invalid namespace specified '{ns}'")
    return ns


def database(cmd: Mapping[str, Any]) -> str:
    name = next(iter(cmd))
    db = cmd[name]
    if not isinstance(db, str):
        raise CommandError(ErrorCode.TypeMismatch, f"'{name}' must be of type String, not {type_name(db)}")
    check_db_name(db)
    return db


def document(cmd: Mapping[str, Any], field: str) -> dict[str, Any]:
    required(cmd, field)
    doc: dict[str, Any] = typed(cmd, field, dict, "object")
    return doc


def bounds(cmd: Mapping[str, Any], field: str = "bounds") -> tuple[dict[str, Any], dict[str, Any]]:
    v = typed(cmd, field, list, "array")
    if v is None or len(v) != 2 or not all(isinstance(b, dict) for b in v):
        raise CommandError(ErrorCode.BadValue, f"'{field}' must be an array of two shard key documents [min, max]")
    return v[0], v[1]


# ------------------------------------------------------------------ shards and databases


def add_shard(shard: str) -> c.AddShard:
    check_shard_name(shard)
    return c.AddShard(shard=shard)


def parse_add_shard(cmd: Mapping[str, Any]) -> c.AddShard:
    """`{addShard: "<rs>/<host:port>,..." | "<id>", name?: "<id>"}`: shardlog's shards are
    named, not reached by host (they are Kafka consumers): the id is `name`, else the
    replica set name of the connection string, else the string itself."""
    only_fields(cmd, {"name", "maxSize"})
    if "maxSize" in cmd:  # MongoDB 6.2 removed it, refusing it so
        raise CommandError(ErrorCode.InvalidOptions, "The maxSize field is no longer supported.")
    conn = cmd["addShard"]
    if not isinstance(conn, str):
        raise CommandError(ErrorCode.TypeMismatch, f"'addShard' must be of type String, not {type_name(conn)}")
    name = typed(cmd, "name", str, "string")
    return add_shard(name if name is not None else conn.partition("/")[0] if "/" in conn else conn)


def add_shard_reply(result: dict[str, Any]) -> dict[str, Any]:
    return {"shardAdded": result["shardAdded"]}


def remove_shard(shard: str) -> c.RemoveShard:
    return c.RemoveShard(shard=shard)


def parse_remove_shard(cmd: Mapping[str, Any]) -> c.RemoveShard:
    only_fields(cmd, set())
    shard = cmd["removeShard"]
    if not isinstance(shard, str):
        raise CommandError(ErrorCode.TypeMismatch, f"'removeShard' must be of type String, not {type_name(shard)}")
    return remove_shard(shard)


REMOVE_NOTE = (
    "the balancer moves this shard's chunks, then the primaries of these databases (no movePrimary "
    "needed, unlike MongoDB); run removeShard again to see the progress"
)


def remove_shard_reply(result: dict[str, Any]) -> dict[str, Any]:
    """mongos's removeShard reply: msg, state started / ongoing / completed, and what remains."""
    state, shard = result["state"], result["shard"]
    if state == "completed":
        return {"msg": "removeshard completed successfully", "state": "completed", "shard": shard}
    rem = result.get("remaining") or {"chunks": 0, "dbs": []}
    dbs: list[str] = list(rem["dbs"])
    out: dict[str, Any] = {
        "msg": "draining started successfully" if state == "started" else "draining ongoing",
        "state": state,
        "shard": shard,
    }
    if state == "ongoing":
        out["remaining"] = {
            "chunks": rem["chunks"],
            "dbs": len(dbs),
            "jumboChunks": rem.get("jumboChunks", 0),
            "collectionsToMove": 0,
        }
    out["note"] = REMOVE_NOTE
    out["dbsToMove"] = dbs
    out["collectionsToMove"] = []
    return out


def enable_sharding(db: str, primary: str | None = None) -> c.CreateDatabase:
    check_db_name(db)
    return c.CreateDatabase(db=db, primary=primary)


def parse_enable_sharding(cmd: Mapping[str, Any]) -> c.CreateDatabase:
    only_fields(cmd, {"primaryShard"})
    return enable_sharding(database(cmd), typed(cmd, "primaryShard", str, "string"))


def move_primary(db: str, to: str) -> c.MovePrimary:
    check_db_name(db)
    return c.MovePrimary(db=db, to=to)


def parse_move_primary(cmd: Mapping[str, Any]) -> c.MovePrimary:
    only_fields(cmd, {"to"})
    db = database(cmd)
    return move_primary(db, required(cmd, "to") and typed(cmd, "to", str, "string"))


# ------------------------------------------------------------------ collections and chunks


def shard_collection(
    ns: str, key: Any, unique: bool = False, num_initial_chunks: int | None = None
) -> c.ShardCollection:
    if not isinstance(key, dict) or not key:
        raise CommandError(ErrorCode.BadValue, 'the shard key must be a non-empty object such as {"x": 1}')
    if num_initial_chunks is not None and num_initial_chunks < 0:
        raise CommandError(ErrorCode.InvalidOptions, "numInitialChunks cannot be negative")
    return c.ShardCollection(ns=ns, key=key, unique=unique, numInitialChunks=num_initial_chunks or None)


def parse_shard_collection(cmd: Mapping[str, Any]) -> c.ShardCollection:
    """`{shardCollection: ns, key, unique?, numInitialChunks?, presplitHashedZones?, collation?}`."""
    only_fields(cmd, {"key", "unique", "numInitialChunks", "presplitHashedZones", "collation", "timeseries"})
    ns = namespace(cmd)
    key = document(cmd, "key")
    if typed(cmd, "presplitHashedZones", bool, "bool", False):
        raise not_implemented("shardCollection", "presplitHashedZones", "pre-splitting hashed zones")
    if "timeseries" in cmd:
        raise not_implemented("shardCollection", "timeseries", "time-series collections")
    collation = typed(cmd, "collation", dict, "object")
    if collation is not None and collation.get("locale") != "simple":
        raise CommandError(ErrorCode.BadValue, "the shard key's collation must be {locale: 'simple'}")
    n = typed(cmd, "numInitialChunks", (int, float), "int")
    return shard_collection(ns, key, typed(cmd, "unique", bool, "bool", False), int(n) if n is not None else None)


def existing_documents_check(catalog: Catalog, record: c.ShardCollection) -> tuple[str, s.CheckShardKey] | None:
    """(primary, request) asking the database's primary whether its documents of the collection
    can be sharded by the key, when the catalog lists it unsharded; None when there is nothing
    to check (a new collection, or one sharded already: the config server answers).  A new
    collection needs no shard to answer, as before (a config server alone can shard it)."""
    db = catalog.databases.get(record.ns.partition(".")[0])
    if db is None or record.ns in catalog.collections or record.ns not in db.collections:
        return None
    return db.primary, s.CheckShardKey(ns=record.ns, key=record.key, unique=record.unique)


def shard_collection_reply(record: c.ShardCollection, result: dict[str, Any]) -> dict[str, Any]:
    return {"collectionsharded": record.ns}


def collection_of(catalog: Catalog, ns: str) -> Collection:
    coll = catalog.collections.get(ns)
    if coll is None:
        raise CommandError(ErrorCode.NamespaceNotSharded, f"Collection {ns} is not sharded.")
    return coll


def chunk_holding(catalog: Catalog, ns: str, doc: Any) -> Chunk:
    """The chunk whose range holds the document's shard key (split / moveChunk `find`)."""
    coll = collection_of(catalog, ns)
    if not isinstance(doc, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"'find' must be an object, not {type_name(doc)}")
    try:
        key = coll.pattern.encode_doc(doc)
    except (ShardKeyError, ValueError, TypeError) as e:
        raise CommandError(ErrorCode.ShardKeyNotFound, f"find: {e}") from None
    return coll.chunks[coll.chunk_index(key)]


def chunk_with_bounds(catalog: Catalog, ns: str, lo: dict[str, Any], hi: dict[str, Any]) -> Chunk:
    """The chunk that is exactly [lo, hi) (bounds in Extended JSON)."""
    coll = collection_of(catalog, ns)
    try:
        lo_key = coll.pattern.encode_bound(from_ejson(lo))
        hi_key = coll.pattern.encode_bound(from_ejson(hi))
    except (ShardKeyError, ValueError, TypeError) as e:
        raise CommandError(ErrorCode.BadValue, f"bounds: {e}") from None
    chunk = coll.chunks[coll.chunk_index(lo_key)]
    if chunk.min_key != lo_key or chunk.max_key != hi_key:
        raise CommandError(
            ErrorCode.BadValue,
            f"no chunk has the bounds {shell_range(lo, hi)} in {ns}; "
            f"the chunk there is {shell_range(chunk.min, chunk.max)}",
        )
    return chunk


def bounds_of(chunk: Chunk) -> tuple[dict[str, Any], dict[str, Any]]:
    return to_ejson(chunk.min), to_ejson(chunk.max)


@dataclass(frozen=True)
class SplitRequest:
    """A split at given points, or (`find`) at the median shard-key value of the chunk
    holding a document, which only the chunk's owner can compute (MongoDB's splitVector)."""

    ns: str
    at: list[dict[str, Any]] | None = None
    find: dict[str, Any] | None = None  # a document in the chunk to halve
    chunk_min: dict[str, Any] | None = None  # or the chunk's min (Extended JSON): `bounds`
    owner: str | None = None  # the shard that holds that chunk: it computes the median


def split(ns: str, at: list[Any]) -> c.SplitChunk:
    if not at or not all(isinstance(p, dict) for p in at):
        raise CommandError(ErrorCode.BadValue, "split points must be shard key documents")
    return c.SplitChunk(ns=ns, at=at)


def parse_split(cmd: Mapping[str, Any], catalog: Catalog) -> SplitRequest:
    """`{split: ns, middle | find | bounds}`: exactly one."""
    only_fields(cmd, {"middle", "find", "bounds"})
    ns = namespace(cmd)
    given = [f for f in ("middle", "find", "bounds") if f in cmd]
    if len(given) != 1:
        raise CommandError(ErrorCode.BadValue, "need to specify exactly one of 'middle', 'find' or 'bounds'")
    collection_of(catalog, ns)
    if given[0] == "middle":
        return SplitRequest(ns, at=[document(cmd, "middle")])
    if given[0] == "find":
        doc = document(cmd, "find")
        return SplitRequest(ns, find=doc, owner=chunk_holding(catalog, ns, doc).shard)
    lo, hi = bounds(cmd)
    chunk = chunk_with_bounds(catalog, ns, lo, hi)
    return SplitRequest(ns, chunk_min=to_ejson(chunk.min), owner=chunk.shard)


def median_points(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The split point from a shard's SplitVector(median) answer, or CannotSplit (87)."""
    points: list[dict[str, Any]] = result.get("points") or []
    if not points:
        why = (
            "every document has the same shard key value (a jumbo chunk)"
            if result.get("jumbo")
            else "the chunk holds no document"
        )
        raise CommandError(ErrorCode.CannotSplit, f"cannot split the chunk: {why}")
    return points


def merge(ns: str, lo: Any, hi: Any) -> c.MergeChunks:
    if not isinstance(lo, dict) or not isinstance(hi, dict):
        raise CommandError(ErrorCode.BadValue, "merge bounds must be shard key documents")
    return c.MergeChunks(ns=ns, min=lo, max=hi)


def parse_merge_chunks(cmd: Mapping[str, Any]) -> c.MergeChunks:
    only_fields(cmd, {"bounds", "epoch"})
    if "epoch" in cmd:  # not compared with the collection's: refused rather than ignored
        raise not_implemented("mergeChunks", "epoch", "checking the collection's epoch")
    ns = namespace(cmd)
    required(cmd, "bounds")
    lo, hi = bounds(cmd)
    return merge(ns, lo, hi)


def move_range(
    ns: str,
    lo: Any,
    hi: Any | None,
    to: str,
    *,
    force_jumbo: bool = False,
    wait_for_delete: bool = False,
) -> c.MoveRange:
    if not isinstance(lo, dict) or (hi is not None and not isinstance(hi, dict)):
        raise CommandError(ErrorCode.BadValue, "range bounds must be shard key documents")
    if not isinstance(to, str) or not to:
        raise CommandError(ErrorCode.BadValue, "the recipient shard must be named")
    return c.MoveRange(ns=ns, min=lo, max=hi, to=to, forceJumbo=force_jumbo, waitForDelete=wait_for_delete)


THROTTLE_FIELDS = {"secondaryThrottle", "_secondaryThrottle", "writeConcern"}


def parse_move_range(cmd: Mapping[str, Any]) -> c.MoveRange:
    """`{moveRange: ns, min?, max?, toShard, forceJumbo?, waitForDelete?, secondaryThrottle?}`:
    `min` or `max` (MongoDB allows either alone; shardlog needs `min`)."""
    only_fields(cmd, {"min", "max", "toShard", "forceJumbo", "waitForDelete", *THROTTLE_FIELDS})
    ns = namespace(cmd)
    to = required(cmd, "toShard") and typed(cmd, "toShard", str, "string")
    if "min" not in cmd:
        raise CommandError(
            ErrorCode.InvalidOptions, "moveRange needs 'min' (a range given by 'max' alone is not supported)"
        )
    lo = typed(cmd, "min", dict, "object")
    hi = typed(cmd, "max", dict, "object")
    return move_range(
        ns,
        lo,
        hi,
        to,
        force_jumbo=_force_jumbo(cmd),
        wait_for_delete=typed(cmd, "waitForDelete", bool, "bool", False),
    )


def _force_jumbo(cmd: Mapping[str, Any]) -> bool:
    v = cmd.get("forceJumbo", False)
    # moveRange takes a bool; the balancer's internal form is a number (0 = do not force).
    return bool(v) if isinstance(v, bool | int | float) else False


def parse_move_chunk(cmd: Mapping[str, Any], catalog: Catalog) -> c.MoveRange:
    """`{moveChunk: ns, find | bounds, to, _waitForDelete?, forceJumbo?}`: the whole chunk."""
    only_fields(cmd, {"find", "bounds", "to", "_waitForDelete", "waitForDelete", "forceJumbo", *THROTTLE_FIELDS})
    ns = namespace(cmd)
    to = required(cmd, "to") and typed(cmd, "to", str, "string")
    if ("find" in cmd) == ("bounds" in cmd):
        raise CommandError(ErrorCode.BadValue, "need to specify exactly one of 'find' or 'bounds'")
    if "find" in cmd:
        chunk = chunk_holding(catalog, ns, document(cmd, "find"))
    else:
        chunk = chunk_with_bounds(catalog, ns, *bounds(cmd))
    lo, hi = bounds_of(chunk)
    wait = bool(cmd.get("_waitForDelete") or cmd.get("waitForDelete"))
    return move_range(ns, lo, hi, to, force_jumbo=_force_jumbo(cmd), wait_for_delete=wait)


# ------------------------------------------------------------------ balancer and settings


def balancer_enabled(on: bool, ns: str | None = None) -> c.SetSetting:
    return c.SetSetting(key="balancerEnabled", value=on, ns=ns)


def balancer_mode(catalog: Catalog) -> str:
    """balancerStatus's `mode`: "full" or "off" (MongoDB's third, "autoSplitOnly", is gone in 6.1)."""
    return "full" if catalog.settings.balancerEnabled else "off"


def balancer_status_reply(catalog: Catalog, state: dict[str, Any]) -> dict[str, Any]:
    """From the balancer's GetBalancerState: in a round while it has actions in flight."""
    last = state.get("lastRound") or {}
    rounds = max(int(state.get("round") or 0), int(last.get("round") or 0))
    return {
        "mode": balancer_mode(catalog),
        "inBalancerRound": bool(state.get("inFlight")),
        "numBalancerRounds": rounds,
    }


def collection_status_reply(catalog: Catalog, ns: str, status: dict[str, Any]) -> dict[str, Any]:
    """balancerCollectionStatus: chunkSize in MB, compliant, the first violation's reason."""
    coll = collection_of(catalog, ns)
    size = coll.settings.maxChunkSizeBytes or catalog.settings.maxChunkSizeBytes
    out: dict[str, Any] = {"chunkSize": size / MB, "balancerCompliant": bool(status.get("compliant"))}
    violations = status.get("violations") or []
    if violations:
        out["firstComplianceViolation"] = violations[0].get("reason")
        out["details"] = violations[0].get("detail", "")
    return out


def parse_configure_collection_balancing(cmd: Mapping[str, Any]) -> list[c.SetSetting]:
    """`{configureCollectionBalancing: ns, chunkSize?: MB (0 = the cluster's), enableAutoMerger?}`."""
    only_fields(cmd, {"chunkSize", "enableAutoMerger", "defragmentCollection", "enableAutoSplitter"})
    ns = namespace(cmd)
    out: list[c.SetSetting] = []
    if typed(cmd, "defragmentCollection", bool, "bool", False):
        raise not_implemented(
            "configureCollectionBalancing",
            "defragmentCollection",
            "defragmenting through the wire (use `shardlog defragment start`)",
        )
    size = typed(cmd, "chunkSize", (int, float), "int")
    if size is not None:
        if size < 0 or size > 1024:
            raise CommandError(ErrorCode.BadValue, "chunkSize must be between 1 and 1024 MB, or 0 for the default")
        out.append(c.SetSetting(ns=ns, key="maxChunkSizeBytes", value=int(size * MB) if size else None))
    merger = typed(cmd, "enableAutoMerger", bool, "bool")
    if merger is not None:
        out.append(c.SetSetting(ns=ns, key="autoMergerEnabled", value=merger))
    splitter = typed(cmd, "enableAutoSplitter", bool, "bool")
    if splitter is not None:  # the collection's autoSplit (docs/reference/auto-split.md)
        out.append(c.SetSetting(ns=ns, key="autoSplit", value=splitter))
    return out


def allow_migrations(ns: str, allow: bool) -> c.SetSetting:
    return c.SetSetting(ns=ns, key="allowMigrations", value=allow)


def parse_set_allow_migrations(cmd: Mapping[str, Any]) -> c.SetSetting:
    only_fields(cmd, {"allowMigrations"})
    ns = namespace(cmd)
    required(cmd, "allowMigrations")
    return allow_migrations(ns, typed(cmd, "allowMigrations", bool, "bool"))


# ------------------------------------------------------------------ zones


def add_shard_to_zone(shard: str, zone: str) -> c.AddShardToZone:
    return c.AddShardToZone(shard=shard, zone=zone)


def remove_shard_from_zone(shard: str, zone: str) -> c.RemoveShardFromZone:
    return c.RemoveShardFromZone(shard=shard, zone=zone)


def _shard_and_zone(cmd: Mapping[str, Any]) -> tuple[str, str]:
    only_fields(cmd, {"zone"})
    name = next(iter(cmd))
    shard = cmd[name]
    if not isinstance(shard, str):
        raise CommandError(ErrorCode.TypeMismatch, f"'{name}' must be of type String, not {type_name(shard)}")
    required(cmd, "zone")
    return shard, typed(cmd, "zone", str, "string")


def parse_add_shard_to_zone(cmd: Mapping[str, Any]) -> c.AddShardToZone:
    return add_shard_to_zone(*_shard_and_zone(cmd))


def parse_remove_shard_from_zone(cmd: Mapping[str, Any]) -> c.RemoveShardFromZone:
    return remove_shard_from_zone(*_shard_and_zone(cmd))


def zone_range(ns: str, lo: Any, hi: Any, zone: str | None) -> c.AssignZoneRange | c.RemoveZoneRange:
    """Pin [lo, hi) to `zone`, or (zone None) unpin it: updateZoneKeyRange's two meanings."""
    if not isinstance(lo, dict) or not isinstance(hi, dict):
        raise CommandError(ErrorCode.BadValue, "zone range bounds must be shard key documents")
    if zone is None:
        return c.RemoveZoneRange(ns=ns, min=lo, max=hi)
    return c.AssignZoneRange(ns=ns, min=lo, max=hi, zone=zone)


def parse_update_zone_key_range(cmd: Mapping[str, Any]) -> c.AssignZoneRange | c.RemoveZoneRange:
    """`{updateZoneKeyRange: ns, min, max, zone: "<name>" | null}`."""
    only_fields(cmd, {"min", "max", "zone"})
    ns = namespace(cmd)
    lo, hi = document(cmd, "min"), document(cmd, "max")
    required(cmd, "zone")
    zone = cmd["zone"]
    if zone is not None and not isinstance(zone, str):
        raise CommandError(ErrorCode.TypeMismatch, f"'zone' must be a string or null, not {type_name(zone)}")
    return zone_range(ns, lo, hi, zone)


# ------------------------------------------------------------------ the command table

# Commands that are one config record and reply {ok: 1} (plus a shaped result, if given).
Parser = Callable[[Mapping[str, Any]], Record]
SIMPLE: dict[str, tuple[Parser, Callable[[dict[str, Any]], dict[str, Any]] | None]] = {
    "addShard": (parse_add_shard, add_shard_reply),
    "removeShard": (parse_remove_shard, remove_shard_reply),
    "enableSharding": (parse_enable_sharding, None),
    "mergeChunks": (parse_merge_chunks, None),
    "setAllowMigrations": (parse_set_allow_migrations, None),
    "addShardToZone": (parse_add_shard_to_zone, None),
    "removeShardFromZone": (parse_remove_shard_from_zone, None),
    "updateZoneKeyRange": (parse_update_zone_key_range, None),
}


# ------------------------------------------------------------------ DDL (domain/ddl.py's coordinators)
#
# Each DDL is one request record (schemas/ddl.py); the caller then awaits the coordinator it
# started (domain/ddl_client.py).  Names are checked here, as the config server checks them
# (domain.ddl.request_of), so bad input is refused before anything is sent.

# mongos's currentOp `desc` of each coordinator (ShardingDDLCoordinator's subclasses).
COORDINATOR_DESC = {
    "dropCollection": "DropCollectionCoordinator",
    "dropDatabase": "DropDatabaseCoordinator",
    "renameCollection": "RenameCollectionCoordinator",
    "refineCollectionShardKey": "RefineCollectionShardKeyCoordinator",
    "createIndexes": "CreateIndexesCoordinator",
    "dropIndexes": "DropIndexesCoordinator",
}


def _checked(record: Record) -> Record:
    ddl.request_of(record)  # InvalidNamespace, rename across databases / to itself
    return record


def drop_collection(ns: str) -> d.DropCollection:
    return _checked(d.DropCollection(ns=ns))  # type: ignore[return-value]


def drop_database(db: str) -> d.DropDatabase:
    if db in RESERVED_DBS:
        raise CommandError(ErrorCode.IllegalOperation, f"Cannot drop '{db}' database")
    return _checked(d.DropDatabase(db=db))  # type: ignore[return-value]


def rename_collection(ns: str, to: str, drop_target: bool = False) -> d.RenameCollection:
    return _checked(d.RenameCollection(ns=ns, to=to, dropTarget=drop_target))  # type: ignore[return-value]


def refine_shard_key(ns: str, key: Any) -> d.RefineCollectionShardKey:
    if not isinstance(key, dict) or not key:
        raise CommandError(ErrorCode.BadValue, 'the new shard key must be a non-empty object such as {"x": 1, "y": 1}')
    try:
        KeyPattern.parse(key)
    except InvalidKeyPattern as e:
        raise CommandError(ErrorCode.InvalidOptions, f"invalid shard key: {e}") from None
    return _checked(d.RefineCollectionShardKey(ns=ns, key=key))  # type: ignore[return-value]


def parse_drop(cmd: Mapping[str, Any]) -> d.DropCollection:
    """`{drop: "<collection>", $db}` (collectionUUID is not checked: refused)."""
    only_fields(cmd, {"collectionUUID"})
    no_collection_uuid(cmd)
    name = cmd["drop"]
    if not isinstance(name, str):
        raise CommandError(ErrorCode.InvalidNamespace, f"collection name has invalid type {type_name(name)}")
    if not name:
        raise CommandError(ErrorCode.InvalidNamespace, f"Invalid namespace specified '{cmd['$db']}.'")
    return drop_collection(f"{cmd['$db']}.{name}")


def drop_reply(result: dict[str, Any]) -> dict[str, Any]:
    """mongos's: the namespace and how many indexes it had (only `_id_` in shardlog); a
    missing collection is ok with nothing to say (MongoDB 7.0)."""
    if not result.get("dropped"):
        return {}
    return {"ns": result["ns"], "nIndexesWas": int(result.get("nIndexesWas", 1))}


def parse_drop_database(cmd: Mapping[str, Any]) -> d.DropDatabase:
    """`{dropDatabase: 1, $db}`."""
    only_fields(cmd, set())
    v = cmd["dropDatabase"]
    if not isinstance(v, int | float) or isinstance(v, bool) and not v:
        raise CommandError(ErrorCode.TypeMismatch, f"'dropDatabase' must be 1, not {type_name(v)}")
    return drop_database(cmd["$db"])


def drop_database_reply(result: dict[str, Any]) -> dict[str, Any]:
    if not result.get("dropped"):
        return {"info": "database does not exist"}
    return {"dropped": result["db"]}


def parse_rename_collection(cmd: Mapping[str, Any]) -> d.RenameCollection:
    """`{renameCollection: "db.a", to: "db.b", dropTarget?, stayTemp?}` on admin."""
    only_fields(cmd, {"to", "dropTarget", "stayTemp", "collectionUUID"})
    no_collection_uuid(cmd)
    ns = namespace(cmd)
    to = required(cmd, "to")
    if not isinstance(to, str):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field 'renameCollection.to' is the wrong type '{type_name(to)}', expected type 'string'",
        )
    namespace({"to": to})
    drop_target = typed(cmd, "dropTarget", bool, "bool", False)
    typed(cmd, "stayTemp", bool, "bool", False)  # no temporary collections here: accepted, nothing to keep
    return rename_collection(ns, to, drop_target)


def parse_refine_collection_shard_key(cmd: Mapping[str, Any]) -> d.RefineCollectionShardKey:
    """`{refineCollectionShardKey: ns, key: {...}}` on admin."""
    only_fields(cmd, {"key"})
    ns = namespace(cmd)
    return refine_shard_key(ns, document(cmd, "key"))


def ddl_outcome(state: dict[str, Any]) -> dict[str, Any]:
    """A finished coordinator (GetDDL's answer once done): its result, or its error as MongoDB
    names it (a rolled-back DDL changed nothing)."""
    if state.get("ok"):
        result: dict[str, Any] = state.get("result") or {}
        return result
    code = state.get("code") or ErrorCode.OperationFailed
    if state.get("op") == "createIndexes":  # as mongod words a failed build; DuplicateKey's details
        raise CommandError(
            code,
            f"Index build failed: {state.get('ns')} :: caused by :: {state.get('reason') or code}",
            state.get("result") or None,
        )
    raise CommandError(code, f"{state.get('op')} of {state.get('ns')} failed: {state.get('reason') or code}")


def coordinator_command(state: dict[str, Any]) -> dict[str, Any]:
    """The request a coordinator runs, as its currentOp `command` shows it."""
    return {state["op"]: state["ns"], **(state.get("params") or {})}


def current_op_entry(state: dict[str, Any], now: float) -> dict[str, Any]:
    """One running coordinator (GetDDL's record) as mongos's currentOp shows a DDL coordinator."""
    secs = max(0.0, now - float(state.get("startedAt") or now))
    return {
        "type": "op",
        "desc": COORDINATOR_DESC.get(state["op"], "ShardingDDLCoordinator"),
        "op": "command",
        "ns": state["ns"],
        "command": coordinator_command(state),
        "currentPhase": state.get("phase"),
        "active": True,
        "secs_running": int(secs),
        "microsecs_running": int(secs * 1_000_000),
        "opid": state["id"],
        "shards": state.get("shards") or [],
    }


# currentOp's options (not filter fields): `$all` and `$ownOps`; every other field is a query on
# the entries, as mongos builds its $match (so `{currentOp: 1, idleConnections: true}` matches
# the entries whose `idleConnections` is true, none).  `$ownOps`: without users, every operation
# is the client's own.  `$all` adds idle connections, cursors and sessions, which shardlog does
# not list (only the running DDL coordinators are listed either way).
CURRENT_OP_OPTIONS = frozenset({"$all", "$ownOps"})


def current_op_filter(cmd: Mapping[str, Any]) -> dict[str, Any]:
    """`{currentOp: 1, $all?, $ownOps?, <filter>...}`: the rest is a query on the entries."""
    name = next(iter(cmd))
    return {k: v for k, v in cmd.items() if k != name and k not in CURRENT_OP_OPTIONS and k not in GENERIC_FIELDS}


# ------------------------------------------------------------------ indexes (domain/index_ddl.py)
#
# createIndexes and dropIndexes are DDL coordinators too (the same loop, domain/ddl_client.py);
# listIndexes is answered from the catalog the router (or the CLI) follows.


def collection_ns(cmd: Mapping[str, Any]) -> str:
    """`{<command>: "<collection>", $db}` -> "db.collection" (InvalidNamespace otherwise)."""
    name = next(iter(cmd))
    coll = cmd[name]
    if not isinstance(coll, str):
        raise CommandError(ErrorCode.InvalidNamespace, f"collection name has invalid type {type_name(coll)}")
    if not valid_collection_name(coll):
        raise CommandError(ErrorCode.InvalidNamespace, f"Invalid namespace specified '{cmd.get('$db')}.{coll}'")
    return f"{cmd['$db']}.{coll}"


def create_indexes(ns: str, specs: list[Any]) -> d.CreateCollectionIndexes:
    """The request, every spec checked as MongoDB checks it (domain.indexes.IndexSpec.parse); a
    spec's `ns`, if given, must be the collection's."""
    if not specs:
        raise CommandError(ErrorCode.BadValue, "Must specify at least one index.")
    for spec in specs:
        if not isinstance(spec, dict):
            raise CommandError(
                ErrorCode.TypeMismatch,
                f"BSON field 'createIndexes.indexes' elements must be objects, got {type_name(spec)}",
            )
        if "ns" in spec and spec["ns"] != ns:
            raise CommandError(
                ErrorCode.BadValue,
                f"The value of the field 'ns' ({spec['ns']}) doesn't match the namespace '{ns}'",
            )
    return _checked(d.CreateCollectionIndexes(ns=ns, indexes=specs))  # type: ignore[return-value]


def index_spec(
    key: Any,
    *,
    name: str | None = None,
    unique: bool = False,
    sparse: bool = False,
    partial: Any = None,
) -> dict[str, Any]:
    """The CLI's options as a createIndexes spec."""
    spec: dict[str, Any] = {"key": key}
    if name is not None:
        spec["name"] = name
    if unique:
        spec["unique"] = True
    if sparse:
        spec["sparse"] = True
    if partial is not None:
        spec["partialFilterExpression"] = partial
    return spec


def parse_create_indexes(cmd: Mapping[str, Any]) -> d.CreateCollectionIndexes:
    """`{createIndexes: "<collection>", indexes: [...], commitQuorum?, ignoreUnknownIndexOptions?}`
    (every shard builds; shards are single nodes, so a commitQuorum of 0 or 1, "majority" or
    "votingMembers" is met by each, and a larger one is UnsatisfiableCommitQuorum, as a
    one-node replica set answers)."""
    only_fields(cmd, {"indexes", "commitQuorum", "ignoreUnknownIndexOptions", "collectionUUID"})
    no_collection_uuid(cmd)
    ns = collection_ns(cmd)
    check_commit_quorum(cmd)
    specs = required(cmd, "indexes")
    if not isinstance(specs, list):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field 'createIndexes.indexes' is the wrong type '{type_name(specs)}', expected type 'array'",
        )
    if typed(cmd, "ignoreUnknownIndexOptions", bool, "bool", False):
        # only the options MongoDB does not define go: a known one shardlog lacks is still refused
        specs = [{k: v for k, v in s.items() if k in KNOWN_INDEX_OPTIONS} if isinstance(s, dict) else s for s in specs]
    return create_indexes(ns, specs)


def check_commit_quorum(cmd: Mapping[str, Any]) -> None:
    if "commitQuorum" not in cmd:
        return
    q = cmd["commitQuorum"]
    if isinstance(q, bool) or not isinstance(q, (int, float, str)):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field 'createIndexes.commitQuorum' is the wrong type '{type_name(q)}', expected types '[string, int]'",
        )
    if isinstance(q, (int, float)):
        if q < 0 or q > 50:
            raise CommandError(
                ErrorCode.FailedToParse,
                f"commitQuorum has to be a non-negative number and not greater than 50; found: {q}",
            )
        if q > 1:
            raise CommandError(
                ErrorCode.UnsatisfiableCommitQuorum,
                f"Not enough data-bearing voting nodes to satisfy commit quorum: {int(q)}",
            )
    elif q not in ("majority", "votingMembers"):
        raise CommandError(
            ErrorCode.UnsatisfiableCommitQuorum, f"Commit quorum cannot be satisfied: no replica set tag '{q}'"
        )


def drop_indexes(ns: str, index: Any) -> d.DropCollectionIndexes:
    return _checked(d.DropCollectionIndexes(ns=ns, index=check_drop_target(index)))  # type: ignore[return-value]


def parse_drop_indexes(cmd: Mapping[str, Any]) -> d.DropCollectionIndexes:
    """`{dropIndexes: "<collection>", index: "*" | name | key pattern | [names]}`."""
    only_fields(cmd, {"index", "collectionUUID"})
    no_collection_uuid(cmd)
    ns = collection_ns(cmd)
    return drop_indexes(ns, required(cmd, "index"))


def parse_list_indexes(cmd: Mapping[str, Any]) -> str:
    """`{listIndexes: "<collection>", cursor?: {batchSize}}` -> the namespace.  The index builds
    in progress are not listed (the catalog lists built indexes), so `includeBuildUUIDs` and
    `includeIndexBuildInfo`, which change the entries' shape, are refused unless false."""
    only_fields(cmd, {"cursor", "includeBuildUUIDs", "includeIndexBuildInfo"})
    cursor_options(cmd)
    for option in ("includeBuildUUIDs", "includeIndexBuildInfo"):
        if typed(cmd, option, bool, "bool", False):
            raise not_implemented("listIndexes", option, "listing index builds in progress")
    return collection_ns(cmd)


def cursor_options(cmd: Mapping[str, Any]) -> int | None:
    """A command's `cursor: {batchSize?}` (MongoDB's SimpleCursorOptions): the batch size, or None."""
    cursor = typed(cmd, "cursor", dict, "object")
    if not cursor:
        return None
    name = next(iter(cmd))
    for key in cursor:
        if key != "batchSize":
            raise CommandError(ErrorCode.IDLUnknownField, f"BSON field '{name}.cursor.{key}' is an unknown field.")
    if "batchSize" not in cursor:
        return None
    size = cursor["batchSize"]
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field '{name}.cursor.batchSize' is the wrong type '{type_name(size)}', expected type 'number'",
        )
    if size < 0:
        raise CommandError(ErrorCode.BadValue, f"BatchSize value must be non-negative, but received: {size}")
    return int(size)


def list_indexes(catalog: Catalog, ns: str) -> list[dict[str, Any]]:
    """listIndexes from the catalog: NamespaceNotFound for a collection it does not know."""
    db = catalog.databases.get(ns.partition(".")[0])
    if ns not in catalog.collections and (db is None or ns not in db.collections):
        raise CommandError(ErrorCode.NamespaceNotFound, f"ns does not exist: {ns}")
    return list_documents(catalog.index_list(ns))
