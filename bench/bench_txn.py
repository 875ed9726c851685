"""Multi-document transactions through the router (issue 33 §4): what a transaction costs against
plain writes, a bank of concurrent transfers and what it costs YCSB-A beside it, and a long
list-append history checked for anomalies.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_txn.py [--parts latency,bank,elle]
        [--seconds 8] [--concurrency 1,16]
        [--accounts 300] [--bank-concurrency 16] [--bank-seconds 15]
        [--records 10000] [--ycsb-ops 3000] [--ycsb-concurrency 16] [--repeat 1]
        [--elle-seconds 20] [--elle-workers 8] [--seed 42] [--json] [--keep]

One cluster: config, 3 shards s0..s2 and router r1 (its wire edge on a free port), each a process
(bench_sessions.py's cluster), on $KAFKA_BOOTSTRAP's broker under a fresh cluster name, the
balancer off.  `txn.pairs`, `bank.acct` and `elle.lists` are range-sharded on {_id: 1} so that
shard i owns the _ids [i·SPAN, (i+1)·SPAN); `ycsb.usertable` is sharded on hashed _id.  Every
client is pymongo through the router's wire edge, `c` threads sharing one MongoClient.

**latency**: each of `c` workers has its own documents (no two workers meet), and repeats for
--seconds one of
    write   one update_one ($inc) on its document on s0: the baseline
    plain2  two update_one, no transaction: its document on s0, then its document on s1     (a)
    txn1    with_transaction of those two kinds of update, both documents on s0 (commitTransaction) (b)
    txn2    with_transaction, one document on s0 and one on s1 (two-phase commit)             (c)
at each concurrency.  p50/p99 of a whole operation and ops/s; for txn1 / txn2 also the
commitTransaction command's own p50/p99 (pymongo's command monitoring).  Ratios of txn2 to `write`
and to plain2; the issue's aim: a two-shard commit within 3× a plain write's latency.

**bank**: --accounts accounts of 1,000 each, dealt round robin over the 3 shards; --bank-concurrency
threads each transfer a random amount between a random pair ($inc -x, $inc +x) in
with_transaction, so a third of the transfers are single-shard and two thirds two-phase.  Committed
transfers/s and the abort rate: (callback invocations - commits) / invocations, each extra
invocation being a TransientTransactionError pymongo retried; the failed commands by code.  The
total is checked after every bank run: a changed total fails the bench (exit 1).  Then YCSB-A
(runner.run, zipfian, 50 % reads / 50 % updates over --records in ycsb.usertable) alone and beside
the bank, alternating --repeat times: ops/s and p99 beside / alone.

**elle**: --elle-workers threads run transactions of 1-4 micro-operations (append a unique value to
a list, or read a list) over 30 keys on the 3 shards for --elle-seconds; the history is checked by
libs/listappend.py for what snapshot isolation forbids (G0, G1a/b/c, G-single, lost or duplicated
appends): a violation fails the bench.  The integration test runs a short one of this.

Ends with one JSON line (`"bench": "txn"`).  Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import _events as E
import pymongo
from bench_sessions import Cluster, pooled, ratio_of
from bench_wire import NS_COLL, NS_DB, SyncWireCollection
from bson.min_key import MinKey
from pymongo import monitoring
from pymongo.errors import PyMongoError

from libs.kafka import delete_cluster_topics
from libs.listappend import Op, Txn, check
from services.workload import runner

SHARDS = ("s0", "s1", "s2")
SPAN = 1_000_000  # shard i owns the _ids [i·SPAN, (i+1)·SPAN) of the range-sharded collections
PAIRS, BANK, ELLE = "txn.pairs", "bank.acct", "elle.lists"
MODES = ("write", "plain2", "txn1", "txn2")
BALANCE = 1_000
ELLE_KEYS = [i * SPAN + k for i in range(len(SHARDS)) for k in range(10)]

out = sys.stdout  # the readable figures; stderr under --json


def say(*a: object) -> None:
    print(*a, file=out, flush=True)


def collection(client: pymongo.MongoClient, ns: str) -> pymongo.collection.Collection:
    db, coll = ns.split(".", 1)
    return client[db][coll]


def on(shard: int, n: int) -> int:
    """The n-th _id on shard `shard` of a range-sharded collection."""
    return shard * SPAN + n


# ------------------------------------------------------------------ measuring


class Commands(monitoring.CommandListener):
    """What pymongo sent: each command's duration by name ("update" inside a transaction is
    "update in txn"), and the failed commands by code (each a statement or commit the router
    refused: the causes of the aborts)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_txn: set[tuple[int, int]] = set()  # (request id, connection) of commands of a transaction
        self.first: set[tuple[int, int]] = set()  # of those, the statements that start one
        self.reset()

    def reset(self) -> tuple[dict[str, runner.LatencyHistogram], Counter[str]]:
        """What was seen since the last reset; start afresh."""
        with self.lock:
            before = getattr(self, "took", {}), getattr(self, "refused", Counter())
            self.took: dict[str, runner.LatencyHistogram] = {}
            self.refused: Counter[str] = Counter()
        return before

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if "txnNumber" in event.command and "autocommit" in event.command:
            with self.lock:
                self.in_txn.add((event.request_id, event.connection_id))
                if event.command.get("startTransaction"):  # the router picks the snapshot
                    self.first.add((event.request_id, event.connection_id))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._ended(event, None)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        failure = event.failure or {}
        self._ended(event, f"{event.command_name}:{failure.get('codeName') or failure.get('code', '?')}")

    def _ended(self, event: monitoring.CommandSucceededEvent | monitoring.CommandFailedEvent, refused: str | None):
        with self.lock:
            txn = (event.request_id, event.connection_id) in self.in_txn
            self.in_txn.discard((event.request_id, event.connection_id))
            if refused:
                self.refused[refused] += 1
                return
            name = event.command_name + (" in txn" if txn and event.command_name != "commitTransaction" else "")
            if (event.request_id, event.connection_id) in self.first:
                self.first.discard((event.request_id, event.connection_id))
                name += ", first"
            self.took.setdefault(name, runner.LatencyHistogram()).record(event.duration_micros / 1e6)


