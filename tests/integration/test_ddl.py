"""DDL coordinators against a real broker (issue 13, section 2; decision 0018): dropCollection,
dropDatabase, renameCollection and refineCollectionShardKey on a cluster of a config server,
three shards and a router, with documents on every shard, and what a client sees while they run.

What each shard holds is read from its own store (orphans included), not through the router;
what the catalog holds from the config server's catalog.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from libs.client import AsyncCluster, ShardlogError
from libs.requests import Requester
from schemas import config as c
from schemas import ddl as d
from schemas import shard as s
from tests.conftest import read_events, wait_until

pytestmark = pytest.mark.kafka

MINK, MAXK = {"$minKey": 1}, {"$maxKey": 1}
SHARDS = ("s0", "s1", "s2")
DOCS = 300
# What a client may see while a DDL runs: the router gave up waiting on a critical section, or
# the collection it wrote to went away; never a silent loss.
RETRIABLE = {"StaleConfig", "ConflictingOperationInProgress", "NamespaceNotFound", "Timeout"}


# ------------------------------------------------------------------ helpers


def ask(cl, topic: str, req, timeout: float = 30):
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            return await r.request(topic, req, timeout=timeout)

    return cl.call(go())


def config(cl, req):
    return ask(cl, cl.settings.topics.config_commands, req)


def start(cl, cmd) -> dict:
    """Start a DDL; its reply (a coordinator id, or a no-op)."""
    reply = config(cl, cmd)
    assert reply.ok, reply
    return dict(reply.result)


def finished(cl, ddl_id: str, timeout: float = 120) -> dict:
    """GetDDL until the coordinator is done; the router and the shards then know its catalog."""

    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            while True:
                rep = await r.request(cl.settings.topics.config_commands, d.GetDDL(id=ddl_id), timeout=30)
                assert rep.ok, rep
                if rep.result["state"] == "done":
                    await cl.router.follower.wait_for(rep.configTime or 0, 30)
                    for sh in cl.shards.values():
                        await sh.follower.wait_for(rep.configTime or 0, 30)
                    return dict(rep.result)
                await asyncio.sleep(0.05)

    return cl.call(asyncio.wait_for(go(), timeout))


def run_ddl(cl, cmd) -> dict:
    started = start(cl, cmd)
    assert started["started"] is True and started["joined"] is False, started
    result = finished(cl, started["id"])
    assert result["ok"] is True, result
    return result


def held(cl, sid: str, ns: str) -> set:
    """Every _id the shard's store holds for `ns` (orphans included), read on the shard's loop."""

    async def go():
        return {doc["_id"] for _, doc in cl.shards[sid].documents.scan(ns)}

    return cl.call(go())


def holdings(cl, ns: str) -> dict[str, set]:
    return {sid: held(cl, sid, ns) for sid in SHARDS}


def client(cl, fn, timeout: float = 60):
    async def go():
        async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=timeout) as ac:
            return await fn(ac)

    return asyncio.run(go())


def coll(ac: AsyncCluster, ns: str):
    db, name = ns.split(".", 1)
    return ac[db][name]


def find_all(cl, ns: str, filter: dict | None = None) -> list[dict]:
    return client(cl, lambda ac: coll(ac, ns).find(filter or {}).to_list())


def catalog(cl):
    return cl.config.catalog


def n_events(cl) -> int:
    return len(read_events(cl.settings.bootstrap, cl.settings.topics.config_events))


def move(cl, ns: str, lo: dict, hi: dict, to: str) -> None:
    mid = cl.command(c.MoveRange(ns=ns, min=lo, max=hi, to=to)).result["id"]
    wait_until(lambda: config(cl, c.GetMigration(id=mid)).result["state"] != "active", 90, f"the move to {to}")
    assert config(cl, c.GetMigration(id=mid)).result["state"] == "committed"


def spread(cl, ns: str, key: str = "k", primary: str = "s0", extra=lambda i: {}) -> None:
    """A collection sharded on `key` with DOCS documents, a third on each shard (s0 keeps the
    moved ranges' orphans: the cleanup delay has not passed)."""
    db = ns.split(".")[0]
    if db not in catalog(cl).databases:
        cl.command(c.CreateDatabase(db=db, primary=primary))
    cl.command(c.ShardCollection(ns=ns, key={key: 1}))
    cl.command(c.SplitChunk(ns=ns, at=[{key: 100}, {key: 200}]))
    client(cl, lambda ac: coll(ac, ns).insert_many([{"_id": i, key: i, **extra(i)} for i in range(DOCS)]))
    move(cl, ns, {key: 100}, {key: 200}, "s1")
    move(cl, ns, {key: 200}, {key: MAXK}, "s2")
    cl.call(cl.router.follower.wait_for(catalog(cl).config_time, 30))
    h = holdings(cl, ns)
    assert h["s1"] == set(range(100, 200)) and h["s2"] == set(range(200, DOCS)), "the ranges did not move"
    assert h["s0"] >= set(range(100)), h["s0"]


def unsharded(cl, ns: str, n: int = 20, primary: str = "s0") -> None:
    db = ns.split(".")[0]
    if db not in catalog(cl).databases:
        cl.command(c.CreateDatabase(db=db, primary=primary))
    client(cl, lambda ac: coll(ac, ns).insert_many([{"_id": i, "u": i} for i in range(n)]))
    assert held(cl, catalog(cl).databases[db].primary, ns) == set(range(n))


def no_ddl_state_left(cl) -> None:
    """No coordinator running, no critical section, drop or range task left of it on a shard."""
    assert config(cl, d.GetDDL()).result["running"] == []

    async def left(sid: str):
        docs = cl.shards[sid].documents
        return list(docs.ddl_sections), list(docs.ddl_drops)

    for sid in SHARDS:
        assert cl.call(left(sid)) == ([], []), sid


# ------------------------------------------------------------------ drop


def test_drop_a_sharded_collection_spread_over_three_shards(data_cluster):
    cl = data_cluster
    spread(cl, "dc.c")
    old = catalog(cl).collections["dc.c"]
    old_routing = {
        sid: s.Routing(configTime=cl.router.follower.config_time, epoch=old.epoch, version=old.shard_version(sid).pair)
        for sid in SHARDS
    }

    result = run_ddl(cl, d.DropCollection(ns="dc.c"))
    assert result["result"] == {"ns": "dc.c", "dropped": True}
    assert holdings(cl, "dc.c") == {sid: set() for sid in SHARDS}  # orphans on s0 too
    assert "dc.c" not in catalog(cl).collections and catalog(cl).uuid_of("dc.c") is None
    assert find_all(cl, "dc.c") == []
    no_ddl_state_left(cl)

    # A router still routing by the old catalog: every shard refuses it (StaleConfig), nothing written.
    for sid in SHARDS:
        rep = ask(
            cl,
            cl.settings.topics.shard_requests(sid),
            s.Insert(ns="dc.c", docs=[{"_id": 7, "k": 7}], routing=old_routing[sid]),
        )
        assert (rep.ok, rep.code) == (False, "StaleConfig"), (sid, rep)
    assert holdings(cl, "dc.c") == {sid: set() for sid in SHARDS}

    # Written again: a new, unsharded collection on the primary, with a new uuid; the old documents stay gone.
    client(cl, lambda ac: coll(ac, "dc.c").insert_one({"_id": 1000, "k": 5}))
    assert "dc.c" not in catalog(cl).collections
    assert catalog(cl).uuid_of("dc.c") not in (None, old.uuid)
    assert find_all(cl, "dc.c") == [{"_id": 1000, "k": 5}]
    assert holdings(cl, "dc.c") == {"s0": {1000}, "s1": set(), "s2": set()}


def test_drop_an_unsharded_collection_and_a_missing_one(data_cluster):
    cl = data_cluster
    unsharded(cl, "du.u", primary="s1")
    unsharded(cl, "du.keep", primary="s1")
    result = run_ddl(cl, d.DropCollection(ns="du.u"))
    assert result["result"] == {"ns": "du.u", "dropped": True}
    assert held(cl, "s1", "du.u") == set() and catalog(cl).uuid_of("du.u") is None
    assert "du.u" not in catalog(cl).databases["du"].collections
    assert held(cl, "s1", "du.keep") == set(range(20))  # its neighbour untouched
    assert find_all(cl, "du.u") == []

    before = n_events(cl)
    for missing in ("du.nothing", "nodb.nothing"):
        reply = start(cl, d.DropCollection(ns=missing))
        assert reply["started"] is False and reply["id"] is None and reply["dropped"] is False, reply
    assert start(cl, d.DropDatabase(db="nodb"))["started"] is False
    assert n_events(cl) == before  # nothing recorded
    no_ddl_state_left(cl)


def test_drop_a_database_with_sharded_and_unsharded_collections(data_cluster):
    cl = data_cluster
    spread(cl, "dd.sharded")
    unsharded(cl, "dd.plain")
    unsharded(cl, "other.plain")
    version = catalog(cl).databases["dd"].version

    result = run_ddl(cl, d.DropDatabase(db="dd"))
    assert result["result"]["db"] == "dd" and result["result"]["dropped"] is True, result
    assert "dd" not in catalog(cl).databases
    assert not [ns for ns in catalog(cl).collections if ns.startswith("dd.")]
    for ns in ("dd.sharded", "dd.plain"):
        assert holdings(cl, ns) == {sid: set() for sid in SHARDS}, ns
        assert find_all(cl, ns) == []
    assert held(cl, "s0", "other.plain") == set(range(20))  # another database untouched
    no_ddl_state_left(cl)

    # Written again: a new database (a new DatabaseVersion uuid) with a new unsharded collection.
    client(cl, lambda ac: coll(ac, "dd.plain").insert_one({"_id": "again"}))
    assert catalog(cl).databases["dd"].version.uuid != version.uuid
    assert find_all(cl, "dd.plain") == [{"_id": "again"}]
    assert find_all(cl, "dd.sharded") == []


# ------------------------------------------------------------------ rename


def test_rename_an_unsharded_collection_and_over_an_existing_target(data_cluster):
    cl = data_cluster
    unsharded(cl, "ru.a", n=30)
    uuid = catalog(cl).uuid_of("ru.a")
    result = run_ddl(cl, d.RenameCollection(ns="ru.a", to="ru.b"))
    assert result["result"] == {"ns": "ru.a", "to": "ru.b"}
    assert catalog(cl).uuid_of("ru.a") is None and catalog(cl).uuid_of("ru.b") == uuid
    assert sorted(x["_id"] for x in find_all(cl, "ru.b")) == list(range(30))
    assert find_all(cl, "ru.a") == [] and held(cl, "s0", "ru.a") == set()

    # dropTarget: the target's documents are replaced by the source's.
    client(cl, lambda ac: coll(ac, "ru.c").insert_many([{"_id": 100 + i, "old": True} for i in range(10)]))
    run_ddl(cl, d.RenameCollection(ns="ru.b", to="ru.c", dropTarget=True))
    assert sorted(x["_id"] for x in find_all(cl, "ru.c")) == list(range(30))
    assert held(cl, "s0", "ru.c") == set(range(30)) and held(cl, "s0", "ru.b") == set()
    assert catalog(cl).uuid_of("ru.c") == uuid
    no_ddl_state_left(cl)


def test_rename_a_sharded_collection_over_an_existing_target(data_cluster):
    cl = data_cluster
    spread(cl, "rs.a", extra=lambda i: {"v": f"a{i}"})
    unsharded(cl, "rs.t", n=50)
    uuid = catalog(cl).uuid_of("rs.a")
    result = run_ddl(cl, d.RenameCollection(ns="rs.a", to="rs.t", dropTarget=True))
    assert result["result"] == {"ns": "rs.a", "to": "rs.t"}

    renamed = catalog(cl).collections["rs.t"]
    assert "rs.a" not in catalog(cl).collections and renamed.uuid == uuid
    assert [ch.shard for ch in renamed.chunks] == ["s0", "s1", "s2"]
    docs = find_all(cl, "rs.t")
    assert sorted(x["_id"] for x in docs) == list(range(DOCS))  # each exactly once, the target's gone
    assert all(x["v"] == f"a{x['_id']}" for x in docs)
    h = holdings(cl, "rs.t")
    # Each shard holds what it owns under the renamed chunks; the orphans did not follow.
    assert h == {"s0": set(range(100)), "s1": set(range(100, 200)), "s2": set(range(200, DOCS))}
    assert holdings(cl, "rs.a") == {sid: set() for sid in SHARDS}
    assert find_all(cl, "rs.a") == []
    assert client(cl, lambda ac: coll(ac, "rs.t").explain({"k": 150}))["shards"] == ["s1"]
    no_ddl_state_left(cl)


def test_refusals_record_nothing(data_cluster):
    cl = data_cluster
    spread(cl, "rf.s")
    unsharded(cl, "rf.u")
    unsharded(cl, "rf.v")
    before = n_events(cl)
    cases = [
        (d.RenameCollection(ns="rf.u", to="rf.v"), "NamespaceExists"),
        (d.RenameCollection(ns="rf.u", to="other.u"), "CommandFailed"),
        (d.RenameCollection(ns="rf.u", to="rf.u"), "IllegalOperation"),
        (d.RenameCollection(ns="rf.missing", to="rf.w"), "NamespaceNotFound"),
        (d.RefineCollectionShardKey(ns="rf.s", key={"x": 1}), "InvalidOptions"),
        (d.RefineCollectionShardKey(ns="rf.s", key={"k": 1}), "InvalidOptions"),
        (d.RefineCollectionShardKey(ns="rf.u", key={"k": 1, "x": 1}), "NamespaceNotSharded"),
    ]
    for cmd, code in cases:
        reply = config(cl, cmd)
        assert (reply.ok, reply.code) == (False, code), (cmd, reply)
    assert n_events(cl) == before
    assert held(cl, "s0", "rf.u") == set(range(20)) and held(cl, "s0", "rf.v") == set(range(20))
    no_ddl_state_left(cl)


# ------------------------------------------------------------------ refine


def test_refine_a_shard_key_with_documents_on_three_shards(data_cluster):
    cl = data_cluster
    spread(cl, "rk.c", key="a", extra=lambda i: {"b": i % 7})
    old_epoch = catalog(cl).collections["rk.c"].epoch
    result = run_ddl(cl, d.RefineCollectionShardKey(ns="rk.c", key={"a": 1, "b": 1}))
    assert result["result"] == {"ns": "rk.c", "key": {"a": 1, "b": 1}}
    refined = catalog(cl).collections["rk.c"]
    assert refined.pattern.spec == {"a": 1, "b": 1} and refined.epoch != old_epoch
    assert [ch.shard for ch in refined.chunks] == ["s0", "s1", "s2"]

    def explain(f):
        return client(cl, lambda ac: coll(ac, "rk.c").explain(f))["shards"]

    assert explain({"a": 150, "b": 3}) == ["s1"] and explain({"a": 250, "b": 5}) == ["s2"]
    assert explain({"a": 5, "b": 5}) == ["s0"]
    docs = find_all(cl, "rk.c")
    assert sorted(x["_id"] for x in docs) == list(range(DOCS))  # every document exactly once
    assert find_all(cl, "rk.c", {"a": 150, "b": 150 % 7}) == [{"_id": 150, "a": 150, "b": 150 % 7}]
    # s0's orphans (not owned under the refined chunks) were removed while rekeying.
    assert holdings(cl, "rk.c") == {"s0": set(range(100)), "s1": set(range(100, 200)), "s2": set(range(200, DOCS))}

    # The refined key moves: split inside a chunk on the new field, move the upper half.
    cl.command(c.SplitChunk(ns="rk.c", at=[{"a": 150, "b": 3}]))
    move(cl, "rk.c", {"a": 150, "b": 3}, {"a": 200, "b": MINK}, "s0")
    cl.call(cl.router.follower.wait_for(catalog(cl).config_time, 30))
    assert explain({"a": 150, "b": 5}) == ["s0"] and explain({"a": 150, "b": 1}) == ["s1"]
    assert sorted(x["_id"] for x in find_all(cl, "rk.c")) == list(range(DOCS))
    no_ddl_state_left(cl)


# ------------------------------------------------------------------ concurrency


def test_identical_drops_join_and_another_ddl_of_the_database_conflicts(data_cluster):
    cl = data_cluster
    spread(cl, "jn.c")
    unsharded(cl, "jn.other")
    t = cl.settings.topics

    async def go():
        async with Requester(cl.settings.bootstrap, t.cli_replies) as r:
            return await asyncio.gather(
                r.request(t.config_commands, d.DropCollection(ns="jn.c"), timeout=30),
                r.request(t.config_commands, d.DropCollection(ns="jn.c"), timeout=30),
                r.request(t.config_commands, d.RenameCollection(ns="jn.other", to="jn.renamed"), timeout=30),
            )

    first, second, other = cl.call(go())
    assert first.ok and second.ok, (first, second)
    assert first.result["id"] == second.result["id"] is not None
    assert sorted([first.result["joined"], second.result["joined"]]) == [False, True]
    assert (other.ok, other.code) == (False, "ConflictingOperationInProgress"), other
    assert finished(cl, first.result["id"])["ok"] is True
    assert holdings(cl, "jn.c") == {sid: set() for sid in SHARDS}
    # The database is free again: the refused rename now runs.
    run_ddl(cl, d.RenameCollection(ns="jn.other", to="jn.renamed"))
    assert sorted(x["_id"] for x in find_all(cl, "jn.renamed")) == list(range(20))


async def workload(cl, ns: str, stop: asyncio.Event, acked: set, seen: dict, base: int, key: str) -> None:
    """Insert new documents and read them back until told to stop; every acknowledged insert
    goes into `acked`, every refusal's code into `seen`."""
    async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=20) as ac:
        target = coll(ac, ns)
        for n in itertools.count():
            if stop.is_set():
                return
            _id = base + n
            try:
                await target.insert_one({"_id": _id, key: _id % DOCS, "b": n % 5, "w": True})
                acked.add(_id)
                await target.find({"_id": _id}).to_list()
                seen["ok"] = seen.get("ok", 0) + 1
            except ShardlogError as e:
                seen[e.code] = seen.get(e.code, 0) + 1


