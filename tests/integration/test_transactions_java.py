"""The MongoDB Java driver (the jars `make ycsb-java` fetched, infra/ycsb/) runs
`ClientSession.withTransaction` against a live router: a transfer between documents on two shards
(two-phase commit, its recoveryToken naming the coordinator) commits whole, invisible outside
until then; a transaction it aborts leaves nothing.  One JVM: java's source-file launcher compiles
tests/integration/java/TransactionTransfer.java in memory and runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bson import MaxKey

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
YCSB = [sys.executable, str(ROOT / "infra" / "ycsb" / "ycsb.py")]
SOURCE = Path(__file__).resolve().parent / "java" / "TransactionTransfer.java"


def test_the_java_drivers_with_transaction_moves_a_value_between_two_shards(data_cluster):
    subprocess.run([*YCSB, "fetch"], check=True, capture_output=True, timeout=300)  # no-op once built
    classpath = subprocess.run([*YCSB, "classpath"], check=True, capture_output=True, text=True).stdout.strip()
    client = data_cluster.mongo_client()
    client.admin.command("shardCollection", "bank.acct", key={"k": 1})
    client.admin.command("split", "bank.acct", middle={"k": 100})
    primary = data_cluster.router.follower.catalog.databases["bank"].primary  # holds k < 100
    other = next(s for s in data_cluster.shards if s != primary)
    client.admin.command("moveRange", "bank.acct", min={"k": 100}, max={"k": MaxKey()}, toShard=other)
    acct = client.bank.acct
    acct.insert_many([{"_id": "a", "k": 1, "v": 100}, {"_id": "b", "k": 150, "v": 0}])

    java = ["java", "-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath]
    done = subprocess.run([*java, str(SOURCE), data_cluster.uri], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"java failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines == [
        "inside [75, 25] outside [100, 0]",
        f'token {{"recoveryShardId": "{primary}"}}',  # the first writer: two-phase commit's coordinator
        "before abort [-925, 25, 5]",
        "after [75, 25]",
    ], done.stdout + done.stderr[-2000:]
    assert sorted((d["_id"], d["v"]) for d in acct.find()) == [("a", 75), ("b", 25)]
    acct.update_many({}, {"$inc": {"v": 1}})  # nothing left holding a document on either shard
    assert sorted(d["v"] for d in acct.find()) == [26, 76]