class Run:
    """One timed run of `workers` threads: latencies of what succeeded, errors by kind."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hist = runner.LatencyHistogram()
        self.errors: Counter[str] = Counter()
        self.seconds = 0.0

    def ok(self, seconds: float) -> None:
        with self.lock:
            self.hist.record(seconds)

    def error(self, e: BaseException) -> None:
        with self.lock:
            self.errors[type(e).__name__ + (f":{e.code}" if getattr(e, "code", None) else "")] += 1

    def figures(self) -> dict:
        h = self.hist
        return {
            "ops": h.count,
            "seconds": round(self.seconds, 2),
            "ops_s": round(h.count / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": h.percentile_ms(50),
            "p99_ms": h.percentile_ms(99),
            "errors": dict(self.errors),
        }


def drive(op: Callable[[int], None], workers: int, stop: threading.Event | float) -> Run:
    """Worker w calls op(w) again and again until `stop` (an event, or seconds from now)."""
    r = Run()
    if not isinstance(stop, threading.Event):
        seconds, stop = stop, threading.Event()
        threading.Timer(seconds, stop.set).start()

    def worker(w: int) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                op(w)
            except PyMongoError as e:
                r.error(e)
            else:
                r.ok(time.perf_counter() - t)

    threads = [threading.Thread(target=worker, args=(w,), name=f"txn-bench-{w}") for w in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r.seconds = time.perf_counter() - t0
    return r


# ---------------------------------------------------------------------- set-up


def range_sharded(client: pymongo.MongoClient, ns: str) -> None:
    """`ns` sharded on {_id: 1}, shard i owning [i·SPAN, (i+1)·SPAN) (moves of empty ranges)."""
    admin = client.admin
    admin.command("shardCollection", ns, key={"_id": 1})
    for i in range(1, len(SHARDS)):
        admin.command("split", ns, middle={"_id": i * SPAN})
    for i, shard in enumerate(SHARDS):  # a range already on its shard (the database's primary) stays
        bounds = {"min": {"_id": i * SPAN if i else MinKey()}}
        if i + 1 < len(SHARDS):
            bounds["max"] = {"_id": (i + 1) * SPAN}
        admin.command("moveRange", ns, toShard=shard, **bounds)


def owners(client: pymongo.MongoClient, ns: str) -> list[str]:
    """Which shard each of the collection's chunks is on, in key order (config.chunks)."""
    uuid = client.config.collections.find_one({"_id": ns})
    query = {"uuid": uuid["uuid"]} if uuid and "uuid" in uuid else {"ns": ns}
    return [c["shard"] for c in client.config.chunks.find(query)]


# --------------------------------------------------------------------- latency


