"""Migration throughput and critical-section cost: moving a range between shards, idle and under load.

Every service is its own process, as in bench_e2e.py: `python -m services.config`,
`services.shard --shard-id s0|s1|s2` and `services.router --instance r1`, on the broker
of $KAFKA_BOOTSTRAP, under a fresh cluster name.  The client is this process
(`libs.client.AsyncCluster`).  `mig.docs` is sharded on {k: 1} and split at
k = 0, N, N + r, so [0, N) (the big range) and [N, N + r) (the small range) are
chunks of their own, both on s0; N documents + r documents of ~1.1 KB
(`{_id: i, k: i, f0..f9: 100 chars}`) are inserted with insert_many.

A migration is run as an operator would: `MoveRange` to config.commands, then
`GetMigration` polled (every 50 ms) until its state is not "active"; the time is
MoveRange sent -> "committed" seen.  Then the bench waits for the donor's
MigrationForgotten in its changelog and only then asks the donor `ListMigrations`
(documents, bytes, mods, `criticalSince`, `criticalMs`): ListMigrations counts the
documents of every range-deletion task, a scan of the range that would hold up the
donor's RecordDecision and lengthen the critical section being measured.  The
phases come from the Kafka timestamps of the coordinator's requests on both shards'
request topics and of their replies on its inbox.

1. idle:      [0, N) moved s0 -> s1 with nothing else running: documents/s, MB/s.
2. loaded:    [0, N) moved s1 -> s2 while `--concurrency` client tasks run YCSB-A
              (50 % find_one / 50 % update_one of a uniform k in [0, N): the moving
              range itself); client ops/s before and during the move.
3. raw:       the same N documents (the same JSON values and store keys as the
              shard's) read from a rocksdict store, framed into ~2 MB Kafka records
              (2,000 documents or 2 MB, the donor's clone batch), produced (acks=all,
              idempotent), consumed (read_committed) by a child process that writes
              each record's documents into a fresh rocksdict with one WriteBatch.
              (a) `stream`: no waiting; (b) `one_in_flight`: the sink acks each batch
              on a Kafka topic and the source waits for it, as the donor waits for each
              TransferBatch reply; (c) `one_in_flight+changelog`: (b), and the sink
              first produces every document as a record of its own to a compacted
              topic, in one transaction per batch with the ack (what the recipient
              shard's processor does, without decoding, pydantic, spans or state).
              ratio = migration documents/s / raw documents/s, for each.
4. critical:  [N, N + r) moved s0 -> s1 -> s0 ... `--moves` times while `--writers`
              client tasks update_one documents of that range in a loop; every write's
              start and end are recorded.  Writes that overlap a critical section
              ([criticalSince, criticalSince + criticalMs] of a move) vs the others:
              p50/p99/max.  After each move the bench deletes the donor's orphans with
              `DeleteRangeBatch` (the range deleter's job; the service is a stub), else
              the move back would wait for them (RangeDeletionPending).

5. floor:     the loaded move's floor: the raw path with changelog (3 (c)'s sink, a source in a
              child process framing documents of the same shape into records of the throttled
              clone's size, one in flight) runs for `--raw-beside-seconds` beside the same YCSB-A
              clients, no shardlog code moving anything: the clients' ops/s before and during it,
              and their change per MB/s, printed beside the loaded move's clone phase.

The load tasks address a document by {_id: k, k: k}: the router targets the shard by
k and the shard finds the document by _id.  `--filter key` uses {k: k} alone, which
the shard serves by scanning every range it owns (see bench/README.md).

MB = 10^6 bytes of documents (their compact JSON, as the donor counts them).
Run order: load, 4, 3, 1, 2, 5 (the small moves run before the big range leaves
N orphans on s0 and s1).  Ends with one JSON line, as the other benchmarks.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_migration.py [--docs 50000] [--moves 20] [--range-docs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import pstats
import queue
import random
import re
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import _events as E
from aiokafka import TopicPartition
from bench_e2e import (
    Proc,
    broker_pid,
    cpu_seconds,
    delete_cluster_topics,
    machine_busy,
    print_profile,
    wait_group,
    wait_ready,
)
from rocksdict import Options, Rdict, WriteBatch

from domain.shardkey import encode_value
from libs import kafka
from libs.client import AsyncCluster
from libs.commands import CORRELATION_ID
from libs.requests import Requester
from libs.topics import LARGE_RECORDS, SHORT_LIVED, Topics, TopicSpec
from schemas import config as cfg
from schemas import shard as s
from services.shard import donor as donor_mod
from services.shard.documents import doc_key

ROOT = E.ROOT
SHARDS = ("s0", "s1", "s2")
DB, COLL = "mig", "docs"
NS = f"{DB}.{COLL}"
MB = 1_000_000
FIELDS = 10
POLL_S = 0.05  # GetMigration polling
PHASES = {  # phases of a migration, each from one answered request of the donor's coordinator to the next
    "start": "MoveRange -> StartDonation answered",
    "receipt": "StartReceipt",
    "clone": "clone: TransferBatch(clone) x n",
    "catch_up": "catch-up: mods -> EnterCriticalSection",
    "critical": "last mods + CommitClone + block reads",
    "commit": "CommitMigration + RecordDecision",
}
REQUEST_TYPE = re.compile(rb'^\{"type":"(\w+)"')
REQUEST_DETAIL = re.compile(rb'"(?:phase":"(\w+)"|reads":(true|false))')


# ------------------------------------------------------------------ figures


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]


def lat_stats(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": _r(pct(values, 50)),
        "p99_ms": _r(pct(values, 99)),
        "max_ms": _r(max(values) if values else None),
    }


def _r(x, nd: int = 1):
    return None if x is None else round(x, nd)


def fmt_ms(x) -> str:
    return "    -" if x is None else f"{x:7.1f}"


# ---------------------------------------------------------------- documents


def make_doc(i: int, rng: random.Random) -> dict:
    """~1.1 KB: _id, k and 10 fields of 100 base64 characters."""
    raw = rng.randbytes(75 * FIELDS)
    text = base64.b64encode(raw).decode()
    return {"_id": i, "k": i, **{f"f{j}": text[j * 100 : (j + 1) * 100] for j in range(FIELDS)}}


def key_filter(k: int, by: str) -> dict:
    """The filter the load tasks use: {_id, k} (the router targets by k, the shard finds by _id)
    or, with --filter key, {k} alone (the shard then scans every range it owns: see the README)."""
    return {"_id": k, "k": k} if by == "id" else {"k": k}


def dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()  # as the shard stores and counts it


# ------------------------------------------------------------ raw data path


def frame(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(struct.pack(">II", len(k), len(v)) + k + v for k, v in pairs)


def unframe(buf: bytes):
    mv, at = memoryview(buf), 0
    while at < len(mv):
        kl, vl = struct.unpack_from(">II", mv, at)
        at += 8
        yield bytes(mv[at : at + kl]), bytes(mv[at + kl : at + kl + vl])
        at += kl + vl


def raw_sink(
    bootstrap: str, topic: str, ack_topic: str | None, changelog: str | None, dest: str, n_docs: int, q
) -> None:
    """Child process: consume the framed batches, write each into a fresh rocksdict with one
    WriteBatch; report (time, docs, bytes) when n_docs are written.  With an ack topic, each
    batch is acked; with a changelog too, each document is first produced to it as a record
    of its own, in one transaction per batch holding the ack (as the shard's processor does)."""

    async def go():
        db = Rdict(dest, Options(raw_mode=True))
        c = kafka.consumer(bootstrap, client_id="raw-sink")
        if changelog:
            p = kafka.producer(bootstrap, client_id="raw-sink", transactional_id=f"{topic}.sink")
        else:
            p = kafka.producer(bootstrap, client_id="raw-sink", linger_ms=0) if ack_topic else None
        await c.start()
        if p:
            await p.start()
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, (await c.end_offsets([tp]))[tp])
        await c.position(tp)
        q.put(("ready",))
        docs = size = 0
        try:
            while docs < n_docs:
                batch = await c.getmany(tp, timeout_ms=100)
                for rec in batch.get(tp, []):
                    wb = WriteBatch(raw_mode=True)
                    if changelog:
                        await p.begin_transaction()
                    for k, v in unframe(rec.value):
                        wb.put(k, v)
                        docs += 1
                        size += len(v)
                        if changelog:
                            await p.send(changelog, v, key=k)
                    if changelog:
                        await p.send(ack_topic, b"ack", key=rec.key)
                        await p.commit_transaction()
                    db.write(wb)
                    if p and not changelog:
                        await p.send_and_wait(ack_topic, b"ack", key=rec.key)
            q.put(("done", time.time(), docs, size))
        finally:
            await c.stop()
            if p:
                await p.stop()
            db.close()

    asyncio.run(go())


