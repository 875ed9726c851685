"""Restart: time from start to ready with a checkpointed store, after a long log vs a short one.

Two catalog-like config.events logs (N events, default 1,000,000, and 1,000)
are each projected once into their own RocksDB store (writing the checkpoint),
then a fresh `Projection` over the same store is timed: open the store,
start() (Catalog.load from the store's entities, consumer start, checkpoint
fingerprint check) + catch_up() -- the point where a service reports ready.
Repeated a few times.  The state is loaded from entities, not replayed, so the
ratio long / short should be about 1; the full replay time of the long log is
printed beside it.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_restart.py [--n 1000000] [--repeat 5]
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _events as E

from domain.catalog import Catalog
from libs.projection import Projection
from libs.store import Store
from schemas import config as schema


async def first_replay(bootstrap: str, topic: str, path: Path) -> dict:
    store = Store(path)
    catalog = Catalog()
    seconds, position, _ = await E.timed_replay(bootstrap, topic, catalog, store, "bench-restart")
    store.close()
    return {
        "seconds": seconds,
        "position": position,
        "chunks": sum(len(c.chunks) for c in catalog.collections.values()),
    }


async def restart(bootstrap: str, topic: str, path: Path) -> dict:
    """One restart, up to ready, with where the time went."""
    t0 = time.perf_counter()
    store = Store(path)
    t_open = time.perf_counter() - t0
    catalog = Catalog()
    load_time = 0.0
    orig_load = catalog.load

    def timed_load(s):
        nonlocal load_time
        t = time.perf_counter()
        orig_load(s)
        load_time += time.perf_counter() - t

    catalog.load = timed_load
    proj = Projection(bootstrap, topic, schema.events, catalog, store, name="bench-restart")
    t1 = time.perf_counter()
    await proj.start()
    t2 = time.perf_counter()
    position = await proj.catch_up()
    t3 = time.perf_counter()
    chunks = sum(len(c.chunks) for c in catalog.collections.values())
    await proj.stop()
    store.close()
    return {
        "ready": t3 - t0,
        "open": t_open,
        "start": t2 - t1,
        "load": load_time,
        "catch_up": t3 - t2,
        "position": position,
        "chunks": chunks,
    }


def time_load(path: Path, repeat: int) -> list[float]:
    """Catalog.load alone (what ConfigServer and CatalogFollower do first), on an open store."""
    store = Store(path)
    try:
        out = []
        for _ in range(repeat):
            t = time.perf_counter()
            Catalog().load(store)
            out.append(time.perf_counter() - t)
        return out
    finally:
        store.close()


def main() -> None:
    p = E.arg_parser(__doc__.splitlines()[0], 1_000_000)
    E.add_catalog_args(p)
    p.add_argument("--n-small", type=int, default=1000, help="events of the short log (default 1000)")
    p.add_argument("--repeat", type=int, default=5, help="restarts timed per store (default 5)")
    args = p.parse_args()
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    logs = {
        "long": (args.n, f"{cluster}-long.config.events"),
        "short": (args.n_small, f"{cluster}-short.config.events"),
    }
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-restart-"))
    E.check_encoding()
    print(
        f"restart benchmark: logs of {args.n:_} and {args.n_small:_} events ({args.collections} collections "
        f"of {args.chunks} chunks), stores under {tmp}"
    )
    figures: dict[str, dict] = {}
    try:
        for name, (n, topic) in logs.items():
            asyncio.run(E.create_events_topic(bootstrap, topic))
            count, t_prod = asyncio.run(
                E.produce(bootstrap, topic, E.catalog_events(n, collections=args.collections, chunks=args.chunks))
            )
            first = asyncio.run(first_replay(bootstrap, topic, tmp / name))
            print(
                f"{name}: produced {count:_} events in {t_prod:.1f}s; first replay into an empty store "
                f"{first['seconds']:.2f}s ({E.rate(count, first['seconds']):,.0f} events/s), "
                f"{first['chunks']} chunks, store {sum(f.stat().st_size for f in (tmp / name).rglob('*')) / 1e6:.1f} MB"
            )
            runs = []
            for i in range(args.repeat):
                r = asyncio.run(restart(bootstrap, topic, tmp / name))
                if r["position"] != first["position"] or r["chunks"] != first["chunks"]:
                    raise SystemExit(
                        f"restart {i} of {name} came back at {r['position']} with {r['chunks']} "
                        f"chunks, expected {first['position']} / {first['chunks']}"
                    )
                runs.append(r)
                print(
                    f"  restart {i + 1}: ready in {r['ready'] * 1e3:7.1f} ms = open store {r['open'] * 1e3:6.1f} "
                    f"+ start {r['start'] * 1e3:6.1f} (Catalog.load {r['load'] * 1e3:6.1f}) "
                    f"+ catch_up {r['catch_up'] * 1e3:6.1f}",
                    flush=True,
                )
            loads = time_load(tmp / name, args.repeat)
            med = {k: statistics.median(r[k] for r in runs) for k in ("ready", "open", "start", "load", "catch_up")}
            figures[name] = {
                "events": count,
                "chunks": first["chunks"],
                "first_replay_s": round(first["seconds"], 3),
                **{f"{k}_ms_median": round(v * 1e3, 2) for k, v in med.items()},
                "ready_ms_min": round(min(r["ready"] for r in runs) * 1e3, 2),
                "catalog_load_ms_median": round(statistics.median(loads) * 1e3, 2),
            }
            print(
                f"  {name}: ready median {med['ready'] * 1e3:.1f} ms (min {figures[name]['ready_ms_min']:.1f}); "
                f"Catalog.load alone, warm store: median {figures[name]['catalog_load_ms_median']:.1f} ms"
            )
    finally:
        E.delete_topics(bootstrap, [t for _, t in logs.values()])
        shutil.rmtree(tmp, ignore_errors=True)
    lg, sh = figures["long"], figures["short"]
    ratio = lg["ready_ms_median"] / sh["ready_ms_median"]
    speedup = lg["first_replay_s"] * 1e3 / lg["ready_ms_median"]
    print(
        f"ratio ready(long) / ready(short) = {ratio:.2f}  "
        f"({lg['events']:_} vs {sh['events']:_} events; median {lg['ready_ms_median']:.1f} vs "
        f"{sh['ready_ms_median']:.1f} ms)"
    )
    print(
        f"restart from the checkpoint vs replaying the long log from scratch: {lg['ready_ms_median']:.1f} ms vs "
        f"{lg['first_replay_s']:.1f} s ({speedup:,.0f}x faster)"
    )
    E.result_line(
        "restart",
        repeat=args.repeat,
        collections=args.collections,
        chunks_per_collection=args.chunks,
        long=lg,
        short=sh,
        ratio_long_over_short=round(ratio, 3),
        replay_over_restart=round(speedup, 1),
    )


if __name__ == "__main__":
    main()
