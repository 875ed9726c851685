"""Sharding administration, the config database and introspection through the wire edge:
the real pymongo driver against a live router (data_cluster: config server, shards s0..s2,
one router, all through the real broker)."""

from __future__ import annotations

import datetime as dt

import pytest
from bson import MaxKey, MinKey, ObjectId, Timestamp
from bson.binary import Binary
from pymongo.errors import CollectionInvalid, OperationFailure

from schemas import config as c
from schemas import shard as s

pytestmark = pytest.mark.kafka


def chunks_of(cluster, ns: str) -> list[tuple[dict, dict, str]]:
    cat = cluster.router.follower.catalog
    from domain.shardkey import to_ejson

    return [(to_ejson(c.min), to_ejson(c.max), c.shard) for c in cat.collections[ns].chunks]


def config_docs(cluster, coll: str) -> list[dict]:
    from services.router.wire.config_db import documents

    edge = cluster.router.wire.edge
    return cluster.call(documents(edge, coll))


def test_sharding_administration_through_pymongo(data_cluster):
    admin = data_cluster.mongo_client().admin

    # listShards: the three shards, in MongoDB's shape
    shards = admin.command("listShards")["shards"]
    assert [d["_id"] for d in shards] == ["s0", "s1", "s2"]
    assert all(d["state"] == 1 and isinstance(d["topologyTime"], Timestamp) and "/" in d["host"] for d in shards)

    # addShard names a new shard (from the replica set name of the connection string), and
    # first asks it to answer, as mongos connects to it: s3 has no process (issue 18, point 7)
    with pytest.raises(OperationFailure) as e:
        admin.command("addShard", "s3/host-a:27018,host-b:27018", maxTimeMS=2000)
    assert e.value.code == 96 and "HostUnreachable" in str(e.value)  # OperationFailed
    assert "s3" not in [d["_id"] for d in admin.command("listShards")["shards"]]
    with pytest.raises(OperationFailure) as e:
        admin.command("addShard", "bad name!")
    assert e.value.code == 2  # BadValue
    data_cluster.command(c.AddShard(shard="s3"))  # recorded without a process, for removeShard below
    assert "s3" in [d["_id"] for d in admin.command("listShards")["shards"]]

    # enableSharding with a primary, then shardCollection
    admin.command("enableSharding", "app", primaryShard="s0")
    reply = admin.command("shardCollection", "app.users", key={"k": 1})
    assert reply["collectionsharded"] == "app.users"
    # again with the same key and options: ok, as MongoDB (idempotent); another key or unique: refused
    assert admin.command("shardCollection", "app.users", key={"k": 1.0})["collectionsharded"] == "app.users"
    for other in ({"key": {"j": 1}}, {"key": {"k": 1}, "unique": True}):
        with pytest.raises(OperationFailure) as e:
            admin.command("shardCollection", "app.users", **other)
        assert e.value.code == 23  # AlreadyInitialized
        assert "sharding already enabled for collection app.users" in str(e.value)
    with pytest.raises(OperationFailure) as e:
        admin.command("shardCollection", "app.other")
    assert e.value.code == 40414  # the key is missing: IDLFailedToParse
    with pytest.raises(OperationFailure) as e:
        admin.command("shardCollection", "app.other", key={"k": 1}, bogus=1)
    assert e.value.code == 40415  # IDLUnknownField
    assert chunks_of(data_cluster, "app.users") == [({"k": {"$minKey": 1}}, {"k": {"$maxKey": 1}}, "s0")]

    # split at a point (middle), then at the median of a chunk's documents (find)
    admin.command("split", "app.users", middle={"k": 100})
    assert [c[0] for c in chunks_of(data_cluster, "app.users")] == [{"k": {"$minKey": 1}}, {"k": 100}]
    data_cluster.call(
        data_cluster.router.routing.handle(s.Insert(ns="app.users", docs=[{"_id": i, "k": i} for i in range(100, 110)]))
    )
    admin.command("split", "app.users", find={"k": 105})
    mins = [c[0] for c in chunks_of(data_cluster, "app.users")]
    assert len(mins) == 3 and mins[1] == {"k": 100} and 100 < mins[2]["k"] < 110, mins
    # bounds: the chunk [MinKey, 100) holds no document: CannotSplit
    with pytest.raises(OperationFailure) as e:
        admin.command("split", "app.users", bounds=[{"k": MinKey()}, {"k": 100}])
    assert e.value.code == 87
    with pytest.raises(OperationFailure) as e:
        admin.command("split", "app.users", middle={"k": 1}, find={"k": 1})
    assert e.value.code == 2

    # mergeChunks [100, MaxKey) back into one, then split it again by its bounds (the median)
    admin.command("mergeChunks", "app.users", bounds=[{"k": 100}, {"k": MaxKey()}])
    assert [c[0] for c in chunks_of(data_cluster, "app.users")] == [{"k": {"$minKey": 1}}, {"k": 100}]
    admin.command("split", "app.users", bounds=[{"k": 100}, {"k": MaxKey()}])
    assert [c[0] for c in chunks_of(data_cluster, "app.users")] == mins

    # moveRange (a whole chunk) and moveChunk (by a document): they return once committed
    admin.command("moveRange", "app.users", min={"k": MinKey()}, max={"k": 100}, toShard="s1")
    assert chunks_of(data_cluster, "app.users")[0][2] == "s1"
    reply = admin.command("moveChunk", "app.users", find={"k": 109}, to="s2")
    assert isinstance(reply["millis"], int)
    assert [c[2] for c in chunks_of(data_cluster, "app.users")] == ["s1", "s0", "s2"]
    with pytest.raises(OperationFailure) as e:
        admin.command("moveRange", "app.users", min={"k": MinKey()}, max={"k": 100}, toShard="nope")
    assert e.value.code == 70  # ShardNotFound
    with pytest.raises(OperationFailure) as e:  # not one chunk's bounds
        admin.command("moveChunk", "app.users", bounds=[{"k": 100}, {"k": MaxKey()}], to="s1")
    assert e.value.code == 2

    # getShardVersion: the routing table's version
    v = admin.command("getShardVersion", "app.users")
    assert isinstance(v["version"], Timestamp) and isinstance(v["versionEpoch"], ObjectId)
    with pytest.raises(OperationFailure) as e:
        admin.command("getShardVersion", "app.unsharded")
    assert e.value.code == 118  # NamespaceNotSharded

    # zones: tag a shard, pin a range, unpin it (zone: null)
    admin.command("addShardToZone", "s1", zone="EU")
    admin.command("updateZoneKeyRange", "app.users", min={"k": MinKey()}, max={"k": 50}, zone="EU")
    tags = config_docs(data_cluster, "tags")
    assert tags == [
        {
            "_id": {"ns": "app.users", "min": {"k": MinKey()}},
            "ns": "app.users",
            "min": {"k": MinKey()},
            "max": {"k": 50},
            "tag": "EU",
        }
    ]
    with pytest.raises(OperationFailure) as e:
        admin.command("removeShardFromZone", "s1", zone="EU")  # a range still uses the zone
    assert e.value.code == 163  # ZoneStillInUse
    admin.command("updateZoneKeyRange", "app.users", min={"k": MinKey()}, max={"k": 50}, zone=None)
    admin.command("removeShardFromZone", "s1", zone="EU")
    assert config_docs(data_cluster, "tags") == []

    # the balancer switch (config.settings), allowMigrations, chunk size
    admin.command("balancerStop")
    assert config_docs(data_cluster, "settings")[0] == {"_id": "balancer", "mode": "off", "stopped": True}
    admin.command("balancerStart")
    assert config_docs(data_cluster, "settings")[0]["stopped"] is False
    with pytest.raises(OperationFailure) as e:
        admin.command("balancerStatus")  # no balancer service in this cluster: it cannot answer
    assert e.value.code == 6  # HostUnreachable
    admin.command("setAllowMigrations", "app.users", allowMigrations=False)
    with pytest.raises(OperationFailure) as e:
        admin.command("moveRange", "app.users", min={"k": MinKey()}, toShard="s2")
    assert e.value.code == 117  # ConflictingOperationInProgress
    admin.command("setAllowMigrations", "app.users", allowMigrations=True)
    admin.command("configureCollectionBalancing", "app.users", chunkSize=64)
    (coll,) = [c for c in config_docs(data_cluster, "collections") if c["_id"] == "app.users"]
    assert coll["maxChunkSizeBytes"] == 64 * 1024 * 1024 and coll["key"] == {"k": 1}
    assert isinstance(coll["uuid"], Binary) and coll["uuid"].subtype == 4

    # movePrimary of a database with no unsharded collection
    admin.command("movePrimary", "app", to="s2")
    assert {d["_id"]: d["primary"] for d in config_docs(data_cluster, "databases")}["app"] == "s2"

    # removeShard: draining progress in MongoDB's shape; s3 holds nothing: started then completed
    admin.command("enableSharding", "drain", primaryShard="s3")
    started = admin.command("removeShard", "s3")
    assert started["state"] == "started" and started["msg"] == "draining started successfully"
    assert started["dbsToMove"] == ["drain"]
    ongoing = admin.command("removeShard", "s3")
    assert ongoing["state"] == "ongoing" and ongoing["remaining"]["dbs"] == 1 and ongoing["remaining"]["chunks"] == 0

    # router commands
    assert admin.command("flushRouterConfig")["flushed"] is True
    assert admin.command("isdbgrid")["isdbgrid"] == 1
    # admin commands are refused outside the admin database, as by mongos
    with pytest.raises(OperationFailure) as e:
        data_cluster.mongo_client().app.command("listShards")
    assert e.value.code == 13


