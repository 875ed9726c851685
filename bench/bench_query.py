"""The cost of the query language's generality (issue 38 §4): µs per document to evaluate a mix
of filters and updates with `domain/query.py`, against a plain `$eq` filter and a plain `$set`
update measured in the same run.  No broker: the shard's matcher and updater alone.

    .venv/bin/python bench/bench_query.py [--docs 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

import _events as E  # noqa: F401  (puts the repository on sys.path)
from bson import Regex

from domain.query import compile_filter, update_stored

FILTERS: dict[str, dict[str, Any]] = {
    "$eq (baseline)": {"n": 500},
    "$gt/$lt range": {"n": {"$gt": 100, "$lt": 900}},
    "$in of 10": {"n": {"$in": list(range(0, 1000, 100))}},
    "dotted path": {"meta.score": {"$gte": 50}},
    "array element": {"tags": "t3"},
    "$elemMatch": {"items": {"$elemMatch": {"sku": "s2", "qty": {"$gt": 5}}}},
    "$all": {"tags": {"$all": ["t1", "t2"]}},
    "$size": {"tags": {"$size": 3}},
    "$regex": {"name": Regex("^user1")},
    "$type": {"n": {"$type": "int"}},
    "$mod": {"n": {"$mod": [7, 3]}},
    "$or of 3": {"$or": [{"n": 1}, {"name": "user2"}, {"meta.score": 3}]},
    "$expr": {"$expr": {"$gt": ["$n", "$meta.score"]}},
}
UPDATES: dict[str, dict[str, Any]] = {
    "$set (baseline)": {"$set": {"flag": 1}},
    "$inc": {"$inc": {"n": 1}},
    "$set dotted": {"$set": {"meta.score": 7}},
    "$push $each $slice": {"$push": {"tags": {"$each": ["x"], "$slice": -4}}},
    "$addToSet": {"$addToSet": {"tags": "t9"}},
    "$pull cond": {"$pull": {"items": {"qty": {"$lt": 3}}}},
    "$min/$max": {"$min": {"low": 1}, "$max": {"high": 999}},
    "$rename": {"$rename": {"name": "label"}},
    "$set a.1.qty": {"$set": {"items.1.qty": 0}},
}


def documents(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    return [
        {
            "_id": i,
            "n": rnd.randrange(1000),
            "name": f"user{rnd.randrange(1000)}",
            "meta": {"score": rnd.randrange(100), "city": rnd.choice(["a", "b", "c"])},
            "tags": [f"t{rnd.randrange(6)}" for _ in range(rnd.randrange(1, 5))],
            "items": [{"sku": f"s{rnd.randrange(4)}", "qty": rnd.randrange(10)} for _ in range(3)],
        }
        for i in range(n)
    ]


def best_us(fn: Callable[[], None], n: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    docs = documents(args.docs)
    out: dict[str, Any] = {"filters": {}, "updates": {}}

    print(f"filters over {args.docs} documents (best of {args.repeat}), µs per document:")
    base = None
    for name, flt in FILTERS.items():
        m = compile_filter(flt)
        us = best_us(lambda m=m: [m.matches(d) for d in docs] and None, args.docs, args.repeat)
        base = base or us
        hits = sum(m.matches(d) for d in docs)
        print(f"  {name:22} {us:7.2f} µs   x{us / base:5.2f} of $eq   ({hits} match)")
        out["filters"][name] = {"us": round(us, 3), "ratio": round(us / base, 3), "matched": hits}

    print(f"updates of {args.docs} documents (copy-on-write, as a shard applies them), µs per document:")
    base = None
    for name, upd in UPDATES.items():
        us = best_us(lambda upd=upd: [update_stored(d, upd) for d in docs] and None, args.docs, args.repeat)
        base = base or us
        changed = sum(update_stored(d, upd) is not None for d in docs)
        print(f"  {name:22} {us:7.2f} µs   x{us / base:5.2f} of $set   ({changed} changed)")
        out["updates"][name] = {"us": round(us, 3), "ratio": round(us / base, 3), "changed": changed}
    print(json.dumps({"bench": "query", "docs": args.docs, **out}))


if __name__ == "__main__":
    main()
