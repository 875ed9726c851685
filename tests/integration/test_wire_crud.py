"""CRUD through the router's wire edge with the real pymongo driver (issue 14 §2): writes,
reads, cursors, write results and errors in the drivers' shapes, and sessions (retryable
writes apply once; operationTime and $clusterTime advance).

Most documents carry explicit `_id`s; the driver's own ObjectIds and other BSON types are
checked to come back as the types they were written as.
"""

from __future__ import annotations

import datetime
import socket
import struct
import threading

import pymongo
import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Timestamp
from pymongo import DeleteOne, InsertOne, ReplaceOne, ReturnDocument, UpdateOne, WriteConcern
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure, WriteError

from schemas import config as c
from tests.conftest import wait_until

pytestmark = pytest.mark.kafka


def _collections(data_cluster):
    """An unsharded collection and one sharded over all three shards (hashed _id)."""
    data_cluster.command(c.ShardCollection(ns="app.sharded", key={"_id": "hashed"}))
    db = data_cluster.mongo_client().app
    return db, [db.plain, db.sharded]


def test_crud_through_pymongo_on_unsharded_and_sharded_collections(data_cluster):
    db, colls = _collections(data_cluster)
    routing = data_cluster.router.routing
    for coll in colls:
        result = coll.insert_many([{"_id": i, "n": i, "g": i % 3, "tags": [i % 2, "x"]} for i in range(20)])
        assert result.inserted_ids == list(range(20))
        assert coll.insert_one({"_id": "s", "n": 100, "g": 9}).inserted_id == "s"

        # find: filter, sort, skip, limit, projection
        got = list(coll.find({"n": {"$lt": 20}}, {"n": 1, "_id": 0}).sort("n", -1).skip(2).limit(5))
        assert got == [{"n": n} for n in (17, 16, 15, 14, 13)], coll.name
        assert coll.find_one({"_id": 7}) == {"_id": 7, "n": 7, "g": 1, "tags": [1, "x"]}
        assert coll.find_one({"_id": 12345}) is None

        # a cursor across getMores, then one closed early (killCursors)
        cursor = coll.find({}, batch_size=3).sort("n", 1)
        assert [d["n"] for d in cursor] == [*range(20), 100]
        early = coll.find({}, batch_size=2)
        next(early)
        assert early.cursor_id and early.cursor_id in routing.cursors
        early.close()
        assert early.cursor_id not in routing.cursors

        # count (estimated_document_count sends `count`), distinct
        assert coll.estimated_document_count() == 21
        assert sorted(coll.distinct("g")) == [0, 1, 2, 9]
        assert coll.distinct("tags", {"n": {"$lt": 20}}) == [0, 1, "x"]

        # updates: operators, multi, replacement, upsert
        r = coll.update_one({"_id": 1}, {"$set": {"name": "one"}, "$inc": {"n": 1000}})
        assert (r.matched_count, r.modified_count, r.upserted_id) == (1, 1, None)
        r = coll.update_many({"g": 0}, {"$inc": {"n": 1}})
        assert (r.matched_count, r.modified_count) == (7, 7)
        r = coll.update_one({"_id": 2}, {"$set": {"n": 2}})
        assert (r.matched_count, r.modified_count) == (1, 0)
        r = coll.replace_one({"_id": 3}, {"replaced": True})
        assert r.modified_count == 1 and coll.find_one({"_id": 3}) == {"_id": 3, "replaced": True}
        r = coll.update_one({"_id": "up"}, {"$set": {"n": -1}}, upsert=True)
        assert (r.matched_count, r.upserted_id) == (0, "up")
        assert coll.find_one({"_id": "up"}) == {"_id": "up", "n": -1}

        # findAndModify: before/after images, replace, remove, upsert, projection
        doc = coll.find_one_and_update({"_id": 4}, {"$set": {"k": 1}}, return_document=ReturnDocument.AFTER)
        assert doc["k"] == 1
        doc = coll.find_one_and_update({"_id": 4}, {"$set": {"k": 2}}, projection={"k": 1})
        assert doc == {"_id": 4, "k": 1}
        doc = coll.find_one_and_replace({"_id": 5}, {"r": 5}, return_document=ReturnDocument.AFTER)
        assert doc == {"_id": 5, "r": 5}
        assert coll.find_one_and_delete({"_id": 6})["n"] == 7  # g 0: incremented above
        assert coll.find_one_and_delete({"_id": 6}) is None
        doc = coll.find_one_and_update(
            {"_id": "fam"}, {"$set": {"v": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert doc == {"_id": "fam", "v": 1}

        # deletes: limit 1 and 0
        assert coll.delete_one({"g": 1}).deleted_count == 1
        before = coll.estimated_document_count()
        assert coll.delete_many({"g": 2}).deleted_count == 5  # 2, 8, 11, 14, 17 (5 was replaced)
        assert coll.estimated_document_count() == before - 5
        assert coll.delete_many({"nothing": 1}).deleted_count == 0
    assert not routing.cursors


def test_write_errors_in_the_drivers_shapes(data_cluster):
    db, colls = _collections(data_cluster)
    for coll in colls:
        coll.insert_many([{"_id": i} for i in range(3)])
        with pytest.raises(DuplicateKeyError) as dup:
            coll.insert_one({"_id": 1})
        assert dup.value.code == 11000

        # ordered: stops at the first error; unordered: carries on
        with pytest.raises(BulkWriteError) as bulk:
            coll.insert_many([{"_id": 10}, {"_id": 1}, {"_id": 11}])
        details = bulk.value.details
        assert details["nInserted"] == 1
        assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000)]
        assert coll.find_one({"_id": 11}) is None
        with pytest.raises(BulkWriteError) as bulk:
            coll.insert_many([{"_id": 20}, {"_id": 1}, {"_id": 21}, {"_id": 2}], ordered=False)
        details = bulk.value.details
        assert details["nInserted"] == 2
        assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000), (3, 11000)]

        # a mixed bulk: the indexes are the client's, the counts are per kind
        with pytest.raises(BulkWriteError) as bulk:
            coll.bulk_write(
                [
                    InsertOne({"_id": 30}),
                    UpdateOne({"_id": 30}, {"$set": {"a": 1}}),
                    InsertOne({"_id": 30}),
                    DeleteOne({"_id": 0}),
                ],
                ordered=False,
            )
        details = bulk.value.details
        assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(2, 11000)]
        assert (details["nInserted"], details["nMatched"], details["nModified"], details["nRemoved"]) == (1, 1, 1, 1)
        result = coll.bulk_write([ReplaceOne({"_id": 31}, {"b": 1}, upsert=True), DeleteOne({"_id": 30})])
        assert result.upserted_ids == {0: 31} and result.deleted_count == 1

        # an update operator the engine refuses: a WriteError with MongoDB's number
        with pytest.raises(WriteError) as bad:
            coll.update_one({"_id": 1}, {"$set": {"a": 1}, "$unset": {"a": ""}})
        assert bad.value.code in (2, 40)

    sharded = colls[1]
    # the shard key is immutable (on _id, as in MongoDB)
    with pytest.raises(WriteError) as key:
        sharded.update_one({"_id": 1}, {"$set": {"_id": 99}})
    assert key.value.code == 66

    # the config database is read-only; a reserved namespace is InvalidNamespace
    with pytest.raises(OperationFailure) as cfg:
        db.client.config.shards.insert_one({"_id": "nope"})
    assert cfg.value.code == 20
    with pytest.raises(OperationFailure) as ns:
        db.command("insert", "system.x", documents=[{"_id": 1}])
    assert ns.value.code == 73
    with pytest.raises(OperationFailure) as parse:
        db.command("delete", "plain", deletes=[{"q": {}, "limit": 2}])
    assert parse.value.code == 9
    assert colls[0].estimated_document_count() == 6  # 1, 2, 10, 20, 21, 31: nothing of the refused commands was written


