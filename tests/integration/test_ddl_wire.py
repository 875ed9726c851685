"""DDL through the router's wire edge and the CLI (issue 13): drop, dropDatabase,
renameCollection (with and without dropTarget; across databases refused), refineCollectionShardKey
and currentOp, from the real pymongo driver and mongosh against a live cluster (data_cluster:
config server with its DDL coordinators, shards s0..s2, one router, the real broker), and the
`shardlog` CLI printing and --json."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.conftest import cli, wait_until
from tests.integration.test_mongosh import run as mongosh_run
from tests.unit.test_wire_mongosh import _mongosh

pytestmark = pytest.mark.kafka

COORDINATORS = ("DropCollectionCoordinator", "DropDatabaseCoordinator", "RenameCollectionCoordinator")


def refused(fn, *args, **kw) -> int:
    with pytest.raises(OperationFailure) as e:
        fn(*args, **kw)
    return e.value.code


def body(reply: dict) -> dict:
    """A reply without the cluster's times (every reply carries them)."""
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def catalog(cluster):
    return cluster.router.follower.catalog


def held_at_block_crud(cluster, op: str = "dropCollection") -> threading.Event:
    """Hold the coordinators of `op` at blockCRUD (their driver fails there and resumes from the
    phase) while the returned event is set: a running coordinator to look at."""
    hold = threading.Event()
    hold.set()

    def fault(point: str, tag: str | None = None) -> None:
        if hold.is_set() and point == "ddl.blockCRUD" and tag == op:
            raise RuntimeError("held at blockCRUD by the test")

    cluster.config.ddl.fault = fault
    return hold


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_ddl_through_pymongo(data_cluster, monkeypatch):
    client = data_cluster.mongo_client()
    admin, app = client.admin, client.app
    admin.command("enableSharding", "app", primaryShard="s0")

    # drop: unsharded, then sharded with chunks on two shards; a missing one answers ok
    app.plain.insert_many([{"_id": i} for i in range(5)])
    app.plain.drop()
    assert "plain" not in app.list_collection_names() and app.plain.count_documents({}) == 0
    assert body(app.command("drop", "plain")) == {"ok": 1.0}
    admin.command("shardCollection", "app.users", key={"k": 1})
    app.users.insert_many([{"_id": i, "k": i} for i in range(100)])
    admin.command("split", "app.users", middle={"k": 50})
    admin.command("moveRange", "app.users", min={"k": 50}, toShard="s1")
    reply = app.command("drop", "users")
    assert reply["ns"] == "app.users" and reply["nIndexesWas"] == 2 and reply["ok"] == 1.0  # _id_ and k_1
    assert "app.users" not in catalog(data_cluster).collections
    assert app.users.count_documents({}) == 0
    # the router's routing does not resurrect it: a write makes a fresh, unsharded collection
    app.users.insert_one({"_id": "new", "k": 1})
    assert list(app.users.find()) == [{"_id": "new", "k": 1}]
    assert "app.users" not in catalog(data_cluster).collections

    # renameCollection: sharded, keeping its documents; the old name is gone
    admin.command("shardCollection", "app.a", key={"k": 1})
    app.a.insert_many([{"_id": i, "k": i} for i in range(20)])
    app.a.rename("b")
    assert sorted(d["_id"] for d in app.b.find()) == list(range(20)) and app.a.count_documents({}) == 0
    assert "app.b" in catalog(data_cluster).collections and "app.a" not in catalog(data_cluster).collections
    # onto an existing collection: NamespaceExists (48) without dropTarget, replaced with it
    app.c.insert_one({"_id": "c"})
    assert refused(app.b.rename, "c") == 48
    assert app.b.count_documents({}) == 20  # nothing changed
    app.b.rename("c", dropTarget=True)
    assert app.c.count_documents({}) == 20 and app.c.find_one({"_id": "c"}) is None
    # across databases: CommandFailed (125); bad input: MongoDB's codes, nothing sent
    assert refused(admin.command, "renameCollection", "app.c", to="other.c") == 125
    assert refused(admin.command, "renameCollection", "app.c", to="app.c") == 20
    assert refused(admin.command, "renameCollection", "app.c", to=5) == 14
    assert refused(admin.command, "renameCollection", "app.c", to="app.d", bogus=1) == 40415
    assert refused(admin.command, "renameCollection", "app.missing", to="app.d") == 26
    assert refused(app.command, "renameCollection", "app.c", to="app.d") == 13  # only on admin
    assert app.c.count_documents({}) == 20

    # refineCollectionShardKey: the new key extends the old one; the documents stay readable
    admin.command("refineCollectionShardKey", "app.c", key={"k": 1, "j": 1})
    assert catalog(data_cluster).collections["app.c"].pattern.spec == {"k": 1, "j": 1}
    assert app.c.count_documents({}) == 20
    assert refused(admin.command, "refineCollectionShardKey", "app.c", key={"j": 1}) == 72
    assert refused(admin.command, "refineCollectionShardKey", "app.plain2", key={"j": 1}) == 26

    # dropDatabase: every collection, then the database
    client.shop.items.insert_many([{"_id": i} for i in range(3)])
    assert body(client.shop.command("dropDatabase")) == {"dropped": "shop", "ok": 1.0}
    assert "shop" not in client.list_database_names() and client.shop.items.count_documents({}) == 0
    client.drop_database("shop")  # missing: ok
    assert refused(client.admin.command, "dropDatabase") == 20

    # currentOp: a coordinator held at blockCRUD is listed as mongos lists one; the drop
    # waiting on it returns once it is let go
    app.held.insert_one({"_id": 1})
    hold = held_at_block_crud(data_cluster)
    t, out = in_thread(lambda: app.command("drop", "held"))
    wait_until(
        lambda: [e for e in admin.command("currentOp")["inprog"] if e.get("currentPhase") == "blockCRUD"],
        30,
        "the coordinator in currentOp, held at blockCRUD",
    )
    [entry] = admin.command("currentOp")["inprog"]
    assert entry["desc"] == "DropCollectionCoordinator" and entry["ns"] == "app.held", entry
    assert entry["command"] == {"dropCollection": "app.held"} and entry["currentPhase"] == "blockCRUD"
    assert entry["type"] == "op" and entry["op"] == "command" and entry["active"] is True
    assert entry["shards"] == ["s0", "s1", "s2"] and entry["secs_running"] >= 0
    assert [e["opid"] for e in admin.command("currentOp", ns="app.held")["inprog"]] == [entry["opid"]]
    assert admin.command("currentOp", ns="app.other")["inprog"] == []
    [agg] = list(
        admin.aggregate(
            [{"$currentOp": {"allUsers": True}}, {"$match": {"desc": {"$in": ["DropCollectionCoordinator"]}}}]
        )
    )
    assert agg["opid"] == entry["opid"]
    # the same drop again joins it (and returns with it); nothing returns while it is held
    t2, out2 = in_thread(lambda: client.app.command("drop", "held"))
    # another DDL of the database waits for its lock: SHARDLOG_DDL_LOCK_WAIT, then 117
    monkeypatch.setenv("SHARDLOG_DDL_LOCK_WAIT", "1")
    began = time.monotonic()
    assert refused(admin.command, "renameCollection", "app.c", to="app.c2") == 117
    assert time.monotonic() - began >= 0.9 and app.c.count_documents({}) == 20
    monkeypatch.setenv("SHARDLOG_DDL_LOCK_WAIT", "60")
    t3, out3 = in_thread(lambda: admin.command("renameCollection", "app.c", to="app.c2"))
    # ... while a DDL of another database runs at once
    client.other.x.insert_one({"_id": 1})
    assert body(client.other.command("dropDatabase")) == {"dropped": "other", "ok": 1.0}
    assert not out and not out2 and not out3
    hold.clear()
    for th in (t, t2, t3):
        th.join(60)
    assert out3 and out3[0]["ok"] == 1.0 and app.c2.count_documents({}) == 20
    assert [body(r) for r in out] == [{"ns": "app.held", "nIndexesWas": 1, "ok": 1.0}] and out2 and out2[0]["ok"] == 1.0
    assert app.held.count_documents({}) == 0

    # currentOp: nothing running once every DDL returned; filters apply to the entries
    assert admin.command("currentOp")["inprog"] == []
    assert admin.command("currentOp", desc={"$in": list(COORDINATORS)})["inprog"] == []
    assert list(admin.aggregate([{"$currentOp": {"allUsers": True}}, {"$match": {"desc": "x"}}])) == []


