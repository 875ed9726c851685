"""domain/planner.py and domain/query_plan.py: bounds, byte ranges, ranking, sort and covering,
sparse and partial eligibility; and the proof of soundness: for random documents (arrays and
missing fields included), random indexes (compound, descending, multikey, sparse, partial) and
random filters, sorts, projections, skips, limits and orphans, the planned execution returns
exactly what a COLLSCAN plus an in-memory sort returns."""

from __future__ import annotations

import math
from typing import Any

import pytest
from bson import Decimal128, Int64
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from domain.indexes import IndexSpec, entries
from domain.planner import (
    FULL,
    IndexInfo,
    Interval,
    byte_ranges,
    choose,
    explain,
    field_bounds,
    implies,
)
from domain.query import apply_projection, compile_filter, sort_key
from domain.query_plan import Access, ExecStats, MemoryDocuments, run
from domain.shardkey import MAX_KEY, MIN_KEY, encode_value
from libs.errors import CommandError

INF = math.inf
NAN = float("nan")
PROPERTY = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def spec(key: dict, name: str | None = None, **kw) -> IndexSpec:
    k = tuple(key.items())
    return IndexSpec.make(name or "_".join(f"{p}_{d}" for p, d in k), k, **kw)


def info(key: dict, multikey: bool = False, **kw) -> IndexInfo:
    return IndexInfo(spec(key, **kw), multikey)


# ------------------------------------------------------------------ bounds


def b(flt: dict, path: str = "a", multikey: bool = False):
    return field_bounds(compile_filter(flt), path, multikey=multikey)


def test_bounds_points_ranges_and_nothing():
    assert b({"a": 5}) == (Interval(5, True, 5, True),)
    assert b({"a": {"$in": [3, 1, 1.0]}}) == (Interval(1, True, 1, True), Interval(3, True, 3, True))
    assert b({"a": {"$gt": 5}}) == (Interval(5, False, INF, True),)
    assert b({"a": {"$gte": "m", "$lt": "z"}}) == (Interval("m", True, "z", False),)
    assert b({"a": {"$gt": 5, "$lt": 1}}) == ()  # unsatisfiable: nothing to scan
    for nothing in ({"a": {"$ne": 1}}, {"a": {"$nin": [1]}}, {"a": {"$exists": True}}, {"a": {"$not": {"$gt": 1}}}):
        assert b(nothing) == (FULL,)
    assert b({"$nor": [{"a": 1}]}) == (FULL,)
    assert b({"b": 1}) == (FULL,)


def test_an_array_operand_bounds_nothing():
    assert b({"a": [1, 2]}) == (FULL,)
    assert b({"a": {"$gt": [1]}}) == (FULL,)
    assert b({"a": {"$in": [1, [2]]}}) == (FULL,)


def test_or_is_the_union_when_every_branch_bounds_the_field():
    assert b({"$or": [{"a": 1}, {"a": 3}]}) == (Interval(1, True, 1, True), Interval(3, True, 3, True))
    assert b({"$or": [{"a": 1}, {"b": 3}]}) == (FULL,)


def test_multikey_never_intersects_two_predicates():
    # {a: [1, 10]} matches both: each predicate holds for another element.
    flt = {"a": {"$gt": 5, "$lt": 3}}
    assert b(flt) == ()
    assert b(flt, multikey=True) in ((Interval(5, False, INF, True),), (Interval(-INF, True, 3, False),))
    assert b({"a": 1, "$and": [{"a": {"$gt": 0}}]}, multikey=True) == (Interval(1, True, 1, True),)
    assert b({"a": {"$gt": MIN_KEY}}, multikey=True) == (FULL,)


def test_multikey_dotted_null_bounds_nothing():
    # {a: [{b: 1}, {c: 1}]} matches {"a.b": null} but its keys in a.b are only 1.
    assert b({"a.b": None}, "a.b", multikey=True) == (FULL,)
    assert b({"a.b": None}, "a.b") == (Interval(None, True, None, True),)
    assert b({"a": None}, "a", multikey=True) == (Interval(None, True, None, True),)