def test_retryable_writes_apply_once_and_times_advance(data_cluster):
    db, colls = _collections(data_cluster)
    client = db.client
    hello = client.admin.command("hello")
    assert hello["logicalSessionTimeoutMinutes"] == 30
    # Two sessions for the whole test: raw commands name their own txnNumbers on one; the
    # driver numbers its retryable writes on the other (a pooled lsid would mix the two).
    raw, driven = client.start_session(), client.start_session()
    txn = iter(range(1, 100))
    for coll in colls:
        first_time = None
        number = Int64(next(txn))
        for attempt in range(2):  # the same lsid and txnNumber twice: a driver's retry
            reply = db.command(
                {"insert": coll.name, "documents": [{"_id": 1, "n": 0}, {"_id": 2, "n": 0}], "txnNumber": number},
                session=raw,
            )
            assert reply["n"] == 2 and "writeErrors" not in reply, (attempt, reply)
            first_time = first_time or reply["operationTime"]
            assert reply["operationTime"] >= first_time
            assert reply["$clusterTime"]["clusterTime"] >= reply["operationTime"]
        assert coll.estimated_document_count() == 2

        # three statements of one update batch, retried: each applies once
        updates = [
            {"q": {"_id": 1}, "u": {"$inc": {"n": 1}}},
            {"q": {"_id": 2}, "u": {"$inc": {"n": 10}}},
            {"q": {"_id": 3}, "u": {"$set": {"n": 5}}, "upsert": True},
        ]
        number = Int64(next(txn))
        for _ in range(2):
            reply = db.command({"update": coll.name, "updates": updates, "txnNumber": number}, session=raw)
            assert (reply["n"], reply["nModified"]) == (3, 2), reply
            assert reply["upserted"] == [{"index": 2, "_id": 3}]
        assert sorted((d["_id"], d["n"]) for d in coll.find()) == [(1, 1), (2, 10), (3, 5)]

        number = Int64(next(txn))
        for _ in range(2):
            reply = db.command(
                {"findAndModify": coll.name, "query": {"_id": 1}, "update": {"$inc": {"n": 1}}, "new": True}
                | {"txnNumber": number},
                session=raw,
            )
            assert reply["value"]["n"] == 2
        number = Int64(next(txn))
        for _ in range(2):
            reply = db.command(
                {"delete": coll.name, "deletes": [{"q": {"_id": 3}, "limit": 1}], "txnNumber": number}, session=raw
            )
            assert reply["n"] == 1
        assert coll.find_one({"_id": 1})["n"] == 2 and coll.find_one({"_id": 3}) is None

        if coll is colls[0]:  # (each shard knows the txnNumbers it saw: on the primary, all of these)
            with pytest.raises(OperationFailure) as old:
                db.command({"insert": coll.name, "documents": [{"_id": 9}], "txnNumber": Int64(1)}, session=raw)
            assert old.value.code == 225  # TransactionTooOld
            assert coll.find_one({"_id": 9}) is None

        # the driver's own retryable writes, and its session clock
        before = driven.operation_time
        coll.insert_one({"_id": 50}, session=driven)
        assert driven.operation_time is not None and (before is None or driven.operation_time >= before)
        assert driven.cluster_time is not None
        assert coll.find_one({"_id": 50}, session=driven) == {"_id": 50}  # a read after the session's time
    raw.end_session()
    driven.end_session()


