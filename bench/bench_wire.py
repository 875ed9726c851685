"""YCSB-A / YCSB-C through the router's wire edge (pymongo) vs our Kafka client vs a raw TCP front, at concurrency 1 and 32.

Issue 14, section 5.  One cluster, every service its own process as in bench_e2e.py
(`services.config`, `services.shard` s0..s2, `services.router --instance r1` with
SHARDLOG_ROUTER_PORT=0: the port is read from its ready file), on $KAFKA_BOOTSTRAP's broker
under a fresh cluster name; `ycsb.usertable` sharded on {_id: "hashed"}.  Three systems, driven
by the SAME `services.workload.runner` (same operation stream, same seed, same histogram) from
this process:

- `wire`:  pymongo -> TCP -> router's wire edge -> shard -> router -> TCP.  Two Kafka hops.
  `--wire-client sync` (default): one `pymongo.MongoClient`, each operation in a thread of a
  pool of `concurrency` threads (how a threaded application uses pymongo);
  `--wire-client async`: pymongo's own `AsyncMongoClient` on this event loop.
- `kafka`: today's client path, `libs.client.AsyncCluster`: client -> router.requests ->
  router -> shard -> router -> client inbox.  Four Kafka hops.
- `raw` (the baseline the issue defines): an asyncio TCP front (`bench/_echo.py tcp-front`, a
  process) speaking a minimal framing (4-byte length + `R<key>` / `W<key>\\n<fields>`) that
  forwards each request through the same two Kafka hops to an echo back (`_echo.py back` x3,
  the shard processor's transactional loop, as in bench_e2e) and writes the reply back.  The
  client is a bare asyncio pool of `concurrency` connections, one request at a time on each.

Records are loaded once through the Kafka client (the wire path reads the same documents).
Per (workload, concurrency) the three systems run in turn, after one warm-up per system.
Figures: ops/s, p50, p99; ratios to raw; and the issue's two aims at concurrency 1 (wire p50
<= 0.5 x kafka p50; wire ops/s >= 0.8 x raw ops/s), printed as holding or not.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_wire.py [--records 10000] [--ops1 1000] [--ops32 8000]
        [--workloads a,c] [--concurrency 1,32] [--systems wire,kafka,raw] [--wire-client sync|async] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _events as E
from bench_e2e import SHARDS, Proc, wait_group, wait_ready

from libs import kafka
from libs.client import AsyncCluster
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.topics import LARGE_RECORDS, SHORT_LIVED, Topics, TopicSpec
from schemas import config as cfg
from services.workload import runner

ROOT = E.ROOT
NS_DB, NS_COLL = "ycsb", "usertable"
SYSTEMS = ("wire", "kafka", "raw")

out = sys.stdout  # the readable figures; stderr under --json


def say(*a, **kw) -> None:
    print(*a, **kw, file=out, flush=True)


# ------------------------------------------------------------------ clients


class SyncWireCollection:
    """What runner.run calls on a collection, through one shared pymongo MongoClient, each call
    in a thread of a pool (the pool has `concurrency` threads, pymongo's pool as many sockets)."""

    def __init__(self, uri: str, threads: int):
        import pymongo

        self.client = pymongo.MongoClient(uri, maxPoolSize=max(threads, 1))
        self.coll = self.client[NS_DB][NS_COLL]
        self.ns = f"{NS_DB}.{NS_COLL}"
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="wire")

    async def _call(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kw))

    async def find_one(self, filter: dict, projection=None):
        return await self._call(self.coll.find_one, filter, projection)

    async def update_one(self, filter: dict, update: dict) -> dict:
        r = await self._call(self.coll.update_one, filter, update)
        return {"matched": r.matched_count}

    async def insert_many(self, docs: list[dict], ordered: bool = True):
        return await self._call(self.coll.insert_many, docs, ordered=ordered)

    async def count_documents(self, filter: dict) -> int:
        # runner.run continues YCSB's key sequence after the documents there are.
        return int(await self._call(self.coll.count_documents, filter))

    async def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