def test_config_database_documents(data_cluster):
    """config.* in MongoDB's shapes (read in process: the find that serves them is crud.py's)."""
    data_cluster.mongo_client().admin.command("shardCollection", "shop.orders", key={"o": 1})
    data_cluster.mongo_client().admin.command("split", "shop.orders", middle={"o": 10})

    chunks = config_docs(data_cluster, "chunks")
    assert [(c["min"], c["max"]) for c in chunks] == [({"o": MinKey()}, {"o": 10}), ({"o": 10}, {"o": MaxKey()})]
    (coll,) = config_docs(data_cluster, "collections")
    assert all(c["uuid"] == coll["uuid"] and isinstance(c["_id"], ObjectId) for c in chunks)
    assert all(isinstance(c["lastmod"], Timestamp) for c in chunks)
    assert isinstance(coll["timestamp"], Timestamp) and isinstance(coll["lastmodEpoch"], ObjectId)

    (version,) = config_docs(data_cluster, "version")
    assert version["_id"] == 1 and isinstance(version["clusterId"], ObjectId)
    (router,) = config_docs(data_cluster, "mongos")
    assert router["_id"].endswith(f":{data_cluster.router.wire.port}")
    assert isinstance(router["ping"], dt.datetime) and router["mongoVersion"] == "8.0.0"
    assert {d["_id"] for d in config_docs(data_cluster, "settings")} == {
        "balancer",
        "chunksize",
        "autosplit",
        "automerge",
    }
    assert config_docs(data_cluster, "unknown") == []

    log = config_docs(data_cluster, "changelog")
    whats = [e["what"] for e in log]
    assert whats.count("addShard") == 3 and "shardCollection.end" in whats and "split" in whats
    (split,) = [e for e in log if e["what"] == "split"]
    assert split["ns"] == "shop.orders" and isinstance(split["time"], dt.datetime)

    from services.router.wire.config_db import refuse_write

    assert refuse_write("chunks").code == "IllegalOperation"