# ------------------------------------------------------------------ byte ranges


def keys_in(s: IndexSpec, ranges, docs) -> set:
    got = set()
    for d in docs:
        for k, values in entries(s, d)[0].items():
            if any(lo <= k < hi for lo, hi in ranges):
                got.add((encode_value(d["_id"]), values))
    return got


@pytest.mark.parametrize("direction", [1, -1])
def test_byte_ranges_respect_inclusive_ends_and_decimal_continuations(direction):
    s = spec({"a": direction, "b": 1})
    near = Decimal128("2.5000000000000000001")  # encodes as 2.5's encoding, 0xFF, more digits
    docs = [{"_id": i, "a": v, "b": i} for i, v in enumerate([2, 2.5, near, 3, Decimal128("2.5"), "x", None])]
    cases = {
        (2.5, True, 3, False): {1, 2, 4},
        (2.5, False, 3, True): {2, 3},
        (2, False, 2.5, True): {1, 4},
        (2, True, 2.5, False): {0},
        (MIN_KEY, True, MAX_KEY, True): set(range(7)),
    }
    for iv, want in cases.items():
        ranges = byte_ranges(s, [(Interval(*iv),), (FULL,)])
        got = {i for i, d in enumerate(docs) if any(lo <= k < hi for k in entries(s, d)[0] for lo, hi in ranges)}
        assert got == want, iv
    point = byte_ranges(s, [(Interval(2.5, True, 2.5, True),), (Interval(1, True, 1, True),)])
    got = {i for i, d in enumerate(docs) if any(lo <= k < hi for k in entries(s, d)[0] for lo, hi in point)}
    assert got == {1}


def test_compound_points_then_a_range():
    s = spec({"a": 1, "b": -1, "c": 1})
    ranges = byte_ranges(
        s,
        [
            (Interval(1, True, 1, True), Interval(2, True, 2, True)),
            (Interval(5, False, INF, True),),
            (FULL,),
        ],
    )
    assert len(ranges) == 2 and ranges == sorted(ranges)
    docs = [{"_id": i, "a": a, "b": bb, "c": 0} for i, (a, bb) in enumerate([(1, 6), (1, 5), (2, 9), (3, 9), (2, 4)])]
    assert {i for i, _ in [(k[0], k) for k in keys_in(s, ranges, docs)]} == {
        encode_value(0),
        encode_value(2),
    }


# ------------------------------------------------------------------ ranking, sort, covering


def test_ranking_prefers_equality_then_range_then_sort_then_no_fetch_then_fewer_fields():
    idx = [info({"b": 1}), info({"a": 1, "c": 1}), info({"a": 1}), info({"c": 1})]
    p = choose({"a": 1, "b": {"$gt": 0}}, indexes=idx)
    assert p.winner.name in ("a_1_c_1", "a_1")
    assert p.winner.name == "a_1"  # as good, fewer fields
    assert [c.name for c in p.rejected] == ["a_1_c_1", "b_1"]
    p = choose({"a": 1, "c": {"$gt": 0}}, indexes=idx)
    assert p.winner.name == "a_1_c_1"  # equality then a range beats equality alone
    p = choose({"b": {"$gt": 0}}, sort={"c": 1}, indexes=idx)
    assert p.winner.name == "b_1" and not p.sort_provided  # a range beats the sort
    p = choose({}, sort={"c": -1}, indexes=idx)
    assert p.winner.name == "c_1" and p.sort_provided and p.winner.direction == -1
    p = choose({"x": 1}, indexes=idx)
    assert p.winner is None  # nothing bounded, no sort, no covering: COLLSCAN


def test_the_shard_key_index_competes_and_wins_ties():
    p = choose({"a": 1, "sk": 2}, indexes=[info({"a": 1})], shard_key={"sk": 1})
    assert p.winner.name == "sk_1" and p.winner.index.clustered
    p = choose({"a": 1, "sk": {"$gt": 2}}, indexes=[info({"a": 1})], shard_key={"sk": 1})
    assert p.winner.name == "a_1"


