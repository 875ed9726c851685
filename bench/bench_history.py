"""What a shard's history costs (issue 32 §5; docs/decisions/0019), without a broker: a shard's
fold of YCSB-A-like writes (updates of 1 KB documents by a zipfian-ish key choice, in batches as
the command processor commits them) into its real RocksDB store, keeping history, against the
same fold keeping none (a window of 0), rounds alternating.  Then the store's history after a
steady run, and what one reclaim pass deletes and how fast.

    .venv/bin/python bench/bench_history.py [--docs 10000] [--writes 50000] [--batch 50] [--rounds 3]
                                            [--steady-seconds 600] [--rate 1000] [--window 300]

Last, a steady run in simulated time (the shard's real fold, store and Reclaimer; the clock
advanced per write, not waited for): `--rate` updates a second for `--steady-seconds`, the
Reclaimer's pass every 10 s with a window of `--window` s; every minute the history's entries and
bytes, and the reclaim passes' entries/s.  Bounded means: no growth once the window has passed.

The end-to-end figure the issue asks for (YCSB-A ops/s and p99 through routers, window 300 s
against 0) is not measured here: this isolates the shard's part of it, where history is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import _events as E  # noqa: F401  (puts the repository on sys.path)

from domain.clock import VectorClock
from domain.shardkey import encode_value
from libs.commands import stamp
from libs.store import Store
from schemas import shard as s
from services.shard import history
from services.shard.documents import ShardDocuments

NS = "ycsb.usertable"


def fold(dir: Path, docs: int, writes: int, batch: int, keep: bool, seed: int) -> tuple[float, Store, int]:
    """Load `docs`, then fold `writes` updates; (seconds for the updates, the store, last stamp)."""
    store = Store(dir / "db")
    documents = ShardDocuments()
    documents.load(store)
    documents.keeps_history = lambda: keep
    wall = [1_800_000_000.0]
    clock = VectorClock(wall=lambda: wall[0])
    documents.clock = clock
    pad = "x" * 1000
    rng = random.Random(seed)

    def write(i: int, v: int) -> None:
        skey = encode_value(i).hex()
        event = stamp(clock, s.DocumentWritten(ns=NS, skey=skey, doc={"_id": i, "v": v, "pad": pad}))
        documents.apply(event, -1)

    def commit() -> None:
        store.commit(documents.drain_changes().items(), None, documents.drain_range_deletions())

    for i in range(docs):
        write(i, 0)
        if i % batch == batch - 1:
            commit()
    commit()
    hot = [int(rng.paretovariate(1.2)) % docs for _ in range(writes)]  # a few keys take most writes
    began = time.perf_counter()
    for n, i in enumerate(hot):
        wall[0] += 0.001  # 1,000 writes a second
        write(i, n)
        if n % batch == batch - 1:
            commit()
    commit()
    return time.perf_counter() - began, store, clock.cluster_time


async def steady(dir: Path, docs: int, seconds: int, rate: int, window: int, batch: int) -> list[dict]:
    """Updates at `rate` a second for `seconds` simulated seconds, reclaimed as a shard does;
    a row a minute: entries and MiB of history, and the reclaim passes of that minute."""
    store = Store(dir / "db")
    documents = ShardDocuments()
    documents.load(store)
    wall = [1_800_000_000.0]
    clock = VectorClock(wall=lambda: wall[0])
    documents.clock = clock
    reclaimer = history.Reclaimer(store, lambda: window, every_s=RECLAIM_EVERY_S)
    pad, rng, rows = "x" * 1000, random.Random(7), []
    start, pending = wall[0], 0
    reclaimed, reclaim_s = 0, 0.0
    for n in range(docs + seconds * rate):
        i = n if n < docs else int(rng.paretovariate(1.2)) % docs
        if n >= docs:
            wall[0] += 1 / rate
        skey = encode_value(i).hex()
        documents.apply(stamp(clock, s.DocumentWritten(ns=NS, skey=skey, doc={"_id": i, "v": n, "pad": pad})), -1)
        pending += 1
        if pending == batch:
            store.commit(documents.drain_changes().items(), None, documents.drain_range_deletions())
            pending = 0
        if n < docs:
            continue
        second = (n - docs + 1) / rate
        if second % RECLAIM_EVERY_S == 0:
            began = time.perf_counter()
            reclaimed += await reclaimer.reclaim_once(wall[0])
            reclaim_s += time.perf_counter() - began
        if second % 60 == 0:
            entries = sum(1 for _ in store.scan(history.BY_TIME))
            mib = sum(len(k) + len(v) for k, v in store.scan(history.HISTORY)) / 2**20
            rows.append(
                {
                    "second": int(wall[0] - start),
                    "entries": entries,
                    "historyMiB": round(mib, 1),
                    "reclaimed": reclaimed,
                    "reclaimEntriesPerS": round(reclaimed / reclaim_s) if reclaim_s else None,
                }
            )
            print(
                f"  t={rows[-1]['second']:4d}s  {entries:9,} history entries  {mib:7.1f} MiB  "
                f"reclaimed this minute {reclaimed:8,}"
                + (f" ({reclaimed / reclaim_s:,.0f} entries/s)" if reclaim_s else ""),
                flush=True,
            )
            reclaimed, reclaim_s = 0, 0.0
    store.close()
    return rows


RECLAIM_EVERY_S = 10  # SHARDLOG_HISTORY_RECLAIM_S's default


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--writes", type=int, default=50_000)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steady-seconds", type=int, default=600, help="the steady run's simulated seconds (0: none)")
    p.add_argument("--rate", type=int, default=1000, help="the steady run's updates a second")
    p.add_argument("--window", type=int, default=300, help="minSnapshotHistoryWindowInSeconds of the steady run")
    args = p.parse_args()
    results: dict[str, list[float]] = {"history": [], "none": []}
    base = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        for r in range(args.rounds):
            for name, keep in (
                (("history", True), ("none", False)) if r % 2 == 0 else (("none", False), ("history", True))
            ):
                d = base / f"{name}-{r}"
                secs, store, _ = fold(d, args.docs, args.writes, args.batch, keep, seed=r)
                results[name].append(args.writes / secs)
                store.close()
                shutil.rmtree(d)
        best = {k: max(v) for k, v in results.items()}
        ratio = best["history"] / best["none"]
        print(f"fold of {args.writes:,} updates of 1 KB documents ({args.docs:,} documents, batches of {args.batch}):")
        for k, v in results.items():
            print(f"  {k:8s} {best[k]:10,.0f} writes/s   (rounds: {', '.join(f'{x:,.0f}' for x in v)})")
        print(f"  history / none: {ratio:.2f}")

        d = base / "reclaim"
        _, store, last = fold(d, args.docs, args.writes, args.batch, True, seed=99)
        entries = sum(1 for _ in store.scan(history.BY_TIME))
        history_bytes = sum(len(k) + len(v) for k, v in store.scan(history.HISTORY))
        store.db.flush()
        before = size(d)
        began = time.perf_counter()
        deleted, done = history.reclaim(store, last + 1, limit=10**9)  # everything: the window has passed
        reclaim_s = time.perf_counter() - began
        left = sum(1 for _ in store.scan(history.BY_TIME))
        store.close()
        print(
            f"after {args.writes:,} writes: {entries:,} history entries, {history_bytes / 2**20:.1f} MiB of them "
            f"(store {before / 2**20:.1f} MiB on disk); one reclaim pass deleted {deleted:,} in {reclaim_s:.2f}s "
            f"({deleted / reclaim_s:,.0f} entries/s), {left} left"
        )
        rows: list[dict] = []
        if args.steady_seconds:
            print(
                f"steady: {args.rate:,} updates/s for {args.steady_seconds} s (simulated), window {args.window} s, "
                f"a reclaim pass every {RECLAIM_EVERY_S} s:"
            )
            rows = asyncio.run(
                steady(base / "steady", args.docs, args.steady_seconds, args.rate, args.window, args.batch)
            )
            after = [r["entries"] for r in rows if r["second"] > args.window + RECLAIM_EVERY_S]
            if after:
                print(
                    f"  after the window: {min(after):,}..{max(after):,} entries "
                    f"(max/min {max(after) / max(1, min(after)):.2f}; bounded: no growth past the window)"
                )
        print(
            json.dumps(
                {
                    "bench": "history",
                    "steady": rows,
                    "writesPerS": {k: round(v) for k, v in best.items()},
                    "ratio": round(ratio, 3),
                    "historyEntries": entries,
                    "historyMiB": round(history_bytes / 2**20, 2),
                    "reclaimEntriesPerS": round(deleted / reclaim_s),
                    "reclaimDone": done and left == 0,
                }
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
