"""Shard statistics end to end: a cluster whose shards publish to `shard.stats` every half
second while a client writes, read back as the balancer reads them."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from domain.shardkey import to_ejson
from libs import kafka
from schemas import config as c
from schemas import stats as schema
from services.shard.statistics import INTERVAL_ENV
from tests.conftest import InProcessCluster

# ------------------------------------------------------------------ end to end


def stored_size(doc: dict) -> int:
    return len(json.dumps(doc, separators=(",", ":")))


INTERVAL_S = 0.5
APP = "app.st"


@pytest.fixture
def stats_cluster(settings, monkeypatch):
    """The in-process cluster, its shards reporting every INTERVAL_S (read when they are built)."""
    monkeypatch.setenv(INTERVAL_ENV, str(INTERVAL_S))
    cl = InProcessCluster(settings)
    yield cl
    cl.stop()


class StatsReader:
    """Every report on `shard.stats`, read_committed from offset 0, in order."""

    def __init__(self, settings):
        self.settings = settings
        self.reports: list[schema.ShardStatistics] = []
        self.consumer = None

    async def __aenter__(self):
        from aiokafka import TopicPartition

        self.tp = TopicPartition(self.settings.topics.shard_stats, 0)
        self.consumer = kafka.consumer(self.settings.bootstrap)
        await self.consumer.start()
        self.consumer.assign([self.tp])
        self.consumer.seek(self.tp, 0)
        return self

    async def __aexit__(self, *exc):
        await self.consumer.stop()

    async def poll(self) -> None:
        batch = await self.consumer.getmany(self.tp, timeout_ms=200)
        for r in batch.get(self.tp, []):
            report = schema.statistics.decode(r.value)
            assert r.key == report.shard.encode(), "reports are keyed by shard id"
            self.reports.append(report)

    async def until(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            await self.poll()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                latest = {sid: _summary(r) for sid, r in self.latest().items()}
                pytest.fail(
                    f"timed out after {timeout:g}s waiting for {what}; {len(self.reports)} reports, "
                    f"latest per shard: {latest}"
                )

    def latest(self, since: int = 0) -> dict[str, schema.ShardStatistics]:
        out = {}
        for r in self.reports[since:]:
            out[r.shard] = r
        return out


def _coll(report: schema.ShardStatistics, ns: str = APP) -> schema.CollectionStatistics | None:
    return next((x for x in report.collections if x.ns == ns), None)


def _summary(r: schema.ShardStatistics) -> dict:
    x = _coll(r)
    return {
        "configTime": r.configTime,
        "chunks": x and x.chunks,
        "documents": x and x.documents,
        "written": x and x.bytesWrittenSinceLastReport,
    }


def _written(r: schema.ShardStatistics) -> int:
    return sum(ch.bytesWrittenSinceLastReport for ch in r.chunks if ch.ns == APP)


def client_run(cluster, fn):
    from libs.client import AsyncCluster

    async def go():
        async with AsyncCluster(cluster.settings.bootstrap, cluster.settings.cluster, timeout=60) as cl:
            return await fn(cl)

    return asyncio.run(go())


def shard_scan(cluster) -> dict[tuple[str, str], tuple[int, int]]:
    """(shard, min bound as JSON) -> (documents, data size), straight from each shard's store."""

    async def scan():
        out = {}
        for sid, s in cluster.shards.items():
            for ch in s.follower.catalog.collections[APP].chunks:
                if ch.shard == sid:
                    docs = [d for _, d in s.documents.scan(APP, ch.min_key, ch.max_key)]
                    out[(sid, json.dumps(to_ejson(ch.min)))] = (len(docs), sum(map(stored_size, docs)))
        return out

    return cluster.call(scan())


def reported(latest: dict[str, schema.ShardStatistics]) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        (sid, json.dumps(ch.min)): (ch.documents, ch.dataSizeBytes)
        for sid, r in latest.items()
        for ch in r.chunks
        if ch.ns == APP
    }


