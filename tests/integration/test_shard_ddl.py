"""A DDL coordinator's requests sent to a real shard against a real broker: the critical
section refuses CRUD until the exit, a drop empties the store and leaves one uniquely keyed
record in the changelog, a rename moves documents (docs/reference/ddl.md, "On the shards")."""

from __future__ import annotations

import asyncio

import pytest

from libs.requests import Requester
from schemas import config as c
from schemas import ddl as d
from schemas import shard as s
from tests.conftest import read_records, wait_until

pytestmark = pytest.mark.kafka

DDL = "ddl-it-1"


def ask(cl, sid: str, req):
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(cl.settings.topics.shard_requests(sid), req, timeout=30)

    return cl.call(go())


def stored_keys(cl, sid: str, prefix: bytes) -> list[bytes]:
    """The keys the shard's RocksDB store holds under `prefix` (read on the shard's own loop)."""

    async def go():
        return [k for k, _ in cl.shards[sid].documents.store.scan(prefix)]

    return cl.call(go())


def changelog(cl, sid: str) -> list[tuple[bytes, object]]:
    return [
        (r.key, s.changelog.decode(r.value))
        for r in read_records(cl.settings.bootstrap, cl.settings.topics.shard_changelog(sid))
        if r.value is not None
    ]


def test_a_shard_serves_a_ddl_coordinators_requests(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="q", primary="s0"))
    cl.command(c.CreateCollection(ns="q.u"))
    cl.command(c.CreateCollection(ns="q.v"))
    client = cl.mongo_client()
    client["q"]["u"].insert_many([{"_id": i, "x": i} for i in range(30)])
    client["q"]["v"].insert_many([{"_id": i, "y": i} for i in range(5)])
    routing = s.Routing(configTime=cl.router.follower.config_time)

    rep = ask(cl, "s0", d.EnterDDLCriticalSection(id=DDL, namespaces=["q.u"]))
    assert rep.ok and rep.result["critical"] is True, rep
    held = ask(cl, "s0", s.Count(ns="q.u", filter={}, routing=routing))
    assert (held.ok, held.code, held.result["critical"]) == (False, "StaleConfig", True), held
    assert ask(cl, "s0", s.Count(ns="q.v", filter={}, routing=routing)).result == {"n": 5}

    rep = ask(cl, "s0", d.DropLocalData(id=DDL, ns="q.u"))
    assert rep.ok and rep.result["dropped"] is True, rep
    assert ask(cl, "s0", d.DropLocalData(id=DDL, ns="q.u")).ok  # a retry
    assert stored_keys(cl, "s0", b"d/q.u\x00") == [] and stored_keys(cl, "s0", b"i/q.u\x00") == []
    assert len(stored_keys(cl, "s0", b"d/q.v\x00")) == 5
    drops = [(k, e) for k, e in changelog(cl, "s0") if isinstance(e, d.LocalDataDropped)]
    assert drops == [(f"drop/{DDL}/q.u".encode(), d.LocalDataDropped(id=DDL, ns="q.u", ts=drops[0][1].ts))]

    rep = ask(cl, "s0", d.ExitDDLCriticalSection(id=DDL))
    assert rep.ok and rep.result["critical"] is False, rep
    assert client["q"]["u"].count_documents({}) == 0
    client["q"]["u"].insert_one({"_id": 1, "x": "after"})
    assert client["q"]["u"].find_one({"_id": 1}) == {"_id": 1, "x": "after"}

    events = [e for _, e in changelog(cl, "s0")]
    assert [e.type for e in events if e.type.startswith("DDLCriticalSection")] == [
        "DDLCriticalSectionRecorded",
        "DDLCriticalSectionRemoved",
    ]


def config_ask(cl, req):
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(cl.settings.topics.config_commands, req, timeout=30)

    return cl.call(go())


def finished(cl, ddl_id: str, timeout: float = 120) -> dict:
    """GetDDL until the coordinator is done; the router and shards then see its catalog."""

    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            while True:
                rep = await r.request(cl.settings.topics.config_commands, d.GetDDL(id=ddl_id), timeout=30)
                assert rep.ok, rep
                if rep.result["state"] == "done":
                    await cl.router.follower.wait_for(rep.configTime or 0, 30)
                    return rep.result
                await asyncio.sleep(0.1)

    return cl.call(asyncio.wait_for(go(), timeout))


