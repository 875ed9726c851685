"""services/dashboard/snapshot.py: the cluster picture assembled from the catalog, the shards'
statistics and answers, and the balancer's state, without I/O (jumbo, zones, draining, a migration,
missing statistics, services that did not answer)."""

from __future__ import annotations

import json

from domain.catalog import Catalog
from schemas import config as c
from schemas import stats
from services.dashboard import snapshot

EPOCH = "0" * 24
MIN, MAX = {"$minKey": 1}, {"$maxKey": 1}
LINKS = snapshot.Links("http://127.0.0.1:9411/zipkin/")


def make_catalog() -> Catalog:
    """s0, s1, s2 (s2 draining, s1 in zone "eu"); app.users on k in three chunks: [MinKey, 10) on s0,
    [10, 20) on s1 (jumbo), [20, MaxKey) on s1; zone eu on [10, 30); a migration of [MinKey, 10) to s2."""
    cat = Catalog(track_changes=False)
    events = [
        c.ShardAdded(shard="s0"),
        c.ShardAdded(shard="s1"),
        c.ShardAdded(shard="s2"),
        c.DatabaseCreated(db="app", primary="s0", uuid="u"),
        c.CollectionSharded(
            ns="app.users",
            key={"k": 1},
            unique=False,
            epoch=EPOCH,
            uuid="11111111-2222-3333-4444-555555555555",
            chunks=[
                c.ChunkDoc(min={"k": MIN}, max={"k": 10}, shard="s0", version=(1, 0)),
                c.ChunkDoc(min={"k": 10}, max={"k": 20}, shard="s1", version=(1, 1)),
                c.ChunkDoc(min={"k": 20}, max={"k": MAX}, shard="s1", version=(1, 2)),
            ],
        ),
        c.ChunkMarkedJumbo(ns="app.users", epoch=EPOCH, min={"k": 10}),
        c.ShardZoneAdded(shard="s1", zone="eu"),
        c.ZoneRangeAssigned(ns="app.users", min={"k": 10}, max={"k": 30}, zone="eu"),
        c.ShardDraining(shard="s2"),
        c.MigrationRequested(
            id="m1", ns="app.users", epoch=EPOCH, min={"k": MIN}, max={"k": 10}, donor="s0", recipient="s2"
        ),
    ]
    for i, e in enumerate(events):
        cat.apply(e, i)
    cat.config_time = len(events)
    return cat


def report(shard: str, chunks: list[tuple[dict, dict, int, int]], at: float = 100.0) -> stats.ShardStatistics:
    return stats.ShardStatistics(
        shard=shard,
        configTime=1,
        timestamp=at,
        windowSeconds=10,
        chunks=[
            stats.ChunkStatistics(
                ns="app.users", min=lo, max=hi, documents=docs, dataSizeBytes=size, bytesWrittenSinceLastReport=0
            )
            for lo, hi, docs, size in chunks
        ],
        collections=[
            stats.CollectionStatistics(
                ns="app.users",
                epoch=EPOCH,
                chunks=len(chunks),
                documents=sum(x[2] for x in chunks),
                dataSizeBytes=sum(x[3] for x in chunks),
                bytesWrittenSinceLastReport=0,
            )
        ],
    )


REPORTS = {
    "s0": report("s0", [({"k": MIN}, {"k": 10}, 4000, 400_000)]),
    "s1": report("s1", [({"k": 10}, {"k": 20}, 30, 3000), ({"k": 20}, {"k": MAX}, 70, 7000)]),
}

DONOR = {
    "shard": "s0",
    "migrations": [],
    "rangeDeletions": [],
    "progress": {"m1": {"phase": "cloning", "cloned": 1000, "bytes": 100_000, "mods": 3, "min": {"k": MIN}}},
}


