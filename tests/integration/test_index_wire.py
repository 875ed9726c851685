"""createIndexes / dropIndexes / listIndexes through the router's wire edge (pymongo) and the
`shardlog index` CLI, against a live cluster (data_cluster: config server with its DDL
coordinators, shards s0..s2, one router, the real broker).

Listing a fresh collection's implicit indexes (`_id_`, the shard key's), MongoDB's errors for
bad input (nothing changed afterwards), "all indexes already exist", and builds end to end on
shards that hold documents.
"""

from __future__ import annotations

import json

import pytest
from pymongo import ASCENDING, DESCENDING
from pymongo.errors import DuplicateKeyError, OperationFailure

from schemas import indexes as ix
from tests.conftest import cli
from tests.integration.test_shard_indexes import ask, kept_and_rebuilt, stored_keys

pytestmark = pytest.mark.kafka


def code_of(fn, *args, **kw) -> int:
    with pytest.raises(OperationFailure) as e:
        fn(*args, **kw)
    return e.value.code


def body(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def test_list_indexes_and_mongodb_errors_through_pymongo(data_cluster):
    client = data_cluster.mongo_client()
    admin, app = client.admin, client.app
    admin.command("enableSharding", "app", primaryShard="s0")
    admin.command("shardCollection", "app.users", key={"k": 1})
    app.users.insert_one({"_id": 1, "k": 1, "b": 1})
    app.plain.insert_one({"_id": 1})

    # listIndexes: the implicit indexes, from the router's catalog
    assert list(app.users.list_indexes()) == [
        {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        {"v": 2, "key": {"k": 1}, "name": "k_1"},
    ]
    assert [i["name"] for i in app.plain.list_indexes()] == ["_id_"]
    reply = app.command("listIndexes", "users", cursor={"batchSize": 1})
    assert reply["cursor"]["ns"] == "app.$cmd.listIndexes.users" and len(reply["cursor"]["firstBatch"]) == 1
    assert code_of(app.command, "listIndexes", "nope") == 26  # NamespaceNotFound
    assert app.users.index_information()["k_1"]["key"] == [("k", 1)]

    # the same index again: ok, nothing to build
    reply = app.command("createIndexes", "users", indexes=[{"key": {"k": 1}, "name": "k_1"}])
    assert reply["ok"] == 1.0 and reply["note"] == "all indexes already exist"
    assert reply["numIndexesBefore"] == reply["numIndexesAfter"] == 2
    assert app.users.create_index([("_id", ASCENDING)]) == "_id_1"  # the _id index, whatever its name

    # bad input: MongoDB's codes, nothing changed
    before = app.users.index_information()
    assert code_of(app.users.create_index, [("b", ASCENDING)], unique=True) == 67  # no shard key prefix
    assert code_of(app.users.create_index, [("b", "text")]) == 67
    assert code_of(app.users.create_index, [("b", ASCENDING)], expireAfterSeconds=5) == 238  # no TTL
    assert code_of(app.command, "createIndexes", "users", indexes=[{"key": {"b": 1}, "bogus": 1}]) == 197
    assert code_of(app.command, "createIndexes", "users", indexes=[{"key": {"$b": 1}}]) == 67
    assert code_of(app.command, "createIndexes", "users", indexes=[]) == 2
    assert code_of(app.command, "createIndexes", "users", indexes=[{"key": {"k": -1}, "name": "k_1"}]) == 86
    assert code_of(app.users.create_index, [("k", ASCENDING)], name="other") == 85
    assert code_of(app.users.create_index, [("b", ASCENDING)], sparse=True, partialFilterExpression={"b": 1}) == 67
    assert code_of(app.users.drop_index, "_id_") == 72  # InvalidOptions: cannot drop _id index
    assert code_of(app.users.drop_index, "k_1") == 370  # CannotDropShardKeyIndex
    assert code_of(app.users.drop_index, [("k", ASCENDING)]) == 370
    assert code_of(app.users.drop_index, "nope") == 27  # IndexNotFound
    assert code_of(app.command, "dropIndexes", "users", index={"zz": 1}) == 27
    assert code_of(app.command, "dropIndexes", "nope", index="*") == 26
    assert code_of(app.command, "dropIndexes", "users") == 40414
    assert app.users.index_information() == before
    # dropIndexes "*" with nothing but the implicit ones: ok
    assert body(app.command("dropIndexes", "users", index="*"))["nIndexesWas"] == 2
    assert app.users.index_information() == before


def test_index_cli_lists_and_refuses(data_cluster):
    client = data_cluster.mongo_client()
    client.admin.command("enableSharding", "app", primaryShard="s0")
    client.admin.command("shardCollection", "app.users", key={"k": 1})
    r = cli(data_cluster.settings, "index", "list", "app.users", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [i["name"] for i in doc["indexes"]] == ["_id_", "k_1"] and doc["running"] == []
    r = cli(data_cluster.settings, "index", "list", "app.users")
    assert r.returncode == 0 and "k_1" in r.stdout
    r = cli(data_cluster.settings, "index", "list", "app.nope", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == "NamespaceNotFound"
    r = cli(data_cluster.settings, "index", "drop", "app.users", "k_1", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == "CannotDropShardKeyIndex"
    r = cli(data_cluster.settings, "index", "create", "app.users", '{"b": 1}', "--unique", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == "CannotCreateIndex"
    r = cli(data_cluster.settings, "index", "create", "app.users", '{"k": 1}', "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["note"] == "all indexes already exist"


def test_create_list_drop_with_documents_on_two_shards(data_cluster):
    client = data_cluster.mongo_client()
    admin, app = client.admin, client.app
    admin.command("enableSharding", "app", primaryShard="s0")
    admin.command("shardCollection", "app.users", key={"k": 1})
    app.users.insert_many([{"_id": i, "k": i, "b": i % 7, "e": f"u{i}"} for i in range(200)])
    admin.command("split", "app.users", middle={"k": 100})
    admin.command("moveRange", "app.users", min={"k": 100}, toShard="s1")

    reply = app.command("createIndexes", "users", indexes=[{"key": {"b": 1, "e": -1}, "name": "b_e"}])
    assert reply["numIndexesBefore"] == 2 and reply["numIndexesAfter"] == 3
    assert sorted(reply["raw"]) == ["s0", "s1"] and not reply["createdCollectionAutomatically"]
    assert [i["name"] for i in app.users.list_indexes()] == ["_id_", "k_1", "b_e"]
    assert app.users.create_index([("k", ASCENDING), ("e", DESCENDING)], unique=True) == "k_1_e_-1"

    # a unique build that finds a duplicate: DuplicateKey, and no index listed
    # (distinct e: the unique k_1_e_-1 index above takes both)
    app.users.insert_one({"_id": 1000, "k": 1000, "b": 1, "e": "x"})
    app.users.insert_one({"_id": 1001, "k": 1000, "b": 1, "e": "y"})
    with pytest.raises(DuplicateKeyError):
        app.users.create_index([("k", ASCENDING), ("b", ASCENDING)], unique=True)
    assert "k_1_b_1" not in app.users.index_information()
    # ... and no half index on ANY shard: s1 (the duplicate's) failed its build; s0 built
    # entries for its documents, and the coordinator's rollback (DropIndexes missingOk) took them.
    for sid in ("s0", "s1"):
        listed = ask(data_cluster, sid, ix.ListIndexes(ns="app.users"))
        assert listed.ok, listed
        names = [i["spec"]["name"] for i in listed.result["indexes"]]
        assert "k_1_b_1" not in names and "k_1_e_-1" in names, (sid, names)
        assert stored_keys(data_cluster, sid, b"k/app.users\x00k_1_b_1\x00") == [], sid
        # (the same read finds the entries of the index that did build: the check can fail;
        # s0's include those of the moved range's orphans until the range deleter takes them)
        kept, rebuilt = kept_and_rebuilt(data_cluster, sid, "app.users", {"key": {"k": 1, "e": -1}, "unique": True})
        assert len(kept) >= 100 and kept == rebuilt, sid
        assert len(stored_keys(data_cluster, sid, b"k/app.users\x00k_1_e_-1\x00")) == len(kept), sid

    # created with the collection; then dropped by name, by key and all at once
    reply = app.command("createIndexes", "fresh", indexes=[{"key": {"x": 1}, "name": "x_1"}])
    assert reply["createdCollectionAutomatically"] and reply["numIndexesAfter"] == 2
    assert body(app.command("dropIndexes", "users", index="b_e"))["nIndexesWas"] == 4
    app.users.drop_index([("k", ASCENDING), ("e", DESCENDING)])
    app.fresh.drop_indexes()
    assert [i["name"] for i in app.users.list_indexes()] == ["_id_", "k_1"]
    assert [i["name"] for i in app.fresh.list_indexes()] == ["_id_"]

    # the CLI: create with --json (per-shard builds), list, drop --all
    r = cli(data_cluster.settings, "index", "create", "app.users", '{"e": 1}', "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["numIndexesAfter"] == 3 and "createIndexes" not in doc.get("phases", [])
    r = cli(data_cluster.settings, "index", "drop", "app.users", "--all", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["dropped"] == ["e_1"]
