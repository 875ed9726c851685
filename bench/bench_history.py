"""What a shard's history costs (issue 32 §5; docs/decisions/0019), without a broker: a shard's
fold of YCSB-A-like writes (updates of 1 KB documents by a zipfian-ish key choice, in batches as
the command processor commits them) into its real RocksDB store, keeping history, against the
same fold keeping none (a window of 0), rounds alternating.  Then the store's history after a
steady run, and what one reclaim pass deletes and how fast.

    .venv/bin/python bench/bench_history.py [--docs 10000] [--writes 50000] [--batch 50] [--rounds 3]

The end-to-end figure the issue asks for (YCSB-A ops/s and p99 through routers, window 300 s
against 0) is not measured here: this isolates the shard's part of it, where history is written.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

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


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--writes", type=int, default=50_000)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
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
        print(
            json.dumps(
                {
                    "bench": "history",
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
