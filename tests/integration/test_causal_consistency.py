"""The vector clock and causal consistency against a real broker (docs/decisions/0014): a
causally consistent session reads its own write through a router that is behind; a client's
$clusterTime that is forged, unsigned or runs away is refused and changes nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from domain import clock as vc
from libs.client import AsyncCluster, ShardlogError
from schemas import config as c
from schemas import shard as s
from services.router.server import RouterServer
from tests.conftest import async_wait_until, read_events, read_records, wait_until

pytestmark = pytest.mark.kafka


def on_loop(data_cluster, fn):
    """Run a plain function on the cluster's event loop (asyncio objects are not thread-safe)."""

    async def go():
        return fn()

    return data_cluster.call(go())


def start_router(data_cluster, instance: str) -> tuple[RouterServer, asyncio.Task]:
    router = RouterServer(data_cluster.settings, instance=instance)

    async def go():
        task = asyncio.create_task(router.run())
        await async_wait_until(
            lambda: router.follower._tail is not None, 60, f"router {instance} to follow the catalog"
        )
        return task

    return router, data_cluster.call(go())


def test_a_causal_session_reads_its_write_through_a_router_that_is_behind(data_cluster):
    r1 = data_cluster.router
    wait_until(lambda: len(r1.follower.catalog.keys) >= 2, 30, "the config server to make the signing keys")
    r2, r2_task = start_router(data_cluster, "r2")
    assert r2.follower.catalog.keys == r1.follower.catalog.keys  # every follower holds them
    on_loop(data_cluster, r2.follower.pause)  # R2's catalog stops here: it has never seen db "fresh"
    r1_task = data_cluster.tasks[-1]  # InProcessCluster starts its router last

    async def scenario(cl: AsyncCluster):
        session = cl.start_session(causal_consistency=True)
        # The write goes through R1 (its own topic: whatever the group's assignment of router.requests).
        await cl.call(s.Insert(ns="fresh.c", docs=[{"_id": 1, "v": "mine"}]), topic=r1.cursor_topic, session=session)
        written = session.operation_time
        assert written and cl.cluster_time["signature"]["keyId"] > 0  # a signed $clusterTime came back
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_stop(data_cluster, r1_task), data_cluster.loop))
        fresh = cl["fresh"]["c"]
        # Without the session's time, R2 (now serving router.requests alone) answers from its stale
        # catalog: no such database, so nothing.
        assert await fresh.find_one({"_id": 1}) is None
        assert await fresh.count_documents({}) == 0
        assert r2.routing.causal_refreshes == 0
        # With it: R2 must first catch its catalog up to the end of config.events; it waits...
        read = asyncio.create_task(fresh.find_one({"_id": 1}, session=session))
        await async_wait_until(lambda: r2.routing.causal_refreshes == 1, 30, "R2 to wait for its catalog")
        await asyncio.sleep(0.3)
        assert not read.done()  # ... for as long as its catalog is behind
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_resume(r2), data_cluster.loop))
        doc = await read
        assert doc == {"_id": 1, "v": "mine"}
        assert session.operation_time >= written
        assert await fresh.count_documents({}, session=session) == 1
        return written

    written = asyncio.run(_client(data_cluster, scenario))
    # The write's operationTime is the stamp the shard put on it in its changelog.
    primary = data_cluster.config.catalog.databases["fresh"].primary
    stamps = [
        json.loads(r.value)["ts"]
        for r in read_records(data_cluster.settings.bootstrap, data_cluster.settings.topics.shard_changelog(primary))
        if json.loads(r.value)["type"] == "DocumentWritten"
    ]
    assert stamps == [written]
    # Config events are stamped too, in offset order; the keys are config events.
    events = read_events(data_cluster.settings.bootstrap, data_cluster.settings.topics.config_events, keys=True)
    ts = [e.ts for _, e in events]
    assert all(ts) and ts == sorted(ts) and len(set(ts)) == len(ts)
    assert sum(e.type == "ClusterTimeKeyCreated" for _, e in events) == 2
    assert r2.follower.catalog.config_ts == ts[-1] < written
    data_cluster.call(_stop(data_cluster, r2_task))


async def _stop(data_cluster, task):
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _resume(router):
    router.follower.resume()