def test_sort_skips_point_fields_and_may_end_with_id():
    idx = [info({"a": 1, "b": -1})]
    assert choose({"a": 5}, sort={"b": 1}, indexes=idx).winner.direction == -1
    assert choose({"a": 5}, sort={"b": -1, "_id": 1}, indexes=idx).sort_provided
    assert not choose({"a": 5}, sort={"b": -1, "_id": -1}, indexes=idx).sort_provided
    assert not choose({"a": {"$in": [1, 2]}}, sort={"b": 1}, indexes=idx).sort_provided
    assert choose({"a": {"$in": [1, 2]}}, sort={"a": 1, "b": -1}, indexes=idx).sort_provided
    assert not choose({}, sort={"a": 1, "b": 1}, indexes=idx).sort_provided
    multikey = [info({"a": 1}, multikey=True)]
    assert not choose({"a": 5}, sort={"a": 1}, indexes=multikey).sort_provided


def test_covered_projections():
    idx = [info({"a": 1, "b": 1})]
    assert choose({"a": 5}, projection={"a": 1, "b": 1, "_id": 0}, indexes=idx).covered
    assert choose({"a": 5}, projection={"b": 1}, indexes=idx).covered  # _id ends every entry
    assert not choose({"a": 5}, projection={"b": 1, "c": 1}, indexes=idx).covered
    assert not choose({"a": 5, "c": 1}, projection={"b": 1}, indexes=idx).covered
    assert not choose({"a": 5}, projection={"c": 0}, indexes=idx).covered
    assert not choose({"a": 5}, projection={"b": 1}, indexes=[info({"a": 1, "b": 1}, multikey=True)]).covered


def test_sparse_only_when_the_filter_needs_a_value():
    idx = [info({"a": 1}, sparse=True)]
    assert choose({"a": 5}, indexes=idx).winner is not None
    assert choose({"a": {"$gt": 1}}, indexes=idx).winner is not None
    assert choose({"a": None}, indexes=idx).winner is None
    assert choose({"a": {"$in": [1, None]}}, indexes=idx).winner is None
    assert choose({"a": {"$exists": False}}, indexes=idx).winner is None
    assert choose({}, sort={"a": 1}, indexes=idx).winner is None  # a sort must not lose documents


def test_partial_only_when_the_filter_implies_it():
    idx = [info({"a": 1}, partial={"b": {"$gt": 5}})]
    assert choose({"a": 1, "b": {"$gt": 5}}, indexes=idx).winner is not None
    assert choose({"a": 1, "b": {"$gte": 10}}, indexes=idx).winner is not None
    assert choose({"a": 1, "b": 7}, indexes=idx).winner is not None
    assert choose({"a": 1, "b": {"$in": [6, 8]}}, indexes=idx).winner is not None
    assert choose({"a": 1, "b": {"$gte": 5}}, indexes=idx).winner is None
    assert choose({"a": 1, "b": "z"}, indexes=idx).winner is None
    assert choose({"a": 1}, indexes=idx).winner is None
    assert choose({"$or": [{"a": 1, "b": 9}, {"a": 2}]}, indexes=idx).winner is None
    q = compile_filter
    assert implies(q({"b": 1}), q({"b": {"$exists": True}}))
    assert not implies(q({"b": None}), q({"b": {"$exists": True}}))
    assert implies(q({"b": None}), q({"b": None}))
    assert implies(q({"$or": [{"x": 1}, {"y": 1}], "z": 1}), q({"$or": [{"x": 1}, {"y": 1}]}))


def test_hint_by_name_or_key_pattern_or_natural():
    idx = [info({"a": 1}), info({"b": 1})]
    assert choose({"a": 1}, hint="b_1", indexes=idx).winner.name == "b_1"
    assert choose({"a": 1}, hint={"b": 1}, indexes=idx).winner.name == "b_1"
    assert choose({"a": 1}, hint={"$natural": 1}, indexes=idx).winner is None
    with pytest.raises(CommandError) as e:
        choose({"a": 1}, hint="nope", indexes=idx)
    assert e.value.code == "BadValue"


