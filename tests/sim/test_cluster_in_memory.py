"""The whole cluster on the in-memory bus: the same services as on the broker, no broker."""

from __future__ import annotations

import pytest

from schemas import config as c
from tests.sim.cluster import SimCluster, until


@pytest.fixture(autouse=True)
def no_wire(monkeypatch):
    monkeypatch.setenv("SHARDLOG_ROUTER_PORT", "off")  # the router's MongoDB edge: not needed here
    monkeypatch.setenv("SHARDLOG_METRICS", "0")


async def test_a_sharded_collection_takes_writes_moves_a_range_and_reads_them_back(tmp_path):
    cl = SimCluster(tmp_path)
    try:
        await cl.start_all()
        await cl.command(c.CreateDatabase(db="db", primary="s0"))
        await cl.command(c.ShardCollection(ns="db.c", key={"k": 1}))
        await cl.command(c.SplitChunk(ns="db.c", at=[{"k": 50}]))
        async with cl.client(timeout=30) as client:
            coll = client["db"]["c"]
            await coll.insert_many([{"_id": i, "k": i} for i in range(100)])
            mid = (await cl.command(c.MoveRange(ns="db.c", min={"k": 50}, max={"k": {"$maxKey": 1}}, to="s1"))).result
            await until("the migration to commit", lambda: not cl.config.catalog.migrations)
            assert await coll.count_documents({}) == 100
            assert sorted([d["_id"] async for d in coll.find({"k": {"$gte": 45, "$lt": 55}})]) == list(range(45, 55))
            assert cl.config.catalog.collections["db.c"].chunks_per_shard() == {"s0": 1, "s1": 1}, mid
    finally:
        await cl.stop_all()
