"""The balancer at work: convergence after adding a 4th shard, and what clients feel meanwhile.

Every service is its own process, as in bench_migration.py: `python -m services.config`,
`services.shard --shard-id s0..s2`, `services.router --instance r1`, `services.balancer`
and `services.range_deleter`, on the broker of $KAFKA_BOOTSTRAP, under a fresh cluster
name.  The client is this process (`libs.client.AsyncCluster`).

Set-up (a balanced 3-shard cluster): `bal.docs` is sharded on {k: 1} and pre-split into
`--chunks` chunks of `--chunk-docs` keys, which are dealt round robin to s0..s2 with
MoveRange while still empty (each move waited for with GetMigration before the next),
then loaded with insert_many.  Documents are ~880 bytes, so a chunk of 1,000 holds
~0.85 MiB: under the 1 MiB max chunk size, so the balancer moves whole chunks (a range
over the max chunk size would be cut, changing chunk bounds) and "the minimum number of
moves" is well defined.

Settings (catalog): maxChunkSizeBytes `--max-chunk-mib` (1 MiB; `--chunk-docs` follows it), balancerRoundIntervalSecs `--round-interval`
(0.5 s; MongoDB's 10 s would only stretch the wall time), balancerMigrationsThrottlingMs
`--throttle-ms` (0), orphanCleanupDelaySecs 0 (the range deleter works during the
measurement, as it would in production); the shards report statistics every
`--stats-interval` s (0.5), since a round after a migration waits for statistics that
show it.

1. without:  the balancer running on the balanced cluster while `--concurrency` client
             tasks run YCSB-A (50 % find_one / 50 % update_one, scrambled zipfian over the
             loaded keys) for `--seconds`.  It must stay quiet: the bench counts the
             MigrationRequested events and the balancer's rounds during the phase.
2. with:     shard s3 starts; once it is ready, the same load starts and AddShard(s3) is
             sent.  Converged = the balancer has seen AddShard, its last round found
             nothing to do, nothing is in flight, the collection is compliant, and the
             per-shard data (the balancer's snapshot, from the shards' statistics) is
             within 3 × the max chunk size; all of that unchanged (no new round) for
             `--quiet-rounds` round intervals.  The convergence time is the start of that
             stable stretch.

Reported: rounds that moved data (RoundCompleted in balancer.events), AddShard -> last
MigrationCommitted and -> converged, migrations issued / committed / aborted
(config.events after AddShard), the minimum needed (chunks whose owner differs between
the routing table before AddShard and at convergence), ranges moved more than once
(overlapping committed ranges), each migration's MoveRange -> commit time, the gap from a
commit to the next MoveRange, and each shard's statistics report period (shard.stats: a
round after a migration waits for reports that show it); YCSB-A ops/s and p50/p95/p99
without, from AddShard to converged, and between the first MoveRange and the last commit;
ratio = p99 with / p99 without (this benchmark's baseline ratio).  A final count checks
that every document is still there.  Ends with one JSON line.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_balancer.py [--chunks 24] [--seconds 30] [--concurrency 8]
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
from dataclasses import dataclass, field
from pathlib import Path

import _events as E
from aiokafka import TopicPartition
from bench_e2e import Proc, broker_pid, cpu_seconds, wait_group, wait_ready
from bench_migration import pct

from domain.shardkey import KeyPattern, from_ejson
from libs import kafka
from libs.client import AsyncCluster
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.topics import Topics
from schemas import balancer as b
from schemas import config as cfg
from services.workload.ycsb import ScrambledZipfianGenerator

ROOT = E.ROOT
SHARDS = ("s0", "s1", "s2")
NEW_SHARD = "s3"
DB, COLL = "bal", "docs"
NS = f"{DB}.{COLL}"
KEY = KeyPattern.parse({"k": 1})
MIB = 1024 * 1024
DOC_BYTES = 880  # stored size of make_doc's documents
POLL_S = 0.25  # balancer state polling while waiting for convergence


def make_doc(i: int, rng: random.Random) -> dict:
    """~880 bytes stored: _id, k and 8 fields of 100 hex characters."""
    return {"_id": i, "k": i, **{f"f{j}": rng.randbytes(50).hex() for j in range(8)}}


def key_of(bound) -> bytes:
    """A chunk bound (Extended JSON) as an ordered byte string, for range comparisons."""
    return KEY.encode_bound(from_ejson(bound))


# ------------------------------------------------------------------ client latency


@dataclass
class Ops:
    """Every completed operation as (start, unix seconds; latency, ms), and errors by type."""

    done: list[tuple[float, float]] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)

    def window(self, lo: float, hi: float) -> dict:
        """Figures of the operations that started in [lo, hi)."""
        lat = [ms for t, ms in self.done if lo <= t < hi]
        secs = hi - lo
        return {
            "ops": len(lat),
            "seconds": round(secs, 2),
            "ops_s": round(len(lat) / secs, 1) if secs > 0 else None,
            **{f"p{p}_ms": None if not lat else round(pct(lat, p), 1) for p in (50, 95, 99)},
            "max_ms": round(max(lat), 1) if lat else None,
        }


def latency_line(f: dict) -> str:
    return (
        f"{f['ops_s']} ops/s ({f['ops']:,} ops in {f['seconds']:.1f}s), p50 {f['p50_ms']} ms, "
        f"p95 {f['p95_ms']} ms, p99 {f['p99_ms']} ms, max {f['max_ms']} ms"
    )


def ratio(a, b):
    return round(a / b, 2) if a and b else None


# ------------------------------------------------------------------ balancer snapshot


def owners(snapshot: dict) -> dict[bytes, str]:
    """Chunk min (encoded) -> owning shard, for NS."""
    coll = next(c for c in snapshot["collections"] if c["ns"] == NS)
    return {key_of(ch["min"]): ch["shard"] for ch in coll["chunks"]}


def shard_sizes(snapshot: dict) -> dict[str, int]:
    """Bytes of NS per shard (every shard, empty ones too), as the balancer sees them."""
    sizes = {s["id"]: 0 for s in snapshot["shards"]}
    coll = next(c for c in snapshot["collections"] if c["ns"] == NS)
    for ch in coll["chunks"]:
        sizes[ch["shard"]] += ch["sizeBytes"]
    return sizes


def is_converged(st: dict, seen_config_time: int, imbalance: int) -> bool:
    """One observation of the balancer: done with NS, by its own verdict and by the sizes."""
    sizes = shard_sizes(st["snapshot"])
    return (
        st["configTime"] >= seen_config_time
        and st["activity"].startswith("balanced")
        and not st["inFlight"]
        and st["collection"]["compliant"]
        and max(sizes.values()) - min(sizes.values()) < imbalance
    )


def timing(requested: dict, committed: dict, added: float) -> dict:
    """From (Kafka timestamp, event) by migration id: when moves began and ended after AddShard,
    how long one took, and the wait from a commit to the next MoveRange (the round loop's pause)."""
    durations = sorted(committed[m][0] - requested[m][0] for m in committed if m in requested)
    starts, ends = sorted(ts for ts, _ in requested.values()), sorted(ts for ts, _ in committed.values())
    gaps = [s - max(e for e in ends if e <= s) for s in starts if any(e <= s for e in ends)]
    return {
        "first_request_s": round(starts[0] - added, 2) if starts else None,
        "last_commit_s": round(ends[-1] - added, 2) if ends else None,
        "migration_s": {"p50": round(pct(durations, 50), 2), "max": round(durations[-1], 2)} if durations else None,
        "commit_to_next_request_s": {"p50": round(pct(gaps, 50), 2), "max": round(max(gaps), 2)} if gaps else None,
    }


def overlapping(ranges: list[tuple[bytes, bytes]]) -> int:
    """How many of the [lo, hi) ranges overlap an earlier one (a key range moved again)."""
    return sum(1 for i, (lo, hi) in enumerate(ranges) if any(lo < b_hi and b_lo < hi for b_lo, b_hi in ranges[:i]))


# ------------------------------------------------------------------ the bench


class Bench:
    def __init__(self, args, bootstrap: str, cluster: str, tmp: Path):
        self.args, self.bootstrap, self.cluster = args, bootstrap, cluster
        self.t = Topics(cluster)
        self.data, self.logs = tmp / "data", tmp / "logs"
        self.data.mkdir()
        self.logs.mkdir()
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "SHARDLOG_CLUSTER": cluster,
            "SHARDLOG_DATA_DIR": str(self.data),
            "PYTHONPATH": str(ROOT),
            "SHARDLOG_STATS_INTERVAL_S": str(args.stats_interval),
        }
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
        """Send a config command; (result, ConfigTime of its events)."""
        reply = await self.req.request(self.t.config_commands, cmd, timeout=timeout)
        if not reply.ok:
            raise SystemExit(f"{cmd.type} refused: {reply.code}: {reply.error}")
        return reply.result or {}, reply.configTime or 0

    async def balancer_state(self) -> dict:
        """`shardlog balancer status` + `collection-status NS` + `balancer snapshot` in one request."""
        reply = await self.req.request(self.t.balancer_commands, b.GetBalancerState(ns=NS, snapshot=True), timeout=30)
        if not reply.ok:
            raise SystemExit(f"GetBalancerState refused: {reply.code}: {reply.error}")
        return reply.result or {}

    async def consume(self, topic: str, take, *, offset: int = 0, since: float | None = None) -> None:
        """Feed `take(records)` with a one-partition log, from `offset` or from unix time `since`, to its end now."""
        c = kafka.consumer(self.bootstrap)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            if since is not None:
                found = (await c.offsets_for_times({tp: int(since * 1000)}))[tp]
                if found is None:
                    return
                offset = found.offset
            c.seek(tp, offset)
            await kafka.catch_up(c, tp, take)
        finally:
            await c.stop()

    async def read_log(self, topic: str, codec, after: int = -1) -> list[tuple[int, float, object]]:
        """(offset, Kafka timestamp in unix seconds, event) of a one-partition log past offset `after`."""
        out = []

        async def take(records):
            out.extend((r.offset, r.timestamp / 1000, codec.decode(r.value)) for r in records)

        await self.consume(topic, take, offset=after + 1)
        return out

    async def report_periods(self, lo: float, hi: float) -> dict[str, float]:
        """Median seconds between two statistics reports of each shard in [lo, hi): the interval
        plus the time a report takes (it reads the size of every document the shard owns).  A
        round after a migration waits for a report begun after the commit."""
        times: dict[str, list[float]] = {}

        async def take(records):
            for r in records:
                if lo <= r.timestamp / 1000 < hi:
                    times.setdefault(r.key.decode(), []).append(r.timestamp / 1000)

        await self.consume(self.t.shard_stats, take, since=lo)
        return {
            sh: round(pct([b - a for a, b in zip(ts, ts[1:])], 50), 2)
            for sh, ts in sorted(times.items())
            if len(ts) > 1
        }

    async def log_mark(self, topic: str) -> int:
        """The log's stable end now, minus one: `read_log(topic, codec, mark)` then reads what came after."""
        c = kafka.consumer(self.bootstrap)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            return await kafka.log_end(c, tp) - 1
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
        config = self.service("config", "services.config")
        await wait_ready([config], lambda p: "active")
        for sid in SHARDS:
            await self.command(cfg.AddShard(shard=sid))
        for key, value in (
            ("maxChunkSizeBytes", a.max_chunk_mib * MIB),
            ("balancerRoundIntervalSecs", a.round_interval),
            ("balancerMigrationsThrottlingMs", a.throttle_ms),
            ("orphanCleanupDelaySecs", 0),
            ("balancerEnabled", False),
        ):  # enabled once the cluster is dealt and loaded
            await self.command(cfg.SetSetting(key=key, value=value))
        await self.command(cfg.CreateDatabase(db=DB, primary="s0"))
        await self.command(cfg.ShardCollection(ns=NS, key={"k": 1}))
        await self.command(cfg.SplitChunk(ns=NS, at=[{"k": i * a.chunk_docs} for i in range(1, a.chunks)]))
        shards = [self.service(f"shard-{sid}", "services.shard", "--shard-id", sid) for sid in SHARDS]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        await wait_ready([*shards, router], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        await self.deal()
        print(
            f"  config, {len(SHARDS)} shards, router r1 up; {NS} split into {a.chunks} chunks dealt round robin "
            f"in {time.monotonic() - t0:.1f}s",
            flush=True,
        )

    async def deal(self) -> None:
        """Chunk i, [i·d, (i+1)·d) (the first from MinKey, the last to MaxKey), to SHARDS[i % 3] while empty."""
        for i in range(self.args.chunks):
            owner = SHARDS[i % len(SHARDS)]
            if owner != "s0":  # the whole collection starts on s0, the database's primary
                result, _ = await self.command(cfg.MoveRange(ns=NS, min={"k": i * self.args.chunk_docs}, to=owner))
                await self.wait_moved(result["id"])

    async def load(self, client) -> None:
        coll, rng, t0 = client[DB][COLL], random.Random(self.args.seed), time.monotonic()
        starts = iter(range(0, self.n, 500))

        async def worker():
            while (lo := next(starts, None)) is not None:
                await coll.insert_many([make_doc(i, rng) for i in range(lo, min(self.n, lo + 500))], ordered=False)

        await asyncio.gather(*(worker() for _ in range(4)))
        secs = time.monotonic() - t0
        print(f"  loaded {self.n:,} documents in {secs:.1f}s ({self.n / secs:,.0f} docs/s)", flush=True)

    async def start_balancing(self) -> dict:
        balancer = self.service("balancer", "services.balancer")
        deleter = self.service("range-deleter", "services.range_deleter")
        await wait_ready([balancer, deleter], lambda p: "active" if p.name == "balancer" else None)
        _, at = await self.command(cfg.SetSetting(key="balancerEnabled", value=True))
        _, st = await self.wait_converged(at, "the balancer's first quiet rounds on the balanced cluster")
        return st

    # ---------------------------------------------------------------- measure

    async def wait_converged(self, seen_config_time: int, what: str, timeout: float = 900) -> tuple[float, dict]:
        """Until `is_converged` holds with no new round for --quiet-rounds round intervals;
        (unix time the stable stretch began, the last observation)."""
        hold = self.args.quiet_rounds * self.args.round_interval
        deadline, since, seen_round, st = time.monotonic() + timeout, None, None, {}
        while time.monotonic() < deadline:
            st = await self.balancer_state()
            if not is_converged(st, seen_config_time, int(3 * self.args.max_chunk_mib * MIB)):
                since = None
            elif since is None or st["lastRound"]["round"] != seen_round:
                since, seen_round = time.time(), st["lastRound"]["round"]
            elif time.time() - since >= hold:
                return since, st
            await asyncio.sleep(POLL_S)
        raise SystemExit(f"timed out after {timeout:g}s waiting for {what}; last state: {st}")

    async def ycsb_a(self, client, stop: asyncio.Event, ops: Ops) -> None:
        """YCSB-A until `stop`: {_id: k, k: k} lets the router target by k and the shard find by _id."""
        coll = client[DB][COLL]

        async def worker(seed: int):
            keys, rng = ScrambledZipfianGenerator(0, self.n - 1, rng=seed), random.Random(seed)
            while not stop.is_set():
                k = keys.next_value()
                started, t = time.time(), time.perf_counter()
                try:
                    if rng.random() < 0.5:
                        await coll.find_one({"_id": k, "k": k})
                    else:  # same size as before: the chunks do not grow
                        await coll.update_one({"_id": k, "k": k}, {"$set": {"f0": rng.randbytes(50).hex()}})
                except Exception as e:  # counted and reported, never hidden
                    ops.errors[type(e).__name__] += 1
                    continue
                ops.done.append((started, (time.perf_counter() - t) * 1000))

        await asyncio.gather(*(worker(self.args.seed * 100 + i) for i in range(self.args.concurrency)))

    async def phase_without(self, client) -> None:
        """YCSB-A on the balanced cluster, balancer running; it must not move anything."""
        a = self.args
        config_mark, round_before = (
            await self.log_mark(self.t.config_events),
            (await self.balancer_state())["lastRound"]["round"],
        )
        ops, stop = Ops(), asyncio.Event()
        load = asyncio.create_task(self.ycsb_a(client, stop, ops))
        t0 = time.time()
        await asyncio.sleep(a.seconds)  # a fixed measuring window, not a synchronisation
        stop.set()
        await load
        requested = [
            e
            for _, _, e in await self.read_log(self.t.config_events, cfg.events, config_mark)
            if e.type == "MigrationRequested"
        ]
        rounds = (await self.balancer_state())["lastRound"]["round"] - round_before
        if requested or rounds:
            self.problems.append(
                f"the balanced cluster was not quiet: {len(requested)} migration(s), "
                f"{rounds} round(s) during the phase without balancing"
            )
        t1 = time.time()
        self.figures["without"] = {
            **ops.window(t0, t1),
            "errors": dict(ops.errors),
            "migrations_during": len(requested),
            "stats_period_s": await self.report_periods(t0, t1),
        }
        w = self.figures["without"]
        print(
            f"1. without balancing (balancer on, nothing to move; {len(requested)} migrations meanwhile):\n"
            f"   {latency_line(w)}, errors {w['errors'] or 'none'}\n"
            f"   a statistics report every {w['stats_period_s']} s (p50; interval {self.args.stats_interval:g}s)",
            flush=True,
        )

    async def phase_with(self, client) -> None:
        """Start s3, AddShard, and the same YCSB-A until the balancer has converged."""
        before = await self.balancer_state()
        shard = self.service(f"shard-{NEW_SHARD}", "services.shard", "--shard-id", NEW_SHARD)
        await wait_ready([shard], lambda p: "active")
        config_mark = await self.log_mark(self.t.config_events)
        balancer_mark = await self.log_mark(self.t.balancer_events)
        ops, stop = Ops(), asyncio.Event()
        load = asyncio.create_task(self.ycsb_a(client, stop, ops))
        cpu_mark = self.cpu_mark()
        added = time.time()
        _, added_at = await self.command(cfg.AddShard(shard=NEW_SHARD))
        converged, after = await self.wait_converged(added_at, f"the balancer to converge after AddShard({NEW_SHARD})")
        cpu = self.cpu_since(cpu_mark)  # to convergence seen: the quiet rounds included
        stop.set()
        await load

        config_events = await self.read_log(self.t.config_events, cfg.events, config_mark)
        balancer_events = await self.read_log(self.t.balancer_events, b.events, balancer_mark)
        conv = self.convergence(config_events, balancer_events, before, after, added, converged)
        conv["cpu_pct"] = cpu
        conv["stats_period_s"] = await self.report_periods(added, converged)
        self.figures["convergence"] = conv
        self.figures["with"] = {**ops.window(added, converged), "errors": dict(ops.errors)}
        if conv["first_request_s"] is not None and conv["last_commit_s"] is not None:
            self.figures["while_moving"] = ops.window(added + conv["first_request_s"], added + conv["last_commit_s"])
        self.print_with(conv)

    def convergence(
        self, config_events, balancer_events, before: dict, after: dict, added: float, converged: float
    ) -> dict:
        """The balancer's work from AddShard to convergence, from both logs and the routing tables."""
        requested = {e.id: (ts, e) for _, ts, e in config_events if e.type == "MigrationRequested"}
        committed = {e.id: (ts, e) for _, ts, e in config_events if e.type == "MigrationCommitted"}
        aborted = {e.id: (ts, e) for _, ts, e in config_events if e.type == "MigrationAborted"}
        rounds = [e for _, _, e in balancer_events if e.type == "RoundCompleted"]
        issued = [e.action for _, _, e in balancer_events if e.type == "ActionIssued" and e.action.kind == "migration"]
        if len(issued) != len(requested):
            self.problems.append(f"the balancer issued {len(issued)} migrations, config.events shows {len(requested)}")

        # What moved: the recipient's chunks of each commit, in commit order.
        moved = [
            (key_of(ch.min), key_of(ch.max))
            for _, (ts, e) in sorted(committed.items(), key=lambda x: x[1][0])
            for ch in e.chunks
            if ch.shard == e.recipient
        ]
        owners_before, owners_after = owners(before["snapshot"]), owners(after["snapshot"])
        if set(owners_before) != set(owners_after):
            self.problems.append(
                "chunk bounds changed during convergence: 'minimum needed' compares owners by chunk min"
            )
        sizes_after = shard_sizes(after["snapshot"])
        # The cluster-wide rebalance rate (issue 17, beside bench_migration's single move): the
        # chunks are alike by construction, so the data moved is the chunks moved x the mean chunk.
        sizes_before = shard_sizes(before["snapshot"])
        chunk_mib = sum(sizes_before.values()) / max(len(owners_before), 1) / MIB
        t = timing(requested, committed, added)
        moving_s = (t["last_commit_s"] or 0) - (t["first_request_s"] or 0)
        mib_moved = len(moved) * chunk_mib
        return {
            "rounds": len(rounds),
            "rounds_by_counter": after["lastRound"]["round"] - before["lastRound"]["round"],
            "rounds_with_failures": sum(1 for r in rounds if r.summary.get("failed")),
            **t,
            "converged_s": round(converged - added, 2),
            "mib_moved": round(mib_moved, 2),
            "mib_per_s_moving": round(mib_moved / moving_s, 2) if moving_s > 0 else None,
            "mib_per_s_to_converged": round(mib_moved / (converged - added), 2) if converged > added else None,
            "migrations_issued": len(requested),
            "committed": len(committed),
            "aborted": len(aborted),
            "abort_reasons": sorted({e.reason for _, e in aborted.values()}),
            "minimum": sum(1 for lo, sh in owners_after.items() if owners_before.get(lo) != sh),
            "ranges_moved_more_than_once": overlapping(moved),
            "mins_requested_more_than_once": sum(
                n - 1 for n in Counter(key_of(e.min) for _, e in requested.values()).values() if n > 1
            ),
            "moves": dict(Counter(f"{a.donor}->{a.recipient}" for a in issued)),
            "chunks_per_shard": dict(sorted(Counter(owners_after.values()).items())),
            "mib_per_shard": {s: round(v / MIB, 2) for s, v in sorted(sizes_after.items())},
            "spread_mib": round((max(sizes_after.values()) - min(sizes_after.values())) / MIB, 2),
        }

    def print_with(self, c: dict) -> None:
        w = self.figures["with"]
        print(
            f"2. AddShard({NEW_SHARD}) -> converged: {c['rounds']} round(s) moved data "
            f"(round counter +{c['rounds_by_counter']}); first MoveRange after {c['first_request_s']}s, last commit "
            f"after {c['last_commit_s']}s, converged after {c['converged_s']}s "
            f"(+{self.args.quiet_rounds} quiet rounds to be sure)"
        )
        print(
            f"   migrations issued {c['migrations_issued']} (committed {c['committed']}, aborted {c['aborted']}"
            f"{': ' + '; '.join(c['abort_reasons']) if c['abort_reasons'] else ''}), minimum needed {c['minimum']}; "
            f"ranges moved more than once {c['ranges_moved_more_than_once']}; moves {c['moves']}"
        )
        print(
            f"   rebalance rate: {c['mib_moved']} MiB moved ({c['committed']} migrations), "
            f"{c['mib_per_s_moving']} MiB/s from the first MoveRange to the last commit, "
            f"{c['mib_per_s_to_converged']} MiB/s from AddShard to converged"
        )
        print(
            f"   each migration MoveRange -> committed: {c['migration_s']} s; a commit -> the next MoveRange: "
            f"{c['commit_to_next_request_s']} s; a statistics report every {c['stats_period_s']} s (p50)"
        )
        print(
            f"   after: chunks per shard {c['chunks_per_shard']}, MiB per shard {c['mib_per_shard']} "
            f"(spread {c['spread_mib']} MiB, limit {3 * self.args.max_chunk_mib:g})"
        )
        print(
            "   CPU (% of one core) AddShard -> converged seen: "
            + ", ".join(f"{n} {v}" for n, v in c["cpu_pct"].items())
        )
        print(f"   YCSB-A AddShard -> converged: {latency_line(w)}, errors {w['errors'] or 'none'}")
        if (mv := self.figures.get("while_moving")) and mv["ops"]:
            print(f"   YCSB-A first MoveRange -> last commit: {latency_line(mv)}")

    def cpu_mark(self) -> tuple[float, dict]:
        return time.monotonic(), {
            **{n: p.cpu_seconds() for n, p in self.procs.items()},
            "broker": cpu_seconds(broker_pid(self.bootstrap)),
        }

    def cpu_since(self, mark: tuple[float, dict]) -> dict:
        """% of one core each process (and the local broker) used since `mark`, busiest first."""
        (t0, before), (t1, now) = mark, self.cpu_mark()
        return dict(
            sorted(((n, round(100 * (now[n] - before.get(n, 0)) / (t1 - t0))) for n in now), key=lambda x: -x[1])
        )

    async def check_count(self, client) -> None:
        count = await client[DB][COLL].count_documents({})
        self.figures["documents_after"] = count
        if count != self.n:
            self.problems.append(f"{count:,} documents after balancing, {self.n:,} loaded")

    # ---------------------------------------------------------------- run

    async def run(self) -> None:
        a = self.args
        print(
            f"balancer benchmark: cluster {self.cluster}; {a.chunks} chunks x {a.chunk_docs:,} documents on "
            f"{len(SHARDS)} shards, then AddShard({NEW_SHARD}); YCSB-A with {a.concurrency} tasks; rounds every "
            f"{a.round_interval:g}s, statistics every {a.stats_interval:g}s",
            flush=True,
        )
        await kafka.ensure_topics(
            self.bootstrap,
            [
                *self.t.core(),
                *self.t.for_balancer(),
                *(sp for sh in (*SHARDS, NEW_SHARD) for sp in self.t.for_shard(sh)),
            ],
        )
        async with Requester(self.bootstrap, self.t.cli_replies, client_id="bench-balancer") as self.req:
            await self.start()
            async with AsyncCluster(self.bootstrap, self.cluster, timeout=120) as client:
                await self.load(client)
                st = await self.start_balancing()
                sizes = shard_sizes(st["snapshot"])
                self.figures["mib_per_shard_before"] = {s: round(v / MIB, 2) for s, v in sorted(sizes.items())}
                print(
                    f"  balancer and range deleter up, the balanced cluster is quiet; MiB per shard "
                    f"{self.figures['mib_per_shard_before']} (chunk ~{sum(sizes.values()) / a.chunks / MIB:.2f} MiB)",
                    flush=True,
                )
                await self.phase_without(client)
                await self.phase_with(client)
                await self.check_count(client)
        w, m, mv = self.figures["without"], self.figures["with"], self.figures.get("while_moving") or {}
        self.figures["p99_ratio"] = ratio(m["p99_ms"], w["p99_ms"])
        self.figures["p99_ratio_while_moving"] = ratio(mv.get("p99_ms"), w["p99_ms"])
        print(
            f"   ratio p99 with / without: {self.figures['p99_ratio']} (AddShard -> converged), "
            f"{self.figures['p99_ratio_while_moving']} (first MoveRange -> last commit)"
        )
        for p in self.problems:
            print(f"   PROBLEM: {p}")

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=24, help="chunks of the collection, dealt to s0..s2 (default 24)")
    p.add_argument(
        "--max-chunk-mib",
        type=float,
        default=1.0,
        help="maxChunkSizeBytes in MiB (default 1); the policy's imbalance threshold is 3x this",
    )
    p.add_argument(
        "--chunk-docs",
        type=int,
        default=None,
        help="documents per chunk, ~880 bytes each (default: ~0.85 of the max chunk size, 1,000 at 1 MiB)",
    )
    p.add_argument("--seconds", type=float, default=30.0, help="length of the phase without balancing (default 30)")
    p.add_argument("--concurrency", type=int, default=8, help="YCSB-A client tasks (default 8)")
    p.add_argument("--round-interval", type=float, default=0.5, help="balancerRoundIntervalSecs (default 0.5)")
    p.add_argument("--throttle-ms", type=int, default=0, help="balancerMigrationsThrottlingMs (default 0)")
    p.add_argument("--stats-interval", type=float, default=0.5, help="SHARDLOG_STATS_INTERVAL_S (default 0.5)")
    p.add_argument(
        "--quiet-rounds", type=int, default=4, help="round intervals the converged state must hold (default 4)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, stores)")
    args = p.parse_args()
    if args.chunk_docs is None:  # whole chunks under the max, so the balancer moves them without cutting
        args.chunk_docs = round(0.85 * args.max_chunk_mib * MIB / DOC_BYTES / 1000) * 1000 or 1000
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
    wall = time.monotonic() - t0
    print(f"({wall:.0f}s wall)")
    E.result_line(
        "balancer",
        chunks=args.chunks,
        chunk_docs=args.chunk_docs,
        max_chunk_mib=args.max_chunk_mib,
        concurrency=args.concurrency,
        round_interval_s=args.round_interval,
        stats_interval_s=args.stats_interval,
        wall_s=round(wall),
        problems=bench.problems,
        **bench.figures,
    )


if __name__ == "__main__":
    main()
