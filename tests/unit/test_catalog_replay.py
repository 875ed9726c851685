"""The catalog's replay fast paths (docs: `Catalog` and `chunk_json` in domain/catalog.py) fold a
log exactly as parsing and serialising every event's chunks does: the same writes, byte for
byte, batch by batch, the same store, and the same catalog, whatever JSON the bounds are
written in (ints, doubles that equal them, $numberLong, big ints, strings, compound keys,
MinKey/MaxKey as 1 or 1.0, BSON values in events applied in-process)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import bson
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.catalog import Catalog, Chunk, chunk_json
from domain.shardkey import MAX_KEY, MIN_KEY, encode_value, from_ejson
from libs.store import Checkpoint, Store
from schemas import Codec
from schemas import config as ev
from schemas import ddl as dd


class ParseEveryEvent(Catalog):
    """The reference: every event's chunks parsed from their documents and serialised as they come."""

    fast_fold = False


SHARDS = ["a", "b", "c", "sh\u00e9", 'q"t']
INTS = sorted({-(2**63), -(2**60), -(2**53) - 1, -1000, -3, -1, 0, 1, 2, 7, 1000, 2**53, 2**53 + 1, 2**63 - 1})
STRS = sorted(["", "a", "ab", "b", 'q"', "z\\", "\u00e9t\u00e9", "\x01"], key=lambda s: s.encode())


def int_form(rng: random.Random, v: int) -> Any:
    """One way a log may write the int v: mostly as itself."""
    r = rng.random()
    if r < 0.8:
        return v
    if r < 0.87 and -(2**53) <= v <= 2**53:
        return float(v)  # the same key, another value (a double)
    if r < 0.94:
        return {"$numberLong": str(v)}
    return bson.Int64(v)  # only an in-process event holds one (the log writes $numberLong)


def sentinel_form(rng: random.Random, which: str) -> Any:
    r = rng.random()
    if r < 0.8:
        return {which: 1}
    if r < 0.9:
        return {which: 1.0}
    return MIN_KEY if which == "$minKey" else MAX_KEY


class Coll:
    """A model of one collection's chunks: its boundaries (None: MinKey / MaxKey at the ends)."""

    def __init__(self, ns: str, fields: tuple[str, ...], values: list[Any], epoch: str) -> None:
        self.ns, self.fields, self.values, self.epoch = ns, fields, values, epoch
        self.bounds: list[Any] = [None, None]  # [MinKey, ..., MaxKey]
        self.shards = ["a"]
        self.major, self.minor = 1, 0

    def form(self, rng: random.Random, i: int) -> dict[str, Any]:
        """Boundary i as a bound document, in a random form."""
        v = self.bounds[i]
        if v is None:
            which = "$minKey" if i == 0 else "$maxKey"
            return {f: sentinel_form(rng, which) for f in self.fields}
        if len(self.fields) == 2:
            return {self.fields[0]: int_form(rng, v[0]), self.fields[1]: int_form(rng, v[1])}
        return {self.fields[0]: int_form(rng, v) if isinstance(v, int) else v}

    def key(self, v: Any) -> bytes:
        return b"".join(encode_value(x) for x in (v if isinstance(v, tuple) else (v,)))

    def doc(self, rng: random.Random, i: int, j: int, shard: str, version: tuple[int, int]) -> ev.ChunkDoc:
        return ev.ChunkDoc(
            min=self.form(rng, i), max=self.form(rng, j), shard=shard, version=version, jumbo=rng.random() < 0.05
        )


def collections() -> list[Coll]:
    return [
        Coll("d.r", ("x",), INTS, "e0000000000000000000000r"),
        Coll("d.s", ("s",), STRS, "e0000000000000000000000s"),
        Coll("d.c", ("a", "b"), [(a, b) for a in (-1, 0, 5) for b in (-2, 0, 3)], "e0000000000000000000000c"),
    ]


