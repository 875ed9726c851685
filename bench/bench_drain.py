"""Draining small chunks: how long `remove-shard` takes for N chunks, and how many
migrations each round ran (issue 18, point 8).

In one process (tests.conftest.InProcessCluster: config server, 4 shards, router, and
the balancer and range deleter as tasks; they still talk only through Kafka on
$KAFKA_BOOTSTRAP).  `dr.c` is split into `--chunks` chunks of 10 keys, dealt to s2 and
s3, loaded (one small document per key); then s2 and s3 are removed at once.  Shards
report statistics every SHARDLOG_STATS_INTERVAL_S (the default, 10 s, unless set).

Printed: seconds from the two RemoveShard commands to both shards gone, chunks per
second, rounds that issued migrations and the most migrations in one round, and the
same run's time against the old behaviour's estimate (a round per chunk per draining
shard, each waiting for the next periodic report: ~interval/2 on average per round,
as measured before the fix: 31 chunks in ~4.5 min with one draining shard).

    KAFKA_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python bench/bench_drain.py --chunks 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.client import AsyncCluster  # noqa: E402
from libs.service import ServiceSettings  # noqa: E402
from schemas import balancer as b  # noqa: E402
from schemas import config as c  # noqa: E402
from tests.conftest import InProcessCluster, async_wait_until, read_records  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=32)
    args = ap.parse_args()
    n = args.chunks
    interval = float(os.environ.setdefault("SHARDLOG_STATS_INTERVAL_S", "10"))
    settings = ServiceSettings(
        os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:19092"), f"bd{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp())
    )
    cl = InProcessCluster(settings, shards=("s0", "s1", "s2", "s3"))
    try:
        for key, value in (
            ("balancerRoundIntervalSecs", 10),
            ("balancerMigrationsThrottlingMs", 0),
            ("orphanCleanupDelaySecs", 0),
        ):
            cl.command(c.SetSetting(key=key, value=value))
        cl.command(c.CreateDatabase(db="dr", primary="s0"))
        cl.command(c.ShardCollection(ns="dr.c", key={"k": 1}))
        cl.command(c.SplitChunk(ns="dr.c", at=[{"k": i * 10} for i in range(1, n)]))
        for i in range(n):
            cl.command(c.MoveRange(ns="dr.c", min={"k": i * 10} if i else {"k": {"$minKey": 1}}, to=f"s{2 + i % 2}"))
            cl.call(async_wait_until(lambda: not cl.config.catalog.migrations, 60, "a set-up move"))

        async def load():
            async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as client:
                await client["dr"]["c"].insert_many([{"_id": i, "k": i} for i in range(n * 10)])

        asyncio.run(load())
        from services.balancer.server import Balancer
        from services.range_deleter.server import RangeDeleter

        tasks = [
            asyncio.run_coroutine_threadsafe(x.run(), cl.loop) for x in (Balancer(settings), RangeDeleter(settings))
        ]
        t0 = time.monotonic()
        for s in ("s2", "s3"):
            cl.command(c.RemoveShard(shard=s))
        cl.call(
            async_wait_until(lambda: not {"s2", "s3"} & set(cl.config.catalog.shards), 3600, "the drain"), timeout=3700
        )
        took = time.monotonic() - t0
        for t in tasks:
            t.cancel()
        per_round: dict[int, int] = {}
        for rec in read_records(settings.bootstrap, settings.topics.balancer_events):
            e = b.events.decode(rec.value)
            if isinstance(e, b.ActionIssued) and isinstance(e.action, b.MigrationAction):
                per_round[e.round] = per_round.get(e.round, 0) + 1
        old = n / 2 * interval / 2  # a round per chunk per draining shard, waiting ~interval/2 for a report
        print(f"drain of {n} chunks off 2 of 4 shards: {took:.1f} s ({n / took:.2f} chunks/s)")
        print(f"rounds with migrations: {len(per_round)}; most migrations in one round: {max(per_round.values())}")
        print(f"old behaviour (estimated, stats interval {interval:g} s): ~{old:.0f} s; ratio {old / took:.1f}x")
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
