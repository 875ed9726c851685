"""Issue 18, point 9, against a real broker: `zone add-range` before `shard-collection` (as
MongoDB 4.0.2+ allows), then sharding the empty collection cuts its first chunks at the
ranges' bounds, each on a shard of its zone; config.tags shows the ranges all along."""

from __future__ import annotations

import json

import pytest

from schemas import config as c
from tests.conftest import cli

pytestmark = pytest.mark.kafka


def run(settings, *args: str) -> dict:
    done = cli(settings, *args, "--json")
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return json.loads(done.stdout)


def test_zone_ranges_added_before_shard_collection_place_the_first_chunks(data_cluster):
    cl = data_cluster
    st = cl.settings
    run(st, "zone", "add-shard", "s1", "EU")
    run(st, "zone", "add-shard", "s2", "US")
    cl.command(c.CreateDatabase(db="z", primary="s0"))  # the collection itself does not exist yet
    run(st, "zone", "add-range", "z.users", "--min", '{"k": 0}', "--max", '{"k": 100}', "--zone", "EU")
    run(st, "zone", "add-range", "z.users", "--min", '{"k": 100}', "--max", '{"k": 200}', "--zone", "US")
    # a refused bound still answers MongoDB's shape: different fields in min and max
    bad = cli(st, "zone", "add-range", "z.users", "--min", '{"k": 300}', "--max", '{"j": 400}', "--zone", "US")
    assert bad.returncode != 0 and "same fields" in bad.stdout + bad.stderr, bad.stdout + bad.stderr

    status = run(st, "status")
    assert [(z["ns"], z["zone"]) for z in status["unshardedZones"]] == [("z.users", "EU"), ("z.users", "US")]
    client = cl.mongo_client()
    tags = list(client["config"]["tags"].find({"ns": "z.users"}, {"_id": 0}).sort("min", 1))
    assert [(t["min"], t["max"], t["tag"]) for t in tags] == [
        ({"k": 0}, {"k": 100}, "EU"),
        ({"k": 100}, {"k": 200}, "US"),
    ]

    sharded = run(st, "shard-collection", "z.users", "--key", '{"k": 1}')
    primary = sharded["primary"]
    coll = next(x for x in run(st, "status", "--verbose")["collections"] if x["ns"] == "z.users")
    assert [(ch["min"], ch["max"], ch["shard"]) for ch in coll["chunks"]] == [
        ({"k": {"$minKey": 1}}, {"k": 0}, primary),
        ({"k": 0}, {"k": 100}, "s1"),
        ({"k": 100}, {"k": 200}, "s2"),
        ({"k": 200}, {"k": {"$maxKey": 1}}, primary),
    ]
    assert [z["zone"] for z in coll["zones"]] == ["EU", "US"]
    # config.chunks, as mongosh's sh.status() reads it, says the same
    uuid = client["config"]["collections"].find_one({"_id": "z.users"})["uuid"]
    on_wire = [(ch["max"], ch["shard"]) for ch in client["config"]["chunks"].find({"uuid": uuid}).sort("min", 1)]
    assert [(m, s) for m, s in on_wire if s in ("s1", "s2")] == [({"k": 100}, "s1"), ({"k": 200}, "s2")]
    # and remove-range works on them, sharded now
    run(st, "zone", "remove-range", "z.users", "--min", '{"k": 100}', "--max", '{"k": 200}')
    coll = next(x for x in run(st, "status")["collections"] if x["ns"] == "z.users")
    assert [z["zone"] for z in coll["zones"]] == ["EU"]