def test_crud_while_ddls_run_loses_no_acknowledged_write(data_cluster):
    """A rename in another database and a refine of this very collection: the workload only
    sees ok or retriable refusals, and every insert acknowledged is there afterwards."""
    cl = data_cluster
    spread(cl, "wk.c", key="a", extra=lambda i: {"b": i % 5})
    spread(cl, "wo.c", extra=lambda i: {"v": i})

    async def scenario():
        stop, acked, seen = asyncio.Event(), set(), {}
        task = asyncio.create_task(workload(cl, "wk.c", stop, acked, seen, 10_000, "a"))
        await asyncio.sleep(0.3)  # inserts in flight before the DDLs start, not a synchronisation
        rename = await asyncio.to_thread(run_ddl, cl, d.RenameCollection(ns="wo.c", to="wo.d"))
        during_rename = len(acked)
        refine = await asyncio.to_thread(run_ddl, cl, d.RefineCollectionShardKey(ns="wk.c", key={"a": 1, "b": 1}))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        return rename, refine, acked, seen, during_rename

    rename, refine, acked, seen, during_rename = asyncio.run(scenario())
    assert rename["ok"] and refine["ok"]
    assert during_rename > 0 and len(acked) > during_rename, "the workload made no progress"
    assert set(seen) <= RETRIABLE | {"ok"}, seen
    docs = find_all(cl, "wk.c")
    ids = [x["_id"] for x in docs]
    assert len(ids) == len(set(ids)), "a document is read twice"
    missing = acked - set(ids)
    assert not missing, f"{len(missing)} acknowledged inserts lost, e.g. {sorted(missing)[:5]}"
    assert set(range(DOCS)) <= set(ids)
    assert sorted(x["_id"] for x in find_all(cl, "wo.d")) == list(range(DOCS))
    no_ddl_state_left(cl)
