"""Take-over: how soon a standby config server serves after the active one is killed (kill -9).

A catalog of ~100,000 chunks (`--collections` x `--chunks`, the generated log of
`_events.catalog_events`) is written to a cluster's config.events, then two config server
processes run on it (`python -m services.config --instance 0|1`): one active, one standing by
with its projection warm.  Each round kill -9s the active one, waits for the other to report
`active` in its readiness file, sends it a command (SetSetting) and times the reply, then
restarts the killed one as the new standby.

The figure is the heir's `activation` (libs.commands: last_activation), measured from the moment
the consumer group gives it the command partition to the moment it serves: fence (InitProducerId),
committed offset + rewind, catch-up of what the dead one wrote.  The time before the assignment
is the group's session timeout (`--session-timeout-ms`), which detection needs and the issue sets
aside.  Baselines measured in the same run:

- the Kafka floor: a fresh transactional producer's start (InitProducerId) plus one OffsetFetch,
  what any take-over must wait for;
- `Catalog.load` of a store holding the same catalog: the reload a take-over used to do.

`--service shard` does the same for shard s0 (two `services.shard --shard-id s0 --instance 0|1`,
each with a store of its own, behind a config server and router r1) holding `--docs` documents;
the first command is an update through the router.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_takeover.py [--rounds 3] [--chunks 25001]
    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_takeover.py --service shard [--docs 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _events as E
from bench_e2e import Proc

from domain.catalog import Catalog
from libs import kafka
from libs.client import AsyncCluster
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.service import ServiceSettings
from libs.store import Store
from libs.topics import TopicSpec
from schemas import config as schema

ROOT = Path(__file__).resolve().parent.parent


class ServiceProcess(Proc):
    """One service instance in its own process (bench_e2e's `Proc`), waited for by role and
    killed with SIGKILL."""

    def __init__(
        self,
        settings: ServiceSettings,
        module: str,
        args: list[str],
        ready_name: str,
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        full_env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": settings.bootstrap,
            "SHARDLOG_CLUSTER": settings.cluster,
            "SHARDLOG_DATA_DIR": str(settings.data_dir),
            "SHARDLOG_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
            "OTEL_TRACES_EXPORTER": "none",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        super().__init__(
            ready_name, ["-m", module, *args], full_env, log_dir, settings.data_dir / f"{ready_name}.ready"
        )

    def wait(self, role: str | None, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.check(role):  # raises if the process exited
                return self.info() or {}
            time.sleep(0.02)
        raise SystemExit(f"{self.name} not {role or 'ready'} within {timeout:g}s:\n{self.tail()}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


async def serves(settings: ServiceSettings, round_no: int, timeout: float) -> float:
    """Send the config server a command; seconds until its reply (which must be ok)."""
    async with Requester(settings.bootstrap, settings.topics.client_inbox("takeover-bench")) as r:
        t0 = time.perf_counter()
        cmd = schema.SetSetting(key="rangeDeleterBatchSize", value=100 + round_no)
        reply = await r.request(settings.topics.config_commands, cmd, timeout=timeout)
        if not reply.ok:
            raise SystemExit(f"SetSetting was refused after the take-over: {reply}")
        return time.perf_counter() - t0


async def kafka_floor(bootstrap: str, group: str, topic: str, repeat: int) -> list[float]:
    """What a take-over cannot avoid: InitProducerId (fencing) + OffsetFetch of the group."""
    from aiokafka import TopicPartition

    out = []
    tp = TopicPartition(topic, 0)
    # In the group (to fetch its offsets) but never joining it: nothing is assigned away.
    consumer = kafka.consumer(bootstrap, group_id=group, client_id="takeover-floor")
    await consumer.start()
    try:
        for i in range(repeat):
            t0 = time.perf_counter()
            p = kafka.producer(bootstrap, transactional_id=f"{group}.floor-{i}", client_id="takeover-floor")
            await p.start()
            await consumer.committed(tp)
            out.append(time.perf_counter() - t0)
            await p.stop()
    finally:
        await consumer.stop()
    return out


async def reload_time(bootstrap: str, topic: str, path: Path, repeat: int) -> tuple[int, list[float]]:
    """Project the same log into a store of our own, then time Catalog.load of it."""
    store = Store(path)
    await E.timed_replay(bootstrap, topic, Catalog(), store, "takeover-bench")
    loads = []
    chunks = 0
    for _ in range(repeat):
        catalog = Catalog()
        t0 = time.perf_counter()
        catalog.load(store)
        loads.append(time.perf_counter() - t0)
        chunks = sum(len(c.chunks) for c in catalog.collections.values())
    store.close()
    return chunks, loads


def instances(settings: ServiceSettings, service: str, log_dir: Path) -> dict[str, Callable[[], ServiceProcess]]:
    """How to start instance 0 and 1 of the service under test."""
    if service == "config":
        return {
            i: (lambda i=i: ServiceProcess(settings, "services.config", ["--instance", i], READY["config"][i], log_dir))
            for i in ("0", "1")
        }
    return {
        i: (
            lambda i=i: ServiceProcess(
                settings, "services.shard", ["--shard-id", "s0", "--instance", i], READY["shard"][i], log_dir
            )
        )
        for i in ("0", "1")
    }


READY = {"config": {"0": "config", "1": "config-1"}, "shard": {"0": "shard-s0", "1": "shard-s0-1"}}


async def shard_cluster(settings: ServiceSettings, docs: int) -> None:
    """The shard mode's catalog: s0 owns bench.kv, sharded on {_id: hashed}."""
    async with Requester(settings.bootstrap, settings.topics.client_inbox("takeover-bench")) as r:
        for cmd in (schema.AddShard(shard="s0"), schema.ShardCollection(ns=NS, key={"_id": "hashed"})):
            reply = await r.request(settings.topics.config_commands, cmd, timeout=60)
            if not reply.ok:
                raise SystemExit(f"{cmd.type} refused: {reply}")


async def load_documents(settings: ServiceSettings, docs: int) -> None:
    async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=120) as cl:
        coll = cl[NS.split(".")[0]][NS.split(".")[1]]
        for start in range(0, docs, 1000):
            await coll.insert_many([{"_id": i, "v": "x" * 100} for i in range(start, min(start + 1000, docs))])


