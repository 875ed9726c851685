"""Database and server introspection: listDatabases, listCollections, dbStats, collStats,
serverStatus (a truthful subset).  What the router knows is the catalog: databases, the
sharded collections and the unsharded ones it has seen written; sizes are not projected to
routers, so they are reported as 0 where MongoDB has them (`sizeOnDisk`, `size`).

`create` tracks a collection as a first insert does; `drop` and `dropDatabase` are DDL
coordinators (`ddl.py`).
"""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from bson import Int64

from domain.catalog import Catalog
from domain.protocol import ErrorCode
from domain.query import QueryError, compile_filter
from domain.sharding_commands import cursor_options
from libs.errors import CommandError
from schemas.config import CreateCollection
from services.router.wire.commands import COMPATIBLE_VERSION, SERVER_COMMANDS, Connection
from services.router.wire.config_db import COLLECTIONS as CONFIG_COLLECTIONS
from services.router.wire.config_db import this_router_id, uuid_value
from services.router.wire.options import HONOURED, Fields, Rule, only_if_empty, only_if_false, refused, refused_unless


def _filter(flt: Any, what: str) -> Any:
    if not isinstance(flt, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"{what} 'filter' must be an object")
    try:
        return compile_filter(flt)
    except QueryError as e:
        raise CommandError(ErrorCode.BadValue, str(e)) from None


def collection_names(cat: Catalog, db: str) -> list[str]:
    """The collections of `db` the catalog knows: sharded ones and tracked unsharded ones."""
    names = {ns.partition(".")[2] for ns in cat.collections if ns.partition(".")[0] == db}
    d = cat.databases.get(db)
    if d is not None:
        names |= {ns.partition(".")[2] for ns in d.collections}
    return sorted(names)


def database_names(cat: Catalog) -> list[str]:
    return sorted({*cat.databases, *(ns.partition(".")[0] for ns in cat.collections)})


# ------------------------------------------------------------------ listDatabases


def list_databases(cat: Catalog, cmd: dict[str, Any]) -> dict[str, Any]:
    name_only = bool(cmd.get("nameOnly"))
    flt = _filter(cmd.get("filter") or {}, "listDatabases")
    dbs: list[dict[str, Any]] = []
    for name in ["admin", "config", *database_names(cat)]:
        doc: dict[str, Any] = {"name": name}
        if not name_only:
            doc["sizeOnDisk"] = 0  # sizes live with the shards; routers do not project them
            doc["empty"] = name not in cat.databases and name not in ("config",)
            if name in cat.databases:
                doc["shards"] = {cat.databases[name].primary: 0}
        if flt.matches(doc):
            dbs.append(doc if not name_only else {"name": name})
    out: dict[str, Any] = {"databases": dbs}
    if not name_only:
        out["totalSize"] = 0
        out["totalSizeMb"] = 0
    return out


# There are no users: every database is authorized, so `authorizedDatabases` changes nothing.
LIST_DATABASES = Fields("listDatabases", {"filter": HONOURED, "nameOnly": HONOURED, "authorizedDatabases": HONOURED})


