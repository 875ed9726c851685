"""Defragmentation and the auto-merger in the live balancer, against a real broker:
the three phases end to end, a balancer killed mid-phase resuming the same phase,
and the auto-merger's schedule and history window (docs/reference/defragmentation-and-auto-merge.md)."""

from __future__ import annotations

import asyncio
import json

import pytest

from libs.client import AsyncCluster
from libs.requests import Requester
from schemas import balancer as b
from schemas import config as c
from tests.conftest import InProcessCluster, async_wait_until, cli, read_records, wait_until

pytestmark = pytest.mark.kafka

MB = 1024 * 1024
PHASES = ["mergeAndMeasureChunks", "moveAndMergeChunks", "mergeChunks", "finished"]  # in order
# 16 chunks of 100 keys each; runs of one shard merge in phase 1, the rest need moves in phase 2.
LAYOUT = ["s0", "s0", "s1", "s2", "s1", "s1", "s0", "s2", "s2", "s1", "s0", "s1", "s2", "s0", "s1", "s2"]
DOCS = 100 * len(LAYOUT)


@pytest.fixture
def cl(settings, monkeypatch):
    """Config server, three shards, a router and the range deleter (a chunk may move back to a
    shard that still holds its orphans: the migration waits for their deletion)."""
    from services.range_deleter.server import RangeDeleter

    monkeypatch.setenv("SHARDLOG_STATS_INTERVAL_S", "0.5")  # fresh statistics for dataSize
    cluster = InProcessCluster(settings)
    cluster.command(c.SetSetting(key="orphanCleanupDelaySecs", value=0))
    deleter = asyncio.run_coroutine_threadsafe(RangeDeleter(settings).run(), cluster.loop)
    yield cluster
    deleter.cancel()
    cluster.stop()


def move(cl, ns: str, lo: int, hi: int | None, to: str) -> None:
    """MoveRange [lo, hi) and wait until the router sees it committed."""

    def bound(v: int | None) -> dict:
        return {"k": v} if v is not None else {"k": {"$maxKey": 1}}

    mid = cl.command(c.MoveRange(ns=ns, min=bound(lo), max=bound(hi), to=to)).result["id"]

    async def committed():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            while True:
                rep = await r.request(cl.settings.topics.config_commands, c.GetMigration(id=mid), timeout=30)
                if rep.result["state"] != "active":
                    assert rep.result["state"] == "committed", rep.result
                    await cl.router.follower.wait_for(rep.configTime or 0, 30)
                    return
                await asyncio.sleep(0.1)

    cl.call(asyncio.wait_for(committed(), 90))


def fragmented_collection(cl, ns: str = "d.c") -> None:
    """`ns` in 16 small chunks spread over the shards as LAYOUT says, 100 documents each."""
    for key, value in (("maxChunkSizeBytes", MB), ("balancerRoundIntervalSecs", 0.5), ("autoMergerEnabled", False)):
        cl.command(c.SetSetting(key=key, value=value))
    db = ns.partition(".")[0]
    cl.command(c.CreateDatabase(db=db, primary="s0"))
    cl.command(c.ShardCollection(ns=ns, key={"k": 1}))
    cl.command(c.SplitChunk(ns=ns, at=[{"k": i * 100} for i in range(1, len(LAYOUT))]))
    for i, shard in enumerate(LAYOUT):
        if shard != "s0":  # moved while empty: quick
            move(cl, ns, i * 100, (i + 1) * 100 if i + 1 < len(LAYOUT) else None, shard)

    async def load():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=120) as client:
            await client[db][ns.partition(".")[2]].insert_many(
                [{"_id": i, "k": i, "pad": "x" * 400} for i in range(DOCS)]
            )

    asyncio.run(load())


def chunks_of(cl, ns: str) -> list:
    return cl.router.follower.catalog.collections[ns].chunks


def all_ids(cl, ns: str) -> list:
    async def go():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=60) as client:
            db, _, coll = ns.partition(".")
            return sorted([d["_id"] async for d in client[db][coll].find({})])

    return asyncio.run(go())


