"""domain/sharding_commands: mongos command documents -> config records (MongoDB's codes for
bad input), config results -> mongos replies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain import sharding_commands as sc
from domain.catalog import Catalog
from libs.errors import CommandError
from schemas import config as c


def refused(fn, *args, code: str, text: str = ""):
    with pytest.raises(CommandError) as e:
        fn(*args)
    assert e.value.code == code and text in e.value.message, (e.value.code, e.value.message)


@pytest.fixture
def catalog() -> Catalog:
    cat = Catalog(track_changes=False)
    for i, e in enumerate(
        [
            c.ShardAdded(shard="s0"),
            c.ShardAdded(shard="s1"),
            c.DatabaseCreated(db="app", primary="s0", uuid="u"),
            c.CollectionSharded(
                ns="app.users",
                key={"k": 1},
                unique=False,
                epoch="0" * 24,
                uuid="11111111-2222-3333-4444-555555555555",
                chunks=[
                    c.ChunkDoc(min={"k": {"$minKey": 1}}, max={"k": 10}, shard="s0", version=(1, 0)),
                    c.ChunkDoc(min={"k": 10}, max={"k": {"$maxKey": 1}}, shard="s1", version=(1, 1)),
                ],
            ),
        ]
    ):
        cat.apply(e, i)
    return cat


def test_add_shard_takes_the_name_or_the_replica_set_name():
    assert sc.parse_add_shard({"addShard": "rs1/h:1,h:2"}) == c.AddShard(shard="rs1")
    assert sc.parse_add_shard({"addShard": "h:1", "name": "s9"}) == c.AddShard(shard="s9")
    assert sc.parse_add_shard({"addShard": "s3", "$db": "admin", "lsid": {}}) == c.AddShard(shard="s3")
    refused(sc.parse_add_shard, {"addShard": "bad name"}, code="BadValue")
    refused(sc.parse_add_shard, {"addShard": 5}, code="TypeMismatch")
    refused(sc.parse_add_shard, {"addShard": "s3", "nope": 1}, code="IDLUnknownField", text="addShard.nope")


def test_remove_shard_replies_as_mongos():
    assert sc.remove_shard_reply({"state": "completed", "shard": "s1"}) == {
        "msg": "removeshard completed successfully",
        "state": "completed",
        "shard": "s1",
    }
    started = sc.remove_shard_reply({"state": "started", "shard": "s1", "remaining": {"chunks": 3, "dbs": ["a"]}})
    assert started["msg"] == "draining started successfully" and started["dbsToMove"] == ["a"]
    assert "remaining" not in started
    ongoing = sc.remove_shard_reply({"state": "ongoing", "shard": "s1", "remaining": {"chunks": 3, "dbs": ["a"]}})
    assert ongoing["msg"] == "draining ongoing"
    assert ongoing["remaining"] == {"chunks": 3, "dbs": 1, "jumboChunks": 0, "collectionsToMove": 0}


def test_shard_collection_fields_and_codes():
    assert sc.parse_shard_collection({"shardCollection": "a.b", "key": {"x": "hashed"}, "numInitialChunks": 4}) == (
        c.ShardCollection(ns="a.b", key={"x": "hashed"}, numInitialChunks=4)
    )
    refused(sc.parse_shard_collection, {"shardCollection": "a.b"}, code="IDLFailedToParse", text="key")
    refused(sc.parse_shard_collection, {"shardCollection": "nodot", "key": {"x": 1}}, code="InvalidNamespace")
    refused(sc.parse_shard_collection, {"shardCollection": "a.b", "key": [1]}, code="TypeMismatch")
    refused(sc.parse_shard_collection, {"shardCollection": "a.b", "key": {"x": 1}, "unique": 1}, code="TypeMismatch")
    refused(
        sc.parse_shard_collection,
        {"shardCollection": "a.b", "key": {"x": 1}, "presplitHashedZones": True},
        code="NotImplemented",
    )
    assert sc.shard_collection_reply(c.ShardCollection(ns="a.b", key={"x": 1}), {}) == {"collectionsharded": "a.b"}


def test_split_middle_find_bounds(catalog):
    assert sc.parse_split({"split": "app.users", "middle": {"k": 5}}, catalog) == sc.SplitRequest(
        "app.users", at=[{"k": 5}]
    )
    by_doc = sc.parse_split({"split": "app.users", "find": {"k": 50}}, catalog)
    assert by_doc.find == {"k": 50} and by_doc.owner == "s1"
    by_bounds = sc.parse_split({"split": "app.users", "bounds": [{"k": {"$minKey": 1}}, {"k": 10}]}, catalog)
    assert by_bounds.chunk_min == {"k": {"$minKey": 1}} and by_bounds.owner == "s0"
    refused(sc.parse_split, {"split": "app.users", "bounds": [{"k": 0}, {"k": 10}]}, catalog, code="BadValue")
    refused(sc.parse_split, {"split": "app.users"}, catalog, code="BadValue")
    refused(sc.parse_split, {"split": "app.other", "middle": {"k": 1}}, catalog, code="NamespaceNotSharded")
    refused(sc.median_points, {"points": [], "jumbo": True}, code="CannotSplit", text="jumbo")
    assert sc.median_points({"points": [{"k": 3}]}) == [{"k": 3}]


def test_move_chunk_is_the_whole_chunk(catalog):
    rec = sc.parse_move_chunk({"moveChunk": "app.users", "find": {"k": 3}, "to": "s1", "_waitForDelete": True}, catalog)
    assert rec == c.MoveRange(ns="app.users", min={"k": {"$minKey": 1}}, max={"k": 10}, to="s1", waitForDelete=True)
    refused(sc.parse_move_chunk, {"moveChunk": "app.users", "find": {"k": 3}}, catalog, code="IDLFailedToParse")
    refused(sc.parse_move_chunk, {"moveChunk": "app.users", "to": "s1"}, catalog, code="BadValue")
    assert sc.parse_move_range({"moveRange": "app.users", "min": {"k": 10}, "toShard": "s0"}) == c.MoveRange(
        ns="app.users", min={"k": 10}, to="s0"
    )


def test_zones_and_settings():
    assert sc.parse_update_zone_key_range(
        {"updateZoneKeyRange": "a.b", "min": {"x": 1}, "max": {"x": 2}, "zone": None}
    ) == c.RemoveZoneRange(ns="a.b", min={"x": 1}, max={"x": 2})
    assert sc.parse_update_zone_key_range(
        {"updateZoneKeyRange": "a.b", "min": {"x": 1}, "max": {"x": 2}, "zone": "EU"}
    ) == c.AssignZoneRange(ns="a.b", min={"x": 1}, max={"x": 2}, zone="EU")
    refused(
        sc.parse_update_zone_key_range,
        {"updateZoneKeyRange": "a.b", "min": {"x": 1}, "max": {"x": 2}},
        code="IDLFailedToParse",
    )
    assert sc.parse_add_shard_to_zone({"addShardToZone": "s0", "zone": "EU"}) == c.AddShardToZone(shard="s0", zone="EU")
    assert sc.parse_configure_collection_balancing({"configureCollectionBalancing": "a.b", "chunkSize": 0}) == [
        c.SetSetting(ns="a.b", key="maxChunkSizeBytes", value=None)
    ]
    refused(
        sc.parse_configure_collection_balancing,
        {"configureCollectionBalancing": "a.b", "chunkSize": 2000},
        code="BadValue",
    )


def test_balancer_replies(catalog):
    assert sc.balancer_status_reply(catalog, {"round": 4, "inFlight": [{}], "lastRound": {"round": 3}}) == {
        "mode": "full",
        "inBalancerRound": True,
        "numBalancerRounds": 4,
    }
    reply = sc.collection_status_reply(
        catalog, "app.users", {"compliant": False, "violations": [{"reason": "zoneViolation"}]}
    )
    assert reply["chunkSize"] == 128.0 and reply["balancerCompliant"] is False
    assert reply["firstComplianceViolation"] == "zoneViolation"


NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=10)
VALUES = st.one_of(
    st.integers(-(2**40), 2**40), st.text(max_size=5), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)
)


@given(field=NAMES, value=VALUES)
def test_a_command_never_fails_with_anything_but_a_command_error(field, value):
    """Any field with any value: a record or a CommandError with a MongoDB-numbered or known code."""
    cmd = {"shardCollection": "a.b", "key": {"x": 1}, field: value}
    try:
        rec = sc.parse_shard_collection(cmd)
    except CommandError as e:
        assert e.code in {"IDLUnknownField", "TypeMismatch", "InvalidOptions", "BadValue"}, e.code
    else:
        assert rec.ns == "a.b" and rec.key == {"x": 1}
