"""aggregate through the router's wire edge with the real pymongo, on a collection hashed over
three shards: $match goes down to the shards as the find filter, the rest is merged on the
router; results equal the same computation in Python."""

from __future__ import annotations

from collections import defaultdict

import pytest
from pymongo.errors import OperationFailure

from domain.shardkey import hash_value
from schemas import config as c
from schemas import shard as s

pytestmark = pytest.mark.kafka

NS = "app.orders"
DOCS = [
    {"_id": i, "k": i, "cust": f"c{i % 4}", "qty": i % 5, "price": 1 + i % 3, "tags": ["a", "b"][: i % 3]}
    for i in range(60)
]


@pytest.fixture
def orders(data_cluster):
    """app.orders hashed on k over the three shards, DOCS in it; the pymongo collection."""
    data_cluster.command(c.ShardCollection(ns=NS, key={"k": "hashed"}))
    reply = data_cluster.call(data_cluster.router.routing.handle(s.Insert(ns=NS, docs=DOCS)))
    assert reply["inserted"] == len(DOCS) and not reply["writeErrors"], reply
    assert all(n >= 1 for n in data_cluster.served("Insert", NS).values()), "every shard holds a share"
    return data_cluster.mongo_client()["app"]["orders"]


def test_group_equals_python_and_match_goes_to_every_shard(data_cluster, orders):
    before = data_cluster.served("Find", NS)
    out = list(
        orders.aggregate(
            [
                {"$match": {"qty": {"$gte": 1}}},
                {
                    "$group": {
                        "_id": "$cust",
                        "n": {"$sum": 1},
                        "total": {"$sum": {"$multiply": ["$qty", "$price"]}},
                        "avg": {"$avg": "$qty"},
                        "lo": {"$min": "$k"},
                        "hi": {"$max": "$k"},
                        "ks": {"$addToSet": "$k"},
                    }
                },
                {"$sort": {"_id": 1}},
            ]
        )
    )
    after = data_cluster.served("Find", NS)
    assert all(after[sid] == before[sid] + 1 for sid in after), "one find per shard: the filter went down"
    groups: dict[str, list[dict]] = defaultdict(list)
    for d in DOCS:
        if d["qty"] >= 1:
            groups[d["cust"]].append(d)
    expected = [
        {
            "_id": cust,
            "n": len(ds),
            "total": sum(d["qty"] * d["price"] for d in ds),
            "avg": sum(d["qty"] for d in ds) / len(ds),
            "lo": min(d["k"] for d in ds),
            "hi": max(d["k"] for d in ds),
            "ks": sorted(d["k"] for d in ds),
        }
        for cust, ds in sorted(groups.items())
    ]
    assert [{**g, "ks": sorted(g["ks"])} for g in out] == expected


def test_match_on_the_shard_key_reaches_one_shard(data_cluster, orders):
    coll = data_cluster.config.catalog.collections[NS]
    owner = coll.chunks[coll.chunk_index(coll.pattern.encode_bound({"k": hash_value(7)}))].shard
    before = data_cluster.served("Find", NS)
    out = list(
        orders.aggregate([{"$match": {"k": 7}}, {"$project": {"_id": 0, "k": 1, "double": {"$add": ["$k", "$k"]}}}])
    )
    after = data_cluster.served("Find", NS)
    assert out == [{"k": 7, "double": 14}]
    assert {sid for sid in after if after[sid] > before[sid]} == {owner}, "shard-key equality targets one shard"
    explained = orders.database.command(
        "aggregate", "orders", pipeline=[{"$match": {"k": 7}}, {"$count": "n"}], explain=True
    )
    assert explained["splitPipeline"] == {"shardsPart": [{"$match": {"k": 7}}], "mergerPart": [{"$count": "n"}]}
    assert list(explained["shards"]) == [owner]


def test_unwind_sort_limit_count_and_count_documents(orders):
    unwound = list(
        orders.aggregate([{"$unwind": {"path": "$tags", "includeArrayIndex": "i"}}, {"$sort": {"_id": 1, "i": 1}}])
    )
    expected = [{**d, "tags": t, "i": i} for d in DOCS for i, t in enumerate(d["tags"])]
    assert unwound == expected
    top = list(orders.aggregate([{"$sort": {"qty": -1, "k": 1}}, {"$limit": 3}, {"$project": {"k": 1}}]))
    assert top == [{"_id": k, "k": k} for k in sorted((d["k"] for d in DOCS), key=lambda k: (-(k % 5), k))[:3]]
    assert list(orders.aggregate([{"$match": {"cust": "c1"}}, {"$count": "n"}])) == [{"n": 15}]
    assert orders.count_documents({}) == 60
    assert orders.count_documents({"qty": 0}) == 12
    assert orders.count_documents({"qty": 0}, skip=2, limit=5) == 5
    assert orders.count_documents({"cust": "nobody"}) == 0


def test_small_batches_across_get_more(orders):
    cursor = orders.aggregate([{"$sort": {"k": 1}}, {"$project": {"k": 1}}], batchSize=7)
    assert [d["k"] for d in cursor] == list(range(60))


def test_first_batch_honours_batch_size(orders):
    reply = orders.database.command("aggregate", "orders", pipeline=[{"$sort": {"k": 1}}], cursor={"batchSize": 4})
    assert [d["k"] for d in reply["cursor"]["firstBatch"]] == [0, 1, 2, 3]
    assert reply["cursor"]["id"] != 0 and reply["cursor"]["ns"] == NS
    everything = orders.database.command("aggregate", "orders", pipeline=[{"$count": "n"}], cursor={})
    assert everything["cursor"]["id"] == 0 and everything["cursor"]["firstBatch"] == [{"n": 60}]


def test_bad_pipelines_get_mongodbs_codes_and_the_router_keeps_serving(orders):
    cases = [
        ([{"$bogus": {}}], 40324),
        ([{"$lookup": {"from": "x", "localField": "a", "foreignField": "b", "as": "c"}}], 40324),
        ([{"$out": "copy"}], 40324),
        ([{"$group": {"_id": None, "x": {"$median": "$qty"}}}], 15952),
        ([{"$limit": 0}], 15958),
        ([{"$skip": -1}], 5107200),
        ([{"$project": {"x": {"$regexMatch": {"input": "$cust"}}}}], 168),
        ([{"$project": {"x": {"$divide": ["$k", 0]}}}], 16608),  # fails while running, on the router
    ]
    for pipeline, code in cases:
        with pytest.raises(OperationFailure) as e:
            list(orders.aggregate(pipeline))
        assert e.value.code == code, (pipeline, e.value.details)
    with pytest.raises(OperationFailure) as e:
        orders.database.command("aggregate", "orders", pipeline=[])  # no cursor option
    assert e.value.code == 9
    with pytest.raises(OperationFailure) as e:
        list(orders.database.aggregate([{"$match": {}}]))  # {aggregate: 1}: no collection
    assert e.value.code == 73
    assert orders.count_documents({}) == 60
    assert orders.database.client.admin.command("ping")["ok"] == 1.0


def test_config_database_is_read_from_the_routers_catalog(data_cluster, orders):
    from services.router.wire import config_db

    before = data_cluster.served("Find", "config.chunks")
    chunks = data_cluster.call(config_db.documents(data_cluster.router.wire.edge, "chunks"))
    out = list(orders.database.client["config"]["chunks"].aggregate([{"$match": {}}, {"$count": "n"}]))
    assert out == ([{"n": len(chunks)}] if chunks else [])
    assert data_cluster.served("Find", "config.chunks") == before, "no shard is asked for config.*"