def build(**kw):
    args = dict(
        cluster="demo",
        catalog=make_catalog(),
        reports=REPORTS,
        shards={"s0": DONOR, "s1": {"rangeDeletions": [], "progress": {}}, "s2": {"rangeDeletions": []}},
        balancer={"enabled": True, "inWindow": True, "round": 4, "activity": "balanced", "inFlight": []},
        rounds=[],
        figures=snapshot.empty_figures(),
        links=LINKS,
        now=1000.0,
    )
    args.update(kw)
    snap = snapshot.assemble(**args)
    json.dumps(snap)  # what /api/snapshot serves must be JSON as it is
    return snap


def test_shards_with_sizes_draining_zones_and_links():
    snap = build()
    by_id = {s["id"]: s for s in snap["shards"]}
    assert list(by_id) == ["s0", "s1", "s2"]
    assert by_id["s0"] | {"traces": None} == by_id["s0"] | {
        "chunks": 1,
        "documents": 4000,
        "dataSizeBytes": 400_000,
        "draining": False,
        "zones": [],
        "traces": None,
    }
    assert by_id["s1"]["chunks"] == 2 and by_id["s1"]["documents"] == 100 and by_id["s1"]["zones"] == ["eu"]
    assert by_id["s2"]["draining"] is True
    assert by_id["s0"]["traces"] == "http://127.0.0.1:9411/zipkin/?serviceName=shardlog-shard-s0"


def test_missing_statistics_are_unknown_not_zero():
    snap = build(reports={"s0": REPORTS["s0"]})
    s1 = next(s for s in snap["shards"] if s["id"] == "s1")
    assert s1["documents"] is None and s1["dataSizeBytes"] is None and s1["chunks"] == 2
    chunks = snap["collections"][0]["chunks"]
    assert chunks[0]["documents"] == 4000 and chunks[1]["documents"] is None


def test_the_key_space_in_order_with_jumbo_and_zones():
    (coll,) = build()["collections"]
    assert coll["ns"] == "app.users" and coll["key"] == {"k": 1}
    assert [(ch["min"], ch["max"], ch["shard"], ch["jumbo"], ch["zone"]) for ch in coll["chunks"]] == [
        ("{ k: MinKey }", "{ k: 10 }", "s0", False, None),
        ("{ k: 10 }", "{ k: 20 }", "s1", True, "eu"),
        ("{ k: 20 }", "{ k: MaxKey }", "s1", False, None),  # only partly in the zone
    ]
    assert coll["zones"] == [{"zone": "eu", "min": "{ k: 10 }", "max": "{ k: 30 }", "chunks": [1, 2]}]
    assert coll["chunksPerShard"] == {"s0": 1, "s1": 2}
    assert coll["traces"] == "http://127.0.0.1:9411/zipkin/?annotationQuery=db.namespace%3Dapp.users"


def test_a_migration_with_the_donors_progress():
    (m,) = build()["migrations"]
    assert (m["id"], m["ns"], m["donor"], m["recipient"], m["phase"]) == ("m1", "app.users", "s0", "s2", "cloning")
    assert (m["min"], m["max"]) == ("{ k: MinKey }", "{ k: 10 }")
    assert m["documentsCloned"] == 1000 and m["bytesCloned"] == 100_000 and m["mods"] == 3
    assert m["documentsInRange"] == 4000 and m["fraction"] == 0.25
    assert m["traces"] == "http://127.0.0.1:9411/zipkin/?annotationQuery=shardlog.migration%3Dm1"


def test_a_migration_past_cloning_is_fully_cloned_and_one_not_begun_is_starting():
    donor = {**DONOR, "progress": {"m1": {**DONOR["progress"]["m1"], "phase": "critical section"}}}
    assert build(shards={"s0": donor})["migrations"][0]["fraction"] == 1.0
    m = build(shards={"s0": {**DONOR, "progress": {}}})["migrations"][0]
    assert m["phase"] == "starting" and m["documentsCloned"] is None and m["fraction"] is None


def test_a_donor_that_did_not_answer_leaves_the_migration_unknown_and_says_why():
    snap = build(shards={"s0": "unknown: no answer within 1s", "s1": {}, "s2": {}})
    m = snap["migrations"][0]
    assert m["phase"] == "unknown" and m["fraction"] is None and m["donor"] == "s0"
    assert snap["errors"] == {"shard s0": "unknown: no answer within 1s"}
    assert next(s for s in snap["shards"] if s["id"] == "s0")["answering"] is False
    assert snap["rangeDeletions"]["unanswered"] == ["s0"]


