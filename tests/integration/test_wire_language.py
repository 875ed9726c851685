"""The query, update and projection language through pymongo on a live cluster (issue 38 §2):
the same answers on an unsharded collection (one shard) and one sharded over three (hashed
_id), and the same as the shard's pure matcher and updater give for the same documents."""

from __future__ import annotations

import pytest
from bson import Int64, Regex
from pymongo import ReturnDocument

from domain.query import apply_projection, compile_filter
from schemas import config as c

pytestmark = pytest.mark.kafka

DOCS = [
    {
        "_id": i,
        "n": i,
        "s": f"user{i % 4}",
        "tags": [f"t{i % 3}", f"t{(i + 1) % 3}"][: 1 + i % 2],
        "items": [{"sku": f"s{i % 2}", "qty": i}, {"sku": "z", "qty": 10 - i}],
        "b": Int64(i * 3),
    }
    for i in range(12)
]
FILTERS = [
    {"s": Regex("^user[12]$")},
    {"s": {"$regex": "USER0", "$options": "i"}},
    {"tags": {"$all": ["t0", "t1"]}},
    {"tags": {"$size": 1}},
    {"items": {"$elemMatch": {"sku": "s1", "qty": {"$gt": 4}}}},
    {"n": {"$mod": [3, 1]}},
    {"b": {"$type": "long"}},
    {"b": {"$bitsAllSet": [1]}},
    {"$expr": {"$gt": ["$n", {"$size": "$tags"}]}},
    {"items.1.qty": {"$lt": 3}},
    {"$or": [{"tags": "t2"}, {"s": {"$in": [Regex("0$")]}}]},
]


@pytest.fixture
def colls(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.sharded", key={"_id": "hashed"}))
    db = data_cluster.mongo_client().app
    for coll in (db.plain, db.sharded):
        coll.insert_many([dict(d) for d in DOCS])
    return db.plain, db.sharded


def test_filters_answer_as_the_matcher_on_one_shard_and_three(colls):
    for flt in FILTERS:
        expected = sorted(d["_id"] for d in DOCS if compile_filter(flt).matches(d))
        answers = [sorted(d["_id"] for d in coll.find(flt)) for coll in colls]
        assert answers == [expected, expected], flt
        assert [coll.count_documents(flt) for coll in colls] == [len(expected)] * 2, flt


def test_projections_and_sorts_through_arrays(colls):
    projection = {"tags": {"$slice": 1}, "items": {"$elemMatch": {"qty": {"$gte": 6}}}, "n": 1}
    for coll in colls:
        got = list(coll.find({}, projection).sort("_id", 1))
        assert got == [apply_projection(d, projection) for d in DOCS]
        by_items = [d["_id"] for d in coll.find({}, {"_id": 1}).sort("items.qty", 1)]
        # by the smallest qty in each array: doc 11's -1, then docs 0 and 10 (0 both, either order)
        assert by_items[0] == 11 and set(by_items[1:3]) == {0, 10}


def test_updates_give_the_same_documents_on_one_shard_and_three(colls):
    updates = [
        ({"n": {"$lt": 6}}, {"$push": {"tags": {"$each": ["x", "y"], "$slice": -2}}, "$mul": {"n": 2}}),
        ({}, {"$addToSet": {"tags": "t0"}, "$max": {"n": 5}}),
        ({"s": "user1"}, {"$pull": {"items": {"qty": {"$gt": 5}}}, "$rename": {"s": "name"}}),
        ({"n": {"$gte": 10}}, [{"$set": {"total": {"$add": ["$n", 100]}}}, {"$unset": "b"}]),  # a pipeline
        ({}, {"$set": {"items.0.qty": 0}, "$bit": {"b": {"or": Int64(1)}}}),
        ({"_id": 3}, {"$pop": {"tags": -1}, "$currentDate": {"seen": True}}),
    ]
    for flt, update in updates:
        results = [coll.update_many(flt, update) for coll in colls]
        assert results[0].matched_count == results[1].matched_count > 0, update
    plain, sharded = colls
    docs = [sorted(coll.find({}, {"seen": 0}), key=lambda d: d["_id"]) for coll in colls]
    assert docs[0] == docs[1]
    assert docs[0][0]["tags"] == ["x", "y", "t0"] and docs[0][0]["n"] == 5 and docs[0][11]["total"] == 111
    # the pipeline removed doc 11's b; $bit then made it again from 0 (as MongoDB: a missing field is 0)
    assert docs[0][11]["b"] == Int64(1) and docs[0][2]["b"] == Int64(7)
    for coll in colls:  # filtered positional updates
        coll.update_many({}, {"$inc": {"items.$[big].qty": 100}}, array_filters=[{"big.qty": {"$gte": 9}}])
        coll.update_one({"_id": 4}, {"$set": {"tags.$[]": "all"}})
    docs = [sorted(coll.find({}, {"seen": 0}), key=lambda d: d["_id"]) for coll in colls]
    assert docs[0] == docs[1] and docs[0][4]["tags"] == ["all"] * len(docs[0][4]["tags"])
    assert [it["qty"] for it in docs[0][0]["items"]] == [0, 110]  # only the element the filter names
    for coll in colls:  # a pipeline in findAndModify, and an upsert from a pipeline
        doc = coll.find_one_and_update(
            {"_id": 1}, [{"$set": {"twice": {"$multiply": ["$n", 2]}}}], return_document=ReturnDocument.AFTER
        )
        assert doc["twice"] == doc["n"] * 2
        coll.update_one({"_id": "new"}, [{"$set": {"made": True}}], upsert=True)
        assert coll.find_one({"_id": "new"}) == {"_id": "new", "made": True}


def test_the_positional_operator_through_the_wire(colls):
    for coll in colls:
        coll.update_one({"_id": 2, "items.sku": "z"}, {"$set": {"items.$.qty": 77}})
        assert [it["qty"] for it in coll.find_one({"_id": 2})["items"]] == [2, 77]
        doc = coll.find_one_and_update(
            {"_id": 3, "tags": "t1"}, {"$set": {"tags.$": "hit"}}, return_document=ReturnDocument.AFTER
        )
        assert "hit" in doc["tags"] and "t1" not in doc["tags"]