async def _client(data_cluster, fn):
    async with AsyncCluster(data_cluster.settings.bootstrap, data_cluster.settings.cluster, timeout=60) as cl:
        return await fn(cl)


def test_forged_unsigned_runaway_and_future_times_are_refused_and_change_nothing(data_cluster):
    router = data_cluster.router
    wait_until(lambda: router.follower.catalog.keys, 30, "the config server to make the signing keys")

    async def scenario(cl: AsyncCluster):
        coll = cl["app"]["t"]
        await coll.insert_one({"_id": 1})
        good = cl.cluster_time
        before = on_router(router.clock.now)
        now = good_time = vc.parse_signed_cluster_time(good).time
        ahead = now + 1000
        key = router.follower.catalog.keys[good["signature"]["keyId"]]
        forged = vc.signed_cluster_time(
            ahead, {1: vc.ClusterTimeKey(good["signature"]["keyId"], b"x" * 20, key.expires_at)}
        )
        unsigned = vc.signed_cluster_time(ahead, {})
        runaway_t = vc.LogicalTime(int(time.time()) + 2 * 31_536_000, 0).packed
        runaway = {
            "clusterTime": vc.to_ejson(runaway_t),
            "signature": {
                "hash": {
                    "$binary": {"base64": base64.b64encode(vc.sign(key.key, runaway_t)).decode(), "subType": "00"}
                },
                "keyId": key.key_id,
            },
        }
        codes = {}
        for name, doc in [
            ("forged", forged),
            ("unsigned", unsigned),
            ("runaway", runaway),
            ("malformed", {"clusterTime": 1}),
        ]:
            cl.cluster_time = doc
            with pytest.raises(ShardlogError) as e:
                await coll.insert_one({"_id": name})
            codes[name] = e.value.code
        cl.cluster_time = good
        assert codes == {
            "forged": "TimeProofMismatch",
            "unsigned": "KeyNotFound",
            "runaway": "ClusterTimeFailsRateLimiter",
            "malformed": "TypeMismatch",
        }
        assert on_router(router.clock.now).cluster < ahead  # nothing advanced the router's clock
        future = {"afterClusterTime": vc.to_ejson(on_router(lambda: router.clock.cluster_time) + 10_000)}
        with pytest.raises(ShardlogError) as e:
            await cl.call(s.Find(ns="app.t", readConcern=future))
        assert e.value.code == "InvalidOptions" and "greater than the current clusterTime" in e.value.message
        with pytest.raises(ShardlogError) as e:
            await cl.call(s.Count(ns="app.t", readConcern={"afterClusterTime": 12}))
        assert e.value.code == "TypeMismatch"
        # Nothing applied, and the router keeps serving.
        assert sorted(d["_id"] for d in await coll.find({}).to_list()) == [1]
        assert on_router(router.clock.now).cluster >= before.cluster >= good_time

    def on_router(fn):
        return fn()  # the clock is thread-safe to read

    asyncio.run(_client(data_cluster, scenario))


def test_a_router_refreshes_when_gossip_shows_a_newer_topology_time(data_cluster):
    router = data_cluster.router
    asyncio.run(_client(data_cluster, lambda cl: cl["app"]["topo"].insert_one({"_id": 1})))
    on_loop(data_cluster, router.follower.pause)
    reply = data_cluster.command_without_router(c.AddShard(shard="s9"))  # the shards see it, the router not
    added = next(
        e.ts
        for o, e in read_events(data_cluster.settings.bootstrap, data_cluster.settings.topics.config_events)
        if o == reply.configTime - 1
    )
    assert router.follower.catalog.topology_ts < added and "s9" not in router.follower.catalog.shards
    # Any reply from a shard gossips the shard's TopologyTime: the router sees it is behind.
    assert asyncio.run(_client(data_cluster, lambda cl: cl["app"]["topo"].count_documents({}))) == 1
    assert router.clock.now().topology == added and router.routing.topology_refreshes == 1
    on_loop(data_cluster, router.follower.resume)
    wait_until(lambda: router.follower.catalog.topology_ts == added, 30, "the router to catch up to the new topology")
    assert "s9" in router.follower.catalog.shards
