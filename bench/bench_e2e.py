"""End to end YCSB-A / YCSB-C through the router(s) to 3 shards, against a raw aiokafka echo with the same hops.

Every service is its own process, as in production: `python -m services.config`,
`services.shard --shard-id s0|s1|s2`, `services.router --instance r1` (then r2),
on the broker of $KAFKA_BOOTSTRAP, under a fresh cluster name.  The client is
this process: `libs.client.AsyncCluster` driven by `services.workload.runner`
(load 10,000 YCSB records into `ycsb.usertable`, sharded on {_id: "hashed"},
then 20,000 operations per workload at concurrency 32).

Baseline (`raw`), up at the same time on the same broker, as processes too
(`bench/_echo.py`): client -> raw.requests (4 partitions) -> echo front (consumer
group, the router's loop) -> raw.back<i>.requests -> echo back (transactional
producer, per fetched batch: replies + send_offsets_to_transaction + commit, the
shard processor's loop) -> the front's inbox -> the client's inbox.  4 Kafka hops
per operation, as client -> router -> shard -> router -> client; one back per
shard; ~1.1 KB records.  It is driven by the SAME runner, operation stream (same
seed) and latency histogram, through a stand-in collection whose find_one /
update_one are a bare aiokafka request/reply.  A second echo, the fair baseline
(`fair.*` topics), works as a shard's processor must: its backs ack each update's
events before replying and write --fair-events-per-update records per update.  Runs
go shardlog, raw, fair.  After each: offsets per op per topic; with --count-requests,
Kafka requests per op by API (every process counts them: SHARDLOG_KAFKA_REQUEST_COUNTS).

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_e2e.py [--records 10000] [--ops 20000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _events as E
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from libs import kafka
from libs.client import AsyncCluster
from libs.commands import CORRELATION_ID, REPLY_TO, header
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.topics import LARGE_RECORDS, ROUTER_PARTITIONS, SHORT_LIVED, Topics, TopicSpec
from schemas import config as cfg
from services.workload import runner

ROOT = E.ROOT
SHARDS = ("s0", "s1", "s2")
NS_DB, NS_COLL = "ycsb", "usertable"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ processes


class Proc:
    """A child process (a service or an echo) with its log and readiness file."""

    def __init__(
        self, name: str, argv: list[str], env: dict, logs: Path, ready_file: Path, profile_to: Path | None = None
    ):
        self.name, self.ready_file, self.profile_to = name, ready_file, profile_to
        self.log = logs / f"{name}.log"
        ready_file.unlink(missing_ok=True)
        cmd = [sys.executable, *(["-m", "cProfile", "-o", str(profile_to)] if profile_to else []), *argv]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def info(self) -> dict | None:
        try:
            info = json.loads(self.ready_file.read_text())
        except (OSError, ValueError):
            return None
        return info if info.get("pid") == self.proc.pid else None

    def check(self, role: str | None = None) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
        info = self.info()
        return bool(info) and (role is None or info.get("role") == role)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def retries(self) -> int:
        """aiokafka's "..., retrying" warnings so far (e.g. KIP-890 NOT_ENOUGH_REPLICAS in a transaction)."""
        try:
            return self.log.read_text(errors="replace").count("retrying")
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def wait_ready(procs: list[Proc], role_of=lambda p: None, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.check(role_of(p)) for p in procs):
        if time.monotonic() > deadline:
            late = [p.name for p in procs if not p.check(role_of(p))]
            raise SystemExit(f"not ready after {timeout:g}s: {late}\n" + "\n".join(p.tail(10) for p in procs))
        await asyncio.sleep(0.1)


