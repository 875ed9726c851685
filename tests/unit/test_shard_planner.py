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


# ------------------------------------------------ hints on Count, Update, Delete and FindAndModify

MISSING_INDEX_HINTS = ["nope", {"nope": 1}]
NATURAL = {"$natural": 1}
HINTS = ["a_1", {"a": 1}, NATURAL]


def stored(shard, ns: str) -> list[dict]:
    return [d for _, d in shard.documents.scan(ns)]


def refused(shard, req) -> str | None:
    """The code a request is refused with."""
    with pytest.raises(Exception) as err:
        shard.run(req)
    return getattr(err.value, "code", None)


def twins(shard) -> ShardIndexes:
    """d.c and d.h: the same documents and index a_1, for an operation without a hint on d.c and
    the same one with a hint on d.h.  The counter counts the index entries either scans."""
    load(shard, "d.c", DOCS, a_1())
    return load(shard, "d.h", DOCS, a_1())


def same_with_a_hint(shard, ix: ShardIndexes, hint: Any, make, indexed: bool) -> dict:
    """Run `make(ns, hint)` on d.c without the hint and on d.h with it: the same reply, and the
    hinted plan read a_1's entries exactly when the hint names a_1.  `indexed`: whether the
    planner reads a_1 by itself, so that each hint is seen to change some plan."""
    before = ix.scanned
    _, plain = shard.run(make("d.c", None))
    assert (ix.scanned > before) == indexed
    before = ix.scanned
    _, hinted = shard.run(make("d.h", hint))
    assert hinted == plain
    assert (ix.scanned > before) == (hint != NATURAL)
    return plain


def test_count_plans_with_its_hint(shard):
    ix = load(shard, "d.c", DOCS, a_1(), IndexSpec.make("sp", (("s", 1),), sparse=True))
    shard.run(
        s.Update(
            ns="d.c", filter={"b": {"$lt": 5}}, update={"$set": {"s": 1}}, multi=True, routing=shard.routing("d.c")
        )
    )

    def count(flt: dict, hint: Any = None) -> tuple[int, int]:
        """(n, index entries scanned)."""
        before = ix.scanned
        _, r = shard.run(s.Count(ns="d.c", filter=flt, hint=hint, routing=shard.routing("d.c")))
        return r["n"], ix.scanned - before

    assert count({"b": {"$lt": 30}}) == (30, 0)  # a COLLSCAN
    assert count({"b": {"$lt": 30}}, "a_1") == count({"b": {"$lt": 30}}, {"a": 1}) == (30, 100)  # all of a_1
    assert count({"a": 3}) == (10, 10)
    assert count({"a": 3}, NATURAL) == (10, 0)
    assert count({"_id": 7}) == (1, 0)  # the IDHACK
    assert count({"_id": 7}, "a_1") == (1, 100)  # a hint plans otherwise, as a find's
    assert count({"s": 1}, "sp") == count({"s": 1}) == (5, 5)
    for hint in MISSING_INDEX_HINTS:
        for flt in ({"a": 3}, {"_id": 7}, {}):
            req = s.Count(ns="d.c", filter=flt, hint=hint, routing=shard.routing("d.c"))
            assert refused(shard, req) == "BadValue", (hint, flt)
    # The sparse index lacks the documents without `s`: it may not count them (5 for 100).
    assert count({})[0] == 100
    assert refused(shard, s.Count(ns="d.c", filter={}, hint="sp", routing=shard.routing("d.c"))) == "BadValue"


@pytest.mark.parametrize("hint", HINTS)
def test_update_with_a_hint_does_what_it_does_without(shard, hint):
    ix = twins(shard)
    for flt, update, multi, upsert, indexed in [
        ({"a": 4}, {"$set": {"x": 1}}, True, False, True),
        ({"b": {"$gte": 90}}, {"$inc": {"b": 1000}}, True, False, False),
        ({"b": 42}, {"$set": {"y": 2}}, False, False, False),
        ({"_id": 7}, {"$set": {"z": 3}}, False, False, False),  # the IDHACK without a hint
        ({"_id": 1000, "a": 4}, {"$set": {"u": 1}}, False, True, False),  # an upsert
    ]:

        def make(ns, h, flt=flt, update=update, multi=multi, upsert=upsert):
            return s.Update(
                ns=ns, filter=flt, update=update, multi=multi, upsert=upsert, hint=h, routing=shard.routing(ns)
            )

        r = same_with_a_hint(shard, ix, hint, make, indexed)
        if upsert:
            assert r == {"matched": 0, "modified": 0, "upsertedId": 1000}, flt
        else:
            assert r["modified"] > 0, flt
    assert stored(shard, "d.h") == stored(shard, "d.c")
    # a: 4 (10), b >= 90 (10, _id 94 among both), _id 42, _id 7, the upserted 1000
    assert len([d for d in stored(shard, "d.c") if {"x", "y", "z", "u"} & d.keys() or d["b"] >= 1000]) == 22