@pytest.mark.kafka
def test_shards_publish_chunk_statistics_for_the_balancer(stats_cluster):
    cluster = stats_cluster
    shards = set(cluster.shards)
    n = 240
    docs = [{"_id": i, "p": "x" * (i % 50)} for i in range(n)]
    total = sum(map(stored_size, docs))

    async def go():
        async with StatsReader(cluster.settings) as reader:
            # Each shard reports as soon as it serves, before anything exists.
            await reader.until(lambda: set(reader.latest()) == shards, 30, "a first report from every shard")
            sharded = await asyncio.to_thread(cluster.command, c.ShardCollection(ns=APP, key={"_id": "hashed"}))
            await asyncio.to_thread(client_run, cluster, lambda cl: cl["app"]["st"].insert_many(docs))
            counted = await asyncio.to_thread(client_run, cluster, lambda cl: cl["app"]["st"].count_documents({}))
            assert counted == n

            def all_reported():
                latest = reader.latest()
                colls = {sid: _coll(r) for sid, r in latest.items() if r.configTime >= sharded.configTime}
                if set(colls) != shards or any(x is None for x in colls.values()):
                    return False
                if sum(x.documents for x in colls.values()) != n:
                    return False
                # Every byte inserted has been reported as written, once.
                return sum(_written(r) for r in reader.reports) == total

            await reader.until(all_reported, 60, f"reports counting {n} documents and {total} bytes written")
            latest = reader.latest()
            catalog = cluster.config.catalog.collections[APP]
            for sid, r in latest.items():
                own = [ch for ch in r.chunks if ch.ns == APP]
                assert _coll(r).chunks == catalog.chunks_per_shard()[sid] == len(own)
            assert reported(latest) == await asyncio.to_thread(shard_scan, cluster), (
                "per-chunk counts and sizes are those of the shards' stores"
            )
            assert sum(ch.dataSizeBytes for r in latest.values() for ch in r.chunks) == total
            for sid in shards:
                mine = [r for r in reader.reports if r.shard == sid]
                assert sum(map(_written, mine)) == _coll(latest[sid]).dataSizeBytes, (
                    f"{sid}: bytes written over its reports == the size of what it holds"
                )
                assert any(_written(r) > 0 for r in mine)

            # Nothing written: a later report of every shard shows no bytes written, same counts.
            mark = len(reader.reports)
            await reader.until(
                lambda: (
                    set(reader.latest(mark)) == shards and all(_written(r) == 0 for r in reader.latest(mark).values())
                ),
                30,
                "a report with nothing written from every shard",
            )
            assert reported(reader.latest(mark)) == reported(latest)

            # Updates are written bytes too: the new size of each updated document.
            mark = len(reader.reports)
            pad = "y" * 100
            res = await asyncio.to_thread(
                client_run, cluster, lambda cl: cl["app"]["st"].update_many({"_id": {"$lt": 30}}, {"$set": {"p": pad}})
            )
            assert res["modified"] == 30
            rewritten = sum(stored_size({"_id": i, "p": pad}) for i in range(30))
            new_total = total - sum(map(stored_size, docs[:30])) + rewritten
            await reader.until(
                lambda: (
                    sum(_written(r) for r in reader.reports[mark:]) == rewritten
                    and set(reader.latest(mark)) == shards
                    and sum(_coll(r).dataSizeBytes for r in reader.latest(mark).values()) == new_total
                ),
                30,
                f"{rewritten} bytes rewritten to be reported",
            )
            assert sum(_written(r) for r in reader.reports[mark:]) == rewritten
            return reader.reports

    reports = asyncio.run(go())
    assert {r.shard for r in reports} == shards
    assert all(r.windowSeconds >= 0 for r in reports)
    for sid in shards:  # ConfigTime never goes backwards in one shard's reports
        times = [r.configTime for r in reports if r.shard == sid]
        assert times == sorted(times)
