"""The shard's read paths through the planner (issue 15): Find, Count, Explain and the filters of
Update, Delete and FindAndModify, over a real RocksDB store and the shard's own indexes (built by
its BuildIndexes / IndexBuildStep requests, kept in the write batch of each document)."""

from __future__ import annotations

from typing import Any

import pytest

from domain.indexes import IndexSpec
from domain.shardkey import encode_value
from schemas import config as c
from schemas import indexes as ixs
from schemas import shard as s
from tests.unit.test_shard_decide import Shard


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    yield sh
    sh.store.close()


class ShardIndexes:
    """The shard's own indexes, built by its own requests; the index entries it scans counted."""

    def __init__(self, shard, ns: str, specs: list[IndexSpec]):
        shard.run(ixs.BuildIndexes(ns=ns, indexes=[sp.to_mongo() for sp in specs], buildId="b"))
        for sp in specs:
            while not shard.run(ixs.IndexBuildStep(ns=ns, name=sp.name, buildId="b", limit=1000))[1]["done"]:
                pass
        self.scanned = 0
        real = shard.documents.scan_index

        def counted(*args, **kw):
            for row in real(*args, **kw):
                self.scanned += 1
                yield row

        shard.documents.scan_index = counted


def load(shard, ns: str, docs: list[dict], *specs: IndexSpec) -> ShardIndexes:
    shard.run(s.Insert(ns=ns, docs=docs, routing=shard.routing(ns)))
    return ShardIndexes(shard, ns, list(specs))


def explain(shard, ns: str, **kw: Any) -> dict:
    _, r = shard.run(s.Explain(ns=ns, routing=shard.routing(ns), **kw))
    return r


def a_1() -> IndexSpec:
    return IndexSpec.make("a_1", (("a", 1),))


DOCS = [{"_id": i, "a": i % 10, "b": i} for i in range(100)]


