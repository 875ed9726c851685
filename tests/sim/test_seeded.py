"""The cluster under the seeded loop (tests/sim/loop.py): simulated time, a seed per interleaving."""

from __future__ import annotations

import time

import pytest

from schemas import config as c
from tests.sim import loop as sim
from tests.sim.cluster import SimCluster, until


@pytest.fixture(autouse=True)
def no_wire(monkeypatch):
    monkeypatch.setenv("SHARDLOG_ROUTER_PORT", "off")
    monkeypatch.setenv("SHARDLOG_METRICS", "off")


def scenario(tmp_path, seed: int):
    async def main(loop: sim.SimLoop):
        cl = SimCluster(tmp_path / f"seed-{seed}")
        try:
            await cl.start_all()
            await cl.command(c.CreateDatabase(db="db", primary="s0"))
            await cl.command(c.ShardCollection(ns="db.c", key={"k": 1}))
            await cl.command(c.SplitChunk(ns="db.c", at=[{"k": 50}]))
            async with cl.client(timeout=30) as client:
                coll = client["db"]["c"]
                await coll.insert_many([{"_id": i, "k": i} for i in range(100)])
                await cl.command(c.MoveRange(ns="db.c", min={"k": 50}, max={"k": {"$maxKey": 1}}, to="s1"))
                await until("the migration to commit", lambda: not cl.config.catalog.migrations)
                assert await coll.count_documents({}) == 100
                ids = sorted([d["_id"] async for d in coll.find({"k": {"$gte": 45, "$lt": 55}})])
                assert ids == list(range(45, 55))
            return sim.stats(loop), cl.config.catalog.collections["db.c"].chunks_per_shard()
        finally:
            await cl.stop_all()

    return main


def test_a_schedule_runs_in_simulated_time(tmp_path):
    began = time.monotonic()
    stats, chunks = sim.run(1, scenario(tmp_path, 1))
    assert chunks == {"s0": 1, "s1": 1}
    print(stats, f"{time.monotonic() - began:.2f}s real")


def test_the_same_seed_runs_the_same_schedule_and_another_seed_another(tmp_path):
    first = sim.run(7, scenario(tmp_path / "a", 7))
    again = sim.run(7, scenario(tmp_path / "b", 7))
    other = sim.run(8, scenario(tmp_path / "c", 8))
    assert first == again, "a seed is one schedule"
    assert other[0]["passes"] != first[0]["passes"] or other[0]["simulatedS"] != first[0]["simulatedS"]


@pytest.mark.parametrize("seed", range(20))
def test_many_seeds(tmp_path, seed):
    stats, chunks = sim.run(seed, scenario(tmp_path, seed))
    assert chunks == {"s0": 1, "s1": 1}, stats