def defrag_states(settings, ns: str, since: int = 0) -> list[tuple[int, dict]]:
    """(offset, defragmentation state) of every DefragmentationChanged of `ns` in balancer.events."""
    out = []
    for rec in read_records(settings.bootstrap, settings.topics.balancer_events):
        e = b.events.decode(rec.value)
        if rec.offset >= since and e.type == "DefragmentationChanged" and e.ns == ns and e.state:
            out.append((rec.offset, e.state["state"]))
    return out


def phases_in_order(states: list[dict]) -> list[str]:
    out: list[str] = []
    for st in states:
        if not out or out[-1] != st["phase"]:
            out.append(st["phase"])
    return out


def start_in_process(cl):
    from services.balancer.server import Balancer

    balancer = Balancer(cl.settings)
    task = asyncio.run_coroutine_threadsafe(balancer.run(), cl.loop)
    cl.call(async_wait_until(lambda: balancer.processor.active.is_set(), 60, "the balancer to become active"))
    return balancer, task


def test_defragmentation_runs_its_three_phases_and_leaves_fewer_chunks(cl):
    fragmented_collection(cl)
    before = len(chunks_of(cl, "d.c"))
    cl.command(c.SetSetting(key="chunkDefragmentationThrottlingMS", value=300))  # slow enough to watch
    balancer, task = start_in_process(cl)
    try:
        started = cli(cl.settings, "defragment", "d.c", "start", "--json")
        assert started.returncode == 0, started.stdout + started.stderr
        assert json.loads(started.stdout)["started"] is True
        status = json.loads(cli(cl.settings, "defragment", "d.c", "status", "--json").stdout)
        assert status["ok"] and status["currentPhase"] in PHASES[:3] and status["state"] == "running", status
        comp = json.loads(cli(cl.settings, "balancer", "collection-status", "d.c", "--json").stdout)
        assert "defragmenting" in [v["reason"] for v in comp["violations"]], comp  # not balanced meanwhile

        cl.call(
            async_wait_until(
                lambda: balancer.state.defrag_status("d.c")["state"] == "finished",
                300,
                "defragmentation of d.c to finish",
            ),
            timeout=310,
        )
        done = json.loads(cli(cl.settings, "defragment", "d.c", "status", "--json").stdout)
        assert done["currentPhase"] == "finished" and done["remainingChunksToProcess"] == 0, done
        assert done["merges"] > 0 and done["dataSizes"] > 0 and done["moves"] > 0, done
        human = cli(cl.settings, "defragment", "d.c", "status")
        assert "phase finished" in human.stdout, human.stdout + human.stderr
        seen = phases_in_order([st for _, st in defrag_states(cl.settings, "d.c")])
        assert seen[:2] == PHASES[:2] and seen[-1] == "finished" and seen == [p for p in PHASES if p in seen], seen
        assert not [a for a in balancer.state.in_flight.values() if a.secondary], "actions left in flight"
        cl.call(cl.router.follower.wait_for(balancer.follower.config_time, 30))
    finally:
        task.cancel()
    after = chunks_of(cl, "d.c")
    assert len(after) <= before // 2, f"{before} chunks before, {len(after)} after"
    for left, right in zip(after, after[1:]):  # phase 3: no two neighbours left on one shard
        assert left.shard != right.shard, [(ch.min, ch.shard) for ch in after]
    assert all_ids(cl, "d.c") == list(range(DOCS))