class AsyncWireCollection:
    """The same through pymongo's AsyncMongoClient (no threads)."""

    def __init__(self, uri: str, threads: int):
        import pymongo

        self.client = pymongo.AsyncMongoClient(uri, maxPoolSize=max(threads, 1))
        self.coll = self.client[NS_DB][NS_COLL]
        self.ns = f"{NS_DB}.{NS_COLL}"

    async def find_one(self, filter: dict, projection=None):
        return await self.coll.find_one(filter, projection)

    async def update_one(self, filter: dict, update: dict) -> dict:
        r = await self.coll.update_one(filter, update)
        return {"matched": r.matched_count}

    async def insert_many(self, docs: list[dict], ordered: bool = True):
        return await self.coll.insert_many(docs, ordered=ordered)

    async def count_documents(self, filter: dict) -> int:
        return int(await self.coll.count_documents(filter))

    async def close(self) -> None:
        await self.client.close()


class RawTcpCollection:
    """The raw baseline's client: `connections` TCP connections to the echo tcp-front, one
    request at a time on each (as a driver's pool), 4-byte length framing, no BSON."""

    def __init__(self, port: int, connections: int):
        self.port, self.size = port, connections
        self.ns = f"{NS_DB}.{NS_COLL}"
        self.idle: asyncio.Queue = asyncio.Queue()

    async def start(self) -> None:
        for _ in range(self.size):
            self.idle.put_nowait(await asyncio.open_connection("127.0.0.1", self.port))

    async def request(self, value: bytes) -> bytes:
        reader, writer = await self.idle.get()
        try:
            writer.write(len(value).to_bytes(4, "big") + value)
            await writer.drain()
            n = int.from_bytes(await reader.readexactly(4), "big")
            return await reader.readexactly(n)
        finally:
            self.idle.put_nowait((reader, writer))

    async def find_one(self, filter: dict, projection=None) -> bytes:
        return await self.request(b"R" + filter["_id"].encode())

    async def update_one(self, filter: dict, update: dict) -> dict:
        body = json.dumps(update["$set"], separators=(",", ":")).encode()
        await self.request(b"W" + filter["_id"].encode() + b"\n" + body)
        return {"matched": 1}

    async def count_documents(self, filter: dict) -> int:
        # The echo keeps no documents to count: the loaded record count stands (A and C insert nothing).
        return 0

    async def close(self) -> None:
        while not self.idle.empty():
            _, writer = self.idle.get_nowait()
            writer.close()


# -------------------------------------------------------------------- cluster


