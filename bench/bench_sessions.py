"""Logical sessions and retryable writes: what they cost, and what storage they take and give back.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_sessions.py cost    [--records 10000] [--ops 20000]
                                                                         [--concurrency 32] [--repeat 2]
    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_sessions.py storage [--writes 100000] [--sessions 1000]
                                                                         [--concurrency 32]

Every service is its own process, as in bench_e2e.py (config, shards, router r1), on the
broker of $KAFKA_BOOTSTRAP under a fresh cluster name; the client is this process.

**cost**: YCSB-A (50 % reads, 50 % updates, zipfian) through the same client, router and
3 shards, with retryable writes (every update on an implicit session with a txnNumber, the
shard recording it in its transactions table in the same transaction) and without (the
baseline: the same updates, no session, nothing recorded).  Runs alternate, same seed and
operation stream; ops/s, p50 and p99 of each and their ratio.

**storage**: one shard.  `--sessions` sessions each make `--writes / --sessions` retryable
updates (upserts of a small document per session).  Then: bytes of the shard's changelog
on disk (DescribeLogDirs, `_logdirs.py`), its live records and tombstones by kind (read from
the beginning), and the RocksDB bytes of the transactions table (keys and values under its
prefix, read from the shard's store opened read-only).  Then the sessions expire
(`logicalSessionTimeoutMinutes` set to 3 s): the shard's reaper forgets them and the
changelog — configured to compact aggressively for the run (segment.ms, min.cleanable.dirty.ratio,
delete.retention.ms) — drops their records and then the tombstones; the same figures after.
The baseline is the same changelog's documents alone (what is left once every record is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import _events as E
import _logdirs
from bench_e2e import Proc, wait_group, wait_ready
from rocksdict import AccessType, Options, Rdict

from libs import kafka
from libs.bus import read_to_end
from libs.client import AsyncCluster
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.topics import Topics, TopicSpec
from schemas import config as cfg
from services.workload import runner

ROOT = E.ROOT
NS_DB, NS_COLL = "ycsb", "usertable"
TXN_STATE_PREFIX = b"x/"  # the transactions table in a shard's store (services/shard/documents.py)
TXN_LOG_PREFIX = b"txn/"  # its records' changelog keys
AGGRESSIVE_COMPACTION = {
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1000",
    "min.compaction.lag.ms": "0",
}


class Cluster:
    """config + shards + router r1 as processes, under a fresh cluster name (`name` and a
    suffix); `env`: more settings for every service (bench_indexes shares this)."""

    def __init__(
        self, bootstrap: str, shards: tuple[str, ...], tmp: Path, *, name: str = "benchsess", env: dict | None = None
    ):
        self.bootstrap, self.shards, self.tmp, self.name = bootstrap, shards, tmp, name
        self.cluster = E.cluster_name(name)
        self.t = Topics(self.cluster)
        self.data, self.logs = tmp / "data", tmp / "logs"
        self.data.mkdir()
        self.logs.mkdir()
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SHARDLOG_CLUSTER": self.cluster,
            "SHARDLOG_DATA_DIR": str(self.data),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.procs: dict[str, Proc] = {}
        self.uri = ""  # the router's wire edge, once started

    def service(self, name: str, module: str, *args: str) -> Proc:
        p = Proc(name, ["-m", module, *args], self.env, self.logs, self.data / f"{name}.ready")
        self.procs[name] = p
        return p

    async def command(self, cmd) -> dict:
        async with Requester(self.bootstrap, self.t.cli_replies, client_id=f"{self.name}-cli") as r:
            reply = await r.request(self.t.config_commands, cmd, timeout=60)
        assert reply.ok, reply
        return reply.result or {}

    async def start(
        self, *, changelog_config: dict[str, str] | None = None, chunks: int = 0, namespaces: list[str] | None = None
    ) -> None:
        """Topics, config, AddShard, each of `namespaces` (default the YCSB table) sharded on a
        hashed _id, then the shards and the router."""
        t = self.t
        specs = [*t.core(), *(s for sh in self.shards for s in t.for_shard(sh))]
        if changelog_config:  # created here with it, before the shard creates it without
            specs = [
                TopicSpec(x.name, x.partitions, {**x.config, **changelog_config})
                if x.name.endswith(".changelog")
                else x
                for x in specs
            ]
        await kafka.ensure_topics(self.bootstrap, specs)
        t0 = time.monotonic()
        config = self.service("config", "services.config")
        await wait_ready([config], lambda p: "active")
        for sid in self.shards:
            await self.command(cfg.AddShard(shard=sid))
        key = {"_id": "hashed"}
        for ns in namespaces if namespaces is not None else [f"{NS_DB}.{NS_COLL}"]:
            await self.command(cfg.ShardCollection(ns=ns, key=key, **({"numInitialChunks": chunks} if chunks else {})))
        shards = [self.service(f"shard-{s}", "services.shard", "--shard-id", s) for s in self.shards]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        await wait_ready([*shards, router], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        self.uri = (router.info() or {}).get("uri", "")
        at = f" ({self.uri})" if self.uri else ""
        print(f"  config, {len(self.shards)} shard(s), router r1{at} up in {time.monotonic() - t0:.1f}s", flush=True)

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


# ---------------------------------------------------------------------- cost


async def cost(args, bootstrap: str, tmp: Path) -> None:
    c = Cluster(bootstrap, ("s0", "s1", "s2"), tmp)
    print(
        f"sessions benchmark (cost): cluster {c.cluster}; {args.records:,} records, {args.ops:,} ops of YCSB-A "
        f"per run, concurrency {args.concurrency}, {args.repeat} run(s) each way, alternating"
    )
    try:
        await c.start(chunks=args.chunks)
        async with (
            AsyncCluster(bootstrap, c.cluster, retry_writes=True) as retrying,
            AsyncCluster(bootstrap, c.cluster, retry_writes=False) as plain,
        ):
            load = await runner.load(
                plain[NS_DB][NS_COLL], "a", args.records, concurrency=args.concurrency, seed=args.seed
            )
            print(f"  load: {load.operations:,} records in {load.elapsed_s:.2f}s")
            clients = {"retryable": retrying, "plain": plain}
            results = await alternating_ycsb_a(clients, args)
        figures = {name: pooled(reps) for name, reps in results.items()}
        r, p = figures["retryable"], figures["plain"]
        ratio = ratio_of(r, p)
        print(
            f"\n  retryable writes / plain writes: ops/s x{ratio['ops_s']:.2f}, p50 x{ratio['p50']:.2f}, "
            f"p99 x{ratio['p99']:.2f} (median of {args.repeat} run(s) each)"
        )
        E.result_line(
            "sessions.cost",
            records=args.records,
            ops=args.ops,
            concurrency=args.concurrency,
            retryable=r,
            plain=p,
            ratio=ratio,
        )
    finally:
        c.stop()
        await delete_cluster_topics(bootstrap, c.cluster)


async def alternating_ycsb_a(clients: dict[str, AsyncCluster], args) -> dict[str, list[dict]]:
    """Warm each client's cluster up with a short YCSB-A run, then `args.repeat` rounds of one
    YCSB-A run each, alternating between them with the same seed and operation stream (so a
    noisy minute hurts both); every run's figures, printed as it ends, per client."""
    for cl in clients.values():  # warm-up: metadata, groups, the session pool, exporters' connections
        await runner.run(
            cl[NS_DB][NS_COLL],
            "a",
            min(args.ops, 2000),
            concurrency=args.concurrency,
            record_count=args.records,
            seed=args.seed,
        )
    results: dict[str, list[dict]] = {name: [] for name in clients}
    width = max(len(name) for name in clients)
    for _ in range(args.repeat):
        for name, cl in clients.items():
            final: list[runner.Progress] = []
            rep = await runner.run(
                cl[NS_DB][NS_COLL],
                "a",
                args.ops,
                concurrency=args.concurrency,
                record_count=args.records,
                seed=args.seed,
                progress=lambda p: final.append(p) if p.final else None,  # noqa: B023 (called within the loop)
                progress_interval=5.0,
            )
            r = {
                "ops_s": round(rep.throughput_ops_s, 1),
                "p50_ms": final[-1].p50_ms,
                "p99_ms": final[-1].p99_ms,
                "update_p99_ms": rep.kinds["update"].latency_ms["p99"],
                "errors": rep.total_errors,
            }
            results[name].append(r)
            print(
                f"  {name:{width}s} ycsb-a: {rep.operations:7,} ops in {rep.elapsed_s:6.2f}s = "
                f"{r['ops_s']:7,.0f} ops/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
                f"  (updates p99 {r['update_p99_ms']:6.2f} ms)"
                + (f"  ERRORS {rep.errors}" if rep.total_errors else ""),
                flush=True,
            )
    return results