def test_a_renamed_sharded_collection_keeps_its_documents_and_its_orphans_go(data_cluster):
    """End to end through the config server's coordinator: s0 keeps orphans of a range moved
    to s1 (the cleanup delay has not passed); the rename moves what each shard owns and drops
    the orphans with their range-deletion task."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="r", primary="s0"))
    cl.command(c.ShardCollection(ns="r.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="r.c", at=[{"k": 100}]))
    client = cl.mongo_client()
    client["r"]["c"].insert_many([{"_id": i, "k": i} for i in range(200)])
    mid = cl.command(c.MoveRange(ns="r.c", min={"k": 100}, max={"k": {"$maxKey": 1}}, to="s1")).result["id"]
    wait_until(lambda: config_ask(cl, c.GetMigration(id=mid)).result["state"] == "committed", 90, "the move")
    assert len(stored_keys(cl, "s0", b"d/r.c\x00")) == 200  # 100 of them orphans now

    started = config_ask(cl, d.RenameCollection(ns="r.c", to="r.d"))
    assert started.ok and started.result["started"] is True, started
    result = finished(cl, started.result["id"])
    assert result["ok"] is True, result

    assert client["r"]["d"].count_documents({}) == 200 and client["r"]["c"].count_documents({}) == 0
    assert client["r"]["d"].find_one({"k": 150}) == {"_id": 150, "k": 150}
    assert stored_keys(cl, "s0", b"d/r.c\x00") == stored_keys(cl, "s1", b"d/r.c\x00") == []
    assert (len(stored_keys(cl, "s0", b"d/r.d\x00")), len(stored_keys(cl, "s1", b"d/r.d\x00"))) == (100, 100)
    for sid in ("s0", "s1"):
        assert cl.call(_ddl_state(cl, sid)) == ([], [], []), sid  # no task, section or drop left


async def _ddl_state(cl, sid: str) -> tuple[list, list, list]:
    docs = cl.shards[sid].documents
    return list(docs.range_tasks), list(docs.ddl_sections), list(docs.ddl_drops)


def test_a_refined_key_rekeys_every_document_where_it_lives(data_cluster):
    """End to end: documents with and without the new field (null in the key) are rewritten
    under the refined key on both shards; targeted reads on the new key find them."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="f", primary="s0"))
    cl.command(c.ShardCollection(ns="f.c", key={"k": 1}))
    cl.command(c.SplitChunk(ns="f.c", at=[{"k": 50}]))
    mid = cl.command(c.MoveRange(ns="f.c", min={"k": 50}, max={"k": {"$maxKey": 1}}, to="s1")).result["id"]
    wait_until(lambda: config_ask(cl, c.GetMigration(id=mid)).result["state"] == "committed", 90, "the move")
    client = cl.mongo_client()
    client["f"]["c"].insert_many([{"_id": i, "k": i, **({"j": i % 4} if i % 2 else {})} for i in range(100)])

    started = config_ask(cl, d.RefineCollectionShardKey(ns="f.c", key={"k": 1, "j": 1}))
    assert started.ok and started.result["started"] is True, started
    assert finished(cl, started.result["id"])["ok"] is True

    coll = client["f"]["c"]
    assert coll.count_documents({}) == 100
    assert coll.find_one({"k": 7, "j": 3}) == {"_id": 7, "k": 7, "j": 3}
    assert coll.find_one({"k": 8, "j": None}) == {"_id": 8, "k": 8}
    for sid, n in (("s0", 50), ("s1", 50)):
        keys = stored_keys(cl, sid, b"d/f.c\x00")
        assert len(keys) == n, sid  # one key per document: no copy left under its old key


def test_a_dropped_database_leaves_nothing_on_any_shard_and_can_be_created_again(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="g", primary="s1"))
    cl.command(c.ShardCollection(ns="g.c", key={"k": "hashed"}))
    cl.command(c.CreateCollection(ns="g.u"))
    client = cl.mongo_client()
    client["g"]["c"].insert_many([{"_id": i, "k": i} for i in range(60)])
    client["g"]["u"].insert_many([{"_id": i} for i in range(10)])
    assert sum(len(stored_keys(cl, sid, b"d/g.")) for sid in cl.shards) == 70

    started = config_ask(cl, d.DropDatabase(db="g"))
    assert started.ok, started
    result = finished(cl, started.result["id"])
    assert result["ok"] is True and result["result"]["dropped"] is True, result
    for sid in cl.shards:
        assert stored_keys(cl, sid, b"d/g.") == stored_keys(cl, sid, b"i/g.") == [], sid
        drops = [k for k, e in changelog(cl, sid) if isinstance(e, d.LocalDataDropped)]
        assert drops == [f"drop/{started.result['id']}/g".encode()], sid
    client["g"]["u"].insert_one({"_id": 1, "again": True})
    assert list(client["g"]["u"].find()) == [{"_id": 1, "again": True}]
