"""issue 38 §1 for the server, database, index and admin commands: every field is honoured or
refused before the command runs.  A field the command does not define is IDLUnknownField
(40415); one MongoDB defines and shardlog does not implement is NotImplemented (238), naming
it, unless its value is the one that changes nothing, which is accepted.  Driven through the
command table with no cluster attached: a command that passes every check reaches its handler,
which then says it has no cluster (CommandNotFound, 59); a refused one never reaches it, so it
changes nothing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

import services.router.wire  # noqa: F401  (registers every command)
from domain import sharding_commands as sc
from domain.catalog import Catalog
from domain.indexes import IndexSpec
from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import config as c
from services.router.wire import admin, databases
from services.router.wire.commands import SERVER_COMMANDS, Connection

REACHED_HANDLER = 59  # CommandNotFound: the handler ran and found no cluster attached


def reply(cmd: dict[str, Any], conn: Connection | None = None) -> dict[str, Any]:
    conn = conn or Connection(id=1, peer="test")
    return asyncio.run(SERVER_COMMANDS(conn, {**cmd, "$db": cmd.get("$db", "admin")}))


def code(cmd: dict[str, Any]) -> int:
    r = reply(cmd)
    assert r["ok"] == 0, r
    return int(r["code"])


def call(handler: Any, conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """A handler run directly (past the command table's checks)."""

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = await handler(conn, cmd)
        return out

    return asyncio.run(run())


def refused_code(fn: Any, *args: Any) -> str:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return str(e.value.code)


# ------------------------------------------------------------------ unknown fields: 40415


@pytest.mark.parametrize(
    "cmd",
    [
        {"listDatabases": 1, "bogus": 1},
        {"listCollections": 1, "filtre": {}, "$db": "app"},
        {"listCollections": 1, "cursor": {"batchSize": 1, "size": 2}, "$db": "app"},
        {"dbStats": 1, "bogus": 1, "$db": "app"},
        {"collStats": "c", "bogus": 1, "$db": "app"},
        {"create": "c", "cappedSize": 5, "$db": "app"},
        {"ping": 1, "bogus": 1},
        {"buildInfo": 1, "bogus": 1},
        {"whatsmyuri": 1, "bogus": 1},
        {"connectionStatus": 1, "showPrivilege": True},
        {"getLog": "global", "bogus": 1},
        {"hostInfo": 1, "bogus": 1},
        {"isdbgrid": 1, "bogus": 1},
        {"listShards": 1, "bogus": 1},
        {"balancerStatus": 1, "bogus": 1},
        {"balancerStart": 1, "bogus": 1},
        {"flushRouterConfig": 1, "bogus": 1},
        {"getShardVersion": "a.b", "bogus": 1},
        {"listIndexes": "c", "cursor": {"batchsize": 1}, "$db": "app"},
    ],
)
def test_an_unknown_field_is_idl_unknown_field(cmd: dict[str, Any]) -> None:
    r = reply(cmd)
    assert (r["ok"], r["code"], r["codeName"]) == (0, 40415, "IDLUnknownField"), r
    assert "is an unknown field" in r["errmsg"]


# ------------------------------------------------------------------ refused options: 238


@pytest.mark.parametrize(
    ("cmd", "field"),
    [
        ({"create": "c", "capped": True, "size": 4096}, "capped"),
        ({"create": "c", "size": 4096}, "size"),
        ({"create": "c", "max": 10}, "max"),
        ({"create": "c", "validator": {"a": {"$exists": True}}}, "validator"),
        ({"create": "c", "validationLevel": "moderate"}, "validationLevel"),
        ({"create": "c", "validationAction": "warn"}, "validationAction"),
        ({"create": "v", "viewOn": "c", "pipeline": []}, "viewOn"),
        ({"create": "c", "collation": {"locale": "fr"}}, "collation"),
        ({"create": "c", "timeseries": {"timeField": "t"}}, "timeseries"),
        ({"create": "c", "expireAfterSeconds": 60}, "expireAfterSeconds"),
        ({"create": "c", "clusteredIndex": {"key": {"_id": 1}, "unique": True}}, "clusteredIndex"),
        ({"create": "c", "changeStreamPreAndPostImages": {"enabled": True}}, "changeStreamPreAndPostImages"),
        ({"create": "c", "encryptedFields": {"fields": []}}, "encryptedFields"),
        ({"create": "c", "idIndex": {"key": {"_id": 1}, "name": "_id_", "unique": False}}, "idIndex"),
        ({"create": "c", "autoIndexId": False}, "autoIndexId"),
        ({"create": "c", "storageEngine": {"wiredTiger": {"configString": "x"}}}, "storageEngine"),
        ({"create": "c", "indexOptionDefaults": {"storageEngine": {"wiredTiger": {}}}}, "indexOptionDefaults"),
        ({"create": "c", "recordPreImages": True}, "recordPreImages"),
        ({"collStats": "c", "indexDetails": True}, "indexDetails"),
        ({"collStats": "c", "verbose": True}, "verbose"),
        ({"listCollections": 1, "includePendingDrops": True}, "includePendingDrops"),
        ({"getShardVersion": "a.b", "fullMetadata": True}, "fullMetadata"),
    ],
)
def test_a_known_option_shardlog_lacks_is_not_implemented(cmd: dict[str, Any], field: str) -> None:
    r = reply({**cmd, "$db": "admin" if "getShardVersion" in cmd else "app"})
    assert (r["ok"], r["code"], r["codeName"]) == (0, 238, "NotImplemented"), r  # the handler never ran
    assert f".{field}'" in r["errmsg"] and "not supported by shardlog" in r["errmsg"]


# ------------------------------------------------------------------ neutral values: accepted


@pytest.mark.parametrize(
    "cmd",
    [
        {"create": "c", "capped": False},
        {"create": "c", "collation": {"locale": "simple"}},
        {"create": "c", "validator": {}, "validationLevel": "strict", "validationAction": "error"},
        {"create": "c", "autoIndexId": True, "idIndex": {"key": {"_id": 1}, "name": "_id_", "v": 2}},
        {"create": "c", "changeStreamPreAndPostImages": {"enabled": False}, "storageEngine": {}},
        {"create": "c", "clusteredIndex": False, "recordPreImages": False, "comment": "x"},
        {"collStats": "c", "scale": 1024, "indexDetails": False, "verbose": False, "waitForLock": True},
        {"dbStats": 1, "scale": 1, "freeStorage": 1},
        {"listCollections": 1, "filter": {}, "nameOnly": True, "authorizedCollections": True},
        {"listCollections": 1, "includePendingDrops": False, "cursor": {"batchSize": 2}},
        {"listDatabases": 1, "filter": {}, "nameOnly": True, "authorizedDatabases": True, "$db": "admin"},
        {"getShardVersion": "a.b", "fullMetadata": False, "$db": "admin"},
    ],
)
def test_a_neutral_value_is_accepted(cmd: dict[str, Any]) -> None:
    assert code(cmd if "$db" in cmd else {**cmd, "$db": "app"}) == REACHED_HANDLER


def test_create_with_neutral_options_creates_a_plain_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    async def config_command(edge: Any, record: Any, timeout: float = 0) -> dict[str, Any]:
        sent.append(record)
        return {}

    monkeypatch.setattr(admin, "config_command", config_command)
    edge = SimpleNamespace(follower=SimpleNamespace(catalog=Catalog()))
    conn = Connection(id=1, peer="test", edge=edge)  # type: ignore[arg-type]
    cmd = {"create": "c", "capped": False, "collation": {"locale": "simple"}, "$db": "app"}
    assert call(databases._create, conn, cmd) == {}
    assert sent == [c.CreateCollection(ns="app.c")]


# ------------------------------------------------------------------ the handshake and server commands


def test_hello_is_tolerant_and_honours_its_fields() -> None:
    conn = Connection(id=7, peer="test", compressors=("zlib",))
    r = reply(
        {
            "hello": 1,
            "client": {"driver": {"name": "x", "version": "1"}},
            "compression": ["snappy", "zlib"],
            "loadBalanced": True,  # as a mongos not behind a load balancer: no serviceId
            "backpressure": "2",  # pymongo 4.20 sends it to every server: not refused
            "saslSupportedMechs": "admin.nobody",
            "speculativeAuthenticate": {"saslStart": 1},
        },
        conn,
    )
    assert r["ok"] == 1.0 and r["isWritablePrimary"] is True and r["compression"] == ["zlib"]
    assert "serviceId" not in r and "saslSupportedMechs" not in r and "speculativeAuthenticate" not in r
    r = reply({"isMaster": 1, "helloOk": True, "topologyVersion": {"processId": 1, "counter": 0}, "maxAwaitTimeMS": 10})
    assert r["ok"] == 1.0 and r["helloOk"] is True and r["ismaster"] is True


def test_server_commands() -> None:
    assert reply({"ping": 1})["ok"] == 1.0
    assert reply({"buildInfo": 1, "comment": "generic arguments are fine"})["version"]
    assert reply({"connectionStatus": 1, "showPrivileges": True})["authInfo"]["authenticatedUserPrivileges"] == []
    assert "authenticatedUserPrivileges" not in reply({"connectionStatus": 1})["authInfo"]
    assert reply({"getLog": 1})["code"] == 14  # TypeMismatch: getLog names a log
    assert reply({"isdbgrid": 1})["isdbgrid"] == 1


# ------------------------------------------------------------------ database commands' pure parts


def test_db_stats_free_storage_and_server_status_sections() -> None:
    cat = Catalog()
    assert "freeStorageSize" not in databases.db_stats(cat, "app", 1)
    assert databases.db_stats(cat, "app", 1, free_storage=True)["totalFreeStorageSize"] == 0
    edge = SimpleNamespace(started=0.0, instance="r0", server=None, stats=lambda: {"connections": {"current": 1}})
    conn = Connection(id=1, peer="test", edge=edge)  # type: ignore[arg-type]
    full = call(databases._server_status, conn, {"serverStatus": 1, "$db": "admin"})
    assert "connections" in full
    off = call(databases._server_status, conn, {"serverStatus": 1, "connections": 0, "host": 0, "$db": "admin"})
    assert "connections" not in off and "host" in off  # the basics stay, as in MongoDB


def test_list_collections_batch_size_is_checked_as_mongodb_checks_it() -> None:
    assert sc.cursor_options({"listCollections": 1}) is None
    assert sc.cursor_options({"listCollections": 1, "cursor": {}}) is None
    assert sc.cursor_options({"listCollections": 1, "cursor": {"batchSize": 0}}) == 0
    assert refused_code(sc.cursor_options, {"listCollections": 1, "cursor": {"batchSize": -1}}) == "BadValue"
    assert refused_code(sc.cursor_options, {"listCollections": 1, "cursor": {"batchSize": "2"}}) == "TypeMismatch"
    assert refused_code(sc.cursor_options, {"listCollections": 1, "cursor": 5}) == "TypeMismatch"


# ------------------------------------------------------------------ index options


@pytest.mark.parametrize(
    "option",
    [
        {"expireAfterSeconds": 3600},
        {"hidden": True},
        {"collation": {"locale": "fr"}},
        {"collation": {"locale": "simple", "strength": 2}},
        {"wildcardProjection": {"a": 1}},
        {"weights": {"a": 1}},
        {"default_language": "english"},
        {"2dsphereIndexVersion": 3},
        {"bits": 26},
        {"storageEngine": {"wiredTiger": {}}},
        {"clustered": True},
        {"prepareUnique": True},
        {"v": 1},
    ],
)
def test_an_index_option_shardlog_lacks_is_not_implemented(option: dict[str, Any]) -> None:
    with pytest.raises(CommandError) as e:
        IndexSpec.parse({"key": {"a": 1}, **option})
    assert e.value.code == ErrorCode.NotImplemented and repr(next(iter(option))) in e.value.message
    cmd = {"createIndexes": "c", "indexes": [{"key": {"a": 1}, **option}], "$db": "app"}
    assert code(cmd) == 238  # refused before anything is sent


def test_neutral_index_options_make_the_plain_index() -> None:
    plain = IndexSpec.parse({"key": {"a": 1}})
    neutral = IndexSpec.parse(
        {
            "key": {"a": 1},
            "hidden": False,
            "collation": {"locale": "simple"},
            "prepareUnique": False,
            "clustered": False,
            "storageEngine": {},
            "background": True,  # a no-op since MongoDB 4.2
            "v": 2,
        }
    )
    assert neutral == plain and neutral.to_mongo() == plain.to_mongo() == {"v": 2, "key": {"a": 1}, "name": "a_1"}


def test_create_indexes_command_options() -> None:
    base = {"createIndexes": "c", "indexes": [{"key": {"a": 1}}], "$db": "db"}
    for quorum in (0, 1, "majority", "votingMembers"):
        assert sc.parse_create_indexes({**base, "commitQuorum": quorum}).ns == "db.c"
    assert refused_code(sc.parse_create_indexes, {**base, "commitQuorum": 2}) == "UnsatisfiableCommitQuorum"
    assert refused_code(sc.parse_create_indexes, {**base, "commitQuorum": "dc"}) == "UnsatisfiableCommitQuorum"
    assert refused_code(sc.parse_create_indexes, {**base, "commitQuorum": True}) == "TypeMismatch"
    assert refused_code(sc.parse_create_indexes, {**base, "collectionUUID": "u"}) == "NotImplemented"
    # ignoreUnknownIndexOptions drops what MongoDB does not define, never an option it defines
    ignoring = {**base, "ignoreUnknownIndexOptions": True}
    r = sc.parse_create_indexes({**ignoring, "indexes": [{"key": {"a": 1}, "bogus": 1, "hidden": False}]})
    assert r.indexes == [{"key": {"a": 1}, "hidden": False}]
    spec = {"key": {"a": 1}, "bogus": 1, "expireAfterSeconds": 5}
    assert refused_code(sc.parse_create_indexes, {**ignoring, "indexes": [spec]}) == "NotImplemented"
    # a spec's ns must be the collection's
    assert sc.parse_create_indexes({**base, "indexes": [{"key": {"a": 1}, "ns": "db.c"}]}).ns == "db.c"
    assert refused_code(sc.parse_create_indexes, {**base, "indexes": [{"key": {"a": 1}, "ns": "db.x"}]}) == "BadValue"


def test_list_indexes_and_drop_options() -> None:
    assert sc.parse_list_indexes({"listIndexes": "c", "includeBuildUUIDs": False, "$db": "db"}) == "db.c"
    for option in ("includeBuildUUIDs", "includeIndexBuildInfo"):
        assert refused_code(sc.parse_list_indexes, {"listIndexes": "c", option: True, "$db": "db"}) == "NotImplemented"
    uuid = "5e0b2f1e-0000-4000-8000-000000000000"
    assert refused_code(sc.parse_drop, {"drop": "c", "collectionUUID": uuid, "$db": "db"}) == "NotImplemented"
    cmd = {"dropIndexes": "c", "index": "*", "collectionUUID": uuid, "$db": "db"}
    assert refused_code(sc.parse_drop_indexes, cmd) == "NotImplemented"
    cmd = {"renameCollection": "db.a", "to": "db.b", "collectionUUID": uuid}
    assert refused_code(sc.parse_rename_collection, cmd) == "NotImplemented"


# ------------------------------------------------------------------ admin commands' allowed sets


def test_admin_options_are_honoured_or_refused() -> None:
    assert refused_code(sc.parse_add_shard, {"addShard": "rs/h:1", "maxSize": 100}) == "InvalidOptions"  # gone in 6.2
    assert refused_code(sc.parse_merge_chunks, {"mergeChunks": "a.b", "bounds": [{}, {}], "epoch": "e"}) == (
        "NotImplemented"
    )
    cmd: dict[str, Any] = {"shardCollection": "a.b", "key": {"x": 1}, "timeseries": {"timeField": "t"}}
    assert refused_code(sc.parse_shard_collection, cmd) == "NotImplemented"
    cmd = {"configureCollectionBalancing": "a.b", "defragmentCollection": True}
    assert refused_code(sc.parse_configure_collection_balancing, cmd) == "NotImplemented"
    assert sc.parse_configure_collection_balancing(
        {"configureCollectionBalancing": "a.b", "enableAutoSplitter": True, "defragmentCollection": False}
    ) == [c.SetSetting(ns="a.b", key="autoSplit", value=True)]


def test_current_op_options_are_only_all_and_own_ops() -> None:
    """As mongos builds its $match: every other field is a query on the entries."""
    cmd: dict[str, Any] = {
        "currentOp": 1,
        "$all": True,
        "$ownOps": True,
        "idleConnections": True,
        "comment": "x",
        "$db": "admin",
    }
    assert sc.current_op_filter(cmd) == {"idleConnections": True}