def latency(args, client: pymongo.MongoClient, commands: Commands) -> dict:
    coll = collection(client, PAIRS)
    most = max(args.concurrency)
    # Worker w: a = on(0, 2w), a2 = on(0, 2w + 1), b = on(1, 2w): no two workers share a document.
    coll.insert_many([{"_id": on(s, n), "n": 0} for s in (0, 1) for n in range(2 * most)])
    inc = {"$inc": {"n": 1}}

    def in_txn(first: int, second: int) -> Callable[[int], None]:
        def op(w: int) -> None:
            def body(session) -> None:
                coll.update_one({"_id": first + 2 * w}, inc, session=session)
                coll.update_one({"_id": second + 2 * w}, inc, session=session)

            with client.start_session() as session:
                session.with_transaction(body)

        return op

    def write(w: int) -> None:
        coll.update_one({"_id": on(0, 2 * w)}, inc)

    def plain2(w: int) -> None:
        coll.update_one({"_id": on(0, 2 * w)}, inc)
        coll.update_one({"_id": on(1, 2 * w)}, inc)

    ops = {"write": write, "plain2": plain2, "txn1": in_txn(on(0, 0), on(0, 1)), "txn2": in_txn(on(0, 0), on(1, 0))}
    cells: dict = {}
    for c in args.concurrency:
        for mode in MODES:  # warm-up: connections, sessions, routing
            drive(ops[mode], c, 1.0)
        for mode in MODES:
            commands.reset()
            f = drive(ops[mode], c, float(args.seconds)).figures()
            took, failed = commands.reset()
            if mode.startswith("txn"):
                for name, what in (
                    ("commitTransaction", "commit"),
                    ("update in txn, first", "first_statement"),
                    ("update in txn", "second_statement"),
                ):
                    h = took.get(name, runner.LatencyHistogram())
                    f[f"{what}_p50_ms"], f[f"{what}_p99_ms"] = h.percentile_ms(50), h.percentile_ms(99)
            f["failed_commands"] = dict(failed)
            cells[f"{mode}_c{c}"] = f
            commit = (
                f" (statements p50 {f['first_statement_p50_ms']:.1f} + {f['second_statement_p50_ms']:.1f}, "
                f"commitTransaction p50 {f['commit_p50_ms']:6.2f} "
                f"p99 {f['commit_p99_ms']:6.2f})"
                if "commit_p50_ms" in f
                else ""
            )
            say(
                f"  {mode:6s} c={c:<2d}: {f['ops']:6,} in {f['seconds']:5.1f}s = {f['ops_s']:7,.1f} ops/s  "
                f"p50 {f['p50_ms']:7.2f} ms  p99 {f['p99_ms']:7.2f} ms{commit}"
                + (f"  ERRORS {f['errors']}" if f["errors"] else "")
                + (f"  failed commands {dict(failed)}" if failed else "")
            )
        w, p2, t2 = cells[f"write_c{c}"], cells[f"plain2_c{c}"], cells[f"txn2_c{c}"]
        ratios = {
            "txn2_write_p50": round(t2["p50_ms"] / w["p50_ms"], 2),
            "txn2_write_p99": round(t2["p99_ms"] / w["p99_ms"], 2),
            "txn2_plain2_p50": round(t2["p50_ms"] / p2["p50_ms"], 2),
            "txn2_plain2_p99": round(t2["p99_ms"] / p2["p99_ms"], 2),
            "commit2_write_p50": round(t2["commit_p50_ms"] / w["p50_ms"], 2),
            "txn1_write_p50": round(cells[f"txn1_c{c}"]["p50_ms"] / w["p50_ms"], 2),
            "txn2_write_ops_s": round(t2["ops_s"] / w["ops_s"], 3),
        }
        cells[f"ratios_c{c}"] = ratios
        say(
            f"  c={c}: two-shard transaction / plain write: p50 ×{ratios['txn2_write_p50']}, p99 ×{ratios['txn2_write_p99']}; "
            f"/ two plain writes: p50 ×{ratios['txn2_plain2_p50']}, p99 ×{ratios['txn2_plain2_p99']}; "
            f"its commitTransaction alone / plain write p50 ×{ratios['commit2_write_p50']}; "
            f"single-shard transaction / plain write p50 ×{ratios['txn1_write_p50']}"
        )
        for what, key in (("the whole two-shard transaction", "txn2_write_p50"), ("its commit", "commit2_write_p50")):
            holds = "holds" if ratios[key] <= 3 else "MISSED"
            say(f"  aim c={c}: {what} p50 <= 3 × a plain write's: ×{ratios[key]} -> {holds}")
    return cells


