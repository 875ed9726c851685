"""The balancer at work: convergence after adding a shard, and what clients feel meanwhile.

Every service is its own process, as in bench_migration.py: config, shards s0..s2, one
router, the balancer and the range deleter, on the broker of $KAFKA_BOOTSTRAP, under a
fresh cluster name.  `bal.docs` is sharded on {k: 1} and pre-split into `--chunks`
chunks of `--chunk-docs` documents (~900 bytes each, so a chunk stays under the 1 MiB
max chunk size and moves whole), dealt round robin to s0..s2 by MoveRange while still
empty, then loaded with insert_many: a balanced 3-shard cluster.

Settings (catalog): maxChunkSizeBytes 1 MiB, balancerRoundIntervalSecs `--round-interval`
(1 s; MongoDB's 10 s would only stretch the wall time), balancerMigrationsThrottlingMs
`--throttle-ms` (0), orphanCleanupDelaySecs 0 (the range deleter runs during the
measurement, as it would); shards report statistics every `--stats-interval` s (1).

1. without:  the balancer running on the balanced cluster (it must stay quiet: the bench
             counts MigrationRequested events during the phase) while `--concurrency`
             client tasks run YCSB-A (50 % find_one / 50 % update_one, scrambled zipfian
             over the loaded keys) for `--seconds`.
2. with:     shard s3 starts, AddShard; the same YCSB-A load runs from AddShard until
             the balancer has converged: its last round found nothing to do, nothing is
             in flight, the collection is compliant, and that holds for `--quiet`
             seconds of further rounds.

Reported: rounds that moved data (the balancer's own round counter), wall time from
AddShard to the last MigrationCommitted (Kafka timestamps) and to convergence seen,
migrations issued / committed / aborted (config.events after AddShard), the minimum
needed (chunks whose owner differs between the routing table before AddShard and after
convergence), ranges moved more than once; YCSB-A ops/s and p50/p95/p99 without and
with, and ratio = p99 with / p99 without.  Ends with one JSON line.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_balancer.py [--chunks 48] [--seconds 20] [--concurrency 8]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _events as E
from aiokafka import TopicPartition
from bench_e2e import Proc, broker_pid, cpu_seconds, delete_cluster_topics, wait_group, wait_ready
from bench_migration import pct

from libs import kafka
from libs.client import AsyncCluster
from libs.requests import Requester
from libs.shardkey import from_ejson
from libs.topics import Topics
from schemas import balancer as b
from schemas import config as cfg
from services.workload.ycsb import ScrambledZipfianGenerator

ROOT = E.ROOT
SHARDS = ("s0", "s1", "s2")
NEW_SHARD = "s3"
DB, COLL = "bal", "docs"
NS = f"{DB}.{COLL}"
MIB = 1024 * 1024


def make_doc(i: int, rng: random.Random) -> dict:
    """~900 bytes: _id, k and 8 fields of 100 characters."""
    return {"_id": i, "k": i, **{f"f{j}": rng.randbytes(50).hex() for j in range(8)}}


def lat_figures(lat_ms: list[float], seconds: float) -> dict:
    return {"ops": len(lat_ms), "ops_s": round(len(lat_ms) / seconds, 1) if seconds else None,
            **{f"p{p}_ms": None if not lat_ms else round(pct(lat_ms, p), 1) for p in (50, 95, 99)},
            "max_ms": round(max(lat_ms), 1) if lat_ms else None}


class Bench:
    def __init__(self, args, bootstrap: str, cluster: str, tmp: Path):
        self.args, self.bootstrap, self.cluster = args, bootstrap, cluster
        self.t = Topics(cluster)
        self.data, self.logs = tmp / "data", tmp / "logs"
        self.data.mkdir()
        self.logs.mkdir()
        self.env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "SHARDLOG_CLUSTER": cluster,
                    "SHARDLOG_DATA_DIR": str(self.data), "PYTHONPATH": str(ROOT),
                    "SHARDLOG_STATS_INTERVAL_S": str(args.stats_interval)}
        self.procs: dict[str, Proc] = {}
        self.n = args.chunks * args.chunk_docs
        self.figures: dict = {}
        self.problems: list[str] = []

    # ---------------------------------------------------------------- plumbing

    def service(self, name: str, module: str, *argv: str) -> Proc:
        p = Proc(name, ["-m", module, *argv], self.env, self.logs, self.data / f"{name}.ready")
        self.procs[name] = p
        return p

    async def command(self, cmd, timeout: float = 60) -> tuple[dict, int]:
        reply = await self.req.request(self.t.config_commands, cmd, timeout=timeout)
        if not reply.ok:
            raise SystemExit(f"{cmd.type} refused: {reply.code}: {reply.error}")
        return reply.result or {}, reply.configTime or 0

    async def balancer_state(self, **kw) -> dict:
        reply = await self.req.request(self.t.balancer_commands, b.GetBalancerState(**kw), timeout=30)
        if not reply.ok:
            raise SystemExit(f"GetBalancerState refused: {reply.code}: {reply.error}")
        return reply.result or {}

    async def config_events(self, after: int = -1) -> list[tuple[int, int, object]]:
        """(offset, Kafka timestamp ms, event) of config.events past `after`."""
        c = kafka.consumer(self.bootstrap)
        await c.start()
        try:
            tp = TopicPartition(self.t.config_events, 0)
            c.assign([tp])
            end = (await c.end_offsets([tp]))[tp]
            c.seek(tp, after + 1)
            out = []
            while (await c.position(tp)) < end:
                for rec in (await c.getmany(tp, timeout_ms=1000)).get(tp, []):
                    out.append((rec.offset, rec.timestamp, cfg.events.decode(rec.value)))
            return out
        finally:
            await c.stop()

    async def wait_moved(self, mid: str) -> None:
        while True:
            result, _ = await self.command(cfg.GetMigration(id=mid))
            if result["state"] != "active":
                if result["state"] != "committed":
                    raise SystemExit(f"set-up move {mid}: {result['state']}")
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ setup

    async def start(self) -> None:
        a, t0 = self.args, time.monotonic()
        await kafka.ensure_topics(self.bootstrap, [*self.t.core(), *self.t.for_balancer(),
                                                   *(sp for sh in (*SHARDS, NEW_SHARD) for sp in self.t.for_shard(sh))])
        self.req = Requester(self.bootstrap, self.t.cli_replies)
        await self.req.start()
        config = self.service("config", "services.config")
        await wait_ready([config], lambda p: "active")
        for sid in SHARDS:
            await self.command(cfg.AddShard(shard=sid))
        for key, value in (("maxChunkSizeBytes", MIB), ("balancerRoundIntervalSecs", a.round_interval),
                           ("balancerMigrationsThrottlingMs", a.throttle_ms), ("orphanCleanupDelaySecs", 0),
                           ("balancerEnabled", False)):
            await self.command(cfg.SetSetting(key=key, value=value))
        await self.command(cfg.CreateDatabase(db=DB, primary="s0"))
        await self.command(cfg.ShardCollection(ns=NS, key={"k": 1}))
        await self.command(cfg.SplitChunk(ns=NS, at=[{"k": i * a.chunk_docs} for i in range(1, a.chunks)]))
        shards = [self.service(f"shard-{sid}", "services.shard", "--shard-id", sid) for sid in SHARDS]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        await wait_ready([*shards, router], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        # Deal the empty chunks round robin (the last chunk, [.., MaxKey), stays on s0 and stays empty).
        for i in range(a.chunks):
            owner = SHARDS[i % len(SHARDS)]
            if owner != "s0":
                result, _ = await self.command(cfg.MoveRange(ns=NS, min={"k": i * a.chunk_docs}, to=owner))
                await self.wait_moved(result["id"])
        print(f"  config, {len(SHARDS)} shards, router up; {NS}: {a.chunks} chunks dealt round robin "
              f"in {time.monotonic() - t0:.1f}s", flush=True)

    async def load(self, client) -> None:
        coll, rng, t0 = client[DB][COLL], random.Random(self.args.seed), time.monotonic()
        starts = iter(range(0, self.n, 500))

        async def worker():
            while (lo := next(starts, None)) is not None:
                await coll.insert_many([make_doc(i, rng) for i in range(lo, min(self.n, lo + 500))], ordered=False)
        await asyncio.gather(*(worker() for _ in range(4)))
        secs = time.monotonic() - t0
        print(f"  loaded {self.n:,} documents in {secs:.1f}s ({self.n / secs:,.0f} docs/s)", flush=True)

    async def start_balancing(self) -> None:
        balancer = self.service("balancer", "services.balancer")
        deleter = self.service("range-deleter", "services.range_deleter")
        await wait_ready([balancer, deleter], lambda p: "active" if p.name == "balancer" else None)
        await self.command(cfg.SetSetting(key="balancerEnabled", value=True))
        await self.wait_converged("the balancer's first quiet rounds on the balanced cluster")

    # ---------------------------------------------------------------- measure

    async def wait_converged(self, what: str, timeout: float = 900) -> dict:
        """Until rounds find nothing to do, nothing is in flight and NS is compliant, for
        `--quiet` seconds of rounds (the round counter must not move meanwhile)."""
        deadline, quiet_since, seen_round = time.monotonic() + timeout, None, None
        while time.monotonic() < deadline:
            st = await self.balancer_state(ns=NS)
            calm = (st["activity"].startswith("balanced") and not st["inFlight"]
                    and st["collection"]["compliant"])
            rnd = st["lastRound"]["round"]
            if calm and rnd == seen_round:
                if time.monotonic() - quiet_since >= self.args.quiet:
                    return st
            else:
                quiet_since, seen_round = (time.monotonic(), rnd) if calm else (None, None)
            await asyncio.sleep(0.25)
        raise SystemExit(f"timed out after {timeout:g}s waiting for {what}; last: {st}")

    async def ycsb_a(self, client, stop: asyncio.Event, lat_ms: list[float], errors: Counter,
                     starts: list[float] | None = None) -> None:
        coll = client[DB][COLL]

        async def worker(seed: int):
            keys, rng = ScrambledZipfianGenerator(0, self.n - 1, rng=seed), random.Random(seed)
            while not stop.is_set():
                k = keys.next_value()
                t, started = time.perf_counter(), time.time()
                try:
                    if rng.random() < 0.5:
                        await coll.find_one({"_id": k, "k": k})
                    else:
                        await coll.update_one({"_id": k, "k": k}, {"$set": {"f0": rng.randbytes(50).hex()}})
                except Exception as e:  # counted and reported, never hidden
                    errors[type(e).__name__] += 1
                    continue
                lat_ms.append((time.perf_counter() - t) * 1000)
                if starts is not None:
                    starts.append(started)
        await asyncio.gather(*(worker(self.args.seed * 100 + i) for i in range(self.args.concurrency)))

    async def chunk_owners(self) -> dict[int, str]:
        snap = (await self.balancer_state(snapshot=True))["snapshot"]
        coll = next(c for c in snap["collections"] if c["ns"] == NS)
        owners = {}
        for ch in coll["chunks"]:
            lo = from_ejson(ch["min"])["k"]
            owners[lo if isinstance(lo, int) else -1] = ch["shard"]  # MinKey as -1
        return owners

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if getattr(self, "req", None):
                await self.req.stop()

    async def _run(self) -> None:
        a = self.args
        await self.start()
        async with AsyncCluster(self.bootstrap, self.cluster, timeout=120) as client:
            await self.load(client)
            await self.start_balancing()
            print(f"  balancer and range deleter up; the balanced cluster stays quiet", flush=True)

            # 1. without: YCSB-A while the balancer runs with nothing to move.
            before = await self.config_events()
            mark = before[-1][0]
            lat, errs, stop = [], Counter(), asyncio.Event()
            load = asyncio.create_task(self.ycsb_a(client, stop, lat, errs))
            t0 = time.monotonic()
            await asyncio.sleep(a.seconds)  # a fixed measuring window, not a synchronisation
            stop.set()
            await load
            without_s = time.monotonic() - t0
            moved_meanwhile = [e for _, _, e in await self.config_events(mark) if e.type == "MigrationRequested"]
            if moved_meanwhile:
                self.problems.append(f"{len(moved_meanwhile)} migration(s) during the quiet phase")
            self.figures["without"] = {**lat_figures(lat, without_s), "errors": dict(errs)}
            print(f"1. without balancing ({a.concurrency} client tasks, {without_s:.0f}s): "
                  f"{self._line(self.figures['without'])}", flush=True)

            # 2. with: add s3, the same load until the balancer has converged.
            owners_before = await self.chunk_owners()
            round_before = (await self.balancer_state())["lastRound"]["round"]
            shard = self.service(f"shard-{NEW_SHARD}", "services.shard", "--shard-id", NEW_SHARD)
            await wait_ready([shard], lambda p: "active")
            mark = (await self.config_events())[-1][0]
            lat, errs, stop, starts = [], Counter(), asyncio.Event(), []
            load = asyncio.create_task(self.ycsb_a(client, stop, lat, errs, starts))
            cpu0 = {n: p.cpu_seconds() for n, p in self.procs.items()}
            broker0 = cpu_seconds(broker_pid(self.bootstrap))
            t0, added_wall = time.monotonic(), time.time()
            await self.command(cfg.AddShard(shard=NEW_SHARD))
            state = await self.wait_converged("the balancer to converge after adding s3")
            seen = time.monotonic() - t0
            stop.set()
            await load
            with_s = time.monotonic() - t0
            cpu = {n: round(100 * (p.cpu_seconds() - cpu0.get(n, 0)) / with_s) for n, p in self.procs.items()}
            cpu["broker"] = round(100 * (cpu_seconds(broker_pid(self.bootstrap)) - broker0) / with_s)
            self.figures["with"] = {**lat_figures(lat, with_s), "errors": dict(errs)}
            last_commit = await self.convergence(mark, added_wall, seen, owners_before, round_before, state, cpu)
            if last_commit is not None:  # the operations that started while data was moving
                moving = [x for x, t in zip(lat, starts) if added_wall <= t <= last_commit]
                self.figures["while_moving"] = lat_figures(moving, last_commit - added_wall)

        w, m = self.figures["without"], self.figures["with"]
        self.figures["p99_ratio"] = round(m["p99_ms"] / w["p99_ms"], 2) if w["p99_ms"] and m["p99_ms"] else None
        print(f"2. AddShard to converged: {self._line(m)}")
        if (mv := self.figures.get("while_moving")) and mv["ops"]:
            print(f"   only operations started between AddShard and the last commit: {mv['ops_s']} ops/s, "
                  f"p50 {mv['p50_ms']} ms, p95 {mv['p95_ms']} ms, p99 {mv['p99_ms']} ms, max {mv['max_ms']} ms")
            self.figures["p99_ratio_while_moving"] = round(mv["p99_ms"] / w["p99_ms"], 2) if w["p99_ms"] else None
        print(f"   ratio p99 with / without: {self.figures['p99_ratio']} (AddShard to converged), "
              f"{self.figures.get('p99_ratio_while_moving')} (while moving)")

    async def convergence(self, mark, added_wall, seen, owners_before, round_before, state, cpu) -> None:
        events = await self.config_events(mark)
        requested = [e for _, _, e in events if e.type == "MigrationRequested"]
        committed = [(ts, e) for _, ts, e in events if e.type == "MigrationCommitted"]
        aborted = [e for _, _, e in events if e.type == "MigrationAborted"]
        bounds = Counter((repr(e.min), repr(e.max)) for e in requested)
        twice = [k for k, n in bounds.items() if n > 1]
        owners_after = await self.chunk_owners()
        if set(owners_after) != set(owners_before):
            self.problems.append("chunk boundaries changed: the minimum below counts owners by chunk min only")
        minimum = sum(1 for lo, sh in owners_after.items() if owners_before.get(lo) != sh)
        last_commit_s = (committed[-1][0] / 1000 - added_wall) if committed else None
        per_shard = Counter(owners_after.values())
        rounds = state["lastRound"]["round"] - round_before
        self.figures["convergence"] = {
            "rounds": rounds, "seconds_to_last_commit": None if last_commit_s is None else round(last_commit_s, 2),
            "seconds_to_converged_seen": round(seen, 2), "migrations_issued": len(requested),
            "committed": len(committed), "aborted": len(aborted), "minimum": minimum,
            "ranges_moved_more_than_once": len(twice), "chunks_per_shard": dict(sorted(per_shard.items())),
            "cpu_pct": cpu}
        c = self.figures["convergence"]
        print(f"   convergence after AddShard({NEW_SHARD}): {rounds} round(s) that moved data; last commit after "
              f"{c['seconds_to_last_commit']}s, converged (and {self.args.quiet:g}s quiet) seen after {seen:.1f}s")
        print(f"   migrations issued {len(requested)} (committed {len(committed)}, aborted {len(aborted)}), "
              f"minimum needed {minimum}; ranges moved more than once: {len(twice)}; chunks per shard {dict(per_shard)}")
        print(f"   CPU (% of one core) during it: " + ", ".join(f"{n} {v}" for n, v in sorted(cpu.items(),
                                                                                          key=lambda x: -x[1])))
        return committed[-1][0] / 1000 if committed else None

    @staticmethod
    def _line(f: dict) -> str:
        return (f"{f['ops_s']} ops/s, p50 {f['p50_ms']} ms, p95 {f['p95_ms']} ms, p99 {f['p99_ms']} ms, "
                f"max {f['max_ms']} ms, errors {f['errors'] or 'none'}")

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=48, help="chunks of the collection, dealt to s0..s2 (default 48)")
    p.add_argument("--chunk-docs", type=int, default=1000, help="documents per chunk (~900 KB; default 1,000)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the without-balancing phase (default 20)")
    p.add_argument("--concurrency", type=int, default=8, help="YCSB-A client tasks (default 8)")
    p.add_argument("--round-interval", type=float, default=1.0, help="balancerRoundIntervalSecs (default 1)")
    p.add_argument("--throttle-ms", type=int, default=0, help="balancerMigrationsThrottlingMs (default 0)")
    p.add_argument("--stats-interval", type=float, default=1.0, help="SHARDLOG_STATS_INTERVAL_S (default 1)")
    p.add_argument("--quiet", type=float, default=5.0, help="seconds of quiet rounds that mean converged (default 5)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, stores)")
    args = p.parse_args()
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-balancer-"))
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
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"({time.monotonic() - t0:.0f}s wall)")
    E.result_line("balancer", chunks=args.chunks, chunk_docs=args.chunk_docs, concurrency=args.concurrency,
                  round_interval_s=args.round_interval, problems=bench.problems, **bench.figures)


if __name__ == "__main__":
    main()
