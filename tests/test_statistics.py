"""Shard statistics for the balancer: per chunk, documents, data size and bytes
written since the last report.  First the counting and the computation on a
real RocksDB store (no Kafka), then end to end: a cluster whose shards publish
to `shard.stats` every half second while a client writes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from libs import kafka
from libs.service import ServiceSettings
from libs.shardkey import MAX_KEY, MIN_KEY, KeyPattern, to_ejson
from libs.store import Store
from schemas import Codec
from schemas import config as c
from schemas import shard as ev
from schemas import stats as schema
from services.config.catalog import Catalog
from services.shard.statistics import INTERVAL_ENV, CountingDocuments, StatisticsPublisher, interval_from_env
from tests.conftest import InProcessCluster

NS = "db.c"


def stored_size(doc: dict) -> int:
    return len(json.dumps(doc, separators=(",", ":")))


def written(doc: dict, pattern: KeyPattern, ns: str = NS) -> ev.DocumentWritten:
    return ev.DocumentWritten(ns=ns, skey=pattern.encode_doc(doc).hex(), doc=doc)


def removed(doc: dict, pattern: KeyPattern, ns: str = NS) -> ev.DocumentRemoved:
    return ev.DocumentRemoved(ns=ns, skey=pattern.encode_doc(doc).hex(), id=doc["_id"])


def k_catalog() -> Catalog:
    """db.c sharded on {k: 1}: [MinKey, 0) on s0, [0, 10) on s1, [10, MaxKey) on s0."""
    bounds = [{"k": MIN_KEY}, {"k": 0}, {"k": 10}, {"k": MAX_KEY}]
    chunks = [
        c.ChunkDoc(min=to_ejson(lo), max=to_ejson(hi), shard=owner, version=(1, i))
        for i, (lo, hi, owner) in enumerate(zip(bounds, bounds[1:], ["s0", "s1", "s0"]))
    ]
    cat = Catalog(track_changes=False)
    for offset, e in enumerate(
        [
            c.ShardAdded(shard="s0"),
            c.ShardAdded(shard="s1"),
            c.DatabaseCreated(db="db", primary="s0", uuid="u"),
            c.CollectionSharded(ns=NS, key={"k": 1}, unique=False, epoch="e1", uuid="u2", chunks=chunks),
        ]
    ):
        cat.apply(e, offset)
    return cat


def commit(docs: CountingDocuments, store: Store) -> None:
    """What Projection.advance does once a batch's transaction has committed."""
    store.commit(docs.drain_changes().items(), None)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "documents")
    yield s
    s.close()


def test_only_committed_writes_decided_here_are_counted(store):
    pattern = KeyPattern.parse({"k": 1})
    docs = CountingDocuments()
    docs.load(store)
    a, b = {"_id": 1, "k": 1, "p": "x" * 10}, {"_id": 2, "k": 2}
    docs.apply(written(a, pattern), -1)
    docs.apply(written(b, pattern), -1)
    assert docs.take_written() == {}, "nothing is counted before the batch commits"
    commit(docs, store)
    ka, kb = (NS, pattern.encode_doc(a)), (NS, pattern.encode_doc(b))
    assert docs.take_written() == {ka: stored_size(a), kb: stored_size(b)}
    assert docs.take_written() == {}, "taking resets"
    # An aborted batch: the projection reloads the state from the store.
    docs.apply(written({**a, "p": "y"}, pattern), -1)
    docs.load(store)
    commit(docs, store)
    assert docs.take_written() == {}
    # Replaying the changelog (catch-up, a standby following the active instance) is not writing.
    docs.apply(written({"_id": 3, "k": 3}, pattern), 7)
    commit(docs, store)
    assert docs.take_written() == {}
    # Updates count their new size; removals count nothing; a failed report gives the bytes back.
    docs.apply(written({**a, "p": "z" * 30}, pattern), -1)
    docs.apply(removed(b, pattern), -1)
    commit(docs, store)
    taken = docs.take_written()
    assert taken == {ka: stored_size({**a, "p": "z" * 30})}
    docs.give_back_written(taken)
    docs.apply(written({**a, "p": ""}, pattern), -1)
    commit(docs, store)
    assert docs.take_written() == {ka: stored_size({**a, "p": "z" * 30}) + stored_size({**a, "p": ""})}