def ratio_of(a: dict, b: dict) -> dict:
    """a's ops/s, p50 and p99 over b's."""
    return {
        "ops_s": round(a["ops_s"] / b["ops_s"], 3),
        "p50": round(a["p50_ms"] / b["p50_ms"], 3),
        "p99": round(a["p99_ms"] / b["p99_ms"], 3),
    }


def pooled(runs: list[dict]) -> dict:
    """The median run's figures (by ops/s)."""
    mid = sorted(runs, key=lambda r: r["ops_s"])[len(runs) // 2]
    return {**mid, "errors": sum(r["errors"] for r in runs)}


# ------------------------------------------------------------------- storage


def state_bytes(store_path: Path) -> tuple[int, int]:
    """(entries, bytes of keys and values) of the transactions table, from the shard's store
    opened read-only while the shard runs (RocksDB replays its WAL: the latest state)."""
    db = Rdict(str(store_path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        n = size = 0
        it = db.iter()
        it.seek(TXN_STATE_PREFIX)
        while it.valid() and it.key().startswith(TXN_STATE_PREFIX):
            n += 1
            size += len(it.key()) + len(it.value())
            it.next()
        return n, size
    finally:
        db.close()


async def changelog_figures(bootstrap: str, topic: str) -> dict:
    """Bytes on disk, and what reading from the beginning finds: records by kind, tombstones."""
    counts = {"documents": 0, "documentBytes": 0, "txnRecords": 0, "txnBytes": 0, "tombstones": 0, "other": 0}

    async def take(records):
        for rec in records:
            key = rec.key or b""
            if rec.value is None:
                counts["tombstones"] += 1
            elif key.startswith(TXN_LOG_PREFIX):
                counts["txnRecords"] += 1
                counts["txnBytes"] += len(key) + len(rec.value)
            elif key.startswith(b"doc/"):
                counts["documents"] += 1
                counts["documentBytes"] += len(key) + len(rec.value)
            else:
                counts["other"] += 1

    await read_to_end(bootstrap, topic, take, client_id="bench-sessions")
    return {"diskBytes": await _logdirs.topic_bytes(bootstrap, topic), **counts}


async def storage(args, bootstrap: str, tmp: Path) -> None:
    c = Cluster(bootstrap, ("s0",), tmp)
    per = max(1, args.writes // args.sessions)
    print(
        f"sessions benchmark (storage): cluster {c.cluster}; {args.sessions:,} sessions x {per:,} retryable "
        f"writes = {args.sessions * per:,} on one shard, concurrency {args.concurrency}"
    )
    changelog = c.t.shard_changelog("s0")
    store = c.data / "shard-s0" / "documents"
    try:
        await c.start(changelog_config=AGGRESSIVE_COMPACTION)
        await c.command(cfg.SetSetting(key="logicalSessionRefreshMillis", value=1000))
        async with (
            AsyncCluster(bootstrap, c.cluster) as cl,
            AsyncCluster(bootstrap, c.cluster, retry_writes=False) as plain,
        ):
            coll = cl[NS_DB][NS_COLL]
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(args.sessions):
                queue.put_nowait(i)
            t0 = time.monotonic()

            async def worker() -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    session = cl.start_session()
                    for n in range(per):
                        await coll.update_one({"_id": f"s{i}"}, {"$set": {"n": n}}, upsert=True, session=session)

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
            wrote = time.monotonic() - t0
            print(f"  {args.sessions * per:,} retryable writes in {wrote:.1f}s = {args.sessions * per / wrote:,.0f}/s")
            await asyncio.sleep(3)  # let the last segment roll and the cleaner pass over the writes
            before = {**await changelog_figures(bootstrap, changelog), "state": state_bytes(store)}
            show("live sessions", before)
            # Expire them: every session idle for 3 s is gone from the store, then reaped by the shard.
            await c.command(cfg.SetSetting(key="logicalSessionTimeoutMinutes", value=0.05))
            t1 = time.monotonic()
            while state_bytes(store)[0] and time.monotonic() - t1 < args.wait:
                await asyncio.sleep(1)
            reaped = time.monotonic() - t1
            # Compaction needs its segment rolled (a later write) and a second pass for the tombstones.
            while time.monotonic() - t1 < args.wait:
                await plain[NS_DB]["ticks"].update_one({"_id": 0}, {"$inc": {"n": 1}}, upsert=True)
                figures = await changelog_figures(bootstrap, changelog)
                if figures["txnRecords"] == 0 and figures["tombstones"] == 0:
                    break
                await asyncio.sleep(2)
            compacted = time.monotonic() - t1
            after = {**await changelog_figures(bootstrap, changelog), "state": state_bytes(store)}
            show("after expiry", after)
        ratio = round(after["diskBytes"] / max(1, before["diskBytes"]), 3)
        print(
            f"\n  reaped in {reaped:.1f}s, compacted in {compacted:.1f}s; changelog on disk after/before: x{ratio:.2f}; "
            f"transactions table {before['state'][1]:,} -> {after['state'][1]:,} bytes"
        )
        E.result_line(
            "sessions.storage",
            sessions=args.sessions,
            writes=args.sessions * per,
            before=before,
            after=after,
            ratio_disk=ratio,
            reaped_s=round(reaped, 1),
            compacted_s=round(compacted, 1),
        )
    finally:
        c.stop()
        await delete_cluster_topics(bootstrap, c.cluster)


def show(label: str, f: dict) -> None:
    n, size = f["state"]
    print(
        f"  {label:13s}: changelog {f['diskBytes']:,} bytes on disk; {f['documents']:,} document records "
        f"({f['documentBytes']:,} B), {f['txnRecords']:,} transactions-table records ({f['txnBytes']:,} B), "
        f"{f['tombstones']:,} tombstones; state: {n:,} transactions-table keys, {size:,} bytes"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost", help="YCSB-A with and without retryable writes")
    c.add_argument("--records", type=int, default=10_000)
    c.add_argument("--ops", type=int, default=20_000)
    c.add_argument("--concurrency", type=int, default=32)
    c.add_argument("--repeat", type=int, default=3)
    c.add_argument("--chunks", type=int, default=0, help="initial chunks of the hashed collection (default: MongoDB's)")
    c.add_argument("--seed", type=int, default=42)
    s = sub.add_parser("storage", help="changelog and state bytes before and after sessions expire")
    s.add_argument("--writes", type=int, default=100_000)
    s.add_argument("--sessions", type=int, default=1_000)
    s.add_argument("--concurrency", type=int, default=32)
    s.add_argument("--wait", type=float, default=180, help="seconds to wait for reaping and compaction")
    args = p.parse_args()
    bootstrap = E.bootstrap()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    try:
        asyncio.run((cost if args.what == "cost" else storage)(args, bootstrap, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
