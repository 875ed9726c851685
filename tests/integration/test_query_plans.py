"""Each shard's query plan through a live router (issue 15): pymongo's explain and the CLI's show,
per shard, the plan (IDHACK, the shard key's index, COLLSCAN, or a secondary index once the
shards build them) with keys and documents examined; hints reach the shards' planners."""

from __future__ import annotations

import json

import pytest
from pymongo.errors import OperationFailure

from schemas import config as c
from schemas import shard as s

pytestmark = pytest.mark.kafka


def shard_plan(explained: dict) -> tuple[dict, dict]:
    """The only shard's winningPlan and executionStats."""
    (planner,) = explained["queryPlanner"]["winningPlan"]["shards"]
    (stats,) = explained["executionStats"]["executionStages"]["shards"]
    return planner["winningPlan"], stats


def innermost(stage: dict) -> dict:
    while "inputStage" in stage:
        stage = stage["inputStage"]
    return stage


def test_explain_shows_each_shards_plan_and_its_counts(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.ex", key={"k": 1}))
    coll = data_cluster.mongo_client().app.ex
    coll.insert_many([{"_id": i, "k": i, "x": i % 5} for i in range(50)])

    plan, stats = shard_plan(coll.find({"k": {"$gte": 40}}).explain())
    scan = innermost(plan)
    assert plan["stage"] == "SHARDING_FILTER" and scan["stage"] == "IXSCAN"
    assert scan["indexName"] == "k_1" and scan["isShardKey"] and scan["indexBounds"] == {"k": ["[40, inf.0]"]}
    assert (stats["nReturned"], stats["totalDocsExamined"]) == (10, 10)

    plan, stats = shard_plan(coll.find({"x": 3}).explain())
    assert innermost(plan)["stage"] == "COLLSCAN"
    assert (stats["nReturned"], stats["totalDocsExamined"], stats["totalKeysExamined"]) == (10, 50, 0)

    plan, stats = shard_plan(coll.find({"_id": 7}).explain())
    assert innermost(plan)["stage"] == "IDHACK" and stats["nReturned"] == 1

    plan, _ = shard_plan(coll.find({"x": 3}).sort("x", -1).explain())
    assert plan["stage"] == "SORT"

    # A hint reaches the shards: $natural is a COLLSCAN; a name no index has is BadValue (2).
    plan, stats = shard_plan(coll.find({"k": 5}).hint([("$natural", 1)]).explain())
    # a COLLSCAN, over the shard-key range the filter targets (the documents are in key order)
    assert innermost(plan)["stage"] == "COLLSCAN" and stats["totalDocsExamined"] == 1
    assert [d["_id"] for d in coll.find({"k": 5}).hint([("$natural", 1)])] == [5]
    with pytest.raises(OperationFailure) as bad:
        list(coll.find({"k": 5}).hint("nope_1"))
    assert bad.value.code == 2

    planned = coll.database.command("explain", {"find": "ex", "filter": {"x": 1}}, verbosity="queryPlanner")
    assert "executionStats" not in planned
    assert innermost(planned["queryPlanner"]["winningPlan"]["shards"][0]["winningPlan"])["stage"] == "COLLSCAN"


def test_cli_explain_prints_each_shards_plan(data_cluster):
    from typer.testing import CliRunner

    from cli.main import app

    data_cluster.command(c.ShardCollection(ns="app.cliex", key={"k": 1}))
    data_cluster.mongo_client().app.cliex.insert_many([{"_id": i, "k": i, "x": i % 5} for i in range(20)])
    base = ["--bootstrap", data_cluster.settings.bootstrap, "--cluster", data_cluster.settings.cluster]
    runner = CliRunner()
    r = runner.invoke(app, [*base, "explain", "app.cliex", '{"k": {"$lt": 5}}'])
    assert r.exit_code == 0, r.output
    assert "IXSCAN k_1 {k: [-inf.0, 5)}" in r.output  # a number's range stops at the numbers' edge
    assert "returned 5" in " ".join(r.output.split())
    r = runner.invoke(app, [*base, "explain", "app.cliex", '{"x": 1}', "--json"])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (p,) = out["plans"]
    assert p["summary"] == "COLLSCAN" and p["executionStats"]["totalDocsExamined"] == 20


def test_a_secondary_index_serves_a_query_and_the_same_query_without_it_reads_everything(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.ix", key={"k": 1}))
    coll = data_cluster.mongo_client().app.ix
    coll.insert_many([{"_id": i, "k": i, "x": i % 10, "y": i} for i in range(200)])
    assert coll.create_index("x") == "x_1"  # the DDL coordinator has every shard build it

    plan, stats = shard_plan(coll.find({"x": 3}).explain())
    assert innermost(plan)["indexName"] == "x_1"
    assert (stats["nReturned"], stats["totalKeysExamined"], stats["totalDocsExamined"]) == (20, 20, 20)
    plan, stats = shard_plan(coll.find({"y": 3}).explain())
    assert innermost(plan)["stage"] == "COLLSCAN" and stats["totalDocsExamined"] == 200
    assert sorted(d["_id"] for d in coll.find({"x": 3})) == [i for i in range(200) if i % 10 == 3]
    covered, stats = shard_plan(coll.find({"x": {"$gte": 8}}, {"x": 1, "_id": 0}).explain())
    assert covered["stage"] == "PROJECTION_COVERED" and stats["totalDocsExamined"] == 0


def plans_by_shard(explained: dict) -> dict[str, tuple[dict, dict]]:
    """shard -> (its winningPlan, its executionStats), from a router's explain."""
    planners = {p["shardName"]: p["winningPlan"] for p in explained["queryPlanner"]["winningPlan"]["shards"]}
    stats = {x["shardName"]: x for x in explained["executionStats"]["executionStages"]["shards"]}
    assert sorted(planners) == sorted(stats), explained
    return {sid: (planners[sid], stats[sid]) for sid in planners}


def test_a_shard_that_gains_its_first_chunk_has_the_index_and_plans_with_it(data_cluster):
    """createIndexes while s0 owns every chunk (s1 has neither chunk nor index), then moveRange to
    s1: the recipient builds the index before it clones, lists it, and its planner uses it.
    Then a query on both shards: each shard's own plan, and per-shard counts that sum to the totals."""
    from tests.conftest import wait_until
    from tests.integration.test_shard_indexes import ask, index_state, kept_and_rebuilt

    cl = data_cluster
    client = cl.mongo_client()
    client.admin.command("enableSharding", "mv", primaryShard="s0")
    client.admin.command("shardCollection", "mv.c", key={"k": 1})
    coll = client.mv.c
    coll.insert_many([{"_id": i, "k": i, "x": i % 10} for i in range(300)])
    assert coll.create_index("x") == "x_1"
    assert index_state(cl, "s0", "mv.c", "x_1")["state"] == "ready"
    assert index_state(cl, "s1", "mv.c", "x_1") == {}  # no chunk, no index

    client.admin.command("split", "mv.c", middle={"k": 200})
    client.admin.command("moveRange", "mv.c", min={"k": 200}, toShard="s1")
    on_s1 = index_state(cl, "s1", "mv.c", "x_1")  # the shard's own ListIndexes
    assert on_s1["state"] == "ready" and on_s1["spec"]["key"] == {"x": 1}, on_s1
    kept, rebuilt = kept_and_rebuilt(cl, "s1", "mv.c", {"key": {"x": 1}})
    assert len(kept) == 100 and kept == rebuilt

    # A query that targets s1 alone: s1's plan is an IXSCAN of x_1.
    explained = coll.find({"k": {"$gte": 200}, "x": 3}).explain()
    plans = plans_by_shard(explained)
    assert list(plans) == ["s1"], explained
    plan, stats = plans["s1"]
    scan = innermost(plan)
    assert (scan["stage"], scan["indexName"]) == ("IXSCAN", "x_1"), plan
    assert (stats["nReturned"], stats["totalKeysExamined"], stats["totalDocsExamined"]) == (10, 10, 10), stats
    assert sorted(d["_id"] for d in coll.find({"k": {"$gte": 200}, "x": 3})) == list(range(203, 300, 10))

    # A query on both shards: each shard plans with its own x_1 and counts its own keys and
    # documents; the router's totals are their sums.  s0 still holds the moved range's
    # documents (orphans: no range deleter runs here), so it examines their 20 keys and
    # documents too and its SHARDING_FILTER drops them; once their range is deleted it does not.
    def per_shard() -> dict[str, tuple[int, int, int]]:
        explained = coll.find({"x": {"$in": [3, 4]}}).explain()
        plans = plans_by_shard(explained)
        assert sorted(plans) == ["s0", "s1"], explained
        for sid, (plan, _) in plans.items():
            scan = innermost(plan)
            assert plan["stage"] == "SHARDING_FILTER" and (scan["stage"], scan["indexName"]) == ("IXSCAN", "x_1"), (
                sid,
                plan,
            )
        counts = {
            sid: (st["nReturned"], st["totalKeysExamined"], st["totalDocsExamined"]) for sid, (_, st) in plans.items()
        }
        totals = explained["executionStats"]
        assert (totals["nReturned"], totals["totalKeysExamined"], totals["totalDocsExamined"]) == tuple(
            sum(c[n] for c in counts.values()) for n in range(3)
        ), (totals, counts)
        assert _ids(coll.find({"x": {"$in": [3, 4]}})) == [i for i in range(300) if i % 10 in (3, 4)]
        return counts

    assert per_shard() == {"s0": (40, 60, 60), "s1": (20, 20, 20)}
    tasks = cl.shards["s0"].documents.range_tasks  # the move's range deletion on the donor
    task_id = wait_until(lambda: next(iter(list(tasks)), None), 30, "the donor's range-deletion task")

    def task_ready():
        task = cl.shards["s0"].documents.range_tasks.get(task_id)
        return task is not None and not task.pending

    wait_until(task_ready, 30, "the donor's range-deletion task to be ready")

    def delete_batch():
        rep = ask(cl, "s0", s.DeleteRangeBatch(task=task_id, limit=50))
        assert rep.ok, rep
        return rep.result["done"]

    wait_until(delete_batch, 60, "the range deletion")
    assert per_shard() == {"s0": (40, 40, 40), "s1": (20, 20, 20)}


def _ids(cursor) -> list:
    return sorted(d["_id"] for d in cursor)


def test_sparse_and_partial_indexes_serve_only_the_queries_they_can_answer(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.sp", key={"k": 1}))
    coll = data_cluster.mongo_client().app.sp
    docs = []
    for i in range(120):
        doc = {"_id": i, "k": i, "p": i, "status": "a" if i % 3 == 0 else "b"}
        if i % 2 == 0:
            doc["s"] = i % 6  # 0, 2 or 4
        elif i % 10 == 1:
            doc["s"] = None  # present, null: a sparse index holds it
        docs.append(doc)
    coll.insert_many(docs)
    assert coll.create_index("s", sparse=True) == "s_1"
    assert coll.create_index("p", partialFilterExpression={"status": "a"}) == "p_1"
    info = coll.index_information()
    assert info["s_1"].get("sparse") is True and info["p_1"]["partialFilterExpression"] == {"status": "a"}

    def check(flt: dict, expected: list, index: str | None) -> dict:
        """The plan's innermost stage uses `index` (None: COLLSCAN), and the results are the
        expected documents and those of a $natural (no index) run."""
        plan, stats = shard_plan(coll.find(flt).explain())
        scan = innermost(plan)
        if index is None:
            assert scan["stage"] == "COLLSCAN" and stats["totalDocsExamined"] == 120, (flt, plan, stats)
        else:
            assert (scan["stage"], scan["indexName"]) == ("IXSCAN", index), (flt, plan)
        assert _ids(coll.find(flt)) == expected == _ids(coll.find(flt).hint([("$natural", 1)])), flt
        return stats

    # sparse: {s: 2} needs a value in s, so the index holds every match
    stats = check({"s": 2}, [d["_id"] for d in docs if d.get("s") == 2], "s_1")
    assert stats["totalKeysExamined"] == stats["totalDocsExamined"] == 20, stats
    # ... {s: null} also matches the documents without s, which it does not hold
    nulls = check({"s": None}, [d["_id"] for d in docs if d.get("s") is None], None)
    assert nulls["nReturned"] == 60  # 12 with s: null, 48 without s
    with pytest.raises(OperationFailure) as refused:  # nor may a hint make it answer
        list(coll.find({"s": None}).hint("s_1"))
    assert refused.value.code == 2

    # partial {status: "a"}: a query that implies it uses the index ...
    served = [d["_id"] for d in docs if d["status"] == "a" and d["p"] >= 60]
    stats = check({"p": {"$gte": 60}, "status": "a"}, served, "p_1")
    assert stats["totalKeysExamined"] == stats["totalDocsExamined"] == len(served) == 20, stats
    # ... one that does not (status "b" documents are not in it) reads the collection
    check({"p": {"$gte": 60}}, list(range(60, 120)), None)
    check({"p": {"$gte": 60}, "status": "b"}, [d["_id"] for d in docs if d["status"] == "b" and d["p"] >= 60], None)


def test_count_update_delete_and_find_and_modify_take_a_hint(data_cluster):
    """A hint reaches the shards' planners from count, update, delete and findAndModify as from find:
    a name no index has is BadValue (2) and changes nothing; a valid hint answers as without it."""
    data_cluster.command(c.ShardCollection(ns="app.hw", key={"k": 1}))
    coll = data_cluster.mongo_client().app.hw
    coll.insert_many([{"_id": i, "k": i, "x": i % 10} for i in range(50)])
    assert coll.create_index("x") == "x_1"
    db = coll.database

    def refused(call) -> int | None:
        with pytest.raises(OperationFailure) as e:
            call()
        return e.value.code

    def unchanged() -> None:
        assert sorted((d["_id"], d["k"], d["x"]) for d in coll.find()) == [(i, i, i % 10) for i in range(50)]
        assert coll.count_documents({"$or": [{"u": {"$exists": True}}, {"f": {"$exists": True}}]}) == 0

    # count
    for flt in ({"x": 3}, {"_id": 7}):
        n = db.command("count", "hw", query=flt)["n"]
        assert n == (5 if "x" in flt else 1)
        for hint in ("x_1", {"x": 1}, {"$natural": 1}):
            assert db.command("count", "hw", query=flt, hint=hint)["n"] == n, (flt, hint)
        assert refused(lambda flt=flt: db.command("count", "hw", query=flt, hint="nope_1")) == 2
    # writes with a hint naming no index: refused, nothing written or removed
    assert refused(lambda: coll.update_many({"x": 3}, {"$set": {"u": 1}}, hint="nope_1")) == 2
    assert refused(lambda: coll.update_one({"_id": 7}, {"$set": {"u": 1}}, hint="nope_1")) == 2
    assert refused(lambda: coll.update_one({"k": 99}, {"$set": {"u": 1}}, upsert=True, hint="nope_1")) == 2
    assert refused(lambda: coll.delete_many({"x": 4}, hint="nope_1")) == 2
    assert refused(lambda: coll.delete_one({"_id": 7}, hint={"nope": 1})) == 2
    assert refused(lambda: coll.find_one_and_update({"x": 5}, {"$set": {"f": 1}}, hint="nope_1")) == 2
    assert refused(lambda: coll.find_one_and_delete({"_id": 8}, hint="nope_1")) == 2
    unchanged()
    # with a valid hint: as without one
    assert coll.update_many({"x": 3}, {"$set": {"u": 1}}, hint="x_1").modified_count == 5
    assert coll.update_one({"k": 11}, {"$set": {"u": 2}}, hint=[("$natural", 1)]).modified_count == 1
    assert sorted(d["_id"] for d in coll.find({"u": {"$exists": True}})) == [3, 11, 13, 23, 33, 43]
    assert coll.delete_many({"x": 4}, hint=[("x", 1)]).deleted_count == 5
    assert coll.delete_one({"_id": 7}, hint="x_1").deleted_count == 1
    found = coll.find_one_and_update({"x": 5}, {"$set": {"f": 1}}, sort=[("k", -1)], hint="x_1")
    assert found == {"_id": 45, "k": 45, "x": 5}
    assert coll.find_one_and_delete({"x": 6}, sort=[("k", 1)], hint=[("$natural", 1)]) == {"_id": 6, "k": 6, "x": 6}
    assert coll.count_documents({}) == 50 - 5 - 1 - 1