async def wait_group(bootstrap: str, group: str, members: int, timeout: float = 60) -> float:
    """Until the consumer group is Stable with `members` members; returns the seconds it took."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    t0 = time.monotonic()
    try:
        while True:
            g = (await admin.describe_consumer_groups([group]))[0].to_object()["groups"][0]
            if g["state"] == "Stable" and len(g["members"]) == members:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"group {group}: {g['state']} with {len(g['members'])} members after {timeout:g}s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def broker_pid(bootstrap: str) -> int | None:
    """The local process listening on the bootstrap port (the broker), for its CPU figure; None if remote."""
    try:
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        inodes = {
            line.split()[9]
            for f in ("/proc/net/tcp", "/proc/net/tcp6")
            if Path(f).exists()
            for line in Path(f).read_text().splitlines()[1:]
            if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port
        }
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(pid)
            except OSError:
                continue
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process, from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, sum(v)


# --------------------------------------------------------------- raw client


class RawClient:
    """The least a request/reply client does: an idempotent producer (acks=all, linger 0,
    as libs.requests.Requester) and a consumer on its own inbox; no pydantic, no tracing."""

    def __init__(self, bootstrap: str, inbox: str):
        self.bootstrap, self.inbox = bootstrap, inbox
        self.waiting: dict[bytes, asyncio.Future] = {}

    async def start(self) -> None:
        self.producer = kafka.producer(self.bootstrap, client_id="raw-client", linger_ms=0)
        self.consumer = kafka.consumer(self.bootstrap, client_id="raw-client")
        await asyncio.gather(self.producer.start(), self.consumer.start())
        tp = TopicPartition(self.inbox, 0)
        self.consumer.assign([tp])
        self.consumer.seek(tp, (await self.consumer.end_offsets([tp]))[tp])
        self.reader = asyncio.create_task(self._read(tp))

    async def stop(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.producer.stop(), self.consumer.stop(), return_exceptions=True)

    async def _read(self, tp) -> None:
        while True:
            batch = await self.consumer.getmany(tp, timeout_ms=500)
            for rec in batch.get(tp, []):
                fut = self.waiting.pop(header(rec.headers, CORRELATION_ID) or b"", None)
                if fut is not None and not fut.done():
                    fut.set_result(rec.value)

    async def request(self, topic: str, value: bytes) -> bytes:
        corr = uuid.uuid4().hex.encode()
        fut = asyncio.get_running_loop().create_future()
        self.waiting[corr] = fut
        await self.producer.send_and_wait(
            topic,
            value,
            key=uuid.uuid4().hex.encode(),
            headers=[(REPLY_TO, self.inbox.encode()), (CORRELATION_ID, corr)],
        )
        return await asyncio.wait_for(fut, 30)


class RawCollection:
    """What runner.run calls on a collection for YCSB A..C, as raw echo requests."""

    def __init__(self, client: RawClient, topic: str, ns: str):
        self.client, self.topic, self.ns = client, topic, ns

    async def find_one(self, filter: dict, projection=None) -> bytes:
        return await self.client.request(self.topic, b"R" + filter["_id"].encode())

    async def update_one(self, filter: dict, update: dict) -> dict:
        body = json.dumps(update["$set"], separators=(",", ":")).encode()
        await self.client.request(self.topic, b"W" + filter["_id"].encode() + b"\n" + body)
        return {"matched": 1}

    async def count_documents(self, filter: dict) -> int:
        # runner.run continues YCSB's key sequence after the documents there are; the echo keeps
        # none it could count, so the loaded record count stands (A..C insert nothing).
        return 0


# -------------------------------------------------------------------- bench


class Bench:
    def __init__(self, args, bootstrap: str, cluster: str, tmp: Path):
        self.args, self.bootstrap, self.cluster, self.tmp = args, bootstrap, cluster, tmp
        self.t = Topics(cluster)
        self.data = tmp / "data"
        self.logs = tmp / "logs"
        self.data.mkdir()
        self.logs.mkdir()
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SHARDLOG_CLUSTER": cluster,
            "SHARDLOG_DATA_DIR": str(self.data),
            "PYTHONPATH": str(ROOT),
        }
        self.procs: dict[str, Proc] = {}
        self.raw_requests = f"{cluster}.raw.requests"
        self.raw_backs = [f"{cluster}.raw.back{i}.requests" for i in range(len(SHARDS))]
        self.raw_group = f"{cluster}.raw.front"
        # The fair baseline: a second echo whose backs work as the shard processor does (events
        # acked before replies, as many records per update as a shard writes).
        self.fair_requests = f"{cluster}.fair.requests"
        self.fair_backs = [f"{cluster}.fair.back{i}.requests" for i in range(len(SHARDS))]
        self.fair_group = f"{cluster}.fair.front"
        self.request_counts = tmp / "requests" if args.count_requests else None
        self.partitions: list[TopicPartition] | None = None  # every partition of this cluster's topics
        if self.request_counts:
            self.request_counts.mkdir()
            self.env[kafka.REQUEST_COUNTS_ENV] = str(self.request_counts)
            kafka.count_requests(str(self.request_counts))  # this process: the clients
        self.client_prof = cProfile.Profile() if args.profile else None
        self.results: list[dict] = []
        self.broker = broker_pid(bootstrap)

    def spawn(self, name: str, argv: list[str], ready: Path | None = None) -> Proc:
        prof = self.tmp / f"{name}.prof" if name in self.args.profile_service else None
        p = Proc(name, argv, self.env, self.logs, ready or self.data / f"{name}.ready", prof)
        self.procs[name] = p
        return p

    def service(self, name: str, module: str, *args: str) -> Proc:
        return self.spawn(name, ["-m", module, *args])

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
                "--client-id",
                name,
            ],
        )

    def front(self, i: int, fair: bool = False) -> Proc:
        kind = "fair" if fair else "raw"
        return self.echo(
            f"{'fair' if fair else 'echo'}-front{i}",
            "front",
            "--requests",
            self.fair_requests if fair else self.raw_requests,
            "--group",
            self.fair_group if fair else self.raw_group,
            "--backs",
            ",".join(self.fair_backs if fair else self.raw_backs),
            "--inbox",
            self.t.inbox(f"{kind}-front{i}"),
        )

    def backs(self, fair: bool) -> list[Proc]:
        kind = "fair" if fair else "raw"
        phases = ["--two-phase"] if fair or self.args.raw_two_phase else []
        per_update = self.args.fair_events_per_update if fair else 1
        return [
            self.echo(
                f"{'fair' if fair else 'echo'}-back{i}",
                "back",
                "--requests",
                b,
                "--group",
                f"{self.cluster}.{kind}.back{i}",
                "--events",
                f"{self.cluster}.{kind}.back{i}.events",
                "--events-per-update",
                str(per_update),
                *phases,
            )
            for i, b in enumerate(self.fair_backs if fair else self.raw_backs)
        ]

    # ---------------------------------------------------------------- setup

    async def start(self) -> None:
        t = self.t
        raw_topics = [
            TopicSpec(self.t.inbox("raw-client"), config=SHORT_LIVED),
            *(
                spec
                for kind, requests, backs in (
                    ("raw", self.raw_requests, self.raw_backs),
                    ("fair", self.fair_requests, self.fair_backs),
                )
                for spec in (
                    TopicSpec(requests, partitions=ROUTER_PARTITIONS, config=SHORT_LIVED),
                    *(TopicSpec(self.t.inbox(f"{kind}-front{i}"), config=SHORT_LIVED) for i in (1, 2)),
                    *(TopicSpec(b, config=SHORT_LIVED) for b in backs),
                    *(
                        TopicSpec(
                            f"{self.cluster}.{kind}.back{i}.events",
                            config={"cleanup.policy": "compact", **LARGE_RECORDS},
                        )
                        for i in range(len(SHARDS))
                    ),
                )
            ),
        ]
        await kafka.ensure_topics(
            self.bootstrap, [*t.core(), *(s for sh in SHARDS for s in t.for_shard(sh)), *raw_topics]
        )
        t0 = time.monotonic()
        config = self.service("config", "services.config")
        backs = [*self.backs(fair=False), *self.backs(fair=True)]
        await wait_ready([config], lambda p: "active")
        async with Requester(self.bootstrap, t.cli_replies, client_id="bench-e2e") as r:
            for sid in SHARDS:
                reply = await r.request(t.config_commands, cfg.AddShard(shard=sid), timeout=60)
                assert reply.ok, reply
            reply = await r.request(
                t.config_commands,
                cfg.ShardCollection(ns=f"{NS_DB}.{NS_COLL}", key={"_id": "hashed"}, numInitialChunks=self.args.chunks),
                timeout=60,
            )
            assert reply.ok, reply
            self.chunks = reply.result["chunks"]
        shards = [self.service(f"shard-{s}", "services.shard", "--shard-id", s) for s in SHARDS]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        fronts = [self.front(1), self.front(1, fair=True)]
        await wait_ready([*shards, router, *backs, *fronts], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        await wait_group(self.bootstrap, self.raw_group, 1)
        await wait_group(self.bootstrap, self.fair_group, 1)
        print(
            f"  config, {len(SHARDS)} shards, router r1, 2 echo fronts + {len(backs)} backs (raw, fair) up in "
            f"{time.monotonic() - t0:.1f}s ({self.chunks} chunks of {NS_DB}.{NS_COLL} over {len(SHARDS)} shards)"
        )

    async def add_second_router(self) -> None:
        t0 = time.monotonic()
        r2 = self.service("router-r2", "services.router", "--instance", "r2")
        f2, ff2 = self.front(2), self.front(2, fair=True)
        await wait_ready([r2, f2, ff2])
        await wait_group(self.bootstrap, f"{self.cluster}.router", 2)
        await wait_group(self.bootstrap, self.raw_group, 2)
        await wait_group(self.bootstrap, self.fair_group, 2)
        print(f"  router r2 and echo fronts 2 up, the groups stable with 2 members, in {time.monotonic() - t0:.1f}s")

    # ----------------------------------------------------------------- runs

    def system_procs(self, system: str) -> list[Proc]:
        prefix = {"raw": "echo-", "fair": "fair-"}.get(system)
        if prefix is None:
            return [p for n, p in self.procs.items() if not n.startswith(("echo-", "fair-"))]
        return [p for n, p in self.procs.items() if n.startswith(prefix)]

    async def topic_offsets(self) -> dict[str, int]:
        """Per topic of this cluster (its name without the cluster prefix), the sum of its partitions'
        end offsets: records written, plus one offset per transaction marker."""
        if self.partitions is None:  # the topics are all made at start-up
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="bench-offsets")
            await admin.start()
            try:
                names = [t for t in await admin.list_topics() if t.startswith(f"{self.cluster}.")]
                self.partitions = [
                    TopicPartition(d["topic"], p["partition"])
                    for d in await admin.describe_topics(names)
                    for p in d["partitions"]
                ]
            finally:
                await admin.close()
        c = kafka.consumer(self.bootstrap, client_id="bench-offsets")
        await c.start()
        try:
            ends = await c.end_offsets(self.partitions)
        finally:
            await c.stop()
        out: dict[str, int] = {}
        for tp, end in ends.items():
            name = tp.topic.removeprefix(f"{self.cluster}.")
            out[name] = out.get(name, 0) + end
        return out

    def request_counts_now(self) -> dict[str, int]:
        """Kafka requests sent so far by every process (SHARDLOG_KAFKA_REQUEST_COUNTS), by client id and API."""
        total: dict[str, int] = {}
        for f in self.request_counts.glob("*.json") if self.request_counts else ():
            try:
                for k, n in json.loads(f.read_text()).items():
                    total[k] = total.get(k, 0) + n
            except (OSError, ValueError):
                continue
        return total

    async def measure(self, system: str, coll, workload: str, ops: int, routers: int, *, warmup: bool = False) -> dict:
        final: list[runner.Progress] = []

        def progress(p: runner.Progress) -> None:
            if p.final:
                final.append(p)

        procs = self.system_procs(system)
        others = [p for p in self.procs.values() if p not in procs]  # the idle system: its polling cost
        cpu0 = {p.name: p.cpu_seconds() for p in [*procs, *others]}
        retries0 = sum(p.retries() for p in procs)
        if not warmup:
            offsets0 = await self.topic_offsets()
            if self.request_counts:
                await asyncio.sleep(0.5)  # every process's file rewritten since the last run ended
                requests0 = self.request_counts_now()
        own0, busy0, broker0 = time.process_time(), machine_busy(), cpu_seconds(self.broker)
        if self.client_prof and system == "shardlog" and not warmup:
            self.client_prof.enable()
        try:
            report = await runner.run(
                coll,
                workload,
                ops,
                concurrency=self.args.concurrency,
                record_count=self.args.records,
                progress=progress,
                seed=self.args.seed,
                progress_interval=5.0,
            )
        finally:
            if self.client_prof:
                self.client_prof.disable()
        busy1 = machine_busy()
        wall = report.elapsed_s
        per_op: dict[str, float] = {}
        requests_per_op: dict[str, float] = {}
        by_client: dict[str, float] = {}  # "<client id> <API>": requests per op (in the JSON line only)
        if not warmup:
            offsets1 = await self.topic_offsets()
            per_op = {
                t: round((n - offsets0.get(t, 0)) / report.operations, 2)
                for t, n in sorted(offsets1.items())
                if n - offsets0.get(t, 0) > 0
            }
            if self.request_counts:
                await asyncio.sleep(0.5)
                requests1 = self.request_counts_now()
                for key, n in requests1.items():
                    client, api = key.split("\t")
                    if system == "shardlog":
                        mine = not client.startswith(("echo-", "raw-", "fair-", "bench-"))
                    else:  # its echo processes, and the raw client both baselines share
                        mine = client.startswith("echo-" if system == "raw" else "fair-") or client == "raw-client"
                    if mine and n > requests0.get(key, 0):
                        requests_per_op[api] = requests_per_op.get(api, 0) + (n - requests0.get(key, 0))
                        by_client[key.replace("\t", " ")] = round((n - requests0.get(key, 0)) / report.operations, 3)
                requests_per_op = {
                    api: round(n / report.operations, 2)
                    for api, n in sorted(requests_per_op.items(), key=lambda x: -x[1])
                }
        cpu = {
            "client": round((time.process_time() - own0) / wall * 100, 1),
            **{p.name: round((p.cpu_seconds() - cpu0[p.name]) / wall * 100, 1) for p in procs},
        }
        idle = {p.name: round((p.cpu_seconds() - cpu0[p.name]) / wall * 100, 1) for p in others}
        if self.broker:
            cpu["broker"] = round((cpu_seconds(self.broker) - broker0) / wall * 100, 1)
        machine = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * 100 * os.cpu_count()
        p = final[-1]
        r = {
            "system": system,
            "routers": routers,
            "workload": f"ycsb-{workload}",
            "ops": report.operations,
            "seconds": report.elapsed_s,
            "ops_s": report.throughput_ops_s,
            "p50_ms": p.p50_ms,
            "p95_ms": p.p95_ms,
            "p99_ms": p.p99_ms,
            "errors": report.errors,
            "cpu_pct": cpu,
            "idle_cpu_pct": idle,
            "machine_cpu_pct": round(machine, 1),
            "produce_retries": sum(p.retries() for p in procs) - retries0,
            "offsets_per_op": per_op,
            "requests_per_op": requests_per_op,
            "requests_per_op_by_client": by_client,
            "kinds": {
                k: {
                    "count": v.count,
                    "p50_ms": v.latency_ms["p50"],
                    "p99_ms": v.latency_ms["p99"],
                    "max_ms": v.latency_ms["max"],
                }
                for k, v in report.kinds.items()
            },
        }
        if warmup:
            print(f"    warm-up {system:8s} ycsb-{workload}: {r['ops']:,} ops {r['ops_s']:,.0f}/s")
            return r
        busiest = sorted(((v, k) for k, v in cpu.items()), reverse=True)[:5]
        ours = sum(v for k, v in cpu.items() if k != "broker")
        print(
            f"  {system:8s} routers={routers} ycsb-{workload}: {r['ops']:7,} ops in {r['seconds']:6.2f}s = "
            f"{r['ops_s']:7,.0f} ops/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
            + (f"  ERRORS {report.errors}" if report.total_errors else ""),
            flush=True,
        )
        print(
            "           CPU (% of one core): "
            + ", ".join(f"{k} {v:.0f}" for v, k in busiest)
            + f"; all {system} processes + client {ours:.0f} (the idle other system {sum(idle.values()):.0f}); "
            f"machine {r['machine_cpu_pct']:.0f} of {os.cpu_count() * 100}; {r['produce_retries']} produce retries"
        )
        print("           offsets per op (records + transaction markers): " + _per_op(per_op))
        if requests_per_op:
            print(
                f"           Kafka requests per op ({sum(requests_per_op.values()):.1f}): " + _per_op(requests_per_op)
            )
        self.results.append(r)
        return r

    async def run(self) -> None:
        a = self.args
        print(
            f"e2e benchmark: cluster {self.cluster}; {a.records:,} records, {a.ops:,} ops per workload, "
            f"concurrency {a.concurrency}, workloads {a.workloads}, routers {a.routers}"
        )
        await self.start()
        raw = RawClient(self.bootstrap, self.t.inbox("raw-client"))
        await raw.start()
        try:
            async with AsyncCluster(self.bootstrap, self.cluster) as c:
                coll = c[NS_DB][NS_COLL]
                raw_coll = RawCollection(raw, self.raw_requests, f"{NS_DB}.{NS_COLL}")
                fair_coll = RawCollection(raw, self.fair_requests, f"{NS_DB}.{NS_COLL}")
                systems = (("shardlog", coll), ("raw", raw_coll), ("fair", fair_coll))
                load = await runner.load(coll, "a", a.records, concurrency=a.concurrency, batch_size=100, seed=a.seed)
                lat = load.kinds[runner.LOAD_KIND].latency_ms
                print(
                    f"  load: {load.operations:,} records in {load.elapsed_s:.2f}s = {load.throughput_ops_s:,.0f} "
                    f"records/s (insert_many of 100: p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms)"
                    + (f"  ERRORS {load.errors}" if load.total_errors else "")
                )
                self.load = {
                    "records": load.operations,
                    "seconds": load.elapsed_s,
                    "records_s": load.throughput_ops_s,
                    "batch_p50_ms": lat["p50"],
                    "batch_p99_ms": lat["p99"],
                    "errors": load.errors,
                }
                if a.snapshot_reads:
                    await self.snapshot_reads(coll)
                for routers in a.routers:
                    if routers == 2:
                        await self.add_second_router()
                    elif routers != 1:
                        raise SystemExit("--routers takes 1 and/or 2")
                    for system, cl in systems:  # warm-up: ids, metadata, groups
                        await self.measure(system, cl, "c", min(a.warmup, a.ops), routers, warmup=True)
                    for _ in range(a.repeat):
                        for w in a.workloads:
                            if a.history_windows:  # shardlog only, once per window, in the given order
                                for window in a.history_windows:
                                    await self.set_history_window(window)
                                    await self.measure(f"shardlog-w{window}", coll, w, a.ops, routers)
                                continue
                            for system, cl in systems:
                                await self.measure(system, cl, w, a.ops, routers)
        finally:
            await raw.stop()

    async def set_history_window(self, window: int) -> None:
        """minSnapshotHistoryWindowInSeconds for the next run (the shards see it through their
        catalogs within milliseconds; a second's pause makes sure before the clock starts)."""
        async with Requester(self.bootstrap, self.t.cli_replies, client_id="bench-e2e") as r:
            reply = await r.request(
                self.t.config_commands,
                cfg.SetSetting(key="minSnapshotHistoryWindowInSeconds", value=window),
                timeout=60,
            )
            assert reply.ok, reply
        await asyncio.sleep(1.0)

    async def snapshot_reads(self, coll) -> None:
        """Issue 32 §5: every loaded document read at a past time T (pinned by a snapshot read right
        after the load, then every document updated, so each read goes through its history)
        against the same read of the latest state; rounds alternate, the best of each compared."""
        at = await self._pin_snapshot(coll)
        await coll.update_many({}, {"$set": {"field0": "after the snapshot"}})
        times: dict[str, list[float]] = {"past": [], "latest": []}
        for r in range(self.args.snapshot_reads):
            for kind in ("past", "latest") if r % 2 == 0 else ("latest", "past"):
                began = time.perf_counter()
                docs = [d async for d in coll.find({}, at_cluster_time=at if kind == "past" else None)]
                times[kind].append(time.perf_counter() - began)
                assert len(docs) == self.args.records, (kind, len(docs))
                if kind == "past":
                    assert all(d.get("field0") != "after the snapshot" for d in docs), "a later write seen at T"
        best = {k: min(v) for k, v in times.items()}
        ratio = best["past"] / best["latest"]
        print(
            f"  snapshot read of {self.args.records:,} documents over {len(SHARDS)} shards: at a past time "
            f"{best['past'] * 1000:,.0f} ms, latest {best['latest'] * 1000:,.0f} ms: ratio {ratio:.2f} "
            f"(best of {self.args.snapshot_reads}; rounds past {', '.join(f'{x * 1000:.0f}' for x in times['past'])}, "
            f"latest {', '.join(f'{x * 1000:.0f}' for x in times['latest'])} ms)",
            flush=True,
        )
        self.snapshot = {"past_ms": round(best["past"] * 1000, 1), "latest_ms": round(best["latest"] * 1000, 1)}
        self.snapshot["ratio"] = round(ratio, 3)

    @staticmethod
    async def _pin_snapshot(coll) -> int:
        """A ClusterTime after every loaded write: a snapshot session's first read picks it."""
        session = coll.cluster.start_session(snapshot=True)
        async for _ in coll.find({}, session=session, limit=1):
            pass
        assert session.snapshot_time is not None
        return session.snapshot_time

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


def _per_op(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in figures.items()) or "none"


def pooled(results: list[dict], system: str, routers: int, workload: str) -> dict | None:
    rs = [r for r in results if (r["system"], r["routers"], r["workload"]) == (system, routers, workload)]
    if not rs:
        return None
    ops, secs = sum(r["ops"] for r in rs), sum(r["seconds"] for r in rs)
    # Percentiles of several runs: the median run's (runs are the same size); with --repeat 1, the run's.
    mid = sorted(rs, key=lambda r: r["p50_ms"])[len(rs) // 2]
    return {
        "ops": ops,
        "ops_s": round(ops / secs, 1),
        "p50_ms": mid["p50_ms"],
        "p99_ms": sorted(r["p99_ms"] for r in rs)[len(rs) // 2],
        "runs": len(rs),
    }


def print_profile(title: str, stats: pstats.Stats, n: int = 25) -> None:
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats("tottime").print_stats(n)
    print(f"---- cProfile: {title} (by own time)")
    print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000, help="records loaded (default 10,000)")
    p.add_argument("--ops", type=int, default=20_000, help="operations per workload run (default 20,000)")
    p.add_argument("--concurrency", type=int, default=32, help="operations in flight (default 32)")
    p.add_argument("--workloads", default="a,c", help="YCSB core workloads, comma-separated (default a,c)")
    p.add_argument("--routers", default="1,2", help="router counts to run, in order (default 1,2)")
    p.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="numInitialChunks of ycsb.usertable (default: the config server's, 2 per shard = 6)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs of each (workload, system) per router count")
    p.add_argument("--warmup", type=int, default=1000, help="ycsb-c operations before measuring (default 1,000)")
    p.add_argument("--seed", type=int, default=1, help="the operation stream's seed (the same for both systems)")
    p.add_argument(
        "--raw-two-phase",
        action="store_true",
        help="the echo back waits for its update events' acks before replying, as the shard processor",
    )
    p.add_argument(
        "--fair-events-per-update",
        type=int,
        default=2,
        help="the fair baseline's records per update (default 2: a shard's DocumentWritten + RetryableWriteRecorded)",
    )
    p.add_argument(
        "--count-requests",
        action="store_true",
        help="count every Kafka request per operation by API (SHARDLOG_KAFKA_REQUEST_COUNTS in every process)",
    )
    p.add_argument("--profile", action="store_true", help="cProfile the client (this process) in the shardlog runs")
    p.add_argument(
        "--profile-service",
        action="append",
        default=[],
        metavar="NAME",
        help="run a service under cProfile (router-r1, shard-s0, echo-front1, ...); repeatable",
    )
    p.add_argument(
        "--history-windows",
        default="",
        help="e.g. 300,0: run shardlog alone, once per minSnapshotHistoryWindowInSeconds, instead of the baselines",
    )
    p.add_argument(
        "--snapshot-reads",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="after the load, read every document at a past time and at the latest, ROUNDS times each",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, stores, profiles)")
    args = p.parse_args()
    args.workloads = [w.strip().lower().removeprefix("ycsb-") for w in args.workloads.split(",")]
    args.routers = [int(x) for x in args.routers.split(",")]
    args.history_windows = [int(x) for x in args.history_windows.split(",") if x.strip()]
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-e2e-"))
    bench = Bench(args, bootstrap, cluster, tmp)
    t0 = time.monotonic()
    try:
        asyncio.run(bench.run())
    finally:
        bench.stop()
        try:
            asyncio.run(delete_cluster_topics(bootstrap, cluster))
        except Exception as e:  # clean-up must not hide the figures
            print(f"warning: could not delete the topics of {cluster}: {e}", file=sys.stderr)
        profiles = {n: pr.profile_to for n, pr in bench.procs.items() if pr.profile_to and pr.profile_to.exists()}
        for name, path in profiles.items():
            print_profile(f"{name} process, whole life", pstats.Stats(str(path)))
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if bench.client_prof:
        print_profile("client (this process), shardlog runs", pstats.Stats(bench.client_prof))

    figures: dict = {}
    print(f"summary ({time.monotonic() - t0:.0f}s wall):")
    print(
        f"  {'':22s} {'shardlog ops/s':>14s} {'raw ops/s':>10s} {'ratio':>6s}   {'p50 ms':>15s} {'ratio':>6s}   "
        f"{'p99 ms':>15s} {'ratio':>6s}   {'fair ops/s':>10s} {'ratio':>6s}"
    )
    for routers in args.routers:
        for w in args.workloads:
            o, r, f = (
                pooled(bench.results, "shardlog", routers, f"ycsb-{w}"),
                pooled(bench.results, "raw", routers, f"ycsb-{w}"),
                pooled(bench.results, "fair", routers, f"ycsb-{w}"),
            )
            if not (o and r and f):
                continue
            ratios = {
                "ratio_ops_s": round(o["ops_s"] / r["ops_s"], 3),
                "ratio_p50": round(o["p50_ms"] / r["p50_ms"], 2),
                "ratio_p99": round(o["p99_ms"] / r["p99_ms"], 2),
                "ratio_fair_ops_s": round(o["ops_s"] / f["ops_s"], 3),
            }
            figures[f"ycsb-{w}_routers{routers}"] = {"shardlog": o, "raw": r, "fair": f, **ratios}
            print(
                f"  ycsb-{w}, {routers} router{'s' if routers > 1 else ' '}     {o['ops_s']:14,.0f} {r['ops_s']:10,.0f} "
                f"{ratios['ratio_ops_s']:6.3f}   {o['p50_ms']:7.2f} / {r['p50_ms']:5.2f} {ratios['ratio_p50']:6.2f}   "
                f"{o['p99_ms']:7.2f} / {r['p99_ms']:5.2f} {ratios['ratio_p99']:6.2f}   "
                f"{f['ops_s']:10,.0f} {ratios['ratio_fair_ops_s']:6.3f}"
            )
    for routers in args.routers if args.history_windows else ():
        for w in args.workloads:
            runs = {
                win: pooled(bench.results, f"shardlog-w{win}", routers, f"ycsb-{w}") for win in args.history_windows
            }
            if not all(runs.values()) or len(runs) < 2:
                continue
            base_w = args.history_windows[-1]  # the last window named is the baseline (e.g. 0: no history)
            base = runs[base_w]
            assert base is not None
            for win, o in runs.items():
                assert o is not None
                ratios = {
                    "ratio_ops_s": round(o["ops_s"] / base["ops_s"], 3),
                    "ratio_p99": round(o["p99_ms"] / base["p99_ms"], 2),
                }
                figures[f"ycsb-{w}_routers{routers}_window{win}"] = {**o, **ratios}
                print(
                    f"  ycsb-{w}, {routers} router(s), window {win:4d} s: {o['ops_s']:8,.0f} ops/s  p99 {o['p99_ms']:7.2f} ms"
                    f"   against window {base_w}: ops/s {ratios['ratio_ops_s']:.3f}, p99 {ratios['ratio_p99']:.2f}"
                )
    E.result_line(
        "e2e",
        history_windows=args.history_windows,
        snapshot_reads=getattr(bench, "snapshot", None),
        records=args.records,
        ops=args.ops,
        concurrency=args.concurrency,
        repeat=args.repeat,
        raw_two_phase=args.raw_two_phase,
        fair_events_per_update=args.fair_events_per_update,
        shards=len(SHARDS),
        chunks=getattr(bench, "chunks", None),
        load=getattr(bench, "load", None),
        **figures,
        runs=bench.results,
    )


if __name__ == "__main__":
    main()