def raw_clone_source(
    bootstrap: str, topic: str, ack_topic: str, n: int, batch_bytes: int, seconds: float, seed: int, q
) -> None:
    """Child process: for `seconds`, frame documents of the bench's shape (k cycling over [0, n)) into
    records of `batch_bytes`, one in flight: each waits for the sink's ack (the throttled clone's
    shape); report (start, end, documents, bytes)."""

    async def go():
        rng = random.Random(seed)
        docs = [(doc_key(NS, encode_value(i), encode_value(i)), dumps(make_doc(i, rng))) for i in range(min(n, 20_000))]
        p = kafka.producer(bootstrap, client_id="raw-beside-source", linger_ms=0)
        acks = kafka.consumer(bootstrap, client_id="raw-beside-source")
        await p.start()
        await acks.start()
        try:
            atp = TopicPartition(ack_topic, 0)
            acks.assign([atp])
            acks.seek(atp, (await acks.end_offsets([atp]))[atp])
            await acks.position(atp)
            sent = size = i = batches = 0
            t0 = time.time()
            while time.time() - t0 < seconds:
                pairs, batch = [], 0
                while batch < batch_bytes:
                    pairs.append(docs[i % len(docs)])
                    batch += len(pairs[-1][1])
                    i += 1
                await (await p.send(topic, frame(pairs), key=str(batches).encode()))
                batches += 1
                while not (await acks.getmany(atp, timeout_ms=1000)).get(atp):
                    pass
                sent, size = sent + len(pairs), size + batch
            q.put(("done", t0, time.time(), sent, size))
        finally:
            await p.stop()
            await acks.stop()

    asyncio.run(go())


async def child_report(q, proc, timeout: float):
    """The next report a raw child process puts on `q`, waited for off the event loop."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, q.get, True, timeout)
    except queue.Empty:
        raise SystemExit(f"{proc.name} did not answer within {timeout:g}s (exit code {proc.exitcode})") from None


async def raw_path(
    bootstrap: str,
    src: Rdict,
    lo: bytes,
    hi: bytes,
    n_docs: int,
    topic: str,
    ack_topic: str | None,
    changelog: str | None,
    dest: Path,
) -> dict:
    """Read [lo, hi) of `src`, produce it in ~2 MB framed records, the sink writes it into `dest`."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(
        target=raw_sink,
        args=(bootstrap, topic, ack_topic, changelog, str(dest), n_docs, q),
        daemon=True,
        name="raw sink",
    )
    proc.start()

    p = kafka.producer(bootstrap, client_id="raw-source", linger_ms=0)
    acks = kafka.consumer(bootstrap, client_id="raw-source") if ack_topic else None
    await p.start()
    if acks:
        await acks.start()
        atp = TopicPartition(ack_topic, 0)
        acks.assign([atp])
        acks.seek(atp, (await acks.end_offsets([atp]))[atp])
        await acks.position(atp)
    try:
        assert (await child_report(q, proc, 60))[0] == "ready"
        t0 = time.time()
        it = src.iter()
        it.seek(lo)
        pairs, size, sent, futures, batches = [], 0, 0, [], 0

        async def send():
            nonlocal pairs, size, batches
            fut = await p.send(topic, frame(pairs), key=str(batches).encode())
            batches += 1
            pairs, size = [], 0
            if acks:
                await fut
                while True:  # one batch in flight: wait for the sink's ack
                    got = await acks.getmany(atp, timeout_ms=1000)
                    if got.get(atp):
                        return
            else:
                futures.append(fut)

        while it.valid() and it.key() < hi:
            k, v = it.key(), it.value()
            pairs.append((k, v))
            size += len(v)
            sent += 1
            if len(pairs) >= donor_mod.CLONE_BATCH_DOCS or size >= donor_mod.CLONE_BATCH_BYTES:
                await send()
            it.next()
        if pairs:
            await send()
        t_read = time.time()
        await asyncio.gather(*futures)
        _, t_end, docs, nbytes = await child_report(q, proc, 300)
        assert docs == sent == n_docs, (docs, sent, n_docs)
    finally:
        await p.stop()
        if acks:
            await acks.stop()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    secs = t_end - t0
    return {
        "docs": docs,
        "bytes": nbytes,
        "batches": batches,
        "seconds": round(secs, 3),
        "docs_s": round(docs / secs, 1),
        "mb_s": round(nbytes / MB / secs, 2),
        "source_seconds": round(t_read - t0, 3),
        "ms_per_batch": round(secs / batches * 1000, 1),
    }


class YcsbLoad:
    """`--concurrency` client tasks running YCSB-A (50 % find_one / 50 % update_one of a uniform k in
    [0, n)) until stopped; every operation's (start unix, latency ms, kind) is kept."""

    def __init__(self, coll, n: int, a) -> None:
        self.ops: list[tuple[float, float, str]] = []
        self.errors: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._client(coll, n, a, i)) for i in range(a.concurrency)]

    async def _client(self, coll, n: int, a, i: int) -> None:
        rng = random.Random(a.seed * 1000 + i)
        while not self._stop.is_set():
            k = rng.randrange(n)
            t, t0 = time.time(), time.perf_counter()
            try:
                if rng.random() < 0.5:
                    kind = "read"
                    await coll.find_one(key_filter(k, a.filter))
                else:
                    kind = "update"
                    await coll.update_one(key_filter(k, a.filter), {"$set": {"f0": f"{i}-{t}".ljust(100, ".")}})
                self.ops.append((t, (time.perf_counter() - t0) * 1000, kind))
            except Exception as e:  # measured, not raised
                self.errors[type(e).__name__] = self.errors.get(type(e).__name__, 0) + 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def window(self, lo: float, hi: float) -> dict:
        sel = [lat for t, lat, _ in self.ops if lo <= t < hi]
        return {"ops": len(sel), "ops_s": round(len(sel) / (hi - lo), 1), **lat_stats(sel)}


