"""Issue 18, points 3, 8 and 12, in pure logic: removeShard refuses the last shard of a zone
with key ranges (ZoneStillInUse, as MongoDB), a drain stranded by its zone shows the
`noTarget` blocker with the zone and its ranges, `balancer collection-status` names it,
and the statistics the balancer reads give every chunk the size of its data as soon as
a migration is in the catalog (no report of a former layout counts).  No Kafka."""

from __future__ import annotations

from domain.catalog import Catalog
from domain.versions import new_epoch, new_uuid
from schemas import config as c
from schemas import stats
from services.balancer import draining
from services.balancer.statistics import StatisticsReader
from tests.unit.test_config_decide import MAXK, MINK, catalog, ok, refused


def sharded(cat: Catalog, layout: list[tuple[object, object, str]], ns: str = "d.c") -> None:
    """`ns` sharded on {k: 1} with chunks [(min k, max k, shard)], applied as the config server would."""
    if "d" not in cat.databases:
        ok(cat, c.CreateDatabase(db="d", primary=layout[0][2]))
    cat.apply(
        c.CollectionSharded(
            ns=ns,
            key={"k": 1},
            unique=False,
            epoch=new_epoch(),
            uuid=new_uuid(),
            chunks=[
                c.ChunkDoc(min={"k": lo}, max={"k": hi}, shard=s, version=(1, i))
                for i, (lo, hi, s) in enumerate(layout)
            ],
        ),
        cat.config_time,
    )


def zoned() -> Catalog:
    """Shards a, b, x; b alone in zone z, which holds [0, 10) of d.c; b owns [0, MaxKey)."""
    cat = catalog("a", "b", "x")
    sharded(cat, [(MINK, 0, "a"), (0, MAXK, "b")])
    ok(cat, c.AddShardToZone(shard="b", zone="z"))
    ok(cat, c.AssignZoneRange(ns="d.c", min={"k": 0}, max={"k": 10}, zone="z"))
    return cat


# ------------------------------------------------------------------ point 3


def test_remove_shard_refuses_the_last_shard_of_a_zone_with_ranges():
    cat = zoned()
    e = refused(cat, c.RemoveShard(shard="b"), "ZoneStillInUse", "'b'", "zone 'z'", "d.c")
    assert e.code == "ZoneStillInUse"
    assert not cat.shards["b"].draining  # nothing recorded (`refused` checks the whole catalog)


def test_remove_shard_is_allowed_once_another_shard_is_in_the_zone():
    cat = zoned()
    ok(cat, c.AddShardToZone(shard="x", zone="z"))
    events, result = ok(cat, c.RemoveShard(shard="b"))
    assert events == [c.ShardDraining(shard="b")] and result["state"] == "started"


def test_remove_shard_of_a_zone_without_ranges_is_allowed():
    cat = catalog("a", "b")
    sharded(cat, [(MINK, 0, "a"), (0, MAXK, "b")])
    ok(cat, c.AddShardToZone(shard="b", zone="empty"))
    assert ok(cat, c.RemoveShard(shard="b"))[1]["state"] == "started"


def test_a_draining_shard_does_not_count_as_the_zones_other_member():
    cat = zoned()
    ok(cat, c.AddShardToZone(shard="x", zone="z"))
    ok(cat, c.AddShardToZone(shard="a", zone="z"))
    ok(cat, c.RemoveShard(shard="x"))  # x drains (it owns nothing: removed at once)
    assert "x" not in cat.shards
    cat2 = zoned()
    ok(cat2, c.AddShardToZone(shard="a", zone="z"))
    ok(cat2, c.RemoveShard(shard="a"))  # a drains: it owns [MinKey, 0)
    assert cat2.shards["a"].draining
    refused(cat2, c.RemoveShard(shard="b"), "ZoneStillInUse", "zone 'z'")


