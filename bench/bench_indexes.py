"""Secondary indexes (issue 15): what an index buys a query, what it costs a write, how fast it builds.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_indexes.py [--docs 100000] [--shards 2] [--runs 7]
        [--writes 20000] [--write-repeat 2] [--concurrency 4] [--batch 500]

config + `--shards` shards + router r1 (its wire edge on a free port) as processes, on
$KAFKA_BOOTSTRAP's broker under a fresh cluster name, as in bench_wire.py; the client is
pymongo through the router's wire port.  Collections are sharded on `{_id: "hashed"}`, so
every shard holds about `--docs` documents of each.

Documents: `{_id: i, a: i % M, b: i % M, r: i, s: i, p: 64 bytes}` with M = total / 100
(an equality on `a` or `b` matches 100 documents); `a` and `r` get indexes, `b` and `s` (the
same values) never do.

1. **build**: load `--docs` x `--shards` documents with no secondary index, then
   `create_index("a")` and `create_index("r")`, each timed from the request to pymongo's
   reply (every shard's build ready; the coordinator polls every 0.2 s).  Rate = documents /
   seconds.  Baseline, same run: the same documents' entries of the same index
   (`domain.indexes.entry_key` under the shard's `k/` prefix, the shard's entry value) written
   into a scratch `Rdict` in `WriteBatch`es of 1,000 (the shard's build step), timed with the
   key computation and without it.
2. **queries**: an equality (`{a: v}` vs `{b: v}`) and a range (`{r: {$gte: x, $lt: x + 1000}}`
   vs the same on `s`), `--runs` times each, alternating, a different v / x each run (the same
   for both fields): median latency of `list(find(...))`, and from `explain()`'s
   executionStats, per shard summed: keys examined, documents examined, returned, and the
   plan each shard chose.  Ratio = unindexed / indexed.
3. **writes**: `--writes` inserts (unordered `insert_many` of `--batch`, `--concurrency`
   threads) into fresh collections with 0, 1 (`a`) and 3 (`a`, `r`, `{b: 1, s: -1}`)
   secondary indexes created while empty; `--write-repeat` rounds, alternating, median
   inserts/s.  Ratio = with k indexes / with 0.

Nothing asserts on timings.  Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _events as E
import bench_sessions
from rocksdict import Options, Rdict, WriteBatch

from domain.indexes import IndexSpec, entry_key, index_keys
from libs.kafka import delete_cluster_topics
from services.shard.documents import encode_entry_value, index_base

ROOT = E.ROOT
DB = "bench"
QCOLL = "q"
PAD = "x" * 64
BUILD_BATCH = 1000  # the shard's SHARDLOG_INDEX_BUILD_BATCH default
WRITE_INDEXES = {0: [], 1: [[("a", 1)]], 3: [[("a", 1)], [("r", 1)], [("b", 1), ("s", -1)]]}


def say(*a) -> None:
    print(*a, flush=True)


class Cluster(bench_sessions.Cluster):
    """bench_sessions' cluster: config + shards + router r1, whose wire edge takes a free port."""

    def __init__(self, bootstrap: str, shards: int, tmp: Path):
        shard_ids = tuple(f"s{i}" for i in range(shards))
        super().__init__(bootstrap, shard_ids, tmp, name="benchidx", env={"SHARDLOG_ROUTER_PORT": "0"})

    async def start(self, collections: list[str]) -> None:  # type: ignore[override]
        await super().start(namespaces=[f"{DB}.{coll}" for coll in collections])


# ------------------------------------------------------------------ documents


def doc(i: int, m: int) -> dict:
    return {"_id": i, "a": i % m, "b": i % m, "r": i, "s": i, "p": PAD}


def insert(coll, ids: range, m: int, batch: int, concurrency: int) -> float:
    """Insert documents `ids` in unordered batches from `concurrency` threads; seconds taken."""
    batches = [ids[j : j + batch] for j in range(0, len(ids), batch)]

    def one(b: range) -> int:
        return len(coll.insert_many([doc(i, m) for i in b], ordered=False).inserted_ids)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        n = sum(pool.map(one, batches))
    took = time.perf_counter() - t0
    assert n == len(ids), (n, len(ids))
    return took


# ---------------------------------------------------------------------- build


