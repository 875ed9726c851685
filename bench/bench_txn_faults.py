"""Transactions on a real cluster under faults (issue 33 §3): Elle's list-append history
checked for anomalies, and a bank whose total never changes; the long runs that
tests/integration/test_transaction_workloads.py shortens.

    .venv/bin/python bench/bench_txn_faults.py                  # 10,000 list-append transactions, then the bank
    .venv/bin/python bench/bench_txn_faults.py --txns 2000 --transfers 500 --workers 8 --fault-every 4
    .venv/bin/python bench/bench_txn_faults.py --bug txn-first-writer-does-not-win --txns 600 --transfers 0

A config server, shards s0, s1 and s2, a router and the range deleter, each its own process,
on the broker of $KAFKA_BOOTSTRAP.  A nemesis, every `--fault-every` seconds, does one of:
kill -9 a shard and restart it, SIGSTOP a shard for 2-4 s, kill -9 the router and restart it
(same port), move a range to another shard.

list-append  lists under 30 keys (ten on each shard); workers run pymongo `with_transaction`s
             of one to four micro-operations: append a unique value to a key's list, or read a
             key's whole list.  First `--baseline` transactions without faults, then `--txns`
             under the nemesis.  At the end every process is back, a last transaction reads
             every list, and libs/listappend.py checks the whole history for what snapshot
             isolation forbids: G0, G1a, G1b, G1c, G-single, lost, duplicated appends (write
             skew, G2, it allows).
bank         30 accounts of 100 (ten on each shard); workers move 1-5 between two random
             accounts with `with_transaction`, one attempt in five an audit that sums every
             account in a snapshot transaction; `--transfers` under the nemesis.  The total
             never changes, and every audit saw it.

Prints committed / unknown transactions, anomalies by kind, the bank's total and audits, the
faults done, and list-append transactions/s under faults against the baseline's (the ratio).
Exit 1 if an anomaly is found or the bank is wrong — or, with `--bug NAME` (a mutation of
libs.faults.KNOWN_BUGS switched on in the shards: the proof the checker sees what it should),
exit 1 if nothing is found.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import _events as E  # noqa: E402
from bench_takeover import ServiceProcess  # noqa: E402
from pymongo import MongoClient  # noqa: E402
from pymongo.errors import PyMongoError  # noqa: E402
from pymongo.read_concern import ReadConcern  # noqa: E402

from libs import faults, kafka, listappend  # noqa: E402
from libs.kafka import delete_cluster_topics  # noqa: E402
from libs.requests import Requester  # noqa: E402
from libs.service import ServiceSettings  # noqa: E402
from libs.topics import Topics  # noqa: E402
from schemas import config as c  # noqa: E402

NS_DB, NS_COLL, BANK = "elle", "lists", "accounts"
SHARDS = ("s0", "s1", "s2")
KEYS = [b * 100 + k for b in range(3) for k in range(5, 100, 10)]  # ten on each shard's range


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The processes, each restartable by name."""

    def __init__(self, settings: ServiceSettings, logs: Path, router_port: int, bug: str | None) -> None:
        self.settings, self.logs, self.router_port = settings, logs, router_port
        self.bug_env = {"SHARDLOG_BUGS": bug} if bug else {}
        self.procs: dict[str, ServiceProcess] = {}

    def start(self, name: str) -> None:
        role: str | None = None
        if name == "config":
            p, role = ServiceProcess(self.settings, "services.config", [], "config", self.logs), "active"
        elif name in SHARDS:
            args = ["--shard-id", name]
            p = ServiceProcess(self.settings, "services.shard", args, f"shard-{name}", self.logs, self.bug_env)
            role = "active"
        elif name == "router":
            args = ["--instance", "r1", "--port", str(self.router_port)]
            p = ServiceProcess(self.settings, "services.router", args, "router-r1", self.logs)
        else:
            p = ServiceProcess(self.settings, "services.range_deleter", [], "range-deleter", self.logs)
        self.procs[name] = p
        p.wait(role, 120)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGCONT)
                p.proc.terminate()
                try:
                    p.proc.wait(15)
                except Exception:
                    p.proc.kill()


