"""Command processor: commands/s and send->reply latency with group commit.

A ConfigServer runs in this process (asyncio task, RocksDB in a temp dir); a
Requester sends N valid commands to config.commands, at most C in flight, each
producing one event (SetSetting balancerMigrationsThrottlingMs to a value never
used before, so every command changes the setting whatever order they land in).
The processor decides each fetched batch in ONE transaction (events, replies,
offsets) -- group commit.

Baseline, same broker, same client (Requester) and pattern: a minimal raw aiokafka
transactional consume-produce loop -- read_committed consumer in a group, a
transactional producer writing one output record and one reply per input, then
send_offsets_to_transaction + commit per fetched batch (max 500, as the processor).

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_commands.py [--n 5000] [--concurrency 200]
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import logging
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import _events as E
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from libs import kafka, tracing
from libs.commands import CORRELATION_ID, REPLY_TO, header
from libs.requests import Requester
from libs.service import ServiceSettings
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Codec
from schemas import config as schema
from schemas.reply import Reply
from services.config.server import ConfigServer

MAX_BATCH = 500
SETTING = "balancerMigrationsThrottlingMs"


class RetryCounter(logging.Handler):
    """Counts the producer's retried produce errors.  On Kafka 4 a produce to a transaction
    whose previous commit is still completing fails verification (KIP-890) and comes back
    as NOT_ENOUGH_REPLICAS, retried after retry_backoff_ms (aiokafka: 100 ms)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.count += 1


RETRIES = RetryCounter()
BACKOFFS: dict[str, int] = {}


def count_coordinator_backoffs() -> None:
    """Diagnostics: count the transaction-coordinator requests aiokafka retries after a
    backoff (e.g. CONCURRENT_TRANSACTIONS while the previous commit's markers are written)."""
    from aiokafka.producer import sender

    for cls in (
        sender.AddPartitionsToTxnHandler,
        sender.AddOffsetsToTxnHandler,
        sender.TxnOffsetCommitHandler,
        sender.EndTxnHandler,
    ):

        def wrapped(self, resp, _orig=cls.handle_response, _name=cls.__name__.removesuffix("Handler")):
            backoff = _orig(self, resp)
            if backoff is not None:
                BACKOFFS[f"{_name}@{backoff * 1000:g}ms"] = BACKOFFS.get(f"{_name}@{backoff * 1000:g}ms", 0) + 1
            return backoff

        cls.handle_response = wrapped


class Counter:
    def __init__(self):
        self.value = 100_000  # far from the default (1000): every command changes the setting

    def next(self) -> int:
        self.value += 1
        return self.value


def command(counter: Counter) -> bytes:
    return Codec.encode(schema.SetSetting(key=SETTING, value=counter.next()))


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