def test_killing_a_session_kills_its_cursors(data_cluster):
    db, (plain, _) = _collections(data_cluster)
    plain.insert_many([{"_id": i} for i in range(10)])
    client = db.client
    session = client.start_session()
    cursor = plain.find({}, batch_size=2, session=session)
    next(cursor)
    cid = cursor.cursor_id
    assert cid in data_cluster.router.routing.cursors
    client.admin.command("killSessions", [session.session_id])
    assert cid not in data_cluster.router.routing.cursors
    with pytest.raises(OperationFailure) as gone:
        db.command("getMore", Int64(cid), collection="plain")
    assert gone.value.code == 43  # CursorNotFound
    reply = db.command("killCursors", "plain", cursors=[Int64(cid)])
    assert reply["cursorsNotFound"] == [cid] and reply["cursorsKilled"] == []
    lsid = session.session_id
    session.end_session()
    client.admin.command("endSessions", [lsid])  # an ended session ends again quietly


def test_find_options_and_the_config_database(data_cluster):
    db, (plain, _) = _collections(data_cluster)
    plain.insert_many([{"_id": i, "n": i} for i in range(5)])
    first = db.command("find", "plain", batchSize=0)
    assert first["cursor"]["firstBatch"] == [] and first["cursor"]["id"] != 0
    more = db.command("getMore", first["cursor"]["id"], collection="plain", batchSize=10)
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [0, 1, 2, 3, 4]
    assert more["cursor"]["id"] == 0 and more["cursor"]["ns"] == "app.plain"
    single = db.command("find", "plain", batchSize=2, singleBatch=True)
    assert len(single["cursor"]["firstBatch"]) == 2 and single["cursor"]["id"] == 0
    assert db.command("count", "plain", query={"n": {"$gte": 1}}, skip=1, limit=2)["n"] == 2
    with pytest.raises(OperationFailure) as bad:
        db.command("find", "plain", filter={"n": {"$bogus": 1}})
    assert bad.value.code == 2
    explained = db.command("explain", {"find": "sharded", "filter": {"_id": 3}})
    assert explained["queryPlanner"]["winningPlan"]["stage"] == "SINGLE_SHARD"
    with pytest.raises(OperationFailure) as local:
        db.client.local.oplog.find_one()
    assert local.value.code == 20
    # an unacknowledged write (OP_MSG moreToCome: no reply) is applied all the same
    plain.with_options(write_concern=WriteConcern(w=0)).insert_one({"_id": "w0"})
    wait_until(lambda: plain.find_one({"_id": "w0"}) is not None, 10, "the unacknowledged insert to apply")
    # config reads go through config_db.documents (filled by another module): at least they answer
    assert isinstance(list(db.client.config.shards.find()), list)
    assert db.client.config.chunks.estimated_document_count() >= 0