async def _config(settings: ServiceSettings, *cmds: Any) -> None:
    async with Requester(settings.bootstrap, settings.topics.cli_replies) as r:
        for cmd in cmds:
            reply = await r.request(settings.topics.config_commands, cmd, timeout=60)
            if not reply.ok:
                raise SystemExit(f"{cmd.type} refused: {reply}")


def _set_up(client: MongoClient) -> None:
    """Both collections sharded on k, split at 100 and 200, the ranges on s0, s1 and s2."""
    admin = client.admin
    admin.command("enableSharding", NS_DB, primaryShard="s0")
    for coll in (NS_COLL, BANK):
        ns = f"{NS_DB}.{coll}"
        admin.command("shardCollection", ns, key={"k": 1})
        for at in (100, 200):
            admin.command("split", ns, middle={"k": at})
        admin.command("moveRange", ns, min={"k": 100}, max={"k": 200}, toShard="s1")
        admin.command("moveRange", ns, min={"k": 200}, toShard="s2")
    client[NS_DB][NS_COLL].insert_many([{"_id": k, "k": k, "l": []} for k in KEYS])


def _in_threads(worker: Callable[[int, Iterator[int]], None], workers: int, jobs: int) -> float:
    """`jobs` shared among `workers` threads, each `worker(w, todo)` taking from one iterator;
    the seconds until all are done."""
    todo = iter(range(jobs))
    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w, todo)) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - began


class Workload:
    """Workers running list-append transactions; the history they saw."""

    def __init__(self, uri: str, workers: int, seed: int) -> None:
        self.uri, self.workers, self.seed = uri, workers, seed
        self.history: list[listappend.Txn] = []
        self.lock = threading.Lock()
        self.values = itertools.count(1)
        self.ids = itertools.count(1)
        self.runs = 0  # (each run's workers draw from generators of their own)

    def run(self, txns: int) -> float:
        """`txns` more transactions shared among the workers; the seconds they took."""
        self.runs += 1
        return _in_threads(self._worker, self.workers, txns)

    def _worker(self, w: int, todo) -> None:
        rng = random.Random(self.seed * 1000 + self.runs * 100 + w)
        client = MongoClient(self.uri, serverSelectionTimeoutMS=60_000, socketTimeoutMS=60_000)
        coll = client[NS_DB][NS_COLL]
        try:
            while True:
                with self.lock:
                    if next(todo, None) is None:
                        return
                    steps = [(rng.choice(("append", "r")), rng.choice(KEYS)) for _ in range(rng.randint(1, 4))]
                    plan = [(f, k, next(self.values) if f == "append" else None) for f, k in steps]
                    tid = next(self.ids)
                ops: list[listappend.Op] = []

                def body(session, plan=plan, ops=ops) -> None:
                    ops.clear()  # (with_transaction may run it again: only the last attempt counts)
                    for f, k, v in plan:
                        if f == "append":
                            coll.update_one({"k": k}, {"$push": {"l": v}}, session=session)
                            ops.append(listappend.Op("append", k, v))
                        else:
                            doc = coll.find_one({"k": k}, session=session)
                            ops.append(listappend.Op("r", k, tuple(doc["l"]) if doc else ()))

                invoked, status = time.monotonic(), "ok"
                try:
                    with client.start_session() as session:
                        session.with_transaction(body)
                except PyMongoError:
                    status = "info"  # may have committed: its appends may be seen, never called lost
                with self.lock:
                    self.history.append(listappend.Txn(tid, tuple(ops), status, invoked, time.monotonic()))
        finally:
            client.close()


