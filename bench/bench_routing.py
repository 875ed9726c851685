"""Routing lookup: µs to find the shard owning a key, with 1k, 10k and 100k chunks.

A `Catalog(track_changes=False)` (what a router's follower folds) is built by
applying events: 3 `ShardAdded`, a `DatabaseCreated`, and one `CollectionSharded`
on `{x: 1}` with N chunks over int keys (contiguous runs on shard0..shard2).
Then, for random int keys (the same keys for every measurement at one N):

- `owner_of`      `domain.targeting.owner_of(coll, {"x": k})`: encode the key
                  (`KeyPattern.encode_bound`) + `Collection.chunk_index` (bisect over the
                  encoded chunk minimums) + `chunks[i].shard`
- `encode`        `coll.pattern.encode_bound({"x": k})` alone
- `chunk_index`   `coll.chunk_index(encoded)` alone, keys encoded beforehand
- `for_query`     `targeting.for_query(catalog, ns, {"x": k})`: what the router does for
                  a find/update/delete by equality (compiles the filter, then owner_of)
- `compile_filter` `domain.query.compile_filter({"x": k})` alone (for_query's first step)
- `shard_version` `coll.shard_version(shard)`: the version stamp every routed request carries.
                  The router computes it per shard request (`Routing._routing`, route.py) and the shard
                  again per request to check it (`ShardDecider._placement`): a scan of every chunk of
                  the collection (`max` over the shard's chunk versions)
- baseline `bisect`: `bisect.bisect_right` over a plain sorted list of N ints (the floor
                  of a lookup: the same search, on native ints, nothing else)

No broker needed.

    .venv/bin/python bench/bench_routing.py [--chunks 1000,10000,100000] [--lookups 100000] [--repeat 9]
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import gc
import io
import pstats
import random
import time

import _events as E  # noqa: F401  (puts the repository on sys.path)

from domain import targeting
from domain.catalog import Catalog
from domain.query import compile_filter
from schemas import config as ev

NS = "bench.routing"
SHARDS = ("shard0", "shard1", "shard2")
STEP = 1000  # chunk i is [i*STEP, (i+1)*STEP) (the first from MinKey, the last to MaxKey)


def build_catalog(n: int) -> tuple[Catalog, list[int], float]:
    """The catalog after the events; returns it, the chunks' int minimums and the build seconds."""
    t0 = time.perf_counter()
    bounds = [{"$minKey": 1}] + [i * STEP for i in range(1, n)] + [{"$maxKey": 1}]
    chunks = [
        ev.ChunkDoc(min={"x": bounds[i]}, max={"x": bounds[i + 1]}, shard=SHARDS[i * len(SHARDS) // n], version=(1, i))
        for i in range(n)
    ]
    events = [
        *(ev.ShardAdded(shard=s) for s in SHARDS),
        ev.DatabaseCreated(db="bench", primary=SHARDS[0], uuid="00000000-0000-4000-8000-000000000000"),
        ev.CollectionSharded(
            ns=NS,
            key={"x": 1},
            unique=False,
            epoch="65000000" + "0" * 16,
            uuid="00000000-0000-4000-8000-000000000001",
            chunks=chunks,
        ),
    ]
    catalog = Catalog(track_changes=False)
    for offset, e in enumerate(events):
        catalog.apply(e, offset)
    seconds = time.perf_counter() - t0
    coll = catalog.collections[NS]
    assert len(coll.chunks) == n and len(coll.mins) == n
    return catalog, [i * STEP for i in range(n)], seconds


def per_call_us(rows: dict[str, tuple], repeat: int) -> dict[str, float]:
    """µs per call of each row (fn, args): the best of `repeat` passes over its args, rows interleaved
    within every pass so that a burst of machine noise hits them alike (the loop's own cost is included)."""
    best = {name: float("inf") for name in rows}
    gc.disable()
    try:
        for _ in range(repeat):
            for name, (fn, args) in rows.items():
                t0 = time.perf_counter()
                for a in args:
                    fn(a)
                best[name] = min(best[name], (time.perf_counter() - t0) / len(args))
    finally:
        gc.enable()
    return {name: v * 1e6 for name, v in best.items()}


def measure(n: int, lookups: int, repeat: int, seed: int, profile: cProfile.Profile | None) -> dict:
    catalog, ints, build_s = build_catalog(n)
    coll = catalog.collections[NS]
    rng = random.Random(seed)
    keys = [rng.randrange(-STEP, (n + 1) * STEP) for _ in range(lookups)]  # a few below/above the split points
    docs = [{"x": k} for k in keys]
    encoded = [coll.pattern.encode_bound(d) for d in docs]
    q_docs = docs[: max(1, lookups // 10)]  # for_query is ~10x slower: fewer calls, same keys

    # Every path agrees with the baseline on a sample (chunk i holds [i*STEP, (i+1)*STEP)).
    for d, e in zip(docs[:2000], encoded[:2000]):
        i = max(bisect.bisect_right(ints, d["x"]) - 1, 0)
        assert coll.chunk_index(e) == i and targeting.owner_of(coll, d) == coll.chunks[i].shard
    t = targeting.for_query(catalog, NS, q_docs[0])
    assert t.shards == (targeting.owner_of(coll, q_docs[0]),) and t.sharded, t

    owner_of, chunk_index, encode = targeting.owner_of, coll.chunk_index, coll.pattern.encode_bound
    for_query = targeting.for_query
    bisect_right = bisect.bisect_right
    rows = per_call_us(
        {
            "bisect": (lambda k: bisect_right(ints, k), keys),
            "chunk_index": (chunk_index, encoded),
            "encode": (encode, docs),
            "owner_of": (lambda d: owner_of(coll, d), docs),
            "for_query": (lambda d: for_query(catalog, NS, d), q_docs),
            "compile_filter": (compile_filter, q_docs),
            # O(chunks): a scan for the highest version on the shard; few calls at 100k chunks.
            "shard_version": (coll.shard_version, [SHARDS[i % len(SHARDS)] for i in range(max(20, 2_000_000 // n))]),
            "loop": (lambda k: k, keys),  # the timing loop + a call: what every row pays on top
        },
        repeat,
    )
    if profile is not None:
        profile.enable()
        for d in q_docs:
            for_query(catalog, NS, d)
        profile.disable()
    return {
        "chunks": n,
        "build_s": round(build_s, 3),
        "lookups": lookups,
        "for_query_lookups": len(q_docs),
        **{f"{k}_us": round(v, 3) for k, v in rows.items()},
        "ratio_owner_of_vs_bisect": round(rows["owner_of"] / rows["bisect"], 2),
        "ratio_for_query_vs_bisect": round(rows["for_query"] / rows["bisect"], 2),
        "ratio_chunk_index_vs_bisect": round(rows["chunk_index"] / rows["bisect"], 2),
        "router_per_find_us": round(rows["for_query"] + rows["shard_version"], 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", default="1000,10000,100000", help="chunk counts, comma-separated (default 1k,10k,100k)")
    p.add_argument(
        "--lookups", type=int, default=100_000, help="random keys per pass (for_query: a tenth; default 100,000)"
    )
    p.add_argument("--repeat", type=int, default=9, help="passes over the keys; the best is kept (default 9)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="cProfile for_query at the largest chunk count")
    args = p.parse_args()
    sizes = [int(x) for x in args.chunks.split(",")]
    print(
        f"routing lookup: {args.lookups:,} random int keys per pass (for_query {args.lookups // 10:,}), "
        f"best of {args.repeat} interleaved passes; shard key {{x: 1}}, chunks on {len(SHARDS)} shards"
    )
    results = []
    prof = cProfile.Profile() if args.profile else None
    print(
        f"  {'chunks':>8}  {'build':>7}  {'bisect':>7}  {'chunk_index':>11}  {'encode':>7}  {'owner_of':>8}  "
        f"{'for_query':>9}  {'(compile)':>9}  {'shard_version':>13}  {'owner_of/bisect':>15}  {'for_query/bisect':>16}"
        f"   (µs per call)"
    )
    for n in sizes:
        r = measure(n, args.lookups, args.repeat, args.seed, prof if n == max(sizes) else None)
        results.append(r)
        print(
            f"  {n:8,}  {r['build_s']:6.2f}s  {r['bisect_us']:7.3f}  {r['chunk_index_us']:11.3f}  "
            f"{r['encode_us']:7.3f}  {r['owner_of_us']:8.3f}  {r['for_query_us']:9.3f}  {r['compile_filter_us']:9.3f}  "
            f"{r['shard_version_us']:13.1f}  "
            f"{r['ratio_owner_of_vs_bisect']:15.2f}  {r['ratio_for_query_vs_bisect']:16.2f}",
            flush=True,
        )
    print(f"  (timing loop alone: {results[0]['loop_us']:.3f} µs per call, included in every figure)")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    E.result_line("routing", lookups=args.lookups, repeat=args.repeat, results=results)


if __name__ == "__main__":
    main()
