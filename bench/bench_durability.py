"""Durability figures of the local deployment, on brokers of its own (it stops and kills them).

    .venv/bin/python bench/bench_durability.py restart  [--gb 1.0] [--doc-bytes 1000]
    .venv/bin/python bench/bench_durability.py fsync    [--docs 20000] [--serial 400] [--rounds 2]
    .venv/bin/python bench/bench_durability.py takeover [--seconds 20]
    .venv/bin/python bench/bench_durability.py          # all three, restart at --gb 0.05

restart   load GB of documents into a sharded collection, `down`, `up`: time until every
          service is active again (they resume from checkpoints) and until the first read.
          Baselines in the same run: `up` of the empty cluster, and `up` after deleting
          every store (each service rebuilds by replaying its logs).
fsync     the broker acknowledging only what is on disk (`fsync always`, the default) vs
          leaving flushing to the OS (`fsync os`): unordered bulk inserts (docs/s) and
          serial insert_one latency, alternating the two settings on the same data.
takeover  three brokers under a steady read/`$inc` mix: kill -9 the leader of a shard's
          changelog, restart it, then kill -9 the KRaft controller leader: the longest
          operation and the longest gap without a completed operation after each kill,
          against the p99 before any kill.

It runs `python -m infra.cluster` (what `make up/down` run) on a temporary data
directory with its own brokers on free ports, whatever KAFKA_BOOTSTRAP says, and
deletes it at the end.  Prints its figures and a final JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.deployment import LocalDeployment, partition_leaders  # noqa: E402
from libs.client import AsyncCluster  # noqa: E402

CLUSTER = "bench"


class Deployment(LocalDeployment):
    """The shared local deployment; a failed step ends the benchmark with what it printed."""

    def __init__(self, data: Path, brokers: int = 1):
        super().__init__(data, CLUSTER, brokers, env={"SHARDLOG_SESSION_TIMEOUT_MS": "6000"})

    def run(self, action: str) -> float:
        t0 = time.perf_counter()
        r = self.cluster_action(action)
        if r.returncode != 0:
            raise SystemExit(f"infra.cluster {action} failed:\n{r.stdout}\n{r.stderr}")
        return time.perf_counter() - t0

    def up(self) -> float:
        return self.run("up")

    def down(self) -> float:
        return self.run("down")

    def reset(self) -> None:
        self.cluster_action("reset")

    def cli(self, *args: str) -> str:
        r = self.shardlog(*args)
        if r.returncode != 0:
            raise SystemExit(f"shardlog {' '.join(args)}: {r.stdout}{r.stderr}")
        return r.stdout

    def kafka(self, *args: str) -> None:
        r = self.local_kafka(*args)
        if r.returncode != 0:
            raise SystemExit(f"local.py {' '.join(args)}: {r.stdout}{r.stderr}")

    def client(self, **kw) -> AsyncCluster:
        return AsyncCluster(self.bootstrap, CLUSTER, **kw)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def bulk_load(d: Deployment, ns: str, n: int, doc_bytes: int, start: int = 0, progress: bool = False) -> float:
    """Unordered batches of 1,000, four in flight; returns seconds.  The padding is random
    (hex), so neither RocksDB nor Kafka can shrink it: the bytes on disk are the documents'."""
    pads = [os.urandom(doc_bytes // 2).hex() for _ in range(64)]
    db, coll = ns.split(".")
    t0 = time.perf_counter()
    async with d.client(timeout=300) as cl:
        c = cl[db][coll]
        sem = asyncio.Semaphore(4)
        done = 0

        async def batch(lo):
            nonlocal done
            async with sem:
                await c.insert_many(
                    [
                        {"_id": i, "pad": pads[i % 64][i % 7 :] + pads[(i + 1) % 64][: i % 7]}
                        for i in range(lo, min(start + n, lo + 1000))
                    ],
                    ordered=False,
                )
                done += min(1000, start + n - lo)
                if progress and done % 50_000 < 1000:
                    el = time.perf_counter() - t0
                    print(f"  loaded {done:,}/{n:,} documents ({done * doc_bytes / el / 1e6:.1f} MB/s)", flush=True)

        await asyncio.gather(*(batch(lo) for lo in range(start, start + n, 1000)))
    return time.perf_counter() - t0


async def first_read(d: Deployment, ns: str, key: int) -> float:
    db, coll = ns.split(".")
    t0 = time.perf_counter()
    async with d.client(timeout=300) as cl:
        doc = await cl[db][coll].find_one({"_id": key})
        assert doc is not None, f"document {key} missing"
    return time.perf_counter() - t0


async def count(d: Deployment, ns: str) -> int:
    db, coll = ns.split(".")
    async with d.client(timeout=600) as cl:
        return await cl[db][coll].count_documents({})


def bench_restart(base: Path, gb: float, doc_bytes: int) -> dict:
    d = Deployment(base / "restart")
    try:
        empty_up = d.up()
        d.cli("shard-collection", "b.docs", "--key", '{"_id": "hashed"}')
        n = int(gb * 1e9 / doc_bytes)
        print(f"restart: loading {n:,} documents of {doc_bytes} bytes ({gb} GB)", flush=True)
        load_s = asyncio.run(bulk_load(d, "b.docs", n, doc_bytes, progress=True))
        down_s = d.down()
        sizes = {"kafka_bytes": du(d.data / "kafka"), "stores_bytes": du(d.data / "services")}
        restart_up = d.up()
        read_s = asyncio.run(first_read(d, "b.docs", n - 1))
        counted = asyncio.run(count(d, "b.docs"))
        assert counted == n, f"{counted} documents after the restart, {n} loaded"
        # Baseline: the same restart without the stores (every service replays its logs).
        d.down()
        import shutil

        shutil.rmtree(d.data / "services")
        replay_up = d.up()
        replay_read = asyncio.run(first_read(d, "b.docs", n - 1))
        counted_again = asyncio.run(count(d, "b.docs"))
        assert counted_again == n
        out = {
            "documents": n,
            "doc_bytes": doc_bytes,
            "gb": gb,
            **sizes,
            "load_s": round(load_s, 1),
            "load_mb_s": round(n * doc_bytes / load_s / 1e6, 1),
            "down_s": round(down_s, 2),
            "empty_up_s": round(empty_up, 2),
            "restart_up_s": round(restart_up, 2),
            "restart_first_read_s": round(read_s, 2),
            "replay_up_s": round(replay_up, 2),
            "replay_first_read_s": round(replay_read, 2),
            "ratio_restart_over_empty": round(restart_up / empty_up, 2),
            "ratio_restart_over_replay": round(restart_up / replay_up, 3),
        }
        print(
            f"restart with {n:,} documents ({gb} GB of documents; Kafka {sizes['kafka_bytes'] / 1e9:.2f} GB, "
            f"stores {sizes['stores_bytes'] / 1e9:.2f} GB): make up {restart_up:.1f}s to every service active "
            f"+ {read_s:.2f}s to the first read | empty cluster {empty_up:.1f}s (ratio "
            f"{out['ratio_restart_over_empty']}) | rebuilding every store by replay {replay_up:.1f}s (ratio "
            f"{out['ratio_restart_over_replay']}) | load {out['load_mb_s']} MB/s, down {down_s:.1f}s",
            flush=True,
        )
        return out
    finally:
        d.reset()


async def serial_inserts(d: Deployment, ns: str, n: int, start: int) -> list[float]:
    db, coll = ns.split(".")
    lat = []
    async with d.client(timeout=60) as cl:
        c = cl[db][coll]
        for i in range(start, start + n):
            t0 = time.perf_counter()
            await c.insert_one({"_id": i, "pad": "x" * 100})
            lat.append(time.perf_counter() - t0)
    return sorted(lat)


def bench_fsync(base: Path, docs: int, serial: int, rounds: int) -> dict:
    d = Deployment(base / "fsync")
    try:
        d.up()
        d.cli("shard-collection", "b.f", "--key", '{"_id": "hashed"}')
        res: dict[str, dict[str, list]] = {m: {"bulk_docs_s": [], "p50_ms": [], "p99_ms": []} for m in ("always", "os")}
        nxt = 0
        for r in range(rounds):
            for mode in ("always", "os") if r % 2 == 0 else ("os", "always"):
                d.down()
                d.kafka("start", "--fsync", mode)
                d.up()
                s = asyncio.run(bulk_load(d, "b.f", docs, 1000, start=nxt))
                nxt += docs
                lat = asyncio.run(serial_inserts(d, "b.f", serial, nxt))
                nxt += serial
                res[mode]["bulk_docs_s"].append(docs / s)
                res[mode]["p50_ms"].append(lat[len(lat) // 2] * 1000)
                res[mode]["p99_ms"].append(lat[int(len(lat) * 0.99)] * 1000)
                print(
                    f"fsync {mode:6} round {r + 1}: bulk {docs / s:,.0f} docs/s, serial insert_one p50 "
                    f"{lat[len(lat) // 2] * 1000:.1f} ms p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms",
                    flush=True,
                )
        med = {m: {k: round(statistics.median(v), 1) for k, v in figs.items()} for m, figs in res.items()}
        out = {
            "always": med["always"],
            "os": med["os"],
            "ratio_bulk_always_over_os": round(med["always"]["bulk_docs_s"] / med["os"]["bulk_docs_s"], 3),
            "ratio_p50_always_over_os": round(med["always"]["p50_ms"] / med["os"]["p50_ms"], 3),
        }
        print(
            f"fsync always vs os (medians of {rounds}): bulk {med['always']['bulk_docs_s']:,} vs "
            f"{med['os']['bulk_docs_s']:,} docs/s (ratio {out['ratio_bulk_always_over_os']}), serial p50 "
            f"{med['always']['p50_ms']} vs {med['os']['p50_ms']} ms (ratio {out['ratio_p50_always_over_os']})",
            flush=True,
        )
        return out
    finally:
        d.reset()


class Steady:
    """A steady read/$inc mix, 8 in flight, recording (end time, latency) per operation."""

    def __init__(self, d: Deployment, ns: str, docs: int):
        self.d, self.ns, self.docs = d, ns, docs
        self.ops: list[tuple[float, float]] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        db, coll = self.ns.split(".")
        rng = random.Random(3)
        async with self.d.client(timeout=120, attempt_timeout=8) as cl:
            c = cl[db][coll]

            async def worker():
                while not self.stop.is_set():
                    i = rng.randrange(self.docs)
                    t0 = time.monotonic()
                    if rng.random() < 0.5:
                        await c.find_one({"_id": i})
                    else:
                        await c.update_one({"_id": i}, {"$inc": {"n": 1}})
                    t1 = time.monotonic()
                    self.ops.append((t1, t1 - t0))

            await asyncio.gather(*(worker() for _ in range(8)))

    def after(self, since: float, until: float) -> dict:
        window = [(end, lat) for end, lat in self.ops if since <= end <= until]
        ends = sorted([since, *(end for end, _ in window)])
        gap = max((b - a for a, b in zip(ends, ends[1:])), default=until - since)
        return {
            "longest_op_s": round(max((lat for _, lat in window), default=0.0), 2),
            "longest_gap_s": round(gap, 2),
            "ops": len(window),
        }


def _victim(d: Deployment, what: str) -> int:
    if what == "partition leader":
        changelog = f"{CLUSTER}.shard.s0.changelog"
        return partition_leaders(d.bootstrap, [changelog])[changelog]["leader"]
    leader = d.controller_leader()
    if leader is None:
        raise SystemExit("no controller leader found")
    return leader


def bench_takeover(base: Path, seconds: float) -> dict:
    d = Deployment(base / "takeover", brokers=3)
    try:
        d.up()
        d.cli("settings", "set", "balancerEnabled", "false")
        d.cli("shard-collection", "b.t", "--key", '{"_id": "hashed"}')
        asyncio.run(bulk_load(d, "b.t", 1000, 100))
        out: dict = {}

        async def scenario():
            steady = Steady(d, "b.t", 1000)
            task = asyncio.create_task(steady.run())
            loop = asyncio.get_running_loop()
            await asyncio.sleep(5)  # warm-up: client connections, first metadata
            t_warm = time.monotonic()
            await asyncio.sleep(seconds / 2)  # the baseline window: nothing happens on purpose
            lats = sorted(lat for end, lat in steady.ops if end >= t_warm)
            out["baseline"] = {
                "p50_ms": round(lats[len(lats) // 2] * 1000, 1),
                "p99_ms": round(lats[int(len(lats) * 0.99)] * 1000, 1),
                "ops": len(lats),
            }
            for what in ("partition leader", "controller leader"):
                victim = await loop.run_in_executor(None, _victim, d, what)
                os.kill(d.broker_pids()[victim], signal.SIGKILL)
                killed = time.monotonic()
                await asyncio.sleep(seconds)  # observe clients through the take-over
                fig = steady.after(killed, time.monotonic())
                t0 = time.monotonic()
                await loop.run_in_executor(None, d.up)
                fig["broker_restart_s"] = round(time.monotonic() - t0, 1)
                fig["broker"] = victim
                out[what] = fig
                print(
                    f"takeover: {what} (broker {victim}) killed: longest operation {fig['longest_op_s']}s, "
                    f"longest gap without a completed operation {fig['longest_gap_s']}s, {fig['ops']} ops in "
                    f"{seconds:.0f}s; restarted and rejoined in {fig['broker_restart_s']}s",
                    flush=True,
                )
            steady.stop.set()
            await task

        asyncio.run(scenario())
        print(
            f"takeover: baseline p50 {out['baseline']['p50_ms']} ms, p99 {out['baseline']['p99_ms']} ms; ratio "
            f"longest operation / baseline p99: "
            f"{out['partition leader']['longest_op_s'] * 1000 / out['baseline']['p99_ms']:.0f} (partition leader), "
            f"{out['controller leader']['longest_op_s'] * 1000 / out['baseline']['p99_ms']:.0f} (controller leader)",
            flush=True,
        )
        return out
    finally:
        d.reset()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", choices=["restart", "fsync", "takeover", "all"], default="all")
    p.add_argument("--gb", type=float, help="restart: GB of documents (default 1.0; 0.05 with `all`)")
    p.add_argument("--doc-bytes", type=int, default=1000)
    p.add_argument("--docs", type=int, default=20000, help="fsync: documents per bulk load")
    p.add_argument("--serial", type=int, default=400, help="fsync: serial insert_one per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--seconds",
        type=float,
        default=20,
        help="takeover: observation window after each kill (longer than the pause, ~10 s)",
    )
    a = p.parse_args()
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-durability-") as tmp:
        base = Path(tmp)
        if a.what in ("restart", "all"):
            result["restart"] = bench_restart(base, a.gb or (1.0 if a.what == "restart" else 0.05), a.doc_bytes)
        if a.what in ("fsync", "all"):
            result["fsync"] = bench_fsync(base, a.docs, a.serial, a.rounds)
        if a.what in ("takeover", "all"):
            result["takeover"] = bench_takeover(base, a.seconds)
    print(json.dumps({"bench": "durability", **result}))


if __name__ == "__main__":
    main()
