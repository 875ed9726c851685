"""The YCSB driver against a real broker: load and run core workloads through
the client library on an in-process cluster (config server, 3 shards, router)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import typer
from typer.testing import CliRunner

from cli.context import CliContext
from cli.workload import workload_app
from libs.client import AsyncCluster
from schemas import config as c
from services.workload import runner

pytestmark = pytest.mark.kafka

NS = "ycsb.usertable"


def client_run(data_cluster, fn):
    async def go():
        async with AsyncCluster(data_cluster.settings.bootstrap, data_cluster.settings.cluster, timeout=60) as cl:
            return await fn(cl["ycsb"]["usertable"])

    return asyncio.run(go())


def all_records(data_cluster) -> dict[str, dict]:
    docs = client_run(data_cluster, lambda coll: coll.find({}).to_list())
    return {d["_id"]: d for d in docs}


def test_load_then_run_ycsb_a_and_d(data_cluster):
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    loaded = client_run(data_cluster, lambda coll: runner.load(coll, "a", 200, concurrency=4, batch_size=30, seed=1))
    assert (loaded.inserted, loaded.total_errors, loaded.operations) == (200, 0, 200)
    assert loaded.kinds["insert_many"].count == 7  # ceil(200 / 30) batches
    assert client_run(data_cluster, lambda coll: coll.count_documents({})) == 200
    before = all_records(data_cluster)
    record = before["user6284781860667377211"]  # YCSB's first key (keynum 0, hashed)
    assert sorted(record) == ["_id"] + [f"field{i}" for i in range(10)]
    assert all(len(record[f"field{i}"]) == 100 for i in range(10))

    a = client_run(data_cluster, lambda coll: runner.run(coll, "ycsb-a", 400, concurrency=8, record_count=200, seed=2))
    assert a.errors == {} and a.operations == 400
    reads, updates = a.kinds["read"], a.kinds["update"]
    assert reads.count + updates.count == 400
    assert 120 <= reads.count <= 280, "about half reads, half updates"
    for k in (reads, updates):
        assert (
            0
            < k.latency_ms["min"]
            <= k.latency_ms["p50"]
            <= k.latency_ms["p95"]
            <= k.latency_ms["p99"]
            <= k.latency_ms["max"]
        )
        assert k.ops_per_s > 0
    assert a.throughput_ops_s > 0
    after = all_records(data_cluster)
    assert after.keys() == before.keys()
    changed = [key for key in before if before[key] != after[key]]
    assert changed, "the updates changed stored records"
    assert all(sum(before[k][f] != after[k][f] for f in before[k]) >= 1 for k in changed)

    d = client_run(data_cluster, lambda coll: runner.run(coll, "ycsb-d", 200, concurrency=8, record_count=200, seed=3))
    assert d.errors == {} and set(d.kinds) <= {"read", "insert"}
    inserts = d.kinds["insert"].count if "insert" in d.kinds else 0
    assert d.inserted == inserts and d.kinds["read"].count + inserts == 200
    assert client_run(data_cluster, lambda coll: coll.count_documents({})) == 200 + inserts


def test_rate_is_honoured_and_errors_are_counted(data_cluster):
    # Nothing loaded: every read and update finds no record, which is counted, not raised.
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    snapshots: list[runner.Progress] = []
    started = time.monotonic()
    report = client_run(
        data_cluster,
        lambda coll: runner.run(
            coll,
            "ycsb-a",
            100,
            concurrency=8,
            rate=100,
            record_count=50,
            progress=snapshots.append,
            progress_interval=0.2,
        ),
    )
    assert time.monotonic() - started >= 0.9 and report.elapsed_s >= 0.9, "100 ops at 100 ops/s take ~1 s"
    assert report.target_rate == 100 and report.throughput_ops_s <= 110
    assert report.total_errors == 100 and set(report.errors) == {"read", "update"}
    assert {code for by_code in report.errors.values() for code in by_code} == {"NotFound"}
    assert len(snapshots) >= 3 and snapshots[-1].final and snapshots[-1].done == 100
    assert [s.done for s in snapshots] == sorted(s.done for s in snapshots)


def test_cli_load_and_run_with_json_and_a_bad_workload(data_cluster):
    data_cluster.command(c.ShardCollection(ns=NS, key={"_id": "hashed"}))
    s = data_cluster.settings
    app = typer.Typer()
    app.add_typer(workload_app, name="workload")

    @app.callback()
    def context(ctx: typer.Context) -> None:  # what shardlog's root callback builds
        ctx.obj = CliContext(s.bootstrap, s.cluster, 60.0)

    cli_runner = CliRunner()

    loaded = cli_runner.invoke(app, ["workload", "load", "ycsb", "--records", "50", "--json"])
    assert loaded.exit_code == 0, loaded.output
    doc = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["phase"] == "load" and doc["inserted"] == 50 and doc["total_errors"] == 0

    ran = cli_runner.invoke(app, ["workload", "run", "ycsb-b", "--ops", "60", "--records", "50", "--json"])
    assert ran.exit_code == 0, ran.output
    doc = json.loads(ran.stdout.strip().splitlines()[-1])
    assert {
        "ok",
        "phase",
        "workload",
        "ns",
        "operations",
        "elapsed_s",
        "throughput_ops_s",
        "concurrency",
        "target_rate",
        "inserted",
        "kinds",
        "errors",
        "total_errors",
    } <= doc.keys()
    assert (doc["workload"], doc["ns"], doc["operations"], doc["total_errors"]) == ("ycsb-b", NS, 60, 0)
    assert sum(k["count"] for k in doc["kinds"].values()) == 60
    assert {"p50", "p95", "p99", "max"} <= doc["kinds"]["read"]["latency_ms"].keys()

    human = cli_runner.invoke(app, ["workload", "run", "ycsb-c", "--ops", "20", "--records", "50"])
    assert human.exit_code == 0, human.output
    assert "read" in human.stdout and json.loads(human.stdout.strip().splitlines()[-1])["workload"] == "ycsb-c"

    for args in (
        ["run", "ycsb-z", "--ops", "10"],
        ["run", "ycsb-a", "--ops", "0"],
        ["run", "ycsb-a", "--ops", "10", "--rate", "0"],
    ):
        bad = cli_runner.invoke(app, ["workload", *args])
        assert bad.exit_code != 0, args
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: BadValue:"), (args, bad.stderr)
    assert "ycsb-z" in cli_runner.invoke(app, ["workload", "run", "ycsb-z", "--ops", "10"]).stderr
