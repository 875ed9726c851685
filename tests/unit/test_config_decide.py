"""services.config.decide on an in-memory catalog: every config command, its events,
its reply, and its refusals — each refusal with its code, a helpful message, and the
catalog left exactly as it was.  Plus persistence round-trips through a real Store
and a stateful test of random splits and merges.  No Kafka.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cli.status import status_document
from domain.catalog import Catalog
from domain.settings import MB, ClusterSettings, CollectionSettings
from domain.shardkey import INT64_MAX, INT64_MIN, MAX_KEY, MIN_KEY, to_ejson
from domain.versions import hashed_split_points, moved_primary, new_epoch, new_uuid
from libs.errors import CommandError
from libs.store import Checkpoint, Store
from schemas import Codec
from schemas import config as c
from services.config.decide import MAX_INITIAL_CHUNKS_PER_SHARD, decide

MINK, MAXK = {"$minKey": 1}, {"$maxKey": 1}


# ------------------------------------------------------------------ helpers


def snapshot(cat: Catalog) -> dict:
    """Everything the catalog holds, deeply, including the entity writes not yet drained."""
    colls = {}
    for ns, coll in cat.collections.items():
        colls[ns] = {
            "key": coll.pattern.spec,
            "unique": coll.unique,
            "epoch": coll.epoch,
            "uuid": coll.uuid,
            "chunks": [(ch.doc().model_dump(), ch.min_key, ch.max_key, ch.version) for ch in coll.chunks],
            "zones": [(z.zone, repr(z.min), repr(z.max), z.min_key, z.max_key) for z in coll.zones],
            "settings": coll.settings.model_dump(),
        }
    return {
        "shards": {k: (s.id, s.draining, sorted(s.zones)) for k, s in cat.shards.items()},
        "databases": {k: (d.name, d.primary, d.version) for k, d in cat.databases.items()},
        "collections": colls,
        "settings": cat.settings.model_dump(),
        "config_time": cat.config_time,
        "changes": dict(cat._changes),
    }


def run(cat: Catalog, cmd: c.Record):
    """Decide `cmd` and apply its events as the config server does: (events, result), or the
    CommandError — after checking the catalog is untouched."""
    before = snapshot(cat)
    try:
        d = decide(cat, cmd)
    except CommandError as e:
        assert snapshot(cat) == before, "a refused command changed the catalog"
        return e
    assert snapshot(cat) == before, "decide() mutated the catalog"
    json.dumps(d.result, allow_nan=False)  # replies travel as JSON
    for e in d.events:
        # The config server applies the event it decided; followers apply what config.events says.
        assert c.events.decode(Codec.encode(e)) == e, f"{e!r} does not survive the event log"
        cat.apply(e, cat.config_time)
    return d.events, d.result


def ok(cat: Catalog, cmd: c.Record):
    r = run(cat, cmd)
    assert not isinstance(r, CommandError), f"{cmd!r} refused: {r.code}: {r.message}"
    return r


def refused(cat: Catalog, cmd: c.Record, code: str, *fragments: str) -> CommandError:
    r = run(cat, cmd)
    assert isinstance(r, CommandError), f"{cmd!r} was accepted: {r}"
    assert r.code == code, (r.code, r.message)
    for f in fragments:
        assert f in r.message, (f, r.message)
    return r


def catalog(*shards: str) -> Catalog:
    cat = Catalog(track_changes=True)
    for s in shards:
        ok(cat, c.AddShard(shard=s))
    return cat


def chunks(cat: Catalog, ns: str) -> list[tuple]:
    """(min, max, shard, version) of each chunk, bounds in Extended JSON."""
    return [(d.min, d.max, d.shard, d.version) for d in (ch.doc() for ch in cat.collections[ns].chunks)]


def check_chunk_invariants(cat: Catalog, ns: str) -> None:
    coll = cat.collections[ns]
    cs = coll.chunks
    assert cs, "a collection has at least one chunk"
    assert cs[0].min_key == coll.pattern.encode_bound(coll.pattern.global_min())
    assert cs[-1].max_key == coll.pattern.encode_bound(coll.pattern.global_max())
    for a, b in zip(cs, cs[1:]):
        assert a.max_key == b.min_key and a.max == b.min  # contiguous, hence sorted
    assert all(ch.min_key < ch.max_key for ch in cs)
    assert len({ch.version.pair for ch in cs}) == len(cs)  # unique versions
    assert all(ch.version.epoch == coll.epoch for ch in cs)
    assert all(ch.shard in cat.shards for ch in cs)


# ------------------------------------------------------- tracked collections


def test_a_collection_written_to_before_sharding_starts_as_one_chunk_on_its_primary():
    cat = catalog("a", "b", "c")
    events, result = ok(cat, c.CreateCollection(ns="d.x"))
    assert [e.type for e in events] == ["DatabaseCreated", "CollectionCreated"] and result["created"]
    assert "d.x" in cat.databases["d"].collections
    assert ok(cat, c.CreateCollection(ns="d.x")) == ([], {"ns": "d.x", "created": False})  # idempotent
    refused(cat, c.ShardCollection(ns="d.x", key={"k": "hashed"}, numInitialChunks=6), "InvalidOptions", "empty")
    _, result = ok(cat, c.ShardCollection(ns="d.x", key={"k": "hashed"}))
    coll = cat.collections["d.x"]
    assert result["existing"] and len(coll.chunks) == 1
    assert coll.chunks[0].shard == cat.databases["d"].primary  # where the documents already are
    assert "d.x" not in cat.databases["d"].collections  # tracked as sharded now
    _, result = ok(cat, c.ShardCollection(ns="d.fresh", key={"k": "hashed"}))  # never written: presplit
    assert not result["existing"] and len({ch.shard for ch in cat.collections["d.fresh"].chunks}) == 3


# --------------------------------------------------------------- dispatch


def test_every_command_has_a_decision():
    cat = catalog("a", "b")
    samples = {
        c.AddShard: c.AddShard(shard="c"),
        c.RemoveShard: c.RemoveShard(shard="c"),
        c.CreateDatabase: c.CreateDatabase(db="d"),
        c.CreateCollection: c.CreateCollection(ns="d.plain"),
        c.ShardCollection: c.ShardCollection(ns="d.x", key={"k": 1}),
        c.SplitChunk: c.SplitChunk(ns="d.x", at=[{"k": 10}]),
        c.MergeChunks: c.MergeChunks(ns="d.x", min={"k": MINK}, max={"k": MAXK}),
        c.AddShardToZone: c.AddShardToZone(shard="a", zone="z"),
        c.AssignZoneRange: c.AssignZoneRange(ns="d.x", min={"k": 0}, max={"k": 5}, zone="z"),
        c.RemoveZoneRange: c.RemoveZoneRange(ns="d.x", min={"k": 0}, max={"k": 5}),
        c.RemoveShardFromZone: c.RemoveShardFromZone(shard="a", zone="z"),
        c.SetSetting: c.SetSetting(key="balancerEnabled", value=False),
        c.MoveRange: c.MoveRange(ns="d.x", min={"k": MINK}, to="b"),
        c.CommitMigration: None,  # needs the id of the migration above
        c.AbortMigration: None,
        c.GetMigration: c.GetMigration(),  # read-only
        c.MovePrimary: None,
        c.CommitPrimaryMove: None,
        c.AbortPrimaryMove: None,  # below
        c.MarkJumbo: c.MarkJumbo(ns="d.x", min={"k": MINK}),
        c.RotateClusterTimeKeys: c.RotateClusterTimeKeys(),  # makes the first two keys
        # The DDL coordinators' commands: tests/unit/test_ddl_coordinator.py
        c.DropCollection: None,
        c.DropDatabase: None,
        c.RenameCollection: None,
        c.RefineCollectionShardKey: None,
        c.CreateCollectionIndexes: None,  # tests/unit/test_index_ddl.py
        c.DropCollectionIndexes: None,
        c.AdvanceDDL: None,
        c.GetDDL: c.GetDDL(),
    }
    assert set(samples) == set(c.COMMANDS)
    for cmd in samples.values():
        if cmd is None:
            continue
        events, result = ok(cat, cmd)
        assert events or cmd.type in ("GetMigration", "GetDDL"), f"{cmd.type} decided nothing"
    (mid,) = cat.migrations
    events, _ = ok(cat, c.CommitMigration(id=mid, min={"k": MINK}, max={"k": MAXK}))
    assert events


# ------------------------------------------------------------- migrations


def moving(shards=("a", "b", "c"), primary="a"):
    cat = catalog(*shards)
    ok(cat, c.CreateDatabase(db="d", primary=primary))
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    ok(cat, c.SplitChunk(ns="d.x", at=[{"k": 0}, {"k": 100}]))
    return cat


def test_moving_a_whole_chunk_gives_it_the_next_major_and_the_donor_a_control_chunk():
    cat = moving()
    assert cat.collections["d.x"].version().pair == (1, 3)
    (e,), r = ok(cat, c.MoveRange(ns="d.x", min={"k": 0}, max={"k": 100}, to="b"))
    assert isinstance(e, c.MigrationRequested) and (e.donor, e.recipient) == ("a", "b") and r["id"] == e.id
    assert cat.migration_of("a").id == e.id and cat.migration_of("b").id == e.id
    events, r = ok(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 100}))
    assert [x.type for x in events] == ["MigrationCommitted"]
    assert chunks(cat, "d.x") == [
        ({"k": MINK}, {"k": 0}, "a", (2, 1)),
        ({"k": 0}, {"k": 100}, "b", (2, 0)),
        ({"k": 100}, {"k": MAXK}, "a", (1, 3)),
    ]
    coll = cat.collections["d.x"]
    assert coll.shard_version("b").pair == (2, 0) and coll.shard_version("a").pair == (2, 1)
    assert cat.migrations == {} and cat.outcomes[e.id] == "committed"
    assert ok(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 100})) == (
        [],
        {"id": e.id, "outcome": "committed"},
    )
    assert ok(cat, c.AbortMigration(id=e.id, reason="late"))[1]["outcome"] == "committed"  # recovery learns it moved


def test_the_donors_last_chunk_leaves_it_at_version_zero():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d", primary="a"))
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    (e,), _ = ok(cat, c.MoveRange(ns="d.x", min={"k": MINK}, to="b"))
    assert e.max is None
    ok(cat, c.CommitMigration(id=e.id, min={"k": MINK}, max={"k": MAXK}))
    coll = cat.collections["d.x"]
    assert chunks(cat, "d.x") == [({"k": MINK}, {"k": MAXK}, "b", (2, 0))]
    assert coll.shard_version("a").pair == (0, 0)


def test_a_sub_range_is_split_at_commit_then_moved():
    cat = moving()
    (e,), _ = ok(cat, c.MoveRange(ns="d.x", min={"k": 10}, max={"k": 20}, to="c"))
    events, _ = ok(cat, c.CommitMigration(id=e.id, min={"k": 10}, max={"k": 20}))
    assert [x.type for x in events] == ["ChunkSplit", "MigrationCommitted"]
    # split: (1,4) (1,5) (1,6); the piece moves at (2,0), the donor's control chunk (the first piece left) (2,1)
    assert chunks(cat, "d.x")[1:4] == [
        ({"k": 0}, {"k": 10}, "a", (2, 1)),
        ({"k": 10}, {"k": 20}, "c", (2, 0)),
        ({"k": 20}, {"k": 100}, "a", (1, 6)),
    ]
    # --min only: the donor chose where the range ends
    (e,), _ = ok(cat, c.MoveRange(ns="d.x", min={"k": 100}, to="b"))
    ok(cat, c.CommitMigration(id=e.id, min={"k": 100}, max={"k": 500}))
    # split of [100, max) at 500 after (2,1): (2,2) (2,3); moved (3,0), control (3,1)
    assert chunks(cat, "d.x")[-2:] == [({"k": 100}, {"k": 500}, "b", (3, 0)), ({"k": 500}, {"k": MAXK}, "a", (3, 1))]


def test_one_migration_per_shard_a_retry_joins_and_bad_requests_are_refused():
    cat = moving(("a", "b", "c", "d"))
    (e,), _ = ok(cat, c.MoveRange(ns="d.x", min={"k": 0}, max={"k": 100}, to="b"))
    assert ok(cat, c.MoveRange(ns="d.x", min={"k": 0}, max={"k": 100}, to="b"))[1]["joined"]
    refused(cat, c.MoveRange(ns="d.x", min={"k": 100}, to="c"), "ConflictingOperationInProgress", "one migration")
    refused(cat, c.SplitChunk(ns="d.x", at=[{"k": 50}]), "ConflictingOperationInProgress")
    refused(cat, c.MoveRange(ns="d.x", min={"k": -5}, max={"k": 5}, to="c"), "BadValue", "spans")
    refused(cat, c.MoveRange(ns="d.x", min={"k": 0}, max={"k": 100}, to="zz"), "ShardNotFound")
    refused(cat, c.MoveRange(ns="d.nope", min={"k": 0}, to="c"), "NamespaceNotFound")
    assert ok(cat, c.MoveRange(ns="d.x", min={"k": 100}, to="a"))[1]["moved"] is False  # already there
    refused(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 200}), "BadValue")
    refused(cat, c.CommitMigration(id="nope", min={"k": 0}, max={"k": 100}), "NoSuchMigration")
    events, r = ok(cat, c.AbortMigration(id=e.id, reason="test", jumbo=True))
    assert [x.type for x in events] == ["ChunkMarkedJumbo", "MigrationAborted"] and cat.outcomes[
        e.id
    ] == "aborted: test"
    assert cat.collections["d.x"].chunks[1].jumbo
    refused(cat, c.MoveRange(ns="d.x", min={"k": 0}, to="c"), "ChunkTooBig", "--force-jumbo")
    refused(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 100}), "NoSuchMigration", "aborted")
    ok(cat, c.SetSetting(ns="d.x", key="allowMigrations", value=False))
    refused(cat, c.MoveRange(ns="d.x", min={"k": 100}, to="c"), "ConflictingOperationInProgress", "not allowed")


def test_move_primary_bumps_the_database_version_and_counts_as_the_shards_migration():
    cat = moving()
    (e,), r = ok(cat, c.MovePrimary(db="d", to="b"))
    assert (e.donor, e.recipient) == ("a", "b") and cat.migrations[e.id].kind == "primary"
    assert ok(cat, c.MovePrimary(db="d", to="b"))[1]["joined"]
    refused(cat, c.MoveRange(ns="d.x", min={"k": 0}, to="c"), "ConflictingOperationInProgress")  # a is busy
    refused(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 100}), "BadValue", "primary move")
    before = cat.databases["d"].version
    events, _ = ok(cat, c.CommitPrimaryMove(id=e.id))
    db = cat.databases["d"]
    assert db.primary == "b" and db.version.uuid == before.uuid and db.version.last_mod == before.last_mod + 1
    assert cat.outcomes[e.id] == "committed" and not cat.migrations
    assert ok(cat, c.MovePrimary(db="d", to="b"))[1]["moved"] is False
    (e2,), _ = ok(cat, c.MovePrimary(db="d", to="c"))
    ok(cat, c.AbortMigration(id=e2.id, reason="test"))  # recovery aborts a primary move like any migration
    assert cat.databases["d"].primary == "b" and cat.outcomes[e2.id] == "aborted: test"
    refused(cat, c.MovePrimary(db="nope", to="b"), "NamespaceNotFound")


def test_disallowing_migrations_aborts_the_running_one_and_refuses_its_commit():
    """Issue 18, point 4: setAllowMigrations(false) ends a running migration at once (MongoDB's
    ConflictingOperationInProgress); the donor's late commit is refused and it finishes aborted."""
    cat = moving()
    (e,), _ = ok(cat, c.MoveRange(ns="d.x", min={"k": 0}, max={"k": 100}, to="b"))
    _, r = ok(cat, c.SetSetting(ns="d.x", key="allowMigrations", value=False))
    assert r["aborted"] == [e.id]
    assert ok(cat, c.GetMigration(ns="d.x"))[1]["active"] == []
    state = ok(cat, c.GetMigration(id=e.id))[1]
    assert state["code"] == "ConflictingOperationInProgress" and "setAllowMigrations" in state["reason"]
    refused(cat, c.CommitMigration(id=e.id, min={"k": 0}, max={"k": 100}), "NoSuchMigration")
    assert ok(cat, c.AbortMigration(id=e.id, reason="late"))[1]["outcome"].startswith("aborted")
    _, again = ok(cat, c.SetSetting(ns="d.x", key="allowMigrations", value=False))
    assert again["changed"] is False


