"""The balancer's chunk-selection policy (services/balancer/policy.py): pure, no Kafka."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from cli.balancer import balancer_app
from domain.catalog import Catalog
from schemas import config as ev
from schemas.export import OUT
from services.balancer import policy, snapshot

MAXC = 10  # max chunk size in bytes: small numbers keep the arithmetic readable
MIN, MAX = {"$minKey": 1}, {"$maxKey": 1}
STEP = 10  # chunk i is [i*STEP, (i+1)*STEP), the first from MinKey, the last to MaxKey


def bound(i: int, n: int) -> dict:
    return {"x": MIN if i == 0 else MAX if i == n else i * STEP}


def chunks(*owners: tuple) -> list[dict]:
    """One chunk per (shard, sizeBytes[, jumbo]), contiguous over {x: 1}."""
    n = len(owners)
    return [
        {
            "min": bound(i, n),
            "max": bound(i + 1, n),
            "shard": o[0],
            "sizeBytes": o[1],
            "jumbo": o[2] if len(o) > 2 else False,
        }
        for i, o in enumerate(owners)
    ]


def coll(owners, zones=(), ns="db.c", **kw) -> dict:
    """`zones`: (zone, lo, hi) over x; None for MinKey / MaxKey."""
    return {
        "ns": ns,
        "key": {"x": 1},
        "chunks": chunks(*owners),
        "zones": [
            {"zone": z, "min": {"x": MIN if lo is None else lo}, "max": {"x": MAX if hi is None else hi}}
            for z, lo, hi in zones
        ],
        **kw,
    }


def snap(shards, *colls, max_chunk=MAXC) -> dict:
    shards = [{"id": s} if isinstance(s, str) else s for s in shards]
    return {"settings": {"maxChunkSizeBytes": max_chunk}, "shards": shards, "collections": list(colls)}


def moves(s: dict) -> list[tuple]:
    return [(m["from"], m["to"], m["reason"]) for m in policy.plan(s).to_json()["migrations"]]


# ------------------------------------------------------------------- rule 1: drain


def test_a_balanced_cluster_needs_nothing():
    p = policy.plan(snap(["S0", "S1"], coll([("S0", 20), ("S1", 20)])))
    assert p.to_json() == {"splits": [], "migrations": []}


def test_draining_comes_first_and_moves_the_first_chunk_whole_to_the_least_loaded_shard():
    s = snap(
        [{"id": "S0", "draining": True}, "S1", "S2", "S3"],
        coll([("S0", 5), ("S0", 5), ("S1", 100), ("S2", 40), ("S3", 0)]),
    )
    m = policy.plan(s).to_json()["migrations"]
    # S3 (least loaded) takes S0's first chunk; S1 -> S2 is then the only pair left, but S2's 40 is not
    # below the ideal, 150 / 4 = 37: the draining S0 is one of the shards the ideal counts (MongoDB's).
    assert m[0] == {"ns": "db.c", "from": "S0", "to": "S3", "min": {"x": MIN}, "max": {"x": 10}, "reason": "drain"}
    assert [(x["from"], x["to"], x["reason"]) for x in m[1:]] == []
    s["collections"][0]["chunks"][3]["sizeBytes"] = 30  # the ideal is 140 / 4 = 35: S2 is below it
    assert moves(s) == [("S0", "S3", "drain"), ("S1", "S2", "chunksImbalance")]


def test_draining_takes_the_recipient_an_imbalance_would_have_used():
    s = snap([{"id": "S0", "draining": True}, "S1", "S2"], coll([("S0", 5), ("S1", 100), ("S2", 0)]))
    assert moves(s) == [("S0", "S2", "drain")]


def test_a_jumbo_chunk_is_forced_off_a_draining_shard():
    s = snap([{"id": "S0", "draining": True}, "S1"], coll([("S0", 500, True), ("S1", 0)]))
    assert moves(s) == [("S0", "S1", "drain")]


def test_a_drained_chunk_goes_to_a_shard_of_its_zone():
    s = snap(
        [{"id": "S0", "draining": True}, "S1", {"id": "S2", "zones": ["a"]}],
        coll([("S1", 0), ("S0", 5), ("S2", 90)], zones=[("a", 10, 20)]),
    )
    assert moves(s) == [("S0", "S2", "drain")]  # S1 holds less but is not in zone a


# ------------------------------------------------------------ rule 2: zone violations


def test_a_chunk_in_a_zone_on_a_shard_outside_the_zone_moves_whole_into_the_zone():
    # To the shard of the zone with the least data *in the zone*: S2, though S1 holds less overall.
    s = snap(
        ["S0", {"id": "S1", "zones": ["a"]}, {"id": "S2", "zones": ["a"]}],
        coll([("S0", 1), ("S0", 1), ("S1", 50), ("S2", 80), ("S2", 0)], zones=[("a", 10, 20), ("a", 20, 30)]),
    )
    m = policy.plan(s).to_json()["migrations"]
    assert m == [
        {"ns": "db.c", "from": "S0", "to": "S2", "min": {"x": 10}, "max": {"x": 20}, "reason": "zoneViolation"}
    ]


def test_a_jumbo_chunk_violating_its_zone_is_not_selected():
    s = snap(["S0", {"id": "S1", "zones": ["a"]}], coll([("S0", 1), ("S0", 1, True), ("S1", 1)], zones=[("a", 10, 20)]))
    assert moves(s) == []
    assert [v.reason for v in policy.violations(s, "db.c")] == ["zoneViolation", "jumbo"]


def test_a_zone_without_shards_leaves_its_chunks_in_place():
    s = snap(["S0", "S1"], coll([("S0", 1), ("S0", 1), ("S1", 1)], zones=[("nowhere", 10, 20)]))
    assert moves(s) == []


# ----------------------------------------------------------- splits at zone boundaries


def test_a_chunk_crossing_zone_boundaries_is_split_there_and_not_moved():
    # [10, 20) holds zone a's [13, 17): split at both; it sits on S0, outside the zone, yet stays.
    s = snap(["S0", {"id": "S1", "zones": ["a"]}], coll([("S0", 1), ("S0", 1), ("S1", 1)], zones=[("a", 13, 17)]))
    p = policy.plan(s).to_json()
    assert p["splits"] == [{"ns": "db.c", "chunk": {"min": {"x": 10}, "max": {"x": 20}}, "at": [{"x": 13}, {"x": 17}]}]
    assert p["migrations"] == []


def test_a_zone_on_chunk_boundaries_needs_no_split():
    s = snap(
        ["S0", {"id": "S1", "zones": ["a"]}], coll([("S0", 1), ("S1", 1), ("S1", 1), ("S0", 1)], zones=[("a", 10, 30)])
    )
    assert policy.plan(s).splits == []


def test_a_zone_reaching_maxkey_splits_only_at_its_min():
    s = snap(
        ["S0", {"id": "S1", "zones": ["a"]}],
        {
            "ns": "db.c",
            "key": {"x": 1},
            "chunks": chunks(("S1", 1), ("S1", 1)),
            "zones": [{"zone": "a", "min": {"x": 15}, "max": {"x": MAX}}],
        },
    )
    assert [sp["at"] for sp in policy.plan(s).to_json()["splits"]] == [[{"x": 15}]]


# ---------------------------------------------------------------- rule 3: imbalance


@pytest.mark.parametrize("donor_bytes, expected", [(29, []), (30, [("S0", "S1", "chunksImbalance")])])
def test_imbalance_needs_at_least_three_max_chunk_sizes(donor_bytes, expected):
    assert moves(snap(["S0", "S1"], coll([("S0", donor_bytes), ("S1", 0)]))) == expected


def test_an_imbalance_moves_up_to_one_max_chunk_size_from_the_min_of_the_donors_first_chunk():
    s = snap(["S0", "S1"], coll([("S1", 0), ("S0", 5, True), ("S0", 100), ("S0", 100)]))
    assert policy.plan(s).to_json()["migrations"] == [
        {"ns": "db.c", "from": "S0", "to": "S1", "min": {"x": 20}, "max": None, "reason": "chunksImbalance"}
    ]


def test_the_donor_must_hold_more_than_its_ideal():
    # S0 is busy: among S1 and S2 the gap is 50 > 30, but S1 is below the ideal (1150 / 3).
    s = snap([{"id": "S0", "available": False}, "S1", "S2"], coll([("S0", 1000), ("S1", 100), ("S2", 50)]))
    assert moves(s) == []


def test_the_recipient_must_hold_less_than_its_ideal():
    # S0 is busy and empty: S2 holds 160, above the ideal of 120, so it takes nothing from S1.
    s = snap([{"id": "S0", "available": False}, "S1", "S2"], coll([("S0", 0), ("S1", 200), ("S2", 160)]))
    assert moves(s) == []
    s["shards"][0]["available"] = True
    assert moves(s) == [("S1", "S0", "chunksImbalance")]


def test_each_zone_is_balanced_among_its_own_shards():
    shards = [{"id": "S0", "zones": ["a"]}, {"id": "S1", "zones": ["a"]}, "S2", "S3"]
    s = snap(shards, coll([("S0", 100), ("S1", 0), ("S2", 50), ("S3", 50)], zones=[("a", None, 20)]))
    # zone a: S0 -> S1; outside the zone all four may hold data: S2 and S3 are at the
    # ideal (200 / 4) and the only shards below it are taken.
    assert moves(s) == [("S0", "S1", "chunksImbalance")]


def test_weights_shard_capacity():
    assert moves(snap([{"id": "S0", "weight": 2}, "S1"], coll([("S0", 200), ("S1", 100)]))) == []
    assert moves(snap([{"id": "S0", "weight": 2}, "S1"], coll([("S0", 150), ("S1", 150)]))) == [
        ("S1", "S0", "chunksImbalance")
    ]
    assert moves(snap(["S0", "S1"], coll([("S0", 150), ("S1", 150)]))) == []


def apply(s: dict, plan: dict) -> None:
    """Carry out a plan whose ranges are whole chunks of at most one max chunk size."""
    for m in plan["migrations"]:
        c = next(c for col in s["collections"] if col["ns"] == m["ns"] for c in col["chunks"] if c["min"] == m["min"])
        assert c["shard"] == m["from"] and c["sizeBytes"] <= MAXC
        c["shard"] = m["to"]


def held(s: dict) -> dict[str, int]:
    out = {sh["id"]: 0 for sh in s["shards"]}
    for c in s["collections"][0]["chunks"]:
        out[c["shard"]] += c["sizeBytes"]
    return out


def test_rounds_converge_with_a_weight_two_shard_holding_twice_the_data():
    s = snap([{"id": "S0", "weight": 2}, "S1", "S2"], coll([("S1", MAXC)] * 80))
    for _ in range(200):
        p = policy.plan(s).to_json()
        if not p["migrations"]:
            break
        apply(s, p)
    else:
        pytest.fail("the rounds did not converge")
    d = held(s)
    assert sum(d.values()) == 800
    assert abs(d["S0"] / 2 - d["S1"]) <= 3 * MAXC and abs(d["S0"] / 2 - d["S2"]) <= 3 * MAXC, d
    assert d["S0"] >= 360  # ~ twice each of the others: 400 / 200 / 200


def test_up_to_half_the_shards_migrate_in_parallel_each_at_most_once():
    for n in (2, 7, 10):
        owners = [(f"S{i}", 1000 if i < n // 2 else 0) for i in range(n)]
        m = moves(snap([o[0] for o in owners], coll(owners)))
        assert len(m) == n // 2
        used = [x for f, t, _ in m for x in (f, t)]
        assert len(used) == len(set(used))


def test_one_round_spans_collections_without_reusing_a_shard():
    s = snap(
        ["S0", "S1", "S2", "S3"],
        coll([("S0", 100), ("S1", 0), ("S2", 0), ("S3", 0)], ns="db.a"),
        coll([("S0", 100), ("S1", 100), ("S2", 100), ("S3", 0)], ns="db.b"),
    )
    # db.a: S0 -> S1; db.b: S0 and S1 are taken, S2 -> S3.
    assert [(m.ns, m.donor, m.recipient) for m in policy.plan(s).migrations] == [
        ("db.a", "S0", "S1"),
        ("db.b", "S2", "S3"),
    ]


def test_busy_shards_take_no_part():
    s = snap(
        [{"id": "S0", "available": False}, "S1", "S2", {"id": "S3", "available": False}],
        coll([("S0", 900), ("S1", 500), ("S2", 100), ("S3", 0)]),
    )
    assert moves(s) == [("S1", "S2", "chunksImbalance")]
    s = snap([{"id": "S0", "draining": True, "available": False}, "S1"], coll([("S0", 5), ("S1", 0)]))
    assert moves(s) == []


def test_a_donor_with_only_jumbo_chunks_gives_nothing():
    s = snap(["S0", "S1"], coll([("S0", 500, True), ("S0", 500, True), ("S1", 0)]))
    assert moves(s) == []
    # Not reported imbalanced, since no migration can fix it (as MongoDB's balancerCollectionStatus).
    assert [v.reason for v in policy.violations(s, "db.c")] == ["jumbo", "jumbo"]
    # The next most loaded shard may still give (MongoDB would give up on the zone).
    s = snap(["S0", "S1", "S2"], coll([("S0", 500, True), ("S2", 300), ("S1", 0)]))
    assert moves(s) == [("S2", "S1", "chunksImbalance")]


def test_the_collections_max_chunk_size_wins_over_the_clusters():
    owners = [("S0", 40), ("S1", 0)]
    assert moves(snap(["S0", "S1"], coll(owners), max_chunk=10)) == [("S0", "S1", "chunksImbalance")]
    assert moves(snap(["S0", "S1"], coll(owners, maxChunkSizeBytes=100), max_chunk=10)) == []
    assert moves(snap(["S0", "S1"], coll(owners, maxChunkSizeBytes=10), max_chunk=100)) == [
        ("S0", "S1", "chunksImbalance")
    ]


def test_a_collection_with_balancing_off_is_left_alone():
    for off in ({"balancerEnabled": False}, {"allowMigrations": False}):
        s = snap(["S0", {"id": "S1", "zones": ["a"]}], coll([("S0", 100), ("S1", 0)], zones=[("a", 5, 100)], **off))
        assert policy.plan(s).to_json() == {"splits": [], "migrations": []}


def imbalanced(s: dict) -> list[tuple]:
    """(donor, zone) of each chunksImbalance violation of db.c."""
    return [(v.shard, v.zone) for v in policy.violations(s, "db.c") if v.reason == "chunksImbalance"]


@pytest.mark.parametrize("gap, moved", [(3 * 100, True), (3 * 100 - 1, False)])
def test_rule_3_moves_at_a_difference_of_exactly_three_max_chunk_sizes_not_one_byte_less(gap, moved):
    # The collection's max chunk size, 100 bytes (the cluster's is 10): S0 holds `gap` bytes more than S1.
    s = snap(["S0", "S1"], coll([("S0", 40), ("S1", 50), ("S0", 10 + gap)], maxChunkSizeBytes=100))
    assert moves(s) == ([("S0", "S1", "chunksImbalance")] if moved else [])
    assert imbalanced(s) == ([("S0", None)] if moved else [])
    if moved:
        detail = next(v.detail for v in policy.violations(s, "db.c") if v.reason == "chunksImbalance")
        assert detail.endswith("at least 3 × max chunk size (100) apart"), detail


@pytest.mark.parametrize("s2_bytes, moved", [(40, True), (41, False)])
def test_rule_3_the_donor_is_the_shard_with_the_most_data_of_the_whole_collection(s2_bytes, moved):
    # Zone a ([MinKey, 20)) and the rest are on S0, S1 and S2.  In zone a S1 holds the most (60), but
    # S0 holds the most of the collection (10 in zone a, 60 outside it): S0 gives zone a's chunk to S2,
    # the least loaded (its `s2_bytes` all outside the zone), as the two are 30 (3 × 10) apart; not at 29.
    shards = [{"id": x, "zones": ["a"]} for x in ("S0", "S1", "S2")]
    s = snap(shards, coll([("S0", 10), ("S1", 60), ("S0", 60), ("S2", s2_bytes)], zones=[("a", None, 20)]))
    m = policy.plan(s).to_json()["migrations"]
    if moved:
        assert m == [
            {"ns": "db.c", "from": "S0", "to": "S2", "min": {"x": MIN}, "max": None, "reason": "chunksImbalance"}
        ]
        # With every shard free (violations), S0 would also give S2 a chunk from outside the zone.
        assert imbalanced(s) == [("S0", "a"), ("S0", None)]
    else:  # 29 apart: zone a is balanced, though S1 holds 60 of its 70 bytes
        assert m == [] and imbalanced(s) == []


def test_rule_3_a_shard_outside_the_zone_does_not_stop_it_being_balanced():
    # S2 holds the most data but not in zone a: S1 still gives to S0.  (MongoDB picks S2 as the donor,
    # finds none of its chunks in the zone and balances zone a no further this round.)
    s = snap(
        [{"id": "S0", "zones": ["a"]}, {"id": "S1", "zones": ["a"]}, {"id": "S2", "available": False}],
        coll([("S0", 0), ("S1", 100), ("S2", 1000)], zones=[("a", None, 20)]),
    )
    assert moves(s) == [("S1", "S0", "chunksImbalance")]
    assert imbalanced(s) == [("S1", "a"), ("S2", None)]  # violations ignore that S2 is busy


def test_rule_3_the_donor_is_ranked_over_every_shard_and_the_recipient_over_the_zones():
    # Zone a ([MinKey, 20)) is on S0 and S1.  S3, in no zone, holds the most data of the collection
    # (MongoDB's donor) but nothing in zone a: it is passed over and S0 gives zone a's range to S1,
    # the least loaded shard of the zone; S2 holds less still but may not take zone a's data.
    shards = [{"id": "S0", "zones": ["a"]}, {"id": "S1", "zones": ["a"]}, "S2", "S3"]
    s = snap(shards, coll([("S0", 50), ("S1", 0), ("S3", 1000), ("S2", 0)], zones=[("a", None, 20)]))
    assert [(m["from"], m["to"], m["min"], m["max"]) for m in policy.plan(s).to_json()["migrations"]] == [
        ("S0", "S1", {"x": MIN}, None),  # zone a: ideal 50 / 2 = 25, S0 above it, S1 below, 50 apart
        ("S3", "S2", {"x": 20}, None),  # outside every zone: S3 gives its chunk there to S2
    ]
    assert imbalanced(s) == [("S0", "a"), ("S3", None)]


def test_rule_3_a_donor_outside_the_zone_gives_a_range_of_the_zone_into_it():
    # S2, in no zone, holds the most data, some of it in zone a ([MinKey, 10), on S0 and S1).  In a
    # round, rule 2 moves that chunk (a zone violation) and takes S2 and S1 (MongoDB's order); were
    # every shard free, rule 3 for zone a picks S2 as the donor and moves its range of zone a to S1.
    shards = [{"id": "S0", "zones": ["a"]}, {"id": "S1", "zones": ["a"]}, "S2"]
    s = snap(shards, coll([("S2", 10), ("S0", 40), ("S2", 500), ("S1", 0)], zones=[("a", None, 20)]))
    assert moves(s) == [("S2", "S1", "zoneViolation")]
    assert imbalanced(s) == [("S2", "a"), ("S2", None)]
    zone_a = next(v for v in policy.violations(s, "db.c") if v.reason == "chunksImbalance")
    assert "S2 holds 510 bytes of the collection (ideal 20)" in zone_a.detail, zone_a.detail
    s["shards"][0]["available"] = False  # S0 busy: rule 2 has no recipient for S2's chunk, nor has rule 3
    s["shards"][1]["available"] = False
    assert moves(s) == []


@pytest.mark.parametrize(
    "s1_bytes, s2_bytes, moved",
    [
        (70, 100, True),  # ideal (100 + 70 + 100) / 3 = 90: S0 above it, S1 below it, 30 apart
        (71, 100, False),  # ideal 90.3, but 29 apart
        (70, 129, True),  # ideal 299 / 3 = 99.7: S0's 100 is above it
        (70, 130, False),  # ideal 300 / 3 = 100: S0's 100 is not above it
    ],
)
def test_rule_3_the_ideal_of_a_zone_is_the_collections_data_on_its_shards_over_their_number(s1_bytes, s2_bytes, moved):
    # Zone a ([MinKey, 10)) is on S0, S1 and S2 (busy).  Only S0 has data in the zone; S1's and S2's,
    # outside it, count in its ideal; S3's (busy, not in the zone) does not.
    shards = [
        {"id": "S0", "zones": ["a"]},
        {"id": "S1", "zones": ["a"]},
        {"id": "S2", "zones": ["a"], "available": False},
        {"id": "S3", "available": False},
    ]
    s = snap(shards, coll([("S0", 100), ("S1", s1_bytes), ("S2", s2_bytes), ("S3", 10_000)], zones=[("a", None, 10)]))
    assert moves(s) == ([("S0", "S1", "chunksImbalance")] if moved else [])
    # With every shard free (violations), S3 would also give outside the zone.
    assert imbalanced(s) == [*([("S0", "a")] if moved else []), ("S3", None)]


@pytest.mark.parametrize("s2_bytes, moved", [(43, True), (42, False)])
def test_rule_3_the_recipient_holds_less_than_the_ideal_rounded_down(s2_bytes, moved):
    # As above, S0 100 and S1 70: (100 + 70 + 43) / 3 = 71 takes S1's 70; 212 / 3 = 70.67 -> 70 does not.
    shards = [
        {"id": "S0", "zones": ["a"]},
        {"id": "S1", "zones": ["a"]},
        {"id": "S2", "zones": ["a"], "available": False},
    ]
    s = snap(shards, coll([("S0", 100), ("S1", 70), ("S2", s2_bytes)], zones=[("a", None, 10)]))
    assert moves(s) == ([("S0", "S1", "chunksImbalance")] if moved else [])


# ---------------------------------------------------------------- chunk order, input


def test_chunks_in_any_order_plan_the_same():
    owners = [("S0", 5), ("S1", 1), ("S0", 50), ("S2", 0), ("S0", 7, True), ("S1", 30)]
    s = snap(["S0", "S1", {"id": "S2", "zones": ["a"]}], coll(owners, zones=[("a", 15, 35)]))
    expected = policy.plan(s).to_json()
    random.Random(4).shuffle(s["collections"][0]["chunks"])
    assert policy.plan(s).to_json() == expected and expected["splits"] and expected["migrations"]


def test_overlapping_chunks_are_refused():
    s = snap(["S0", "S1"], coll([("S0", 1), ("S1", 1)]))
    s["collections"][0]["chunks"][0]["max"] = {"x": 15}
    with pytest.raises(policy.SnapshotError, match="overlap"):
        policy.plan(s)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s["collections"][0]["chunks"][1].update(shard="S9"),
            "collections.0.chunks.1.shard: unknown shard 'S9'",
        ),
        (
            lambda s: s["collections"][0]["chunks"][1].pop("sizeBytes"),
            "collections.0.chunks.1.sizeBytes: Field required",
        ),
        (
            lambda s: s["collections"][0]["chunks"][0].update(min={"y": 1}),
            "collections.0.chunks.0.min: must name exactly",
        ),
        (lambda s: s["shards"].append({"id": "S0"}), "shards.2.id: duplicate shard 'S0'"),
        (lambda s: s["shards"][0].update(weight=0), "shards.0.weight: Input should be greater than 0"),
        (lambda s: s["collections"][0].update(key={"x": -1}), "collections.0.key: shard key fields must be ascending"),
        (
            lambda s: s["collections"][0]["zones"].append({"zone": "b", "min": {"x": 5}, "max": {"x": 25}}),
            "collections.0.zones: ranges of zones 'a' and 'b' overlap",
        ),
        (
            lambda s: s["collections"][0]["zones"].append({"zone": "b", "min": {"x": 50}, "max": {"x": 40}}),
            "collections.0.zones.1: min must sort below max",
        ),
    ],
)
def test_a_bad_snapshot_is_refused_naming_the_field(change, message):
    s = snap(["S0", "S1"], coll([("S0", 1), ("S1", 1)], zones=[("a", 0, 10)]))
    change(s)
    with pytest.raises(ValidationError) as e:
        policy.plan(s)
    assert policy.describe(e.value).startswith(message), policy.describe(e.value)


def test_the_documented_formats_match_their_json_schemas():
    s = snap(
        [{"id": "S0", "draining": False, "zones": ["a"], "available": True, "weight": 1}, "S1"],
        coll([("S0", 100), ("S1", 0), ("S0", 1)], zones=[("a", 5, 15)], maxChunkSizeBytes=10),
    )
    jsonschema.validate(s, json.loads((OUT / "balancer.snapshot.schema.json").read_text()))
    out = policy.plan(s).to_json()
    assert out["splits"] and out["migrations"]
    jsonschema.validate(out, json.loads((OUT / "balancer.plan.schema.json").read_text()))


# --------------------------------------------------------------------- violations


def test_violations_lists_every_reason_in_priority_order():
    shards = [{"id": "S0", "draining": True}, "S1", {"id": "S2", "zones": ["a"]}, "S3"]
    s = snap(
        shards,
        coll(
            [("S0", 1), ("S0", 1), ("S1", 1), ("S1", 1), ("S2", 100), ("S3", 400, True), ("S3", 50)],
            zones=[("a", 25, 50)],
        ),
    )
    found = policy.violations(s, "db.c")
    assert [(v.reason, v.shard) for v in found] == [
        ("draining", "S0"),
        ("draining", "S0"),
        ("zoneViolation", "S1"),  # [30, 40) is in zone a
        ("zoneBoundary", "S1"),  # [20, 30) crosses 25
        ("chunksImbalance", "S3"),  # outside the zone: S3 holds 450, S1 2
        ("jumbo", "S3"),
    ]
    assert found[2].min == {"x": 30} and found[2].zone == "a"
    assert "balancing the ranges outside every zone: S3 holds 450 bytes of the collection" in found[4].detail
    assert json.loads(json.dumps(found[0].to_json()))["reason"] == "draining"
    with pytest.raises(KeyError):
        policy.violations(s, "db.nope")


# ---------------------------------------------------------------- from the catalog


def test_a_snapshot_built_from_the_catalog_plans():
    cat = Catalog(track_changes=False)
    docs = [
        ev.ChunkDoc(min={"x": MIN}, max={"x": 0}, shard="s0", version=(1, 0)),
        ev.ChunkDoc(min={"x": 0}, max={"x": 100}, shard="s0", version=(1, 1)),
        ev.ChunkDoc(min={"x": 100}, max={"x": MAX}, shard="s1", version=(1, 2), jumbo=True),
    ]
    events = [
        ev.ShardAdded(shard="s0"),
        ev.ShardAdded(shard="s1"),
        ev.ShardAdded(shard="s2"),
        ev.ShardZoneAdded(shard="s2", zone="hot"),
        ev.ShardDraining(shard="s1"),
        ev.DatabaseCreated(db="db", primary="s0", uuid="00000000-0000-4000-8000-000000000000"),
        ev.CollectionSharded(ns="db.c", key={"x": 1}, unique=False, epoch="e", uuid="u", chunks=docs),
        ev.ZoneRangeAssigned(ns="db.c", min={"x": 50}, max={"x": 60}, zone="hot"),
        ev.SettingChanged(ns="db.c", key="maxChunkSizeBytes", value=2 * 1024 * 1024),
    ]
    for offset, e in enumerate(events):
        cat.apply(e, offset)
    coll_ = cat.collections["db.c"]
    sizes = {("db.c", coll_.chunks[0].min_key): 7}
    s = snapshot.build(cat, sizes, weights={"s2": 2}, busy=["s0"])
    assert [(sh["id"], sh["available"], sh["weight"], sh["draining"], sh["zones"]) for sh in s["shards"]] == [
        ("s0", False, 1, False, []),
        ("s1", True, 1, True, []),
        ("s2", True, 2, False, ["hot"]),
    ]
    c = s["collections"][0]
    assert c["maxChunkSizeBytes"] == 2 * 1024 * 1024 and c["key"] == {"x": 1}
    assert [(ch["min"], ch["sizeBytes"], ch["jumbo"]) for ch in c["chunks"]] == [
        ({"x": MIN}, 7, False),
        ({"x": 0}, 0, False),
        ({"x": 100}, 0, True),
    ]
    assert c["zones"] == [{"zone": "hot", "min": {"x": 50}, "max": {"x": 60}}]
    jsonschema.validate(s, json.loads((OUT / "balancer.snapshot.schema.json").read_text()))
    p = policy.plan(s).to_json()
    assert p["splits"] == [{"ns": "db.c", "chunk": {"min": {"x": 0}, "max": {"x": 100}}, "at": [{"x": 50}, {"x": 60}]}]
    assert p["migrations"] == [
        {"ns": "db.c", "from": "s1", "to": "s2", "min": {"x": 100}, "max": {"x": MAX}, "reason": "drain"}
    ]  # jumbo, forced off the draining shard


# ------------------------------------------------------------------------------- CLI


def test_cli_plan_prints_the_plan(tmp_path):
    f = tmp_path / "snap.json"
    f.write_text(json.dumps(snap(["S0", "S1"], coll([("S0", 100), ("S1", 0)]))))
    r = CliRunner().invoke(balancer_app, ["plan", "--snapshot", str(f)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["migrations"][0]["reason"] == "chunksImbalance"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"shards": [', "is not valid JSON: Expecting value at line 1 column 13"),
        (
            json.dumps(
                {
                    "shards": [{"id": "S0"}],
                    "collections": [
                        {
                            "ns": "a.b",
                            "key": {"x": 1},
                            "chunks": [{"min": {"x": MIN}, "max": {"x": MAX}, "shard": "S0"}],
                        }
                    ],
                }
            ),
            "invalid snapshot: collections.0.chunks.0.sizeBytes: Field required",
        ),
        ("[]", "invalid snapshot: Input should be a valid dictionary"),
    ],
)
def test_cli_plan_refuses_a_bad_snapshot_in_one_line(tmp_path, text, message):
    f = tmp_path / "snap.json"
    f.write_text(text)
    r = CliRunner().invoke(balancer_app, ["plan", "--snapshot", str(f)])
    assert r.exit_code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = CliRunner().invoke(balancer_app, ["plan", "--snapshot", str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "cannot read snapshot" in r.stderr


# ----------------------------------------------------------------------- properties


@st.composite
def snapshots(draw):
    n_shards = draw(st.integers(2, 7))
    shards = [
        {
            "id": f"S{i}",
            "draining": draw(st.sampled_from([False, False, False, True])),
            "zones": draw(st.lists(st.sampled_from(["a", "b"]), unique=True, max_size=2)),
            "available": draw(st.sampled_from([True, True, True, False])),
            "weight": draw(st.sampled_from([1, 1, 2, 0.5])),
        }
        for i in range(n_shards)
    ]
    ids = [s["id"] for s in shards]
    colls = []
    for ns in ("db.a", "db.b")[: draw(st.integers(1, 2))]:
        n = draw(st.integers(1, 25))
        owners = [
            (draw(st.sampled_from(ids)), draw(st.integers(0, 60)), draw(st.booleans()) and draw(st.booleans()))
            for _ in range(n)
        ]
        # Zone bounds on multiples of 5: some on chunk bounds, some inside chunks.
        points = sorted(draw(st.sets(st.integers(0, 2 * n + 1), max_size=4)))
        names = draw(st.lists(st.sampled_from(["a", "b"]), min_size=len(points) // 2, max_size=len(points) // 2))
        zones = [(z, points[2 * i] * 5, points[2 * i + 1] * 5) for i, z in enumerate(names)]
        colls.append(coll(owners, zones=zones, ns=ns))
    return snap(shards, *colls, max_chunk=draw(st.sampled_from([5, 10, 20])))


def _x(b: dict) -> float:
    v = b["x"]
    return float("-inf") if v == MIN else float("inf") if v == MAX else v


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_plan_properties(s):
    p = policy.plan(s).to_json()
    shards = {sh["id"]: sh for sh in s["shards"]}
    colls = {c["ns"]: c for c in s["collections"]}
    used = [x for m in p["migrations"] for x in (m["from"], m["to"])]
    assert len(used) == len(set(used)), "a shard takes part in one migration per round"
    assert len(p["migrations"]) <= sum(sh["available"] for sh in s["shards"]) // 2
    split_mins = {(sp["ns"], _x(sp["chunk"]["min"])) for sp in p["splits"]}
    for sp in p["splits"]:
        assert all(_x(sp["chunk"]["min"]) < _x(b) < _x(sp["chunk"]["max"]) for b in sp["at"])
    for m in p["migrations"]:
        c = colls[m["ns"]]
        chunk = next(ch for ch in c["chunks"] if ch["min"] == m["min"])
        assert chunk["shard"] == m["from"], "the range starts at a chunk of the donor"
        assert m["max"] in (None, chunk["max"]), "and lies within that chunk"
        assert (m["ns"], _x(chunk["min"])) not in split_mins, "a chunk being split is not moved"
        donor, recipient = shards[m["from"]], shards[m["to"]]
        assert donor["available"] and recipient["available"] and not recipient["draining"]
        zone = next((z["zone"] for z in c["zones"] if _x(z["min"]) <= _x(chunk["min"]) < _x(z["max"])), None)
        assert zone is None or zone in recipient["zones"], "never into a shard outside the chunk's zone"
        if m["reason"] == "drain":
            assert donor["draining"] and m["max"] == chunk["max"]
        elif m["reason"] == "zoneViolation":
            assert zone not in donor["zones"] and m["max"] == chunk["max"] and not chunk.get("jumbo")
        else:
            assert m["max"] is None and not chunk.get("jumbo") and not donor["draining"]
            assert zone is None or zone in donor["zones"]


@settings(max_examples=200, deadline=None)
@given(snapshots())
def test_violations_report_an_imbalance_exactly_when_plan_moves_for_one(s):
    # Every shard free, none draining, no zone: plan's first collection is balanced by rule 3 alone.
    for sh in s["shards"]:
        sh.update(available=True, draining=False)
    for c in s["collections"]:
        c["zones"] = []
    first = s["collections"][0]["ns"]
    plan = [m for m in policy.plan(s).migrations if m.ns == first]
    found = [v for v in policy.violations(s, first) if v.reason == "chunksImbalance"]
    assert [v.shard for v in found] == [m.donor for m in plan[:1]]
    assert all(m.reason == "chunksImbalance" for m in plan)


# ---------------------------------------------------------------- round pacing (rounds.py)

from services.balancer.rounds import round_pause, throttle_left  # noqa: E402


def test_after_a_round_that_moved_data_the_next_starts_at_once_as_in_mongodb():
    assert round_pause({"splits": 0, "migrations": 2, "failed": 1}, 10.0) == 0.0
    assert round_pause({"splits": 1, "migrations": 0, "failed": 0}, 10.0) == 0.0


@pytest.mark.parametrize(
    "summary",
    [{"splits": 0, "migrations": 0}, {}, {"splits": 1, "migrations": 2, "failed": 3}, None],
    ids=["nothing to do", "disabled or outside the window", "every action failed", "raised"],
)
def test_a_quiet_failed_or_idle_round_waits_the_full_interval(summary):
    assert round_pause(summary, 10.0) == 10.0


def test_migrations_are_spaced_by_balancer_migrations_throttling_ms():
    assert throttle_left(None, 100.0, 1000) == 0.0  # no migration yet
    assert throttle_left(100.0, 100.25, 1000) == pytest.approx(0.75)
    assert throttle_left(100.0, 101.0, 1000) == 0.0  # exactly at the boundary: no wait
    assert throttle_left(100.0, 105.0, 1000) == 0.0
    assert throttle_left(100.0, 100.0, 0) == 0.0
