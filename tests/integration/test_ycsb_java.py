"""YCSB's own engine driving the MongoDB Java driver (a second driver, in another language,
nobody here wrote) through our binding against a live router's wire edge: a tiny load and
workload-A run, every operation OK.  `make test` builds the jars first (`make ycsb-java`);
YCSB writes its fields as BSON binary, so this needs the router to keep BSON types (0016)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import config as cfg
from services.workload.ycsb import build_key_name

pytestmark = pytest.mark.kafka

YCSB = [sys.executable, str(Path(__file__).resolve().parents[2] / "infra" / "ycsb" / "ycsb.py")]
RECORDS, OPS = 200, 500


def ycsb(*args: str) -> dict:
    proc = subprocess.run([*YCSB, *args, "--json"], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"ycsb"')]
    assert lines, f"no YCSB report (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == 0 and not report["failures"], (
        f"YCSB {args[0]}: exit {proc.returncode}, failures {report['failures']}\n{proc.stderr[-3000:]}"
    )
    return report["report"]


def test_java_ycsb_loads_and_runs_workload_a_through_the_router(data_cluster):
    subprocess.run([*YCSB, "fetch"], check=True, capture_output=True, timeout=300)  # no-op once built
    data_cluster.command(cfg.ShardCollection(ns="ycsb.usertable", key={"_id": "hashed"}))
    url = data_cluster.uri.rstrip("/") + "/ycsb?w=1"

    load = ycsb("load", "--url", url, "--records", str(RECORDS), "--threads", "4")
    assert load["INSERT"]["Return=OK"] == RECORDS
    db = data_cluster.mongo_client()["ycsb"]
    coll = db["usertable"]
    assert db.command("count", "usertable")["n"] == RECORDS
    doc = coll.find_one({"_id": build_key_name(RECORDS - 1)})  # YCSB's own key names, as ours
    assert doc is not None and sorted(doc) == ["_id", *(f"field{i}" for i in range(10))], doc
    assert isinstance(doc["field0"], bytes) and len(doc["field0"]) == 100  # BSON binary, as YCSB's binding

    run = ycsb("run", "--url", url, "--records", str(RECORDS), "--ops", str(OPS), "--threads", "4")
    assert run["READ"]["Return=OK"] + run["UPDATE"]["Return=OK"] == OPS
    assert run["READ"]["Return=OK"] > 0 and run["UPDATE"]["Return=OK"] > 0
    assert db.command("count", "usertable")["n"] == RECORDS
