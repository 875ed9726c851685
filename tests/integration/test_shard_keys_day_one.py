"""Issue 18, points 1, 2 and 9, as an operator meets them: a unique shard key enforced through
pymongo and the CLI (also after its chunk migrated), sharding refused when existing documents
cannot be keyed (the collection stays unsharded and usable), and shardCollection re-run.  The
real broker, a config server, shards s0..s2 and a router (data_cluster)."""

from __future__ import annotations

import json

import pytest
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from tests.conftest import cli

pytestmark = pytest.mark.kafka


def test_a_unique_shard_key_is_enforced_through_pymongo_also_after_a_migration(data_cluster):
    client = data_cluster.mongo_client()
    admin = client.admin
    admin.command("enableSharding", "ju", primaryShard="s0")
    admin.command("shardCollection", "ju.u", key={"email": 1}, unique=True)
    users = client.ju.u
    users.insert_one({"_id": 1, "email": "c"})
    with pytest.raises(DuplicateKeyError) as e:
        users.insert_one({"_id": 2, "email": "c"})
    assert e.value.code == 11000
    assert (
        e.value.details["errmsg"]
        == 'E11000 duplicate key error collection: ju.u index: email_1 dup key: { email: "c" }'
    )
    with pytest.raises(DuplicateKeyError):  # an upsert into a taken key
        users.update_one({"email": "c", "n": 2}, {"$set": {"m": 1}}, upsert=True)
    assert users.count_documents({}) == 1

    # Its chunk moves to s1: the new owner enforces it (equal keys always route to one shard).
    admin.command("split", "ju.u", middle={"email": "m"})
    users.insert_one({"_id": 3, "email": "x"})
    admin.command("moveChunk", "ju.u", find={"email": "x"}, to="s1")
    with pytest.raises(DuplicateKeyError) as e:
        users.insert_one({"_id": 4, "email": "x"})
    assert 'index: email_1 dup key: { email: "x" }' in e.value.details["errmsg"]
    users.insert_one({"_id": 5, "email": "y"})  # another key on s1 goes in
    assert sorted(d["email"] for d in users.find()) == ["c", "x", "y"]


def test_a_compound_unique_key_within_one_batch(data_cluster):
    client = data_cluster.mongo_client()
    client.admin.command("enableSharding", "jc", primaryShard="s0")
    client.admin.command("shardCollection", "jc.o", key={"a": 1, "b": 1}, unique=True)
    client.admin.command("shardCollection", "jc.n", key={"a": 1, "b": 1}, unique=True)
    with pytest.raises(OperationFailure) as e:  # a hashed key cannot be unique, as in MongoDB
        client.admin.command("shardCollection", "jc.h", key={"a": "hashed"}, unique=True)
    assert e.value.code == 72  # InvalidOptions
    docs = [{"_id": 1, "a": 1, "b": "x"}, {"_id": 2, "a": 1, "b": "x"}, {"_id": 3, "a": 1, "b": "y"}]

    with pytest.raises(BulkWriteError) as e:  # ordered: the first goes in, the rest stops
        client.jc.o.insert_many(docs)
    assert e.value.details["nInserted"] == 1
    [err] = e.value.details["writeErrors"]
    assert err["index"] == 1 and err["code"] == 11000 and 'index: a_1_b_1 dup key: { a: 1, b: "x" }' in err["errmsg"]
    assert client.jc.o.count_documents({}) == 1

    with pytest.raises(BulkWriteError) as e:  # unordered: the others still go in
        client.jc.n.insert_many(docs, ordered=False)
    assert e.value.details["nInserted"] == 2
    assert [(w["index"], w["code"]) for w in e.value.details["writeErrors"]] == [(1, 11000)]
    assert sorted(d["_id"] for d in client.jc.n.find()) == [1, 3]