async def shard_serves(settings: ServiceSettings, round_no: int, timeout: float) -> float:
    """A write through the router to the heir: seconds until it is acknowledged."""
    async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=timeout) as cl:
        coll = cl[NS.split(".")[0]][NS.split(".")[1]]
        t0 = time.perf_counter()
        await coll.update_one({"_id": round_no}, {"$set": {"round": round_no}})
        return time.perf_counter() - t0


NS = "bench.kv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--service", choices=("config", "shard"), default="config", help="whose take-over (default config)")
    p.add_argument("--collections", type=int, default=4, help="config: sharded collections (default 4)")
    p.add_argument(
        "--chunks", type=int, default=25_001, help="config: chunks per collection (default 25,001: 100,004 in all)"
    )
    p.add_argument("--docs", type=int, default=50_000, help="shard: documents on the shard (default 50,000)")
    p.add_argument("--rounds", type=int, default=3, help="take-overs timed (default 3)")
    p.add_argument("--session-timeout-ms", type=int, default=6000, help="the group's session timeout (default 6000)")
    args = p.parse_args()
    bootstrap, cluster = E.bootstrap(), E.cluster_name("takeover")
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-takeover-"))
    settings = ServiceSettings(bootstrap, cluster, tmp / "data", args.session_timeout_ms)
    topics = settings.topics
    what = (
        f"{args.collections} x {args.chunks:_} chunks"
        if args.service == "config"
        else f"shard s0 with {args.docs:_} documents"
    )
    print(f"take-over benchmark ({args.service}): cluster {cluster}, {what}, stores under {tmp}")
    procs: dict[str, ServiceProcess] = {}
    others: list[ServiceProcess] = []
    rounds: list[dict] = []
    loads: list[float] = []
    size = 0
    try:
        asyncio.run(
            kafka.ensure_topics(
                bootstrap, [*topics.core(), *topics.for_shard("s0"), TopicSpec(topics.client_inbox("takeover-bench"))]
            )
        )
        start = instances(settings, args.service, tmp)
        if args.service == "config":
            n = 3 + 1 + args.collections * args.chunks  # shards, database, collections, splits
            count, t_prod = asyncio.run(
                E.produce(
                    bootstrap,
                    topics.config_events,
                    E.catalog_events(n, collections=args.collections, chunks=args.chunks),
                )
            )
            print(f"produced {count:_} config events in {t_prod:.1f}s")
            size, loads = asyncio.run(reload_time(bootstrap, topics.config_events, tmp / "reload", 3))
            print(
                f"Catalog.load of the same {size:_} chunks: median {statistics.median(loads):.3f}s (the reload avoided)"
            )
        else:
            config = ServiceProcess(settings, "services.config", [], "config", tmp)
            others.append(config)
            config.wait("active", 120)
            asyncio.run(shard_cluster(settings, args.docs))
            router = ServiceProcess(settings, "services.router", ["--instance", "r1"], "router-r1", tmp)
            others.append(router)
        for inst in ("0", "1"):
            procs[inst] = start[inst]()
        for proc in [*procs.values(), *others]:
            proc.wait(None, 600)
        deadline = time.monotonic() + 120  # the first activation may still be running
        active = None
        while active is None:
            active = next((i for i, pr in procs.items() if (pr.info() or {}).get("role") == "active"), None)
            if time.monotonic() > deadline:
                raise SystemExit("no instance became active within 120 s")
            time.sleep(0.05)
        if args.service == "shard":
            t0 = time.perf_counter()
            asyncio.run(load_documents(settings, args.docs))
            size = args.docs
            print(f"loaded {args.docs:_} documents in {time.perf_counter() - t0:.1f}s")
        print(f"instance {active} is active; the other stands by with its state warm")
        for r in range(args.rounds):
            heir = "1" if active == "0" else "0"
            procs[heir].wait("standby", 300)
            t_kill = time.perf_counter()
            procs[active].kill9()
            info = procs[heir].wait("active", args.session_timeout_ms / 1000 * 3 + 60)
            t_active = time.perf_counter() - t_kill
            if args.service == "config":
                reply_s = asyncio.run(serves(settings, r, 30))
            else:
                reply_s = asyncio.run(shard_serves(settings, r, 30))
            act = info["activation"]
            rounds.append({**act, "killToActiveS": round(t_active, 3), "replyS": round(reply_s, 4)})
            print(
                f"  round {r + 1}: instance {heir} serving {act['sinceAssignedS']:.3f}s after its assignment "
                f"(fence {act['fenceS']:.3f} + committed/rewind {act['committedS']:.3f} + catch-up "
                f"{act['catchUpS']:.3f}); kill -9 -> active {t_active:.2f}s (session timeout "
                f"{args.session_timeout_ms} ms); first command's reply {reply_s * 1e3:.0f} ms",
                flush=True,
            )
            procs[active] = start[active]()  # the killed one comes back as standby
            active = heir
        group = topics.group("config" if args.service == "config" else "shard-s0")
        command_topic = topics.config_commands if args.service == "config" else topics.shard_requests("s0")
        floor = asyncio.run(kafka_floor(bootstrap, group, command_topic, args.rounds))
    finally:
        for proc in [*procs.values(), *reversed(others)]:
            proc.stop()
        asyncio.run(delete_cluster_topics(bootstrap, cluster))
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}
    floor_s = statistics.median(floor)
    load_s = statistics.median(loads) if loads else None
    reload = f"; the reload no longer done (Catalog.load) {load_s:.3f}s" if load_s is not None else ""
    print(
        f"{args.service} take-over, assignment -> serving: median {med['sinceAssignedS']:.3f}s over {len(rounds)} "
        f"rounds (goal <= 2 s); Kafka floor (InitProducerId + OffsetFetch) {floor_s:.3f}s, ratio "
        f"{med['sinceAssignedS'] / floor_s:.1f}x the floor{reload}"
    )
    E.result_line(
        "takeover",
        service=args.service,
        size=size,
        rounds=rounds,
        median=med,
        kafka_floor_s=round(floor_s, 4),
        catalog_load_s=round(load_s, 4) if load_s is not None else None,
        ratio_to_floor=round(med["sinceAssignedS"] / floor_s, 2),
    )


if __name__ == "__main__":
    main()