def test_update_with_a_hint_naming_no_index_is_refused_and_writes_nothing(shard):
    load(shard, "d.c", DOCS, a_1(), IndexSpec.make("a_part", (("a", 1),), partial={"a": {"$lt": 5}}))
    for hint in MISSING_INDEX_HINTS:
        for flt, multi, upsert in [
            ({"a": 4}, True, False),
            ({"b": 42}, False, False),
            ({"_id": 7}, False, False),  # not the IDHACK either
            ({"_id": 1000}, False, True),  # no upsert
        ]:
            req = s.Update(
                ns="d.c",
                filter=flt,
                update={"$set": {"x": 1}},
                multi=multi,
                upsert=upsert,
                hint=hint,
                routing=shard.routing("d.c"),
            )
            assert refused(shard, req) == "BadValue", (hint, flt)
    # A partial index that would miss matching documents is refused too, not half applied.
    req = s.Update(
        ns="d.c",
        filter={"a": {"$gte": 3}},
        update={"$set": {"x": 1}},
        multi=True,
        hint="a_part",
        routing=shard.routing("d.c"),
    )
    assert refused(shard, req) == "BadValue"
    assert stored(shard, "d.c") == DOCS


@pytest.mark.parametrize("hint", HINTS)
def test_delete_with_a_hint_does_what_it_does_without(shard, hint):
    ix = twins(shard)
    deleted = []
    for flt, multi, indexed in [
        ({"a": {"$in": [2, 4]}}, True, True),
        ({"b": 43}, False, False),
        ({"_id": 7}, False, False),  # the IDHACK without a hint
        ({"b": -1}, True, False),
    ]:

        def make(ns, h, flt=flt, multi=multi):
            return s.Delete(ns=ns, filter=flt, multi=multi, hint=h, routing=shard.routing(ns))

        deleted.append(same_with_a_hint(shard, ix, hint, make, indexed)["deleted"])
    assert deleted == [20, 1, 1, 0]
    assert stored(shard, "d.h") == stored(shard, "d.c")
    assert len(stored(shard, "d.c")) == 78


def test_delete_with_a_hint_naming_no_index_is_refused_and_removes_nothing(shard):
    load(shard, "d.c", DOCS, a_1(), IndexSpec.make("a_part", (("a", 1),), partial={"a": {"$lt": 5}}))
    for hint in MISSING_INDEX_HINTS:
        for flt, multi in [({"a": 4}, True), ({}, True), ({"b": 42}, False), ({"_id": 7}, False)]:
            req = s.Delete(ns="d.c", filter=flt, multi=multi, hint=hint, routing=shard.routing("d.c"))
            assert refused(shard, req) == "BadValue", (hint, flt)
    req = s.Delete(ns="d.c", filter={"a": {"$gte": 3}}, multi=True, hint="a_part", routing=shard.routing("d.c"))
    assert refused(shard, req) == "BadValue"
    assert stored(shard, "d.c") == DOCS


@pytest.mark.parametrize("hint", HINTS)
def test_find_and_modify_with_a_hint_does_what_it_does_without(shard, hint):
    ix = twins(shard)
    values = []
    for options, indexed in [
        ({"query": {"a": 5}, "sort": {"b": -1}, "update": {"$set": {"y": 1}}, "new": True}, True),
        ({"query": {"a": {"$gte": 7}}, "sort": {"a": -1, "b": 1}, "remove": True}, True),
        ({"query": {"b": 42}, "update": {"$inc": {"b": 1}}}, False),
        ({"query": {"_id": 8}, "remove": True}, False),  # the IDHACK without a hint
        ({"query": {"_id": 1000, "a": 4}, "update": {"$set": {"u": 1}}, "upsert": True, "new": True}, False),
    ]:

        def make(ns, h, options=options):
            return s.FindAndModify(ns=ns, hint=h, routing=shard.routing(ns), **options)

        r = same_with_a_hint(shard, ix, hint, make, indexed)
        assert r["lastErrorObject"]["n"] == 1, options
        values.append(r["value"])
    assert values == [
        {"_id": 95, "a": 5, "b": 95, "y": 1},
        {"_id": 9, "a": 9, "b": 9},
        {"_id": 42, "a": 2, "b": 42},
        {"_id": 8, "a": 8, "b": 8},
        {"_id": 1000, "a": 4, "u": 1},
    ]
    assert stored(shard, "d.h") == stored(shard, "d.c")


def test_find_and_modify_with_a_hint_naming_no_index_is_refused_and_writes_nothing(shard):
    load(shard, "d.c", DOCS, a_1(), IndexSpec.make("a_part", (("a", 1),), partial={"a": {"$lt": 5}}))
    for hint in MISSING_INDEX_HINTS:
        for options in [
            {"query": {"a": 5}, "sort": {"b": -1}, "update": {"$set": {"y": 1}}},
            {"query": {"_id": 8}, "remove": True},
            {"query": {"_id": 1000}, "update": {"$set": {"u": 1}}, "upsert": True},
        ]:
            req = s.FindAndModify(ns="d.c", hint=hint, routing=shard.routing("d.c"), **options)
            assert refused(shard, req) == "BadValue", (hint, options)
    req = s.FindAndModify(ns="d.c", query={"a": {"$gte": 3}}, remove=True, hint="a_part", routing=shard.routing("d.c"))
    assert refused(shard, req) == "BadValue"
    assert stored(shard, "d.c") == DOCS