def random_log(rng: random.Random, steps: int) -> list[Any]:
    """A log that folds cleanly: shards, a database, three sharded collections, then random
    splits (2 or 3 pieces), merges, migrations, jumbo marks and renames."""
    events: list[Any] = [ev.ShardAdded(shard=s) for s in SHARDS]
    events.append(ev.DatabaseCreated(db="d", primary="a", uuid="00000000-0000-4000-8000-000000000000", lastMod=1))
    colls = collections()
    for c in colls:
        events.append(
            ev.CollectionSharded(
                ns=c.ns,
                key={f: 1 for f in c.fields},
                unique=False,
                epoch=c.epoch,
                uuid=f"00000000-0000-4000-8000-00000000000{len(events) % 10}",
                chunks=[c.doc(rng, 0, 1, "a", (1, 0))],
            )
        )
    for step in range(steps):
        c = rng.choice(colls)
        n = len(c.bounds) - 1
        kind = rng.choice(["split", "split", "split", "merge", "merge", "move", "jumbo", "rename"])
        i = rng.randrange(n)
        if kind == "split":
            lo, hi = c.bounds[i], c.bounds[i + 1]
            inside = [
                v for v in c.values if (lo is None or c.key(v) > c.key(lo)) and (hi is None or c.key(v) < c.key(hi))
            ]
            if not inside:
                continue
            points = sorted(rng.sample(inside, min(len(inside), rng.choice([1, 1, 1, 2]))), key=c.key)
            c.bounds[i + 1 : i + 1] = points
            c.shards[i + 1 : i + 1] = [c.shards[i]] * len(points)
            m = c.minor
            c.minor += len(points) + 1
            pieces = [c.doc(rng, i + k, i + k + 1, c.shards[i], (c.major, m + 1 + k)) for k in range(len(points) + 1)]
            if rng.random() < 0.1:  # a split point written two ways: the pieces must not share it
                pieces[1] = pieces[1].model_copy(update={"min": c.form(rng, i + 1)})
            events.append(ev.ChunkSplit(ns=c.ns, epoch=c.epoch, min=pieces[0].min, max=pieces[-1].max, chunks=pieces))
        elif kind == "merge" and n >= 2:
            i = min(i, n - 2)
            j = min(n, i + rng.choice([2, 2, 3]))
            c.minor += 1
            doc = c.doc(rng, i, j, c.shards[i], (c.major, c.minor))
            del c.bounds[i + 1 : j]
            del c.shards[i + 1 : j]
            events.append(ev.ChunksMerged(ns=c.ns, epoch=c.epoch, chunk=doc))
        elif kind == "move":
            to = rng.choice(SHARDS)
            c.major += 1
            c.minor = 0
            c.shards[i] = to
            events.append(
                ev.MigrationCommitted(
                    id=f"m{step}",
                    ns=c.ns,
                    epoch=c.epoch,
                    donor="a",
                    recipient=to,
                    chunks=[c.doc(rng, i, i + 1, to, (c.major, 0))],
                )
            )
        elif kind == "jumbo":
            events.append(ev.ChunkMarkedJumbo(ns=c.ns, epoch=c.epoch, min=c.form(rng, i)))
        elif kind == "rename":
            to = c.ns + "x" if not c.ns.endswith("x") else c.ns[:-1]
            c.epoch = c.epoch[:-1] + ("y" if c.epoch[-1] != "y" else "z")
            events.append(dd.CollectionRenamed(ns=c.ns, to=to, epoch=c.epoch))
            c.ns = to
    return events


def state(cat: Catalog) -> dict[str, Any]:
    """Every chunk as deeply as the catalog holds it (bound values with their types), versions read."""
    out: dict[str, Any] = {}
    for ns, coll in cat.collections.items():
        out[ns] = {
            "chunks": [
                (
                    repr(ch.min),
                    repr(ch.max),
                    ch.min_key,
                    ch.max_key,
                    ch.shard,
                    ch.version,
                    ch.jumbo,
                    chunk_json(ch),
                    ch.doc().model_dump_json(),
                )
                for ch in coll.chunks
            ],
            "mins": list(coll.mins),
            "epoch": coll.epoch,
            "version": coll.version(),
            "shard_versions": {s: coll.shard_version(s) for s in SHARDS},
        }
    out["outcomes"] = dict(cat.outcomes)
    return out