async def drive(req: Requester, topic: str, counter: Counter, n: int, concurrency: int) -> dict:
    """N requests, at most `concurrency` in flight; latency = send -> reply."""
    latencies: list[float] = []
    failures: list[str] = []
    todo = iter(range(n))

    async def worker():
        for _ in todo:
            value = command(counter)
            t0 = time.perf_counter()
            fut = await req.send(topic, value)
            reply = await asyncio.wait_for(fut, 120)
            latencies.append(time.perf_counter() - t0)
            if not reply.ok or (reply.result is not None and reply.result.get("changed") is False):
                failures.append(f"{reply.code}: {reply.error} {reply.result}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"{len(failures)} commands failed or changed nothing, e.g. {failures[0]}")
    return {"n": n, "seconds": wall, "latencies": latencies}


class System:
    """One side of the comparison: where to send, and its transaction counters."""

    def __init__(self, label: str, req: Requester, topic: str, stats: dict):
        self.label, self.req, self.topic, self.stats = label, req, topic, stats
        self.counter = Counter()
        self.rounds: dict[int, list[dict]] = {}

    async def round(self, n: int, concurrency: int) -> dict:
        before = (self.stats["txns"], self.stats["records"], RETRIES.count, dict(BACKOFFS))
        r = await drive(self.req, self.topic, self.counter, n, concurrency)
        r["transactions"] = self.stats["txns"] - before[0]
        r["records"] = self.stats["records"] - before[1]
        r["produce_retries"] = RETRIES.count - before[2]
        r["coordinator_backoffs"] = {k: v - before[3].get(k, 0) for k, v in BACKOFFS.items() if v - before[3].get(k, 0)}
        self.rounds.setdefault(concurrency, []).append(r)
        lat = sorted(r["latencies"])
        print(
            f"  {self.label:8s} c={concurrency:<4d} {n:6_} commands {r['seconds']:6.2f}s = "
            f"{E.rate(n, r['seconds']):7,.0f}/s  p50 {percentile(lat, 0.5) * 1e3:6.1f} ms  "
            f"p99 {percentile(lat, 0.99) * 1e3:6.1f} ms  {r['transactions']} txns  "
            f"backoffs: {r['produce_retries']} produce, {r['coordinator_backoffs'] or 'no coordinator'}",
            flush=True,
        )
        return r

    def summary(self, concurrency: int) -> dict:
        """All rounds at one concurrency pooled: throughput = commands / time, percentiles of every latency."""
        rs = self.rounds[concurrency]
        n, secs = sum(r["n"] for r in rs), sum(r["seconds"] for r in rs)
        lat = sorted(x for r in rs for x in r["latencies"])
        backoffs: dict[str, int] = {}
        for r in rs:
            for k, v in r["coordinator_backoffs"].items():
                backoffs[k] = backoffs.get(k, 0) + v
        txns = sum(r["transactions"] for r in rs)
        return {
            "commands": n,
            "rounds": len(rs),
            "per_s": round(E.rate(n, secs), 1),
            "p50_ms": round(percentile(lat, 0.5) * 1e3, 2),
            "p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
            "max_ms": round(lat[-1] * 1e3, 1),
            "transactions": txns,
            "commands_per_txn": round(sum(r["records"] for r in rs) / txns, 1) if txns else None,
            "produce_retries": sum(r["produce_retries"] for r in rs),
            "coordinator_backoffs": backoffs,
        }


# ------------------------------------------------------------------ shardlog


async def start_shardlog(bootstrap: str, cluster: str, data_dir: Path) -> tuple[asyncio.Task, str, str, dict]:
    settings = ServiceSettings(bootstrap=bootstrap, cluster=cluster, data_dir=data_dir)
    server = ConfigServer(settings, max_batch=MAX_BATCH)
    stats = {"txns": 0, "records": 0}
    transact = server.processor.transact

    async def counted(commands, end):
        await transact(commands, end)
        stats["txns"] += 1
        stats["records"] += len(commands)

    server.processor.transact = counted  # type: ignore[method-assign]
    task = asyncio.create_task(server.run())
    await asyncio.wait_for(server.processor.active.wait(), 60)
    return task, settings.topics.config_commands, settings.topics.cli_replies, stats


# ----------------------------------------------------------------------- raw


async def raw_loop(
    bootstrap: str, in_topic: str, out_topic: str, group: str, stats: dict, retry_backoff_ms: int, two_phase: bool
) -> None:
    """The least a transactional consume-produce service can do per fetched batch."""
    consumer = AIOKafkaConsumer(
        in_topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=10_000,
        heartbeat_interval_ms=2000,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        transactional_id=f"{group}.0",
        linger_ms=2,
        retry_backoff_ms=retry_backoff_ms,
    )
    await producer.start()
    await consumer.start()
    reply = Codec.encode(Reply(ok=True, configTime=0, result={"key": SETTING, "value": 0, "ns": None, "changed": True}))
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=MAX_BATCH)
            for tp, records in batch.items():
                await producer.begin_transaction()
                if two_phase:  # as the processor: outputs acked before any reply is sent
                    futures = [await producer.send(out_topic, rec.value) for rec in records]
                    for f in futures:
                        await f
                for rec in records:
                    if not two_phase:
                        await producer.send(out_topic, rec.value)
                    corr, reply_to = header(rec.headers, CORRELATION_ID), header(rec.headers, REPLY_TO)
                    await producer.send(reply_to.decode(), reply, headers=[(CORRELATION_ID, corr)])
                await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, group)
                await producer.commit_transaction()
                stats["txns"] += 1
                stats["records"] += len(records)
    finally:
        await consumer.stop()
        await producer.stop()


async def start_raw(
    bootstrap: str, cluster: str, retry_backoff_ms: int, two_phase: bool
) -> tuple[asyncio.Task, str, str, dict]:
    t_in, t_out, t_replies = f"{cluster}.raw.in", f"{cluster}.raw.out", f"{cluster}.raw.replies"
    await kafka.ensure_topics(bootstrap, [TopicSpec(t_in), TopicSpec(t_out), TopicSpec(t_replies, config=SHORT_LIVED)])
    stats = {"txns": 0, "records": 0}
    task = asyncio.create_task(raw_loop(bootstrap, t_in, t_out, f"{cluster}.raw", stats, retry_backoff_ms, two_phase))
    return task, t_in, t_replies, stats