def test_a_balancer_killed_mid_phase_resumes_the_same_phase(cl, spawn):
    fragmented_collection(cl)
    before = len(chunks_of(cl, "d.c"))
    env = {"SHARDLOG_STATS_INTERVAL_S": "0.5"}
    first = spawn(
        cl.settings,
        "services.balancer",
        ready_name="balancer",
        env={**env, "SHARDLOG_FAULTS": "balancer.defragment_step@moveAndMergeChunks#3=kill"},
    )
    first.wait_ready(90, role="active")
    started = cli(cl.settings, "defragment", "d.c", "start", "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    wait_until(lambda: first.proc.poll() is not None, 240, "the balancer to die at the fault point")
    assert first.proc.returncode == -9, first.tail()

    recorded = defrag_states(cl.settings, "d.c")
    last_offset, last = recorded[-1]
    assert last["phase"] == "moveAndMergeChunks", f"killed in phase {last['phase']}"

    second = spawn(cl.settings, "services.balancer", ready_name="balancer", env={**env, "SHARDLOG_FAULTS": ""})
    second.wait_ready(90, role="active")
    wait_until(
        lambda: any(st["phase"] == "finished" for _, st in defrag_states(cl.settings, "d.c", last_offset + 1)),
        300,
        "the restarted balancer to finish defragmenting d.c",
    )
    resumed = [st for _, st in defrag_states(cl.settings, "d.c", last_offset + 1)]
    assert resumed[0]["phase"] == "moveAndMergeChunks", f"resumed in phase {resumed[0]['phase']}"
    seen = phases_in_order(resumed)  # (phase 3 passes unrecorded when phase 2 left nothing to merge)
    assert seen[-1] == "finished" and seen == [p for p in PHASES[1:] if p in seen], seen

    wait_until(lambda: len(chunks_of(cl, "d.c")) <= before // 2, 30, f"fewer than {before // 2} chunks in d.c")
    assert all_ids(cl, "d.c") == list(range(DOCS))


def test_the_auto_merger_merges_on_its_schedule_but_not_recently_migrated_chunks(cl):
    interval, throttle = 4, 1500
    for key, value in (
        ("autoMergerIntervalSecs", interval),
        ("autoMergerThrottlingMS", throttle),
        ("balancerRoundIntervalSecs", 0.5),
    ):
        cl.command(c.SetSetting(key=key, value=value))
    cl.command(c.CreateDatabase(db="a", primary="s0"))
    cl.command(c.ShardCollection(ns="a.c", key={"k": 1}))
    cl.command(c.SetSetting(ns="a.c", key="autoMergerEnabled", value=False))  # until the layout is ready
    cl.command(c.SplitChunk(ns="a.c", at=[{"k": i * 100} for i in range(1, 8)]))
    move(cl, "a.c", 300, 400, "s1")  # migrated just now: within minSnapshotHistoryWindowInSeconds (300 s)
    move(cl, "a.c", 400, 500, "s1")

    balancer, task = start_in_process(cl)
    try:
        first = cl.call(async_wait_until(lambda: balancer.state.auto_merged_at, 60, "the first auto-merger pass"))
        cl.command(c.SetSetting(ns="a.c", key="autoMergerEnabled", value=True))

        def layout():
            return [(ch.min["k"] if isinstance(ch.min["k"], int) else None, ch.shard) for ch in chunks_of(cl, "a.c")]

        expected = [(None, "s0"), (300, "s1"), (400, "s1"), (500, "s0")]  # s1's pair was migrated: not merged
        cl.call(async_wait_until(lambda: layout() == expected, 60, f"the auto-merger to merge a.c into {expected}"))
        merged_at = balancer.state.auto_merged_at
        cl.call(async_wait_until(lambda: balancer.state.auto_merged_at > merged_at, 60, "another auto-merger pass"))
        assert layout() == expected, "recently migrated chunks were merged"
    finally:
        task.cancel()

    merges = [
        r.timestamp / 1000
        for r in read_records(cl.settings.bootstrap, cl.settings.topics.config_commands)
        if c.commands.decode(r.value).type == "MergeChunks"
    ]
    assert len(merges) >= 2, merges
    assert merges[0] >= first + interval - 0.05, "merged before autoMergerIntervalSecs elapsed"
    assert merges[1] - merges[0] >= throttle / 1000 - 0.05, "two merges of a.c closer than autoMergerThrottlingMS"
