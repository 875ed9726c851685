"""MongoDB 8.0's bulkWrite command through pymongo's MongoClient.bulk_write (issue 38 §2):
several namespaces in one command, ordered and unordered, per-operation results and errors,
and a retried command applied once."""

from __future__ import annotations

import pytest
from bson import SON
from pymongo import DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import ClientBulkWriteException, OperationFailure

from schemas import config as c

pytestmark = pytest.mark.kafka


@pytest.fixture
def client(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.sharded", key={"_id": "hashed"}))
    return data_cluster.mongo_client()


def test_bulk_write_across_namespaces_with_verbose_results(client):
    models = [
        InsertOne(namespace="app.plain", document={"_id": 1, "n": 1}),
        InsertOne(namespace="app.sharded", document={"_id": 1, "n": 1}),
        InsertOne(namespace="app.sharded", document={"_id": 2, "n": 2}),
        UpdateOne(namespace="app.plain", filter={"_id": 1}, update={"$inc": {"n": 10}}),
        UpdateMany(namespace="app.sharded", filter={}, update={"$set": {"seen": True}}),
        UpdateOne(namespace="other.c", filter={"_id": "u"}, update={"$set": {"x": 1}}, upsert=True),
        ReplaceOne(namespace="app.sharded", filter={"_id": 2}, replacement={"r": 1}),
        DeleteOne(namespace="app.plain", filter={"_id": 1}),
        DeleteMany(namespace="app.sharded", filter={"r": 1}),
    ]
    result = client.bulk_write(models, verbose_results=True)
    assert (result.inserted_count, result.matched_count, result.modified_count) == (3, 4, 4)
    assert (result.upserted_count, result.deleted_count) == (1, 2)
    assert result.update_results[5].upserted_id == "u"
    assert result.update_results[4].matched_count == 2
    assert client.app.plain.count_documents({}) == 0
    assert list(client.app.sharded.find()) == [{"_id": 1, "n": 1, "seen": True}]
    assert client.other.c.find_one() == {"_id": "u", "x": 1}


def test_ordered_stops_at_the_first_error_and_unordered_goes_on(client):
    client.app.sharded.insert_one({"_id": 5})
    ops = [
        InsertOne(namespace="app.sharded", document={"_id": 4}),
        InsertOne(namespace="app.sharded", document={"_id": 5}),  # duplicate
        UpdateOne(namespace="app.plain", filter={}, update={"$foo": {"a": 1}}),  # unknown modifier
        InsertOne(namespace="app.sharded", document={"_id": 6}),
    ]
    with pytest.raises(ClientBulkWriteException) as e:
        client.bulk_write(ops)
    assert [(err["idx"], err["code"]) for err in e.value.write_errors] == [(1, 11000)]
    assert sorted(d["_id"] for d in client.app.sharded.find()) == [4, 5]
    client.app.sharded.delete_many({"_id": 4})
    with pytest.raises(ClientBulkWriteException) as e:
        client.bulk_write(ops, ordered=False)
    assert [(err["idx"], err["code"]) for err in e.value.write_errors] == [(1, 11000), (2, 9)]
    assert sorted(d["_id"] for d in client.app.sharded.find()) == [4, 5, 6]


def test_refusals_and_a_retried_command_applied_once(client):
    admin = client.admin
    with pytest.raises(OperationFailure) as e:  # bulkWrite runs on admin only
        client.app.command(SON([("bulkWrite", 1), ("ops", []), ("nsInfo", [])]))
    assert e.value.code == 13
    with pytest.raises(OperationFailure) as e:
        admin.command(
            SON([("bulkWrite", 1), ("ops", [{"insert": 0, "document": {}, "x": 1}]), ("nsInfo", [{"ns": "app.c"}])])
        )
    assert e.value.code == 40415
    with pytest.raises(OperationFailure) as e:
        admin.command(SON([("bulkWrite", 1), ("ops", [{"insert": 3, "document": {}}]), ("nsInfo", [{"ns": "app.c"}])]))
    assert e.value.code == 2
    with client.start_session() as session:
        cmd = SON(
            [
                ("bulkWrite", 1),
                (
                    "ops",
                    [
                        {"update": 0, "filter": {"_id": 9}, "updateMods": {"$inc": {"n": 1}}, "upsert": True},
                        {"insert": 0, "document": {"_id": 10}},
                    ],
                ),
                ("nsInfo", [{"ns": "app.plain"}]),
                ("txnNumber", 7),
            ]
        )
        first = admin.command(cmd, session=session)
        again = admin.command(cmd, session=session)  # the driver's retry: same lsid and txnNumber
    assert (first["nUpserted"], first["nInserted"], first["nErrors"]) == (1, 1, 0)
    assert again["nErrors"] == 0
    assert client.app.plain.find_one({"_id": 9}) == {"_id": 9, "n": 1}
    assert client.app.plain.count_documents({"_id": 10}) == 1
