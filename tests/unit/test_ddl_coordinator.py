"""The DDL coordinator's decisions (services/config/decide.py over domain/ddl.py) on an
in-memory catalog: start, join, conflict and no-op; every phase in order, the catalog change at
the point of no return, rollback before it and never after; the locks other commands respect;
and the catalog's fold of it all surviving a persist-and-load.  No Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.catalog import Catalog
from domain.ddl import ORDER, Phase
from domain.versions import ChunkVersion
from libs.store import Checkpoint, Store
from schemas import config as c
from schemas import ddl as d
from tests.unit.test_config_decide import MAXK, MINK, catalog, check_chunk_invariants, ok, refused, snapshot


def sharded(*shards: str, ns: str = "db.c", key: dict | None = None) -> Catalog:
    cat = catalog(*(shards or ("s0", "s1")))
    ok(cat, c.CreateDatabase(db=ns.partition(".")[0], primary=cat.active_shards()[0]))
    ok(cat, c.ShardCollection(ns=ns, key=key or {"a": 1}))
    return cat


def start(cat: Catalog, cmd) -> str:
    events, result = ok(cat, cmd)
    assert result["started"] and not result["joined"]
    assert [type(e) for e in events] == [d.DDLStarted]
    return result["id"]


def drive(cat: Catalog, cid: str, until: Phase = Phase.DONE) -> list:
    """Advance coordinator `cid` phase by phase (as the driver does once each phase's work is
    done); the events of each step."""
    out = []
    while cid in cat.ddl and cat.ddl[cid].phase != until:
        at = cat.ddl[cid].phase
        nxt = Phase.DONE if at == Phase.ROLLBACK else ORDER[ORDER.index(at) + 1]
        events, _ = ok(cat, d.AdvanceDDL(id=cid, phase=at, to=nxt))
        out.append(events)
    return out


def test_drop_sharded_collection_runs_every_phase_and_changes_the_catalog_at_the_point_of_no_return():
    cat = sharded()
    ok(cat, c.SplitChunk(ns="db.c", at=[{"a": 10}]))
    cid = start(cat, d.DropCollection(ns="db.c"))
    assert cat.ddl[cid].phase == Phase.FREEZE and cat.ddl[cid].locks == ["db", "db.c"]
    steps = drive(cat, cid, until=Phase.COMMIT)
    assert "db.c" in cat.collections  # nothing destructive before the point of no return
    (commit,) = drive(cat, cid, until=Phase.APPLY)
    assert [type(e) for e in commit] == [d.CollectionDropped, d.DDLPhaseReached]
    assert "db.c" not in cat.collections
    drive(cat, cid)
    assert cid not in cat.ddl and cat.ddl_outcomes[cid]["ok"] is True
    assert cat.ddl_outcomes[cid]["result"] == {"ns": "db.c", "dropped": True}
    assert len(steps) == 2


def test_a_retried_checkpoint_answers_where_the_coordinator_is_and_records_nothing():
    cat = sharded()
    cid = start(cat, d.DropCollection(ns="db.c"))
    drive(cat, cid, until=Phase.BLOCK_CRUD)
    events, result = ok(cat, d.AdvanceDDL(id=cid, phase=Phase.FREEZE, to=Phase.BLOCK_CRUD))
    assert events == [] and result["phase"] == Phase.BLOCK_CRUD
    refused(cat, d.AdvanceDDL(id=cid, phase=Phase.BLOCK_CRUD, to=Phase.RELEASE), "IllegalOperation", "next is commit")
    drive(cat, cid)
    events, result = ok(cat, d.AdvanceDDL(id=cid, phase=Phase.RELEASE, to=Phase.DONE))
    assert events == [] and result["phase"] == Phase.DONE
    refused(cat, d.AdvanceDDL(id="nope", phase="freezeMigrations", to="blockCRUD"), "NoSuchKey")


def test_dropping_a_missing_collection_or_database_is_ok_and_records_nothing():
    cat = sharded()
    events, result = ok(cat, d.DropCollection(ns="db.nothere"))
    assert events == [] and result == {
        "op": "dropCollection",
        "ns": "db.nothere",
        "id": None,
        "started": False,
        "dropped": False,
    }
    events, result = ok(cat, d.DropDatabase(db="nodb"))
    assert events == [] and result["started"] is False


def test_the_same_request_joins_another_waits_and_other_databases_run_in_parallel():
    cat = sharded()
    ok(cat, c.ShardCollection(ns="other.c", key={"a": 1}))
    cid = start(cat, d.DropCollection(ns="db.c"))
    events, joined = ok(cat, d.DropCollection(ns="db.c"))
    assert events == [] and joined["id"] == cid and joined["joined"] is True
    refused(
        cat, d.RenameCollection(ns="db.c", to="db.d"), "ConflictingOperationInProgress", cid, "one DDL runs at a time"
    )
    refused(cat, d.DropDatabase(db="db"), "ConflictingOperationInProgress")
    other = start(cat, d.DropCollection(ns="other.c"))
    assert other != cid and set(cat.ddl) == {cid, other}


def test_catalog_commands_on_a_held_namespace_wait_for_the_coordinator():
    cat = sharded()
    cid = start(cat, d.DropCollection(ns="db.c"))
    for cmd in (
        c.SplitChunk(ns="db.c", at=[{"a": 5}]),
        c.MoveRange(ns="db.c", min={"a": MINK}, to="s1"),
        c.ShardCollection(ns="db.c", key={"b": 1}),
        c.SetSetting(ns="db.c", key="allowMigrations", value=False),
    ):
        refused(cat, cmd, "ConflictingOperationInProgress", cid)
    drive(cat, cid, until=Phase.APPLY)  # dropped, not yet done: a write's CreateCollection waits
    refused(cat, c.CreateCollection(ns="db.c"), "ConflictingOperationInProgress", cid)
    ok(cat, c.CreateCollection(ns="db.other"))  # the rest of the database carries on
    refused(cat, c.MovePrimary(db="db", to="s1"), "ConflictingOperationInProgress")


def test_a_migration_running_when_the_ddl_starts_cannot_commit():
    cat = sharded()
    _, moved = ok(cat, c.MoveRange(ns="db.c", min={"a": MINK}, to="s1"))
    start(cat, d.DropCollection(ns="db.c"))
    refused(
        cat,
        c.CommitMigration(id=moved["id"], min={"a": MINK}, max={"a": MAXK}),
        "ConflictingOperationInProgress",
    )


def test_drop_database_forgets_every_collection_and_the_database_version():
    cat = sharded()
    ok(cat, c.CreateCollection(ns="db.plain"))
    ok(cat, c.ShardCollection(ns="keep.c", key={"a": 1}))
    cid = start(cat, d.DropDatabase(db="db"))
    refused(cat, c.CreateCollection(ns="db.new"), "ConflictingOperationInProgress")
    drive(cat, cid)
    assert "db" not in cat.databases and not [ns for ns in cat.collections if ns.startswith("db.")]
    assert "keep.c" in cat.collections
    _, r = ok(cat, c.CreateCollection(ns="db.new"))  # a fresh database afterwards
    assert r["created"]


def test_rename_sharded_keeps_uuid_chunks_and_zones_under_a_new_epoch():
    cat = sharded()
    ok(cat, c.SplitChunk(ns="db.c", at=[{"a": 10}]))
    ok(cat, c.AddShardToZone(shard="s0", zone="z"))
    ok(cat, c.AssignZoneRange(ns="db.c", min={"a": 0}, max={"a": 10}, zone="z"))
    before = cat.collections["db.c"]
    versions = [(ch.version.major, ch.version.minor, ch.shard) for ch in before.chunks]
    cid = start(cat, d.RenameCollection(ns="db.c", to="db.d"))
    drive(cat, cid)
    assert "db.c" not in cat.collections
    after = cat.collections["db.d"]
    assert after.uuid == before.uuid and after.epoch != before.epoch
    assert [(ch.version.major, ch.version.minor, ch.shard) for ch in after.chunks] == versions
    assert all(ch.version.epoch == after.epoch for ch in after.chunks)
    assert [(z.zone, z.min_key) for z in after.zones] == [("z", before.zones[0].min_key)]
    check_chunk_invariants(cat, "db.d")


def test_rename_unsharded_moves_its_uuid_and_drop_target_replaces_the_target():
    cat = sharded()
    ok(cat, c.CreateCollection(ns="db.u"))
    uuid = cat.uuid_of("db.u")
    assert uuid
    refused(cat, d.RenameCollection(ns="db.u", to="db.c"), "NamespaceExists", "dropTarget")
    cid = start(cat, d.RenameCollection(ns="db.u", to="db.c", dropTarget=True))
    drive(cat, cid)
    assert "db.c" not in cat.collections and cat.uuid_of("db.c") == uuid and cat.uuid_of("db.u") is None


@pytest.mark.parametrize(
    ("cmd", "code", "fragment"),
    [
        (d.RenameCollection(ns="db.c", to="other.c"), "CommandFailed", "same database"),
        (d.RenameCollection(ns="db.c", to="db.c"), "IllegalOperation", "itself"),
        (d.RenameCollection(ns="db.missing", to="db.x"), "NamespaceNotFound", "db.missing"),
        (d.RenameCollection(ns="db.c", to="db.$bad"), "InvalidNamespace", ""),
        (d.RefineCollectionShardKey(ns="db.c", key={"b": 1, "a": 1}), "InvalidOptions", "extend"),
        (d.RefineCollectionShardKey(ns="db.c", key={"a": 1}), "InvalidOptions", "at least one field"),
        (d.RefineCollectionShardKey(ns="db.c", key={"a": 1, "b": "nope"}), "InvalidOptions", "invalid shard key"),
        (d.RefineCollectionShardKey(ns="db.missing", key={"a": 1, "b": 1}), "NamespaceNotFound", ""),
        (d.DropCollection(ns="nodot"), "InvalidNamespace", ""),
        (d.DropDatabase(db="admin"), "InvalidNamespace", "reserved"),
    ],
)
def test_bad_requests_are_refused_with_mongodb_codes_and_record_nothing(cmd, code, fragment):
    cat = sharded()
    ok(cat, c.CreateCollection(ns="db.u"))
    refused(cat, cmd, code, fragment)
    assert not cat.ddl


def test_refine_of_an_unsharded_collection_is_namespace_not_sharded():
    cat = sharded()
    ok(cat, c.CreateCollection(ns="db.u"))
    refused(cat, d.RefineCollectionShardKey(ns="db.u", key={"a": 1, "b": 1}), "NamespaceNotSharded")


def test_refine_keeps_every_chunk_version_extends_bounds_with_minkey_and_takes_a_new_epoch():
    cat = sharded()
    ok(cat, c.SplitChunk(ns="db.c", at=[{"a": 10}, {"a": 20}]))
    ok(cat, c.AddShardToZone(shard="s0", zone="z"))
    ok(cat, c.AssignZoneRange(ns="db.c", min={"a": 0}, max={"a": 10}, zone="z"))
    old = cat.collections["db.c"]
    pairs = [ch.version.pair for ch in old.chunks]
    cid = start(cat, d.RefineCollectionShardKey(ns="db.c", key={"a": 1, "b": 1}))
    drive(cat, cid)
    new = cat.collections["db.c"]
    assert new.pattern.spec == {"a": 1, "b": 1} and new.epoch != old.epoch and new.uuid == old.uuid
    assert [ch.version.pair for ch in new.chunks] == pairs
    docs = [ch.doc() for ch in new.chunks]
    assert docs[0].min == {"a": MINK, "b": MINK}
    assert docs[1].min == {"a": 10, "b": MINK} and docs[0].max == {"a": 10, "b": MINK}
    assert docs[-1].max == {"a": MAXK, "b": MAXK}  # the global max stays the global max
    assert new.zones[0].min == {"a": 0, "b": new.zones[0].min["b"]} and len(new.zones) == 1
    check_chunk_invariants(cat, "db.c")
    assert new.version() == ChunkVersion(*max(pairs), new.epoch)


def test_rollback_before_the_point_of_no_return_and_never_after():
    cat = sharded()
    cid = start(cat, d.RenameCollection(ns="db.c", to="db.d"))
    drive(cat, cid, until=Phase.COMMIT)
    events, _ = ok(cat, d.AdvanceDDL(id=cid, phase=Phase.COMMIT, to=Phase.ROLLBACK, code="X", reason="why"))
    assert cat.ddl[cid].phase == Phase.ROLLBACK
    drive(cat, cid)
    assert cat.ddl_outcomes[cid]["ok"] is False and cat.ddl_outcomes[cid]["reason"] == "why"
    assert "db.c" in cat.collections and "db.d" not in cat.collections

    cid = start(cat, d.DropCollection(ns="db.c"))
    drive(cat, cid, until=Phase.APPLY)
    refused(cat, d.AdvanceDDL(id=cid, phase=Phase.APPLY, to=Phase.ROLLBACK), "IllegalOperation", "point of no return")


def test_get_ddl_shows_running_coordinators_and_outcomes():
    cat = sharded()
    cid = start(cat, d.DropCollection(ns="db.c"))
    _, running = ok(cat, d.GetDDL())
    assert [r["id"] for r in running["running"]] == [cid] and running["running"][0]["phase"] == "freezeMigrations"
    drive(cat, cid)
    _, done = ok(cat, d.GetDDL(id=cid))
    assert done["state"] == "done" and done["ok"] is True
    _, unknown = ok(cat, d.GetDDL(id="nope"))
    assert unknown["state"] == "unknown"


def test_the_coordinators_survive_a_persist_and_load(tmp_path: Path):
    cat = sharded()
    ok(cat, c.ShardCollection(ns="other.c", key={"a": 1}))
    finished = start(cat, d.RefineCollectionShardKey(ns="other.c", key={"a": 1, "b": 1}))
    drive(cat, finished)
    ok(cat, c.CreateCollection(ns="db.u"))
    running = start(cat, d.RenameCollection(ns="db.u", to="db.v"))
    drive(cat, running, until=Phase.APPLY)
    store = Store(tmp_path / "config")
    store.commit(cat.drain_changes().items(), Checkpoint("t", 0, cat.config_time))
    loaded = Catalog()
    loaded.load(store)
    assert {k: v.state() for k, v in loaded.ddl.items()} == {k: v.state() for k, v in cat.ddl.items()}
    assert list(loaded.ddl) == [running] and loaded.ddl_outcomes == cat.ddl_outcomes
    assert loaded.uuid_of("db.v") == cat.uuid_of("db.v") is not None
    assert snapshot(loaded)["databases"] == snapshot(cat)["databases"]
    assert loaded.collections["other.c"].pattern.spec == {"a": 1, "b": 1}
    store.close()