def test_explain_in_mongodbs_shape():
    idx = [info({"a": 1, "b": -1})]
    p = choose({"a": 5, "b": {"$gt": 1}}, projection={"a": 1, "_id": 0}, indexes=idx)
    e = explain(p, {"keysExamined": 3, "docsExamined": 0, "nReturned": 2})
    plan = e["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "PROJECTION_COVERED"
    ix = plan["inputStage"]
    assert ix["stage"] == "IXSCAN" and ix["indexName"] == "a_1_b_-1" and ix["keyPattern"] == {"a": 1, "b": -1}
    assert ix["indexBounds"] == {"a": ["[5, 5]"], "b": ["[inf.0, 1)"]}
    assert ix["direction"] == "forward"
    assert e["executionStats"]["totalKeysExamined"] == 3 and e["executionStats"]["nReturned"] == 2
    p = choose({"c": "x"}, sort={"c": 1}, indexes=idx, shard_key={"sk": 1})
    plan = explain(p)["queryPlanner"]["winningPlan"]
    assert plan["stage"] == "SORT" and plan["inputStage"]["stage"] == "SHARDING_FILTER"
    assert plan["inputStage"]["inputStage"]["stage"] == "COLLSCAN"
    p = choose({"a": {"$in": ["x", 2]}}, sort={"a": -1}, indexes=[info({"a": 1})])
    ix = explain(p)["queryPlanner"]["winningPlan"]["inputStage"]
    assert ix["direction"] == "backward" and ix["indexBounds"] == {"a": ['["x", "x"]', "[2, 2]"]}


# ------------------------------------------------------------------ executor


def test_executor_counts_keys_and_documents():
    s = spec({"a": 1})
    mem = MemoryDocuments.of([{"_id": i, "a": i % 10, "b": i} for i in range(100)], [s])
    p = choose({"a": 3}, indexes=[IndexInfo(s)])
    stats = ExecStats()
    out = list(run(p, mem.access(), stats=stats))
    assert len(out) == 10 and stats.keysExamined == 10 and stats.docsExamined == 10 and stats.nReturned == 10
    stats = ExecStats()
    list(run(choose({"a": 3}), mem.access(), stats=stats))
    assert stats.docsExamined == 100 and stats.keysExamined == 0
    stats = ExecStats()
    p = choose({"a": 3}, projection={"a": 1, "_id": 0}, indexes=[IndexInfo(s)])
    assert list(run(p, mem.access(), stats=stats)) == [{"a": 3}] * 10
    assert stats.docsExamined == 0 and p.covered
    stats = ExecStats()
    p = choose({"a": {"$gte": 0}}, sort={"a": 1}, indexes=[IndexInfo(s)])
    assert [d["a"] for d in run(p, mem.access(), limit=3, stats=stats)] == [0, 0, 0]
    assert stats.keysExamined == 3  # the index gives the order: the limit stops the scan


def test_compound_later_fields_are_checked_on_the_keys():
    s = spec({"a": 1, "b": 1, "c": 1})
    mem = MemoryDocuments.of([{"_id": i, "a": i % 2, "b": i, "c": i % 3} for i in range(30)], [s])
    stats = ExecStats()
    p = choose({"a": 0, "b": {"$gte": 10}, "c": 1}, indexes=[IndexInfo(s)])
    out = list(run(p, mem.access(), stats=stats))
    assert sorted(d["_id"] for d in out) == [10, 16, 22, 28]
    assert stats.keysExamined == 10 and stats.docsExamined == 4


def test_multikey_results_come_once_and_orphans_stay_invisible():
    s = spec({"a": 1})
    docs = [{"_id": 1, "a": [1, 2, 3]}, {"_id": 2, "a": [2]}, {"_id": 3, "a": 5}]
    mem = MemoryDocuments.of(docs, [s])
    assert mem.multikey["a_1"]
    p = choose({"a": {"$in": [1, 2, 3]}}, indexes=[IndexInfo(s, True)])
    access = mem.access()
    assert sorted(d["_id"] for d in run(p, access)) == [1, 2]
    access.owned = lambda loc: loc != encode_value(2)
    assert [d["_id"] for d in run(p, access)] == [1]


def test_a_null_key_in_a_covered_plan_fetches_the_document():
    s = spec({"a": 1, "b": 1})
    mem = MemoryDocuments.of([{"_id": 1, "a": 1}, {"_id": 2, "a": 1, "b": None}, {"_id": 3, "a": 1, "b": 2}], [s])
    p = choose({"a": 1}, projection={"b": 1, "_id": 0}, indexes=[IndexInfo(s)])
    stats = ExecStats()
    assert p.covered
    assert sorted(map(str, run(p, mem.access(), stats=stats))) == sorted(map(str, [{}, {"b": None}, {"b": 2}]))
    assert stats.docsExamined == 2


# ------------------------------------------------------------------ the proof of soundness

NEAR = Decimal128("2.5000000000000000001")
SCALARS = [None, True, False, 0, 1, 1.0, Int64(1), -2, 2.5, NEAR, Decimal128("0.1"), INF, -INF, NAN, "", "a", "ab"]
VALUES = SCALARS + [{}, {"b": 1}, {"b": None}, [], [1], [1, "a"], [[1]]]
PATHS = ["a", "b", "a.b", "c.d", "a.0"]

values = st.one_of(st.sampled_from(VALUES), st.sampled_from([1, 2.5, "a", None, NEAR]))
operands = st.one_of(*[st.sampled_from(SCALARS)] * 4, values, st.sampled_from([MIN_KEY, MAX_KEY]))
_cmp = st.tuples(st.sampled_from(["$eq", "$ne"] + ["$gt", "$gte", "$lt", "$lte"] * 2), operands)
_in = st.tuples(st.sampled_from(["$in", "$in", "$nin"]), st.lists(operands, max_size=3))
_exists = st.tuples(st.just("$exists"), st.booleans())
simple_ops = st.lists(st.one_of(_cmp, _cmp, _in, _exists), min_size=1, max_size=3).map(dict)
op_objects = st.one_of(simple_ops, simple_ops, simple_ops.map(lambda d: {"$not": d}))
conditions = st.one_of(operands, operands, op_objects, op_objects)
leaves = st.dictionaries(st.sampled_from(PATHS), conditions, min_size=1, max_size=2)
filters = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(
            lambda op, xs: {op: xs},
            st.sampled_from(["$and", "$or", "$or", "$nor"]),
            st.lists(children, min_size=1, max_size=3),
        ),
        st.builds(lambda leaf, sub: {**leaf, "$and": [sub]}, leaves, children),
    ),
    max_leaves=5,
)
common = st.sampled_from([1, 1.0, 2.5, NEAR, "a", None, -2, [1], {"b": 1}])
focused_conditions = st.one_of(
    common,
    st.builds(lambda vs: {"$in": vs}, st.lists(common, max_size=3)),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), common, min_size=1, max_size=2),
    op_objects,
)
# Narrowing conjuncts, so partial indexes get used.
NARROW = [{"b": {"$gt": 1}}, {"b": 2.5}, {"a": {"$exists": True}}, {"b": {"$in": [1, "a"]}}, {"b": {"$gte": 0}}]
PARTIALS = [{"b": {"$gt": 0}}, {"a": {"$exists": True}}, {"b": {"$in": [1, 2.5, "a"]}}, {"b": {"$gte": 0, "$lt": 100}}]

