"""The data path against a real broker: a config server, three shards and a
router (in one host process, talking only through Kafka), driven by the client
library."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from domain.shardkey import hash_value
from libs.client import (
    AsyncCluster,
    DocumentTooLarge,
    DuplicateKeyError,
    InvalidNamespace,
    ShardKeyError,
    ShardlogError,
)
from schemas import config as c
from tests.conftest import async_wait_until, read_records

pytestmark = pytest.mark.kafka


def client_run(data_cluster, fn):
    async def go():
        async with AsyncCluster(data_cluster.settings.bootstrap, data_cluster.settings.cluster, timeout=60) as cl:
            return await fn(cl)

    return asyncio.run(go())


def test_crud_on_a_hashed_collection(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.users", key={"_id": "hashed"}))

    async def go(cl):
        users = cl["app"]["users"]
        ids = await users.insert_many([{"_id": i, "age": i % 50, "name": f"u{i}"} for i in range(300)])
        assert ids == list(range(300))
        assert await users.count_documents({}) == 300
        assert await users.find_one({"_id": 7}) == {"_id": 7, "age": 7, "name": "u7"}
        assert await users.count_documents({"age": {"$gte": 40}}) == 60
        assert (await users.update_one({"_id": 7}, {"$set": {"name": "seven"}}))["modified"] == 1
        assert (await users.find_one({"_id": 7}))["name"] == "seven"
        many = await users.update_many({"age": 1}, {"$inc": {"age": 100}})
        assert many == {"matched": 6, "modified": 6}
        assert await users.delete_many({"age": {"$gte": 100}}) == 6
        assert await users.delete_one({"_id": 8}) == 1
        assert await users.count_documents({}) == 300 - 7
        up = await users.update_one({"_id": 1000}, {"$set": {"age": 1}}, upsert=True)
        assert up["upsertedId"] == 1000 and await users.find_one({"_id": 1000}) == {"_id": 1000, "age": 1}
        return True

    assert client_run(data_cluster, go)
    # Every shard holds a share of a hashed collection.
    assert all(n >= 1 for n in data_cluster.served("Insert", "app.users").values())


def test_unsharded_collections_live_on_the_primary(data_cluster):
    async def go(cl):
        await cl["notes"]["todo"].insert_many([{"_id": i, "t": f"task {i}"} for i in range(10)])
        return await cl["notes"]["todo"].find({}, sort={"_id": -1}, limit=3).to_list()

    docs = client_run(data_cluster, go)
    assert [d["_id"] for d in docs] == [9, 8, 7]
    primary = data_cluster.config.catalog.databases["notes"].primary
    served = data_cluster.served("Insert", "notes.todo")
    assert served[primary] >= 1 and sum(served.values()) == served[primary]


def test_a_collection_sharded_after_writes_keeps_its_documents(data_cluster):
    async def fill(cl):
        await cl["late"]["c"].insert_many([{"_id": i, "k": i % 7} for i in range(40)])

    client_run(data_cluster, fill)
    result = data_cluster.command(c.ShardCollection(ns="late.c", key={"k": "hashed"})).result
    assert result["existing"] and result["chunks"] == 1  # all on the primary, where the documents are

    async def read(cl):
        coll = cl["late"]["c"]
        return (
            await coll.count_documents({}),
            await coll.count_documents({"k": 3}),
            await coll.find_one({"_id": 5}),
            await coll.insert_one({"_id": 99, "k": 1}),
        )

    assert client_run(data_cluster, read) == (40, 6, {"_id": 5, "k": 5}, 99)


def test_targeting_is_what_the_shards_actually_served(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.t", key={"k": "hashed"}))
    client_run(data_cluster, lambda cl: cl["app"]["t"].insert_many([{"k": i, "v": i % 7} for i in range(60)]))
    coll = data_cluster.config.catalog.collections["app.t"]
    owner = coll.chunks[coll.chunk_index(coll.pattern.encode_bound({"k": hash_value(5)}))].shard
    before = data_cluster.served("Find", "app.t")
    docs = client_run(data_cluster, lambda cl: cl["app"]["t"].find({"k": 5}).to_list())
    after = data_cluster.served("Find", "app.t")
    assert [d["k"] for d in docs] == [5]
    assert {s for s in after if after[s] > before[s]} == {owner}, "equality on the shard key reaches one shard"
    before = after
    docs = client_run(data_cluster, lambda cl: cl["app"]["t"].find({"v": 3}).to_list())
    after = data_cluster.served("Find", "app.t")
    assert sorted(d["k"] for d in docs) == [k for k in range(60) if k % 7 == 3]
    assert all(after[s] == before[s] + 1 for s in after), "a non-key filter reaches every shard"
    explained = client_run(data_cluster, lambda cl: cl["app"]["t"].explain({"k": 5}))
    assert explained["shards"] == [owner] and "equality" in explained["reason"]


def test_sorted_queries_merge_across_shards(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.people", key={"_id": "hashed"}))
    rng = random.Random(7)
    people = [{"_id": i, "age": rng.randint(0, 90), "name": rng.choice(["ann", "bob", "cy", None])} for i in range(400)]

    async def go(cl):
        p = cl["app"]["people"]
        await p.insert_many(people, ordered=False)
        a = await p.find({}, sort={"age": 1, "_id": -1}).to_list()
        b = await p.find(
            {"age": {"$lt": 50}}, sort={"name": -1, "_id": 1}, skip=10, limit=25, projection={"name": 1}
        ).to_list()
        cursor = await p.find({}, sort={"_id": 1}, batch_size=50).to_list()  # several getMore round trips
        return a, b, cursor

    a, b, cursor = client_run(data_cluster, go)
    assert a == sorted(people, key=lambda d: (d["age"], -d["_id"]))
    young = [d for d in people if d["age"] < 50]
    # MongoDB order: null sorts below strings, so it comes last in descending order.
    by_name = sorted(young, key=lambda d: (d["name"] is not None, d["name"] or "", -d["_id"]), reverse=True)
    assert b == [{"_id": d["_id"], "name": d["name"]} for d in by_name[10:35]]
    assert [d["_id"] for d in cursor] == list(range(400))


def test_a_stale_router_refreshes_and_answers_correctly(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.s", key={"_id": "hashed"}))
    client_run(data_cluster, lambda cl: cl["app"]["s"].insert_many([{"_id": i} for i in range(100)]))
    router = data_cluster.router
    # Freeze the router's routing-table cache, then split a chunk: its cache is now old.
    data_cluster.call(_pause(router.follower))
    old_time = router.follower.config_time
    coll = data_cluster.config.catalog.collections["app.s"]
    chunk = coll.chunks[1]
    mid = (chunk.min["_id"] + chunk.max["_id"]) // 2
    reply = data_cluster.command_without_router(c.SplitChunk(ns="app.s", at=[{"_id": mid}]))
    assert router.follower.config_time == old_time < reply.configTime
    retries = router.routing.stale_retries

    async def go(cl):
        find = asyncio.create_task(cl["app"]["s"].find({}, sort={"_id": 1}).to_list())
        # The shard that owns the split chunk answers StaleConfig; then the cache may catch up.
        await async_wait_until(lambda: router.routing.stale_retries > retries, 30, "a StaleConfig from a shard")
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_resume(router.follower), data_cluster.loop))
        return await find

    docs = client_run(data_cluster, go)
    assert [d["_id"] for d in docs] == list(range(100))
    assert router.follower.config_time >= reply.configTime


async def _pause(follower):
    follower._tail.cancel()
    await asyncio.gather(follower._tail, return_exceptions=True)


async def _resume(follower):
    follower._tail = asyncio.create_task(follower.projection.follow())


def test_bad_input_gets_a_clear_error_and_leaves_no_trace(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.k", key={"region": 1, "n": 1}))
    t = data_cluster.settings.topics

    def changelog_sizes():
        return {
            sid: len(read_records(data_cluster.settings.bootstrap, t.shard_changelog(sid)))
            for sid in data_cluster.shards
        }

    client_run(data_cluster, lambda cl: cl["app"]["k"].insert_one({"_id": 1, "region": "eu", "n": 1}))
    before = changelog_sizes()

    async def go(cl):
        k = cl["app"]["k"]
        cases = [
            (k.insert_one({"_id": 2, "region": "eu"}), ShardKeyError, "ShardKeyNotFound"),
            (k.insert_one({"_id": 3, "region": "x" * 600, "n": 1}), ShardKeyError, "ShardKeyTooLarge"),
            (
                k.insert_one({"_id": 4, "region": "eu", "n": 2, "blob": "x" * (16 * 1024 * 1024)}),
                DocumentTooLarge,
                "DocumentTooLarge",
            ),
            (k.insert_one({"_id": 1, "region": "eu", "n": 1}), DuplicateKeyError, "DuplicateKey"),
            (k.update_one({"_id": 1}, {"$set": {"region": "us"}}), ShardKeyError, "ImmutableField"),
            (k.update_one({"_id": 1}, {"$foo": {"a": 1}}), ShardlogError, "FailedToParse"),  # as MongoDB
            (k.find({"n": {"$bogus": 1}}).to_list(), ShardlogError, "BadValue"),
            (cl["bad db"]["c"].insert_one({"a": 1}), InvalidNamespace, "InvalidNamespace"),
            (cl["app"]["$bad"].find({}).to_list(), InvalidNamespace, "InvalidNamespace"),
        ]
        for coro, kind, code in cases:
            with pytest.raises(kind) as e:
                await coro
            assert e.value.code == code, (code, e.value)
            assert e.value.message
        return await k.find({}).to_list()

    docs = client_run(data_cluster, go)
    assert docs == [{"_id": 1, "region": "eu", "n": 1}]
    assert changelog_sizes() == before, "a refused write reached a changelog"


def test_cli_insert_find_count_explain(data_cluster):
    from typer.testing import CliRunner

    from cli.main import app

    data_cluster.command(c.ShardCollection(ns="app.cli", key={"sku": 1}))
    base = ["--bootstrap", data_cluster.settings.bootstrap, "--cluster", data_cluster.settings.cluster]
    runner = CliRunner()

    def cli_json(*args):
        r = runner.invoke(app, [*base, *args, "--json"])
        return r.exit_code, json.loads(r.stdout.strip().splitlines()[-1])

    code, out = cli_json("insert", "app.cli", '[{"sku": 1, "q": 5}, {"sku": 2, "q": 7}, {"sku": 3, "q": 9}]')
    assert code == 0 and out["inserted"] == 3
    code, out = cli_json("find", "app.cli", '{"q": {"$gte": 7}}', "--sort", '{"sku": -1}')
    assert code == 0 and [d["sku"] for d in out["docs"]] == [3, 2]
    code, out = cli_json("count", "app.cli", '{"sku": {"$lt": 3}}')
    assert code == 0 and out["n"] == 2
    code, out = cli_json("explain", "app.cli", '{"sku": 2}')
    assert code == 0 and len(out["shards"]) == 1 and "equality" in out["reason"]
    code, out = cli_json("insert", "app.cli", '{"q": 1}')
    assert code != 0 and out["code"] == "ShardKeyNotFound"
    code, out = cli_json("find", "app.cli", "{bad")
    assert code != 0 and out["code"] == "FailedToParse"
    human = runner.invoke(app, [*base, "count", "app.cli"])
    assert human.exit_code == 0 and human.stdout.strip() == "3"


def test_a_shard_key_prefix_reaches_only_the_owning_shards(data_cluster):
    # A hashed prefix presplits the collection over every shard; equality on the prefix
    # pins one hash, so one chunk range, so (here) one shard.
    data_cluster.command(c.ShardCollection(ns="app.orders", key={"cust": "hashed", "n": 1}))
    client_run(
        data_cluster,
        lambda cl: cl["app"]["orders"].insert_many(
            [{"cust": k, "n": n, "total": k * n} for k in range(12) for n in range(5)], ordered=False
        ),
    )
    coll = data_cluster.config.catalog.collections["app.orders"]
    assert len({ch.shard for ch in coll.chunks}) == 3
    owner = coll.chunks[coll.chunk_index(coll.pattern.encode_bound({"cust": hash_value(4), "n": 0}))].shard

    def served_by(flt):
        before = data_cluster.served("Find", "app.orders")
        docs = client_run(data_cluster, lambda cl: cl["app"]["orders"].find(flt).to_list())
        after = data_cluster.served("Find", "app.orders")
        return docs, {s for s in after if after[s] > before[s]}

    docs, shards = served_by({"cust": 4})
    assert sorted(d["n"] for d in docs) == [0, 1, 2, 3, 4] and shards == {owner}
    docs, shards = served_by({"cust": 4, "n": {"$gte": 3}})
    assert sorted(d["n"] for d in docs) == [3, 4] and shards == {owner}
    docs, shards = served_by({"n": 2})
    assert len(docs) == 12 and shards == {"s0", "s1", "s2"}


def test_malformed_operations_reach_dead_letters_and_routing_carries_on(data_cluster):
    from libs.requests import Requester

    t = data_cluster.settings.topics

    async def go():
        async with Requester(data_cluster.settings.bootstrap, t.cli_replies) as r:
            bad = [
                await r.request(t.router_requests, raw, timeout=30)
                for raw in (b"{nope", b'{"type": "Insert", "v": 1, "ns": "a.b"}', b'{"type": "Drop", "v": 1}')
            ]
            routing = s_insert_with_routing()
            smuggled = await r.request(t.router_requests, routing, timeout=30)
            return bad, smuggled

    bad, smuggled = data_cluster.call(go())
    assert [b.code for b in bad] == ["BadRecord"] * 3
    assert "docs" in bad[1].error and "unknown record type 'Drop'" in bad[2].error
    assert smuggled.code == "BadValue" and "routers add it" in smuggled.error
    reasons = [
        dict(r.headers)["dlq.reason"].decode() for r in read_records(data_cluster.settings.bootstrap, t.dead_letters)
    ]
    assert len(reasons) == 3 and "not JSON" in reasons[0]
    assert client_run(data_cluster, lambda cl: cl["app"]["ok"].count_documents({})) == 0  # still serving


def s_insert_with_routing():
    from schemas import shard as s

    return s.Insert(ns="app.ok", docs=[{"a": 1}], routing=s.Routing(configTime=0))