def raw_build(ns: str, spec: IndexSpec, total: int, m: int, path: Path) -> dict:
    """The same entries the shards write for `spec` over the same documents, into a scratch Rdict
    in WriteBatches of BUILD_BATCH: seconds with the key computation, and the writes alone."""
    base = index_base(ns, spec.name)
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        t0 = time.perf_counter()
        batches: list[list[tuple[bytes, bytes]]] = []
        for lo in range(0, total, BUILD_BATCH):
            part = []
            for i in range(lo, min(total, lo + BUILD_BATCH)):
                d = doc(i, m)
                for key in index_keys(spec, d)[0]:
                    part.append((base + entry_key(spec, key, d["_id"]), encode_entry_value(key, d["_id"])))
            batches.append(part)
        keyed = time.perf_counter() - t0
        t1 = time.perf_counter()
        for part in batches:
            wb = WriteBatch(raw_mode=True)
            for k, v in part:
                wb.put(k, v)
            db.write(wb)
        wrote = time.perf_counter() - t1
        entries = sum(len(p) for p in batches)
    finally:
        db.close()
        Rdict.destroy(str(path))
    return {
        "entries": entries,
        "keys_s": round(keyed, 3),
        "write_s": round(wrote, 3),
        "total_s": round(keyed + wrote, 3),
    }


def build(coll, field: str, total: int, m: int, tmp: Path) -> dict:
    t0 = time.perf_counter()
    name = coll.create_index(field)
    took = time.perf_counter() - t0
    spec = IndexSpec.make(name, ((field, 1),))
    raw = raw_build(coll.full_name, spec, total, m, tmp / f"raw-{name}")
    f = {
        "index": name,
        "docs": total,
        "seconds": round(took, 3),
        "docs_s": round(total / took, 1),
        "raw": raw,
        "raw_docs_s": round(total / raw["total_s"], 1),
        "raw_write_only_docs_s": round(total / raw["write_s"], 1),
    }
    f["ratio"] = round(f["docs_s"] / f["raw_docs_s"], 4)
    f["ratio_write_only"] = round(f["docs_s"] / f["raw_write_only_docs_s"], 4)
    say(
        f"  build {name}: {total:,} docs in {took:.2f}s = {f['docs_s']:,.0f} docs/s | raw rocksdict, same "
        f"{raw['entries']:,} entries in {raw['total_s']:.2f}s (keys {raw['keys_s']:.2f}s + writes "
        f"{raw['write_s']:.2f}s) = {f['raw_docs_s']:,.0f} docs/s (writes alone {f['raw_write_only_docs_s']:,.0f}) | "
        f"shardlog / raw = {f['ratio']:.4f} (vs writes alone {f['ratio_write_only']:.4f})"
    )
    return f


# -------------------------------------------------------------------- queries


def innermost(stage: dict) -> dict:
    while "inputStage" in stage:
        stage = stage["inputStage"]
    return stage


def explained(coll, flt: dict) -> dict:
    e = coll.find(flt).explain()
    stats = e["executionStats"]["executionStages"]["shards"]
    plans = e["queryPlanner"]["winningPlan"]["shards"]
    scans = sorted({(lambda s: s.get("indexName") or s["stage"])(innermost(p["winningPlan"])) for p in plans})
    return {
        "shards": len(stats),
        "keysExamined": sum(s["totalKeysExamined"] for s in stats),
        "docsExamined": sum(s["totalDocsExamined"] for s in stats),
        "docsExaminedPerShard": [s["totalDocsExamined"] for s in stats],
        "nReturned": sum(s["nReturned"] for s in stats),
        "plans": scans,
    }


def queries(coll, total: int, m: int, runs: int) -> dict:
    shapes = {
        "equality": (lambda f, j: {f: (j * 7919) % m}, "a", "b"),
        "range": (lambda f, j: {f: {"$gte": (x := (j * 104729) % (total - 1000)), "$lt": x + 1000}}, "r", "s"),
    }
    out = {}
    for shape, (make, ix, unix) in shapes.items():
        times: dict[str, list[float]] = {ix: [], unix: []}
        counts: dict[str, int] = {}
        for j in range(runs + 1):  # run 0 warms up
            for field in (ix, unix):
                t0 = time.perf_counter()
                n = len(list(coll.find(make(field, j))))
                took = time.perf_counter() - t0
                if j:
                    times[field].append(took)
                counts[field] = n
        assert counts[ix] == counts[unix], counts
        res = {}
        for field in (ix, unix):
            res["indexed" if field == ix else "unindexed"] = {
                "field": field,
                "median_ms": round(statistics.median(times[field]) * 1000, 2),
                "min_ms": round(min(times[field]) * 1000, 2),
                "returned": counts[field],
                **explained(coll, make(field, 1)),
            }
        i, u = res["indexed"], res["unindexed"]
        res["ratio_latency"] = round(u["median_ms"] / i["median_ms"], 2)
        res["ratio_docs_examined"] = round(u["docsExamined"] / max(1, i["docsExamined"]), 1)
        out[shape] = res
        for label in ("indexed", "unindexed"):
            r = res[label]
            say(
                f"  {shape:8s} {label:9s} ({r['field']}): median {r['median_ms']:8.2f} ms (min {r['min_ms']:.2f}) "
                f"returned {r['returned']:,}  keys examined {r['keysExamined']:,}  docs examined "
                f"{r['docsExamined']:,}  plans {r['plans']}"
            )
        say(
            f"  {shape:8s} unindexed / indexed: latency x{res['ratio_latency']:.2f}, "
            f"docs examined x{res['ratio_docs_examined']:,.1f}"
        )
    return out