def test_an_event_is_not_a_command():
    cat = catalog("a")
    refused(cat, c.ShardAdded(shard="b"), "CommandNotFound", "ShardAdded")


# ------------------------------------------------------------------ shards


def test_add_shard():
    cat = Catalog()
    events, result = ok(cat, c.AddShard(shard="rs-0_A"))
    assert events == [c.ShardAdded(shard="rs-0_A")]
    assert result == {"shardAdded": "rs-0_A"}
    assert cat.active_shards() == ["rs-0_A"] and cat.config_time == 1
    ok(cat, c.AddShard(shard="x" * 64))


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "s/1", "s.1", "é", "s$", "s\x00", "s1\n", "\ns1"])
def test_add_shard_invalid_name(name):
    cat = catalog("a")
    refused(cat, c.AddShard(shard=name), "BadValue", "invalid shard name", "1-64")


def test_add_shard_twice():
    cat = catalog("a")
    refused(cat, c.AddShard(shard="a"), "ShardAlreadyExists", "'a' already exists")


def test_remove_unknown_shard():
    cat = catalog("a", "b")
    refused(cat, c.RemoveShard(shard="zz"), "ShardNotFound", "'zz' does not exist")


def test_remove_the_last_shard_is_refused():
    cat = catalog("a")
    refused(cat, c.RemoveShard(shard="a"), "IllegalOperation", "last shard")
    ok(cat, c.CreateDatabase(db="d"))
    refused(cat, c.RemoveShard(shard="a"), "IllegalOperation", "last shard")