def test_range_sizes_agree_with_scan_including_the_pending_overlay(store):
    pattern = KeyPattern.parse({"k": 1})
    docs = CountingDocuments()
    docs.load(store)
    originals = [{"_id": i, "k": i % 7, "p": "x" * i} for i in range(40)]
    for d in originals:
        docs.apply(written(d, pattern), 0)
    commit(docs, store)
    # Pending: an overwrite, a removal and a new document, not committed yet.
    docs.apply(written({**originals[3], "p": "changed"}, pattern), -1)
    docs.apply(removed(originals[4], pattern), -1)
    docs.apply(written({"_id": 100, "k": 5, "p": "new"}, pattern), -1)
    for lo, hi in [(MIN_KEY, MAX_KEY), (0, 3), (3, 5), (5, MAX_KEY), (MIN_KEY, 0), (6, 6)]:
        blo, bhi = pattern.encode_bound({"k": lo}), pattern.encode_bound({"k": hi})
        want = [stored_size(d) for _, d in docs.scan(NS, blo, bhi)]
        assert sorted(docs.range_sizes(NS, blo, bhi)) == sorted(want), (lo, hi)


def test_a_report_covers_the_owned_chunks_and_attributes_writes_to_them(store, tmp_path):
    pattern = KeyPattern.parse({"k": 1})
    docs = CountingDocuments()
    docs.load(store)
    all_docs = [{"_id": i, "k": k, "p": "x" * (i % 5)} for i, k in enumerate(range(-5, 15))]
    for d in all_docs:
        docs.apply(written(d, pattern), -1)
    docs.apply(written({"_id": "other", "k": 1}, pattern, ns="db.unsharded"), -1)
    commit(docs, store)
    cat = k_catalog()
    pub = StatisticsPublisher(ServiceSettings("unused:9092", "t", tmp_path), "s0", cat, docs, interval_s=1)
    report = asyncio.run(pub.compute(docs.take_written()))
    assert report.shard == "s0" and report.configTime == cat.config_time == 4
    low = [d for d in all_docs if d["k"] < 0]
    high = [d for d in all_docs if d["k"] >= 10]
    rows = [(ch.min, ch.max, ch.documents, ch.dataSizeBytes, ch.bytesWrittenSinceLastReport) for ch in report.chunks]
    assert rows == [
        ({"k": {"$minKey": 1}}, {"k": 0}, 5, sum(map(stored_size, low)), sum(map(stored_size, low))),
        ({"k": 10}, {"k": {"$maxKey": 1}}, 5, sum(map(stored_size, high)), sum(map(stored_size, high))),
    ], "s1's chunk [0, 10) is not s0's to report, nor are writes into it or into unsharded collections"
    (coll,) = report.collections
    assert (coll.ns, coll.epoch, coll.chunks, coll.documents) == (NS, "e1", 2, 10)
    assert coll.dataSizeBytes == coll.bytesWrittenSinceLastReport == sum(map(stored_size, low + high))
    again = asyncio.run(pub.compute(docs.take_written()))
    assert [ch.bytesWrittenSinceLastReport for ch in again.chunks] == [0, 0]
    assert [ch.documents for ch in again.chunks] == [5, 5]
    assert schema.statistics.decode(Codec.encode(report)) == report


def test_a_long_scan_lets_the_event_loop_run(store, tmp_path):
    from services.shard.statistics import YIELD_EVERY

    pattern = KeyPattern.parse({"k": 1})
    docs = CountingDocuments()
    docs.load(store)
    for i in range(3 * YIELD_EVERY):
        docs.apply(written({"_id": i, "k": -i - 1}, pattern), 0)  # all in s0's chunk [MinKey, 0)
    commit(docs, store)
    pub = StatisticsPublisher(ServiceSettings("unused:9092", "t", tmp_path), "s0", k_catalog(), docs, interval_s=1)

    async def go():
        ticks = 0
        done = False

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        start = ticks
        report = await pub.compute({})
        done = True
        await t
        return report, ticks - start

    report, ticks = asyncio.run(go())
    assert report.chunks[0].documents == 3 * YIELD_EVERY
    assert ticks >= 3, "the scan yields to the event loop every few thousand documents"


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_from_env() == 10.0
    monkeypatch.setenv(INTERVAL_ENV, "0.25")
    assert interval_from_env() == 0.25
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=INTERVAL_ENV):
            interval_from_env()


# ------------------------------------------------------------------ end to end

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