def test_find_uses_the_index_and_returns_what_a_collscan_returns(shard):
    load(shard, "d.c", DOCS, a_1())
    _, r = shard.run(s.Find(ns="d.c", filter={"a": 3}, routing=shard.routing("d.c")))
    assert sorted(d["_id"] for d in r["docs"]) == [i for i in range(100) if i % 10 == 3]
    e = explain(shard, "d.c", filter={"a": 3})
    plan = e["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "FETCH" and plan["inputStage"]["indexName"] == "a_1"
    assert plan["inputStage"]["indexBounds"] == {"a": ["[3, 3]"]}
    stats = e["executionStats"]
    assert (stats["totalKeysExamined"], stats["totalDocsExamined"], stats["nReturned"]) == (10, 10, 10)
    e = explain(shard, "d.c", filter={"b": 3})  # the same query without an index examines every document
    assert e["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    assert e["executionStats"]["totalDocsExamined"] == 100


def test_a_sort_from_the_index_stops_at_the_limit(shard):
    load(shard, "d.c", DOCS, a_1())
    _, r = shard.run(s.Find(ns="d.c", filter={}, sort={"a": -1}, limit=3, routing=shard.routing("d.c")))
    assert [d["a"] for d in r["docs"]] == [9, 9, 9]
    e = explain(shard, "d.c", sort={"a": -1}, limit=3)
    assert e["queryPlanner"]["winningPlan"]["inputStage"]["direction"] == "backward"
    assert e["executionStats"]["totalKeysExamined"] == 3


def test_covered_find_and_count_read_no_document(shard):
    load(shard, "d.c", DOCS, a_1())
    _, r = shard.run(
        s.Find(ns="d.c", filter={"a": {"$gte": 8}}, projection={"a": 1, "_id": 0}, routing=shard.routing("d.c"))
    )
    assert sorted(d["a"] for d in r["docs"]) == [8] * 10 + [9] * 10
    e = explain(shard, "d.c", filter={"a": {"$gte": 8}}, projection={"a": 1, "_id": 0})
    assert e["queryPlanner"]["winningPlan"]["stage"] == "PROJECTION_COVERED"
    assert e["executionStats"]["totalDocsExamined"] == 0
    _, r = shard.run(s.Count(ns="d.c", filter={"a": {"$in": [1, 2]}}, routing=shard.routing("d.c")))
    assert r["n"] == 20


def test_writes_find_their_documents_through_the_index(shard):
    ix = load(shard, "d.c", DOCS, a_1())
    _, r = shard.run(
        s.Update(ns="d.c", filter={"a": 4}, update={"$set": {"x": 1}}, multi=True, routing=shard.routing("d.c"))
    )
    assert r["matched"] == 10 and ix.scanned == 10
    _, r = shard.run(s.Delete(ns="d.c", filter={"a": 4, "x": 1}, multi=True, routing=shard.routing("d.c")))
    assert r["deleted"] == 10
    _, r = shard.run(
        s.FindAndModify(
            ns="d.c", query={"a": 5}, sort={"b": -1}, update={"$set": {"y": 1}}, new=True, routing=shard.routing("d.c")
        )
    )
    assert r["value"]["_id"] == 95


def test_idhack_hint_and_a_bad_hint(shard):
    load(shard, "d.c", DOCS, a_1())
    e = explain(shard, "d.c", filter={"_id": 7})
    assert e["queryPlanner"]["winningPlan"]["stage"] == "IDHACK" and e["executionStats"]["nReturned"] == 1
    e = explain(shard, "d.c", filter={"a": 3}, hint={"$natural": 1})
    assert e["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"
    _, r = shard.run(s.Find(ns="d.c", filter={"b": 3}, hint="a_1", routing=shard.routing("d.c")))
    assert [d["_id"] for d in r["docs"]] == [3]
    with pytest.raises(Exception) as err:
        shard.run(s.Find(ns="d.c", filter={}, hint="nope", routing=shard.routing("d.c")))
    assert getattr(err.value, "code", None) == "BadValue"


def test_sharded_collection_plans_the_shard_key_index_and_filters_orphans(shard):
    shard.config(c.ShardCollection(ns="d.s", key={"sk": 1}))
    docs = [{"_id": i, "sk": i, "a": i % 5} for i in range(50)]
    load(shard, "d.s", docs, a_1())
    e = explain(shard, "d.s", filter={"sk": {"$gte": 40}, "a": {"$gt": 0}})
    ix = e["queryPlanner"]["winningPlan"]["inputStage"]["inputStage"]
    assert e["queryPlanner"]["winningPlan"]["stage"] == "SHARDING_FILTER"
    assert ix["indexName"] == "sk_1" and ix["isShardKey"]
    e = explain(shard, "d.s", filter={"a": 2})
    assert e["queryPlanner"]["winningPlan"]["inputStage"]["inputStage"]["indexName"] == "a_1"
    # An orphan (a document the shard holds outside its chunks) stays invisible through the index.
    shard.documents.apply(
        s.DocumentWritten(ns="d.s", skey=encode_value(10**6).hex(), doc={"_id": "o", "sk": 10**6, "a": 2}), -1
    )
    # The shard's one chunk is cut short of the orphan's key, as if a migration had moved it away.
    ranges = shard.decider._owned_ranges
    shard.decider._owned_ranges = lambda coll: [(lo, encode_value(10**6)) for lo, _ in ranges(coll)]  # type: ignore[method-assign]
    shard.decider._owns = lambda coll, skey: skey != encode_value(10**6)  # type: ignore[method-assign]
    _, r = shard.run(s.Find(ns="d.s", filter={"a": 2}, routing=shard.routing("d.s")))
    assert sorted(d["_id"] for d in r["docs"]) == [i for i in range(50) if i % 5 == 2]


# ------------------------------------------------------------------ the property, on a real shard


def test_finds_through_the_shards_own_indexes_equal_a_collscan(tmp_path_factory):
    """test_planner's soundness property, through the shard's requests, its RocksDB store, its
    index entries (key values back from their record form) and its read overlay."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from domain.query import apply_projection, compile_filter, sort_key
    from tests.unit.test_planner import dense_docs, dense_index, focused_conditions, key_of

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(dense_docs, st.lists(dense_index, min_size=1, max_size=2), st.data())
    def prop(raw_docs, raw_indexes, data):
        sh = Shard(tmp_path_factory.mktemp("p"))
        try:
            sh.config(c.CreateDatabase(db="d", primary="a"))
            specs = list(
                {
                    k: IndexSpec.make(f"i{n}", k, sparse=kind == "sparse", partial=p if kind == "partial" else None)
                    for n, (k, kind, p) in enumerate(raw_indexes)
                }.values()
            )
            docs = [{"_id": i, **d} for i, d in enumerate(raw_docs)]
            load(sh, "d.p", docs, *specs)
            key = specs[0].key
            flt = {"$and": [{p: data.draw(focused_conditions)} for p, _ in key[: data.draw(st.integers(1, len(key)))]]}
            sort = {p: d for p, d in key} if data.draw(st.booleans()) else None
            projection = {key[0][0]: 1, "_id": data.draw(st.sampled_from([0, 1]))} if data.draw(st.booleans()) else None
            _, r = sh.run(
                s.Find(
                    ns="d.p", filter=flt, sort=sort, projection=projection, batchSize=1000, routing=sh.routing("d.p")
                )
            )
            m = compile_filter(flt)
            stored = [d for _, d in sh.documents.scan("d.p")]
            want = [d for d in stored if m.matches(d)]
            if sort:
                want.sort(key=sort_key(sort))
                got_full = (
                    [next(d for d in stored if d["_id"] == g["_id"]) for g in r["docs"]]
                    if projection is None or projection["_id"]
                    else None
                )
                if got_full is not None:
                    assert [sort_key(sort)(d) for d in got_full] == [sort_key(sort)(d) for d in want]
            proj = (lambda d: apply_projection(d, projection)) if projection else (lambda d: d)
            assert sorted(key_of(d) for d in r["docs"]) == sorted(key_of(proj(d)) for d in want)
        finally:
            sh.store.close()

    prop()


def test_find_and_modify_takes_the_first_document_in_the_indexs_order(shard):
    ix = load(shard, "d.c", DOCS, a_1())
    before = ix.scanned
    _, r = shard.run(
        s.FindAndModify(ns="d.c", query={"a": {"$gte": 7}}, sort={"a": -1}, remove=True, routing=shard.routing("d.c"))
    )
    assert r["value"]["a"] == 9 and ix.scanned - before == 1  # the first key, read backward