def test_remove_an_empty_shard_completes_at_once():
    cat = catalog("a", "b")
    events, result = ok(cat, c.RemoveShard(shard="b"))
    assert events == [c.ShardRemoved(shard="b")]
    assert result == {"state": "completed", "shard": "b"}
    assert list(cat.shards) == ["a"]
    refused(cat, c.RemoveShard(shard="b"), "ShardNotFound")


def test_remove_shard_drains_then_removes():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d1", primary="a"))
    ok(cat, c.CreateDatabase(db="d2", primary="b"))
    ok(cat, c.ShardCollection(ns="d1.h", key={"h": "hashed"}))  # 2 chunks on a, 2 on b

    events, result = ok(cat, c.RemoveShard(shard="b"))
    assert events == [c.ShardDraining(shard="b")]
    assert result == {"state": "started", "shard": "b", "remaining": {"chunks": 2, "dbs": ["d2"]}}
    assert cat.shards["b"].draining and cat.active_shards() == ["a"]

    # again: still ongoing, nothing decided
    events, result = ok(cat, c.RemoveShard(shard="b"))
    assert events == [] and result["state"] == "ongoing"
    assert result["remaining"] == {"chunks": 2, "dbs": ["d2"]}

    # a draining shard gets no new data
    assert ok(cat, c.CreateDatabase(db="d3"))[1]["primary"] == "a"
    ok(cat, c.ShardCollection(ns="d3.h", key={"h": "hashed"}))
    assert {ch[2] for ch in chunks(cat, "d3.h")} == {"a"}
    refused(cat, c.CreateDatabase(db="d4", primary="b"), "ShardNotFound", "draining")

    # the balancer's work, by hand: b's chunks move to a (a new incarnation), d2's primary moves
    coll = cat.collections["d1.h"]
    cat.apply(
        c.CollectionSharded(
            ns="d1.h",
            key=coll.pattern.spec,
            unique=False,
            epoch=new_epoch(),
            uuid=new_uuid(),
            chunks=[c.ChunkDoc(min={"h": MINK}, max={"h": MAXK}, shard="a", version=(1, 0))],
        ),
        cat.config_time,
    )
    assert ok(cat, c.RemoveShard(shard="b"))[1]["remaining"] == {"chunks": 0, "dbs": ["d2"]}
    d2 = cat.databases["d2"].version
    moved = moved_primary(d2)
    cat.apply(c.DatabaseCreated(db="d2", primary="a", uuid=moved.uuid, lastMod=moved.last_mod), cat.config_time)

    events, result = ok(cat, c.RemoveShard(shard="b"))
    assert events == [c.ShardRemoved(shard="b")] and result["state"] == "completed"
    assert list(cat.shards) == ["a"]


def test_draining_shard_with_no_other_shard_to_take_its_data():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="da", primary="a"))
    ok(cat, c.CreateDatabase(db="db", primary="b"))
    ok(cat, c.RemoveShard(shard="a"))  # draining
    refused(cat, c.RemoveShard(shard="b"), "IllegalOperation", "no other shard")


# --------------------------------------------------------------- databases


def test_create_database():
    cat = catalog("a")
    events, result = ok(cat, c.CreateDatabase(db="Sales-2024_x"))
    (e,) = events
    assert isinstance(e, c.DatabaseCreated) and e.primary == "a" and e.lastMod == 1
    assert result == {"db": "Sales-2024_x", "primary": "a", "created": True}
    d = cat.databases["Sales-2024_x"]
    assert d.primary == "a" and d.version.uuid == e.uuid and d.version.last_mod == 1
    ok(cat, c.CreateDatabase(db="x" * 63))


def test_primary_is_the_shard_with_the_least_data_ties_by_name():
    cat = catalog("c", "b", "a")
    assert ok(cat, c.CreateDatabase(db="d1"))[1]["primary"] == "a"  # all empty: by name
    assert ok(cat, c.CreateDatabase(db="d2"))[1]["primary"] == "b"  # a is primary of one
    assert ok(cat, c.CreateDatabase(db="d3"))[1]["primary"] == "c"
    ok(cat, c.ShardCollection(ns="d2.x", key={"k": 1}))  # one chunk on b
    ok(cat, c.ShardCollection(ns="d3.x", key={"k": 1}))  # one chunk on c
    # a: 0 chunks, 1 db; b and c: 1 chunk, 1 db -> a; then a: 0 chunks, 2 dbs -> still a (chunks first)
    assert ok(cat, c.CreateDatabase(db="d4"))[1]["primary"] == "a"
    assert ok(cat, c.CreateDatabase(db="d5"))[1]["primary"] == "a"


def test_create_database_with_explicit_primary():
    cat = catalog("a", "b")
    assert ok(cat, c.CreateDatabase(db="d", primary="b"))[0][0].primary == "b"
    refused(cat, c.CreateDatabase(db="e", primary="zz"), "ShardNotFound", "'zz'")


def test_create_database_twice():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d", primary="b"))
    for primary in (None, "b"):
        events, result = ok(cat, c.CreateDatabase(db="d", primary=primary))
        assert events == [] and result == {"db": "d", "primary": "b", "created": False}
    refused(cat, c.CreateDatabase(db="d", primary="a"), "NamespaceExists", "already exists", "'b'")


def test_create_database_without_shards():
    refused(Catalog(), c.CreateDatabase(db="d"), "ShardNotFound", "add-shard")


@pytest.mark.parametrize("db", ["admin", "config", "local"])
def test_reserved_databases(db):
    cat = catalog("a")
    refused(cat, c.CreateDatabase(db=db), "InvalidNamespace", "reserved")
    refused(cat, c.ShardCollection(ns=f"{db}.x", key={"k": 1}), "InvalidNamespace", "reserved")


@pytest.mark.parametrize(
    "db", ["", "a.b", "a b", "a$b", "a/b", "a\\b", 'a"b', "a*b", "a<b", "a>b", "a:b", "a|b", "a?b", "a\x00b", "x" * 64]
)
def test_invalid_database_names(db):
    cat = catalog("a")
    refused(cat, c.CreateDatabase(db=db), "InvalidNamespace", "invalid database name")


# ------------------------------------------------------------- collections


def test_shard_collection_range_key():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d", primary="b"))
    events, result = ok(cat, c.ShardCollection(ns="d.users", key={"user_id": 1}))
    (e,) = events
    assert isinstance(e, c.CollectionSharded) and e.key == {"user_id": 1} and not e.unique
    assert result == {"ns": "d.users", "epoch": e.epoch, "chunks": 1, "primary": "b", "existing": False}
    assert chunks(cat, "d.users") == [({"user_id": MINK}, {"user_id": MAXK}, "b", (1, 0))]
    coll = cat.collections["d.users"]
    assert coll.version().pair == (1, 0) and coll.epoch == e.epoch and coll.uuid == e.uuid
    assert coll.shard_version("b").pair == (1, 0) and coll.shard_version("a").pair == (0, 0)
    check_chunk_invariants(cat, "d.users")


def test_shard_collection_compound_and_unique():
    cat = catalog("a")
    _, result = ok(cat, c.ShardCollection(ns="d.x", key={"region": 1, "id": 1.0}, unique=True))
    assert result["chunks"] == 1
    assert chunks(cat, "d.x") == [({"region": MINK, "id": MINK}, {"region": MAXK, "id": MAXK}, "a", (1, 0))]
    coll = cat.collections["d.x"]
    assert coll.unique and coll.pattern.spec == {"region": 1, "id": 1}


def test_shard_collection_creates_its_database():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="other"))  # on a
    events, result = ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    assert [e.type for e in events] == ["DatabaseCreated", "CollectionSharded"]
    assert events[0].db == "d" and events[0].primary == "b" == result["primary"]
    assert cat.databases["d"].primary == "b" and chunks(cat, "d.x")[0][2] == "b"


def test_each_collection_gets_its_own_epoch():
    cat = catalog("a")
    e1 = ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))[1]["epoch"]
    e2 = ok(cat, c.ShardCollection(ns="d.y", key={"k": 1}))[1]["epoch"]
    assert e1 != e2 and cat.collections["d.x"].uuid != cat.collections["d.y"].uuid


def test_shard_collection_hashed_two_chunks_per_shard():
    cat = catalog("c", "a", "b")
    _, result = ok(cat, c.ShardCollection(ns="d.h", key={"_id": "hashed"}))
    assert result["chunks"] == 6
    points = hashed_split_points(6)
    bounds = [MINK, *points, MAXK]
    assert chunks(cat, "d.h") == [({"_id": bounds[i]}, {"_id": bounds[i + 1]}, "aabbcc"[i], (1, i)) for i in range(6)]
    assert cat.collections["d.h"].chunks_per_shard() == {"a": 2, "b": 2, "c": 2}
    assert cat.collections["d.h"].version().pair == (1, 5)
    check_chunk_invariants(cat, "d.h")