def test_a_unique_shard_key_through_the_cli_and_shard_collection_again(data_cluster):
    settings = data_cluster.settings
    done = cli(settings, "shard-collection", "jdb.u3", "--key", '{"email": 1}', "--unique", "--json")
    assert done.returncode == 0, done.stderr
    first = cli(settings, "insert", "jdb.u3", '{"email": "c"}', "--json")
    assert first.returncode == 0, first.stderr
    second = cli(settings, "insert", "jdb.u3", '{"email": "c"}', "--json")
    assert second.returncode != 0
    refusal = json.loads(second.stdout.strip().splitlines()[-1])
    assert refusal["code"] == "DuplicateKey", refusal
    assert 'E11000 duplicate key error collection: jdb.u3 index: email_1 dup key: { email: "c" }' in refusal["error"]
    human = cli(settings, "insert", "jdb.u3", '{"email": "c"}')
    assert human.returncode != 0 and "DuplicateKey" in human.stderr and "Traceback" not in human.stderr, human.stderr
    count = cli(settings, "count", "jdb.u3")
    assert count.returncode == 0 and count.stdout.strip() == "1", count.stdout + count.stderr

    # The same key and options again: ok, nothing changes; another key or unique: AlreadyInitialized.
    again = cli(settings, "shard-collection", "jdb.u3", "--key", '{"email": 1}', "--unique")
    assert again.returncode == 0 and "already sharded with this key jdb.u3" in again.stdout, again.stdout + again.stderr
    for args in (("--key", '{"email": 1}'), ("--key", '{"other": 1}', "--unique")):
        refused = cli(settings, "shard-collection", "jdb.u3", *args, "--json")
        assert refused.returncode != 0 and json.loads(refused.stdout)["code"] == "AlreadyInitialized", refused.stdout


def test_sharding_an_array_keyed_collection_is_refused_and_leaves_it_usable(data_cluster):
    client = data_cluster.mongo_client()
    client.admin.command("enableSharding", "udb", primaryShard="s0")
    arr = client.udb.arr
    arr.insert_many([{"_id": 1, "k": [1, 2]}, {"_id": 2, "k": 3}])
    config_time = data_cluster.router.follower.catalog.config_time
    with pytest.raises(OperationFailure) as e:
        client.admin.command("shardCollection", "udb.arr", key={"k": 1})
    assert e.value.code == 72 and "couldn't find valid index for shard key" in str(e.value)  # InvalidOptions
    assert "udb.arr" not in data_cluster.router.follower.catalog.collections
    assert data_cluster.router.follower.catalog.config_time == config_time  # nothing recorded

    # Still unsharded and fully usable.
    assert arr.count_documents({}) == 2 and arr.find_one({"_id": 1})["k"] == [1, 2]
    arr.insert_one({"_id": 3, "k": [4]})
    assert arr.delete_one({"_id": 3}).deleted_count == 1

    # Existing duplicates refuse a unique key (the index build's DuplicateKey); without them it shards.
    arr.delete_one({"_id": 1})
    arr.insert_many([{"_id": 4, "k": 3}, {"_id": 5}])  # _id 5 has no k: keyed as null
    with pytest.raises(OperationFailure) as e:
        client.admin.command("shardCollection", "udb.arr", key={"k": 1}, unique=True)
    assert e.value.code == 11000 and "dup key: { k: 3 }" in str(e.value)
    assert "udb.arr" not in data_cluster.router.follower.catalog.collections
    client.admin.command("shardCollection", "udb.arr", key={"k": 1})
    assert data_cluster.router.follower.catalog.collections["udb.arr"].pattern.spec == {"k": 1}
    assert sorted(d["_id"] for d in arr.find({"k": 3})) == [2, 4]
    assert arr.count_documents({}) == 3


def test_sharding_an_array_keyed_collection_through_the_cli_is_refused(data_cluster):
    settings = data_cluster.settings
    done = cli(settings, "insert", "udc.arr", '[{"_id":1,"k":[1,2]},{"_id":2,"k":3}]', "--json")
    assert done.returncode == 0, done.stderr
    refused = cli(settings, "shard-collection", "udc.arr", "--key", '{"k": 1}', "--json")
    assert refused.returncode != 0
    assert json.loads(refused.stdout)["code"] == "InvalidOptions", refused.stdout
    for args in (("count", "udc.arr"), ("find", "udc.arr", '{"k": 3}')):
        usable = cli(settings, *args)
        assert usable.returncode == 0, usable.stdout + usable.stderr
    assert cli(settings, "count", "udc.arr").stdout.strip() == "2"
    assert "udc.arr" not in data_cluster.router.follower.catalog.collections
