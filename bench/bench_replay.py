"""Replay: events/s folding a catalog-like config.events log into RocksDB.

(a) the real path: `Projection(..., Catalog(), Store)` start + catch_up from an
    empty store — Kafka fetch (read_committed), JSON + pydantic decode,
    `Catalog.apply`, and one RocksDB write batch per fetched batch with the
    checkpoint in it;
(b) the baseline: the very same write batches (keys, values, deletes and
    checkpoints, captured by folding the same events in memory) written with
    raw rocksdict into a fresh database.

Also splits the real path's time into fetch / decode / apply+drain / write,
measured in a second, instrumented pass over the same log.

    KAFKA_BOOTSTRAP=... .venv/bin/python bench/bench_replay.py [--n 1000000]
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import _events as E
from rocksdict import Options, Rdict, WriteBatch

from domain.catalog import Catalog
from libs.projection import Projection
from libs.store import Store
from schemas import config as schema


async def project(bootstrap: str, topic: str, path: Path, profile: bool) -> dict:
    store = Store(path)
    catalog = Catalog()
    batches = 0
    orig_commit = store.commit

    def counting_commit(*args, **kwargs):  # Store.commit's signature, whatever it grows
        nonlocal batches
        batches += 1
        orig_commit(*args, **kwargs)

    store.commit = counting_commit
    proj = Projection(bootstrap, topic, schema.events, catalog, store, name="bench-replay")
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    await proj.start()
    position = await proj.catch_up()
    if prof:
        prof.disable()
    seconds = time.perf_counter() - t0
    await proj.stop()
    store.close()
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())
    return {
        "seconds": seconds,
        "position": position,
        "skipped": proj.skipped,
        "batches": batches,
        "chunks": sum(len(c.chunks) for c in catalog.collections.values()),
    }


class TimedCodec:
    """The projection's codec, timing every decode."""

    def __init__(self, codec):
        self.codec, self.seconds = codec, 0.0

    def decode(self, raw):
        t = time.perf_counter()
        try:
            return self.codec.decode(raw)
        finally:
            self.seconds += time.perf_counter() - t


class TimedCatalog(Catalog):
    """Times apply + drain_changes, and keeps every write of every event before a
    batch's writes to one key collapse into one (for the second baseline)."""

    def __init__(self, track_changes: bool = True, clock=None):
        super().__init__(track_changes, clock)
        self.seconds = 0.0
        self.stream: list[tuple[bytes, bytes | None]] = []

    def _put(self, key: bytes, value: dict | None) -> None:
        super()._put(key, value)
        self.stream.append((key, self._changes[key]))

    def apply(self, event, offset: int) -> None:
        t = time.perf_counter()
        super().apply(event, offset)
        self.seconds += time.perf_counter() - t

    def drain_changes(self):
        t = time.perf_counter()
        out = super().drain_changes()
        self.seconds += time.perf_counter() - t
        return out


async def instrumented_pass(bootstrap: str, topic: str, path: Path) -> dict:
    """The real Projection again over the same log, with decode and apply timed and the
    store's commit replaced by a capture of every write batch (changes + checkpoint),
    which the baselines then write with raw rocksdict."""
    codec, catalog = TimedCodec(schema.events), TimedCatalog()
    store = Store(path)
    captured: list[tuple[list[tuple[bytes, bytes | None]], bytes, bytes]] = []
    streamed: list[tuple[list[tuple[bytes, bytes | None]], bytes, bytes]] = []
    t_capture = 0.0

    def capture(changes, checkpoint, *_range_deletions):  # a catalog has no range deletions
        nonlocal t_capture
        t = time.perf_counter()
        key, value = Store._ckpt_key(checkpoint.topic, checkpoint.partition), checkpoint.to_bytes()
        captured.append((list(changes), key, value))
        streamed.append((catalog.stream, key, value))
        catalog.stream = []
        t_capture += time.perf_counter() - t

    store.commit = capture
    proj = Projection(bootstrap, topic, codec, catalog, store, name="bench-replay-instrumented")
    t0 = time.perf_counter()
    await proj.start()
    await proj.catch_up()
    total = time.perf_counter() - t0 - t_capture
    await proj.stop()
    store.close()
    return {
        "total": total,
        "decode": codec.seconds,
        "apply": catalog.seconds,
        "fetch": total - codec.seconds - catalog.seconds,
        "position": proj.position,
        "captured": captured,
        "streamed": streamed,
    }


def raw_ingest(path: Path, captured) -> dict:
    db = Rdict(str(path), Options(raw_mode=True))
    writes = 0
    t0 = time.perf_counter()
    for changes, ckpt_key, ckpt in captured:
        wb = WriteBatch(raw_mode=True)
        for k, v in changes:
            if v is None:
                wb.delete(k)
            else:
                wb.put(k, v)
        wb.put(ckpt_key, ckpt)
        db.write(wb)
        writes += len(changes) + 1
    seconds = time.perf_counter() - t0
    db.close()
    return {"seconds": seconds, "writes": writes}