def test_shard_collection_hashed_compound():
    cat = catalog("a", "b")
    ok(cat, c.ShardCollection(ns="d.h", key={"x": "hashed", "y": 1}))
    got = chunks(cat, "d.h")
    p = hashed_split_points(4)
    assert [ch[0] for ch in got] == [{"x": MINK, "y": MINK}] + [{"x": v, "y": MINK} for v in p]
    assert got[-1][1] == {"x": MAXK, "y": MAXK}
    check_chunk_invariants(cat, "d.h")


def test_hashed_field_not_first_is_a_range_key():
    cat = catalog("a", "b")
    _, result = ok(cat, c.ShardCollection(ns="d.h", key={"a": 1, "b": "hashed"}))
    assert result["chunks"] == 1
    refused(
        cat,
        c.ShardCollection(ns="d.g", key={"a": 1, "b": "hashed"}, numInitialChunks=4),
        "InvalidOptions",
        "hashed prefix",
    )


@pytest.mark.parametrize(
    "shards,n",
    [
        (["a", "b"], 5),
        (["a", "b", "c"], 7),
        (["a", "b", "c"], 2),
        (["a", "b"], 1),
        (["a"], 9),
        (["a", "b", "c", "d"], 1000),
    ],
)
def test_num_initial_chunks(shards, n):
    cat = catalog(*shards)
    _, result = ok(cat, c.ShardCollection(ns="d.h", key={"h": "hashed"}, numInitialChunks=n))
    assert result["chunks"] == n
    got = chunks(cat, "d.h")
    assert [ch[3] for ch in got] == [(1, i) for i in range(n)]
    assert [ch[0]["h"] for ch in got[1:]] == hashed_split_points(n)
    owners = [ch[2] for ch in got]
    runs = [s for i, s in enumerate(owners) if i == 0 or owners[i - 1] != s]
    assert len(runs) == len(set(runs)), f"each shard's chunks should be one contiguous run: {owners}"
    counts = cat.collections["d.h"].chunks_per_shard()
    assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == min(n, len(shards))
    check_chunk_invariants(cat, "d.h")


def test_num_initial_chunks_zero_means_the_default():
    cat = catalog("a", "b")
    assert ok(cat, c.ShardCollection(ns="d.h", key={"h": "hashed"}, numInitialChunks=0))[1]["chunks"] == 4


@pytest.mark.parametrize("n", [-1, 2 * MAX_INITIAL_CHUNKS_PER_SHARD + 1])
def test_num_initial_chunks_out_of_range(n):
    cat = catalog("a", "b")
    refused(
        cat,
        c.ShardCollection(ns="d.h", key={"h": "hashed"}, numInitialChunks=n),
        "InvalidOptions",
        "between 1 and 16384",
        str(n),
    )
    assert "d" not in cat.databases  # not even the database


def test_num_initial_chunks_needs_a_hashed_key():
    cat = catalog("a")
    refused(cat, c.ShardCollection(ns="d.x", key={"k": 1}, numInitialChunks=4), "InvalidOptions", "hashed prefix")


def test_shard_collection_twice():
    cat = catalog("a")
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    epoch = cat.collections["d.x"].epoch
    # The same key and options again: ok and nothing changes, as MongoDB answers (issue 18, point 9).
    events, result = ok(cat, c.ShardCollection(ns="d.x", key={"k": 1.0}))
    assert events == [] and result["alreadySharded"] and result["epoch"] == epoch
    already = "sharding already enabled for collection d.x"
    refused(cat, c.ShardCollection(ns="d.x", key={"other": "hashed"}), "AlreadyInitialized", already)
    refused(cat, c.ShardCollection(ns="d.x", key={"k": 1, "j": 1}), "AlreadyInitialized", already)
    refused(cat, c.ShardCollection(ns="d.x", key={"k": 1}, unique=True), "AlreadyInitialized", already)


@pytest.mark.parametrize(
    "key,fragment",
    [
        ({}, "non-empty"),
        ({"x": -1}, "descending"),
        ({"x": "text"}, 'ascending (1) or "hashed"'),
        ({"x": True}, "ascending"),
        ({"x": 2}, "ascending"),
        ({"a": "hashed", "b": "hashed"}, "at most one hashed"),
        ({"": 1}, "empty"),
        ({"$x": 1}, "'$'"),
        ({"a..b": 1}, "empty path component"),
        ({f"f{i}": 1 for i in range(33)}, "at most 32"),
    ],
)
def test_invalid_shard_keys(key, fragment):
    cat = catalog("a")
    refused(cat, c.ShardCollection(ns="d.x", key=key), "InvalidOptions", "invalid shard key", fragment)


@pytest.mark.parametrize("key", [{"h": "hashed"}, {"a": 1, "h": "hashed"}])
def test_hashed_key_cannot_be_unique(key):
    cat = catalog("a")
    refused(cat, c.ShardCollection(ns="d.x", key=key, unique=True), "InvalidOptions", "cannot be unique")


@pytest.mark.parametrize(
    "ns,fragment",
    [
        ("nodot", "database.collection"),
        ("d.", "database.collection"),
        (".x", "invalid database name"),
        ("d.system.users", "system.*"),
        ("d.a$b", "'$'"),
        ("d b.x", "invalid database name"),
        ("d." + "x" * 254, "255 bytes"),
        ("d.a\x00b", "NUL"),
    ],
)
def test_invalid_namespaces(ns, fragment):
    cat = catalog("a")
    refused(cat, c.ShardCollection(ns=ns, key={"k": 1}), "InvalidNamespace", fragment)
    refused(cat, c.SplitChunk(ns=ns, at=[{"k": 1}]), "InvalidNamespace")
    refused(cat, c.MergeChunks(ns=ns, min={"k": MINK}, max={"k": MAXK}), "InvalidNamespace")
    refused(cat, c.SetSetting(ns=ns, key="autoSplit", value=True), "InvalidNamespace")


def test_dotted_collection_names_are_fine():
    cat = catalog("a")
    ok(cat, c.ShardCollection(ns="d.a.b", key={"k": 1}))
    ok(cat, c.ShardCollection(ns="d." + "x" * 253, key={"k": 1}))


def test_shard_collection_without_shards():
    refused(Catalog(), c.ShardCollection(ns="d.x", key={"k": 1}), "ShardNotFound")


# ------------------------------------------------------------------- split


@pytest.fixture
def ranged() -> Catalog:
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d", primary="a"))
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    return cat


def test_split_at_one_point(ranged):
    events, result = ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 50}]))
    (e,) = events
    assert isinstance(e, c.ChunkSplit) and e.min == {"k": MINK} and e.max == {"k": MAXK}
    assert e.epoch == ranged.collections["d.x"].epoch
    assert chunks(ranged, "d.x") == [({"k": MINK}, {"k": 50}, "a", (1, 1)), ({"k": 50}, {"k": MAXK}, "a", (1, 2))]
    assert [tuple(ch["version"]) for ch in result["chunks"]] == [(1, 1), (1, 2)]
    check_chunk_invariants(ranged, "d.x")


def test_split_at_several_points_uses_the_collection_version(ranged):
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 50}]))  # (1,1) (1,2)
    # split the lower chunk, whose own version is (1,1): the pieces follow the collection version (1,2)
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": None}, {"k": 10}, {"k": 20}]))
    assert chunks(ranged, "d.x") == [
        ({"k": MINK}, {"k": None}, "a", (1, 3)),
        ({"k": None}, {"k": 10}, "a", (1, 4)),
        ({"k": 10}, {"k": 20}, "a", (1, 5)),
        ({"k": 20}, {"k": 50}, "a", (1, 6)),
        ({"k": 50}, {"k": MAXK}, "a", (1, 2)),
    ]
    assert ranged.collections["d.x"].version().pair == (1, 6)
    check_chunk_invariants(ranged, "d.x")


def test_split_points_of_any_type_in_mongodb_order(ranged):
    ok(
        ranged,
        c.SplitChunk(
            ns="d.x", at=[{"k": None}, {"k": -1.5}, {"k": 3}, {"k": "s"}, {"k": {"o": 1}}, {"k": False}, {"k": True}]
        ),
    )
    assert len(ranged.collections["d.x"].chunks) == 8
    check_chunk_invariants(ranged, "d.x")


