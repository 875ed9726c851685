"""kill -9 on the data path, every service in its own process: a shard or a
router dies mid-workload; every acknowledged write is present exactly once."""

from __future__ import annotations

import asyncio
import collections
import random

import pytest

from libs.client import AsyncCluster
from libs.commands import CORRELATION_ID
from libs.requests import Requester
from schemas import config as c
from tests.conftest import active_and_standby, group_offset_and_log_end, read_records, wait_group_stable

pytestmark = pytest.mark.kafka

N_DOCS = 120
INCS_PER_DOC = 3


@pytest.fixture
def cluster_procs(settings, spawn):
    """Config server, shards s0..s2 and routers r1, r2 as separate processes."""
    procs = {"config": spawn(settings, "services.config", ready_name="config")}
    procs["config"].wait_ready(role="active")

    async def add_shards():
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            for sid in ("s0", "s1", "s2"):
                assert (await r.request(settings.topics.config_commands, c.AddShard(shard=sid), timeout=60)).ok
            assert (
                await r.request(
                    settings.topics.config_commands,
                    c.ShardCollection(ns="app.counters", key={"_id": "hashed"}),
                    timeout=60,
                )
            ).ok

    asyncio.run(add_shards())
    for sid in ("s0", "s1", "s2"):
        procs[sid] = spawn(settings, "services.shard", "--shard-id", sid, ready_name=f"shard-{sid}")
    for r in ("r1", "r2"):
        procs[r] = spawn(settings, "services.router", "--instance", r, ready_name=f"router-{r}")
    for name, p in procs.items():
        p.wait_ready(role="active" if name.startswith("s") else None)
    procs["spawn"] = lambda *a, **kw: spawn(settings, *a, **kw)
    return procs


async def workload(settings, on_progress) -> dict:
    """Insert N docs, then $inc each INCS_PER_DOC times, many in flight; every op must be acknowledged."""
    acked = {"inserted": set(), "incs": {i: 0 for i in range(N_DOCS)}}
    async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=120, attempt_timeout=8) as cl:
        coll = cl["app"]["counters"]
        sem = asyncio.Semaphore(16)

        async def insert(i):
            async with sem:
                await coll.insert_one({"_id": i, "n": 0})
                acked["inserted"].add(i)
                on_progress(len(acked["inserted"]))

        async def inc(i):
            async with sem:
                r = await coll.update_one({"_id": i}, {"$inc": {"n": 1}})
                assert r["matched"] == 1
                acked["incs"][i] += 1

        await asyncio.gather(*(insert(i) for i in range(N_DOCS)))
        ops = [i for i in range(N_DOCS) for _ in range(INCS_PER_DOC)]
        random.Random(1).shuffle(ops)
        await asyncio.gather(*(inc(i) for i in ops))
        docs = await coll.find({}, sort={"_id": 1}).to_list()
    return {"acked": acked, "docs": docs}


def check_exactly_once(result) -> None:
    docs, acked = result["docs"], result["acked"]
    assert [d["_id"] for d in docs] == list(range(N_DOCS)), "every acknowledged insert, once"
    assert acked["inserted"] == set(range(N_DOCS))
    for d in docs:
        assert d["n"] == acked["incs"][d["_id"]] == INCS_PER_DOC, f"doc {d['_id']}: $inc applied {d['n']} times"


def test_kill9_a_shard_mid_workload(settings, cluster_procs):
    state = {"killed": False}

    def on_progress(n):
        if not state["killed"] and n >= N_DOCS // 3:
            state["killed"] = True
            cluster_procs["s1"].kill9()
            state["restarted"] = cluster_procs["spawn"]("services.shard", "--shard-id", "s1", ready_name="shard-s1")

    result = asyncio.run(asyncio.wait_for(workload(settings, on_progress), 240))
    assert state["killed"]
    check_exactly_once(result)


def test_kill9_a_router_mid_workload(settings, cluster_procs):
    state = {"killed": False}

    def on_progress(n):
        if not state["killed"] and n >= N_DOCS // 3:
            state["killed"] = True
            cluster_procs["r1"].kill9()  # r2 takes over its share of router.requests

    result = asyncio.run(asyncio.wait_for(workload(settings, on_progress), 240))
    assert state["killed"]
    check_exactly_once(result)


def test_a_shard_that_lost_its_disk_rebuilds_from_its_changelog(settings, cluster_procs):
    import shutil

    async def write_and_read():
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=120) as cl:
            coll = cl["app"]["counters"]
            await coll.insert_many([{"_id": i, "n": i} for i in range(60)], ordered=False)
            await coll.update_many({"n": {"$lt": 10}}, {"$inc": {"n": 100}})
            await coll.delete_many({"n": {"$gte": 50, "$lt": 60}})
            return await coll.find({}, sort={"_id": 1}).to_list()

    before = asyncio.run(write_and_read())
    cluster_procs["s0"].stop()
    shutil.rmtree(settings.data_dir / "shard-s0")  # documents and catalog: everything on its disk
    restarted = cluster_procs["spawn"]("services.shard", "--shard-id", "s0", ready_name="shard-s0")
    restarted.wait_ready(role="active", timeout=90)

    async def read():
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=120) as cl:
            return await cl["app"]["counters"].find({}, sort={"_id": 1}).to_list()

    assert asyncio.run(read()) == before
    assert len(before) == 50


