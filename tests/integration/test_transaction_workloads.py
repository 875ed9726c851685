"""Transactions under concurrency on three shards, through pymongo (issue 33 §3): a bank whose
total never changes, audited inside transactions while a range moves; and Elle's list-append
workload, its history checked by libs/listappend.py for what snapshot isolation forbids: G0, G1a,
G1b, G1c, G-single, lost and duplicated appends (write skew, G2, it allows). This is the short
history CI runs; bench/bench_txn.py runs a longer one, bench/bench_txn_faults.py 10,000
transactions under kill -9, SIGSTOP, router kills and moves."""

from __future__ import annotations

import random
import threading
import time

import pytest
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from libs.listappend import Op, Txn, check
from schemas import config as c

pytestmark = pytest.mark.kafka

ACCOUNTS = [10, 20, 110, 120, 210, 220]  # two on each of s0, s1, s2


def three_shards(cluster, ns: str) -> None:
    cluster.command(c.ShardCollection(ns=ns, key={"k": 1}))
    admin = cluster.mongo_client().admin
    for at in (100, 200):
        admin.command("split", ns, middle={"k": at})
    admin.command("moveRange", ns, min={"k": 100}, max={"k": 200}, toShard="s1")
    admin.command("moveRange", ns, min={"k": 200}, toShard="s2")


def test_a_bank_keeps_its_total_under_concurrent_transfers_audits_and_a_migration(data_cluster):
    three_shards(data_cluster, "bank.acct")
    client = data_cluster.mongo_client()
    coll = client.bank.acct
    coll.insert_many([{"_id": k, "k": k, "v": 100} for k in ACCOUNTS])
    total = 100 * len(ACCOUNTS)
    audits: list[int] = []
    errors: list[str] = []
    committed = [0]

    def transfer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            a, b = rng.sample(ACCOUNTS, 2)
            amount = rng.randint(1, 5)

            def body(session, a=a, b=b, amount=amount):
                coll.update_one({"k": a}, {"$inc": {"v": -amount}}, session=session)
                coll.update_one({"k": b}, {"$inc": {"v": amount}}, session=session)

            try:
                with client.start_session() as session:
                    session.with_transaction(body)
                committed[0] += 1
            except PyMongoError as e:
                errors.append(f"transfer: {e}")

    def audit() -> None:
        for _ in range(10):
            try:
                with client.start_session() as session:
                    audits.append(
                        session.with_transaction(
                            lambda s: sum(d["v"] for d in coll.find({}, session=s)),
                            read_concern=ReadConcern("snapshot"),
                        )
                    )
            except PyMongoError as e:
                errors.append(f"audit: {e}")

    threads = [threading.Thread(target=transfer, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=audit))
    for t in threads:
        t.start()
    client.admin.command("moveRange", "bank.acct", min={"k": 100}, max={"k": 200}, toShard="s2")
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a workload thread did not finish"
    assert not errors, errors
    assert audits and set(audits) == {total}, audits
    assert sum(d["v"] for d in coll.find()) == total
    assert committed[0] == 48


def test_list_append_transactions_show_no_anomaly(data_cluster):
    three_shards(data_cluster, "elle.lists")
    client = data_cluster.mongo_client()
    coll = client.elle.lists
    keys = [5, 50, 105, 150, 205, 250]
    coll.insert_many([{"_id": k, "k": k, "l": []} for k in keys])
    history: list[Txn] = []
    lock = threading.Lock()
    counter = iter(range(1, 10**9))

    def worker(w: int) -> None:
        rng = random.Random(w)
        for i in range(15):
            plan = [(rng.choice(["append", "r"]), rng.choice(keys)) for _ in range(rng.randint(1, 4))]
            with lock:
                plan = [(f, k, next(counter) if f == "append" else None) for f, k in plan]
            ops: list[Op] = []

            def body(session, plan=plan, ops=ops):
                ops.clear()  # with_transaction may run it again: only the last attempt counts
                for f, k, v in plan:
                    if f == "append":
                        coll.update_one({"k": k}, {"$push": {"l": v}}, session=session)
                        ops.append(Op("append", k, v))
                    else:
                        doc = coll.find_one({"k": k}, session=session)
                        ops.append(Op("r", k, tuple(doc["l"])))

            invoked = time.monotonic()
            try:
                with client.start_session() as session:
                    session.with_transaction(body)
                status = "ok"
            except PyMongoError:
                status = "info"  # its outcome is not known for sure
            history.append(Txn(w * 1000 + i, tuple(ops), status, invoked, time.monotonic()))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive()
    final = Txn(
        10**6,
        tuple(Op("r", k, tuple(coll.find_one({"k": k})["l"])) for k in keys),
        "ok",
        time.monotonic(),
        time.monotonic(),
    )
    report = check([*history, final])
    assert not report.violations("snapshot-isolation"), report.anomalies  # write skew (G2) is allowed
    assert sum(t.status == "ok" for t in history) >= 50, "most transactions committed"
    assert report.edges > 0