def test_split_a_hashed_chunk():
    cat = catalog("a", "b")
    ok(cat, c.ShardCollection(ns="d.h", key={"h": "hashed"}))  # versions (1,0)..(1,3)
    p = hashed_split_points(4)
    ok(cat, c.SplitChunk(ns="d.h", at=[{"h": p[0] + 1}]))
    got = chunks(cat, "d.h")
    assert got[1] == ({"h": p[0]}, {"h": p[0] + 1}, "a", (1, 4))
    assert got[2] == ({"h": p[0] + 1}, {"h": p[1]}, "a", (1, 5))
    ok(cat, c.SplitChunk(ns="d.h", at=[{"h": INT64_MIN}, {"h": INT64_MIN + 1}]))  # MinKey < INT64_MIN
    assert chunks(cat, "d.h")[0] == ({"h": MINK}, {"h": INT64_MIN}, "a", (1, 6))
    refused(cat, c.SplitChunk(ns="d.h", at=[{"h": 1.5}]), "BadValue", "signed 64-bit")
    refused(cat, c.SplitChunk(ns="d.h", at=[{"h": "abc"}]), "BadValue", "signed 64-bit")
    refused(cat, c.SplitChunk(ns="d.h", at=[{"h": INT64_MAX + 1}]), "BadValue", "signed 64-bit")
    check_chunk_invariants(cat, "d.h")


@pytest.mark.parametrize(
    "at", [[{"k": 3}, {"k": 1}], [{"k": 2}, {"k": 2}], [{"k": 2}, {"k": 2.0}], [{"k": "a"}, {"k": 1}]]
)
def test_split_points_unsorted_or_duplicate(ranged, at):
    refused(ranged, c.SplitChunk(ns="d.x", at=at), "BadValue", "sorted ascending and distinct")


def test_split_points_on_bounds_or_outside_the_chunk(ranged):
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10}, {"k": 20}]))
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10}]), "BadValue", "not strictly inside")
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10.0}]), "BadValue", "not strictly inside")  # 10.0 == 10
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": 15}, {"k": 20}]), "BadValue", "not strictly inside")
    refused(
        ranged,
        c.SplitChunk(ns="d.x", at=[{"k": 5}, {"k": 15}]),
        "BadValue",
        "not strictly inside",
        "{ k: MinKey } -->> { k: 10 }",
    )
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": MINK}]), "BadValue", "not strictly inside")
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": MAXK}]), "BadValue", "not strictly inside")


@pytest.mark.parametrize(
    "point,fragment",
    [
        ({"j": 5}, "shard key fields k in"),
        ({"k": 5, "j": 1}, "shard key fields k in"),
        ({}, "shard key fields"),
        ({"k": [1, 2]}, "arrays"),
        ({"k": 2**63}, "64-bit"),
        ({"k": {"$minKey": 2}}, "must be 1"),
        ({"k": "x" * 600}, "512-byte"),
    ],
)
def test_split_points_not_shard_keys(ranged, point, fragment):
    refused(ranged, c.SplitChunk(ns="d.x", at=[point]), "BadValue", "split point 1", fragment)


@pytest.mark.parametrize("x", [float("inf"), float("-inf"), float("nan"), {"a": float("inf")}])
def test_bounds_that_json_cannot_carry(ranged, x):
    # JSON writes them as null: the config server and the readers of config.events would disagree
    frag = "Infinity and NaN cannot be chunk or zone bounds"
    refused(ranged, c.SplitChunk(ns="d.x", at=[{"k": x}]), "BadValue", "split point 1", frag)
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": MINK}, max={"k": x}), "BadValue", "max:", frag)
    ok(ranged, c.AddShardToZone(shard="a", zone="z"))
    refused(ranged, c.AssignZoneRange(ns="d.x", min={"k": x}, max={"k": MAXK}, zone="z"), "BadValue", frag)
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 1e308}, {"k": {"a": -0.0}}]))  # finite floats are fine


@pytest.mark.parametrize(
    "cmd",
    [
        c.CreateDatabase(db="d\ud800"),
        c.AddShardToZone(shard="a", zone="z\udfff"),
        c.ShardCollection(ns="d.y", key={"\ud800": 1}),
        c.ShardCollection(ns="d.\ud800", key={"k": 1}),
        c.SplitChunk(ns="d.x", at=[{"k": "\ud800"}]),
        c.SetSetting(ns="d.x", key="\ud800", value=1),
    ],
)
def test_text_that_is_not_unicode(ranged, cmd):
    # Events holding such text cannot be written to config.events.
    refused(ranged, cmd, "BadValue", "not valid Unicode")


def test_lone_surrogates_do_reach_decide():
    # Why decide() must care: the command codec (json.loads) lets an escaped lone surrogate through.
    cmd = c.commands.decode(b'{"type": "CreateDatabase", "v": 1, "db": "d\\ud800"}')
    assert cmd.db == "d\ud800"
    refused(catalog("a"), cmd, "BadValue", "not valid Unicode")


def test_split_compound_key_fields_in_order():
    cat = catalog("a")
    ok(cat, c.ShardCollection(ns="d.x", key={"a": 1, "b": 1}))
    refused(cat, c.SplitChunk(ns="d.x", at=[{"b": 1, "a": 1}]), "BadValue", "in that order")
    ok(cat, c.SplitChunk(ns="d.x", at=[{"a": 1, "b": MINK}, {"a": 1, "b": 5}, {"a": 2, "b": MINK}]))
    assert len(cat.collections["d.x"].chunks) == 4
    check_chunk_invariants(cat, "d.x")


def test_split_needs_points_and_a_collection(ranged):
    refused(ranged, c.SplitChunk(ns="d.x", at=[]), "BadValue", "at least one split point")
    refused(ranged, c.SplitChunk(ns="d.nope", at=[{"k": 1}]), "NamespaceNotFound", "'d.nope' is not sharded")
    refused(ranged, c.SplitChunk(ns="e.x", at=[{"k": 1}]), "NamespaceNotFound")


# ------------------------------------------------------------------- merge


def test_merge_contiguous_chunks(ranged):
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10}, {"k": 20}, {"k": 30}]))  # (1,1)..(1,4)
    events, result = ok(ranged, c.MergeChunks(ns="d.x", min={"k": 10}, max={"k": 30}))
    (e,) = events
    assert isinstance(e, c.ChunksMerged) and e.chunk.min == {"k": 10} and e.chunk.max == {"k": 30}
    assert result["merged"] == 2
    assert chunks(ranged, "d.x") == [
        ({"k": MINK}, {"k": 10}, "a", (1, 1)),
        ({"k": 10}, {"k": 30}, "a", (1, 5)),
        ({"k": 30}, {"k": MAXK}, "a", (1, 4)),
    ]
    ok(ranged, c.MergeChunks(ns="d.x", min={"k": MINK}, max={"k": MAXK}))
    assert chunks(ranged, "d.x") == [({"k": MINK}, {"k": MAXK}, "a", (1, 6))]


def test_merge_a_single_chunk_is_a_no_op(ranged):
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10}]))
    for lo, hi in (({"k": MINK}, {"k": 10}), ({"k": 10}, {"k": MAXK})):
        events, result = ok(ranged, c.MergeChunks(ns="d.x", min=lo, max=hi))
        assert events == [] and result["merged"] == 0 and result["chunk"]["min"] == lo


def test_merge_misaligned_bounds(ranged):
    ok(ranged, c.SplitChunk(ns="d.x", at=[{"k": 10}, {"k": 20}, {"k": 30}]))
    refused(
        ranged,
        c.MergeChunks(ns="d.x", min={"k": 11}, max={"k": 30}),
        "BadValue",
        "min { k: 11 } is not the lower bound of a chunk",
    )
    refused(
        ranged,
        c.MergeChunks(ns="d.x", min={"k": 10}, max={"k": 25}),
        "BadValue",
        "max { k: 25 } is not the upper bound of a chunk",
    )
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": MINK}, max={"k": 5}), "BadValue", "not the upper bound")
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": 35}, max={"k": MAXK}), "BadValue", "not the lower bound")
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": 20}, max={"k": 10}), "BadValue", "min must be below max")
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": 20}, max={"k": 20}), "BadValue", "min must be below max")
    refused(ranged, c.MergeChunks(ns="d.x", min={"j": 10}, max={"k": 20}), "BadValue", "min:")
    refused(ranged, c.MergeChunks(ns="d.x", min={"k": 10}, max={"j": 20}), "BadValue", "max:")
    refused(ranged, c.MergeChunks(ns="d.y", min={"k": 10}, max={"k": 20}), "NamespaceNotFound")


def test_merge_across_shards_is_refused():
    cat = catalog("a", "b")
    ok(cat, c.CreateDatabase(db="d", primary="a"))
    cat.apply(
        c.CollectionSharded(
            ns="d.m",
            key={"k": 1},
            unique=False,
            epoch=new_epoch(),
            uuid=new_uuid(),
            chunks=[
                c.ChunkDoc(min={"k": MINK}, max={"k": 0}, shard="a", version=(1, 0)),
                c.ChunkDoc(min={"k": 0}, max={"k": 10}, shard="b", version=(2, 0)),
                c.ChunkDoc(min={"k": 10}, max={"k": MAXK}, shard="b", version=(1, 1)),
            ],
        ),
        cat.config_time,
    )
    refused(
        cat,
        c.MergeChunks(ns="d.m", min={"k": MINK}, max={"k": 10}),
        "IllegalOperation",
        "several shards (a, b)",
        "merge needs them on one",
    )
    refused(cat, c.MergeChunks(ns="d.m", min={"k": MINK}, max={"k": MAXK}), "IllegalOperation", "several shards")
    events, _ = ok(cat, c.MergeChunks(ns="d.m", min={"k": 0}, max={"k": MAXK}))
    assert events[0].chunk.version == (2, 1)  # <M_cv, m_cv + 1> of the collection version (2,0)
    assert chunks(cat, "d.m") == [({"k": MINK}, {"k": 0}, "a", (1, 0)), ({"k": 0}, {"k": MAXK}, "b", (2, 1))]
    check_chunk_invariants(cat, "d.m")


