"""Shared helpers of the benchmarks: a catalog-like config.events generator,
a fast producer for it, a throwaway cluster name, and the result line.

The generated log is what a config server would have written: shards, one
database, a few range-sharded collections (`{x: 1}`) grown to a number of
chunks by splits, then alternating ChunkSplit / ChunksMerged on an interior
chunk of one collection after the other, with the versions the config server
would mint (split: <M, m+1> <M, m+2>; merge: <M, m+1>, m the collection's
highest minor).  Every prefix of it applies cleanly through `Catalog.apply`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/bench_x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaProducer  # noqa: E402

from libs import kafka  # noqa: E402
from libs.topics import KEEP_FOREVER, TopicSpec  # noqa: E402

MIN, MAX = {"$minKey": 1}, {"$maxKey": 1}
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # what pydantic's model_dump_json writes


def bootstrap() -> str:
    b = os.environ.get("KAFKA_BOOTSTRAP")
    if not b:
        sys.exit("set KAFKA_BOOTSTRAP (e.g. export KAFKA_BOOTSTRAP=$(cat /tmp/k1/bootstrap)), or run `make bench`")
    return b


def cluster_name(prefix: str = "bench") -> str:
    return f"{prefix}{os.getpid()}{random.randrange(16**6):06x}"


def arg_parser(description: str, default_n: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--n", type=int, default=default_n, help=f"number of events/commands (default {default_n:_})")
    return p


def add_catalog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collections", type=int, default=4, help="sharded collections in the log (default 4)")
    p.add_argument("--chunks", type=int, default=100, help="chunks each collection is grown to (default 100)")


def result_line(name: str, **figures) -> None:
    """The one machine-readable line a benchmark ends with."""
    print(json.dumps({"bench": name, **figures}, separators=(",", ":")), flush=True)


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


# ---------------------------------------------------------------- the log


def _chunk(lo, hi, shard: str, minor: int) -> dict:
    return {
        "type": "Chunk",
        "v": 1,
        "min": {"x": lo},
        "max": {"x": hi},
        "shard": shard,
        "version": [1, minor],
        "jumbo": False,
    }


def catalog_events(
    n: int, *, collections: int = 4, chunks: int = 100, shards: int = 3, step: int = 1 << 20, seed: int = 1
) -> Iterator[bytes]:
    """Yield the first `n` events (JSON bytes, exactly as `Codec.encode` writes them) of the log."""
    rng = random.Random(seed)
    produced = 0

    def emit(obj: dict) -> bytes:
        # Codec.encode's field order: type, v, ts (the record's stamp: none in a generated log), then the rest.
        head = {"type": obj["type"], "v": obj["v"], "ts": None}
        return _dumps({**head, **obj}).encode()

    setup: list[dict] = [{"type": "ShardAdded", "v": 1, "shard": f"shard{i}"} for i in range(shards)]
    setup.append(
        {
            "type": "DatabaseCreated",
            "v": 1,
            "db": "bench",
            "primary": "shard0",
            "uuid": "00000000-0000-4000-8000-000000000000",
            "lastMod": 1,
        }
    )
    colls = []
    for c in range(collections):
        ns, epoch, shard = f"bench.c{c}", f"{0x65000000 + c:08x}{c:016x}", f"shard{c % shards}"
        colls.append({"ns": ns, "epoch": epoch, "shard": shard, "minor": 0, "split": None})
        setup.append(
            {
                "type": "CollectionSharded",
                "v": 1,
                "ns": ns,
                "key": {"x": 1},
                "unique": False,
                "epoch": epoch,
                "uuid": f"00000000-0000-4000-8000-{c:012x}",
                "chunks": [_chunk(MIN, MAX, shard, 0)],
            }
        )
    for obj in setup:
        if produced == n:
            return
        yield emit(obj)
        produced += 1

    def split(c: dict, lo, hi, at) -> bytes:
        m = c["minor"]
        c["minor"] = m + 2
        return emit(
            {
                "type": "ChunkSplit",
                "v": 1,
                "ns": c["ns"],
                "epoch": c["epoch"],
                "min": {"x": lo},
                "max": {"x": hi},
                "chunks": [_chunk(lo, at, c["shard"], m + 1), _chunk(at, hi, c["shard"], m + 2)],
            }
        )

    # Grow every collection to `chunks` chunks: [Min, 0) [0, s) [s, 2s) ... [k*s, Max).
    for k in range(chunks - 1):
        for c in colls:
            if produced == n:
                return
            lo = MIN if k == 0 else (k - 1) * step
            yield split(c, lo, MAX, k * step)
            produced += 1
    # Steady state: split an interior chunk [a, a+s) at its middle, later merge it back.
    while True:
        for c in colls:
            if produced == n:
                return
            if c["split"] is None:
                a = rng.randrange(chunks - 2) * step  # interior chunks [0, s) ... [(chunks-3)s, (chunks-2)s)
                c["split"] = a
                yield split(c, a, a + step, a + step // 2)
            else:
                a, c["split"] = c["split"], None
                c["minor"] += 1
                yield emit(
                    {
                        "type": "ChunksMerged",
                        "v": 1,
                        "ns": c["ns"],
                        "epoch": c["epoch"],
                        "chunk": _chunk(a, a + step, c["shard"], c["minor"]),
                    }
                )
            produced += 1


def check_encoding(sample: int = 2000) -> None:
    """The generated bytes are what the config server would write, and they fold cleanly."""
    from domain.catalog import Catalog
    from schemas import Codec
    from schemas import config as schema

    cat = Catalog(track_changes=False)
    for i, raw in enumerate(catalog_events(sample, chunks=20)):
        event = schema.events.decode(raw)
        if Codec.encode(event) != raw:
            raise AssertionError(f"generated event {i} is not in Codec.encode form:\n{raw!r}\n{Codec.encode(event)!r}")
        cat.apply(event, i)
    if not all(len(c.chunks) >= 19 for c in cat.collections.values()):
        raise AssertionError("generator did not grow the collections")


async def create_events_topic(bootstrap: str, topic: str) -> None:
    await kafka.ensure_topics(bootstrap, [TopicSpec(topic, config=KEEP_FOREVER)])


async def produce(
    bootstrap: str, topic: str, values: Iterator[bytes], *, txn_size: int = 10_000, progress: bool = True
) -> tuple[int, float]:
    """Append `values` to partition 0 of `topic` in transactions of `txn_size`, as the
    single writer of an event log does; returns (records, seconds)."""
    p = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        transactional_id=f"{topic}.bench-writer",
        linger_ms=20,
        max_batch_size=16384,  # aiokafka's default, as the config server writes its log
        max_request_size=kafka.MAX_RECORD_BYTES,
    )
    await p.start()
    t0 = time.perf_counter()
    count = printed = 0
    try:
        done = False
        while not done:
            await p.begin_transaction()
            for _ in range(txn_size):
                v = next(values, None)
                if v is None:
                    done = True
                    break
                await p.send(topic, v, partition=0)
                count += 1
            await p.commit_transaction()
            if progress and count - printed >= 100_000:
                printed = count
                print(f"  produced {count:_} ({rate(count, time.perf_counter() - t0):,.0f}/s)", flush=True)
    finally:
        await p.stop()
    return count, time.perf_counter() - t0


def delete_topics(bootstrap: str, names: list[str]) -> None:
    try:
        asyncio.run(kafka.delete_topics(bootstrap, names))
    except Exception as e:  # clean-up must not hide the figures
        print(f"warning: could not delete topics {names}: {e}", file=sys.stderr)


async def timed_replay(bootstrap: str, topic: str, state, store, name: str) -> tuple[float, int, int]:
    """Fold `topic` into `state` and `store` through a real `Projection`, start to caught up;
    (seconds, position reached, records skipped).  The store stays open."""
    from libs.projection import Projection
    from schemas import config as schema

    proj = Projection(bootstrap, topic, schema.events, state, store, name=name)
    t0 = time.perf_counter()
    await proj.start()
    position = await proj.catch_up()
    seconds = time.perf_counter() - t0
    await proj.stop()
    return seconds, position, proj.skipped