elements = st.one_of(values, common, st.fixed_dictionaries({}, optional={"b": values, "c": values}))
docs_st = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "a": st.one_of(
                common, values, st.fixed_dictionaries({}, optional={"b": common}), st.lists(elements, max_size=3)
            ),
            "b": st.one_of(common, common, values),
            "c": st.one_of(values, st.fixed_dictionaries({}, optional={"d": common})),
        },
    ),
    min_size=3,
    max_size=25,
)
index_keys_st = st.lists(st.sampled_from(["a", "a", "b", "b", *PATHS]), min_size=1, max_size=3, unique=True).flatmap(
    lambda paths: st.tuples(*[st.sampled_from([1, -1])] * len(paths)).map(lambda ds: tuple(zip(paths, ds)))
)
index_st = st.tuples(index_keys_st, st.sampled_from(["plain", "plain", "sparse", "partial"]), st.sampled_from(PARTIALS))
sorts = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.sampled_from(PATHS[:4] + ["_id"]), st.sampled_from([1, -1])),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t[0],
    ).map(dict),
)
projections = st.one_of(
    st.none(),
    st.builds(
        lambda ps, id_flag: {**{p: 1 for p in ps}, **({} if id_flag is None else {"_id": id_flag})},
        st.lists(st.sampled_from(["a", "b", "a.b", "c.d"]), min_size=1, max_size=2, unique=True).filter(
            lambda ps: not ("a" in ps and "a.b" in ps)
        ),
        st.sampled_from([None, 0, 1]),
    ),
    st.just({"b": 0}),
)