async def run(
    bootstrap: str,
    cluster: str,
    data_dir: Path,
    plan,
    repeat: int,
    retry_backoff_ms: int,
    two_phase: bool,
    profile: cProfile.Profile | None,
) -> tuple[System, System]:
    """Both sides up at once (the idle one only polls), rounds alternating between them."""
    ours = await start_shardlog(bootstrap, cluster, data_dir)
    raw = await start_raw(bootstrap, cluster, retry_backoff_ms, two_phase)
    tasks = [ours[0], raw[0]]
    try:
        async with (
            Requester(bootstrap, ours[2], client_id="bench-client") as r1,
            Requester(bootstrap, raw[2], client_id="bench-client") as r2,
        ):
            systems = (System("shardlog", r1, ours[1], ours[3]), System("raw", r2, raw[1], raw[3]))
            for s in systems:  # warm-up: producer ids, metadata, group join, first transactions
                await drive(s.req, s.topic, s.counter, 50, 10)
            for i in range(repeat):
                print(f"round {i + 1}/{repeat}")
                for n, c in plan:
                    for s in systems:
                        if profile and s.label == "shardlog":
                            profile.enable()
                        await s.round(n, c)
                        if profile:
                            profile.disable()
            return systems
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    p = E.arg_parser(__doc__.splitlines()[0], 5000)
    p.add_argument("--concurrency", type=int, default=200, help="commands in flight (default 200)")
    p.add_argument(
        "--n-serial",
        type=int,
        default=1000,
        help="commands sent one at a time for the latency floor (default 1000, at most --n)",
    )
    p.add_argument(
        "--no-tracing",
        action="store_true",
        help="leave OpenTelemetry's no-op provider (a service host installs the SDK's, as here by default)",
    )
    p.add_argument(
        "--raw-retry-backoff-ms",
        type=int,
        default=100,
        help="the baseline producer's retry_backoff_ms (default 100, aiokafka's and so shardlog's)",
    )
    p.add_argument(
        "--raw-two-phase",
        action="store_true",
        help="the baseline waits for its output records' acks before sending replies, as the processor "
        "does to name the ConfigTime in a reply (default: send both, one produce round trip)",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds, alternating shardlog and raw (default 3)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the shardlog rounds (server and client: one process, one event loop)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    sender = logging.getLogger("aiokafka.producer.sender")
    sender.setLevel(logging.WARNING)
    sender.propagate = False
    sender.addHandler(RETRIES)
    count_coordinator_backoffs()
    if not args.no_tracing:
        tracing.setup("shardlog-bench")  # what run_service does: SDK spans, exported only with an OTLP endpoint
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    plan = [(args.n, args.concurrency), (min(args.n_serial, args.n), 1)]
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-commands-"))
    print(
        f"command benchmark: cluster {cluster}; {args.repeat} rounds of {plan} (commands, concurrency) "
        f"alternating shardlog / raw; max batch {MAX_BATCH}; tracing {'off' if args.no_tracing else 'SDK'}"
    )
    prof = cProfile.Profile() if args.profile else None
    try:
        ours, raw = asyncio.run(
            run(bootstrap, cluster, tmp, plan, args.repeat, args.raw_retry_backoff_ms, args.raw_two_phase, prof)
        )
    finally:
        t = Topics(cluster)
        E.delete_topics(
            bootstrap,
            [s.name for s in t.core()] + [f"{cluster}.raw.in", f"{cluster}.raw.out", f"{cluster}.raw.replies"],
        )
        shutil.rmtree(tmp, ignore_errors=True)
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    figures = {}
    print("pooled over all rounds:")
    for _, c in plan:
        o, r = ours.summary(c), raw.summary(c)
        for label, x in (("shardlog", o), ("raw", r)):
            print(
                f"  {label:8s} c={c:<4d} {x['commands']:7_} commands: {x['per_s']:8,.0f}/s  p50 {x['p50_ms']:6.1f} ms  "
                f"p99 {x['p99_ms']:6.1f} ms  max {x['max_ms']:6.1f} ms  {x['commands_per_txn']} commands/txn"
            )
        tput, p50, p99 = o["per_s"] / r["per_s"], o["p50_ms"] / r["p50_ms"], o["p99_ms"] / r["p99_ms"]
        print(
            f"  ratio shardlog / raw at concurrency {c}: throughput {tput:.3f}, p50 latency {p50:.2f}x, "
            f"p99 latency {p99:.2f}x"
        )
        figures[f"c{c}"] = {
            "shardlog": o,
            "raw": r,
            "ratio_throughput": round(tput, 4),
            "ratio_p50": round(p50, 3),
            "ratio_p99": round(p99, 3),
        }
    E.result_line(
        "commands",
        n=args.n,
        n_serial=plan[1][0],
        concurrency=args.concurrency,
        repeat=args.repeat,
        tracing=not args.no_tracing,
        max_batch=MAX_BATCH,
        raw_retry_backoff_ms=args.raw_retry_backoff_ms,
        raw_two_phase=args.raw_two_phase,
        **figures,
    )


if __name__ == "__main__":
    main()