# -------------------------------------------------------------------- bench


class Bench:
    def __init__(self, args, bootstrap: str, cluster: str, tmp: Path):
        self.args, self.bootstrap, self.cluster, self.tmp = args, bootstrap, cluster, tmp
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
        }
        self.procs: dict[str, Proc] = {}
        self.broker = broker_pid(bootstrap)
        self.n, self.r = args.docs, args.range_docs
        self.figures: dict = {}
        self.problems: list[str] = []

    # ---------------------------------------------------------------- setup

    def service(self, name: str, module: str, *argv: str) -> Proc:
        prof = self.tmp / f"{name}.prof" if name in self.args.profile_service else None
        p = Proc(name, ["-m", module, *argv], self.env, self.logs, self.data / f"{name}.ready", prof)
        self.procs[name] = p
        return p

    async def command(self, cmd, timeout: float = 60) -> dict:
        reply = await self.req.request(self.t.config_commands, cmd, timeout=timeout)
        if not reply.ok:
            raise SystemExit(f"{cmd.type} refused: {reply.code}: {reply.error}")
        return reply.result or {}

    async def shard_request(self, shard: str, req, timeout: float = 60) -> dict:
        reply = await self.req.request(self.t.shard_requests(shard), req, timeout=timeout)
        if not reply.ok:
            raise RuntimeError(f"{shard}: {req.type} refused: {reply.code}: {reply.error}")
        return reply.result or {}

    async def create_topics(self) -> None:
        t = self.t
        await kafka.ensure_topics(
            self.bootstrap,
            [
                *t.core(),
                *(sp for sh in SHARDS for sp in t.for_shard(sh)),
                TopicSpec(f"{self.cluster}.raw.transfer", config=SHORT_LIVED),
                TopicSpec(f"{self.cluster}.raw.acks", config=SHORT_LIVED),
                TopicSpec(f"{self.cluster}.raw.changelog", config={"cleanup.policy": "compact", **LARGE_RECORDS}),
            ],
        )

    async def start(self) -> None:
        t0 = time.monotonic()
        config = self.service("config", "services.config")
        await wait_ready([config], lambda p: "active")
        for sid in SHARDS:
            await self.command(cfg.AddShard(shard=sid))
        await self.command(cfg.CreateDatabase(db=DB, primary="s0"))
        await self.command(cfg.ShardCollection(ns=NS, key={"k": 1}))
        for key, value in self.args.set:
            await self.command(cfg.SetSetting(key=key, value=value))
        await self.command(cfg.SplitChunk(ns=NS, at=[{"k": 0}, {"k": self.n}, {"k": self.n + self.r}]))
        shards = [self.service(f"shard-{sid}", "services.shard", "--shard-id", sid) for sid in SHARDS]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        await wait_ready([*shards, router], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        print(
            f"  config, {len(SHARDS)} shards, router r1 up in {time.monotonic() - t0:.1f}s; {NS} sharded on "
            f"{{k: 1}}, chunks [MinKey, 0) [0, {self.n:,}) [{self.n:,}, {self.n + self.r:,}) "
            f"[{self.n + self.r:,}, MaxKey) on s0",
            flush=True,
        )

    async def load(self, coll) -> None:
        """Insert [0, N + r) with insert_many; the same JSON values also go into the raw source store."""
        a = self.args
        self.src = Rdict(str(self.tmp / "raw-source"), Options(raw_mode=True))
        total = self.n + self.r
        rng = random.Random(a.seed)
        starts = iter(range(0, total, a.batch))
        self.doc_bytes = 0
        lats: list[float] = []

        async def worker():
            while (lo := next(starts, None)) is not None:
                docs = [make_doc(i, rng) for i in range(lo, min(total, lo + a.batch))]
                wb = WriteBatch(raw_mode=True)
                for d in docs:
                    v = dumps(d)
                    self.doc_bytes += len(v) if d["k"] < self.n else 0
                    wb.put(doc_key(NS, encode_value(d["k"]), encode_value(d["_id"])), v)
                self.src.write(wb)
                t = time.perf_counter()
                await coll.insert_many(docs, ordered=False)
                lats.append((time.perf_counter() - t) * 1000)

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(a.load_concurrency)))
        secs = time.monotonic() - t0
        self.figures["load"] = {
            "docs": total,
            "seconds": round(secs, 2),
            "docs_s": round(total / secs, 1),
            "batch": a.batch,
            "batch_latency": lat_stats(lats),
        }
        print(
            f"  load: {total:,} documents ({self.doc_bytes / self.n:,.0f} bytes each on average) in {secs:.1f}s = "
            f"{total / secs:,.0f} docs/s (insert_many of {a.batch}, {a.load_concurrency} in flight: "
            f"p50 {pct(lats, 50):.0f} ms, p99 {pct(lats, 99):.0f} ms)",
            flush=True,
        )

    # ------------------------------------------------------------ migrations

    async def migrate(self, lo: int, hi: int, to: str, *, label: str, cpu_mark: dict | None = None) -> dict:
        """MoveRange [lo, hi) to `to`; wait for the outcome and the donor's final progress.

        The donor is not asked anything before it has forgotten the migration: ListMigrations
        counts the documents of every range-deletion task (a scan of the range), which would
        hold up the donor's RecordDecision and lengthen the critical section being measured.
        The end of the migration is read from the donor's changelog instead."""
        t0_unix, t0 = time.time(), time.perf_counter()
        res = await self.command(cfg.MoveRange(ns=NS, min={"k": lo}, max={"k": hi}, to=to))
        if not res.get("moved", True) or "id" not in res:
            raise SystemExit(f"{label}: MoveRange did not start a migration: {res}")
        mid, donor = res["id"], res["donor"]
        while True:
            st = await self.command(cfg.GetMigration(id=mid), timeout=30)
            if st["state"] != "active":
                break
            await asyncio.sleep(POLL_S)
        secs = time.perf_counter() - t0
        cpu = self.cpu_since(cpu_mark) if cpu_mark else None  # MoveRange -> committed
        outcome = st["state"]
        forgotten = await self.wait_forgotten(mid, donor, int(t0_unix * 1000) - 1000)
        progress, lm = {}, {}
        for _ in range(50):
            t_lm = time.perf_counter()
            lm = await self.shard_request(donor, s.ListMigrations())
            lm_ms = (time.perf_counter() - t_lm) * 1000
            progress = lm["progress"].get(mid, {})
            if progress.get("phase") == "done":
                break
            await asyncio.sleep(0.1)
        m = {
            "label": label,
            "id": mid,
            "donor": donor,
            "recipient": to,
            "outcome": outcome,
            "seconds": round(secs, 3),
            "t0": t0_unix,
            "t_end": t0_unix + secs,
            "progress": progress,
            "cpu": cpu,
            "list_migrations_ms": round(lm_ms, 1),
            "orphans_left": sum(t.get("left", 0) for t in lm.get("rangeDeletions", [])),
        }
        if outcome != "committed" or progress.get("phase") != "done" or not forgotten:
            rec = await self.shard_request(to, s.ListMigrations())
            msg = (
                f"{label}: migration {mid} {donor} -> {to}: outcome {outcome!r}, donor progress {progress}, "
                f"forgotten by the donor: {forgotten}\n"
                f"    donor ListMigrations: {json.dumps(lm)[:3000]}\n"
                f"    recipient ListMigrations: {json.dumps(rec)[:3000]}"
            )
            print("  PROBLEM " + msg, flush=True)
            self.problems.append(msg)
        return m

    async def wait_forgotten(self, mid: str, donor: str, since_ms: int, timeout: float = 120) -> bool:
        """Until the donor's changelog holds MigrationForgotten for `mid` (its last step)."""
        key = b"mig/" + mid.encode()
        tp = TopicPartition(self.t.shard_changelog(donor), 0)
        c = kafka.consumer(self.bootstrap, client_id="bench-wait")
        await c.start()
        try:
            c.assign([tp])
            at = (await c.offsets_for_times({tp: since_ms}))[tp]
            c.seek(tp, at.offset if at is not None else (await c.end_offsets([tp]))[tp])
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                batch = await c.getmany(tp, timeout_ms=100)
                for rec in batch.get(tp, []):
                    if rec.key == key and isinstance(s.changelog.decode(rec.value), s.MigrationForgotten):
                        return True
            return False
        finally:
            await c.stop()

    async def delete_orphans(self, shard: str, mid: str) -> tuple[int, float]:
        """The range deleter's job for one task: DeleteRangeBatch until done."""
        t0, deleted = time.perf_counter(), 0
        while True:
            res = await self.shard_request(shard, s.DeleteRangeBatch(task=mid, limit=self.args.delete_batch))
            deleted += res.get("deleted", 0)
            if res.get("done"):
                return deleted, time.perf_counter() - t0
            if res.get("waiting"):
                await asyncio.sleep(0.05)

    async def _read_since(self, topic: str, since_ms: int, on_record) -> None:
        c = kafka.consumer(self.bootstrap, client_id="bench-timeline")
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            at = (await c.offsets_for_times({tp: since_ms}))[tp]
            c.seek(tp, at.offset if at is not None else (await c.end_offsets([tp]))[tp])

            async def on_batch(records):
                for rec in records:
                    on_record(rec)

            await kafka.catch_up(c, tp, on_batch)
        finally:
            await c.stop()

    async def timeline(self, m: dict) -> dict:
        """When each request of migration m was sent by the donor's coordinator and answered
        (ms after MoveRange was sent), from the Kafka timestamps of the requests on both shards'
        request topics and of the replies on the coordinator's inbox (all delete-policy topics;
        the changelogs are compacted, so a migration's early MigrationRecorded records may be gone)."""
        since = int(m["t0"] * 1000) - 1000
        mid = m["id"].encode()
        sent: list[tuple[float, str, str | None, bytes]] = []  # (ms, type, phase / reads, correlation id)
        replied: dict[bytes, float] = {}

        def on_request(rec):
            head = rec.value[:300]
            if mid not in head:
                return
            kind = REQUEST_TYPE.match(head)
            if kind:  # the request's type, and for TransferBatch its phase, for EnterCriticalSection reads
                detail = REQUEST_DETAIL.search(head)
                corr = dict(rec.headers or []).get(CORRELATION_ID, b"")
                sent.append(
                    (
                        rec.timestamp - m["t0"] * 1000,
                        kind[1].decode(),
                        (detail[1] or detail[2]).decode() if detail else None,
                        corr,
                    )
                )

        def on_reply(rec):
            corr = dict(rec.headers or []).get(CORRELATION_ID)
            if corr is not None and corr not in replied:
                replied[corr] = rec.timestamp - m["t0"] * 1000

        for shard in (m["donor"], m["recipient"]):
            await self._read_since(self.t.shard_requests(shard), since, on_request)
        await self._read_since(self.t.inbox(f"shard-{m['donor']}-migrations"), since, on_reply)
        sent.sort()

        def first(kind: str, detail: str | None = None, answered: bool = True):
            for t, k, d, corr in sent:
                if k == kind and (detail is None or d == detail):
                    return replied.get(corr) if answered else t
            return None

        clone = [(t, corr) for t, k, d, corr in sent if k == "TransferBatch" and d == "clone"]
        mods = [(t, corr) for t, k, d, corr in sent if k == "TransferBatch" and d == "mods"]
        critical = first("EnterCriticalSection", "false")
        points = {
            "donation": first("StartDonation"),
            "receipt": first("StartReceipt"),
            "clone_end": replied.get(clone[-1][1]) if clone else None,
            "critical": critical,
            "committing": first("EnterCriticalSection", "true"),
            "decided": first("RecordDecision"),
            "committed_seen": m["seconds"] * 1000,
            "forgotten": first("ForgetMigration"),
        }
        return {
            "points_ms": {k: _r(v) for k, v in points.items()},
            "clone_batches": len(clone),
            "mods_batches_before_critical": sum(1 for t, _ in mods if critical is None or t < critical),
            "mods_batches": len(mods),
        }

    @staticmethod
    def phases(tl: dict) -> dict:
        """Consecutive phases, each from one answered request to the next, up to RecordDecision."""
        p = tl["points_ms"]

        def d(a, b):
            return _r(p[b] - p[a]) if p.get(a) is not None and p.get(b) is not None else None

        return {
            "start": _r(p["donation"]),
            "receipt": d("donation", "receipt"),
            "clone": d("receipt", "clone_end"),
            "catch_up": d("clone_end", "critical"),
            "critical": d("critical", "committing"),
            "commit": d("committing", "decided"),
        }

    def describe(self, m: dict, tl: dict | None = None) -> dict:
        pr = m["progress"]
        docs, nbytes, secs = pr.get("cloned", 0), pr.get("bytes", 0), m["seconds"]
        out = {
            "outcome": m["outcome"],
            "docs": docs,
            "bytes": nbytes,
            "mods": pr.get("mods"),
            "seconds": secs,
            "docs_s": round(docs / secs, 1),
            "mb_s": round(nbytes / MB / secs, 2),
            "critical_ms": pr.get("criticalMs"),
            "donor_seconds": pr.get("seconds"),
            "list_migrations_ms": m.get("list_migrations_ms"),
            "donor_orphans": m.get("orphans_left"),
        }
        if tl:
            ph = self.phases(tl)
            clone_ms = ph["clone"]
            out.update(
                timeline_ms=tl["points_ms"],
                phases_ms=ph,
                clone_batches=tl["clone_batches"],
                mods_batches=tl["mods_batches"],
                mods_batches_before_critical=tl["mods_batches_before_critical"],
                clone_docs_s=round(docs / clone_ms * 1000, 1) if clone_ms else None,
                clone_mb_s=round(nbytes / MB / clone_ms * 1000, 2) if clone_ms else None,
                clone_ms_per_batch=round(clone_ms / tl["clone_batches"], 1)
                if clone_ms and tl["clone_batches"]
                else None,
            )
        return out

    def print_migration(self, title: str, f: dict) -> None:
        print(
            f"  {title}: {f['outcome']}, {f['docs']:,} documents ({f['bytes'] / MB:.1f} MB) in {f['seconds']:.2f}s = "
            f"{f['docs_s']:,.0f} docs/s, {f['mb_s']:.2f} MB/s; mods {f['mods']}; critical section "
            f"{f['critical_ms']} ms",
            flush=True,
        )
        if "phases_ms" in f:
            total = f["seconds"] * 1000
            for name, ms in f["phases_ms"].items():
                if ms is not None:
                    print(f"      {PHASES[name]:40s} {ms:9.1f} ms  {ms / total * 100:5.1f} %")
            tl = f["timeline_ms"]
            print(
                f'      (RecordDecision answered at {tl["decided"]} ms; the bench saw "committed" at '
                f"{tl['committed_seen']} ms; ForgetMigration answered at {tl['forgotten']} ms)"
            )
            if f.get("clone_docs_s"):
                print(
                    f"      ListMigrations on the donor afterwards ({f['donor_orphans']:,} orphans in its range-deletion "
                    f"tasks): answered in {f['list_migrations_ms']:.0f} ms"
                )
                print(
                    f"      clone phase alone: {f['clone_docs_s']:,.0f} docs/s, {f['clone_mb_s']:.2f} MB/s "
                    f"({f['clone_batches']} TransferBatch(clone) requests, {f['clone_ms_per_batch']} ms each; "
                    f"{f['mods_batches']} TransferBatch(mods), {f['mods_batches_before_critical']} of them before the "
                    f"critical section)"
                )

    # ---------------------------------------------------------------- CPU

    def cpu_mark(self) -> dict:
        return {
            "procs": {n: p.cpu_seconds() for n, p in self.procs.items()},
            "client": time.process_time(),
            "broker": cpu_seconds(self.broker),
            "machine": machine_busy(),
            "wall": time.monotonic(),
        }

    def cpu_since(self, mark: dict) -> dict:
        now = self.cpu_mark()
        wall = now["wall"] - mark["wall"]
        out = {n: round((now["procs"][n] - mark["procs"][n]) / wall * 100, 1) for n in now["procs"]}
        out["client"] = round((now["client"] - mark["client"]) / wall * 100, 1)
        if self.broker:
            out["broker"] = round((now["broker"] - mark["broker"]) / wall * 100, 1)
        (b1, t1), (b0, t0) = now["machine"], mark["machine"]
        out["machine"] = round((b1 - b0) / max(1, t1 - t0) * 100 * os.cpu_count(), 1)
        return out

    # ---------------------------------------------------------------- memory

    def rss_reset(self) -> None:
        """Restart the peak-RSS count of every service (Linux: 5 > /proc/<pid>/clear_refs)."""
        for p in self.procs.values():
            try:
                Path(f"/proc/{p.proc.pid}/clear_refs").write_text("5")
            except OSError:
                pass

    def rss_peaks(self) -> dict[str, float]:
        """Each service's peak RSS (MB, VmHWM) since `rss_reset`."""
        out = {}
        for n, p in self.procs.items():
            try:
                status = Path(f"/proc/{p.proc.pid}/status").read_text()
                out[n] = round(int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) * 1024 / MB, 1)  # type: ignore[index]
            except (OSError, TypeError):
                pass
        return out

    def rss_now(self, name: str) -> float | None:
        try:
            status = Path(f"/proc/{self.procs[name].proc.pid}/status").read_text()
            return round(int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) * 1024 / MB, 1)  # type: ignore[index]
        except (OSError, TypeError, KeyError):
            return None

    async def rss_samples(self, names: tuple[str, ...], out: list[tuple[float, dict]], stop: asyncio.Event) -> None:
        """VmRSS of `names` every 0.25 s until `stop`: whether memory grows as more of the range has moved."""
        while not stop.is_set():
            out.append((time.monotonic(), {n: self.rss_now(n) for n in names}))
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except TimeoutError:
                pass

    @staticmethod
    def rss_quarters(samples: list[tuple[float, dict]], names: tuple[str, ...]) -> dict[str, list]:
        """Each name's highest VmRSS (MB) in each quarter of the sampled time."""
        if len(samples) < 4:
            return {}
        t0, t1 = samples[0][0], samples[-1][0]
        span = max(t1 - t0, 1e-9)
        out: dict[str, list] = {}
        for n in names:
            quarters: list[float | None] = [None] * 4
            for t, rss in samples:
                q, v = min(3, int(4 * (t - t0) / span)), rss.get(n)
                if v is not None:
                    quarters[q] = max(quarters[q] or 0.0, v)
            out[n] = quarters
        return out

    @staticmethod
    def print_rss(rss: dict[str, float], donor: str, recipient: str, quarters: dict | None = None) -> None:
        print(
            f"      peak RSS: donor {donor} {rss.get(donor, '?')} MB, recipient {recipient} {rss.get(recipient, '?')} MB"
        )
        if quarters:
            print(
                "      RSS by quarter of the move (MB, highest in each): "
                + "; ".join(f"{n} {' / '.join(str(v) for v in quarters[n])}" for n in (donor, recipient))
            )

    @staticmethod
    def print_cpu(cpu: dict, when: str = "") -> None:
        parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if k != "machine")
        print(f"      CPU{when} (% of one core): {parts}; machine {cpu['machine']:.0f} of {os.cpu_count() * 100}")

    # ---------------------------------------------------------------- parts

    async def part_idle(self) -> None:
        print(f"1. idle: [0, {self.n:,}) s0 -> s1", flush=True)
        self.rss_reset()
        names, samples, sampled = ("shard-s0", "shard-s1"), [], asyncio.Event()
        sampler = asyncio.create_task(self.rss_samples(names, samples, sampled))
        try:
            m = await self.migrate(0, self.n, "s1", label="idle", cpu_mark=self.cpu_mark())
        finally:
            sampled.set()
            await sampler
        rss = self.rss_peaks()
        cpu = m["cpu"]
        f = self.describe(m, await self.timeline(m))
        f["cpu_pct"] = cpu
        f["peak_rss_mb"] = rss
        f["rss_by_quarter_mb"] = quarters = self.rss_quarters(samples, names)
        self.figures["idle"] = f
        self.print_migration("idle", f)
        self.print_cpu(cpu)
        f["machine_cpu_per_mb_s"] = round(cpu["machine"] / max(f["mb_s"], 1e-9), 2)
        print(f"      machine CPU per MB/s moved: {f['machine_cpu_per_mb_s']:.2f} % of a core")
        self.print_rss(rss, *names, quarters)

    async def part_loaded(self, coll) -> None:
        a = self.args
        print(
            f"2. under YCSB-A load ({a.concurrency} client tasks, 50 % find_one / 50 % update_one by k over the "
            f"moving range): [0, {self.n:,}) s1 -> s2",
            flush=True,
        )
        load = YcsbLoad(coll, self.n, a)
        try:
            await asyncio.sleep(1.0)  # warm-up
            w0, cpu_before_mark = time.time(), self.cpu_mark()
            await asyncio.sleep(a.load_before)
            w1, cpu_before = time.time(), self.cpu_since(cpu_before_mark)
            self.rss_reset()
            m = await self.migrate(0, self.n, "s2", label="loaded", cpu_mark=self.cpu_mark())
            rss = self.rss_peaks()
            cpu = m["cpu"]
        finally:
            await load.stop()
        ops, errors, window = load.ops, load.errors, load.window

        before, during = window(w0, w1), window(m["t0"], m["t_end"])
        slow = sorted((o for o in ops if o[1] > 1000), key=lambda o: -o[1])
        f = self.describe(m, await self.timeline(m))
        tl = f.get("timeline_ms", {})
        if tl.get("receipt") is not None and tl.get("clone_end") is not None:
            # The clone alone (its throttle's doing), apart from the critical section's blocked writes.
            c0, c1 = m["t0"] + tl["receipt"] / 1000, m["t0"] + tl["clone_end"] / 1000
            if c1 > c0:
                f["client_during_clone"] = window(c0, c1)
        pr = m["progress"]
        if pr.get("criticalSince") and pr.get("criticalMs") is not None:
            c0, c1 = pr["criticalSince"], pr["criticalSince"] + pr["criticalMs"] / 1000
            over = [lat for t, lat, kind in ops if kind == "update" and t < c1 and t + lat / 1000 > c0]
            f["updates_overlapping_critical"] = lat_stats(over)
        f.update(
            client_before=before,
            cpu_pct_before=cpu_before,
            client_during=during,
            client_errors=errors,
            cpu_pct=cpu,
            peak_rss_mb=rss,
            concurrency=a.concurrency,
            filter=a.filter,
            ops_over_1s=[
                {"start_ms": _r((t - m["t0"]) * 1000), "latency_ms": _r(lat), "kind": kind}
                for t, lat, kind in slow[:10]
            ],
            ops_over_1s_count=len(slow),
        )
        self.figures["loaded"] = f
        self.print_migration("loaded", f)
        print(
            f"      client: before the move {before['ops_s']:,.0f} ops/s (p50 {before['p50_ms']} ms, p99 "
            f"{before['p99_ms']} ms); during it {during['ops_s']:,.0f} ops/s (p50 {during['p50_ms']} ms, p99 "
            f"{during['p99_ms']} ms, max {during['max_ms']} ms); errors {errors or 'none'}"
        )
        if "client_during_clone" in f:
            dc = f["client_during_clone"]
            print(
                f"      client during the clone phase alone: {dc['ops_s']:,.0f} ops/s (p50 {dc['p50_ms']} ms, "
                f"p99 {dc['p99_ms']} ms): {(dc['ops_s'] / before['ops_s'] - 1) * 100 if before['ops_s'] else 0:+.0f} %"
                " against before the move"
            )
        if "updates_overlapping_critical" in f:
            o = f["updates_overlapping_critical"]
            print(
                f"      updates overlapping the critical section: {o['n']}, p50 {o['p50_ms']} ms, max {o['max_ms']} ms"
            )
        if slow:
            print(
                f"      {len(slow)} operations took over 1 s; the slowest (start after MoveRange, latency): "
                + ", ".join(
                    f"{o['kind']} +{o['start_ms']:.0f} ms: {o['latency_ms']:.0f} ms" for o in f["ops_over_1s"][:5]
                )
            )
        self.print_cpu(cpu_before, " before the move")
        self.print_cpu(cpu, " during the move")
        self.print_rss(rss, "shard-s1", "shard-s2")

    async def part_raw_beside_load(self, coll) -> None:
        """The loaded move's floor: what the same clients lose to the raw path with changelog alone
        (no shardlog code moves anything), one THROTTLED_BATCH_BYTES record in flight."""
        a = self.args
        size = donor_mod.THROTTLED_BATCH_BYTES
        print(
            f"5. the raw path with changelog (one {size // 1024} KB record in flight, as the throttled clone) for "
            f"{a.raw_beside_seconds:g}s beside the same YCSB-A clients ({a.concurrency} tasks over [0, {self.n:,}))",
            flush=True,
        )
        transfer, acks, changelog = (f"{self.cluster}.raw.{t}" for t in ("transfer", "acks", "changelog"))
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        sink = ctx.Process(
            target=raw_sink,
            args=(self.bootstrap, transfer, acks, changelog, str(self.tmp / "raw-beside"), 1 << 62, q),
            daemon=True,
            name="raw sink",
        )
        source = ctx.Process(
            target=raw_clone_source,
            args=(self.bootstrap, transfer, acks, self.n, size, a.raw_beside_seconds, a.seed, q),
            daemon=True,
            name="raw source",
        )
        load = YcsbLoad(coll, self.n, a)
        try:
            sink.start()
            assert (await child_report(q, sink, 60))[0] == "ready"
            await asyncio.sleep(1.0)  # warm-up
            w0, mark = time.time(), self.cpu_mark()
            await asyncio.sleep(a.load_before)
            w1, cpu_before = time.time(), self.cpu_since(mark)
            mark = self.cpu_mark()
            source.start()
            _, t0, t1, docs, nbytes = await child_report(q, source, a.raw_beside_seconds + 60)
            cpu = self.cpu_since(mark)
        finally:
            await load.stop()
            for proc in (source, sink):
                if proc.is_alive():
                    proc.kill()
                proc.join(10)
        before, during = load.window(w0, w1), load.window(t0, t1)
        mb_s = nbytes / MB / (t1 - t0)
        drop = during["ops_s"] / before["ops_s"] - 1 if before["ops_s"] else 0.0
        f = {
            "docs": docs,
            "bytes": nbytes,
            "seconds": round(t1 - t0, 3),
            "mb_s": round(mb_s, 2),
            "record_bytes": size,
            "client_before": before,
            "client_during": during,
            "client_errors": load.errors,
            "client_change_pct": round(drop * 100, 1),
            "client_change_pct_per_mb_s": round(drop * 100 / mb_s, 2) if mb_s else None,
            "cpu_pct_before": cpu_before,
            "cpu_pct": cpu,
        }
        self.figures["raw_beside_load"] = f
        print(
            f"  raw beside the clients: {mb_s:.2f} MB/s ({docs:,} documents); clients {before['ops_s']:,.0f} -> "
            f"{during['ops_s']:,.0f} ops/s ({drop * 100:+.0f} %, {f['client_change_pct_per_mb_s']:+.2f} % per MB/s; "
            f"p50 {before['p50_ms']} -> {during['p50_ms']} ms); errors {load.errors or 'none'}",
            flush=True,
        )
        self.print_cpu(cpu_before, " before")
        self.print_cpu(cpu, " beside the raw path")

    async def part_raw(self) -> None:
        print(
            f"3. raw data path for the same {self.n:,} documents: rocksdict -> Kafka (~2 MB records) -> "
            f"rocksdict (sink in a child process)",
            flush=True,
        )
        base = doc_key(NS, b"", b"")
        lo, hi = base + encode_value(0), base + encode_value(self.n)
        out = {}
        acks, changelog = f"{self.cluster}.raw.acks", f"{self.cluster}.raw.changelog"
        modes = [("stream", None, None), ("one_in_flight", acks, None)]
        if self.args.raw_changelog:
            modes.append(("one_in_flight+changelog", acks, changelog))
        for mode, ack, chl in modes:
            mark = self.cpu_mark()
            r = await raw_path(
                self.bootstrap,
                self.src,
                lo,
                hi,
                self.n,
                f"{self.cluster}.raw.transfer",
                ack,
                chl,
                self.tmp / f"raw-dest-{mode}",
            )
            # The whole machine's CPU (the sink is a child process), per MB/s: what moving costs here.
            r["machine_cpu_pct"] = machine = self.cpu_since(mark)["machine"]
            out[mode] = r
            print(
                f"  raw ({mode}): {r['docs']:,} documents ({r['bytes'] / MB:.1f} MB, {r['batches']} records) in "
                f"{r['seconds']:.2f}s = {r['docs_s']:,.0f} docs/s, {r['mb_s']:.2f} MB/s, {r['ms_per_batch']} ms per "
                f"record (source done reading + producing after {r['source_seconds']:.2f}s); machine CPU "
                f"{machine:.0f} of {os.cpu_count() * 100}, {machine / max(r['mb_s'], 1e-9):.2f} % of a core per MB/s",
                flush=True,
            )
        self.figures["raw"] = out

    async def part_critical(self, coll) -> None:
        a = self.args
        lo, hi = self.n, self.n + self.r
        print(
            f"4. critical section: [{lo:,}, {hi:,}) ({self.r:,} documents) moved s0 <-> s1 {a.moves} times under "
            f"{a.writers} update_one loops on that range",
            flush=True,
        )
        writes: list[tuple[float, float]] = []  # (start unix, latency ms)
        errors: dict[str, int] = {}
        stop = asyncio.Event()

        async def writer(i: int):
            rng = random.Random(a.seed * 7919 + i)
            n = 0
            while not stop.is_set():
                k = rng.randrange(lo, hi)
                t, t0 = time.time(), time.perf_counter()
                try:
                    await coll.update_one(key_filter(k, a.filter), {"$set": {"w": n}})
                    writes.append((t, (time.perf_counter() - t0) * 1000))
                except Exception as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                n += 1

        tasks = [asyncio.create_task(writer(i)) for i in range(a.writers)]
        moves, deletions = [], []
        t_start = time.time()
        try:
            await asyncio.sleep(1.0)
            here = "s0"
            for i in range(a.moves):
                to = "s1" if here == "s0" else "s0"
                m = await self.migrate(lo, hi, to, label=f"move {i + 1}")
                tl = await self.timeline(m)
                f = self.describe(m, tl)
                moves.append(f | {"critical_since": m["progress"].get("criticalSince"), "donor": here, "to": to})
                if m["outcome"] == "committed":
                    deleted, dsecs = await self.delete_orphans(here, m["id"])
                    deletions.append(dsecs * 1000)
                    here = to
                print(
                    f"    move {i + 1:2d} {m['donor']} -> {to}: {m['outcome']} in {m['seconds'] * 1000:6.0f} ms, "
                    f"critical section {f['critical_ms']} ms, mods {f['mods']}"
                    + (f"; orphans deleted in {deletions[-1]:.0f} ms" if m["outcome"] == "committed" else ""),
                    flush=True,
                )
                await asyncio.sleep(a.pause)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        t_stop = time.time()
        windows = [
            (f["critical_since"], f["critical_since"] + f["critical_ms"] / 1000)
            for f in moves
            if f.get("critical_since") and f.get("critical_ms") is not None
        ]
        over, other, slow = [], [], []
        for t, lat in writes:
            (over if any(t < w1 and t + lat / 1000 > w0 for w0, w1 in windows) else other).append(lat)
            if lat > 1000:  # where it started, relative to the closest critical section
                w0, w1 = min(windows, key=lambda w: abs(t - w[0]), default=(t, t))
                slow.append(
                    {
                        "latency_ms": _r(lat),
                        "start_vs_critical_ms": _r((t - w0) * 1000),
                        "critical_ms": _r((w1 - w0) * 1000),
                    }
                )
        slow.sort(key=lambda x: -x["latency_ms"])
        crit = [f["critical_ms"] for f in moves if f.get("critical_ms") is not None]
        secs = [f["seconds"] * 1000 for f in moves]
        phase_names = list(moves[0]["phases_ms"]) if moves else []
        phase_p50 = {
            k: _r(pct([f["phases_ms"][k] for f in moves if f["phases_ms"][k] is not None], 50)) for k in phase_names
        }
        fig = {
            "moves": len(moves),
            "committed": sum(f["outcome"] == "committed" for f in moves),
            "range_docs": self.r,
            "writers": a.writers,
            "critical_ms": {"p50": _r(pct(crit, 50)), "p99": _r(pct(crit, 99)), "max": _r(max(crit, default=None))},
            "migration_ms": {"p50": _r(pct(secs, 50)), "p99": _r(pct(secs, 99))},
            "phases_p50_ms": phase_p50,
            "orphan_delete_ms_p50": _r(pct(deletions, 50)),
            "writes_overlapping": lat_stats(over),
            "writes_other": lat_stats(other),
            "writes_s": round(len(writes) / (t_stop - t_start), 1),
            "write_errors": errors,
            "filter": a.filter,
            "writes_over_1s_count": len(slow),
            "writes_over_1s": slow[:10],
            "per_move": [{k: f[k] for k in ("outcome", "seconds", "critical_ms", "mods", "docs")} for f in moves],
        }
        o, n = fig["writes_overlapping"], fig["writes_other"]
        if o["n"] and n["n"]:
            fig["added_ms"] = {"p50": _r(o["p50_ms"] - n["p50_ms"]), "p99": _r(o["p99_ms"] - n["p99_ms"])}
        self.figures["critical"] = fig
        print(
            f"  critical section over {len(crit)} moves: p50 {fig['critical_ms']['p50']} ms, p99 "
            f"{fig['critical_ms']['p99']} ms, max {fig['critical_ms']['max']} ms; whole move p50 "
            f"{fig['migration_ms']['p50']} ms"
        )
        print("  phases, p50 over the moves (ms): " + ", ".join(f"{k} {v}" for k, v in phase_p50.items()))
        print(
            f"  writes ({fig['writes_s']:,.0f}/s, errors {errors or 'none'}):  {'n':>6s} {'p50 ms':>8s} "
            f"{'p99 ms':>8s} {'max ms':>8s}"
        )
        for name, st in (("overlapping a critical section", o), ("all other writes", n)):
            print(f"    {name:33s} {st['n']:6d} {fmt_ms(st['p50_ms'])}  {fmt_ms(st['p99_ms'])}  {fmt_ms(st['max_ms'])}")
        if slow:
            print(
                f"    {len(slow)} writes took over 1 s; the slowest (start relative to the closest critical section "
                f"start, its length): "
                + ", ".join(
                    f"{w['latency_ms']:.0f} ms (at {w['start_vs_critical_ms']:+.0f} ms, {w['critical_ms']:.0f} ms)"
                    for w in slow[:5]
                )
            )
        if "added_ms" in fig:
            print(
                f"    added by the critical section: p50 +{fig['added_ms']['p50']} ms, p99 +{fig['added_ms']['p99']} ms "
                f"(aim: writes blocked well under 200 ms at p99)",
                flush=True,
            )

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        a = self.args
        print(
            f"migration benchmark: cluster {self.cluster}; big range {self.n:,} documents, small range {self.r:,} "
            f"documents moved {a.moves} times; YCSB-A concurrency {a.concurrency}, {a.writers} writers",
            flush=True,
        )
        await self.create_topics()
        async with Requester(self.bootstrap, self.t.cli_replies, client_id="bench-migration") as self.req:
            await self.start()
            async with AsyncCluster(self.bootstrap, self.cluster, timeout=60, attempt_timeout=a.attempt_timeout) as c:
                coll = c[DB][COLL]
                await self.load(coll)
                if a.moves and 4 in a.parts:
                    await self.part_critical(coll)
                if 3 in a.parts:
                    await self.part_raw()
                if 1 in a.parts:
                    await self.part_idle()
                if 2 in a.parts:
                    await self.part_loaded(coll)
                if 5 in a.parts:
                    await self.part_raw_beside_load(coll)

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