class Bank:
    """Transfers between accounts (ten on each shard) and audits of the total, each in a
    transaction; what the audits saw."""

    def __init__(self, uri: str, workers: int, seed: int) -> None:
        self.uri, self.workers, self.seed = uri, workers, seed
        self.audits: list[int] = []
        self.committed = self.unknown = 0
        self.lock = threading.Lock()

    def open(self, client: MongoClient) -> int:
        client[NS_DB][BANK].insert_many([{"_id": k, "k": k, "v": 100} for k in KEYS])
        return 100 * len(KEYS)

    def run(self, transfers: int) -> float:
        return _in_threads(self._worker, self.workers, transfers)

    def _worker(self, w: int, todo) -> None:
        rng = random.Random(self.seed * 7919 + w)
        client = MongoClient(self.uri, serverSelectionTimeoutMS=60_000, socketTimeoutMS=60_000)
        coll = client[NS_DB][BANK]
        try:
            while True:
                with self.lock:
                    if next(todo, None) is None:
                        return
                audit = rng.random() < 0.2
                a, b = rng.sample(KEYS, 2)
                amount = rng.randint(1, 5)

                def transfer(session, a=a, b=b, amount=amount) -> None:
                    coll.update_one({"k": a}, {"$inc": {"v": -amount}}, session=session)
                    coll.update_one({"k": b}, {"$inc": {"v": amount}}, session=session)

                def total(session) -> int:
                    return sum(d["v"] for d in coll.find({}, session=session))

                try:
                    with client.start_session() as session:
                        if audit:
                            seen = session.with_transaction(total, read_concern=ReadConcern("snapshot"))
                            with self.lock:
                                self.audits.append(seen)
                        else:
                            session.with_transaction(transfer)
                            with self.lock:
                                self.committed += 1
                except PyMongoError:
                    with self.lock:
                        self.unknown += 1  # the total must hold whatever became of it
        finally:
            client.close()


