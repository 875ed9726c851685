"""createIndexes / dropIndexes as DDL coordinators (domain/index_ddl.py, domain/ddl.py's index
phases, services/config/decide.py) on an in-memory catalog: what a request plans, MongoDB's
errors for bad input, every phase in order with the catalog change at the point of no return,
rollback, joining, and the catalog's index list surviving drop, rename, refine and a
persist-and-load.  No Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import index_ddl
from domain import sharding_commands as sc
from domain.catalog import Catalog
from domain.ddl import Phase, before_point_of_no_return, next_phase, order_of
from domain.indexes import ID_INDEX, IndexSpec
from libs.errors import CommandError
from libs.store import Checkpoint, Store
from schemas import config as c
from schemas import ddl as d
from tests.unit.test_config_decide import catalog, ok, refused


def spec(key: dict, **options) -> IndexSpec:
    return IndexSpec.parse({"key": key, **options})


def names(cat: Catalog, ns: str) -> list[str]:
    return [s.name for s in cat.index_list(ns)]


def sharded(ns: str = "db.c", key: dict | None = None, unique: bool = False) -> Catalog:
    cat = catalog("s0", "s1", "s2")
    ok(cat, c.CreateDatabase(db=ns.partition(".")[0], primary="s0"))
    ok(cat, c.ShardCollection(ns=ns, key=key or {"a": 1}, unique=unique))
    return cat


def drive(cat: Catalog, cid: str, until: Phase = Phase.DONE) -> list[list]:
    out = []
    while cid in cat.ddl and cat.ddl[cid].phase != until:
        coord = cat.ddl[cid]
        events, _ = ok(cat, d.AdvanceDDL(id=cid, phase=coord.phase, to=next_phase(coord.phase, coord.op)))
        out.append(events)
    return out


def create(ns: str, *specs: dict) -> d.CreateCollectionIndexes:
    return d.CreateCollectionIndexes(ns=ns, indexes=list(specs))


# ------------------------------------------------------------------ pure planning


def test_listed_indexes_are_id_then_the_shard_key_then_the_created_ones():
    assert index_ddl.listed_indexes([]) == [ID_INDEX]
    assert [s.to_mongo() for s in index_ddl.listed_indexes([spec({"b": 1})], {"a": 1}, unique=True)] == [
        {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        {"v": 2, "key": {"a": 1}, "name": "a_1", "unique": True},
        {"v": 2, "key": {"b": 1}, "name": "b_1"},
    ]
    assert [s.name for s in index_ddl.listed_indexes([], {"a": "hashed"})] == ["_id_", "a_hashed"]
    assert [s.name for s in index_ddl.listed_indexes([], {"_id": 1})] == ["_id_"]  # the _id index serves


def test_plan_create_skips_what_exists_and_refuses_conflicts_as_mongodb():
    listed = index_ddl.listed_indexes([spec({"b": 1})], {"a": 1})
    assert index_ddl.plan_create(listed, [spec({"b": 1}), spec({"a": 1}), spec({"_id": 1})], {"a": 1}) == []
    new = index_ddl.plan_create(
        listed, [spec({"c": 1}), spec({"c": 1}), spec({"a": 1, "c": -1}, unique=True)], {"a": 1}
    )
    assert [s.name for s in new] == ["c_1", "a_1_c_-1"]
    cases = [
        (spec({"b": -1}, name="b_1"), "IndexKeySpecsConflict"),
        (spec({"b": 1}, name="other"), "IndexOptionsConflict"),
        (spec({"b": 1}, sparse=True), "IndexOptionsConflict"),
        (spec({"a": 1}, name="a_key"), "IndexOptionsConflict"),  # the shard key's index, renamed
        (spec({"b": 1, "a": 1}, unique=True), "CannotCreateIndex"),  # unique without the shard key prefix
    ]
    for s, code in cases:
        with pytest.raises(CommandError) as e:
            index_ddl.plan_create(listed, [s], {"a": 1})
        assert e.value.code == code, (s, e.value.message)
    # unsharded: any unique index
    assert index_ddl.plan_create([ID_INDEX], [spec({"email": 1}, unique=True)], None)[0].unique


def test_plan_drop_resolves_star_names_key_patterns_and_lists():
    listed = index_ddl.listed_indexes(
        [spec({"b": 1}), spec({"c": 1}), spec({"c": 1}, name="c_sparse", sparse=True)], {"a": 1}
    )
    assert index_ddl.plan_drop("db.c", listed, "*", {"a": 1}) == ["b_1", "c_1", "c_sparse"]
    assert index_ddl.plan_drop("db.c", listed, "b_1", {"a": 1}) == ["b_1"]
    assert index_ddl.plan_drop("db.c", listed, {"b": 1}, {"a": 1}) == ["b_1"]
    assert index_ddl.plan_drop("db.c", listed, ["c_1", "b_1"], {"a": 1}) == ["c_1", "b_1"]
    bad = [
        ("_id_", "InvalidOptions", "cannot drop _id index"),
        ({"_id": 1}, "InvalidOptions", "cannot drop _id index"),
        ("a_1", "CannotDropShardKeyIndex", "shard key"),
        ({"a": 1}, "CannotDropShardKeyIndex", "shard key"),
        ("nope", "IndexNotFound", "index not found with name [nope]"),
        (["b_1", "nope"], "IndexNotFound", "[nope]"),
        ({"z": 1}, "IndexNotFound", "can't find index with key"),
        ({"c": 1}, "AmbiguousIndexKeyPattern", "c_1, c_sparse"),
    ]
    for target, code, fragment in bad:
        with pytest.raises(CommandError) as e:
            index_ddl.plan_drop("db.c", listed, target, {"a": 1})
        assert e.value.code == code and fragment in e.value.message, (target, e.value.message)
    for target in ("", {}, [], ["*"], 5, [1]):
        with pytest.raises(CommandError):
            index_ddl.check_drop_target(target)


@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3, unique=True), st.booleans())
def test_planning_the_same_request_twice_plans_nothing_the_second_time(paths, unique):
    """createIndexes is idempotent: once its plan is listed, the same request plans nothing."""
    key = {"a": 1}
    requested = [spec({p: 1 for p in paths}, unique=unique and paths[0] == "a")]
    listed = index_ddl.listed_indexes([], key)
    try:
        new = index_ddl.plan_create(listed, requested, key)
    except CommandError:  # a unique {a: 1} conflicts with the shard key's index of that name
        return
    assert index_ddl.plan_create(listed + new, requested, key) == []


# ------------------------------------------------------------------ phases


def test_index_ddls_have_their_own_phases_and_points_of_no_return():
    assert order_of("createIndexes") == [Phase.FREEZE, Phase.BUILD, Phase.COMMIT, Phase.DONE]
    assert order_of("dropIndexes") == [Phase.FREEZE, Phase.COMMIT, Phase.APPLY, Phase.DONE]
    assert [before_point_of_no_return(p, "createIndexes") for p in order_of("createIndexes")] == [
        True,
        True,
        True,
        False,
    ]
    assert [before_point_of_no_return(p, "dropIndexes") for p in order_of("dropIndexes")] == [True, True, False, False]
    assert before_point_of_no_return(Phase.COMMIT) and not before_point_of_no_return(
        Phase.APPLY
    )  # the others: unchanged


# ------------------------------------------------------------------ decisions


def test_create_indexes_builds_then_lists_them_at_its_point_of_no_return():
    cat = sharded()
    events, r = ok(cat, create("db.c", {"key": {"b": 1}}, {"key": {"a": 1, "c": -1}, "unique": True, "name": "u"}))
    assert [type(e) for e in events] == [d.DDLStarted] and r["started"] and not r["createdCollectionAutomatically"]
    assert r["numIndexesBefore"] == 2
    cid = r["id"]
    assert cat.ddl[cid].params["indexes"][1] == {"v": 2, "key": {"a": 1, "c": -1}, "name": "u", "unique": True}
    drive(cat, cid, until=Phase.COMMIT)
    assert names(cat, "db.c") == ["_id_", "a_1"]  # not listed while the shards build
    (last,) = drive(cat, cid)
    assert [type(e) for e in last] == [d.IndexesCreated, d.DDLFinished]
    assert names(cat, "db.c") == ["_id_", "a_1", "b_1", "u"]
    assert cat.ddl_outcomes[cid]["result"] == {
        "ns": "db.c",
        "numIndexesBefore": 2,
        "numIndexesAfter": 4,
        "indexes": ["b_1", "u"],
        "shards": ["s0"],
    }
    events, r = ok(cat, create("db.c", {"key": {"b": 1}}))  # again: nothing to do
    assert events == [] and not r["started"] and r["note"] == "all indexes already exist"
    assert r["numIndexesBefore"] == r["numIndexesAfter"] == 4


def test_create_indexes_on_a_missing_collection_creates_it_and_its_database():
    cat = catalog("s0", "s1")
    events, r = ok(cat, create("new.c", {"key": {"x": 1}}))
    assert [type(e) for e in events] == [c.DatabaseCreated, c.CollectionCreated, d.DDLStarted]
    assert r["createdCollectionAutomatically"] and r["numIndexesBefore"] == 1
    drive(cat, r["id"])
    assert names(cat, "new.c") == ["_id_", "x_1"]
    assert cat.index_shards("new.c") == [cat.databases["new"].primary]
    _, r = ok(cat, create("new.d", {"key": {"_id": 1}}))  # only _id: created, nothing to build
    assert not r["started"] and r["createdCollectionAutomatically"] and "new.d" in cat.databases["new"].collections


def test_the_build_runs_on_the_shards_that_own_chunks_and_the_primary():
    cat = sharded()
    ok(cat, c.SplitChunk(ns="db.c", at=[{"a": 10}]))
    (mid,) = [ok(cat, c.MoveRange(ns="db.c", min={"a": 10}, to="s2"))[1]["id"]]
    ok(cat, c.CommitMigration(id=mid, min={"a": 10}, max={"a": {"$maxKey": 1}}))
    assert cat.index_shards("db.c") == ["s0", "s2"]


def test_the_same_request_joins_and_another_waits():
    cat = sharded()
    _, r = ok(cat, create("db.c", {"key": {"b": 1}}))
    _, again = ok(cat, create("db.c", {"key": {"b": 1}, "name": "b_1"}))
    assert again["joined"] and again["id"] == r["id"]
    refused(cat, create("db.c", {"key": {"z": 1}}), "ConflictingOperationInProgress")
    refused(cat, d.DropCollectionIndexes(ns="db.c", index="*"), "ConflictingOperationInProgress")
    drive(cat, r["id"])
    _, dr = ok(cat, d.DropCollectionIndexes(ns="db.c", index="b_1"))
    drive(cat, dr["id"], until=Phase.APPLY)  # committed: b_1 is no longer listed
    assert "b_1" not in names(cat, "db.c")
    _, joined = ok(cat, d.DropCollectionIndexes(ns="db.c", index="b_1"))
    assert joined["joined"] and joined["id"] == dr["id"]


def test_a_failed_build_rolls_back_and_lists_nothing():
    cat = sharded()
    _, r = ok(cat, create("db.c", {"key": {"a": 1, "b": 1}, "unique": True}))
    drive(cat, r["id"], until=Phase.BUILD)
    reason = "E11000 duplicate key error collection: db.c index: a_1_b_1 dup key: { a: 1, b: 2 }"
    info = {"keyPattern": {"a": 1, "b": 1}, "keyValue": {"a": 1, "b": 2}}
    ok(
        cat,
        d.AdvanceDDL(id=r["id"], phase=Phase.BUILD, to=Phase.ROLLBACK, code="DuplicateKey", reason=reason, result=info),
    )
    assert cat.ddl[r["id"]].record()["info"] == info
    (finish,) = drive(cat, r["id"])
    assert [type(e) for e in finish] == [d.DDLFinished] and not finish[0].ok
    outcome = cat.ddl_outcomes[r["id"]]
    assert outcome["code"] == "DuplicateKey" and outcome["result"] == info
    with pytest.raises(CommandError) as e:
        sc.ddl_outcome(outcome)
    assert e.value.code == "DuplicateKey" and e.value.info == info
    assert e.value.message == f"Index build failed: db.c :: caused by :: {reason}"
    assert names(cat, "db.c") == ["_id_", "a_1"]


def test_drop_indexes_lists_the_drop_at_commit_then_the_shards_drop():
    cat = sharded()
    _, r = ok(cat, create("db.c", {"key": {"b": 1}}, {"key": {"c": 1}}))
    drive(cat, r["id"])
    _, dr = ok(cat, d.DropCollectionIndexes(ns="db.c", index="*"))
    assert dr["nIndexesWas"] == 4 and dr["names"] == ["b_1", "c_1"]
    steps = drive(cat, dr["id"])
    assert [[type(e) for e in s] for s in steps] == [
        [d.DDLPhaseReached],
        [d.IndexesDropped, d.DDLPhaseReached],
        [d.DDLFinished],
    ]
    assert names(cat, "db.c") == ["_id_", "a_1"]
    assert cat.ddl_outcomes[dr["id"]]["result"] == {"ns": "db.c", "nIndexesWas": 4, "dropped": ["b_1", "c_1"]}
    events, r = ok(cat, d.DropCollectionIndexes(ns="db.c", index="*"))  # nothing left to drop: ok
    assert events == [] and not r["started"] and r["nIndexesWas"] == 2


@pytest.mark.parametrize(
    "cmd, code, fragment",
    [
        (d.DropCollectionIndexes(ns="db.nope", index="*"), "NamespaceNotFound", "ns not found"),
        (d.DropCollectionIndexes(ns="db.c", index="_id_"), "InvalidOptions", "cannot drop _id index"),
        (d.DropCollectionIndexes(ns="db.c", index="a_1"), "CannotDropShardKeyIndex", "shard key"),
        (d.DropCollectionIndexes(ns="db.c", index="x_1"), "IndexNotFound", "x_1"),
        (d.DropCollectionIndexes(ns="db.c", index=["*"]), "BadValue", "'*'"),
        (d.DropCollectionIndexes(ns="bad db.c", index="*"), "InvalidNamespace", ""),
        (create("db.c", {"key": {"b": 1}, "unique": True}), "CannotCreateIndex", "shard key pattern"),
        (create("db.c", {"key": {"b": 1}, "expireAfterSeconds": 5}), "NotImplemented", "TTL"),
        (create("db.c", {"key": {"b": 1}, "bogus": 5}), "InvalidIndexSpecificationOption", "bogus"),
        (create("db.c", {"key": {"b": "text"}}), "CannotCreateIndex", "text"),
        (create("db.c", {"key": {"$b": 1}}), "CannotCreateIndex", "field name"),
        (create("db.c", {"key": {"b": 1}, "name": "a_1"}), "IndexKeySpecsConflict", "same name"),
        (create("db.c"), "BadValue", "at least one index"),
        (create("db.system.x", {"key": {"b": 1}}), "InvalidNamespace", ""),
    ],
)
def test_bad_index_requests_are_refused_with_mongodb_codes_and_record_nothing(cmd, code, fragment):
    cat = sharded()
    before = (dict(cat.ddl), {ns: list(v) for ns, v in cat.indexes.items()}, set(cat.databases))
    refused(cat, cmd, code, fragment)
    assert (dict(cat.ddl), {ns: list(v) for ns, v in cat.indexes.items()}, set(cat.databases)) == before


def test_sharding_a_collection_with_a_unique_index_needs_the_key_as_its_prefix():
    cat = catalog("s0")
    ok(cat, c.CreateCollection(ns="db.u"))
    drive(cat, ok(cat, create("db.u", {"key": {"email": 1}, "unique": True}))[1]["id"])
    refused(cat, c.ShardCollection(ns="db.u", key={"a": 1}), "InvalidOptions", "Uniqueness can't be maintained")
    refused(cat, c.ShardCollection(ns="db.u", key={"email": "hashed"}), "InvalidOptions", "unique index")
    ok(cat, c.ShardCollection(ns="db.u", key={"email": 1}))
    assert names(cat, "db.u") == ["_id_", "email_1"]  # the unique index serves the shard key
    assert cat.index_list("db.u")[1].unique
    refused(cat, d.DropCollectionIndexes(ns="db.u", index="email_1"), "CannotDropShardKeyIndex")


def test_drop_rename_refine_and_persist_carry_the_index_list(tmp_path: Path):
    cat = sharded()
    drive(
        cat,
        ok(cat, create("db.c", {"key": {"b": 1}}, {"key": {"p": 1}, "partialFilterExpression": {"p": {"$gt": 5}}}))[1][
            "id"
        ],
    )
    ok(cat, c.CreateCollection(ns="db.u"))
    drive(cat, ok(cat, create("db.u", {"key": {"x": -1}, "sparse": True}))[1]["id"])
    drive(cat, ok(cat, d.RenameCollection(ns="db.c", to="db.r"))[1]["id"])
    drive(cat, ok(cat, d.RenameCollection(ns="db.u", to="db.v"))[1]["id"])
    assert names(cat, "db.r") == ["_id_", "a_1", "b_1", "p_1"] and cat.indexes.get("db.c") is None
    assert names(cat, "db.v") == ["_id_", "x_-1"] and "db.u" not in cat.indexes
    drive(cat, ok(cat, d.RefineCollectionShardKey(ns="db.r", key={"a": 1, "z": 1}))[1]["id"])
    assert names(cat, "db.r") == ["_id_", "a_1_z_1", "b_1", "p_1"]
    store = Store(tmp_path / "config")
    store.commit(cat.drain_changes().items(), Checkpoint("t", 0, cat.config_time))
    loaded = Catalog()
    loaded.load(store)
    assert {ns: [s.to_mongo() for s in v] for ns, v in loaded.indexes.items()} == {
        ns: [s.to_mongo() for s in v] for ns, v in cat.indexes.items()
    }
    assert loaded.indexes["db.r"][1].partial == {"p": {"$gt": 5}}
    _, dropping = ok(cat, d.DropCollection(ns="db.r"))
    assert dropping["nIndexesWas"] == 4  # _id_, the shard key's, b_1, p_1 (mongos's drop reply)
    drive(cat, dropping["id"])
    drive(cat, ok(cat, d.DropDatabase(db="db"))[1]["id"])
    assert cat.indexes == {}
    store.commit(cat.drain_changes().items(), Checkpoint("t", 0, cat.config_time))
    loaded.load(store)
    assert loaded.indexes == {}
    store.close()


# ------------------------------------------------------------------ wire commands (domain/sharding_commands.py)


def test_create_indexes_command_is_parsed_as_mongos_parses_it():
    r = sc.parse_create_indexes(
        {
            "createIndexes": "c",
            "indexes": [{"key": {"a": 1}, "name": "a_1"}],
            "commitQuorum": "votingMembers",
            "$db": "db",
        }
    )
    assert r.ns == "db.c" and r.indexes == [{"key": {"a": 1}, "name": "a_1"}]
    r = sc.parse_create_indexes(
        {
            "createIndexes": "c",
            "indexes": [{"key": {"a": 1}, "bogus": 1}],
            "ignoreUnknownIndexOptions": True,
            "$db": "db",
        }
    )
    assert r.indexes == [{"key": {"a": 1}}]
    bad = [
        ({"createIndexes": "c", "$db": "db"}, "IDLFailedToParse"),
        ({"createIndexes": "c", "indexes": {"key": {"a": 1}}, "$db": "db"}, "TypeMismatch"),
        ({"createIndexes": "c", "indexes": [], "$db": "db"}, "BadValue"),
        ({"createIndexes": "c", "indexes": [5], "$db": "db"}, "TypeMismatch"),
        ({"createIndexes": "c", "indexes": [{"key": {"a": 1}}], "extra": 1, "$db": "db"}, "IDLUnknownField"),
        ({"createIndexes": 5, "indexes": [{"key": {"a": 1}}], "$db": "db"}, "InvalidNamespace"),
        ({"createIndexes": "", "indexes": [{"key": {"a": 1}}], "$db": "db"}, "InvalidNamespace"),
        ({"createIndexes": "c$x", "indexes": [{"key": {"a": 1}}], "$db": "db"}, "InvalidNamespace"),
        ({"createIndexes": "c", "indexes": [{"key": {"a": "2d"}}], "$db": "db"}, "CannotCreateIndex"),
        ({"createIndexes": "c", "indexes": [{"key": {"a": 1}, "collation": {}}], "$db": "db"}, "NotImplemented"),
    ]
    for cmd, code in bad:
        with pytest.raises(CommandError) as e:
            sc.parse_create_indexes(cmd)
        assert e.value.code == code, (cmd, e.value.code, e.value.message)


def test_drop_and_list_indexes_commands():
    assert sc.parse_drop_indexes({"dropIndexes": "c", "index": "*", "$db": "db"}).index == "*"
    assert sc.parse_drop_indexes({"dropIndexes": "c", "index": {"a": 1}, "$db": "db"}).index == {"a": 1}
    assert sc.parse_drop_indexes({"dropIndexes": "c", "index": ["a_1", "b_1"], "$db": "db"}).index == ["a_1", "b_1"]
    with pytest.raises(CommandError) as e:
        sc.parse_drop_indexes({"dropIndexes": "c", "$db": "db"})
    assert e.value.code == "IDLFailedToParse"
    assert sc.parse_list_indexes({"listIndexes": "c", "cursor": {}, "$db": "db"}) == "db.c"
    cat = sharded()
    assert sc.list_indexes(cat, "db.c") == [
        {"v": 2, "key": {"_id": 1}, "name": "_id_"},
        {"v": 2, "key": {"a": 1}, "name": "a_1"},
    ]
    with pytest.raises(CommandError) as e:
        sc.list_indexes(cat, "db.nope")
    assert e.value.code == "NamespaceNotFound"


def test_replies_have_mongos_shape():
    started = {"createdCollectionAutomatically": True, "numIndexesBefore": 1}
    result = {"numIndexesBefore": 1, "numIndexesAfter": 3, "shards": ["s0", "s1"]}
    reply = index_ddl.create_reply(result, started)
    assert reply == {
        "raw": {
            s: {"createdCollectionAutomatically": True, "numIndexesBefore": 1, "numIndexesAfter": 3, "ok": 1}
            for s in ("s0", "s1")
        },
        "createdCollectionAutomatically": True,
        "numIndexesBefore": 1,
        "numIndexesAfter": 3,
    }
    noop = index_ddl.create_reply({"numIndexesBefore": 2, "numIndexesAfter": 2, "note": "x"}, {})
    assert noop["note"] == "all indexes already exist" and noop["numIndexesAfter"] == 2
    assert index_ddl.drop_reply({"nIndexesWas": 3}, "*") == {"nIndexesWas": 3, "msg": index_ddl.DROPPED_ALL}
    assert index_ddl.drop_reply({"nIndexesWas": 3}, "b_1") == {"nIndexesWas": 3}


def test_build_states_read_a_shards_list_indexes_answer():
    listed = {
        "indexes": [
            {"spec": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            {"spec": {"key": {"b": 1}, "name": "b_1"}, "state": "building", "scanned": 5, "total": 9},
            {"name": "u", "state": "failed", "error": {"code": "DuplicateKey", "errmsg": "E11000"}},
        ]
    }
    assert index_ddl.build_states(listed, ["b_1", "u", "later"]) == {
        "b_1": {"state": "building", "scanned": 5, "total": 9},
        "u": {"state": "failed", "scanned": 0, "total": 0, "error": {"code": "DuplicateKey", "errmsg": "E11000"}},
        "later": {"state": "building", "scanned": 0, "total": 0},
    }


# ------------------------------------------------------------------ the CLI's shaping (cli/indexes.py)


def test_cli_lines():
    from cli import indexes as cli_indexes

    assert cli_indexes.options_text({"unique": True, "partialFilterExpression": {"a": {"$gt": 5}}}) == (
        "unique, partial { a: { '$gt': 5 } }"
    )
    state = {"op": "createIndexes", "ns": "db.c", "phase": "buildIndexes", "id": "0123456789", "startedAt": 100.0}
    builds = {"s1": {"b_1": {"state": "ready"}}, "s0": {"b_1": {"state": "building", "scanned": 40, "total": 90}}}
    line = cli_indexes.build_line(state, builds, 101.0)
    assert line.startswith("createIndexes db.c [buildIndexes] 1.0s (01234567)")
    assert line.endswith("s0:b_1 40/90  s1:b_1 ready")
    started = {"createdCollectionAutomatically": True, "numIndexesBefore": 1}
    done = {"numIndexesBefore": 1, "numIndexesAfter": 2, "indexes": ["b_1"], "shards": ["s0", "s1"]}
    assert cli_indexes.create_human(done, started) == ["created the collection", "built b_1 on s0, s1: 1 -> 2 indexes"]
    noop = {"numIndexesBefore": 3, "numIndexesAfter": 3, "note": "all indexes already exist"}
    assert cli_indexes.create_human(noop, noop) == ["all indexes already exist (3 indexes)"]
