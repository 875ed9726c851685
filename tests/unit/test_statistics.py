"""Shard statistics for the balancer: per chunk, documents, data size and bytes written
since the last report; the counting and the computation on a real RocksDB store (no Kafka).
The end-to-end publication is tests/integration/test_statistics_service.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from domain.catalog import Catalog
from domain.shardkey import MAX_KEY, MIN_KEY, KeyPattern, to_ejson
from libs.service import ServiceSettings
from libs.store import Store
from schemas import Codec
from schemas import config as c
from schemas import shard as ev
from schemas import stats as schema
from services.shard.statistics import INTERVAL_ENV, CountingDocuments, StatisticsPublisher, interval_from_env

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