# ------------------------------------------------------------------------ bank


class Bank:
    """Transfers between random pairs of accounts, each in pymongo's with_transaction."""

    def __init__(self, client: pymongo.MongoClient, commands: Commands, accounts: int, workers: int, seed: int):
        self.client, self.commands = client, commands
        self.coll = collection(client, BANK)
        self.ids = [on(i % len(SHARDS), i // len(SHARDS)) for i in range(accounts)]  # round robin over the shards
        self.total = BALANCE * accounts
        self.rngs = [random.Random(seed * 1000 + w) for w in range(workers)]
        self.lock = threading.Lock()
        self.invocations = 0  # of the callback: one per attempt, a retry being a TransientTransactionError
        self.two_shard = 0  # committed transfers between accounts on two shards

    def load(self) -> None:
        self.coll.insert_many([{"_id": i, "v": BALANCE} for i in self.ids])

    def transfer(self, w: int) -> None:
        rng = self.rngs[w]
        a, b = rng.sample(self.ids, 2)
        amount = rng.randint(1, 10)

        def body(session) -> None:
            with self.lock:
                self.invocations += 1
            self.coll.update_one({"_id": a}, {"$inc": {"v": -amount}}, session=session)
            self.coll.update_one({"_id": b}, {"$inc": {"v": amount}}, session=session)

        with self.client.start_session() as session:
            session.with_transaction(body)
        if a // SPAN != b // SPAN:
            with self.lock:
                self.two_shard += 1

    def run(self, workers: int, stop: threading.Event | float) -> dict:
        self.commands.reset()
        inv0, two0 = self.invocations, self.two_shard
        r = drive(self.transfer, workers, stop)
        _, failed = self.commands.reset()
        f = r.figures()
        invocations, committed = self.invocations - inv0, f["ops"]
        f.update(
            committed=committed,
            two_shard=self.two_shard - two0,
            invocations=invocations,
            retries=invocations - committed - sum(f["errors"].values()),
            abort_rate=round((invocations - committed) / invocations, 3) if invocations else 0.0,
            failed_commands=dict(failed),
        )
        return f

    def audit(self) -> int:
        return sum(d["v"] for d in self.coll.find({}, {"v": 1}))


def say_bank(label: str, f: dict) -> None:
    say(
        f"  {label}: {f['committed']:,} transfers committed in {f['seconds']:.1f}s = {f['ops_s']:,.1f}/s "
        f"({f['two_shard']:,} two-shard), p50 {f['p50_ms']:.1f} ms p99 {f['p99_ms']:.1f} ms; "
        f"{f['invocations']:,} callback invocations: abort rate {f['abort_rate']:.1%}"
        + (f"; ERRORS {f['errors']}" if f["errors"] else "")
    )
    if f["failed_commands"]:
        say(f"    failed commands: {dict(Counter(f['failed_commands']).most_common())}")


async def ycsb(coll: SyncWireCollection, args, ops: int) -> dict:
    final: list[runner.Progress] = []
    rep = await runner.run(
        coll,
        "a",
        ops,
        concurrency=args.ycsb_concurrency,
        record_count=args.records,
        seed=args.seed,
        progress=lambda p: final.append(p) if p.final else None,
        progress_interval=5.0,
    )
    return {
        "ops_s": rep.throughput_ops_s,
        "p50_ms": final[-1].p50_ms,
        "p99_ms": final[-1].p99_ms,
        "errors": rep.total_errors,
    }


async def bank_part(args, client: pymongo.MongoClient, commands: Commands, uri: str) -> dict:
    bank = Bank(client, commands, args.accounts, args.bank_concurrency, args.seed)
    bank.load()
    bad: list[str] = []

    def audited(label: str) -> None:
        total = bank.audit()
        if total != bank.total:
            bad.append(f"{label}: total {total:,}, expected {bank.total:,}")
            say(f"  INVARIANT BROKEN after {label}: total {total:,}, expected {bank.total:,}")

    bank.run(args.bank_concurrency, 1.0)  # warm-up
    alone = bank.run(args.bank_concurrency, float(args.bank_seconds))
    say_bank(f"bank alone, c={args.bank_concurrency}, {args.accounts} accounts", alone)
    audited("the bank alone")

    wire = SyncWireCollection(uri, args.ycsb_concurrency)
    try:
        load = await runner.load(wire, "a", args.records, concurrency=8, batch_size=500, seed=args.seed)
        say(f"  ycsb load: {load.operations:,} records in {load.elapsed_s:.1f}s")
        await ycsb(wire, args, min(args.ycsb_ops, 500))  # warm-up: connections, routing
        runs: dict[str, list[dict]] = {"alone": [], "beside": []}
        banks: list[dict] = []
        for _ in range(args.repeat):
            runs["alone"].append(await ycsb(wire, args, args.ycsb_ops))
            stop = threading.Event()
            beside = asyncio.create_task(asyncio.to_thread(bank.run, args.bank_concurrency, stop))
            await asyncio.sleep(1.0)  # the bank is at full speed before YCSB starts
            try:
                runs["beside"].append(await ycsb(wire, args, args.ycsb_ops))
            finally:
                stop.set()
                banks.append(await beside)
            audited("the bank beside YCSB-A")
            for name in runs:
                r = runs[name][-1]
                say(
                    f"  ycsb-a c={args.ycsb_concurrency} {name:6s}: {r['ops_s']:7,.1f} ops/s  p50 {r['p50_ms']:7.2f} ms  "
                    f"p99 {r['p99_ms']:7.2f} ms" + (f"  ERRORS {r['errors']}" if r["errors"] else "")
                )
            say_bank("  the bank beside it", banks[-1])
    finally:
        await wire.close()
    figures = {name: pooled(rs) for name, rs in runs.items()}
    ratio = ratio_of(figures["beside"], figures["alone"])
    say(
        f"  YCSB-A beside the bank / alone: ops/s ×{ratio['ops_s']}, p50 ×{ratio['p50']}, p99 ×{ratio['p99']}"
        f" (median of {args.repeat} run(s) each)"
    )
    say(f"  bank total after every run: {'unchanged' if not bad else 'CHANGED'} ({bank.audit():,})")
    bank_beside = sorted(banks, key=lambda f: f["ops_s"])[len(banks) // 2]
    return {
        "accounts": args.accounts,
        "alone": alone,
        "beside": bank_beside,
        "ycsb": figures,
        "ycsb_ratio": ratio,
        "invariant": "broken: " + "; ".join(bad) if bad else "held",
    }


# ------------------------------------------------------------------------ elle


def elle(args, client: pymongo.MongoClient) -> dict:
    coll = collection(client, ELLE)
    coll.insert_many([{"_id": k, "l": []} for k in ELLE_KEYS])
    history: list[Txn] = []
    values = itertools.count(1)
    rngs = [random.Random(args.seed * 7919 + w) for w in range(args.elle_workers)]
    ids = itertools.count()

    def txn(w: int) -> None:
        rng = rngs[w]
        plan = [
            ("append", k, next(values)) if rng.random() < 0.5 else ("r", k, None)
            for k in rng.sample(ELLE_KEYS, rng.randint(1, 4))
        ]
        ops: list[Op] = []

        def body(session) -> None:
            ops.clear()  # with_transaction may run it again: only the last attempt counts
            for f, k, v in plan:
                if f == "append":
                    coll.update_one({"_id": k}, {"$push": {"l": v}}, session=session)
                    ops.append(Op("append", k, v))
                else:
                    ops.append(Op("r", k, tuple(coll.find_one({"_id": k}, session=session)["l"])))

        invoked = time.monotonic()
        try:
            with client.start_session() as session:
                session.with_transaction(body)
        except PyMongoError:
            # Its outcome is not known for sure: its appends may have committed, its reads say nothing.
            unknown = tuple(Op("append", k, v) for f, k, v in plan if f == "append")
            history.append(Txn(next(ids), unknown, "info", invoked, time.monotonic()))
            raise
        history.append(Txn(next(ids), tuple(ops), "ok", invoked, time.monotonic()))

    r = drive(txn, args.elle_workers, float(args.elle_seconds))
    now = time.monotonic()
    final = Txn(next(ids), tuple(Op("r", d["_id"], tuple(d["l"])) for d in coll.find()), "ok", now, now)
    t0 = time.perf_counter()
    report = check([*history, final])
    violations = report.violations("snapshot-isolation")
    ok = sum(t.status == "ok" for t in history)
    say(
        f"  elle list-append: {len(history):,} transactions in {r.seconds:.1f}s ({ok:,} ok, {len(history) - ok:,} unknown), "
        f"{report.edges:,} dependency edges, checked in {time.perf_counter() - t0:.1f}s: "
        + (
            f"VIOLATIONS {violations}"
            if violations
            else f"no anomaly snapshot isolation forbids (counts {report.counts()})"
        )
    )
    return {
        "transactions": len(history),
        "ok": ok,
        "seconds": round(r.seconds, 1),
        "edges": report.edges,
        "anomalies": report.counts(),
        "violations": {k: v[:5] for k, v in violations.items()},
    }


# ------------------------------------------------------------------------- main


async def run(args, bootstrap: str, tmp: Path) -> dict:
    c = Cluster(bootstrap, SHARDS, tmp, name="benchtxn", env={"SHARDLOG_ROUTER_PORT": "0"})
    say(f"transactions benchmark: cluster {c.cluster}; parts {','.join(args.parts)}")
    res: dict = {}
    try:
        with contextlib.redirect_stdout(out):  # the cluster says it is up on stdout
            await c.start(namespaces=[f"{NS_DB}.{NS_COLL}"])
        commands = Commands()
        client: pymongo.MongoClient = pymongo.MongoClient(
            c.uri,
            maxPoolSize=max([*args.concurrency, args.bank_concurrency, args.elle_workers]) + 4,
            event_listeners=[commands],
        )
        try:
            client.admin.command("balancerStop")  # the ranges stay where they were put
            for ns in (PAIRS, BANK, ELLE):
                range_sharded(client, ns)
            say(f"  {PAIRS}, {BANK}, {ELLE}: chunks on {owners(client, PAIRS)}")
            if "latency" in args.parts:
                say(f"latency: {args.seconds}s per mode and concurrency")
                res["latency"] = latency(args, client, commands)
            if "bank" in args.parts:
                say(
                    f"bank: {args.accounts} accounts over {len(SHARDS)} shards, {args.bank_concurrency} transfer threads"
                )
                res["bank"] = await bank_part(args, client, commands, c.uri)
            if "elle" in args.parts:
                say(f"elle: {args.elle_workers} workers for {args.elle_seconds}s")
                res["elle"] = await asyncio.to_thread(elle, args, client)
        finally:
            client.close()
    finally:
        c.stop()
        try:
            await delete_cluster_topics(bootstrap, c.cluster)
        except Exception as e:  # clean-up must not hide the figures
            print(f"warning: could not delete the topics of {c.cluster}: {e}", file=sys.stderr)
    return res


def main() -> None:
    global out
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="latency,bank,elle", help="which of latency,bank,elle to run (default all)")
    p.add_argument("--seconds", type=float, default=8, help="latency: seconds per mode and concurrency (default 8)")
    p.add_argument("--concurrency", default="1,16", help="latency: concurrencies, comma-separated (default 1,16)")
    p.add_argument("--accounts", type=int, default=300, help="bank: accounts over the 3 shards (default 300)")
    p.add_argument("--bank-concurrency", type=int, default=16, help="bank: transfer threads (default 16)")
    p.add_argument("--bank-seconds", type=float, default=15, help="bank: seconds of the bank alone (default 15)")
    p.add_argument("--records", type=int, default=10_000, help="YCSB records in ycsb.usertable (default 10,000)")
    p.add_argument("--ycsb-ops", type=int, default=3_000, help="YCSB-A operations per run (default 3,000)")
    p.add_argument("--ycsb-concurrency", type=int, default=16, help="YCSB-A operations in flight (default 16)")
    p.add_argument(
        "--repeat", type=int, default=1, help="YCSB-A runs alone and beside the bank, alternating (default 1)"
    )
    p.add_argument("--elle-seconds", type=float, default=20, help="elle: seconds of list-append (default 20)")
    p.add_argument("--elle-workers", type=int, default=8, help="elle: transaction threads (default 8)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="stdout is only the JSON result line (figures to stderr)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (the services' logs and stores)")
    args = p.parse_args()
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if set(args.parts) - {"latency", "bank", "elle"}:
        raise SystemExit("--parts takes latency,bank,elle")
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    if args.json:
        out = sys.stderr
    bootstrap = E.bootstrap()
    tmp = Path(tempfile.mkdtemp(prefix="bench-txn-"))
    t0 = time.monotonic()
    try:
        res = asyncio.run(run(args, bootstrap, tmp))
    finally:
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"({time.monotonic() - t0:.0f}s wall)")
    sys.stdout.flush()
    E.result_line("txn", **res)
    broken = [
        *(["the bank's total changed"] if res.get("bank", {}).get("invariant", "held") != "held" else []),
        *(["list-append anomalies"] if res.get("elle", {}).get("violations") else []),
    ]
    if broken:
        raise SystemExit(f"bench_txn: {' and '.join(broken)}")


if __name__ == "__main__":
    main()