def test_merge_hashed_chunks_of_one_shard_only():
    cat = catalog("a", "b")
    ok(cat, c.ShardCollection(ns="d.h", key={"h": "hashed"}))  # a a b b
    p = hashed_split_points(4)
    refused(cat, c.MergeChunks(ns="d.h", min={"h": p[0]}, max={"h": p[2]}), "IllegalOperation", "several shards")
    ok(cat, c.MergeChunks(ns="d.h", min={"h": MINK}, max={"h": p[1]}))
    ok(cat, c.MergeChunks(ns="d.h", min={"h": p[1]}, max={"h": MAXK}))
    assert chunks(cat, "d.h") == [({"h": MINK}, {"h": p[1]}, "a", (1, 4)), ({"h": p[1]}, {"h": MAXK}, "b", (1, 5))]


# ------------------------------------------------------------------- zones


def test_add_and_remove_shard_zone():
    cat = catalog("a", "b")
    events, result = ok(cat, c.AddShardToZone(shard="a", zone="EU"))
    assert events == [c.ShardZoneAdded(shard="a", zone="EU")] and result == {"shard": "a", "zones": ["EU"]}
    assert ok(cat, c.AddShardToZone(shard="a", zone="EU"))[0] == []  # already
    ok(cat, c.AddShardToZone(shard="a", zone="US"))
    assert cat.shards["a"].zones == {"EU", "US"}
    events, result = ok(cat, c.RemoveShardFromZone(shard="a", zone="EU"))
    assert events == [c.ShardZoneRemoved(shard="a", zone="EU")] and result == {"shard": "a", "zones": ["US"]}
    assert ok(cat, c.RemoveShardFromZone(shard="a", zone="EU"))[0] == []  # not in it
    assert ok(cat, c.RemoveShardFromZone(shard="b", zone="nowhere"))[0] == []
    refused(cat, c.AddShardToZone(shard="zz", zone="EU"), "ShardNotFound")
    refused(cat, c.RemoveShardFromZone(shard="zz", zone="EU"), "ShardNotFound")


@pytest.mark.parametrize("zone", ["", "z" * 65, "a\x00b"])
def test_invalid_zone_names(zone):
    cat = catalog("a")
    refused(cat, c.AddShardToZone(shard="a", zone=zone), "BadValue", "invalid zone name")


@pytest.fixture
def zoned() -> Catalog:
    cat = catalog("a", "b")
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    ok(cat, c.AddShardToZone(shard="a", zone="EU"))
    ok(cat, c.AddShardToZone(shard="b", zone="US"))
    return cat


def test_assign_and_remove_zone_ranges(zoned):
    events, result = ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="EU"))
    assert events == [c.ZoneRangeAssigned(ns="d.x", min={"k": 10}, max={"k": 20}, zone="EU")]
    assert result == {"ns": "d.x", "zone": "EU"}
    ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": MINK}, max={"k": 10}, zone="US"))  # adjacent: fine
    ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": 20}, max={"k": MAXK}, zone="EU"))
    assert [(z.zone, z.min, z.max) for z in zoned.collections["d.x"].zones] == [
        ("US", {"k": MIN_KEY}, {"k": 10}),
        ("EU", {"k": 10}, {"k": 20}),
        ("EU", {"k": 20}, {"k": MAX_KEY}),
    ]
    assert ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="EU"))[0] == []  # idempotent

    events, result = ok(zoned, c.RemoveZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}))
    assert events == [c.ZoneRangeRemoved(ns="d.x", min={"k": 10}, max={"k": 20})] and result["zone"] == "EU"
    assert len(zoned.collections["d.x"].zones) == 2
    # A range that is not there (any more) is removed already: ok, nothing decided (as MongoDB).
    assert ok(zoned, c.RemoveZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}))[0] == []
    assert ok(zoned, c.RemoveZoneRange(ns="d.x", min={"k": 20}, max={"k": 30}))[0] == []
    assert ok(zoned, c.RemoveZoneRange(ns="d.y", min={"k": 20}, max={"k": 30}))[0] == []  # d.y: not sharded, none
    refused(zoned, c.RemoveZoneRange(ns="d.x", min={"j": 20}, max={"k": 30}), "BadValue")


@pytest.mark.parametrize(
    "lo,hi,zone",
    [(15, 25, "US"), (5, 15, "US"), (12, 18, "US"), (0, 30, "US"), (10, 20, "US"), (12, 18, "EU"), (10, 30, "EU")],
)
def test_overlapping_zone_ranges(zoned, lo, hi, zone):
    ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="EU"))
    refused(
        zoned,
        c.AssignZoneRange(ns="d.x", min={"k": lo}, max={"k": hi}, zone=zone),
        "RangeOverlapConflict",
        "overlaps the range { k: 10 } -->> { k: 20 } of zone 'EU'",
    )


def test_assign_zone_range_refusals(zoned):
    refused(
        zoned,
        c.AssignZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}, zone="ASIA"),
        "ZoneNotFound",
        "'ASIA' has no shard",
    )
    refused(zoned, c.AssignZoneRange(ns="d.x", min={"k": 2}, max={"k": 2}, zone="EU"), "BadValue", "below max")
    refused(zoned, c.AssignZoneRange(ns="d.x", min={"k": 3}, max={"k": 2}, zone="EU"), "BadValue", "below max")
    refused(zoned, c.AssignZoneRange(ns="d.x", min={"j": 1}, max={"k": 2}, zone="EU"), "BadValue", "min:")
    # d.y is not sharded: its range is recorded for later (tests/unit/test_zones_unsharded.py), but bad
    # bounds are still refused
    refused(zoned, c.AssignZoneRange(ns="d.y", min={"k": 1}, max={"j": 2}, zone="EU"), "BadValue", "same fields")
    refused(zoned, c.AssignZoneRange(ns="d.x", min={"k": 1}, max={"k": 2}, zone=""), "BadValue", "invalid zone")


def test_last_shard_of_a_zone_in_use(zoned):
    ok(zoned, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="EU"))
    refused(
        zoned,
        c.RemoveShardFromZone(shard="a", zone="EU"),
        "ZoneStillInUse",
        "last shard of zone 'EU'",
        "remove those first",
    )
    ok(zoned, c.AddShardToZone(shard="b", zone="EU"))
    ok(zoned, c.RemoveShardFromZone(shard="a", zone="EU"))  # b still serves EU
    refused(zoned, c.RemoveShardFromZone(shard="b", zone="EU"), "ZoneStillInUse")
    ok(zoned, c.RemoveZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}))
    ok(zoned, c.RemoveShardFromZone(shard="b", zone="EU"))
    assert not any("EU" in s.zones for s in zoned.shards.values())


# ---------------------------------------------------------------- settings


def test_cluster_setting():
    cat = catalog("a")
    events, result = ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=64 * MB))
    assert events == [c.SettingChanged(key="maxChunkSizeBytes", value=64 * MB)]
    assert result == {"key": "maxChunkSizeBytes", "value": 64 * MB, "ns": None, "changed": True}
    assert cat.settings.maxChunkSizeBytes == 64 * MB
    events, result = ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=64 * MB))
    assert events == [] and result["changed"] is False
    ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=1 * MB))
    ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=1024 * MB))
    # null: back to the default
    events, result = ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=None))
    assert events == [c.SettingChanged(key="maxChunkSizeBytes", value=None)] and result["value"] == 128 * MB
    assert cat.settings == ClusterSettings()
    assert ok(cat, c.SetSetting(key="maxChunkSizeBytes", value=None))[0] == []  # already the default


@pytest.mark.parametrize(
    "value,fragment",
    [
        (MB - 1, "greater than or equal to 1048576"),
        (1024 * MB + 1, "less than or equal to 1073741824"),
        (0, "greater"),
        (-5, "greater"),
        ("big", "integer"),
        (MB + 0.5, "integer"),
    ],
)
def test_max_chunk_size_out_of_range(value, fragment):
    cat = catalog("a")
    refused(cat, c.SetSetting(key="maxChunkSizeBytes", value=value), "BadValue", "maxChunkSizeBytes", fragment)


def test_unknown_setting_lists_the_known_ones():
    cat = catalog("a")
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    e = refused(cat, c.SetSetting(key="chunkSize", value=64), "BadValue", "unknown setting 'chunkSize'", "known:")
    assert all(k in e.message for k in ClusterSettings.model_fields)
    e = refused(
        cat, c.SetSetting(ns="d.x", key="balancerWindow", value=None), "BadValue", "unknown setting 'balancerWindow'"
    )
    assert all(k in e.message for k in CollectionSettings.model_fields)


