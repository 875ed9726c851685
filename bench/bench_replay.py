"""Replay: events/s folding a catalog-like config.events log into RocksDB.

(a) the real path: `Projection(..., Catalog(), Store)` start + catch_up from an
    empty store — Kafka fetch (read_committed), JSON + pydantic decode,
    `Catalog.apply`, and one RocksDB write batch per fetched batch with the
    checkpoint in it;
(b) the baseline: the very same write batches (keys, values, deletes and
    checkpoints, captured by folding the same events in memory) written with
    raw rocksdict into a fresh database;
(c) the replay target's baseline: the same `Projection` loop over the same log
    with a state that only counts the decoded events (fetch + decode, nothing
    folded), run before and after (a); fold rate / the faster of the two is the
    ratio issue 17 asks to be >= 0.7 (the fold is then not the bottleneck).

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

from domain.catalog import Catalog, chunk_json
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


class DecodeOnly:
    """A projection state that folds nothing: it counts the events the projection decoded."""

    def __init__(self) -> None:
        self.events = 0

    def load(self, store: Store) -> None:
        pass

    def apply(self, event, offset: int) -> None:
        self.events += 1

    def drain_changes(self) -> dict[bytes, bytes | None]:
        return {}


async def decode_pass(bootstrap: str, topic: str, path: Path) -> dict:
    """Fetch + decode only: the real Projection (its fetch loop, codec and per-batch checkpoint
    write) with `DecodeOnly` as its state."""
    store, state = Store(path), DecodeOnly()
    seconds, position, skipped = await E.timed_replay(bootstrap, topic, state, store, "bench-replay-decode")
    store.close()
    return {"seconds": seconds, "position": position, "events": state.events, "skipped": skipped}


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


class RecordingChanges(dict):
    """A catalog's pending changes (or one namespace's chunk writes, keyed by min_key under
    `prefix`) that also keep every write, in order, before a batch's writes to one key collapse
    into one: whichever method of the catalog writes them."""

    def __init__(self, owner: TimedCatalog, prefix: bytes = b"") -> None:
        super().__init__()
        self.owner, self.prefix = owner, prefix

    def __setitem__(self, key: bytes, value) -> None:
        if self.owner.recording:  # off while drained: drain_changes writes serialised chunks
            self.owner.stream.append((self.prefix + key, value))
        super().__setitem__(key, value)


class TimedCatalog(Catalog):
    """Times apply + drain_changes, and keeps every write of every event (for the second
    baseline)."""

    def __init__(self, track_changes: bool = True, clock=None):
        super().__init__(track_changes, clock)
        self.seconds = 0.0
        self.stream: list[tuple[bytes, object]] = []
        self.recording = True
        self._changes = RecordingChanges(self)

    def _chunk_writes(self, ns: str):
        pending = self._chunk_changes.get(ns)
        if pending is None:
            pending = self._chunk_changes[ns] = RecordingChanges(self, self._chunk_key(ns, b""))
        return pending

    def apply(self, event, offset: int) -> None:
        t = time.perf_counter()
        super().apply(event, offset)
        self.seconds += time.perf_counter() - t

    def drain_changes(self):
        self.recording = False
        t = time.perf_counter()
        out = super().drain_changes()
        self.seconds += time.perf_counter() - t
        self._changes = RecordingChanges(self)
        self.recording = True
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
        # A chunk write is kept as the chunk (serialised once per batch by drain_changes): as bytes here.
        streamed.append(
            ([(k, v if v is None or type(v) is bytes else chunk_json(v)) for k, v in catalog.stream], key, value)
        )
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

        decoded = [asyncio.run(decode_pass(bootstrap, topic, tmp / "decode-before"))]
        proj = asyncio.run(project(bootstrap, topic, tmp / "projection", args.profile))
        if proj["skipped"]:
            raise SystemExit(f"projection skipped {proj['skipped']} undecodable events")
        decoded.append(asyncio.run(decode_pass(bootstrap, topic, tmp / "decode-after")))
        for d in decoded:
            if d["events"] != n or d["skipped"] or d["position"] != proj["position"]:
                raise SystemExit(
                    f"the decode-only pass decoded {d['events']:_} of {n:_} events ({d['skipped']} skipped), "
                    f"reached {d['position']:_}, the projection {proj['position']:_}"
                )
        proj_rate = E.rate(n, proj["seconds"])
        print(
            f"(a) projection start+catch_up: {n:_} events in {proj['seconds']:.2f}s = {proj_rate:,.0f} events/s "
            f"({proj['batches']:_} write batches, position {proj['position']:_}, {proj['chunks']} chunks)"
        )
        fetch_decode_s = min(d["seconds"] for d in decoded)
        fetch_decode_rate = E.rate(n, fetch_decode_s)
        fold_ratio = proj_rate / fetch_decode_rate
        print(
            f"(c) the same Projection, fetch + decode only (nothing folded): "
            f"{' / '.join(format(d['seconds'], '.2f') + 's' for d in decoded)} before / after (a) = "
            f"{fetch_decode_rate:,.0f} events/s (the faster)\n"
            f"ratio fold / fetch+decode = {fold_ratio:.3f}  "
            f"(folding costs {(proj['seconds'] - fetch_decode_s) / n * 1e6:.2f} µs/event on top of "
            f"{fetch_decode_s / n * 1e6:.2f} µs/event fetch + decode)"
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
            fetch_decode_s=[round(d["seconds"], 3) for d in decoded],
            fetch_decode_eps=round(fetch_decode_rate),
            ratio_fold_over_fetch_decode=round(fold_ratio, 4),
            stores_identical=identical,
        )
    finally:
        E.delete_topics(bootstrap, [topic])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