class WireCluster:
    """config + 3 shards + router r1 (its wire edge on a free port) + the raw echo (tcp-front and
    3 backs), every one a process; `ycsb.usertable` sharded on hashed _id."""

    def __init__(
        self,
        bootstrap: str,
        cluster: str,
        tmp: Path,
        chunks: int | None = None,
        *,
        raw: bool = True,
        collections: tuple[str, ...] = (NS_COLL,),
    ):
        self.bootstrap, self.cluster, self.tmp, self.chunks_wanted = bootstrap, cluster, tmp, chunks
        self.raw, self.collections = raw, collections
        self.t = Topics(cluster)
        self.data, self.logs = tmp / "data", tmp / "logs"
        self.data.mkdir(parents=True)
        self.logs.mkdir(parents=True)
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SHARDLOG_CLUSTER": cluster,
            "SHARDLOG_DATA_DIR": str(self.data),
            "SHARDLOG_ROUTER_PORT": "0",
            "PYTHONPATH": str(ROOT),
        }
        self.procs: dict[str, Proc] = {}
        self.raw_backs = [f"{cluster}.raw.back{i}.requests" for i in range(len(SHARDS))] if raw else []
        self.uri = ""
        self.raw_port = 0
        self.chunks = None

    def spawn(self, name: str, argv: list[str]) -> Proc:
        p = Proc(name, argv, self.env, self.logs, self.data / f"{name}.ready")
        self.procs[name] = p
        return p

    def echo(self, name: str, *args: str) -> Proc:
        return self.spawn(
            name,
            [
                str(ROOT / "bench" / "_echo.py"),
                *args,
                "--bootstrap",
                self.bootstrap,
                "--ready",
                str(self.data / f"{name}.ready"),
            ],
        )

    async def start(self) -> None:
        t = self.t
        raw_topics = [
            *([TopicSpec(t.inbox("raw-tcp-front"), config=SHORT_LIVED)] if self.raw else []),
            *(TopicSpec(b, config=SHORT_LIVED) for b in self.raw_backs),
            *(
                TopicSpec(f"{self.cluster}.raw.back{i}.events", config={"cleanup.policy": "compact", **LARGE_RECORDS})
                for i in range(len(self.raw_backs))
            ),
        ]
        await kafka.ensure_topics(
            self.bootstrap, [*t.core(), *(s for sh in SHARDS for s in t.for_shard(sh)), *raw_topics]
        )
        t0 = time.monotonic()
        config = self.spawn("config", ["-m", "services.config"])
        backs = [
            self.echo(
                f"echo-back{i}",
                "back",
                "--requests",
                b,
                "--group",
                f"{self.cluster}.raw.back{i}",
                "--events",
                f"{self.cluster}.raw.back{i}.events",
            )
            for i, b in enumerate(self.raw_backs)
        ]
        await wait_ready([config], lambda p: "active")
        async with Requester(self.bootstrap, t.cli_replies, client_id="bench-wire") as r:
            for sid in SHARDS:
                reply = await r.request(t.config_commands, cfg.AddShard(shard=sid), timeout=60)
                assert reply.ok, reply
            reply = await r.request(
                t.config_commands,
                cfg.ShardCollection(
                    ns=f"{NS_DB}.{NS_COLL}", key={"_id": "hashed"}, numInitialChunks=self.chunks_wanted
                ),
                timeout=60,
            )
            assert reply.ok, reply
            self.chunks = reply.result["chunks"]
        shards = [self.spawn(f"shard-{s}", ["-m", "services.shard", "--shard-id", s]) for s in SHARDS]
        router = self.spawn("router-r1", ["-m", "services.router", "--instance", "r1"])
        fronts = (
            [
                self.echo(
                    "echo-tcp-front",
                    "tcp-front",
                    "--backs",
                    ",".join(self.raw_backs),
                    "--inbox",
                    t.inbox("raw-tcp-front"),
                )
            ]
            if self.raw
            else []
        )
        await wait_ready([*shards, router, *backs, *fronts], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        self.uri = router.info()["uri"]
        self.raw_port = fronts[0].info()["port"] if fronts else 0
        raw = f", raw tcp-front (port {self.raw_port}) + {len(backs)} echo backs" if self.raw else ""
        say(
            f"  config, {len(SHARDS)} shards, router r1 ({self.uri}){raw} up in {time.monotonic() - t0:.1f}s "
            f"({self.chunks} chunks each of {', '.join(NS_DB + '.' + c for c in self.collections)} "
            f"over {len(SHARDS)} shards)"
        )

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


# --------------------------------------------------------------------- bench


async def measure(coll, workload: str, ops: int, concurrency: int, records: int, seed: int) -> dict:
    final: list[runner.Progress] = []
    report = await runner.run(
        coll,
        workload,
        ops,
        concurrency=concurrency,
        record_count=records,
        seed=seed,
        progress=lambda p: final.append(p) if p.final else None,
        progress_interval=5.0,
    )
    p = final[-1]
    return {
        "ops": report.operations,
        "seconds": report.elapsed_s,
        "ops_s": report.throughput_ops_s,
        "p50_ms": p.p50_ms,
        "p99_ms": p.p99_ms,
        "errors": report.errors,
        "kinds": {k: {"count": v.count, "p50_ms": v.latency_ms["p50"]} for k, v in report.kinds.items()},
    }


async def run(args, bootstrap: str, cluster: str, tmp: Path) -> dict:
    c = WireCluster(bootstrap, cluster, tmp, args.chunks)
    results: list[dict] = []
    load: dict = {}
    try:
        await c.start()
        async with AsyncCluster(bootstrap, cluster) as kc:
            kafka_coll = kc[NS_DB][NS_COLL]
            rep = await runner.load(kafka_coll, "a", args.records, concurrency=32, batch_size=100, seed=args.seed)
            load = {"records": rep.operations, "seconds": rep.elapsed_s, "errors": rep.errors}
            say(
                f"  load (Kafka client): {rep.operations:,} records in {rep.elapsed_s:.2f}s"
                + (f"  ERRORS {rep.errors}" if rep.total_errors else "")
            )
            wire_cls = SyncWireCollection if args.wire_client == "sync" else AsyncWireCollection
            for conc in args.concurrency:
                colls = {}
                if "wire" in args.systems:
                    colls["wire"] = wire_cls(c.uri, conc)
                if "kafka" in args.systems:
                    colls["kafka"] = kafka_coll
                if "raw" in args.systems:
                    colls["raw"] = RawTcpCollection(c.raw_port, conc)
                    await colls["raw"].start()
                try:
                    for coll in colls.values():  # warm-up: connections, the router's routing table
                        await measure(coll, "c", min(args.warmup, 50 * conc), conc, args.records, args.seed + 1)
                    ops = args.ops1 if conc == 1 else args.ops32
                    for w in args.workloads:
                        for system, coll in colls.items():
                            r = await measure(coll, w, ops, conc, args.records, args.seed)
                            r.update(system=system, workload=f"ycsb-{w}", concurrency=conc)
                            results.append(r)
                            errs = sum(sum(v.values()) for v in r["errors"].values())
                            say(
                                f"  {system:5s} ycsb-{w} c={conc:<3d}: {r['ops']:6,} ops in {r['seconds']:6.2f}s = "
                                f"{r['ops_s']:7,.0f} ops/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
                                + (f"  ERRORS {r['errors']}" if errs else "")
                            )
                finally:
                    for system, coll in colls.items():
                        if system != "kafka":
                            await coll.close()
    finally:
        c.stop()
    return {"results": results, "load": load, "chunks": c.chunks}


def figures(results: list[dict]) -> dict:
    by = {(r["system"], r["workload"], r["concurrency"]): r for r in results}
    cells: dict = {}
    for w, conc in dict.fromkeys((r["workload"], r["concurrency"]) for r in results):
        cell: dict = {s: by[(s, w, conc)] for s in SYSTEMS if (s, w, conc) in by}
        raw, wire, kc = cell.get("raw"), cell.get("wire"), cell.get("kafka")
        for s in ("wire", "kafka"):
            if raw and s in cell:
                cell[f"{s}_raw_ops_s"] = round(cell[s]["ops_s"] / raw["ops_s"], 3)
                cell[f"{s}_raw_p50"] = round(cell[s]["p50_ms"] / raw["p50_ms"], 2)
                cell[f"{s}_raw_p99"] = round(cell[s]["p99_ms"] / raw["p99_ms"], 2)
        if wire and kc:
            cell["wire_kafka_p50"] = round(wire["p50_ms"] / kc["p50_ms"], 2)
            cell["wire_kafka_ops_s"] = round(wire["ops_s"] / kc["ops_s"], 2)
        cells[f"{w}_c{conc}"] = cell
    return cells


def summary(cells: dict) -> None:
    say(
        f"  {'':14s} {'wire ops/s':>10s} {'kafka':>7s} {'raw':>7s} {'w/raw':>6s} {'k/raw':>6s}   "
        f"{'p50 wire/kafka/raw ms':>24s} {'w/k':>5s} {'w/raw':>6s}   {'p99 wire/kafka/raw ms':>24s}"
    )
    nan = {"ops_s": float("nan"), "p50_ms": float("nan"), "p99_ms": float("nan")}
    for name, c in cells.items():
        w, k, r = c.get("wire", nan), c.get("kafka", nan), c.get("raw", nan)
        say(
            f"  {name:14s} {w['ops_s']:10,.0f} {k['ops_s']:7,.0f} {r['ops_s']:7,.0f} "
            f"{c.get('wire_raw_ops_s', float('nan')):6.3f} {c.get('kafka_raw_ops_s', float('nan')):6.3f}   "
            f"{w['p50_ms']:7.2f} /{k['p50_ms']:7.2f} /{r['p50_ms']:6.2f} {c.get('wire_kafka_p50', float('nan')):5.2f} "
            f"{c.get('wire_raw_p50', float('nan')):6.2f}   {w['p99_ms']:7.2f} /{k['p99_ms']:7.2f} /{r['p99_ms']:6.2f}"
        )
    for name, c in cells.items():
        if not name.endswith("_c1"):
            continue
        if "wire_kafka_p50" in c:
            ok = c["wire_kafka_p50"] <= 0.5
            say(
                f"  aim {name}: wire p50 <= 0.5 x kafka p50: {c['wire_kafka_p50']:.2f} -> {'holds' if ok else 'MISSED'}"
            )
        if "wire_raw_ops_s" in c:
            ok = c["wire_raw_ops_s"] >= 0.8
            say(
                f"  aim {name}: wire ops/s >= 0.8 x raw ops/s: {c['wire_raw_ops_s']:.3f} -> {'holds' if ok else 'MISSED'}"
            )


def main() -> None:
    global out
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000, help="records loaded (default 10,000)")
    p.add_argument("--ops1", type=int, default=1_000, help="operations per run at concurrency 1 (default 1,000)")
    p.add_argument("--ops32", type=int, default=8_000, help="operations per run at concurrency > 1 (default 8,000)")
    p.add_argument("--workloads", default="a,c", help="YCSB core workloads, comma-separated (default a,c)")
    p.add_argument("--concurrency", default="1,32", help="operations in flight, comma-separated (default 1,32)")
    p.add_argument("--systems", default="wire,kafka,raw", help="which of wire,kafka,raw to run (default all)")
    p.add_argument(
        "--wire-client",
        choices=["sync", "async"],
        default="sync",
        help="pymongo MongoClient + threads, or AsyncMongoClient",
    )
    p.add_argument("--chunks", type=int, default=None, help="numInitialChunks of ycsb.usertable (default 6)")
    p.add_argument("--warmup", type=int, default=500, help="ycsb-c operations per system before measuring")
    p.add_argument("--seed", type=int, default=1, help="the operation stream's seed (the same for every system)")
    p.add_argument("--json", action="store_true", help="stdout is only the JSON result line (figures to stderr)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores)")
    args = p.parse_args()
    args.workloads = [w.strip().lower().removeprefix("ycsb-") for w in args.workloads.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.systems = [s.strip() for s in args.systems.split(",")]
    if set(args.systems) - set(SYSTEMS):
        raise SystemExit(f"--systems takes {','.join(SYSTEMS)}")
    if args.json:
        out = sys.stderr
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-wire-"))
    say(
        f"wire benchmark: cluster {cluster}; {args.records:,} records; workloads {args.workloads}; concurrency "
        f"{args.concurrency}; {args.ops1:,} ops at c=1, {args.ops32:,} above; systems {args.systems}; "
        f"wire client pymongo {args.wire_client}"
    )
    t0 = time.monotonic()
    try:
        res = asyncio.run(run(args, bootstrap, cluster, tmp))
    finally:
        try:
            asyncio.run(delete_cluster_topics(bootstrap, cluster))
        except Exception as e:  # clean-up must not hide the figures
            print(f"warning: could not delete the topics of {cluster}: {e}", file=sys.stderr)
        if args.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    cells = figures(res["results"])
    say(f"summary ({time.monotonic() - t0:.0f}s wall):")
    summary(cells)
    sys.stdout.flush()
    E.result_line(
        "wire", records=args.records, wire_client=args.wire_client, chunks=res["chunks"], load=res["load"], **cells
    )


if __name__ == "__main__":
    main()