def test_kill9_an_active_shard_mid_workload_its_standby_takes_over(settings, cluster_procs):
    """A shard with a standby instance (its own store, folding the changelog while it waits):
    kill -9 the active one mid-workload and leave it dead; the standby fences it, takes over,
    and every acknowledged write is there exactly once."""
    standby = cluster_procs["spawn"]("services.shard", "--shard-id", "s1", "--instance", "1", ready_name="shard-s1-1")
    assert standby.wait_ready(role="standby")["role"] == "standby"
    state = {"killed": False}

    def on_progress(n):
        if not state["killed"] and n >= N_DOCS // 3:
            state["killed"] = True
            cluster_procs["s1"].kill9()

    result = asyncio.run(asyncio.wait_for(workload(settings, on_progress), 240))
    assert state["killed"]
    check_exactly_once(result)
    info = standby.wait_ready(role="active", timeout=5)
    # The heir seeks to its state rather than reloading it; the readiness file says how long it took.
    assert set(info["activation"]) >= {"fenceS", "committedS", "catchUpS", "sinceAssignedS"}
    assert (settings.data_dir / "shard-s1-1" / "documents").is_dir(), "the standby keeps a store of its own"


def test_a_shard_heir_resumes_where_the_changelog_records_while_the_group_lags(settings, spawn):
    """A shard's transactions that write events record their command offsets on them, not in the
    consumer group (docs/reference/command-processor.md).  The instances' own group commits
    are held off, so after every write is acknowledged the group still lags; kill -9 the active
    one: its standby resumes where the changelog says, so no $inc is applied twice and none is lost."""
    config = spawn(settings, "services.config", ready_name="config")
    config.wait_ready(role="active")

    async def add_shard():
        async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
            assert (await r.request(settings.topics.config_commands, c.AddShard(shard="s0"), timeout=60)).ok
            sharded = c.ShardCollection(ns="app.counters", key={"_id": "hashed"})
            assert (await r.request(settings.topics.config_commands, sharded, timeout=60)).ok

    asyncio.run(add_shard())
    held_off = {"SHARDLOG_READ_OFFSETS_COMMIT_S": "3600"}
    first = spawn(settings, "services.shard", "--shard-id", "s0", ready_name="shard-s0", env=held_off)
    first.wait_ready(role="active")
    second = spawn(
        settings, "services.shard", "--shard-id", "s0", "--instance", "1", ready_name="shard-s0-1", env=held_off
    )
    spawn(settings, "services.router", "--instance", "r1", ready_name="router-r1").wait_ready()
    wait_group_stable(settings, "shard-s0", 2)  # the second's joining revokes (and commits): before the writes
    active, standby = active_and_standby(first, second)

    async def incs(insert: bool) -> list[dict]:
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=120, attempt_timeout=8) as cl:
            coll = cl["app"]["counters"]
            if insert:
                await asyncio.gather(*(coll.insert_one({"_id": i, "n": 0}) for i in range(N_DOCS)))
            results = await asyncio.gather(*(coll.update_one({"_id": i}, {"$inc": {"n": 1}}) for i in range(N_DOCS)))
            assert all(r["matched"] == 1 for r in results)
            return await coll.find({}, sort={"_id": 1}).to_list() if not insert else []

    asyncio.run(asyncio.wait_for(incs(insert=True), 120))
    committed, end = group_offset_and_log_end(settings, "shard-s0", settings.topics.shard_requests("s0"))
    assert committed < end, "the group lags: the transactions recorded their offsets in the changelog"
    active.kill9()
    docs = asyncio.run(asyncio.wait_for(incs(insert=False), 180))
    assert [d["_id"] for d in docs] == list(range(N_DOCS)), "every acknowledged insert, once"
    assert [d["n"] for d in docs] == [2] * N_DOCS, "every acknowledged $inc, once"
    standby.wait_ready(role="active", timeout=5)
    # Answered once: one transactional reply per request on the router's inbox (the heir deciding a
    # write again would answer it again: the write's recorded outcome hides it from the documents).
    replies = collections.Counter(
        dict(r.headers or ()).get(CORRELATION_ID)
        for r in read_records(settings.bootstrap, settings.topics.router_inbox("r1"))
    )
    assert set(replies.values()) == {1}, replies.most_common(3)
