"""Ordered against unordered `insert_many` through the wire on a hashed key (issue 38 §4): the same
number of documents, each run into a fresh id range of `ycsb.usertable` (sharded on hashed _id
over 3 shards), runs alternating, every service a process (bench_wire.py's cluster).  Prints docs/s
of each and ordered ÷ unordered (the issue's aim: ≥ 0.5).

    .venv/bin/python bench/bench_ordered_insert.py [--docs 20000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _events as E
import pymongo
from bench_wire import NS_COLL, NS_DB, WireCluster

from libs.kafka import delete_cluster_topics


def say(*a: object) -> None:
    print(*a, flush=True)


def timed_insert(coll: pymongo.collection.Collection, first: int, n: int, ordered: bool) -> float:
    docs = [{"_id": first + i, "field0": "x" * 100} for i in range(n)]
    t = time.monotonic()
    coll.insert_many(docs, ordered=ordered)
    return time.monotonic() - t


async def run(args: argparse.Namespace, bootstrap: str, cluster: str, tmp: Path) -> dict[str, list[float]]:
    wc = WireCluster(bootstrap, cluster, tmp, raw=False)
    await wc.start()
    try:
        client: pymongo.MongoClient = pymongo.MongoClient(wc.uri, serverSelectionTimeoutMS=30_000)
        coll = client[NS_DB][NS_COLL]
        timed_insert(coll, -1000, 200, False)  # warm-up: connections, routing tables
        rates: dict[str, list[float]] = {"unordered": [], "ordered": []}
        first = 0
        for r in range(args.repeat):
            for kind in ("unordered", "ordered") if r % 2 == 0 else ("ordered", "unordered"):
                secs = await asyncio.to_thread(timed_insert, coll, first, args.docs, kind == "ordered")
                first += args.docs
                rates[kind].append(args.docs / secs)
                say(f"  {kind:9} {args.docs:,} docs in {secs:6.2f} s = {args.docs / secs:8.0f} docs/s")
        assert coll.count_documents({"_id": {"$gte": 0}}) == first, "every document went in"
        client.close()
        return rates
    finally:
        wc.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=20_000, help="documents per insert_many (default 20,000)")
    p.add_argument("--repeat", type=int, default=2, help="runs of each kind, alternating (default 2)")
    args = p.parse_args()
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-ordered-"))
    say(f"ordered vs unordered insert_many: {args.docs:,} documents, hashed _id over 3 shards, cluster {cluster}")
    try:
        rates = asyncio.run(run(args, bootstrap, cluster, tmp))
    finally:
        try:
            asyncio.run(delete_cluster_topics(bootstrap, cluster))
        except Exception as e:  # clean-up must not hide the figures
            print(f"warning: could not delete the topics of {cluster}: {e}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    unordered, ordered = statistics.median(rates["unordered"]), statistics.median(rates["ordered"])
    say(
        f"median: unordered {unordered:.0f} docs/s, ordered {ordered:.0f} docs/s, ordered ÷ unordered {ordered / unordered:.3f}"
    )
    E.result_line(
        "ordered_insert",
        docs=args.docs,
        unordered_docs_per_s=round(unordered),
        ordered_docs_per_s=round(ordered),
        ratio=round(ordered / unordered, 3),
    )


if __name__ == "__main__":
    main()