def contents(store: Store) -> dict[bytes, bytes]:
    return dict(store.scan(b""))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 150), batch=st.integers(1, 40))
def test_the_fast_fold_writes_and_holds_what_parsing_every_event_does(seed, steps, batch):
    rng = random.Random(seed)
    fast, ref = Catalog(), ParseEveryEvent()
    with tempfile.TemporaryDirectory() as tmp:
        fold_both(rng, steps, batch, fast, ref, Path(tmp))


def fold_both(rng: random.Random, steps: int, batch: int, fast: Catalog, ref: Catalog, tmp: Path) -> None:
    stores = Store(tmp / "fast"), Store(tmp / "ref")
    try:
        for offset, e in enumerate(random_log(rng, steps)):
            if rng.random() < 0.8:  # as replayed: through the log's bytes; else in-process, as decided
                e = ev.events.decode(Codec.encode(e))
            fast.apply(e, offset)
            ref.apply(e, offset)
            if rng.randrange(batch) == 0 or offset % 97 == 0:
                ckpt = Checkpoint("config.events", 0, offset + 1)
                changes = fast.drain_changes(), ref.drain_changes()
                assert changes[0] == changes[1]
                for store, ch in zip(stores, changes):
                    store.commit(ch.items(), ckpt)
                assert state(fast) == state(ref)
        changes = fast.drain_changes(), ref.drain_changes()
        assert changes[0] == changes[1]
        assert all(type(v) is bytes or v is None for v in changes[0].values())
        for store, ch in zip(stores, changes):
            store.commit(ch.items(), Checkpoint("config.events", 0, fast.config_time))
        assert state(fast) == state(ref)
        assert contents(stores[0]) == contents(stores[1])
        loaded = Catalog()
        loaded.load(stores[0])
        assert state(loaded) == state(fast)
    finally:
        for store in stores:
            store.close()


def chunk(lo: Any, hi: Any, shard: str, pair: tuple[int, int], jumbo: bool) -> Chunk:
    lo_v, hi_v = from_ejson(lo), from_ejson(hi)
    return Chunk.folded(lo_v, hi_v, b"", b"", shard, pair, "e", jumbo, lo, hi)


bound_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.just({"$minKey": 1}),
    st.just({"$maxKey": 1}),
    st.just({"$minKey": 1.0}),
    st.builds(lambda v: {"$numberLong": str(v)}, st.integers(-(2**63), 2**63 - 1)),
    st.booleans(),
    st.none(),
)
bounds = st.dictionaries(
    st.text(min_size=1, max_size=3).filter(lambda s: not s.startswith("$")), bound_values, min_size=1, max_size=2
)


@given(bounds, bounds, st.text(max_size=6), st.integers(0, 2**40), st.integers(0, 2**40), st.booleans())
def test_chunk_json_is_model_dump_json_byte_for_byte(lo, hi, shard, major, minor, jumbo):
    ch = chunk(lo, hi, shard, (major, minor), jumbo)
    assert (
        chunk_json(ch)
        == ev.ChunkDoc(min=lo, max=hi, shard=shard, version=(major, minor), jumbo=jumbo).model_dump_json().encode()
    )
    ch.min_doc = ch.max_doc = None  # bounds known only parsed: written as doc() writes them
    assert chunk_json(ch) == ch.doc().model_dump_json().encode()


@given(
    st.text(max_size=3),
    st.integers(-(2**70), 2**70),
    st.integers(-(2**70), 2**70),
    st.text(max_size=6),
    st.integers(0, 2**40),
    st.booleans(),
)
def test_chunk_json_of_int_bounds_on_one_field_is_model_dump_json(name, lo, hi, shard, minor, jumbo):
    """The usual chunk of a range-sharded replay ({field: int} bounds), which chunk_json writes inline."""
    ch = chunk({name: lo}, {name: hi}, shard, (1, minor), jumbo)
    expected = ev.ChunkDoc(min={name: lo}, max={name: hi}, shard=shard, version=(1, minor), jumbo=jumbo)
    assert chunk_json(ch) == expected.model_dump_json().encode()
