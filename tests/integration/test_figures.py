"""Live figures: shards and routers publish per-second metric summaries, the dashboard's faust
app (services/dashboard/figures.py) keeps the last minute of them, `shardlog top` shows them;
metric records that do not parse are dead-lettered and the figures go on."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner

from libs.bus import read_to_end
from schemas import config as c
from tests.conftest import wait_until

pytestmark = pytest.mark.kafka

NS = "app.users"


@pytest.fixture
def figures(data_cluster):
    from services.dashboard.figures import Figures

    f = Figures(data_cluster.settings)
    data_cluster.call(f.start())  # in the cluster's loop, as in the dashboard's aiohttp loop
    yield f
    data_cluster.call(f.stop())


def last_minute(cluster, figures) -> dict:
    async def read():
        return figures.last_minute()

    return cluster.call(read())


def sharded_workload(cluster, first: int, n: int) -> None:
    """n inserts and n finds by _id through the router's wire edge (pymongo)."""
    users = cluster.mongo_client().app.users
    for i in range(first, first + n):
        users.insert_one({"_id": i, "name": f"user {i}"})
    for i in range(first, first + n):
        assert users.find_one({"_id": i})["name"] == f"user {i}"


def test_a_workload_shows_per_shard_and_per_collection_figures_and_top_prints_them(data_cluster, figures):
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))  # a share on every shard
    sharded_workload(data_cluster, 0, 60)

    def busy():
        f = last_minute(data_cluster, figures)
        shards, coll = f["shards"], f["collections"].get(NS, {})
        every_shard = all(shards.get(sid, {}).get("ops", {}).get("insert", 0) > 0 for sid in data_cluster.shards)
        # The collection's row comes from the router's summaries and the shard rows from each
        # shard's: they publish on their own schedules, so wait for both to count the inserts.
        shard_inserts = sum(s.get("ops", {}).get("insert", 0) for s in shards.values())
        router_done = coll.get("ops", {}).get("insert", 0) >= 60 and coll["ops"]["find"] >= 60
        return f if every_shard and router_done and shard_inserts >= 60 else None

    f = wait_until(busy, 30, "figures of the workload on every shard and on the collection", interval=0.5)
    for row in [*f["shards"].values(), f["collections"][NS], *f["routers"].values()]:
        assert row["opsPerSec"] > 0
        assert 0 < row["p50Ms"] <= row["p99Ms"]
    assert sum(s["ops"]["insert"] for s in f["shards"].values()) >= 60  # each insert decided on one shard
    assert len(f["routers"]) == 1 and f["windowS"] == 60

    # `shardlog top` against a tiny dashboard serving these real figures.
    from aiohttp import web

    async def serve():
        async def snapshot(request):
            return web.json_response({"figures": figures.last_minute(), "migrations": [], "balancer": {"mode": "full"}})

        app = web.Application()
        app.router.add_get("/api/snapshot", snapshot)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, runner.addresses[0][1]

    runner, port = data_cluster.call(serve())
    try:
        from cli.main import app as cli

        url = f"http://127.0.0.1:{port}"
        result = CliRunner().invoke(cli, ["top", "--url", url, "--json"])
        assert result.exit_code == 0, result.output
        sample = json.loads(result.output)
        assert sample["ok"] and sample["figures"]["collections"][NS]["ops"]["insert"] >= 60
        assert set(sample["figures"]["shards"]) == set(data_cluster.shards)
        result = CliRunner().invoke(cli, ["top", "--url", url, "--once"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "per shard" in result.output and "per collection" in result.output
        lines = result.output.splitlines()
        for name in [*data_cluster.shards, NS]:
            line = next((line for line in lines if f" {name} " in line), None)
            assert line is not None, result.output
            assert line.split("│")[2].strip() not in ("", "-", "0.0"), line  # its ops/s
        assert "migrations in flight: 0" in result.output and "mode=full" in result.output
    finally:
        data_cluster.call(runner.cleanup())
    result = CliRunner().invoke(cli, ["top", "--url", url, "--json"])  # the dashboard is gone
    assert result.exit_code == 1
    answer = json.loads(result.output)
    assert answer["code"] == "DashboardUnavailable" and url in answer["error"] and "make up" in answer["error"]


BAD = [
    b"not json",
    json.dumps({"type": "Gauge", "v": 1}).encode(),  # an unknown type
    json.dumps({"type": "MetricSummary", "v": 2}).encode(),  # a version this build does not read
    json.dumps({"type": "MetricSummary", "v": 1, "role": "shard", "name": "s9"}).encode(),  # fields missing
]


def test_malformed_metric_records_are_dead_lettered_and_the_figures_keep_updating(data_cluster, figures):
    settings = data_cluster.settings
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    sharded_workload(data_cluster, 0, 10)
    wait_until(
        lambda: last_minute(data_cluster, figures)["collections"].get(NS, {}).get("ops", {}).get("insert", 0) >= 10,
        30,
        "the first inserts in the figures",
        interval=0.5,
    )

    async def produce_bad():
        p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap)
        await p.start()
        try:
            for value in BAD:
                await p.send_and_wait(settings.topics.metrics, value, key=b"s9")
        finally:
            await p.stop()

    asyncio.run(produce_bad())

    def dead_letters():
        got = []

        async def take(records):
            got.extend(records)

        asyncio.run(read_to_end(settings.bootstrap, settings.topics.dead_letters, take))
        return [r for r in got if dict(r.headers).get("dlq.topic") == settings.topics.metrics.encode()]

    letters = wait_until(lambda: len(dead_letters()) >= len(BAD) and dead_letters(), 30, "four dead letters")
    assert [r.value for r in letters] == BAD
    reasons = [dict(r.headers)["dlq.reason"].decode() for r in letters]
    assert "not JSON" in reasons[0]
    assert "unknown record type 'Gauge'" in reasons[1]
    assert "schema version 2" in reasons[2]
    assert "MetricSummary." in reasons[3] and "Field required" in reasons[3]
    assert figures.dead_lettered == len(BAD)

    sharded_workload(data_cluster, 10, 10)  # the app goes on
    wait_until(
        lambda: last_minute(data_cluster, figures)["collections"].get(NS, {}).get("ops", {}).get("insert", 0) >= 20,
        30,
        "the later inserts in the figures",
        interval=0.5,
    )
    assert "s9" not in last_minute(data_cluster, figures)["shards"]


def test_a_restarted_dashboard_recovers_the_last_minute_from_its_tables(data_cluster, figures):
    from services.dashboard.figures import Figures

    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    sharded_workload(data_cluster, 0, 10)
    wait_until(
        lambda: last_minute(data_cluster, figures)["collections"].get(NS, {}).get("ops", {}).get("insert", 0) >= 10,
        30,
        "the inserts in the figures",
        interval=0.5,
    )
    data_cluster.call(figures.stop())
    again = Figures(data_cluster.settings)
    data_cluster.call(again.start())
    try:
        # No new inserts: what it shows comes from its RocksDB tables and their changelog.
        f = wait_until(
            lambda: (
                last_minute(data_cluster, again)["collections"].get(NS, {}).get("ops", {}).get("insert", 0) >= 10
                and last_minute(data_cluster, again)
            ),
            30,
            "the restarted figures to show the inserts",
            interval=0.5,
        )
        assert f["collections"][NS]["ops"]["insert"] == 10  # each summary once, though read again
    finally:
        data_cluster.call(again.stop())
