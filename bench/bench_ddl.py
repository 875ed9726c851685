"""dropCollection of a big sharded collection: DropCollection sent -> every shard's documents gone.

Every service is its own process, as in bench_e2e.py: `python -m services.config`,
`services.shard --shard-id s0|s1|s2` and `services.router --instance r1`, on the broker of
$KAFKA_BOOTSTRAP, under a fresh cluster name.  The client is this process
(`libs.client.AsyncCluster` for documents, a `Requester` on config.commands for the DDL).

1. load:     `ddl.big` sharded on {_id: "hashed"} (`--chunks` initial chunks, a third on each
             shard), N documents `{_id: i, pad: <--doc-bytes / 2 random bytes, hex>}` inserted
             with unordered insert_many (`--batch` per call, `--load-concurrency` in flight).
             `ddl.side` (same database, hashed too) gets `--side-docs` documents.  Each shard's
             store is then opened read-only and its `d/ddl.big\\0` and `i/ddl.big\\0` keys counted.
2. workload: open loop on `ddl.side` at `--rate` operations/s, alternately insert_one of a new
             document and find_one by a random existing _id (each operation its own task, so a
             slow one does not slow the pace), `--before` seconds measured before the drop, during
             it, and `--after` seconds after it.
3. drop:     DropCollection(ddl.big) on config.commands, then GetDDL(id) every `--poll` seconds
             until its state is "done" (ok): that is the measured time.  The coordinator answers
             "done" after every shard has answered DropLocalData, and a shard answers after its
             LocalDataDropped is committed to its store (the two range deletions in the batch's
             WriteBatch).  The phases are the GetDDL polls' changes; each shard's
             DropLocalData request -> reply comes from the Kafka timestamps of the request on
             `shard.<id>.requests` and of its reply on the coordinator's inbox.  Then: each
             shard's store opened read-only holds no key of `ddl.big` (counted), the router
             counts 0 documents in it, and `ddl.side` holds what was written to it.
4. raw:      a rocksdict store (the shard's `Options(raw_mode=True)`) with the same N documents
             under the same keys and values as the shards hold them (d/<ns>\\0<hashed key><_id> ->
             the document, i/<ns>\\0<_id> -> its shard key), then (a) one WriteBatch with a
             delete_range per prefix (what LocalDataDropped does), and (b) on a second such store,
             every key found by an iterator and deleted in WriteBatches of `--delete-batch`.
             Each timed from the start to the last write returned; each store then checked empty.
             ratio = the drop's time / raw time.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_ddl.py [--docs 1000000] [--rate 100] [--json]

Ends with one JSON line, as the other benchmarks (`--json`: the only line on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _events as E
from aiokafka import TopicPartition
from bench_e2e import Proc, broker_pid, cpu_seconds, machine_busy, wait_group, wait_ready
from bench_migration import lat_stats, pct
from rocksdict import AccessType, Options, Rdict, WriteBatch

from domain.shardkey import KeyPattern, encode_value
from libs import kafka
from libs.client import AsyncCluster
from libs.commands import CORRELATION_ID
from libs.kafka import delete_cluster_topics
from libs.requests import Requester
from libs.topics import Topics
from schemas import config as cfg
from schemas import ddl as dd
from services.shard.documents import DOCS, IDS, doc_key, dropped_ranges, encode_doc, id_key, ns_prefix

ROOT = E.ROOT
SHARDS = ("s0", "s1", "s2")
DB = "ddl"
BIG, SIDE = f"{DB}.big", f"{DB}.side"
HASHED = KeyPattern.parse({"_id": "hashed"})
PADS = 64  # distinct random paddings, rotated: RocksDB and Kafka cannot shrink the documents
REQUEST_TYPE = re.compile(rb'^\{"type":"(\w+)"')


def _r(x, nd: int = 1):
    return None if x is None else round(x, nd)


# ---------------------------------------------------------------- documents


class Docs:
    """Document i, the same bytes every time it is asked for (the shards' and the raw stores')."""

    def __init__(self, doc_bytes: int, seed: int):
        rng = random.Random(seed)
        self.pads = [rng.randbytes(max(1, doc_bytes // 2)).hex() for _ in range(PADS)]

    def doc(self, i: int) -> dict:
        return {"_id": i, "pad": self.pads[i % PADS][i % 7 :] + self.pads[(i + 1) % PADS][: i % 7]}

    def store_pairs(self, i: int) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
        """(d/ key, document), (i/ key, shard key): as a shard lays document i out."""
        d = self.doc(i)
        skey, id_enc = HASHED.encode_doc(d), encode_value(d["_id"])
        return (doc_key(BIG, skey, id_enc), encode_doc(d)), (id_key(BIG, id_enc), skey)


def count_prefix(db: Rdict, prefix: bytes) -> tuple[int, int]:
    """(keys, value bytes) under `prefix`."""
    it = db.iter()
    it.seek(prefix)
    n = size = 0
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            break
        n += 1
        size += len(it.value())
        it.next()
    return n, size


def count_ns(path: Path, ns: str) -> dict:
    """A live shard's documents of `ns`: its store opened read-only (RocksDB takes no lock for that;
    the WAL is replayed, so what the shard committed is seen)."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        docs, doc_bytes = count_prefix(db, DOCS + ns_prefix(ns))
        ids, _ = count_prefix(db, IDS + ns_prefix(ns))
    finally:
        db.close()
    return {"docs": docs, "ids": ids, "doc_bytes": doc_bytes}


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
        self.docs = Docs(args.doc_bytes, args.seed)
        self.figures: dict = {}
        self.problems: list[str] = []

    def problem(self, msg: str) -> None:
        print("  PROBLEM " + msg, flush=True)
        self.problems.append(msg)

    def service(self, name: str, module: str, *argv: str) -> Proc:
        p = Proc(name, ["-m", module, *argv], self.env, self.logs, self.data / f"{name}.ready")
        self.procs[name] = p
        return p

    def store_of(self, shard: str) -> Path:
        return self.data / f"shard-{shard}" / "documents"

    async def command(self, cmd, timeout: float = 60) -> dict:
        reply = await self.req.request(self.t.config_commands, cmd, timeout=timeout)
        if not reply.ok:
            raise SystemExit(f"{cmd.type} refused: {reply.code}: {reply.error}")
        return reply.result or {}

    # ---------------------------------------------------------------- setup

    async def start(self) -> None:
        t0 = time.monotonic()
        config = self.service("config", "services.config")
        await wait_ready([config], lambda p: "active")
        for sid in SHARDS:
            await self.command(cfg.AddShard(shard=sid))
        res = await self.command(cfg.ShardCollection(ns=BIG, key={"_id": "hashed"}, numInitialChunks=self.args.chunks))
        await self.command(cfg.ShardCollection(ns=SIDE, key={"_id": "hashed"}, numInitialChunks=len(SHARDS)))
        shards = [self.service(f"shard-{sid}", "services.shard", "--shard-id", sid) for sid in SHARDS]
        router = self.service("router-r1", "services.router", "--instance", "r1")
        await wait_ready([*shards, router], lambda p: "active" if p.name.startswith("shard") else None)
        await wait_group(self.bootstrap, f"{self.cluster}.router", 1)
        print(
            f"  config, {len(SHARDS)} shards, router r1 up in {time.monotonic() - t0:.1f}s; {BIG} sharded on "
            f'{{_id: "hashed"}} in {res.get("chunks", self.args.chunks)} chunks, {SIDE} in {len(SHARDS)}',
            flush=True,
        )

    async def load(self, big, side) -> None:
        a = self.args
        n = a.docs
        lats: list[float] = []
        done = 0
        next_report = n // 10
        starts = iter(range(0, n, a.batch))
        t0 = time.monotonic()

        async def worker():
            nonlocal done, next_report
            while (lo := next(starts, None)) is not None:
                batch = [self.docs.doc(i) for i in range(lo, min(n, lo + a.batch))]
                t = time.perf_counter()
                await big.insert_many(batch, ordered=False)
                lats.append((time.perf_counter() - t) * 1000)
                done += len(batch)
                if done >= next_report:
                    next_report += n // 10
                    el = time.monotonic() - t0
                    print(f"    loaded {done:,}/{n:,} ({done / el:,.0f} docs/s)", flush=True)

        await asyncio.gather(*(worker() for _ in range(a.load_concurrency)))
        secs = time.monotonic() - t0
        await side.insert_many([{"_id": f"s{i}", "v": i} for i in range(a.side_docs)], ordered=False)
        per_shard = {sid: count_ns(self.store_of(sid), BIG) for sid in SHARDS}
        stored = sum(c["docs"] for c in per_shard.values())
        self.figures["load"] = {
            "docs": n,
            "seconds": round(secs, 1),
            "docs_s": round(n / secs, 1),
            "batch": a.batch,
            "concurrency": a.load_concurrency,
            "batch_latency": lat_stats(lats),
            "per_shard": per_shard,
            "stored_bytes": sum(c["doc_bytes"] for c in per_shard.values()),
        }
        print(
            f"  load (context): {n:,} documents in {secs:.1f}s = {n / secs:,.0f} docs/s (insert_many of {a.batch}, "
            f"{a.load_concurrency} in flight: p50 {pct(lats, 50):.0f} ms, p99 {pct(lats, 99):.0f} ms)",
            flush=True,
        )
        print(
            "  held by the shards: "
            + ", ".join(f"{sid} {c['docs']:,} ({c['doc_bytes'] / 1e6:.0f} MB)" for sid, c in per_shard.items())
            + f"; {a.side_docs:,} documents in {SIDE}",
            flush=True,
        )
        if stored != n or any(c["ids"] != c["docs"] for c in per_shard.values()):
            self.problem(f"the shards hold {stored:,} documents of {BIG} (ids {per_shard}), not {n:,}")

    # ------------------------------------------------------------- workload

    async def workload(self, side, stop: asyncio.Event, ops: list, errors: dict) -> None:
        """Open loop: one operation every 1/rate s, each its own task; alternately an insert_one of a
        new document and a find_one by a random _id known to exist."""
        rng = random.Random(self.args.seed)
        known = [f"s{i}" for i in range(self.args.side_docs)]
        tasks: set[asyncio.Task] = set()

        async def op(kind: str, arg) -> None:
            t, t0 = time.time(), time.perf_counter()
            try:
                if kind == "insert":
                    await side.insert_one({"_id": arg, "v": 0})
                    known.append(arg)
                else:
                    if await side.find_one({"_id": arg}) is None:
                        raise LookupError(f"{arg} not found")
                ops.append((t, (time.perf_counter() - t0) * 1000, kind))
            except Exception as e:  # measured, not raised
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

        period, i = 1 / self.args.rate, 0
        t_next = time.perf_counter()
        while not stop.is_set():
            kind = "insert" if i % 2 == 0 else "find"
            task = asyncio.create_task(op(kind, f"w{i}" if kind == "insert" else rng.choice(known)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            t_next += period
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ drop

    async def drop(self) -> dict:
        """DropCollection, then GetDDL until done; the phases as the polls saw them."""
        t0_unix, t0 = time.time(), time.perf_counter()
        res = await self.command(dd.DropCollection(ns=BIG))
        t_reply = time.perf_counter()
        if not res.get("started"):
            raise SystemExit(f"DropCollection started nothing: {res}")
        ddl_id = res["id"]
        phases: list[tuple[str, float]] = []
        polls = 0
        while True:
            st = await self.command(dd.GetDDL(id=ddl_id), timeout=30)
            polls += 1
            now = (time.perf_counter() - t0) * 1000
            phase = "done" if st.get("state") == "done" else st.get("phase", "?")
            if not phases or phases[-1][0] != phase:
                phases.append((phase, now))
            if st.get("state") == "done":
                break
            if st.get("state") == "unknown":
                raise SystemExit(f"GetDDL({ddl_id}): {st}")
            await asyncio.sleep(self.args.poll)
        secs = time.perf_counter() - t0
        if not st.get("ok"):
            self.problem(f"the drop ended not ok: {st}")
        return {
            "id": ddl_id,
            "seconds": round(secs, 3),
            "t0": t0_unix,
            "t_end": t0_unix + secs,
            "reply_ms": _r((t_reply - t0) * 1000),
            "phases_seen_ms": [(p, _r(ms)) for p, ms in phases],
            "polls": polls,
            "result": st.get("result"),
            "ok": st.get("ok"),
        }

    async def shard_timeline(self, ddl_id: str, t0_unix: float) -> dict:
        """Per shard, each request of the coordinator (ms after DropCollection was sent) and its
        reply, from the Kafka timestamps of the request topics and of the coordinator's inbox."""
        since = int(t0_unix * 1000) - 1000
        key = ddl_id.encode()
        sent: dict[str, list[tuple[str, float, bytes]]] = {sid: [] for sid in SHARDS}
        replied: dict[bytes, float] = {}

        async def read(topic: str, on_record) -> None:
            c = kafka.consumer(self.bootstrap, client_id="bench-timeline")
            await c.start()
            try:
                tp = TopicPartition(topic, 0)
                c.assign([tp])
                at = (await c.offsets_for_times({tp: since}))[tp]
                c.seek(tp, at.offset if at is not None else (await c.end_offsets([tp]))[tp])

                async def on_batch(records):
                    for rec in records:
                        on_record(rec)

                await kafka.catch_up(c, tp, on_batch)
            finally:
                await c.stop()

        for sid in SHARDS:

            def on_request(rec, sid=sid):
                head = rec.value[:400]
                if key in head and (m := REQUEST_TYPE.match(head)):
                    corr = dict(rec.headers or []).get(CORRELATION_ID, b"")
                    sent[sid].append((m[1].decode(), rec.timestamp - t0_unix * 1000, corr))

            await read(self.t.shard_requests(sid), on_request)

        def on_reply(rec):
            corr = dict(rec.headers or []).get(CORRELATION_ID)
            if corr is not None and corr not in replied:
                replied[corr] = rec.timestamp - t0_unix * 1000

        await read(self.t.ddl_inbox, on_reply)
        return {
            sid: [{"request": kind, "sent_ms": _r(t), "replied_ms": _r(replied.get(corr))} for kind, t, corr in reqs]
            for sid, reqs in sent.items()
        }

    async def part_drop(self, cluster: AsyncCluster) -> None:
        a = self.args
        side, big = cluster[DB]["side"], cluster[DB]["big"]
        print(
            f"2-3. {SIDE}: insert_one / find_one by _id at {a.rate:g} ops/s; {a.before:g}s measured, then "
            f"DropCollection({BIG}), then {a.after:g}s more",
            flush=True,
        )
        ops: list[tuple[float, float, str]] = []
        errors: dict[str, int] = {}
        stop = asyncio.Event()
        load = asyncio.create_task(self.workload(side, stop, ops, errors))
        try:
            await asyncio.sleep(a.warmup)
            w0 = time.time()
            await asyncio.sleep(a.before)
            cpu0 = self.cpu_mark()
            d = await self.drop()
            cpu = self.cpu_since(cpu0)
            await asyncio.sleep(a.after)
            w3 = time.time()
        finally:
            stop.set()
            await load
        timeline = await self.shard_timeline(d["id"], d["t0"])

        # verification: nothing of ddl.big on any shard, through the stores and the router
        left = {sid: count_ns(self.store_of(sid), BIG) for sid in SHARDS}
        router_count = await big.count_documents({})
        side_count = await side.count_documents({})
        inserted = sum(1 for _, _, k in ops if k == "insert")
        expected_side = a.side_docs + inserted
        if any(c["docs"] or c["ids"] for c in left.values()) or router_count:
            self.problem(f"after the drop the shards hold {left}; the router counts {router_count}")
        if side_count < expected_side:
            self.problem(f"{SIDE} holds {side_count:,} documents, expected at least {expected_side:,}")

        def window(lo, hi, kind=None):
            sel = [lat for t, lat, k in ops if lo <= t < hi and (kind is None or k == kind)]
            return {"ops": len(sel), "ops_s": round(len(sel) / max(hi - lo, 1e-9), 1), **lat_stats(sel)}

        before, during, after = window(w0, d["t0"]), window(d["t0"], d["t_end"]), window(d["t_end"], w3)
        by_kind = {
            k: {"before": window(w0, d["t0"], k), "during": window(d["t0"], d["t_end"], k)} for k in ("insert", "find")
        }
        drops = {
            sid: next((r for r in reqs if r["request"] == "DropLocalData"), None) for sid, reqs in timeline.items()
        }
        last_drop = max((r["replied_ms"] for r in drops.values() if r and r["replied_ms"] is not None), default=None)
        self.figures["drop"] = {
            **{k: d[k] for k in ("id", "seconds", "reply_ms", "phases_seen_ms", "polls", "result", "ok")},
            "last_shard_dropped_ms": last_drop,
            "shard_requests": timeline,
            "left_on_shards": left,
            "router_count_after": router_count,
            "cpu_pct": cpu,
        }
        self.figures["workload"] = {
            "rate": a.rate,
            "before": before,
            "during": during,
            "after": after,
            "by_kind": by_kind,
            "errors": errors,
            "side_count": side_count,
            "p50_ratio": _r(during["p50_ms"] / before["p50_ms"], 2) if during["n"] and before["n"] else None,
            "p99_ratio": _r(during["p99_ms"] / before["p99_ms"], 2) if during["n"] and before["n"] else None,
        }
        print(
            f"  drop: DropCollection -> GetDDL done in {d['seconds'] * 1000:,.0f} ms (reply to DropCollection "
            f"{d['reply_ms']} ms; {d['polls']} polls every {a.poll * 1000:.0f} ms); ok {d['ok']}",
            flush=True,
        )
        print(
            "      phases as polled (ms after DropCollection): "
            + ", ".join(f"{p} {ms}" for p, ms in d["phases_seen_ms"])
        )
        for sid, reqs in timeline.items():
            print(f"      {sid}: " + ", ".join(f"{r['request']} {r['sent_ms']} -> {r['replied_ms']} ms" for r in reqs))
        print(
            f"      every shard's documents deleted (last DropLocalData answered) {last_drop} ms after DropCollection; "
            f"left afterwards: "
            + ", ".join(f"{sid} {c['docs']} docs / {c['ids']} ids" for sid, c in left.items())
            + f"; router count {router_count}"
        )
        self.print_cpu(cpu)
        w = self.figures["workload"]
        print(f"  {SIDE} at {a.rate:g} ops/s: {'ops':>6s} {'ops/s':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
        for name, st in (("before the drop", before), ("during the drop", during), ("after the drop", after)):
            print(
                f"    {name:17s} {st['ops']:6d} {st['ops_s']:7.1f} {fmt(st['p50_ms'])} {fmt(st['p99_ms'])} "
                f"{fmt(st['max_ms'])}"
            )
        print(
            f"    during / before: p50 {w['p50_ratio']}x, p99 {w['p99_ratio']}x; errors {errors or 'none'}; "
            f"{SIDE} holds {side_count:,} documents",
            flush=True,
        )

    # ------------------------------------------------------------------ raw

    def raw_store(self, path: Path) -> tuple[Rdict, int]:
        db = Rdict(str(path), Options(raw_mode=True))
        wb, size = WriteBatch(raw_mode=True), 0
        for i in range(self.args.docs):
            (dk, dv), (ik, iv) = self.docs.store_pairs(i)
            wb.put(dk, dv)
            wb.put(ik, iv)
            size += len(dv)
            if len(wb) >= 20_000:
                db.write(wb)
                wb = WriteBatch(raw_mode=True)
        db.write(wb)
        return db, size

    def part_raw(self) -> None:
        a = self.args
        print(f"4. raw rocksdict: {a.docs:,} documents laid out as a shard's, deleted", flush=True)
        out = {}
        for mode in ("delete_range", "key_by_key"):
            t_load = time.perf_counter()
            db, size = self.raw_store(self.tmp / f"raw-{mode}")
            load_s = time.perf_counter() - t_load
            t0 = time.perf_counter()
            writes = 0
            if mode == "delete_range":
                wb = WriteBatch(raw_mode=True)
                for lo, hi in dropped_ranges(BIG):
                    wb.delete_range(lo, hi)
                db.write(wb)
                writes = 1
            else:
                for prefix in (DOCS + ns_prefix(BIG), IDS + ns_prefix(BIG)):
                    it = db.iter()
                    it.seek(prefix)
                    wb = WriteBatch(raw_mode=True)
                    while it.valid() and it.key().startswith(prefix):
                        wb.delete(it.key())
                        if len(wb) >= a.delete_batch:
                            db.write(wb)
                            writes += 1
                            wb = WriteBatch(raw_mode=True)
                        it.next()
                    if len(wb):
                        db.write(wb)
                        writes += 1
                    del it  # an open iterator keeps the store open
            secs = time.perf_counter() - t0
            t1 = time.perf_counter()
            left = count_prefix(db, DOCS + ns_prefix(BIG))[0] + count_prefix(db, IDS + ns_prefix(BIG))[0]
            check_s = time.perf_counter() - t1
            db.close()
            shutil.rmtree(self.tmp / f"raw-{mode}", ignore_errors=True)
            if left:
                self.problem(f"raw {mode}: {left} keys left")
            out[mode] = {
                "seconds": round(secs, 6),
                "writes": writes,
                "keys": 2 * a.docs,
                "doc_bytes": size,
                "load_seconds": round(load_s, 1),
                "check_seconds": round(check_s, 3),
                "left": left,
            }
            print(
                f"  ({'a' if mode == 'delete_range' else 'b'}) {mode}: {2 * a.docs:,} keys ({size / 1e6:.0f} MB of "
                f"documents) deleted in {secs * 1000:,.2f} ms ({writes} WriteBatch{'es' if writes > 1 else ''}"
                + (f" of up to {a.delete_batch:,}" if mode == "key_by_key" else "")
                + f"); then iterating the prefixes found {left} keys in {check_s * 1000:,.1f} ms "
                f"(store built in {load_s:.1f}s)",
                flush=True,
            )
        self.figures["raw"] = out

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

    @staticmethod
    def print_cpu(cpu: dict) -> None:
        parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if k != "machine")
        print(
            f"      CPU during the drop (% of one core): {parts}; machine {cpu['machine']:.0f} of {os.cpu_count() * 100}"
        )

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        a = self.args
        print(
            f"DDL benchmark: cluster {self.cluster}; dropCollection of {a.docs:,} documents (~{a.doc_bytes} bytes) "
            f"on {len(SHARDS)} shards; side workload {a.rate:g} ops/s",
            flush=True,
        )
        await kafka.ensure_topics(
            self.bootstrap, [*self.t.core(), *(sp for sh in SHARDS for sp in self.t.for_shard(sh))]
        )
        async with Requester(self.bootstrap, self.t.cli_replies, client_id="bench-ddl") as self.req:
            print("1. load", flush=True)
            await self.start()
            async with AsyncCluster(self.bootstrap, self.cluster, timeout=120) as c:
                await self.load(c[DB]["big"], c[DB]["side"])
                await self.part_drop(c)
        self.stop()  # the raw baseline runs alone
        self.part_raw()

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()


def fmt(x) -> str:
    return "       -" if x is None else f"{x:8.1f}"


def summary(b: Bench, wall: float) -> None:
    f = b.figures
    print(f"summary ({wall:.0f}s wall):")
    if "load" in f:
        lo = f["load"]
        print(f"  load (context): {lo['docs']:,} documents in {lo['seconds']}s ({lo['docs_s']:,.0f} docs/s)")
    if "drop" in f:
        ms = f["drop"]["seconds"] * 1000
        print(f"  dropCollection, DropCollection -> done: {ms:,.0f} ms")
        for mode, r in f.get("raw", {}).items():
            raw_ms = r["seconds"] * 1000
            f["drop"][f"ratio_to_{mode}"] = round(ms / raw_ms, 1) if raw_ms else None
            print(f"  raw {mode:12s} {raw_ms:12,.2f} ms   drop / raw = {f['drop'][f'ratio_to_{mode}']:,}")
    if "workload" in f:
        w = f["workload"]
        print(
            f"  {SIDE} p50 {w['before']['p50_ms']} -> {w['during']['p50_ms']} ms ({w['p50_ratio']}x), "
            f"p99 {w['before']['p99_ms']} -> {w['during']['p99_ms']} ms ({w['p99_ratio']}x) during the drop "
            f"({w['during']['ops']} operations in it)"
        )
    if b.problems:
        print(f"  PROBLEMS ({len(b.problems)}):")
        for p in b.problems:
            print("   " + p)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--docs", type=int, default=1_000_000, help="documents in the dropped collection (default 1,000,000)"
    )
    p.add_argument("--doc-bytes", type=int, default=256, help="bytes of random padding per document (default 256)")
    p.add_argument("--chunks", type=int, default=6, help="initial chunks of the dropped collection (default 6)")
    p.add_argument("--batch", type=int, default=1000, help="insert_many batch size while loading (default 1,000)")
    p.add_argument("--load-concurrency", type=int, default=4, help="insert_many batches in flight (default 4)")
    p.add_argument("--side-docs", type=int, default=1000, help="documents preloaded in ddl.side (default 1,000)")
    p.add_argument("--rate", type=float, default=100, help="ddl.side operations per second (default 100)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of workload before measuring (default 2)")
    p.add_argument("--before", type=float, default=10.0, help="seconds measured before the drop (default 10)")
    p.add_argument("--after", type=float, default=5.0, help="seconds measured after the drop (default 5)")
    p.add_argument("--poll", type=float, default=0.02, help="GetDDL polling interval, seconds (default 0.02)")
    p.add_argument("--delete-batch", type=int, default=10_000, help="raw key-by-key deletes per WriteBatch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, stores)")
    p.add_argument("--json", action="store_true", help="stdout is only the JSON result line (figures to stderr)")
    args = p.parse_args()
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        bench = run(args)
    E.result_line(
        "ddl",
        docs=args.docs,
        doc_bytes=args.doc_bytes,
        shards=len(SHARDS),
        problems=bench.problems,
        **bench.figures,
    )


def run(args) -> Bench:
    bootstrap, cluster = E.bootstrap(), E.cluster_name("benchddl")
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-ddl-"))
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
    summary(bench, time.monotonic() - t0)
    sys.stdout.flush()
    return bench


if __name__ == "__main__":
    main()
