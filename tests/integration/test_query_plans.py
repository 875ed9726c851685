"""Each shard's query plan through a live router (issue 15): pymongo's explain and the CLI's show,
per shard, the plan (IDHACK, the shard key's index, COLLSCAN, or a secondary index once the
shards build them) with keys and documents examined; hints reach the shards' planners."""

from __future__ import annotations

import json

import pytest
from pymongo.errors import OperationFailure

from schemas import config as c

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
