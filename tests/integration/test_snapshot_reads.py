"""Snapshot reads through the wire against a real broker (issue 32): pymongo's snapshot session
reads every shard at the time of its first read, so writes made after it are not seen, even on
a range that moved meanwhile; `atClusterTime` reads the past; bad read concerns get MongoDB's
errors."""

from __future__ import annotations

import json

import pytest
from bson import MinKey, Timestamp
from pymongo.errors import OperationFailure

from domain.clock import LogicalTime
from schemas import config as c
from tests.conftest import cli, read_records
from tests.integration.test_data_path import client_run

pytestmark = pytest.mark.kafka


def test_a_snapshot_session_ignores_later_writes_on_every_shard_even_after_a_migration(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.acct", key={"k": 1}))
    client = data_cluster.mongo_client()
    admin, coll = client.admin, client.app.acct
    admin.command("split", "app.acct", middle={"k": 100})
    admin.command("moveRange", "app.acct", min={"k": 100}, toShard="s1")
    coll.insert_many([{"_id": k, "k": k, "v": 0} for k in (1, 2, 150, 151)])

    with client.start_session(snapshot=True) as session:
        first = list(coll.find({}, session=session).sort("k", 1))
        assert [d["k"] for d in first] == [1, 2, 150, 151]
        coll.update_many({}, {"$set": {"v": 1}})
        coll.insert_one({"_id": 3, "k": 3, "v": 1})
        coll.delete_one({"k": 151})
        # The range holding k=1, 2 moves to s2: its documents at the snapshot are read on s0, the
        # owner at that time, after its orphans are gone from the latest state there.
        admin.command("moveRange", "app.acct", min={"k": MinKey()}, max={"k": 100}, toShard="s2")
        again = list(coll.find({}, session=session).sort("k", 1))
        assert again == first, "a snapshot session reads every shard at the time of its first read"
        assert coll.distinct("v", session=session) == [0]
        summed = list(
            coll.aggregate([{"$group": {"_id": None, "n": {"$sum": 1}, "v": {"$sum": "$v"}}}], session=session)
        )
        assert [(g["n"], g["v"]) for g in summed] == [(4, 0)]
    with client.start_session(snapshot=True) as session:  # its first read an aggregate: the time comes back
        pipeline = [{"$match": {"k": {"$gte": 100}}}, {"$project": {"_id": 0, "k": 1, "v": 1}}]
        seen = list(coll.aggregate(pipeline, session=session))
        coll.update_many({}, {"$set": {"v": 2}})
        assert list(coll.aggregate(pipeline, session=session)) == seen == [{"k": 150, "v": 1}]
        assert coll.distinct("v", session=session) == [1]
    now = list(coll.find({}).sort("k", 1))
    assert [(d["k"], d["v"]) for d in now] == [(1, 2), (2, 2), (3, 2), (150, 2)]
    # The chunk's placement history, newest first, as config.chunks and `shardlog status` show it.
    low = client.config.chunks.find_one({"min": {"k": MinKey()}})
    assert [h["shard"] for h in low["history"]] == ["s2", "s0"], low
    assert low["onCurrentShardSince"] == low["history"][0]["validAfter"] > low["history"][1]["validAfter"]
    status = json.loads(cli(data_cluster.settings, "status", "--verbose", "--json").stdout)
    acct = next(x for x in status["collections"] if x["ns"] == "app.acct")
    high = next(ch for ch in acct["chunks"] if ch["min"] == {"k": 100})
    assert [h["shard"] for h in high["history"]] == ["s1", "s0"]


def test_a_read_at_a_cluster_time_sees_the_past_and_names_its_time(data_cluster):
    client = data_cluster.mongo_client()
    db = client.app
    db.plain.insert_one({"_id": 1, "v": "old"})
    before = client.admin.command("ping")["$clusterTime"]["clusterTime"]
    db.plain.update_one({"_id": 1}, {"$set": {"v": "new"}})
    reply = db.command("find", "plain", filter={}, readConcern={"level": "snapshot", "atClusterTime": before})
    assert reply["cursor"]["firstBatch"] == [{"_id": 1, "v": "old"}]
    assert reply["cursor"]["atClusterTime"] == before
    latest = db.command("find", "plain", filter={}, readConcern={"level": "snapshot"})
    assert latest["cursor"]["firstBatch"] == [{"_id": 1, "v": "new"}]
    assert latest["cursor"]["atClusterTime"] >= before


def test_a_read_ahead_of_a_shards_log_writes_mongodbs_noop_to_its_changelog(data_cluster):
    client = data_cluster.mongo_client()
    client.app.idle.insert_one({"_id": 1, "v": 0})
    primary = data_cluster.config.catalog.databases["app"].primary
    other = next(sid for sid in data_cluster.shards if sid != primary)
    data_cluster.command(c.CreateDatabase(db="busy", primary=other))
    client.busy.c.insert_one({"_id": 1})  # the cluster's time moves past the idle shard's last write
    at = client.admin.command("ping")["$clusterTime"]["clusterTime"]
    rc = {"level": "snapshot", "atClusterTime": at}
    for _ in range(2):  # the second read at the same time finds it covered: no second no-op
        reply = client.app.command("find", "idle", filter={}, readConcern=rc)
        assert reply["cursor"]["firstBatch"] == [{"_id": 1, "v": 0}]
    changelog = data_cluster.settings.topics.shard_changelog(primary)
    noops = [
        json.loads(r.value)
        for r in read_records(data_cluster.settings.bootstrap, changelog)
        if r.value is not None and json.loads(r.value)["type"] == "NoopWritten"
    ]
    assert len(noops) == 1 and noops[0]["ts"] > LogicalTime(at.time, at.inc).packed, noops


@pytest.mark.parametrize(
    "read_concern, code",
    [
        ({"level": "snapshot", "atClusterTime": Timestamp(4_000_000_000, 1)}, 72),  # in the future
        ({"level": "snapshot", "atClusterTime": "yesterday"}, 14),
        ({"level": "local", "atClusterTime": Timestamp(1, 1)}, 72),
        ({"level": "snapshot", "atClusterTime": Timestamp(1, 1), "afterClusterTime": Timestamp(1, 1)}, 72),
    ],
)
def test_a_bad_snapshot_read_gets_mongodbs_error_and_changes_nothing(data_cluster, read_concern, code):
    client = data_cluster.mongo_client()
    db = client.app
    db.plain.insert_one({"_id": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("find", "plain", filter={}, readConcern=read_concern)
    assert e.value.code == code, e.value.details
    with pytest.raises(OperationFailure) as e:
        db.command("count", "plain", readConcern={"level": "snapshot"})
    assert e.value.code == 72
    assert list(db.plain.find({})) == [{"_id": 1}]


def test_a_read_before_a_collections_routing_history_is_stale_chunk_history(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.sharded", key={"k": 1}))
    db = data_cluster.mongo_client().app
    db.sharded.insert_one({"_id": 1, "k": 1})
    with pytest.raises(OperationFailure) as e:
        db.command("find", "sharded", filter={}, readConcern={"level": "snapshot", "atClusterTime": Timestamp(1, 1)})
    assert e.value.code == 250 and "older than the first available history" in str(e.value)


def test_the_client_library_and_the_cli_read_at_a_cluster_time(data_cluster):
    async def go(cl):
        coll = cl["app"]["lib"]
        await coll.insert_many([{"_id": i, "v": 0} for i in range(3)])
        session = cl.start_session(snapshot=True)
        assert [d["v"] async for d in coll.find({}, sort={"_id": 1}, session=session)] == [0, 0, 0]
        at = session.snapshot_time
        assert at is not None
        await coll.update_many({}, {"$set": {"v": 1}})
        assert [d["v"] async for d in coll.find({}, session=session)] == [0, 0, 0]
        assert [d["v"] async for d in coll.find({}, at_cluster_time=at)] == [0, 0, 0]
        assert [d["v"] async for d in coll.find({})] == [1, 1, 1]
        return at

    at = client_run(data_cluster, go)
    when = f"{at >> 32},{at & 0xFFFFFFFF}"
    out = cli(data_cluster.settings, "find", "app.lib", "{}", "--at-cluster-time", when, "--json")
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert [d["v"] for d in reply["docs"]] == [0, 0, 0]
    assert reply["atClusterTime"] == {"t": at >> 32, "i": at & 0xFFFFFFFF}
    now = json.loads(cli(data_cluster.settings, "find", "app.lib", "{}", "--snapshot", "--json").stdout)
    assert [d["v"] for d in now["docs"]] == [1, 1, 1] and now["atClusterTime"]["t"] >= at >> 32
    bad = cli(data_cluster.settings, "find", "app.lib", "{}", "--at-cluster-time", "soon")
    assert bad.returncode != 0 and "BadValue" in bad.stderr


def test_every_snapshot_read_names_its_time_and_the_config_database_refuses_one(data_cluster):
    client = data_cluster.mongo_client()
    db = client.app
    db.named.insert_many([{"_id": i, "v": i % 2} for i in range(4)])
    after = client.admin.command("ping")["$clusterTime"]["clusterTime"]
    causal = {"level": "snapshot", "afterClusterTime": after}  # what a causal session's snapshot sends
    agg = db.command("aggregate", "named", pipeline=[{"$match": {"v": 1}}], cursor={}, readConcern=causal)
    assert agg["cursor"]["atClusterTime"] >= after and len(agg["cursor"]["firstBatch"]) == 2
    dist = db.command("distinct", "named", key="v", readConcern=causal)
    assert dist["atClusterTime"] >= after and sorted(dist["values"]) == [0, 1]
    # batchSize 0: the documents wait in the router, read at the time the reply names
    empty = db.command("find", "named", filter={}, batchSize=0, readConcern={"level": "snapshot"})
    assert empty["cursor"]["firstBatch"] == [] and empty["cursor"]["atClusterTime"] >= after
    more = db.command("getMore", empty["cursor"]["id"], collection="named")
    assert len(more["cursor"]["nextBatch"]) == 4
    # The config database is the router's catalog as it is now: refused, not answered as if past.
    snapshot = {"level": "snapshot"}
    for command, args in [
        ("find", {"filter": {}}),
        ("aggregate", {"pipeline": [], "cursor": {}}),
        ("distinct", {"key": "_id"}),
        ("count", {}),
    ]:
        with pytest.raises(OperationFailure) as e:
            client.config.command(command, "chunks", readConcern=snapshot, **args)
        assert e.value.code == 72, (command, e.value.details)
