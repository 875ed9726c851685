"""BSON types end to end against a real broker (docs/decisions/0016): a document of every type
written through a router keeps its types in the shard's store, through a migration, in replies
and across a shard's restart; the 16 MB limit is in BSON bytes.

Through the Kafka client (libs.client); the pymongo round trip is the wire CRUD's."""

from __future__ import annotations

import asyncio
import datetime
import json

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, ObjectId, Regex, Timestamp

from domain.protocol import MAX_DOCUMENT_BYTES, ErrorCode
from libs.client import AsyncCluster, ReturnDocument
from schemas import config as c
from schemas import shard as s
from tests.conftest import async_wait_until
from tests.integration.test_migration import move
from tests.unit.test_bson_records import same

pytestmark = pytest.mark.kafka
UTC = datetime.UTC


def every_type(k: int) -> dict:
    return {
        "_id": ObjectId(),
        "k": k,
        "i32": -7,
        "i64": Int64(2**40),
        "small_long": Int64(5),
        "dbl": 2.0,
        "dec": Decimal128("1.10"),
        "date": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "old_date": datetime.datetime(1901, 1, 1, tzinfo=UTC),
        "bytes": b"\x00\x01\xff",
        "uuid": Binary(bytes(range(16)), 4),
        "user_bin": Binary(b"xy", 0x80),
        "ts": Timestamp(1_700_000_000, 3),
        "re": Regex("^a.c", "im"),
        "code": Code("function () { return 1; }"),
        "min": bson.MinKey(),
        "max": bson.MaxKey(),
        "null": None,
        "str": "é\x01",
        "nested": {"a": [ObjectId(), {"d": Int64(-1)}], "b": {"c": Decimal128("-0")}},
    }


def run(cluster, fn, timeout: float = 60):
    async def go():
        async with AsyncCluster(cluster.settings.bootstrap, cluster.settings.cluster, timeout=timeout) as cl:
            return await fn(cl)

    return asyncio.run(go())


def stored(cluster, sid: str, ns: str) -> list[dict]:
    return [d for _, d in cluster.shards[sid].documents.scan(ns)]


async def restart_shard(cluster, sid: str) -> None:
    """Stop a shard's server and start a new one on the same data directory."""
    from services.shard.server import ShardServer

    old = cluster.shards[sid]
    task = next(
        t
        for t in cluster.tasks
        if getattr(t.get_coro(), "cr_frame", None) and t.get_coro().cr_frame.f_locals.get("self") is old
    )
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    cluster.tasks.remove(task)
    new = ShardServer(cluster.settings, sid)
    cluster.shards[sid] = new
    cluster.tasks.append(asyncio.create_task(new.run()))
    await async_wait_until(lambda: new.processor.active.is_set(), 60, f"shard {sid} active again")


def test_every_type_survives_store_migration_reply_and_restart(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="b", primary="s0"))
    cl.command(c.ShardCollection(ns="b.t", key={"k": 1}))
    cl.command(c.SplitChunk(ns="b.t", at=[{"k": 0}]))
    docs = [every_type(k) for k in (-5, 5, 6)]

    async def write_and_read(client: AsyncCluster):
        coll = client["b"]["t"]
        await coll.insert_many(docs)
        back = await coll.find({}, sort={"k": 1}).to_list()
        by_oid = await coll.find_one({"nested.a": docs[1]["nested"]["a"][0]})
        dated = await coll.count_documents({"date": {"$gte": datetime.datetime(2024, 1, 1, tzinfo=UTC)}})
        typed = await coll.count_documents({"small_long": 5, "dec": Decimal128("1.1"), "ts": {"$gt": Timestamp(1, 0)}})
        return back, by_oid, dated, typed

    back, by_oid, dated, typed = run(cl, write_and_read)
    assert all(same(a, b) for a, b in zip(back, docs, strict=True)), (back, docs)
    assert by_oid is not None and same(by_oid, docs[1])
    assert dated == 3 and typed == 3
    assert all(same(a, b) for a, b in zip(stored(cl, "s0", "b.t"), docs, strict=True))  # the store keeps them

    # Migrate [0, MaxKey) to s1: the transfer batches carry the types.
    assert move(cl, c.MoveRange(ns="b.t", min={"k": 0}, to="s1")) == "committed"
    assert all(same(a, b) for a, b in zip(stored(cl, "s1", "b.t"), docs[1:], strict=True))
    moved = run(cl, lambda client: client["b"]["t"].find({"k": {"$gte": 0}}, sort={"k": 1}).to_list())
    assert all(same(a, b) for a, b in zip(moved, docs[1:], strict=True))

    # A findAndModify's post-image (a retryable write's record) and an upsert's generated _id.
    async def modify(client: AsyncCluster):
        coll = client["b"]["t"]
        after = await coll.find_one_and_update(
            {"k": 5},
            {"$set": {"when": datetime.datetime(2025, 6, 1, tzinfo=UTC)}, "$inc": {"small_long": 1}},
            return_document=ReturnDocument.AFTER,
        )
        await coll.update_one({"k": 7}, {"$set": {"x": Int64(1)}}, upsert=True)
        return after, await coll.find_one({"k": 7})

    after, upserted = run(cl, modify)
    assert type(after["small_long"]) is Int64 and after["small_long"] == 6
    assert after["when"] == datetime.datetime(2025, 6, 1, tzinfo=UTC)
    assert isinstance(upserted["_id"], ObjectId) and type(upserted["x"]) is Int64  # a shard's ObjectId

    # What the wire edge calls: the router's in-process routing.handle gives BSON values.
    found = cl.call(
        cl.router.routing.handle(s.Find(ns="b.t", filter={"_id": docs[2]["_id"], "re": {"$eq": docs[2]["re"]}}))
    )
    assert [same(d, docs[2]) for d in found["docs"]] == [True]
    written = cl.call(cl.router.routing.handle(s.Insert(ns="b.t", docs=[{"k": 8, "t": Timestamp(5, 6)}])))
    assert written["inserted"] == 1 and not written["writeErrors"]

    # The recipient restarts on its data directory: the types come back from its store.
    cl.call(restart_shard(cl, "s1"))
    again = run(cl, lambda client: client["b"]["t"].find({"k": 6}).to_list())
    assert len(again) == 1 and same(again[0], docs[2])


