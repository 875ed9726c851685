"""mongosh (MongoDB's shell, from the npm registry via `make mongosh`) against a live cluster:
its sh.* helpers, sh.status() and CRUD.  Assertions are
on what mongosh prints."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from bson import MaxKey

from tests.unit.test_wire_mongosh import _mongosh

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def mongosh() -> str:
    return _mongosh()


def run(mongosh: str, cluster, script: str) -> str:
    """Run `script` with mongosh --eval on the cluster's router; its stdout (exit 0 required)."""
    done = subprocess.run(
        [mongosh, cluster.uri + "?serverSelectionTimeoutMS=5000", "--quiet", "--norc", "--eval", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MONGOSH_FORCE_DISABLE_TELEMETRY_FOR_TESTING": "1"},
    )
    assert done.returncode == 0, f"mongosh failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def chunk_bounds(cluster, ns: str) -> list[tuple[str, str, str]]:
    from cli.context import bound

    return [(bound(c.min), bound(c.max), c.shard) for c in cluster.router.follower.catalog.collections[ns].chunks]


def test_sh_helpers(mongosh, data_cluster):
    out = run(
        mongosh,
        data_cluster,
        """
        const r = sh.shardCollection("shop.orders", {o: 1});
        print("sharded", r.collectionsharded);
        print("split", sh.splitAt("shop.orders", {o: 50}).ok);
        print("moved", sh.moveRange("shop.orders", "s1", {o: 50}, {o: MaxKey()}).ok);
        print("zone", sh.addShardToZone("s2", "EU").ok);
        print("shards", JSON.stringify(db.adminCommand({listShards: 1}).shards.map(s => s._id)));
        """,
    )
    lines = out.strip().splitlines()
    assert lines == ["sharded shop.orders", "split 1", "moved 1", "zone 1", 'shards ["s0","s1","s2"]'], out
    assert chunk_bounds(data_cluster, "shop.orders") == [
        ("{ o: MinKey }", "{ o: 50 }", "s0"),
        ("{ o: 50 }", "{ o: MaxKey }", "s1"),
    ]
    assert data_cluster.router.follower.catalog.shards["s2"].zones == {"EU"}

    # an error reaches the shell as MongoDB's: code and codeName
    out = run(
        mongosh,
        data_cluster,
        'try { sh.shardCollection("shop.orders", {p: 1}) } catch (e) { print(e.code, e.codeName) }',
    )
    assert out.strip() == "23 AlreadyInitialized"


def test_sh_get_balancer_state(mongosh, data_cluster):
    # reads config.settings with find
    assert run(mongosh, data_cluster, "print(sh.getBalancerState())").strip() == "true"
    run(mongosh, data_cluster, "sh.stopBalancer()")
    assert run(mongosh, data_cluster, "print(sh.getBalancerState())").strip() == "false"


def test_sh_status_lists_shards_databases_and_chunks(mongosh, data_cluster):
    data_cluster.mongo_client().admin.command("shardCollection", "shop.orders", key={"o": 1})
    data_cluster.mongo_client().admin.command("split", "shop.orders", middle={"o": 50})
    out = run(mongosh, data_cluster, "sh.status()")
    for shard in ("s0", "s1", "s2"):
        assert f"_id: '{shard}'" in out, out
    # mongosh prints sh.status() as inspected objects (helpers.js getPrintableShardStatus)
    assert "_id: 'shop'" in out and "'shop.orders'" in out and "shardKey: { o: 1 }" in out, out
    assert "min: { o: MinKey() }, max: { o: 50 }, 'on shard': 's0'" in out, out
    assert "min: { o: 50 }, max: { o: MaxKey() }, 'on shard': 's0'" in out, out


def test_crud_from_the_shell(mongosh, data_cluster):
    out = run(
        mongosh,
        data_cluster,
        """
        db.getSiblingDB("app").c.insertMany([{_id: 3, g: "a", n: 1}, {_id: 1, g: "b", n: 2}, {_id: 2, g: "a", n: 3}]);
        print(JSON.stringify(db.getSiblingDB("app").c.find().sort({_id: 1}).toArray().map(d => d._id)));
        print(JSON.stringify(db.getSiblingDB("app").c.aggregate([
            {$group: {_id: "$g", total: {$sum: "$n"}}}, {$sort: {_id: 1}}]).toArray()));
        """,
    )
    lines = out.strip().splitlines()
    assert lines[0] == "[1,2,3]", out
    assert json.loads(lines[1]) == [{"_id": "a", "total": 4}, {"_id": "b", "total": 2}], out


def test_index_helpers_from_the_shell(mongosh, data_cluster):
    """createIndex / getIndexes / explain / dropIndex as a mongosh user types them, on a sharded
    collection with documents on two shards."""
    client = data_cluster.mongo_client()
    client.admin.command("shardCollection", "app.people", key={"k": 1})
    client.admin.command("split", "app.people", middle={"k": 50})
    client.admin.command("moveRange", "app.people", min={"k": 50}, max={"k": MaxKey()}, toShard="s1")
    client.app.people.insert_many([{"_id": i, "k": i, "city": f"c{i % 10}"} for i in range(100)])
    out = run(
        mongosh,
        data_cluster,
        """
        const c = db.getSiblingDB("app").people;
        print("created", c.createIndex({city: 1}));
        print("unique", c.createIndex({k: 1, city: 1}, {unique: true}));
        print("names", JSON.stringify(c.getIndexes().map(i => i.name).sort()));
        const e = c.find({city: "c3"}).explain("executionStats");
        const shards = e.queryPlanner.winningPlan.shards.map(s => JSON.stringify(s.winningPlan)).join(" ");
        print("ixscan", shards.includes('"IXSCAN"') && shards.includes('"city_1"'));
        print("docs", e.executionStats.totalDocsExamined, "returned", e.executionStats.nReturned);
        try { c.insertOne({_id: 1000, k: 3, city: "c3"}) } catch (err) { print("dup", err.code) }
        try { c.createIndex({city: 1}, {unique: true, name: "u"}) } catch (err) { print("refused", err.code, err.codeName) }
        try { c.dropIndex("_id_") } catch (err) { print("id", err.code) }
        print("dropped", c.dropIndex("city_1").ok);
        print("left", JSON.stringify(c.getIndexes().map(i => i.name).sort()));
        """,
    )
    lines = out.strip().splitlines()
    assert lines[:2] == ["created city_1", "unique k_1_city_1"], out
    assert lines[2] == 'names ["_id_","city_1","k_1","k_1_city_1"]', out
    assert lines[3] == "ixscan true", out
    assert lines[4] == "docs 10 returned 10", out
    assert lines[5:9] == ["dup 11000", "refused 67 CannotCreateIndex", "id 72", "dropped 1"], out
    assert lines[9] == 'left ["_id_","k_1","k_1_city_1"]', out
    assert client.app.people.count_documents({}) == 100


def test_a_snapshot_session_from_the_shell_reads_at_its_first_reads_time(mongosh, data_cluster):
    out = run(
        mongosh,
        data_cluster,
        """
        const plain = db.getSiblingDB("app").snap;
        plain.insertOne({_id: 1, v: 0});
        const session = db.getMongo().startSession({snapshot: true});
        const snap = session.getDatabase("app").snap;
        const first = snap.find().toArray().map(d => d.v);
        plain.updateOne({_id: 1}, {$set: {v: 1}});
        plain.insertOne({_id: 2, v: 2});
        const again = snap.find().sort({_id: 1}).toArray().map(d => d.v);
        print(JSON.stringify([first, again, plain.find().sort({_id: 1}).toArray().map(d => d.v)]));
        """,
    )
    assert json.loads(out.strip().splitlines()[-1]) == [[0], [0], [1, 2]], out


def test_a_transaction_from_the_shell_moves_a_value_between_two_shards(mongosh, data_cluster):
    """mongosh's session.withTransaction moves a value between documents on two shards (two-phase
    commit); a transaction the shell aborts leaves nothing; pymongo sees the outcome."""
    client = data_cluster.mongo_client()
    client.admin.command("shardCollection", "bank.acct", key={"k": 1})
    client.admin.command("split", "bank.acct", middle={"k": 100})
    primary = data_cluster.router.follower.catalog.databases["bank"].primary  # holds k < 100
    other = next(s for s in data_cluster.shards if s != primary)
    client.admin.command("moveRange", "bank.acct", min={"k": 100}, max={"k": MaxKey()}, toShard=other)
    acct = client.bank.acct
    acct.insert_many([{"_id": "a", "k": 1, "v": 100}, {"_id": "b", "k": 150, "v": 0}])
    assert [s for _, _, s in chunk_bounds(data_cluster, "bank.acct")] == [primary, other]
    out = run(
        mongosh,
        data_cluster,
        """
        const plain = db.getSiblingDB("bank").acct;
        const values = (c) => c.find().sort({k: 1}).toArray().map(d => d.v);
        const session = db.getMongo().startSession();
        const acct = session.getDatabase("bank").acct;
        session.withTransaction(() => {
            acct.updateOne({k: 1}, {$inc: {v: -30}});
            acct.updateOne({k: 150}, {$inc: {v: 30}});
            print("inside", JSON.stringify(values(acct)), "outside", JSON.stringify(values(plain)));
        });
        session.startTransaction();
        acct.updateOne({k: 1}, {$inc: {v: -1000}});
        acct.insertOne({_id: "c", k: 199, v: 5});
        print("before abort", JSON.stringify(values(acct)));
        session.abortTransaction();
        session.endSession();
        print("after", JSON.stringify(values(plain)));
        """,
    )
    lines = out.strip().splitlines()
    assert lines == ["inside [70,30] outside [100,0]", "before abort [-930,30,5]", "after [70,30]"], out
    assert sorted((d["_id"], d["v"]) for d in acct.find()) == [("a", 70), ("b", 30)]
    acct.update_many({}, {"$inc": {"v": 1}})  # nothing left holding a document on either shard
    assert sorted(d["v"] for d in acct.find()) == [31, 71]