def summary(b: Bench, wall: float) -> None:
    f = b.figures
    raws = f.get("raw", {})
    print(f"summary ({wall:.0f}s wall):")
    print(f"  {'':34s} {'docs/s':>9s} {'MB/s':>7s} {'critical ms':>12s}   ratio to raw " + " / ".join(raws))
    for name, key in (("1. idle move", "idle"), ("2. move under YCSB-A", "loaded")):
        m = f.get(key)
        if not m:
            continue
        m["ratio_to_raw"] = {mode: round(m["docs_s"] / r["docs_s"], 3) for mode, r in raws.items()}
        print(
            f"  {name:34s} {m['docs_s']:9,.0f} {m['mb_s']:7.2f} {m['critical_ms']!s:>12s}   "
            + " / ".join(f"{v:.3f}" for v in m["ratio_to_raw"].values())
        )
    for mode, r in raws.items():
        print(f"  {'3. raw, ' + mode:34s} {r['docs_s']:9,.0f} {r['mb_s']:7.2f}")
    if "loaded" in f:
        lo = f["loaded"]
        print(
            f"  client ops/s during the loaded move: {lo['client_during']['ops_s']:,.0f} (before it: "
            f"{lo['client_before']['ops_s']:,.0f}); p99 {lo['client_during']['p99_ms']} ms "
            f"(before: {lo['client_before']['p99_ms']} ms)"
        )
    if "raw_beside_load" in f:
        r = f["raw_beside_load"]
        line = (
            f"  5. raw path with changelog beside the clients: {r['mb_s']:.2f} MB/s, clients "
            f"{r['client_change_pct']:+.0f} % ({r['client_change_pct_per_mb_s']:+.2f} % per MB/s)"
        )
        dc = f.get("loaded", {}).get("client_during_clone")
        if dc and f["loaded"].get("clone_mb_s"):
            before = f["loaded"]["client_before"]["ops_s"]
            pct = (dc["ops_s"] / before - 1) * 100 if before else 0.0
            line += (
                f"; the loaded move's clone: {f['loaded']['clone_mb_s']:.2f} MB/s, clients {pct:+.0f} % "
                f"({pct / f['loaded']['clone_mb_s']:+.2f} % per MB/s)"
            )
        print(line)
    if "critical" in f:
        c = f["critical"]
        print(
            f"  4. critical section ({c['moves']} moves of {c['range_docs']:,} docs): p50 {c['critical_ms']['p50']} ms, "
            f"p99 {c['critical_ms']['p99']} ms; writes overlapping it p50/p99 {c['writes_overlapping']['p50_ms']} / "
            f"{c['writes_overlapping']['p99_ms']} ms vs others {c['writes_other']['p50_ms']} / "
            f"{c['writes_other']['p99_ms']} ms"
        )
    if b.problems:
        print(f"  PROBLEMS ({len(b.problems)}):")
        for p in b.problems:
            print("   " + p)