def canon(v: Any) -> Any:
    """A document as a value to compare, field order aside (a covered projection rebuilds fields
    in index order)."""
    if isinstance(v, dict):
        return {k: canon(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [canon(x) for x in v]
    return v


def key_of(d: dict) -> bytes:
    return encode_value(canon(d))


@PROPERTY
@given(
    docs_st,
    st.lists(index_st, max_size=3),
    filters,
    st.sampled_from([None, *NARROW]),
    sorts,
    projections,
    st.sampled_from([0, 0, 0, 1, 2]),
    st.sampled_from([0, 0, 1, 2, 5]),
    st.sets(st.integers(0, 24), max_size=5),
    st.data(),
)
def test_planned_execution_equals_collscan_and_in_memory_sort(
    raw_docs, raw_indexes, flt, narrow, sort, projection, skip, limit, orphans, data
):
    check_against_collscan(raw_docs, raw_indexes, flt, narrow, sort, projection, skip, limit, orphans, data)


# Dense data: every document holds a, b and c.d from a few values (arrays now and then), so
# point and range bounds, sorts and covered projections find many documents.
dense_value = st.sampled_from([1, 1.0, 2, 2.5, NEAR, "a", "b", None])
dense_docs = st.lists(
    st.fixed_dictionaries(
        {
            "a": st.one_of(*[dense_value] * 8, st.lists(dense_value, max_size=2)),
            "b": dense_value,
            "c": st.one_of(st.fixed_dictionaries({"d": dense_value}), st.just({})),
        }
    ),
    min_size=5,
    max_size=30,
)
dense_index = st.tuples(
    st.lists(st.sampled_from(["a", "b", "c.d"]), min_size=1, max_size=3, unique=True).flatmap(
        lambda paths: st.tuples(*[st.sampled_from([1, -1])] * len(paths)).map(lambda ds: tuple(zip(paths, ds)))
    ),
    st.sampled_from(["plain", "plain", "plain", "sparse", "partial"]),
    st.sampled_from(PARTIALS),
)


@settings(PROPERTY, max_examples=1200)
@given(
    dense_docs,
    st.lists(dense_index, min_size=1, max_size=3),
    st.sampled_from([0, 0, 0, 1, 2]),
    st.sampled_from([0, 0, 1, 3]),
    st.sets(st.integers(0, 29), max_size=3),
    st.data(),
)
def test_planned_execution_equals_collscan_on_dense_data(raw_docs, raw_indexes, skip, limit, orphans, data):
    check_against_collscan(raw_docs, raw_indexes, {}, None, None, None, skip, limit, orphans, data, focused=True)


# Arrays everywhere: multikey indexes, several predicates on one path (each may hold for another
# element), null on a dotted path through an array of subdocuments without the field.
mk_element = st.one_of(dense_value, st.fixed_dictionaries({}, optional={"b": dense_value, "c": dense_value}))
mk_docs = st.lists(
    st.fixed_dictionaries({"a": st.one_of(st.lists(mk_element, max_size=3), mk_element), "b": dense_value}),
    min_size=3,
    max_size=20,
)
numbers = st.sampled_from([1, 2, 3.5])
mk_conditions = st.one_of(
    dense_value,
    st.just(None),
    *[st.sampled_from([{"$gte": 3.5, "$lte": 1}, {"$gt": 1, "$lt": 2}, {"$gte": 2, "$lt": 2}])] * 3,  # arrays only
    st.builds(lambda vs: {"$in": vs}, st.lists(dense_value, max_size=3)),
    st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte", "$eq"]), dense_value, min_size=1, max_size=2),
)
mk_filters = st.lists(
    st.dictionaries(st.sampled_from(["a", "a", "a.b", "a.b", "a.c", "b"]), mk_conditions, min_size=1, max_size=1),
    min_size=1,
    max_size=2,
).map(lambda fs: {"$and": fs})
mk_index = st.tuples(
    st.lists(st.sampled_from(["a", "a.b", "a.c", "b"]), min_size=1, max_size=2, unique=True).map(
        lambda ps: tuple((p, 1) for p in ps)
    ),
    st.sampled_from(["plain", "plain", "sparse"]),
    st.just(None),
)


@settings(PROPERTY, max_examples=2000)
@given(
    mk_docs,
    st.lists(mk_index, min_size=1, max_size=2),
    mk_filters,
    st.one_of(st.none(), st.sampled_from([{"a": 1}, {"a.b": -1}, {"b": 1}])),
    st.data(),
)
def test_planned_execution_equals_collscan_with_arrays(raw_docs, raw_indexes, flt, sort, data):
    check_against_collscan(raw_docs, raw_indexes, flt, None, sort, None, 0, 0, set(), data, focused=False)


def check_against_collscan(
    raw_docs, raw_indexes, flt, narrow, sort, projection, skip, limit, orphans, data, focused=None
):
    if focused is None:
        focused = bool(raw_indexes) and data.draw(st.booleans())
    if focused:
        # Focused: predicates, a sort and a projection on the first index's fields, which the
        # random ones rarely hit together.
        key = raw_indexes[0][0]
        preds = [{p: data.draw(focused_conditions)} for p, _ in key[: data.draw(st.integers(1, len(key)))]]
        flt = {"$and": [*preds, flt]} if data.draw(st.integers(0, 3)) == 0 else {"$and": preds}
        narrow = data.draw(st.sampled_from([None, None, *NARROW]))
        if data.draw(st.booleans()):
            flip = data.draw(st.sampled_from([1, -1]))
            sort = {p: d * flip for p, d in key[: data.draw(st.integers(1, len(key)))]}
        if data.draw(st.booleans()):
            paths = [p for p, _ in key]
            projection = {p: 1 for p in paths if not any(q.startswith(p + ".") for q in paths)}
            event("focused projection")
            projection["_id"] = data.draw(st.sampled_from([0, 1]))
    flt = {"$and": [flt, narrow]} if narrow is not None else flt
    specs = []
    for n, (key, kind, partial) in enumerate(raw_indexes):
        specs.append(
            IndexSpec.make(f"i{n}", key, sparse=kind == "sparse", partial=partial if kind == "partial" else None)
        )
    docs = []
    for i, d in enumerate(raw_docs):
        d = {"_id": i, **d}
        try:
            for s in specs:
                entries(s, d)
        except CommandError:
            continue  # parallel arrays: the shard refuses the document (CannotIndexParallelArrays)
        docs.append(d)
    mem = MemoryDocuments.of(docs, specs)
    infos = [IndexInfo(s, mem.multikey.get(s.name, False)) for s in specs]
    hint = None
    if infos and data.draw(st.booleans()):
        hint = data.draw(st.sampled_from([i.spec.name for i in infos]))
    try:
        plan = choose(flt, sort=sort, projection=projection, indexes=infos, hint=hint)
    except CommandError:
        assume(False)  # a hinted sparse/partial index that cannot answer: refused, not unsound
        return

    owned = lambda loc: loc not in {encode_value(o) for o in orphans}  # noqa: E731
    access = Access(
        mem,
        "db.c",
        mem.collscan,
        location=lambda d: encode_value(d["_id"]),
        owned=owned,
        locate=lambda _id: encode_value(_id) if mem.get_by_id("db.c", _id) is not None else None,
    )
    stats = ExecStats()
    got = list(run(plan, access, skip=skip, limit=limit, stats=stats))
    event(plan.stage if plan.winner is None or not plan.winner.index.multikey else "IXSCAN multikey")
    if plan.winner is not None:
        event(f"sort provided: {bool(sort) and plan.sort_provided}")
        event(f"covered: {plan.covered}")
        event(f"bounded: {plan.winner.rank[:2] != (0, 0)}")
        event(
            f"kind: {plan.winner.index.spec.sparse and 'sparse' or plan.winner.index.spec.partial is not None and 'partial' or 'plain'}"
        )
        event(f"returned: {min(len(got), 3)}")

    matcher = compile_filter(flt)
    expected_all = [d for d in docs if matcher.matches(d) and d["_id"] not in orphans]
    if sort:
        expected_all.sort(key=sort_key(sort))
    window = expected_all[skip : skip + limit if limit else None]
    project = (lambda d: apply_projection(d, projection)) if projection else (lambda d: d)

    assert len(got) == len(window) == stats.nReturned
    keeps_id = projection is None or projection.get("_id", 1) != 0 and any(projection.values())
    if keeps_id:
        by_id = {d["_id"]: d for d in docs}
        ids = [d["_id"] for d in got]
        assert len(set(ids)) == len(ids), "a document returned twice"
        full = [by_id[i] for i in ids]
        assert all(matcher.matches(d) and d["_id"] not in orphans for d in full)
        assert [key_of(g) for g in got] == [key_of(project(d)) for d in full]
        if sort:
            k = sort_key(sort)
            assert [k(d) for d in full] == [k(d) for d in window]
        elif not skip and not limit:
            assert sorted(ids) == sorted(d["_id"] for d in window)
    elif not skip and not limit:
        assert sorted(key_of(g) for g in got) == sorted(key_of(project(d)) for d in window)
    if plan.winner is None:
        assert stats.keysExamined == 0
    else:
        assert stats.docsExamined <= stats.keysExamined
    explain(plan, stats.as_dict())  # every plan explains


def test_regressions_the_properties_found():
    """Array cases the properties need luck to hit, pinned."""
    for docs, key, flt in [
        ([{"_id": 1, "a": [1, 3.5]}], (("a", 1),), {"a": {"$gte": 3.5, "$lte": 1}}),
        ([{"_id": 1, "a": [{"b": 1}, {"c": 1}]}], (("a.b", 1),), {"a.b": None}),
        ([{"_id": 1, "a": [{"b": 1}, {"c": 1}]}], (("a.b", 1),), {"a.b": {"$in": [None, 5]}}),
        ([{"_id": 1, "a": [1, 2]}], (("a", 1),), {"a": [1, 2]}),
        ([{"_id": 1, "a": [1, 2]}], (("a", 1),), {"a": {"$gt": [1]}}),
        ([{"_id": 1, "a": [MIN_KEY]}], (("a", 1),), {"a": {"$gt": MIN_KEY}}),
        ([{"_id": 1, "a": 2.5}, {"_id": 2, "a": NEAR}], (("a", -1),), {"a": {"$gt": 2.5}}),
        ([{"_id": 1, "a": 2.5}, {"_id": 2, "a": NEAR}], (("a", -1),), {"a": {"$lte": 2.5}}),
    ]:
        s = IndexSpec.make("i", key)
        mem = MemoryDocuments.of(docs, [s])
        plan = choose(flt, indexes=[IndexInfo(s, mem.multikey["i"])])
        m = compile_filter(flt)
        assert sorted(d["_id"] for d in run(plan, mem.access())) == [d["_id"] for d in docs if m.matches(d)], flt