def test_drain_stranded_after_it_began_shows_no_target_with_the_zone_and_its_ranges():
    cat = zoned()
    ok(cat, c.AddShardToZone(shard="x", zone="z"))
    ok(cat, c.RemoveShard(shard="b"))  # allowed: x is in z too
    assert draining.removal_status(cat, "b")["blockers"] == []
    ok(cat, c.RemoveShardFromZone(shard="x", zone="z"))  # MongoDB allows it: b is still in z
    blockers = draining.removal_status(cat, "b")["blockers"]
    assert [(b["reason"], b["ns"], b["zone"]) for b in blockers] == [("noTarget", "d.c", "z")], blockers
    assert blockers[0]["ranges"] == [{"min": {"k": 0}, "max": {"k": 10}}]
    assert "zone 'z'" in blockers[0]["detail"] and '{"k": 0}' in blockers[0]["detail"]
    # the remedy clears it
    ok(cat, c.AddShardToZone(shard="a", zone="z"))
    assert draining.removal_status(cat, "b")["blockers"] == []


def test_no_target_only_for_zones_whose_ranges_hold_the_shards_chunks():
    cat = catalog("a", "b", "x")
    sharded(cat, [(MINK, 0, "a"), (0, 20, "x"), (20, MAXK, "b")])
    ok(cat, c.AddShardToZone(shard="b", zone="z"))
    ok(cat, c.AddShardToZone(shard="x", zone="z"))
    ok(cat, c.AssignZoneRange(ns="d.c", min={"k": 0}, max={"k": 10}, zone="z"))  # x's chunk, not b's
    ok(cat, c.RemoveShard(shard="x"))
    assert draining.removal_status(cat, "x")["blockers"] == []  # b may take it
    ok(cat, c.RemoveShardFromZone(shard="b", zone="z"))
    assert [b["zone"] for b in draining.removal_status(cat, "x")["blockers"]] == ["z"]
    assert draining.stranded(cat, "b") == []  # b owns nothing in z's range


# ------------------------------------------------------------------ point 12: sizes after a migration


def report(shard: str, config_time: int, chunks: list[tuple[object, object, int]], ns: str = "d.c"):
    return stats.ShardStatistics(
        shard=shard,
        configTime=config_time,
        timestamp=0.0,
        windowSeconds=1.0,
        chunks=[
            stats.ChunkStatistics(
                ns=ns,
                min={"k": lo},
                max={"k": hi},
                documents=1,
                dataSizeBytes=size,
                bytesWrittenSinceLastReport=0,
            )
            for lo, hi, size in chunks
        ],
        collections=[],
    )


def sizes_of(cat: Catalog, reader: StatisticsReader) -> list[tuple[str, int | None]]:
    """(owner, the size the balancer reads for it; None: unknown) of each chunk, in key order."""
    known, _ = reader.sizes(cat)
    return [(ch.shard, known.get(("d.c", ch.min_key))) for ch in cat.collections["d.c"].chunks]


def test_a_former_owners_report_does_not_size_a_chunk_it_no_longer_has():
    """A moveRange split [0, Max) on b and moved [0, 50) to a: b's report from before
    describes [0, Max), a's report describes [0, 50); neither may size the other's
    chunk (before: b's old [0, Max) gave [0, 50) b's whole size, or overwrote a's)."""
    cat = catalog("a", "b")
    sharded(cat, [(MINK, 0, "a"), (0, 50, "a"), (50, MAXK, "b")])
    t = cat.config_time
    reader = StatisticsReader.__new__(StatisticsReader)
    reader.latest = {
        "a": report("a", t, [(MINK, 0, 100), (0, 50, 500)]),  # after the migration
        "b": report("b", t - 1, [(0, MAXK, 1000)]),  # before it: [0, Max) was all b's
    }
    got = sizes_of(cat, reader)
    assert got == [("a", 100), ("a", 500), ("b", None)], got  # [50, Max): unknown until b reports, not 1000


def test_a_whole_chunk_move_keeps_its_reported_size_until_the_recipient_reports():
    cat = catalog("a", "b")
    sharded(cat, [(MINK, 0, "a"), (0, MAXK, "a")])
    t = cat.config_time
    reader = StatisticsReader.__new__(StatisticsReader)
    reader.latest = {"b": report("b", t - 1, [(0, MAXK, 700)]), "a": report("a", t - 1, [(MINK, 0, 5)])}
    got = sizes_of(cat, reader)
    assert got == [("a", 5), ("a", 700)], got  # the same data, whoever reported it
