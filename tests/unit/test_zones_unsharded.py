"""Zone ranges of a namespace not sharded yet (issue 18, point 9): recorded as MongoDB 4.0.2+
records them, checked against the shard key when the collection is sharded, the empty
collection's first chunks cut at their bounds on the zones' shards; persisted and replayed."""

from __future__ import annotations

from pathlib import Path

from cli.status import status_document
from domain.catalog import Catalog
from domain.shardkey import to_ejson
from libs.store import Checkpoint, Store
from schemas import config as c
from services.router.wire.config_db import tags
from tests.unit.test_config_decide import MAXK, MINK, catalog, check_chunk_invariants, chunks, ok, refused


def zoned(*shards: str) -> Catalog:
    """Shards a, b, c; a in zone EU, b and c in zone US."""
    cat = catalog(*(shards or ("a", "b", "c")))
    ok(cat, c.AddShardToZone(shard="a", zone="EU"))
    ok(cat, c.AddShardToZone(shard="b", zone="US"))
    ok(cat, c.AddShardToZone(shard="c", zone="US"))
    return cat


def ranges(cat: Catalog, ns: str) -> list[tuple]:
    return [(z.zone, to_ejson(z.min), to_ejson(z.max)) for z in cat.zone_ranges(ns)]


def test_add_range_on_a_namespace_not_sharded_is_recorded():
    cat = zoned()
    _, result = ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    assert result == {"ns": "d.x", "zone": "US"}
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": MINK}, max={"k": 10}, zone="EU"))
    assert ranges(cat, "d.x") == [("EU", {"k": MINK}, {"k": 10}), ("US", {"k": 10}, {"k": 20})]
    # the same range again: ok, nothing new
    events, _ = ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    assert events == []
    assert [t["tag"] for t in tags(cat) if t["ns"] == "d.x"] == ["EU", "US"]
    assert [z["zone"] for z in status_document(cat, verbose=False)["unshardedZones"]] == ["EU", "US"]
    assert cat.zone_in_use("US")  # the last shard of US cannot leave it while the range is there
    ok(cat, c.RemoveShardFromZone(shard="c", zone="US"))
    refused(cat, c.RemoveShardFromZone(shard="b", zone="US"), "ZoneStillInUse")


def test_bad_bounds_on_a_namespace_not_sharded_are_refused_and_change_nothing():
    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 0}, max={"k": 10}, zone="US"))
    for lo, hi, code, fragment in [
        ({"k": 5}, {"j": 6}, "BadValue", "same fields"),
        ({"k": 5, "j": 1}, {"j": 1, "k": 6}, "BadValue", "same fields"),
        ({}, {}, "BadValue", "same fields"),
        ({"k": 6}, {"k": 5}, "BadValue", "below"),
        ({"k": 5}, {"k": 5}, "BadValue", "below"),
        ({"k": [1]}, {"k": [2]}, "BadValue", "arrays"),
        ({"$k": 1}, {"$k": 2}, "BadValue", ""),
        ({"j": 1}, {"j": 2}, "BadValue", "name the fields k"),
        ({"k": 5}, {"k": 15}, "RangeOverlapConflict", "overlaps"),
    ]:
        refused(cat, c.AssignZoneRange(ns="d.x", min=lo, max=hi, zone="US"), code, fragment)
        assert ranges(cat, "d.x") == [("US", {"k": 0}, {"k": 10})]
    refused(cat, c.AssignZoneRange(ns="d.x", min={"k": 20}, max={"k": 30}, zone="nowhere"), "ZoneNotFound")
    refused(cat, c.AssignZoneRange(ns="nodot", min={"k": 20}, max={"k": 30}, zone="US"), "InvalidNamespace")


def test_remove_range_on_a_namespace_not_sharded():
    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 0}, max={"k": 10}, zone="US"))
    events, result = ok(cat, c.RemoveZoneRange(ns="d.x", min={"k": 0}, max={"k": 10}))
    assert result == {"ns": "d.x", "zone": "US"} and len(events) == 1
    assert ranges(cat, "d.x") == [] and "d.x" not in cat.unsharded_zones
    events, result = ok(cat, c.RemoveZoneRange(ns="d.x", min={"k": 0}, max={"k": 10}))
    assert events == [] and result["zone"] is None  # nothing to remove: ok, as MongoDB answers
    ok(cat, c.RemoveShardFromZone(shard="b", zone="US"))
    ok(cat, c.RemoveShardFromZone(shard="c", zone="US"))  # the zone is no longer in use


def test_sharding_an_empty_collection_cuts_its_chunks_at_the_zone_bounds_on_the_zones_shards():
    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": MINK}, max={"k": 0}, zone="EU"))
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 20}, max={"k": 30}, zone="US"))
    _, result = ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    primary = result["primary"]
    check_chunk_invariants(cat, "d.x")
    assert [(lo, hi, s) for lo, hi, s, _ in chunks(cat, "d.x")] == [
        ({"k": MINK}, {"k": 0}, "a"),
        ({"k": 0}, {"k": 10}, primary),
        ({"k": 10}, {"k": 20}, "b"),
        ({"k": 20}, {"k": 30}, "c"),  # the zone's shards in turn
        ({"k": 30}, {"k": MAXK}, primary),
    ]
    assert result["chunks"] == 5
    # the ranges are the collection's zones now, keyed by its shard key
    assert cat.unsharded_zones == {}
    assert ranges(cat, "d.x") == [
        ("EU", {"k": MINK}, {"k": 0}),
        ("US", {"k": 10}, {"k": 20}),
        ("US", {"k": 20}, {"k": 30}),
    ]
    ok(cat, c.RemoveZoneRange(ns="d.x", min={"k": 20}, max={"k": 30}))
    assert len(cat.collections["d.x"].zones) == 2