def test_typed_chunk_bounds_place_documents(data_cluster):
    """A collection sharded on ObjectId _ids, split and moved at an ObjectId bound."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="o", primary="s0"))
    cl.command(c.ShardCollection(ns="o.t", key={"_id": 1}))
    mid = ObjectId("650000000000000000000000")
    cl.command(c.SplitChunk(ns="o.t", at=[{"_id": mid}]))
    assert move(cl, c.MoveRange(ns="o.t", min={"_id": mid}, to="s2")) == "committed"
    low, high = ObjectId("640000000000000000000000"), ObjectId("660000000000000000000000")
    run(cl, lambda client: client["o"]["t"].insert_many([{"_id": low}, {"_id": mid}, {"_id": high}]))
    assert [d["_id"] for d in stored(cl, "s0", "o.t")] == [low]
    assert [d["_id"] for d in stored(cl, "s2", "o.t")] == [mid, high]
    chunks = cl.router.follower.catalog.collections["o.t"].chunks
    assert [ch.min for ch in chunks][1]["_id"] == mid


def test_sixteen_megabytes_of_bson(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="big", primary="s0"))
    # Binary is a third larger as Extended JSON (base64): its record is over 21 MB.
    blob = bytes(range(256)) * ((MAX_DOCUMENT_BYTES - 100) // 256)
    doc = {
        "_id": ObjectId(),
        "blob": blob,
        "pad": "x" * (MAX_DOCUMENT_BYTES - 64 - len(bson.encode({"_id": ObjectId(), "blob": blob, "pad": ""}))),
    }
    assert MAX_DOCUMENT_BYTES - 64 <= len(bson.encode(doc)) <= MAX_DOCUMENT_BYTES

    async def big(client: AsyncCluster):
        coll = client["big"]["t"]
        await coll.insert_one(doc)
        back = await coll.find_one({"_id": doc["_id"]})
        # One byte over, sent as a bare client would (libs.client refuses it before sending).
        over = {"_id": ObjectId(), "pad": "x" * (MAX_DOCUMENT_BYTES - 20)}
        refused = await client.call(s.Insert(ns="big.t", docs=[over]), retry=False)
        return back, refused, await coll.count_documents({})

    back, refused, n = run(cl, big, timeout=120)
    assert back is not None and same(back, doc)
    assert n == 1
    (err,) = refused["writeErrors"]
    assert err["code"] == ErrorCode.DocumentTooLarge and ErrorCode.DocumentTooLarge.number == 10334


def test_cli_reads_and_prints_extended_json(data_cluster):
    from tests.conftest import cli

    cl = data_cluster
    cl.command(c.CreateDatabase(db="cli", primary="s1"))
    doc = '{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "at": {"$date": "2024-01-02T03:04:05.678Z"}, "n": {"$numberLong": "7"}}'
    out = cli(cl.settings, "insert", "cli.t", doc, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["insertedIds"] == [{"$oid": "65a1b2c3d4e5f60718293a4b"}]
    (stored_doc,) = stored(cl, "s1", "cli.t")
    assert stored_doc == {
        "_id": ObjectId("65a1b2c3d4e5f60718293a4b"),
        "at": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "n": Int64(7),
    }
    assert type(stored_doc["n"]) is Int64
    out = cli(cl.settings, "find", "cli.t", '{"at": {"$gt": {"$date": "2024-01-01T00:00:00Z"}}}', "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["docs"] == [json.loads(doc)]