def test_balancer_state_rounds_and_window():
    rounds = snapshot.remember_round(
        [], {"lastRound": {"round": 3, "at": 5.0, "summary": {"reasons": ["chunksImbalance"]}}}
    )
    rounds = snapshot.remember_round(rounds, {"lastRound": {"round": 3, "at": 5.0, "summary": {}}})  # seen: kept once
    rounds = snapshot.remember_round(rounds, {"lastRound": {"round": 4, "at": 6.0, "summary": {"migrations": 1}}})
    assert [r["round"] for r in rounds] == [4, 3]
    assert snapshot.remember_round(rounds, "unknown: no answer") == rounds
    b = build(rounds=rounds, balancer={"inWindow": False, "round": 4, "activity": "outside the balancing window"})[
        "balancer"
    ]
    assert b["enabled"] is True and b["mode"] == "full" and b["answering"] is True and b["inWindow"] is False
    assert b["rounds"][1]["summary"]["reasons"] == ["chunksImbalance"] and b["window"] is None


def test_a_balancer_that_did_not_answer_still_shows_the_catalogs_settings():
    snap = build(balancer="unknown: no answer within 1s")
    b = snap["balancer"]
    assert b["answering"] is False and b["enabled"] is True and b["round"] is None and b["inWindow"] is None
    assert snap["errors"]["balancer"] == "unknown: no answer within 1s"


def test_range_deletions_say_why_they_wait():
    task = {
        "shard": "s1",
        "id": "m0",
        "ns": "app.users",
        "epoch": EPOCH,
        "min": {"k": 10},
        "max": {"k": 20},
        "pending": False,
        "readyAt": 990.0,
        "deleted": 0,
        "left": 30,
        "waiting": None,
        "why": "donor after commit",
    }
    pending = {**task, "id": "m1", "shard": "s2", "pending": True, "readyAt": None}
    snap = build(shards={"s0": DONOR, "s1": {"rangeDeletions": [task]}, "s2": {"rangeDeletions": [pending]}})
    rows = {r["id"]: r for r in snap["rangeDeletions"]["tasks"]}
    assert rows["m0"]["min"] == "{ k: 10 }" and rows["m0"]["left"] == 30 and rows["m0"]["state"] == "ready"
    assert rows["m0"]["waiting"] == "orphanCleanupDelaySecs: 890 s left"  # 900 s default, ready 10 s ago
    assert rows["m1"]["waiting"] == "pending: its migration is not decided"


def test_the_figures_block_is_passed_through():
    figures = {**snapshot.empty_figures(), "shards": {"s0": {"opsPerSec": 12.5, "p50Ms": 1.0, "p99Ms": 9.0}}}
    assert build(figures=figures)["figures"]["shards"]["s0"]["opsPerSec"] == 12.5
    assert build()["figures"]["shards"] == {}


def test_each_chunk_carries_its_placement_history_for_the_page_to_show_a_past_time():
    cat = make_catalog()
    moved = c.ChunkDoc(min={"k": MIN}, max={"k": 10}, shard="s2", version=(2, 0))
    commit = c.MigrationCommitted(
        id="m1", ns="app.users", epoch=EPOCH, donor="s0", recipient="s2", chunks=[moved], ts=(2000 << 32) | 3
    )
    cat.apply(commit, cat.config_time)
    (coll,) = build(catalog=cat)["collections"]
    assert coll["historyFrom"] == [0, 0]
    assert [ch["history"] for ch in coll["chunks"]] == [
        [{"validAfter": [2000, 3], "shard": "s2"}, {"validAfter": [0, 0], "shard": "s0"}],
        [{"validAfter": [0, 0], "shard": "s1"}],
        [{"validAfter": [0, 0], "shard": "s1"}],
    ]