def test_sharding_a_collection_with_documents_keeps_one_chunk_and_the_zones():
    cat = zoned()
    ok(cat, c.CreateCollection(ns="d.x"))
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    _, result = ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    assert [(lo, hi, s) for lo, hi, s, _ in chunks(cat, "d.x")] == [({"k": MINK}, {"k": MAXK}, result["primary"])]
    assert [z.zone for z in cat.collections["d.x"].zones] == ["US"]  # the balancer moves the range there


def test_sharding_on_a_key_the_zone_ranges_do_not_name_is_refused():
    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    for key in ({"j": 1}, {"k": 1, "j": 1}, {"j": 1, "k": 1}):
        refused(cat, c.ShardCollection(ns="d.x", key=key), "InvalidOptions", "does not match the existing zone")
        assert "d.x" not in cat.collections and ranges(cat, "d.x") == [("US", {"k": 10}, {"k": 20})]
    ok(cat, c.ShardCollection(ns="d.x", key={"k": 1}))
    # a hashed field's bounds are hashes (64-bit integers), not values
    ok(cat, c.AssignZoneRange(ns="d.h", min={"k": "a"}, max={"k": "m"}, zone="US"))
    refused(cat, c.ShardCollection(ns="d.h", key={"k": "hashed"}), "InvalidOptions", "64-bit")
    assert "d.h" not in cat.collections


def test_hashed_key_with_zone_ranges_of_hashes():
    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.h", min={"k": MINK}, max={"k": {"$numberLong": "0"}}, zone="EU"))
    ok(cat, c.ShardCollection(ns="d.h", key={"k": "hashed"}))
    check_chunk_invariants(cat, "d.h")
    assert [s for _, _, s, _ in chunks(cat, "d.h")][0] == "a"


def test_zone_ranges_of_a_namespace_not_sharded_survive_a_restart_and_a_replay(tmp_path: Path):
    cat = zoned()
    log: list = []

    def record(cmd):
        events, _ = ok(cat, cmd)
        log.extend(events)

    record(c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    record(c.AssignZoneRange(ns="d.x", min={"k": 30}, max={"k": 40}, zone="EU"))
    record(c.AssignZoneRange(ns="e.y", min={"a": 1, "b": MINK}, max={"a": 2, "b": MINK}, zone="EU"))
    record(c.RemoveZoneRange(ns="d.x", min={"k": 30}, max={"k": 40}))
    store = Store(tmp_path / "config")
    try:
        store.commit(cat.drain_changes().items(), Checkpoint("config.events", 0, cat.config_time))
        loaded = Catalog()
        loaded.load(store)
        assert ranges(loaded, "d.x") == [("US", {"k": 10}, {"k": 20})]
        assert ranges(loaded, "e.y") == [("EU", {"a": 1, "b": MINK}, {"a": 2, "b": MINK})]
        assert [z.min_key for z in loaded.zone_ranges("d.x")] == [z.min_key for z in cat.zone_ranges("d.x")]
        assert status_document(loaded, verbose=True) == status_document(cat, verbose=True)
        # sharded after the restart: the loaded ranges cut the chunks, and the zones persist too
        _, result = ok(loaded, c.ShardCollection(ns="d.x", key={"k": 1}))
        assert result["chunks"] == 3
        store.commit(loaded.drain_changes().items(), Checkpoint("config.events", 0, loaded.config_time))
        again = Catalog()
        again.load(store)
        assert again.unsharded_zones.keys() == {"e.y"}
        assert "d.x" in again.collections and ranges(again, "d.x") == [("US", {"k": 10}, {"k": 20})]
        assert status_document(again, verbose=True) == status_document(loaded, verbose=True)
    finally:
        store.close()
    # a replay of the events from the start: the same ranges
    replayed = Catalog(track_changes=False)
    for s in ("a", "b", "c"):
        replayed.apply(c.ShardAdded(shard=s), -1)
    for s, z in (("a", "EU"), ("b", "US"), ("c", "US")):
        replayed.apply(c.ShardZoneAdded(shard=s, zone=z), -1)
    for e in log:
        replayed.apply(e, -1)
    assert ranges(replayed, "d.x") == ranges(cat, "d.x") and ranges(replayed, "e.y") == ranges(cat, "e.y")


def test_dropping_the_namespace_forgets_its_zone_ranges():
    from schemas import ddl as dd

    cat = zoned()
    ok(cat, c.AssignZoneRange(ns="d.x", min={"k": 10}, max={"k": 20}, zone="US"))
    cat.drain_changes()
    cat.apply(dd.CollectionDropped(ns="d.x"), -1)
    assert ranges(cat, "d.x") == [] and not cat.zone_in_use("US")
    assert list(cat.drain_changes().values()) == [None]