@pytest.mark.parametrize(
    "key,value",
    [
        ("balancerEnabled", "maybe"),
        ("balancerRoundIntervalSecs", 0),
        ("balancerRoundIntervalSecs", float("inf")),
        ("balancerRoundIntervalSecs", float("nan")),
        ("rangeDeleterBatchSize", 0),
        ("orphanCleanupDelaySecs", -1),
        ("autoMergerIntervalSecs", 0),
        ("balancerWindow", "23:00-06:00"),
    ],
)
def test_invalid_setting_values(key, value):
    cat = catalog("a")
    refused(cat, c.SetSetting(key=key, value=value), "BadValue", f"{key}:")


def test_balancer_window():
    cat = catalog("a")
    window = {"start": "23:00", "stop": "06:00", "timeZone": "Europe/Paris"}
    events, result = ok(cat, c.SetSetting(key="balancerWindow", value=window))
    assert events == [c.SettingChanged(key="balancerWindow", value=window)] and result["value"] == window
    w = cat.settings.balancerWindow
    assert (w.start, w.stop, w.timeZone) == ("23:00", "06:00", "Europe/Paris")
    assert ok(cat, c.SetSetting(key="balancerWindow", value=dict(window)))[0] == []
    ok(cat, c.SetSetting(key="balancerWindow", value=None))
    assert cat.settings.balancerWindow is None


@pytest.mark.parametrize(
    "window,fragment",
    [
        ({"start": "24:00", "stop": "06:00", "timeZone": "UTC"}, "'24:00' is not a time of day HH:MM"),
        ({"start": "007:00", "stop": "06:00", "timeZone": "UTC"}, "HH:MM"),
        ({"start": "12:60", "stop": "06:00", "timeZone": "UTC"}, "HH:MM"),
        ({"start": "23:00", "stop": "06:00 ", "timeZone": "UTC"}, "HH:MM"),
        ({"start": "23:00\n", "stop": "06:00", "timeZone": "UTC"}, "HH:MM"),
        ({"start": "23:00", "stop": "06:00", "timeZone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"start": "23:00", "stop": "06:00", "timeZone": "../../etc/passwd"}, "unknown time zone"),
        ({"start": "23:00", "stop": "06:00", "timeZone": ""}, "unknown time zone"),
        ({"start": "23:00", "stop": "06:00"}, "timeZone"),
        ({"start": "23:00", "stop": "06:00", "timeZone": "UTC", "days": 5}, "days"),
    ],
)
def test_invalid_balancer_window(window, fragment):
    cat = catalog("a")
    ok(cat, c.SetSetting(key="balancerWindow", value={"start": "01:00", "stop": "02:00", "timeZone": "UTC"}))
    refused(cat, c.SetSetting(key="balancerWindow", value=window), "BadValue", "balancerWindow", fragment)


def test_collection_settings():
    cat = catalog("a")
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    refused(cat, c.SetSetting(ns="d.y", key="autoSplit", value=True), "NamespaceNotFound", "'d.y'")
    events, result = ok(cat, c.SetSetting(ns="d.x", key="maxChunkSizeBytes", value=32 * MB))
    assert events == [c.SettingChanged(ns="d.x", key="maxChunkSizeBytes", value=32 * MB)]
    assert result == {"key": "maxChunkSizeBytes", "value": 32 * MB, "ns": "d.x", "changed": True}
    assert cat.collections["d.x"].settings.maxChunkSizeBytes == 32 * MB
    assert cat.settings.maxChunkSizeBytes == 128 * MB  # the cluster's is untouched
    ok(cat, c.SetSetting(ns="d.x", key="allowMigrations", value=False))
    refused(cat, c.SetSetting(ns="d.x", key="maxChunkSizeBytes", value=2048 * MB), "BadValue", "maxChunkSizeBytes")
    refused(cat, c.SetSetting(ns="d.x", key="autoSplit", value="perhaps"), "BadValue", "autoSplit")
    ok(cat, c.SetSetting(ns="d.x", key="maxChunkSizeBytes", value=None))
    s = cat.collections["d.x"].settings
    assert s.maxChunkSizeBytes is None and s.allowMigrations is False


# ------------------------------------------------------------- persistence


def random_command(rng: random.Random, cat: Catalog) -> c.Record:
    """A random command, mostly valid for the current catalog."""
    shards = sorted(cat.shards)
    colls = sorted(cat.collections)
    kind = rng.choice(
        [
            "shard",
            "shard",
            "db",
            "coll",
            "coll",
            "split",
            "split",
            "split",
            "merge",
            "merge",
            "zone",
            "range",
            "unrange",
            "unzone",
            "setting",
            "collsetting",
            "remove",
        ]
    )
    if kind == "shard" or not shards:
        return c.AddShard(shard=f"s{rng.randrange(6)}")
    if kind == "db":
        return c.CreateDatabase(db=f"db{rng.randrange(4)}", primary=rng.choice([None, *shards]))
    if kind == "coll" or not colls:
        key = rng.choice([{"k": 1}, {"h": "hashed"}, {"a": 1, "b": 1}, {"h": "hashed", "r": 1}])
        return c.ShardCollection(
            ns=f"db{rng.randrange(4)}.c{rng.randrange(4)}",
            key=key,
            numInitialChunks=rng.choice([None, 3]) if "h" in key else None,
        )
    coll = cat.collections[rng.choice(colls)]
    field = coll.pattern.fields[0]
    rest = {f: MINK for f in coll.pattern.fields[1:]}

    def bound(x):
        return {field: x, **rest}

    if kind == "split":
        i = rng.randrange(len(coll.chunks))
        ch = coll.chunks[i]
        lo = ch.min[field] if isinstance(ch.min[field], int) else -(2**40)
        hi = ch.max[field] if isinstance(ch.max[field], int) else 2**40
        if hi - lo < 2:
            return c.SplitChunk(ns=coll.ns, at=[bound(lo)])  # refused: on a bound
        pts = sorted(rng.sample(range(lo + 1, hi), min(rng.randint(1, 3), hi - lo - 1)))
        return c.SplitChunk(ns=coll.ns, at=[bound(p) for p in pts])
    if kind == "merge":
        i = rng.randrange(len(coll.chunks))
        j = min(len(coll.chunks), i + rng.randint(1, 3))
        return c.MergeChunks(ns=coll.ns, min=coll.chunks[i].doc().min, max=coll.chunks[j - 1].doc().max)
    if kind == "zone":
        return c.AddShardToZone(shard=rng.choice(shards), zone=rng.choice(["EU", "US"]))
    if kind == "unzone":
        return c.RemoveShardFromZone(shard=rng.choice(shards), zone=rng.choice(["EU", "US"]))
    if kind == "range":
        lo = rng.randrange(-100, 100)
        return c.AssignZoneRange(
            ns=coll.ns, min=bound(lo), max=bound(lo + rng.randint(1, 50)), zone=rng.choice(["EU", "US"])
        )
    if kind == "unrange":
        zoned = [x for x in colls if cat.collections[x].zones]
        if zoned:
            z = rng.choice(cat.collections[ns := rng.choice(zoned)].zones)
            return c.RemoveZoneRange(ns=ns, min=to_ejson(z.min), max=to_ejson(z.max))
        return c.RemoveZoneRange(ns=coll.ns, min=bound(0), max=bound(1))
    if kind == "setting":
        return rng.choice(
            [
                c.SetSetting(key="maxChunkSizeBytes", value=rng.choice([None, 2 * MB, 64 * MB])),
                c.SetSetting(
                    key="balancerWindow",
                    value=rng.choice([None, {"start": "22:00", "stop": "04:30", "timeZone": "America/New_York"}]),
                ),
                c.SetSetting(key="autoMergerEnabled", value=rng.choice([True, False])),
            ]
        )
    if kind == "collsetting":
        return c.SetSetting(
            ns=coll.ns, key=rng.choice(["autoSplit", "balancerEnabled"]), value=rng.choice([True, False])
        )
    return c.RemoveShard(shard=rng.choice(shards))


def comparable(cat: Catalog) -> dict:
    doc = status_document(cat, verbose=True)
    del doc["configTime"]
    return doc


def deep(cat: Catalog) -> dict:
    snap = snapshot(cat)
    del snap["changes"], snap["config_time"]
    return snap


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32), st.integers(5, 50))
def test_store_round_trip_after_random_commands(seed, steps):
    rng = random.Random(seed)
    cat = Catalog(track_changes=True)
    accepted = 0
    with tempfile.TemporaryDirectory() as tmp:
        incremental, once = Store(Path(tmp) / "incremental"), Store(Path(tmp) / "once")
        everything: dict[bytes, bytes | None] = {}
        try:
            for _ in range(steps):
                r = run(cat, random_command(rng, cat))
                if isinstance(r, CommandError):
                    continue
                accepted += 1
                for ns in cat.collections:
                    check_chunk_invariants(cat, ns)
                changes = cat.drain_changes()
                everything.update(changes)
                incremental.commit(changes.items(), None)  # a write batch per command, deletes included
            ckpt = Checkpoint("config.events", 0, cat.config_time)
            incremental.commit([], ckpt)
            once.commit(everything.items(), ckpt)
            for store in (incremental, once):
                loaded = Catalog(track_changes=False)
                loaded.load(store)
                assert comparable(loaded) == comparable(cat)
                assert deep(loaded) == deep(cat)
                assert loaded.config_time == cat.config_time
                # the loaded catalog decides like the original
                assert loaded.active_shards() == cat.active_shards()
        finally:
            incremental.close()
            once.close()
    assert accepted >= 1