def test_bson_types_from_the_driver_round_trip(data_cluster):
    coll = data_cluster.mongo_client(tz_aware=True).app.oids
    oid = coll.insert_one({"a": 1}).inserted_id
    assert isinstance(oid, ObjectId)
    assert coll.find_one({"_id": oid}) == {"_id": oid, "a": 1}
    when = datetime.datetime(2026, 11, 24, 12, 30, 1, 250000, tzinfo=datetime.UTC)
    typed = {
        "_id": "typed",
        "when": when,
        "long": Int64(2**40),
        "dec": Decimal128("1.10"),
        "bin": Binary(b"\x00\xff", 128),  # subtype 0 decodes as bytes in pymongo
        "ts": Timestamp(1_700_000_000, 7),
        "nested": {"ids": [ObjectId(), ObjectId()]},
    }
    coll.insert_one(typed)
    back = coll.find_one({"_id": "typed"})
    assert back == typed
    assert type(back["long"]) is Int64 and type(back["dec"]) is Decimal128 and type(back["ts"]) is Timestamp
    # typed values compare as MongoDB compares them
    assert coll.count_documents({"when": {"$gt": when - datetime.timedelta(seconds=1)}}) == 1


class DroppingProxy:
    """A TCP relay between a driver and the router that, once armed, forwards the next request
    naming `command` and closes the client's connection instead of relaying the reply: the
    router has applied the write, the driver sees a network error (as after a lost reply)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed: bytes | None = None
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, command: str) -> None:
        self.armed = b"\x02" + command.encode() + b"\x00"  # the command's first element: a string

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    @staticmethod
    def _message(sock: socket.socket) -> bytes:
        head = b""
        while len(head) < 16:
            chunk = sock.recv(16 - len(head))
            if not chunk:
                raise ConnectionError("closed")
            head += chunk
        body, want = b"", struct.unpack("<i", head[:4])[0] - 16
        while len(body) < want:
            chunk = sock.recv(want - len(body))
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
        return head + body

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        try:
            while True:
                request = self._message(client)
                upstream.sendall(request)
                reply = self._message(upstream)  # (no moreToCome requests in these tests)
                if self.armed is not None and self.armed in request[16:64]:
                    self.armed, self.dropped = None, self.dropped + 1
                    return  # the reply is lost
                client.sendall(reply)
        except (ConnectionError, OSError):
            pass
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.listener.close()


def test_the_drivers_own_retry_after_a_lost_reply_applies_once(data_cluster):
    db, colls = _collections(data_cluster)
    proxy = DroppingProxy(data_cluster.router.wire.port)
    client = pymongo.MongoClient(
        f"mongodb://127.0.0.1:{proxy.port}/", directConnection=True, serverSelectionTimeoutMS=10_000
    )
    try:
        for name in ("plain", "sharded"):
            coll = client.app[name]
            proxy.arm("insert")
            assert coll.insert_one({"_id": "r", "n": 0}).inserted_id == "r"  # not DuplicateKeyError
            proxy.arm("update")
            assert coll.update_one({"_id": "r"}, {"$inc": {"n": 1}}).modified_count == 1
            proxy.arm("findAndModify")
            assert coll.find_one_and_update({"_id": "r"}, {"$inc": {"n": 10}})["n"] == 1
            proxy.arm("delete")
            assert coll.delete_one({"_id": "gone"}).deleted_count == 0
            assert coll.find_one({"_id": "r"}) == {"_id": "r", "n": 11}  # each applied once
        assert proxy.dropped == 8
    finally:
        client.close()
        proxy.close()
