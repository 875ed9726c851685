"""The balancer against a real broker: rounds that even out the data, then quiet."""

from __future__ import annotations

import asyncio
import json

import pytest

from libs.client import AsyncCluster
from schemas import config as c
from tests.conftest import InProcessCluster, async_wait_until, cli, read_events

pytestmark = pytest.mark.kafka

MB = 1024 * 1024


@pytest.fixture
def balanced_cluster(settings, monkeypatch):
    monkeypatch.setenv("SHARDLOG_STATS_INTERVAL_S", "0.5")  # fresh statistics for every round
    cl = InProcessCluster(settings)
    yield cl
    cl.stop()


def sizes_by_shard(cl, ns: str) -> dict:
    """Data of `ns` per shard, from the shards' own statistics."""
    out = {}
    for sid, shard in cl.shards.items():
        coll = shard.follower.catalog.collections[ns]
        out[sid] = sum(
            sum(shard.documents.range_sizes(ns, ch.min_key, ch.max_key)) for ch in coll.chunks if ch.shard == sid
        )
    return out


def test_the_balancer_evens_out_a_collection_loaded_on_one_shard_then_stays_quiet(balanced_cluster):
    from services.balancer.server import Balancer

    cl = balanced_cluster
    for key, value in (
        ("maxChunkSizeBytes", MB),
        ("balancerRoundIntervalSecs", 0.5),
        ("balancerMigrationsThrottlingMs", 0),
        ("orphanCleanupDelaySecs", 0),
    ):
        cl.command(c.SetSetting(key=key, value=value))
    cl.command(c.CreateDatabase(db="b", primary="s0"))
    cl.command(c.ShardCollection(ns="b.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="b.c", at=[{"k": i * 1000} for i in range(1, 8)]))

    async def load():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=120) as client:
            coll = client["b"]["c"]
            for start in range(0, 8000, 1000):
                await coll.insert_many([{"_id": i, "k": i, "pad": "x" * 1000} for i in range(start, start + 1000)])

    asyncio.run(load())
    assert sizes_by_shard(cl, "b.c")["s1"] == 0

    balancer = Balancer(cl.settings)
    task = asyncio.run_coroutine_threadsafe(balancer.run(), cl.loop)
    try:

        def even():
            sizes = sizes_by_shard(cl, "b.c")
            return max(sizes.values()) - min(sizes.values()) <= 3 * MB and min(sizes.values()) > 0 and sizes

        cl.call(async_wait_until(even, 240, "the balancer to even out b.c"))
        # Then quiet: several more rounds with fresh statistics issue no migration.
        moved = len(
            [
                e
                for _, e in read_events(cl.settings.bootstrap, cl.settings.topics.config_events)
                if e.type == "MigrationRequested"
            ]
        )
        rounds_seen = balancer.round
        cl.call(async_wait_until(lambda: "balanced" in balancer.activity, 60, "a round that finds nothing to do"))
        stats_reports = dict(balancer.statistics.latest)
        cl.call(
            async_wait_until(
                lambda: all(
                    balancer.statistics.latest[s].timestamp > stats_reports[s].timestamp + 1 for s in stats_reports
                ),
                60,
                "two more seconds of statistics",
            )
        )
        assert "balanced" in balancer.activity
        again = len(
            [
                e
                for _, e in read_events(cl.settings.bootstrap, cl.settings.topics.config_events)
                if e.type == "MigrationRequested"
            ]
        )
        assert again == moved and balancer.round == rounds_seen, "the balancer kept moving data once even"
        status = cli(cl.settings, "balancer", "status", "--json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["enabled"] and doc["inWindow"] and doc["inFlight"] == [] and doc["lastRound"]["round"] >= 2
        comp = json.loads(cli(cl.settings, "balancer", "collection-status", "b.c", "--json").stdout)
        assert comp["compliant"], comp
    finally:
        task.cancel()
    count = asyncio.run(_count(cl))
    assert count == 8000


async def _count(cl):
    async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=60) as client:
        return await client["b"]["c"].count_documents({})


def test_split_find_without_at_splits_at_the_median_and_refuses_a_single_key_chunk(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="sp", primary="s1"))
    cl.command(c.ShardCollection(ns="sp.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="sp.c", at=[{"k": 1000}]))

    async def load():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=60) as client:
            await client["sp"]["c"].insert_many(
                [{"_id": i, "k": i // 2} for i in range(100)] + [{"_id": 5000 + i, "k": 2000} for i in range(10)]
            )

    asyncio.run(load())
    done = cli(cl.settings, "split", "sp.c", "--find", '{"k": 7}', "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    chunks = json.loads(done.stdout)["chunks"]
    assert [ch["max"] for ch in chunks][0] == {"k": 25}  # keys 0..49, two documents each: the median key
    single = cli(cl.settings, "split", "sp.c", "--find", '{"k": 2000}', "--json")
    assert single.returncode == 1 and json.loads(single.stdout)["code"] == "CannotSplit"
    assert "same shard key" in json.loads(single.stdout)["error"]
    neither = cli(cl.settings, "split", "sp.c")
    assert neither.returncode == 2


def test_a_new_shard_receives_its_share_and_a_removed_shard_drains_and_disappears(balanced_cluster):
    """Add a 4th shard to a balanced cluster: the balancer gives it data. Then remove a
    shard that is also a database's primary: its chunks drain, the database moves
    (movePrimary, with its unsharded collection), the shard leaves the catalog, and every
    document is still there exactly once."""
    from services.balancer.server import Balancer
    from services.range_deleter.server import RangeDeleter
    from services.shard.server import ShardServer

    cl = balanced_cluster
    for key, value in (
        ("maxChunkSizeBytes", MB),
        ("balancerRoundIntervalSecs", 0.5),
        ("balancerMigrationsThrottlingMs", 0),
        ("orphanCleanupDelaySecs", 0),
    ):
        cl.command(c.SetSetting(key=key, value=value))
    cl.command(c.CreateDatabase(db="g", primary="s2"))
    cl.command(c.ShardCollection(ns="g.c", key={"k": 1}))
    n = 24000
    cl.command(c.SplitChunk(ns="g.c", at=[{"k": i * 1000} for i in range(1, n // 1000)]))
    # Ranges start where they would after an even-out, so the balancer only has the new shard to serve.
    for i in range(n // 1000):
        owner = f"s{i % 3}"
        if owner != "s2":
            cl.command(c.MoveRange(ns="g.c", min={"k": i * 1000}, to=owner))
            cl.call(async_wait_until(lambda: not cl.config.catalog.migrations, 60, "the set-up move to finish"))

    async def load():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=120) as client:
            for start in range(0, n, 1000):
                await client["g"]["c"].insert_many(
                    [{"_id": i, "k": i, "pad": "x" * 1000} for i in range(start, start + 1000)]
                )
            await client["g"]["u"].insert_many([{"_id": i, "note": f"unsharded {i}"} for i in range(50)])

    asyncio.run(load())

    balancer, deleter = Balancer(cl.settings), RangeDeleter(cl.settings)
    tasks = [asyncio.run_coroutine_threadsafe(x.run(), cl.loop) for x in (balancer, deleter)]
    try:
        # A 4th shard: its process runs first, then the config server learns of it.
        s3 = ShardServer(cl.settings, "s3")

        async def spawn():  # a cluster member from now on: it stops with the others
            cl.tasks.append(asyncio.create_task(s3.run()))

        cl.call(spawn())
        cl.call(async_wait_until(lambda: s3.processor.active.is_set(), 60, "s3 active"))
        cl.shards["s3"] = s3
        cl.command(c.AddShard(shard="s3"))

        def s3_has_its_share():
            sizes = sizes_by_shard(cl, "g.c")
            return (
                sizes["s3"] > 0
                and max(sizes.values()) - min(sizes.values()) <= 3 * MB
                and not balancer.state.in_flight
                and sizes
            )

        shares = cl.call(async_wait_until(s3_has_its_share, 240, "the balancer to give s3 its share"))
        assert shares["s3"] >= 2 * MB, shares

        # Stopped balancer and disallowed migrations: the removal says what blocks it.
        for args in (("balancer", "stop"), ("set-allow-migrations", "g.c", "false")):
            done = cli(cl.settings, *args, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
        on_s2 = sum(ch.shard == "s2" for ch in cl.config.catalog.collections["g.c"].chunks)
        removing = cli(cl.settings, "remove-shard", "s2", "--json")
        assert removing.returncode == 0 and json.loads(removing.stdout)["state"] == "started", removing.stdout
        status = json.loads(cli(cl.settings, "remove-shard", "s2", "--status", "--json").stdout)
        assert status["draining"] and status["chunks"] == on_s2 > 0 and status["databases"] == ["g"], status
        assert {b["reason"] for b in status["blockers"]} == {"balancerStopped", "migrationsDisallowed"}, status
        during = json.loads(cli(cl.settings, "balancer", "collection-status", "g.c", "--json").stdout)
        assert not during["compliant"] and {"draining", "migrationsDisallowed"} <= {
            v["reason"] for v in during["violations"]
        }, during
        for args in (("set-allow-migrations", "g.c", "true"), ("balancer", "start")):
            done = cli(cl.settings, *args, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
        cl.call(async_wait_until(lambda: "s2" not in cl.config.catalog.shards, 300, "s2 to drain and be removed"))
        catalog = cl.config.catalog
        assert catalog.databases["g"].primary != "s2"
        assert all(ch.shard != "s2" for ch in catalog.collections["g.c"].chunks)
        gone = cli(cl.settings, "remove-shard", "s2", "--status", "--json")
        assert gone.returncode == 1 and json.loads(gone.stdout)["code"] == "ShardNotFound", gone.stdout
    finally:
        for t in tasks:
            t.cancel()

    async def read_back():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=60) as client:
            return (
                [d["k"] for d in await client["g"]["c"].find({}, projection={"k": 1}, sort={"k": 1}).to_list()],
                await client["g"]["u"].find({}, sort={"_id": 1}).to_list(),
            )

    keys, unsharded = asyncio.run(read_back())
    assert keys == list(range(n)), "a document was lost or duplicated while adding and removing shards"
    assert [d["note"] for d in unsharded] == [f"unsharded {i}" for i in range(50)]


def test_auto_split_splits_a_grown_chunk_moves_the_new_top_chunk_and_marks_a_single_key_chunk_jumbo(balanced_cluster):
    """Auto-splitting (docs/reference/auto-split.md), through the balancer: an ascending key grown past the max
    chunk size is split about every half max size, its highest key gets a chunk of its own
    that moves off the hot shard; a chunk whose documents share one shard key is jumbo."""
    from services.balancer.server import Balancer

    cl = balanced_cluster
    for key, value in (
        ("maxChunkSizeBytes", MB),
        ("balancerRoundIntervalSecs", 0.5),
        ("balancerMigrationsThrottlingMs", 0),
    ):
        cl.command(c.SetSetting(key=key, value=value))
    cl.command(c.CreateDatabase(db="as", primary="s0"))
    for ns in ("as.up", "as.one"):
        cl.command(c.ShardCollection(ns=ns, key={"k": 1}))
        cl.command(c.SetSetting(ns=ns, key="autoSplit", value=True))

    async def load():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=120) as client:
            await client["as"]["up"].insert_many([{"_id": i, "k": i, "pad": "x" * 1000} for i in range(2500)])
            await client["as"]["one"].insert_many([{"_id": i, "k": 7, "pad": "x" * 1000} for i in range(1500)])

    asyncio.run(load())

    balancer = Balancer(cl.settings)
    task = asyncio.run_coroutine_threadsafe(balancer.run(), cl.loop)
    try:

        def done():
            cat = cl.config.catalog
            up, one = cat.collections["as.up"], cat.collections["as.one"]
            return (
                len(up.chunks) > 2
                and up.chunks[-1].shard != "s0"
                and one.chunks[0].jumbo
                and not balancer.state.in_flight
                and (up, one)
            )

        up, one = cl.call(async_wait_until(done, 120, "the auto-split of as.up and the jumbo mark of as.one"))
    finally:
        task.cancel()
    top = up.chunks[-1]
    assert top.min == {"k": 2499}, f"the top chunk should hold the highest key alone: {top.min}"
    sizes = [sum(cl.shards[ch.shard].documents.range_sizes("as.up", ch.min_key, ch.max_key)) for ch in up.chunks]
    assert all(size < MB for size in sizes), f"a piece is still over the max chunk size: {sizes}"
    assert sum(sizes) >= 2500 * 1000
    assert len(one.chunks) == 1 and one.chunks[0].shard == "s0", "a jumbo chunk is neither split nor moved"

    async def ask(req):
        from libs.requests import Requester

        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(cl.settings.topics.shard_requests("s0"), req, timeout=30)

    from schemas import shard as s

    for bad in (
        s.SplitVector(ns="as.up"),
        s.SplitVector(ns="as.up", find={"k": 1}, chunkMin={"k": 0}),
        s.SplitVector(ns="as.up", chunkMin={"x": 1}),
    ):
        reply = cl.call(ask(bad))
        assert not reply.ok and reply.code == "BadValue", reply