def test_store_round_trip_of_every_kind_of_entity(tmp_path):
    cat = catalog("a", "b", "c")
    for cmd in [
        c.CreateDatabase(db="d", primary="b"),
        c.ShardCollection(ns="d.x", key={"k": 1}),
        c.ShardCollection(ns="d.h", key={"h": "hashed", "r": 1}, numInitialChunks=5),
        c.ShardCollection(ns="e.x.y", key={"a": 1, "b": 1}, unique=True),
        c.SplitChunk(ns="d.x", at=[{"k": "m"}, {"k": {"o": 1}}]),
        c.SplitChunk(ns="d.x", at=[{"k": -2.5}]),
        c.MergeChunks(ns="d.x", min={"k": -2.5}, max={"k": {"o": 1}}),
        c.AddShardToZone(shard="a", zone="EU"),
        c.AddShardToZone(shard="c", zone="US"),
        c.AddShardToZone(shard="b", zone="US"),  # c is not the zone's only shard: it may drain
        c.AssignZoneRange(ns="d.x", min={"k": "a"}, max={"k": "n"}, zone="EU"),
        c.AssignZoneRange(ns="d.x", min={"k": MINK}, max={"k": 0}, zone="US"),
        c.AssignZoneRange(ns="e.x.y", min={"a": 1, "b": MINK}, max={"a": 2, "b": MINK}, zone="US"),
        c.RemoveZoneRange(ns="d.x", min={"k": MINK}, max={"k": 0}),
        c.SetSetting(key="balancerWindow", value={"start": "23:00", "stop": "06:00", "timeZone": "Asia/Tokyo"}),
        c.SetSetting(key="chunkDefragmentationThrottlingMS", value=250),
        c.SetSetting(ns="d.h", key="allowMigrations", value=False),
        c.SetSetting(ns="d.x", key="maxChunkSizeBytes", value=8 * MB),
        c.RemoveShard(shard="c"),  # draining: it owns hashed chunks
    ]:
        ok(cat, cmd)
    store = Store(tmp_path / "config")
    try:
        store.commit(cat.drain_changes().items(), Checkpoint("config.events", 0, cat.config_time))
        loaded = Catalog()
        loaded.load(store)
        assert status_document(loaded, verbose=True) == status_document(cat, verbose=True)
        assert deep(loaded) == deep(cat)
        assert loaded.drain_changes() == {}  # loading is not a change
    finally:
        store.close()


# ------------------------------------------------ random splits and merges


class SplitsAndMerges(RuleBasedStateMachine):
    """Random splits and merges, valid or not, on a range and a hashed collection over three shards:
    every command either keeps the chunk invariants and raises the collection version, or is refused
    with the catalog untouched."""

    NSS = ("d.r", "d.h", "d.c")

    @initialize()
    def setup(self):
        self.cat = catalog("a", "b", "c")
        ok(self.cat, c.ShardCollection(ns="d.r", key={"k": 1}))
        ok(self.cat, c.SplitChunk(ns="d.r", at=[{"k": -1000}, {"k": 0}, {"k": 1000}]))
        ok(self.cat, c.ShardCollection(ns="d.h", key={"h": "hashed"}))
        ok(self.cat, c.ShardCollection(ns="d.c", key={"h": "hashed", "r": 1}, numInitialChunks=4))
        self.epochs = {ns: self.cat.collections[ns].epoch for ns in self.NSS}
        self.last = {ns: self.cat.collections[ns].version() for ns in self.NSS}

    def _after(self, ns: str, r) -> None:
        coll = self.cat.collections[ns]
        before = self.last[ns]
        if isinstance(r, CommandError) or not r[0]:
            assert coll.version() == before
            return
        v = coll.version()
        assert before.older_than(v) and v.major == before.major == 1  # split and merge keep the major
        self.last[ns] = v

    def _field_bounds(self, ns: str, i: int) -> tuple[int, int]:
        coll = self.cat.collections[ns]
        f = coll.pattern.fields[0]
        ch = coll.chunks[i]
        lo = ch.min[f] if isinstance(ch.min[f], int) else INT64_MIN - 1
        hi = ch.max[f] if isinstance(ch.max[f], int) else INT64_MAX + 1
        return lo, hi

    def _bound(self, ns: str, x) -> dict:
        fields = self.cat.collections[ns].pattern.fields
        return {fields[0]: x, **{f: MINK for f in fields[1:]}}

    @rule(data=st.data(), ns=st.sampled_from(NSS))
    def split_inside_a_chunk(self, data, ns):
        coll = self.cat.collections[ns]
        i = data.draw(st.integers(0, len(coll.chunks) - 1))
        lo, hi = self._field_bounds(ns, i)
        # a compound chunk may start at {h: p, r: MinKey}: p itself is then not inside it
        first = lo + 1
        assume(hi - first >= 1)
        pts = data.draw(st.lists(st.integers(first, hi - 1), min_size=1, max_size=3, unique=True))
        shard, n_before = coll.chunks[i].shard, len(coll.chunks)
        sv_before = {s: coll.shard_version(s) for s in self.cat.shards}
        r = ok(self.cat, c.SplitChunk(ns=ns, at=[self._bound(ns, p) for p in sorted(pts)]))
        assert len(self.cat.collections[ns].chunks) == n_before + len(pts)
        new = self.cat.collections[ns].chunks[i : i + len(pts) + 1]
        assert {ch.shard for ch in new} == {shard}
        assert [ch.version.pair for ch in new] == [(1, self.last[ns].minor + k) for k in range(1, len(pts) + 2)]
        for s, sv in sv_before.items():
            assert not self.cat.collections[ns].shard_version(s).older_than(sv)
        self._after(ns, r)

    @rule(
        ns=st.sampled_from(NSS),
        pts=st.lists(st.integers(-(2**20), 2**20) | st.sampled_from([0, 1, -1]), min_size=0, max_size=3),
    )
    def split_anywhere(self, ns, pts):
        self._after(ns, run(self.cat, c.SplitChunk(ns=ns, at=[self._bound(ns, p) for p in pts])))

    @rule(data=st.data(), ns=st.sampled_from(NSS))
    def merge_a_run(self, data, ns):
        coll = self.cat.collections[ns]
        i = data.draw(st.integers(0, len(coll.chunks) - 1))
        j = data.draw(st.integers(i, min(len(coll.chunks) - 1, i + 4)))
        if data.draw(st.booleans()):  # mostly: keep to the first chunk's shard
            while j > i and len({ch.shard for ch in coll.chunks[i : j + 1]}) > 1:
                j -= 1
        run_ = coll.chunks[i : j + 1]
        owners = {ch.shard for ch in run_}
        sv_before = {s: coll.shard_version(s) for s in self.cat.shards}
        n_before = len(coll.chunks)
        r = run(self.cat, c.MergeChunks(ns=ns, min=run_[0].doc().min, max=run_[-1].doc().max))
        if len(owners) > 1:
            assert isinstance(r, CommandError) and r.code == "IllegalOperation"
        else:
            assert not isinstance(r, CommandError)
            assert len(self.cat.collections[ns].chunks) == n_before - (j - i)
            if j > i:
                merged = self.cat.collections[ns].chunks[i]
                assert merged.version.pair == (1, self.last[ns].minor + 1) and merged.shard in owners
        for s, sv in sv_before.items():
            assert not self.cat.collections[ns].shard_version(s).older_than(sv)
        self._after(ns, r)

    @rule(
        ns=st.sampled_from(NSS),
        lo=st.integers(-(2**20), 2**20) | st.just(None),
        hi=st.integers(-(2**20), 2**20) | st.just(None),
    )
    def merge_anywhere(self, ns, lo, hi):
        fields = self.cat.collections[ns].pattern.fields
        mn = {f: MINK for f in fields} if lo is None else self._bound(ns, lo)
        mx = {f: MAXK for f in fields} if hi is None else self._bound(ns, hi)
        self._after(ns, run(self.cat, c.MergeChunks(ns=ns, min=mn, max=mx)))

    @invariant()
    def chunks_are_sound(self):
        for ns in self.NSS:
            check_chunk_invariants(self.cat, ns)
            coll = self.cat.collections[ns]
            assert coll.epoch == self.epochs[ns] and coll.version() == self.last[ns]
            assert coll.version().major == 1


TestSplitsAndMerges = SplitsAndMerges.TestCase
TestSplitsAndMerges.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