@SERVER_COMMANDS.register("listDatabases", admin_only=True, fields=LIST_DATABASES)
async def _list_databases(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return list_databases(conn.cluster().follower.catalog, cmd)


# ------------------------------------------------------------------ listCollections


def collection_info(cat: Catalog, db: str, name: str) -> dict[str, Any]:
    ns = f"{db}.{name}"
    info: dict[str, Any] = {"readOnly": db == "config"}
    coll = cat.collections.get(ns)
    if coll is not None:
        info["uuid"] = uuid_value(coll.uuid)
    return {
        "name": name,
        "type": "collection",
        "options": {},
        "info": info,
        "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
    }


def list_collections(cat: Catalog, db: str, cmd: dict[str, Any]) -> list[dict[str, Any]]:
    flt = _filter(cmd.get("filter") or {}, "listCollections")
    names = list(CONFIG_COLLECTIONS) if db == "config" else collection_names(cat, db)
    docs = [collection_info(cat, db, n) for n in sorted(names)]
    docs = [d for d in docs if flt.matches(d)]
    if cmd.get("nameOnly"):
        docs = [{"name": d["name"], "type": d["type"]} for d in docs]
    return docs


# No users: every collection is authorized (`authorizedCollections`).  A collection being
# dropped is not listed apart (`includePendingDrops`, an internal option: refused unless false).
LIST_COLLECTIONS = Fields(
    "listCollections",
    {
        "filter": HONOURED,
        "nameOnly": HONOURED,
        "authorizedCollections": HONOURED,
        "cursor": HONOURED,  # {batchSize}: checked by cursor_options
        "includePendingDrops": only_if_false("listing collections pending drop"),
    },
)


@SERVER_COMMANDS.register("listCollections", fields=LIST_COLLECTIONS)
async def _list_collections(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    batch = cursor_options(cmd)
    edge = conn.cluster()
    db = cmd["$db"]
    docs = list_collections(edge.follower.catalog, db, cmd)
    if batch is not None and batch < len(docs):
        # more than one batch: a router-held cursor, continued by getMore like any find
        opened = edge.routing.open_cursor(docs, batch)
        cursor_id = Int64(opened["cursorId"] or 0)
        return {"cursor": {"id": cursor_id, "ns": f"{db}.$cmd.listCollections", "firstBatch": opened["docs"]}}
    return {"cursor": {"id": 0, "ns": f"{db}.$cmd.listCollections", "firstBatch": docs}}


# ------------------------------------------------------------------ dbStats / collStats


def db_stats(cat: Catalog, db: str, scale: int, free_storage: bool = False) -> dict[str, Any]:
    names = collection_names(cat, db)
    out: dict[str, Any] = {
        "db": db,
        "collections": len(names),
        "views": 0,
        "objects": 0,  # counts and sizes live with the shards (not projected to routers)
        "avgObjSize": 0,
        "dataSize": 0,
        "storageSize": 0,
        "indexes": len(names),  # each has its _id index
        "indexSize": 0,
        "totalSize": 0,
        "scaleFactor": scale,
        "fileSize": 0,
        "raw": {},
    }
    if free_storage:  # sizes live with the shards (not projected to routers): 0, as above
        out.update(freeStorageSize=0, indexFreeStorageSize=0, totalFreeStorageSize=0)
    return out


def _scale(cmd: dict[str, Any]) -> int:
    scale = cmd.get("scale", 1)
    if not isinstance(scale, int | float) or isinstance(scale, bool) or scale < 1:
        raise CommandError(ErrorCode.BadValue, "scale has to be >= 1")
    return int(scale)


DB_STATS = Fields("dbStats", {"scale": HONOURED, "freeStorage": HONOURED})


@SERVER_COMMANDS.register("dbStats", "dbstats", fields=DB_STATS)
async def _db_stats(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    scale = _scale(cmd)
    return db_stats(conn.cluster().follower.catalog, cmd["$db"], scale, bool(cmd.get("freeStorage")))


def coll_stats(cat: Catalog, ns: str, scale: int) -> dict[str, Any]:
    db, _, name = ns.partition(".")
    coll = cat.collections.get(ns)
    if coll is None and name not in collection_names(cat, db):
        raise CommandError(ErrorCode.NamespaceNotFound, f"Collection [{ns}] not found.")
    out: dict[str, Any] = {
        "ns": ns,
        "sharded": coll is not None,
        "count": 0,  # counts and sizes live with the shards (not projected to routers)
        "size": 0,
        "storageSize": 0,
        "totalIndexSize": 0,
        "totalSize": 0,
        "avgObjSize": 0,
        "nindexes": len(cat.index_list(ns)),
        "indexSizes": {i.name: 0 for i in cat.index_list(ns)},
        "scaleFactor": scale,
    }
    if coll is not None:
        per_shard = coll.chunks_per_shard()
        out["nchunks"] = len(coll.chunks)
        out["shards"] = {sh: {"ns": ns, "count": 0, "size": 0, "nchunks": n} for sh, n in sorted(per_shard.items())}
        out["primary"] = cat.databases[db].primary if db in cat.databases else None
    else:
        primary = cat.databases[db].primary if db in cat.databases else None
        out["primary"] = primary
        if primary is not None:
            out["shards"] = {primary: {"ns": ns, "count": 0, "size": 0}}
    return out


# collStats: `indexDetails` (each index's storage-engine statistics) and `verbose` (more of
# them) are refused unless false; `indexDetailsKey` / `indexDetailsName` only pick among those
# details, so without them they change nothing, as in MongoDB; a router takes no lock to wait for.
COLL_STATS_RULES: dict[str, Rule] = {
    "scale": HONOURED,
    "verbose": only_if_false("verbose storage statistics"),
    "indexDetails": only_if_false("per-index storage statistics"),
    "indexDetailsKey": HONOURED,
    "indexDetailsName": HONOURED,
    "waitForLock": HONOURED,
}


@SERVER_COMMANDS.register("collStats", fields=Fields("collStats", COLL_STATS_RULES))
@SERVER_COMMANDS.register("collstats", fields=Fields("collstats", COLL_STATS_RULES))
async def _coll_stats(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    name = cmd["collStats"] if "collStats" in cmd else cmd["collstats"]
    if not isinstance(name, str) or not name:
        raise CommandError(ErrorCode.InvalidNamespace, "collStats needs a collection name")
    return coll_stats(conn.cluster().follower.catalog, f"{cmd['$db']}.{name}", _scale(cmd))


# ------------------------------------------------------------------ serverStatus


# Always in serverStatus's reply, whatever the section toggles say (as MongoDB's).
SERVER_STATUS_BASICS = frozenset(
    {"host", "version", "process", "pid", "uptime", "uptimeMillis", "uptimeEstimate", "localTime"}
)


# serverStatus's fields are section toggles (`{serverStatus: 1, connections: 0}`), any name, as
# in MongoDB: a section turned off is left out; the others are all included (fields=None).
@SERVER_COMMANDS.register("serverStatus", "serverstatus")
async def _server_status(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """What this router really knows: who it is, since when, its connections."""
    edge = conn.cluster()
    reply = server_status(edge)
    off = {k for k, v in list(cmd.items())[1:] if k not in SERVER_STATUS_BASICS and _off(v)}
    return {k: v for k, v in reply.items() if k not in off}


def _off(value: Any) -> bool:
    return value is False or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


def server_status(edge: Any) -> dict[str, Any]:
    now = time.time()
    return {
        "host": socket.gethostname(),
        "version": COMPATIBLE_VERSION,
        "process": "mongos",
        "pid": os.getpid(),
        "uptime": float(int(now - edge.started)),
        "uptimeMillis": int((now - edge.started) * 1000),
        "uptimeEstimate": int(now - edge.started),
        "localTime": datetime.now(UTC),
        "shardlog": {"router": edge.instance, "address": this_router_id(edge)},
        **edge.stats(),
    }


# ------------------------------------------------------------------ create


def _simple_collation(value: Any) -> bool:
    return isinstance(value, dict) and value.get("locale") == "simple" and len(value) == 1


def _default_id_index(value: Any) -> bool:
    """The _id index every collection has: `{key: {_id: 1}, name: "_id_"}` (v 2)."""
    if not isinstance(value, dict):
        return False
    rest = {k: v for k, v in value.items() if k not in ("key", "name", "v", "ns")}
    return (
        value.get("key") == {"_id": 1} and value.get("name", "_id_") == "_id_" and value.get("v", 2) == 2 and not rest
    )


# create's options (MongoDB's create.idl): a collection here is a plain collection with the _id
# index and binary string comparison.  Every other kind is refused, naming the option, unless
# the value is the one that changes nothing.
CREATE_FIELDS = Fields(
    "create",
    {
        "capped": only_if_false("capped collections"),
        "size": refused("capped collections (size)"),
        "max": refused("capped collections (max)"),
        "autoIndexId": refused_unless(lambda v: v is True or v == 1, "a collection without an _id index"),
        "idIndex": refused_unless(_default_id_index, "an _id index other than {key: {_id: 1}, name: '_id_'}"),
        "storageEngine": only_if_empty("storage engine options"),
        "indexOptionDefaults": only_if_empty("index option defaults"),
        "validator": only_if_empty("document validation"),
        "validationLevel": refused_unless(lambda v: v == "strict", "document validation (validationLevel)"),
        "validationAction": refused_unless(lambda v: v == "error", "document validation (validationAction)"),
        "viewOn": refused("views"),
        "pipeline": refused("views"),
        "collation": refused_unless(_simple_collation, "collations other than {locale: 'simple'}"),
        "timeseries": refused("time-series collections"),
        "expireAfterSeconds": refused("expiring documents (TTL)"),
        "clusteredIndex": only_if_false("clustered collections"),
        "changeStreamPreAndPostImages": refused_unless(
            lambda v: v == {"enabled": False}, "change stream pre- and post-images"
        ),
        "recordPreImages": only_if_false("recording pre-images"),
        "encryptedFields": refused("Queryable Encryption"),
        "temp": only_if_false("temporary collections"),
        "flags": only_if_false("collection flags"),
    },
)


@SERVER_COMMANDS.register("create", fields=CREATE_FIELDS)
async def _create(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """An explicit create is the implicit one a first insert makes: the catalog tracks the
    collection on its database's primary.  Its options are checked by CREATE_FIELDS first."""
    from services.router.wire.admin import config_command  # the one way config commands go

    name, db = cmd["create"], cmd["$db"]
    if not isinstance(name, str) or not name:
        raise CommandError(ErrorCode.InvalidNamespace, "create needs a collection name")
    if db in ("config", "admin", "local"):
        raise CommandError(ErrorCode.InvalidNamespace, f"cannot create a collection in the {db!r} database")
    ns = f"{db}.{name}"
    edge = conn.cluster()
    if name in collection_names(edge.follower.catalog, db):
        raise CommandError(ErrorCode.NamespaceExists, f"Collection {ns} already exists.")
    await config_command(edge, CreateCollection(ns=ns))
    return {}