class Nemesis:
    """Every `every` seconds one fault, until stopped; what it did."""

    def __init__(self, cluster: Cluster, client: MongoClient, every: float, seed: int) -> None:
        self.cluster, self.client, self.every = cluster, client, every
        self.rng = random.Random(seed)
        self.done: list[str] = []
        self.failures: list[str] = []  # (a move refused while orphans wait for deletion, say)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            kind = self.rng.choice(("kill-shard", "stop-shard", "kill-router", "move-range"))
            try:
                getattr(self, kind.replace("-", "_"))()
                self.done.append(kind)
            except Exception as e:  # a fault that could not be done is reported, not fatal
                self.done.append(f"{kind} failed")
                self.failures.append(f"{kind}: {type(e).__name__}: {e}"[:200])

    def kill_shard(self) -> None:
        sid = self.rng.choice(SHARDS)
        self.cluster.procs[sid].kill9()
        self.cluster.start(sid)

    def stop_shard(self) -> None:
        p = self.cluster.procs[self.rng.choice(SHARDS)]
        p.proc.send_signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(2.0, 4.0))  # the fault itself: how long the process is frozen
        p.proc.send_signal(signal.SIGCONT)

    def kill_router(self) -> None:
        self.cluster.procs["router"].kill9()
        self.cluster.start("router")

    def move_range(self) -> None:
        ns = f"{NS_DB}.{self.rng.choice((NS_COLL, BANK))}"
        uuid = self.client.config.collections.find_one({"_id": ns})["uuid"]
        chunks = list(self.client.config.chunks.find({"uuid": uuid}, {"min": 1, "max": 1, "shard": 1}))
        chunk = self.rng.choice(chunks)
        to = self.rng.choice([s for s in SHARDS if s != chunk["shard"]])
        self.client.admin.command("moveRange", ns, min=chunk["min"], max=chunk["max"], toShard=to)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--txns", type=int, default=10_000, help="list-append transactions under faults (default 10,000)")
    p.add_argument("--baseline", type=int, default=500, help="list-append transactions first, without faults (500)")
    p.add_argument("--transfers", type=int, default=1_000, help="bank transfers and audits under faults (1,000)")
    p.add_argument("--workers", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults (default 5)")
    p.add_argument("--seed", type=int, default=1, help="the workloads' and the nemesis' seed (default 1)")
    p.add_argument("--bug", choices=sorted(faults.KNOWN_BUGS), help="a mutation switched on in the shards")
    args = p.parse_args()

    bootstrap, cluster_name = E.bootstrap(), E.cluster_name("elle")
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-txn-faults-"))
    settings = ServiceSettings(bootstrap, cluster_name, tmp / "data", 6000)
    asyncio.run(kafka.ensure_topics(bootstrap, Topics(cluster_name).core()))
    port = _free_port()
    cluster = Cluster(settings, tmp / "logs", port, args.bug)
    (tmp / "logs").mkdir(parents=True)
    try:
        cluster.start("config")
        asyncio.run(_config(settings, *(c.AddShard(shard=sid) for sid in SHARDS)))
        for name in (*SHARDS, "router", "range-deleter"):
            cluster.start(name)
        uri = f"mongodb://127.0.0.1:{port}/"
        admin_client = MongoClient(uri, serverSelectionTimeoutMS=60_000)
        _set_up(admin_client)
        work = Workload(uri, args.workers, args.seed)
        bank = Bank(uri, args.workers, args.seed)
        bank_total = bank.open(admin_client)
        quiet_s = work.run(args.baseline)
        quiet = len(work.history)
        print(f"baseline: {quiet} transactions without faults in {quiet_s:.1f} s ({E.rate(quiet, quiet_s):.1f}/s)")

        nemesis = Nemesis(cluster, admin_client, args.fault_every, args.seed)
        nemesis.thread.start()
        faulty_s = work.run(args.txns)
        bank_s = bank.run(args.transfers)
        nemesis.stop.set()
        nemesis.thread.join(120)
        for name, proc in cluster.procs.items():  # everything back before the last reads
            proc.proc.send_signal(signal.SIGCONT)
            if proc.proc.poll() is not None:
                cluster.start(name)
        under = len(work.history) - quiet
        print(f"under faults: {under} transactions in {faulty_s:.1f} s ({E.rate(under, faulty_s):.1f}/s)")

        coll = admin_client[NS_DB][NS_COLL]
        now = time.monotonic()
        final = listappend.Txn(0, tuple(listappend.Op("r", d["k"], tuple(d["l"])) for d in coll.find()), "ok", now, now)
        report = listappend.check([*work.history, final])
        wrong = report.violations("snapshot-isolation")
        statuses = {s: sum(t.status == s for t in work.history) for s in ("ok", "info")}
        print(f"list-append: {statuses}; dependency edges {report.edges}")
        print(f"anomalies: {report.counts() or 'none'}")
        for kind, found in wrong.items():
            print(f"  {kind}: {found[:3]}")

        held = sum(d["v"] for d in admin_client[NS_DB][BANK].find())
        bad_audits = [a for a in bank.audits if a != bank_total]
        bank_ok = held == bank_total and not bad_audits
        print(
            f"bank: {bank.committed} transfers committed, {bank.unknown} given up, {len(bank.audits)} audits in "
            f"{bank_s:.1f} s; total {held} of {bank_total}; audits that saw another total: {bad_audits[:5] or 'none'}"
        )
        kinds = {k: sum(d == k for d in nemesis.done) for k in sorted(set(nemesis.done))}
        print(f"faults: {kinds}" + "".join(f"\n  {f}" for f in nemesis.failures[:3]))
        ratio = E.rate(under, faulty_s) / E.rate(quiet, quiet_s) if quiet else float("nan")
        print(f"ratio: list-append transactions/s under faults / without = {ratio:.2f}")
        E.result_line(
            "txn_faults",
            txns=len(work.history),
            committed=statuses["ok"],
            unknown=statuses["info"],
            anomalies=report.counts(),
            violations=sorted(wrong),
            bank_transfers=bank.committed,
            bank_audits=len(bank.audits),
            bank_ok=bank_ok,
            faults=kinds,
            quiet_tps=round(E.rate(quiet, quiet_s), 1),
            faulty_tps=round(E.rate(under, faulty_s), 1),
            ratio=round(ratio, 2),
            bug=args.bug,
        )
        admin_client.close()
        found = bool(wrong) or not bank_ok
        if args.bug:
            print(f"with {args.bug}: {'found' if found else 'NOT found'}")
            return 0 if found else 1
        return 1 if found else 0
    finally:
        cluster.stop_all()
        asyncio.run(delete_cluster_topics(bootstrap, cluster_name))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