def test_ddl_through_mongosh(data_cluster):
    mongosh = _mongosh()
    out = mongosh_run(
        mongosh,
        data_cluster,
        """
        const r = {};
        const d = db.getSiblingDB('sh1');
        d.a.insertMany([{_id: 1}, {_id: 2}]);
        d.t.insertOne({_id: 't'});
        r.rename = d.a.renameCollection('b');
        r.counts = [d.b.countDocuments({}), d.a.countDocuments({})];
        try { d.b.renameCollection('t'); r.onto = 'renamed' } catch (e) { r.onto = e.code }
        r.dropTarget = d.b.renameCollection('t', true);
        r.renamedOnto = d.t.countDocuments({});
        r.drops = [d.t.drop(), d.gone.drop()];
        sh.enableSharding('sh2'); sh.shardCollection('sh2.k', {k: 1});
        r.refine = db.adminCommand({refineCollectionShardKey: 'sh2.k', key: {k: 1, j: 1}});
        r.dropDatabase = db.getSiblingDB('sh2').dropDatabase();
        r.inprog = db.currentOp().inprog;
        r.filtered = db.currentOp({desc: 'DropCollectionCoordinator'}).inprog;
        print(JSON.stringify(r));
        """,
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["rename"] == {"ok": 1} and r["dropTarget"] == {"ok": 1}, out
    assert r["counts"] == [2, 0] and r["onto"] == 48 and r["renamedOnto"] == 2
    assert r["drops"] == [True, True]  # a missing collection drops ok (MongoDB 7.0)
    assert r["refine"]["ok"] == 1 and r["dropDatabase"] == {"ok": 1, "dropped": "sh2"}
    assert r["inprog"] == [] and r["filtered"] == []
    assert data_cluster.router.follower.catalog.collections.get("sh2.k") is None


def test_ddl_through_the_cli(data_cluster):
    settings = data_cluster.settings
    client = data_cluster.mongo_client()
    client.admin.command("enableSharding", "cl", primaryShard="s0")
    client.admin.command("shardCollection", "cl.a", key={"k": 1})
    client.cl.a.insert_many([{"_id": i, "k": i} for i in range(10)])

    done = cli(settings, "rename-collection", "cl.a", "cl.b", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and (doc["ns"], doc["to"]) == ("cl.a", "cl.b") and doc["joined"] is False
    assert doc["phases"][-1] == "done" and isinstance(doc["configTime"], int)
    status = json.loads(cli(settings, "ddl", "status", doc["id"], "--json").stdout)
    assert status["state"] == "done" and status["ok"] is True and status["result"] == {"ns": "cl.a", "to": "cl.b"}
    assert "done: ok" in cli(settings, "ddl", "status", doc["id"]).stdout

    human = cli(settings, "refine-shard-key", "cl.b", '{"k": 1, "j": 1}')
    assert human.returncode == 0 and "refined the shard key of cl.b to { k: 1, j: 1 }" in human.stdout, human.stderr
    assert client.cl.b.count_documents({}) == 10

    bad = cli(settings, "rename-collection", "cl.missing", "cl.c", "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == "NamespaceNotFound"

    human = cli(settings, "drop-collection", "cl.b")
    assert human.returncode == 0 and "dropped cl.b" in human.stdout, human.stderr
    noop = json.loads(cli(settings, "drop-collection", "cl.b", "--json").stdout)
    assert noop["ok"] is True and noop["id"] is None and noop["dropped"] is False
    gone = json.loads(cli(settings, "drop-database", "cl", "--json").stdout)
    assert gone["ok"] is True and gone["db"] == "cl" and gone["dropped"] is True

    client.cl.h.insert_one({"_id": 1})
    hold = held_at_block_crud(data_cluster)
    t, out = in_thread(lambda: client.cl.command("drop", "h"))
    wait_until(
        lambda: [
            c
            for c in json.loads(cli(settings, "ddl", "status", "--json").stdout)["running"]
            if c["phase"] == "blockCRUD"
        ],
        30,
        "the coordinator running, held at blockCRUD",
    )
    [c] = json.loads(cli(settings, "ddl", "status", "--json").stdout)["running"]
    assert (c["op"], c["ns"], c["phase"], c["state"]) == ("dropCollection", "cl.h", "blockCRUD", "running")
    table = cli(settings, "ddl", "status").stdout
    assert "dropCollection" in table and "cl.h" in table and "blockCRUD" in table, table
    one = cli(settings, "ddl", "status", c["id"]).stdout
    assert f"{c['id']}: dropCollection cl.h" in one and "running: phase blockCRUD" in one, one
    hold.clear()
    t.join(60)
    assert out and out[0]["ok"] == 1.0

    assert json.loads(cli(settings, "ddl", "status", "--json").stdout) == {"ok": True, "running": []}
    assert "no DDL coordinator running" in cli(settings, "ddl", "status").stdout