def _setting(text: str) -> tuple[str, object]:
    key, eq, value = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=JSON")
    return key, json.loads(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--docs",
        type=int,
        default=50_000,
        help="documents in the big range (default 50,000: 100,000 takes ~5 min here, mostly the loaded move)",
    )
    p.add_argument(
        "--range-docs", type=int, default=1000, help="documents in the small range of part 4 (default 1,000)"
    )
    p.add_argument("--moves", type=int, default=20, help="moves of the small range (default 20; 0 skips part 4)")
    p.add_argument("--writers", type=int, default=4, help="update_one loops on the small range (default 4)")
    p.add_argument("--concurrency", type=int, default=16, help="YCSB-A client tasks in part 2 (default 16)")
    p.add_argument(
        "--load-before", type=float, default=5.0, help="seconds of YCSB-A measured before the move (default 5)"
    )
    p.add_argument(
        "--pause", type=float, default=0.5, help="seconds between two moves of the small range (default 0.5)"
    )
    p.add_argument("--batch", type=int, default=500, help="insert_many batch size while loading (default 500)")
    p.add_argument("--load-concurrency", type=int, default=8, help="insert_many batches in flight (default 8)")
    p.add_argument("--delete-batch", type=int, default=5000, help="DeleteRangeBatch limit (default 5,000)")
    p.add_argument(
        "--filter",
        choices=("id", "key"),
        default="id",
        help="load tasks address a document by {_id: k, k: k} (default) or by {k: k} alone",
    )
    p.add_argument(
        "--raw-changelog",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run raw (c): one batch in flight + every document produced to a changelog topic in "
        "a transaction per batch, as the recipient shard does (default on)",
    )
    p.add_argument(
        "--attempt-timeout",
        type=float,
        default=10.0,
        help="the client's per-attempt timeout before it resends (AsyncCluster's default 10 s)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=_setting,
        metavar="KEY=JSON",
        help="a cluster setting before the moves, e.g. migrationThrottleUnderLoad=false; repeatable",
    )
    p.add_argument(
        "--profile-service",
        action="append",
        default=[],
        metavar="NAME",
        help="run a service under cProfile (shard-s0, shard-s1, router-r1, config); repeatable",
    )
    p.add_argument(
        "--raw-beside-seconds",
        type=float,
        default=8.0,
        help="part 5: seconds the raw path with changelog runs beside the YCSB-A clients (default 8)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, stores)")
    p.add_argument(
        "--parts",
        default="1,2,3,4,5",
        help="which parts to run (default 1,2,3,4,5; they run in the order "
        "4, 3, 1, 2, 5; part 2 moves the range part 1 moved, from s1)",
    )
    args = p.parse_args()
    args.parts = {int(x) for x in args.parts.split(",")}
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-migration-"))
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
        for name, pr in bench.procs.items():
            if pr.profile_to and pr.profile_to.exists():
                print_profile(f"{name} process, whole life", pstats.Stats(str(pr.profile_to)))
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    summary(bench, time.monotonic() - t0)
    E.result_line(
        "migration",
        docs=args.docs,
        range_docs=args.range_docs,
        moves=args.moves,
        writers=args.writers,
        concurrency=args.concurrency,
        shards=len(SHARDS),
        problems=bench.problems,
        **bench.figures,
    )


if __name__ == "__main__":
    main()