# --------------------------------------------------------------------- writes


def writes(db, args) -> dict:
    m = max(1, args.writes // 100)
    rates: dict[int, list[float]] = {k: [] for k in WRITE_INDEXES}
    for rnd in range(args.write_repeat):
        for k, specs in WRITE_INDEXES.items():
            coll = db[f"w{k}_{rnd}"]
            for key in specs:
                coll.create_index(key)
            took = insert(coll, range(args.writes), m, args.batch, args.concurrency)
            rates[k].append(args.writes / took)
            say(
                f"  writes, {k} secondary index(es), round {rnd + 1}: {args.writes:,} inserts in {took:.2f}s "
                f"= {args.writes / took:,.0f}/s"
            )
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {
        f"idx{k}": {"inserts_s": round(med[k], 1), "ratio_vs_0": round(med[k] / med[0], 3), "runs": rates[k]}
        for k in rates
    }
    say(
        "  writes (median inserts/s): "
        + ", ".join(f"{k} index(es) {med[k]:,.0f}/s (x{med[k] / med[0]:.3f} of 0)" for k in med)
    )
    return out


# ----------------------------------------------------------------------- main


async def run(args, bootstrap: str, tmp: Path) -> None:
    import pymongo

    c = Cluster(bootstrap, args.shards, tmp)
    total = args.docs * args.shards
    m = max(1, total // 100)
    write_colls = [f"w{k}_{r}" for r in range(args.write_repeat) for k in WRITE_INDEXES]
    say(
        f"indexes benchmark: cluster {c.cluster}; {args.shards} shard(s) x ~{args.docs:,} documents = {total:,}; "
        f"{args.runs} runs per query; {args.writes:,} inserts x {args.write_repeat} round(s) per index count"
    )
    try:
        await c.start([QCOLL, *write_colls])
        client = pymongo.MongoClient(c.uri, maxPoolSize=args.concurrency + 2)
        try:
            db = client[DB]
            coll = db[QCOLL]
            took = await asyncio.to_thread(insert, coll, range(total), m, args.batch, args.concurrency)
            say(f"  load: {total:,} documents (no secondary index) in {took:.1f}s = {total / took:,.0f}/s")
            per_shard = await asyncio.to_thread(explained, coll, {})
            say(f"  documents per shard (a COLLSCAN's docs examined): {per_shard['docsExaminedPerShard']}")
            build_figs = [await asyncio.to_thread(build, coll, f, total, m, tmp) for f in ("a", "r")]
            query_figs = await asyncio.to_thread(queries, coll, total, m, args.runs)
            write_figs = await asyncio.to_thread(writes, db, args)
        finally:
            client.close()
        E.result_line(
            "indexes",
            shards=args.shards,
            docs_per_shard=args.docs,
            load_docs_s=round(total / took, 1),
            build=build_figs,
            queries=query_figs,
            writes=write_figs,
        )
    finally:
        c.stop()
        await delete_cluster_topics(bootstrap, c.cluster)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=100_000, help="documents per shard (default 100,000)")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--runs", type=int, default=7, help="runs per query (median)")
    p.add_argument("--writes", type=int, default=20_000, help="inserts per write-throughput run")
    p.add_argument("--write-repeat", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4, help="insert threads")
    p.add_argument("--batch", type=int, default=500, help="documents per insert_many")
    args = p.parse_args()
    bootstrap = E.bootstrap()
    tmp = Path(tempfile.mkdtemp(prefix="bench-indexes-"))
    try:
        asyncio.run(run(args, bootstrap, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
