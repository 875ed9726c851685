"""issue 38 §1 against a live cluster with the real pymongo driver: no option is accepted and
ignored, and what MongoDB refuses is refused whatever the data.  Each wrong answer the issue
lists is checked on an unsharded collection and on one sharded over three shards (hashed _id):
refused with MongoDB's code and nothing changed, or answered as MongoDB answers."""

from __future__ import annotations

import pytest
from bson import SON
from pymongo.collation import Collation
from pymongo.errors import OperationFailure, WriteError

from schemas import config as c

pytestmark = pytest.mark.kafka


@pytest.fixture
def colls(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.sharded", key={"_id": "hashed"}))
    db = data_cluster.mongo_client().app
    out = [db.plain, db.sharded]
    for coll in out:
        coll.insert_many([{"_id": i, "s": "é" if i % 2 else "e", "n": i} for i in range(8)])
    return db, out


def _snapshot(coll):
    return sorted(coll.find(), key=lambda d: d["_id"])


def test_collation_is_refused_not_ignored(colls):
    db, both = colls
    for coll in both:
        before = _snapshot(coll)
        french = Collation(locale="fr", strength=1)  # "e" == "é" at strength 1: MongoDB would hit 8
        for method, args in (
            (coll.update_many, ({"s": "e"}, {"$set": {"hit": 1}})),
            (coll.delete_many, ({"s": "e"},)),
            (coll.count_documents, ({"s": "e"},)),
            (lambda *a, **kw: list(coll.find(*a, **kw)), ({"s": "e"},)),  # noqa: B023 (called at once)
        ):
            with pytest.raises(OperationFailure) as e:
                method(*args, collation=french)
            assert e.value.code == 238, (coll.name, e.value.details)
        assert _snapshot(coll) == before, coll.name
        # the simple collation is what shardlog does: accepted
        simple = Collation(locale="simple")
        assert coll.count_documents({"s": "e"}, collation=simple) == 4
        assert coll.update_many({"s": "e"}, {"$set": {"hit": 1}}, collation=simple).modified_count == 4


def test_sort_on_update_one_is_honoured_and_find_options_are_refused(colls):
    db, both = colls
    for coll in both:
        before = _snapshot(coll)
        for u in ({"$set": {"x": 1}}, {"x": 1}):  # updateOne and replaceOne with a sort (MongoDB 8.0)
            cmd = SON([("update", coll.name), ("updates", [{"q": {"n": {"$gte": 0}}, "u": u, "sort": {"n": -1}}])])
            reply = db.command(cmd)
            if reply.get("writeErrors"):  # matches on many shards: refused, never another document
                assert (coll.name, reply["writeErrors"][0]["code"], reply["n"]) == ("sharded", 61, 0)
                assert _snapshot(coll) == before
                continue
            assert reply["nModified"] == 1
            assert [d["_id"] for d in coll.find({"x": 1})] == [7]  # the largest n: the one changed
            coll.replace_one({"_id": 7}, before[7])
        assert _snapshot(coll) == before
        for cursor in (
            coll.find({}).hint([("_id", 1)]).min([("_id", 2)]),
            coll.find({}).hint([("_id", 1)]).max([("_id", 2)]),
            coll.find({}, return_key=True),
            coll.find({}, show_record_id=True),
        ):
            with pytest.raises(OperationFailure) as e:
                list(cursor)
            assert e.value.code == 238
        # a hint naming no index is refused, for writes and counts too (MongoDB's BadValue)
        with pytest.raises(WriteError) as w:
            coll.update_one({"n": 1}, {"$set": {"x": 1}}, hint="nope_1")
        assert w.value.code == 2
        with pytest.raises(OperationFailure) as e:
            coll.count_documents({}, hint="nope_1")
        assert e.value.code == 2
        assert coll.count_documents({"n": {"$gte": 2}}, hint=[("_id", 1)]) == 6
        assert _snapshot(coll) == before


def test_bad_updates_and_filters_are_refused_whether_or_not_anything_matches(colls):
    db, both = colls
    for coll in both:
        before = _snapshot(coll)
        for flt in ({"_id": 1}, {"_id": "no such document"}):
            with pytest.raises(WriteError) as w:
                coll.update_one(flt, {"$foo": {"a": 1}})
            assert w.value.code == 9, w.value.details  # FailedToParse: Unknown modifier
            with pytest.raises(WriteError) as w:
                coll.update_many(flt, {"$set": {"a": 1, "a.b": 2}})
            assert w.value.code == 40  # ConflictingUpdateOperators
            with pytest.raises(WriteError) as w:
                coll.update_one(flt, {"$set": {"a.$[x]": 1}})  # no arrayFilters for x
            assert w.value.code == 2
            with pytest.raises(OperationFailure) as e:
                coll.find_one_and_update(flt, {"$foo": {"a": 1}})
            assert e.value.code == 9
            with pytest.raises(OperationFailure) as e:
                list(coll.find({"n": {"$foo": 1}, **flt}))
            assert e.value.code == 2 and "unknown operator: $foo" in e.value.details["errmsg"]
            with pytest.raises(OperationFailure) as e:
                coll.delete_many({"n": {"$near": [0, 0]}, **flt})
            assert e.value.code == 224
        assert _snapshot(coll) == before


def test_id_rules_and_the_empty_replacement(colls):
    db, both = colls
    for coll in both:
        for doc, code in (({"_id": {"$a": 1}}, 52), ({"_id": [1, 2]}, 2), ({"_id": {"x": {"$b": 1}}}, 52)):
            with pytest.raises(WriteError) as w:
                coll.insert_one(doc)
            assert w.value.code == code, doc
        assert coll.count_documents({}) == 8
        coll.insert_one({"_id": "dollar", "$top": 1, "a": {"$b": 2}})  # allowed outside _id (5.0+)
        assert coll.find_one({"_id": "dollar"}) == {"_id": "dollar", "$top": 1, "a": {"$b": 2}}
        r = coll.replace_one({"_id": 3}, {})
        assert (r.matched_count, r.modified_count) == (1, 1)
        assert coll.find_one({"_id": 3}) == {"_id": 3}
        with pytest.raises(WriteError) as w:
            coll.update_one({"_id": "up"}, {"$set": {"_id": {"$x": 1}}}, upsert=True)
        assert w.value.code == 52
        assert coll.find_one({"_id": "up"}) is None


def test_sort_through_arrays_is_mongodb_s_on_one_shard_and_three(colls):
    db, both = colls
    docs = [
        {"_id": "a", "v": [5, 1]},
        {"_id": "b", "v": 3},
        {"_id": "c", "v": []},
        {"_id": "d", "v": None},
        {"_id": "e", "v": [2, 9]},
    ]
    answers = []
    for coll in both:
        coll.delete_many({})
        coll.insert_many(docs)
        up = [d["_id"] for d in coll.find().sort("v", 1)]
        down = [d["_id"] for d in coll.find().sort("v", -1)]
        answers.append((up, down))
    # ascending by the smallest element ([] below null), descending by the largest
    assert answers[0] == answers[1] == (["c", "d", "a", "e", "b"], ["e", "a", "b", "d", "c"])


def test_unknown_fields_get_mongodb_s_answer(colls):
    db, both = colls
    for coll in both:
        for cmd in (
            SON([("find", coll.name), ("filtr", {})]),
            SON([("insert", coll.name), ("documents", [{"_id": 99}]), ("upsert", True)]),
            SON([("update", coll.name), ("updates", [{"q": {}, "u": {"$set": {"z": 1}}, "mutli": True}])]),
        ):
            with pytest.raises(OperationFailure) as e:
                db.command(cmd)
            assert e.value.code == 40415, cmd
        assert coll.find_one({"_id": 99}) is None and coll.count_documents({"z": 1}) == 0


def test_get_more_must_name_the_cursor_s_collection_and_no_cursor_timeout_is_kept(colls, data_cluster):
    db, both = colls
    plain, sharded = both
    first = db.command(SON([("find", plain.name), ("batchSize", 2), ("noCursorTimeout", True)]))
    cid = first["cursor"]["id"]
    assert cid and data_cluster.router.routing.cursors[cid].no_timeout
    with pytest.raises(OperationFailure) as e:  # another collection's name: refused, cursor intact
        db.command(SON([("getMore", cid), ("collection", sharded.name)]))
    assert e.value.code == 13
    more = db.command(SON([("getMore", cid), ("collection", plain.name), ("batchSize", 100)]))
    assert len(first["cursor"]["firstBatch"]) + len(more["cursor"]["nextBatch"]) == 8


def test_a_database_that_does_not_exist_refuses_what_a_shard_would(data_cluster):
    """No shard sees a query of a missing database: the router refuses what they would."""
    coll = data_cluster.mongo_client().nosuchdb.c
    for call, code in (
        (lambda: list(coll.find({"a": {"$foo": 1}})), 2),
        (lambda: list(coll.find({}).sort("a", 2)), 2),
        (lambda: list(coll.find({}, {"a": {"$meta": "textScore"}})), 224),
        (lambda: coll.count_documents({"a": {"$foo": 1}}), 2),
        (lambda: coll.find_one_and_update({}, {"$foo": {"a": 1}}), 9),
    ):
        with pytest.raises(OperationFailure) as e:
            call()
        assert e.value.code == code
    assert list(coll.find({"a": {"$gt": 1}})) == [] and coll.count_documents({}) == 0
