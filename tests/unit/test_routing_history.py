"""The historical routing table (seed 001; issue 32 §2): for random splits, merges, migrations,
renames and history windows, the routing table a collection gives for any cluster time T since
its `history_from` equals the routing table of a catalog folded up to T; and `config.chunks`'
history of each chunk names, newest first, the migrations that brought its range to its shard."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.catalog import Catalog, Collection, merge_adjacent
from schemas import config as ev
from tests.unit.test_catalog_replay import random_log

BASE = 1_800_000_000


def ranges(coll: Collection) -> list[tuple[bytes, bytes, str]]:
    return merged([(c.min_key, c.max_key, c.shard) for c in coll.chunks])


merged = merge_adjacent


def stamped_log(seed: int, steps: int) -> list[Any]:
    """random_log, each event one second after the last, every migration's donor the chunk's
    owner (random_log names "a" whatever the owner), cut before the first merge of chunks on
    different shards (which random_log makes, and a MergeChunks decision refuses)."""
    events = random_log(random.Random(seed), steps)
    probe = Catalog(track_changes=False)
    out = []
    for i, e in enumerate(events):
        e = e.model_copy(update={"ts": (BASE + i) << 32})
        if isinstance(e, ev.MigrationCommitted):
            coll = probe.collections[e.ns]
            moved = coll.chunks[coll.chunk_index(coll.pattern.encode_bound(_bound(e.chunks[0].min)))]
            e = e.model_copy(update={"donor": moved.shard})
        if isinstance(e, ev.ChunksMerged):
            coll = probe.collections[e.ns]
            lo = coll.pattern.encode_bound(_bound(e.chunk.min))
            hi = coll.pattern.encode_bound(_bound(e.chunk.max))
            if len({c.shard for c in coll.chunks if lo <= c.min_key and c.max_key <= hi}) > 1:
                break
        probe.apply(e, i)
        out.append(e)
    return out


def _bound(doc: dict[str, Any]) -> dict[str, Any]:
    from domain.shardkey import from_ejson

    return from_ejson(doc)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), steps=st.integers(1, 80), window=st.sampled_from([0, 5, 30, 300]))
def test_the_routing_table_at_any_remembered_time_is_the_catalog_folded_up_to_it(seed, steps, window):
    events = stamped_log(seed, steps)
    now = Catalog(track_changes=False)
    now.settings = now.settings.model_copy(update={"minSnapshotHistoryWindowInSeconds": window})
    for i, e in enumerate(events):
        now.apply(e, i)
    then = Catalog(track_changes=False)
    for i, e in enumerate(events):
        then.apply(e, i)
        at = e.ts
        upto_next = events[i + 1].ts - 1 if i + 1 < len(events) else at
        for t in {at, upto_next}:  # the table holds from one event until the next
            for ns, coll in now.collections.items():
                if t < coll.history_from or ns not in then.collections:
                    continue
                assert merged(coll.routing_at(t)) == ranges(then.collections[ns]), (ns, t >> 32, window)
                for ch in then.collections[ns].chunks:
                    assert coll.owner_at(ch.min_key, t) == ch.shard


def test_chunk_history_names_each_migration_newest_first_and_forgets_past_the_window():
    coll_ts = BASE << 32
    cat = Catalog(track_changes=False)
    cat.settings = cat.settings.model_copy(update={"minSnapshotHistoryWindowInSeconds": 100})
    doc = ev.ChunkDoc(min={"x": {"$minKey": 1}}, max={"x": {"$maxKey": 1}}, shard="a", version=(1, 0))
    cat.apply(ev.ShardAdded(shard="a"), 0)
    cat.apply(ev.ShardAdded(shard="b"), 1)
    cat.apply(
        ev.CollectionSharded(ns="d.c", key={"x": 1}, unique=False, epoch="e" * 24, uuid="u", chunks=[doc], ts=coll_ts),
        2,
    )

    def move(to: str, frm: str, secs: int, version: int) -> None:
        moved = doc.model_copy(update={"shard": to, "version": (version, 0)})
        cat.apply(
            ev.MigrationCommitted(
                id=f"m{secs}", ns="d.c", epoch="e" * 24, donor=frm, recipient=to, chunks=[moved], ts=(BASE + secs) << 32
            ),
            3,
        )

    move("b", "a", 10, 2)
    move("a", "b", 20, 3)
    coll = cat.collections["d.c"]
    ch = coll.chunks[0]
    assert coll.chunk_history(ch) == [((BASE + 20) << 32, "a"), ((BASE + 10) << 32, "b"), (coll_ts, "a")]
    assert coll.owner_at(ch.min_key, (BASE + 15) << 32) == "b" and coll.owner_at(ch.min_key, coll_ts) == "a"
    move("b", "a", 115, 4)  # the move at +10 is now past the 100 s window: forgotten
    ch = coll.chunks[0]
    assert coll.chunk_history(ch) == [((BASE + 115) << 32, "b"), ((BASE + 20) << 32, "a"), ((BASE + 10) << 32, "b")]
    assert coll.history_from == (BASE + 10) << 32


def test_a_merged_chunk_is_whole_on_its_shard_only_since_its_last_part_arrived():
    cat = Catalog(track_changes=False)
    for sid in ("a", "b"):
        cat.apply(ev.ShardAdded(shard=sid), 0)
    whole = ev.ChunkDoc(min={"x": {"$minKey": 1}}, max={"x": {"$maxKey": 1}}, shard="a", version=(1, 0))
    cat.apply(
        ev.CollectionSharded(
            ns="d.c", key={"x": 1}, unique=False, epoch="e" * 24, uuid="u", chunks=[whole], ts=BASE << 32
        ),
        1,
    )
    lo = whole.model_copy(update={"max": {"x": 10}, "version": (1, 1)})
    hi = whole.model_copy(update={"min": {"x": 10}, "version": (1, 2)})
    cat.apply(ev.ChunkSplit(ns="d.c", epoch="e" * 24, min=whole.min, max=whole.max, chunks=[lo, hi]), 2)
    for i, (doc, secs) in enumerate(((lo, 5), (hi, 9))):
        moved = doc.model_copy(update={"shard": "b", "version": (2 + i, 0)})
        cat.apply(
            ev.MigrationCommitted(
                id=f"m{i}", ns="d.c", epoch="e" * 24, donor="a", recipient="b", chunks=[moved], ts=(BASE + secs) << 32
            ),
            3,
        )
    merged = whole.model_copy(update={"shard": "b", "version": (3, 1)})
    cat.apply(ev.ChunksMerged(ns="d.c", epoch="e" * 24, chunk=merged, ts=(BASE + 12) << 32), 4)
    coll = cat.collections["d.c"]
    assert coll.chunk_history(coll.chunks[0]) == [((BASE + 9) << 32, "b")]
    assert coll.owner_at(coll.chunks[0].min_key, (BASE + 7) << 32) == "b"
    assert coll.owner_at(coll.pattern.encode_bound({"x": 10}), (BASE + 7) << 32) == "a"


def test_a_drop_rename_or_primary_move_sets_the_oldest_time_a_snapshot_read_may_ask_for():
    from schemas import ddl as dd

    cat = Catalog(track_changes=False)
    cat.apply(ev.ShardAdded(shard="a"), 0)
    cat.apply(ev.ShardAdded(shard="b"), 1)
    cat.apply(ev.DatabaseCreated(db="d", primary="a", uuid="00000000-0000-4000-8000-000000000000", lastMod=1), 2)
    assert cat.snapshot_floor("d.c") == 0
    cat.apply(dd.CollectionRenamed(ns="d.c", to="d.r", ts=(BASE + 5) << 32), 3)
    assert cat.snapshot_floor("d.c") == cat.snapshot_floor("d.r") == (BASE + 5) << 32
    cat.apply(ev.PrimaryMoved(id="p", db="d", primary="b", lastMod=2, ts=(BASE + 9) << 32), 4)
    assert cat.snapshot_floor("d.other") == (BASE + 9) << 32 and cat.snapshot_floor("e.x") == 0
    cat.apply(dd.CollectionDropped(ns="d.r", ts=(BASE + 12) << 32), 5)
    assert cat.snapshot_floor("d.r") == (BASE + 12) << 32 and cat.snapshot_floor("d.c") == (BASE + 9) << 32