def same_contents(a: Path, b: Path) -> bool:
    da, db = Rdict(str(a), Options(raw_mode=True)), Rdict(str(b), Options(raw_mode=True))
    try:
        ia, ib = dict(da.items()), dict(db.items())
        if ia != ib:
            diff = [k for k in ia.keys() | ib.keys() if ia.get(k) != ib.get(k)]
            print(f"stores differ at {len(diff)} keys, e.g. {[(k, ia.get(k), ib.get(k)) for k in diff[:3]]}")
        return ia == ib
    finally:
        da.close()
        db.close()


def main() -> None:
    p = E.arg_parser(__doc__.splitlines()[0], 1_000_000)
    E.add_catalog_args(p)
    p.add_argument("--profile", action="store_true", help="print a cProfile of the projection phase")
    args = p.parse_args()
    bootstrap, cluster = E.bootstrap(), E.cluster_name()
    topic = f"{cluster}.config.events"
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-bench-replay-"))
    E.check_encoding()
    print(
        f"replay benchmark: {args.n:_} events ({args.collections} collections of {args.chunks} chunks), "
        f"topic {topic}, stores under {tmp}"
    )
    try:
        asyncio.run(E.create_events_topic(bootstrap, topic))
        events = E.catalog_events(args.n, collections=args.collections, chunks=args.chunks)
        n, t_prod = asyncio.run(E.produce(bootstrap, topic, events))
        print(f"produced {n:_} events in {t_prod:.1f}s ({E.rate(n, t_prod):,.0f}/s, transactions of 10k)")

        proj = asyncio.run(project(bootstrap, topic, tmp / "projection", args.profile))
        if proj["skipped"]:
            raise SystemExit(f"projection skipped {proj['skipped']} undecodable events")
        proj_rate = E.rate(n, proj["seconds"])
        print(
            f"(a) projection start+catch_up: {n:_} events in {proj['seconds']:.2f}s = {proj_rate:,.0f} events/s "
            f"({proj['batches']:_} write batches, position {proj['position']:_}, {proj['chunks']} chunks)"
        )

        br = asyncio.run(instrumented_pass(bootstrap, topic, tmp / "instrumented"))
        if br["position"] != proj["position"]:
            raise SystemExit(f"instrumented pass reached {br['position']}, the projection {proj['position']}")
        raw = raw_ingest(tmp / "raw", br["captured"])
        raw_rate = E.rate(n, raw["seconds"])
        identical = same_contents(tmp / "projection", tmp / "raw")
        print(
            f"(b) raw rocksdict WriteBatch ingest of the same {len(br['captured']):_} batches "
            f"({raw['writes']:_} puts/deletes): {raw['seconds']:.2f}s = {raw_rate:,.0f} events/s "
            f"({E.rate(raw['writes'], raw['seconds']):,.0f} writes/s); stores identical: {identical}"
        )
        stream = raw_ingest(tmp / "raw-stream", br["streamed"])
        stream_rate = E.rate(n, stream["seconds"])
        print(
            f"(b') raw ingest of every event's writes, no collapsing within a batch ({stream['writes']:_} "
            f"puts/deletes, same batches): {stream['seconds']:.2f}s = {stream_rate:,.0f} events/s "
            f"({E.rate(stream['writes'], stream['seconds']):,.0f} writes/s)"
        )
        ratio = proj_rate / raw_rate
        print(
            f"ratio projection / raw = {ratio:.4f} (the projection runs at {ratio:.2%} of raw RocksDB speed); "
            f"against the uncollapsed stream: {proj_rate / stream_rate:.4f}"
        )
        write_est = raw["seconds"]
        print(f"where the time goes (instrumented pass {br['total']:.2f}s + raw write {write_est:.2f}s):")
        for what, s in (
            ("Kafka fetch, parsing, loop", br["fetch"]),
            ("decode (JSON + pydantic)", br["decode"]),
            ("Catalog.apply + drain_changes", br["apply"]),
            ("RocksDB write batches", write_est),
        ):
            print(f"  {what:32s} {s:7.2f}s  {E.rate(n, s):>12,.0f} events/s")
        E.result_line(
            "replay",
            events=n,
            collections=args.collections,
            chunks_per_collection=args.chunks,
            produce_s=round(t_prod, 3),
            projection_s=round(proj["seconds"], 3),
            projection_eps=round(proj_rate),
            raw_rocksdb_s=round(raw["seconds"], 3),
            raw_rocksdb_eps=round(raw_rate),
            raw_writes=raw["writes"],
            write_batches=proj["batches"],
            ratio_projection_over_raw=round(ratio, 5),
            raw_stream_s=round(stream["seconds"], 3),
            raw_stream_eps=round(stream_rate),
            raw_stream_writes=stream["writes"],
            ratio_projection_over_raw_stream=round(proj_rate / stream_rate, 5),
            breakdown_s={
                "fetch": round(br["fetch"], 3),
                "decode": round(br["decode"], 3),
                "apply": round(br["apply"], 3),
                "rocksdb_write": round(write_est, 3),
            },
            decode_only_eps=round(E.rate(n, br["decode"])),
            stores_identical=identical,
        )
    finally:
        E.delete_topics(bootstrap, [topic])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