def test_introspection_through_pymongo(data_cluster):
    client = data_cluster.mongo_client()
    client.admin.command("shardCollection", "inv.items", key={"sku": 1})
    data_cluster.call(data_cluster.router.routing.handle(s.Insert(ns="inv.loose", docs=[{"_id": 1}])))

    names = client.list_database_names()
    assert {"admin", "config", "inv"} <= set(names)
    dbs = client.admin.command("listDatabases", filter={"name": "inv"})["databases"]
    assert [d["name"] for d in dbs] == ["inv"] and dbs[0]["shards"]

    assert client.inv.list_collection_names() == ["items", "loose"]
    (items,) = list(client.inv.list_collections(filter={"name": "items"}))
    assert items["type"] == "collection" and isinstance(items["info"]["uuid"], Binary)
    assert "chunks" in client.config.list_collection_names()

    stats = client.inv.command("collStats", "items")
    assert stats["sharded"] is True and stats["nchunks"] == 1 and stats["ns"] == "inv.items"
    with pytest.raises(OperationFailure) as e:
        client.inv.command("collStats", "nothing")
    assert e.value.code == 26
    assert client.inv.command("dbStats")["collections"] == 2

    status = client.admin.command("serverStatus")
    assert status["process"] == "mongos" and status["connections"]["current"] >= 1
    assert status["connections"]["totalCreated"] >= status["connections"]["current"]

    client.inv.create_collection("fresh")
    assert "fresh" in client.inv.list_collection_names()
    with pytest.raises(CollectionInvalid):  # what pymongo makes of NamespaceExists (48)
        client.inv.create_collection("fresh")
    client.inv.drop_collection("fresh")  # a DDL coordinator since issue 13 (test_ddl_wire.py)
    assert "fresh" not in client.inv.list_collection_names()
