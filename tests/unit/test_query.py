"""domain.query: filters, targeting helpers, sort, projection and updates.

Concrete cases come from MongoDB's documentation ("Query an Array", "Query an Array
of Embedded Documents", "Query for Null or Missing Fields") and from its
jstests/core/null_query_semantics.js; properties check the helpers against
references built straight from ``compare_values``."""

from __future__ import annotations

import copy
import math
import pickle
from functools import cmp_to_key
from typing import Any

import pytest
from bson import Int64, Regex
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.query import (
    MISSING,
    NOT_CONSTRAINED,
    Bounds,
    QueryError,
    apply_projection,
    apply_update,
    check_insert_document,
    check_update,
    compile_filter,
    get_path,
    is_update_operator_doc,
    merge_sorted,
    sort_key,
    update_stored,
    upsert_document,
)
from domain.shardkey import INT64_MAX, MAX_KEY, MIN_KEY, compare_values, encode_value

PROPERTY = settings(max_examples=150, deadline=None)
INF = math.inf
NAN = float("nan")


def ids(flt: dict, docs: list[dict]) -> set:
    m = compile_filter(flt)
    return {d["_id"] for d in docs if m.matches(d)}


def matches(flt: dict, doc: dict) -> bool:
    return compile_filter(flt).matches(doc)


# ----------------------------------------------------------------------------- get_path


def test_get_path() -> None:
    doc = {"a": {"b": {"c": 1}, "n": None}, "l": [{"x": 1}]}
    assert get_path(doc, "a.b.c") == 1
    assert get_path(doc, "a.b") == {"c": 1}
    assert get_path(doc, "a.n") is None
    assert get_path(doc, "a.x") is MISSING
    assert get_path(doc, "a.b.c.d") is MISSING  # through a scalar
    assert get_path(doc, "l.x") is MISSING  # no fan-out over arrays
    assert get_path(doc, "zz") is MISSING
    assert repr(MISSING) == "MISSING"
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING
    assert copy.deepcopy(NOT_CONSTRAINED) is NOT_CONSTRAINED


# ------------------------------------------------------------------- filters: examples

INVENTORY = [  # "Query an Array"
    {"_id": "journal", "tags": ["blank", "red"], "dim_cm": [14, 21]},
    {"_id": "notebook", "tags": ["red", "blank"], "dim_cm": [14, 21]},
    {"_id": "paper", "tags": ["red", "blank", "plain"], "dim_cm": [14, 21]},
    {"_id": "planner", "tags": ["blank", "red"], "dim_cm": [22.85, 30]},
    {"_id": "postcard", "tags": ["blue"], "dim_cm": [10, 15.25]},
]
STOCK = [  # "Query an Array of Embedded Documents"
    {"_id": "journal", "instock": [{"warehouse": "A", "qty": 5}, {"warehouse": "C", "qty": 15}]},
    {"_id": "notebook", "instock": [{"warehouse": "C", "qty": 5}]},
    {"_id": "paper", "instock": [{"warehouse": "A", "qty": 60}, {"warehouse": "B", "qty": 15}]},
    {"_id": "planner", "instock": [{"warehouse": "A", "qty": 40}, {"warehouse": "B", "qty": 5}]},
    {"_id": "postcard", "instock": [{"warehouse": "B", "qty": 15}, {"warehouse": "C", "qty": 35}]},
]
ALL = {"journal", "notebook", "paper", "planner", "postcard"}


@pytest.mark.parametrize(
    "flt, expected",
    [
        ({"tags": ["red", "blank"]}, {"notebook"}),  # exact array, order matters
        ({"tags": "red"}, {"journal", "notebook", "paper", "planner"}),  # any element
        ({"dim_cm": {"$gt": 25}}, {"planner"}),
        # each condition may be met by a different element
        ({"dim_cm": {"$gt": 15, "$lt": 20}}, {"journal", "notebook", "paper", "postcard"}),
        ({"dim_cm.1": {"$gt": 25}}, {"planner"}),  # index into the array
        ({"tags": {"$ne": "red"}}, {"postcard"}),  # $ne: no element equals
        ({"tags": {"$nin": ["red", "plain"]}}, {"postcard"}),
        ({"tags": {"$in": ["plain", "blue"]}}, {"paper", "postcard"}),
        ({"tags": {"$not": {"$in": ["red"]}}}, {"postcard"}),
        ({"dim_cm": [14, 21]}, {"journal", "notebook", "paper"}),
    ],
)
def test_array_examples(flt: dict, expected: set) -> None:
    assert ids(flt, INVENTORY) == expected


@pytest.mark.parametrize(
    "flt, expected",
    [
        ({"instock": {"warehouse": "A", "qty": 5}}, {"journal"}),
        ({"instock": {"qty": 5, "warehouse": "A"}}, set()),  # field order matters
        ({"instock.qty": {"$lte": 20}}, ALL),
        ({"instock.0.qty": {"$lte": 20}}, {"journal", "notebook", "postcard"}),
        ({"instock.qty": {"$gt": 10, "$lte": 20}}, {"journal", "paper", "planner", "postcard"}),
        ({"instock.qty": 5, "instock.warehouse": "A"}, {"journal", "planner"}),
        ({"instock.qty": {"$ne": 5}}, {"paper", "postcard"}),
        ({"instock.warehouse": {"$exists": True}}, ALL),
        ({"instock.bin": {"$exists": True}}, set()),
    ],
)
def test_embedded_array_examples(flt: dict, expected: set) -> None:
    assert ids(flt, STOCK) == expected


def test_dotted_path_through_array_of_subdocuments() -> None:
    assert matches({"a.b": 1}, {"a": [{"b": 1}, {"b": 2}]})
    assert matches({"a.b": 2}, {"a": [{"b": 1}, {"b": 2}]})
    assert not matches({"a.b": 3}, {"a": [{"b": 1}, {"b": 2}]})
    assert matches({"a.b.c": 1}, {"a": [{"b": [{"c": 0}, {"c": 1}]}]})
    assert matches({"a.b": 1}, {"a": [{"b": [0, 1]}]})  # leaf array reached through one
    assert not matches({"a.b": 1}, {"a": [[{"b": 1}]]})  # nested arrays are not entered
    assert not matches({"a": 1}, {"a": [[1]]})
    assert matches({"a": [1]}, {"a": [[1], 2]})


# null_query_semantics.js (without `undefined`, which JSON lacks)
NULL_DOCS = [
    {"_id": "a_empty_subobject", "a": {}},
    {"_id": "a_null", "a": None},
    {"_id": "a_number", "a": 4},
    {"_id": "a_subobject_b_not_null", "a": {"b": "hi"}},
    {"_id": "a_subobject_b_null", "a": {"b": None}},
    {"_id": "no_a"},
    {"_id": "a_double_array", "a": [[]]},
    {"_id": "a_empty_array", "a": []},
    {"_id": "a_object_array_all_b_nulls", "a": [{"b": None}, {"b": None}, {}]},
    {"_id": "a_object_array_no_b_nulls", "a": [{"b": 1}, {"b": 3}, {"b": "string"}]},
    {"_id": "a_object_array_some_b_nulls", "a": [{"b": None}, {"b": 3}, {"b": None}]},
    {"_id": "a_object_array_some_b_missing", "a": [{"b": 3}, {}]},
    {"_id": "a_value_array_all_nulls", "a": [None, None]},
    {"_id": "a_value_array_no_nulls", "a": [1, "string", 4]},
    {"_id": "a_value_array_with_null", "a": [1, "string", None, 4]},
]
NULL_IDS = {d["_id"] for d in NULL_DOCS}
A_IS_NULL = {"a_null", "no_a", "a_value_array_all_nulls", "a_value_array_with_null"}
A_B_IS_NULL = {
    "a_empty_subobject",
    "a_null",
    "a_number",
    "a_subobject_b_null",
    "no_a",
    "a_object_array_all_b_nulls",
    "a_object_array_some_b_nulls",
    "a_object_array_some_b_missing",
}


@pytest.mark.parametrize(
    "flt, expected",
    [
        ({"a": None}, A_IS_NULL),
        ({"a": {"$eq": None}}, A_IS_NULL),
        ({"a": {"$in": [None, 75]}}, A_IS_NULL),
        ({"$or": [{"a": None}, {"a": 75}]}, A_IS_NULL),
        ({"a": {"$ne": None}}, NULL_IDS - A_IS_NULL),
        ({"a": {"$nin": [None, 75]}}, NULL_IDS - A_IS_NULL),
        ({"a": {"$not": {"$gte": None}}}, NULL_IDS - A_IS_NULL),
        ({"a": {"$exists": False}}, {"no_a"}),
        ({"a.b": None}, A_B_IS_NULL),
        ({"a.b": {"$in": [None, 75]}}, A_B_IS_NULL),
        ({"a.b": {"$ne": None}}, NULL_IDS - A_B_IS_NULL),
        ({"a.b": {"$nin": [None, 75]}}, NULL_IDS - A_B_IS_NULL),
    ],
)
def test_null_and_missing_semantics(flt: dict, expected: set) -> None:
    assert ids(flt, NULL_DOCS) == expected


def test_dotted_exists_false_on_documents_without_arrays() -> None:
    plain = [d for d in NULL_DOCS if not isinstance(d.get("a"), list)]
    assert ids({"a.b": {"$exists": False}}, plain) == {"no_a", "a_empty_subobject", "a_null", "a_number"}


def test_null_comparisons() -> None:
    assert matches({"a": {"$gte": None}}, {})
    assert matches({"a": {"$lte": None}}, {"a": None})
    assert not matches({"a": {"$gt": None}}, {"a": None})
    assert not matches({"a": {"$lt": None}}, {})
    assert not matches({"a": {"$gte": None}}, {"a": 0})
    assert matches({"a": {"$exists": True}}, {"a": None})
    assert not matches({"a": {"$exists": True}}, {})


@pytest.mark.parametrize(
    "flt, doc, expected",
    [
        ({"a": {"$gt": 5}}, {"a": "x"}, False),  # no cross-type ordering
        ({"a": {"$lt": "z"}}, {"a": 5}, False),
        ({"a": {"$lt": "z"}}, {"a": "b"}, True),
        ({"a": {"$gt": 5}}, {"a": True}, False),
        ({"a": {"$gt": False}}, {"a": True}, True),
        ({"a": {"$lt": 2}}, {"a": [1, "x"]}, True),
        ({"a": {"$gt": {}}}, {"a": {"k": 1}}, True),
        ({"a": {"$gt": {}}}, {"a": [1]}, False),
        ({"a": {"$gte": 2}}, {"a": 2.0}, True),
        ({"a": 1}, {"a": 1.0}, True),  # value equality
        ({"a": 1}, {"a": True}, False),  # ... but booleans are not numbers
        ({"a": True}, {"a": 1}, False),
        ({"a": {"$in": [1]}}, {"a": 1.0}, True),
        ({"a": 2**53 + 1}, {"a": 2.0**53}, False),  # exact comparison of int64
        ({"a": NAN}, {"a": NAN}, True),
        ({"a": {"$lt": 5}}, {"a": NAN}, False),  # NaN is neither below nor above
        ({"a": {"$gt": NAN}}, {"a": 5}, False),
        ({"a": {"$gte": NAN}}, {"a": NAN}, True),
        ({"a": {"$gt": MIN_KEY}}, {"a": "x"}, True),  # MinKey/MaxKey compare across types
        ({"a": {"$lt": MAX_KEY}}, {"a": None}, True),
        ({"a": {"$lt": MIN_KEY}}, {"a": None}, False),
        ({"a": {"b": 1}}, {"a": {"b": 1.0}}, True),
        ({"a": {}}, {"a": {}}, True),
        ({"a": {"$eq": [1, 2]}}, {"a": [1, 2]}, True),
        ({"a": [1, 2]}, {"a": [2, 1]}, False),
    ],
)
def test_comparisons(flt: dict, doc: dict, expected: bool) -> None:
    assert matches(flt, doc) is expected


def test_not_and_logical_operators() -> None:
    gt5 = {"a": {"$not": {"$gt": 5}}}
    assert matches(gt5, {"a": 3}) and matches(gt5, {"a": "x"}) and matches(gt5, {})
    assert not matches(gt5, {"a": 7}) and not matches(gt5, {"a": [1, 7]})
    between = {"a": {"$not": {"$gt": 1, "$lt": 5}}}
    assert not matches(between, {"a": 3}) and matches(between, {"a": 7})
    assert matches({"a": {"$not": {"$not": {"$eq": 1}}}}, {"a": 1})
    nor = {"$nor": [{"a": 1}, {"b": 2}]}
    assert matches(nor, {"a": 2}) and matches(nor, {}) and not matches(nor, {"b": 2})
    orf = {"$or": [{"a": 1}, {"b": 2}], "c": 3}
    assert matches(orf, {"a": 1, "c": 3}) and not matches(orf, {"a": 1})
    andf = {"$and": [{"a": {"$gt": 1}}, {"a": {"$lt": 3}}]}
    assert matches(andf, {"a": 2}) and not matches(andf, {"a": 3})
    assert matches({}, {"anything": 1})
    assert matches({"$and": [{}]}, {})


@pytest.mark.parametrize(
    "flt, message",
    [
        ([], "must be an object"),
        ("a", "must be an object"),
        (None, "must be an object"),
        ({"a": {"$foo": 1}}, "^unknown operator: \\$foo$"),
        ({"a": {"$regex": 5}}, "\\$regex has to be a string"),
        ({"a": {"$regex": "x", "$options": "z"}}, "invalid flag in regex options: z"),
        ({"a": {"$options": "i"}}, "\\$options needs a \\$regex"),
        ({"a": {"$regex": "("}}, "Regular expression is invalid"),
        ({"a": {"$elemMatch": 1}}, "\\$elemMatch needs an Object"),
        ({"a": {"$size": "1"}}, "\\$size needs a number"),
        ({"a": {"$size": 1.5}}, "whole number"),
        ({"a": {"$all": 1}}, "\\$all needs an array"),
        ({"a": {"$mod": [0, 1]}}, "divisor cannot be 0"),
        ({"a": {"$mod": [1]}}, "not enough elements"),
        ({"a": {"$type": "nope"}}, "Unknown type name alias: nope"),
        ({"a": {"$type": 99}}, "Invalid numerical type code"),
        ({"a": {"$bitsAllSet": -1}}, "non-negative"),
        ({"a": {"$ne": Regex("x")}}, "Can't have regex as arg to \\$ne"),
        ({"a": {"$in": 1}}, "\\$in needs an array"),
        ({"a": {"$nin": "xy"}}, "\\$nin needs an array"),
        ({"a": {"$geoWithin": {}}}, "\\$geoWithin .* not supported"),
        ({"a": {"$in": [{"$gt": 1}]}}, "cannot nest"),
        ({"$and": []}, "non-empty array of objects"),
        ({"$and": {"a": 1}}, "non-empty array of objects"),
        ({"$or": [1]}, "non-empty array of objects"),
        ({"$nor": "x"}, "non-empty array of objects"),
        ({"a": {"$gt": 1, "b": 2}}, "cannot mix operators and plain fields"),
        ({"a": {"b": 2, "$gt": 1}}, "cannot mix operators and plain fields"),
        ({"$where": "this.a"}, "\\$where is not supported"),
        ({"$text": {"$search": "x"}}, "\\$text is not supported"),
        ({"$expr": {"$nope": 1}}, "Unrecognized expression"),
        ({"$eq": 1}, "unknown top level operator: \\$eq"),
        ({"$alwaysTrue": 2}, "must be an integer value of 1"),
        ({"a": {"$not": 5}}, "\\$not on 'a' needs a non-empty operator object"),
        ({"a": {"$not": {}}}, "\\$not"),
        ({"a": {"$not": {"b": 1}}}, "\\$not"),
        ({"a": {"$exists": "yes"}}, "\\$exists"),
        ({"a": {1, 2}}, "unsupported"),
        ({"a": 2**70}, "64-bit"),
        ({"": 1}, "non-empty"),
        ({"a..b": 1}, "empty path component"),
        ({"$or": [{"a": {"$bad": 1}}]}, "unknown operator"),
    ],
)
def test_malformed_filters(flt: Any, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        compile_filter(flt)


def test_matches_refuses_non_documents() -> None:
    with pytest.raises(QueryError):
        compile_filter({}).matches([1])


# ---------------------------------------------------------------- targeting: examples


def test_equality_on() -> None:
    eq = lambda flt, path="k": compile_filter(flt).equality_on(path)  # noqa: E731
    assert eq({"k": 5}) == 5
    assert eq({"k": {"$eq": "x"}}) == "x"
    assert eq({"k": None}) is None
    assert eq({"$and": [{"x": 1}, {"$and": [{"k": 5}]}]}) == 5
    assert eq({"k": {"$in": [5]}}) == 5
    assert eq({"k": {"$in": [1, 1.0]}}) == 1  # equal values deduplicated
    assert eq({"k": {"$in": [1, 5, 9]}, "$and": [{"k": {"$gt": 3, "$lt": 7}}]}) == 5
    assert eq({"k": {"$gte": 5, "$lte": 5}}) is NOT_CONSTRAINED  # a range, not an equality
    assert eq({"a.k": 5}, "a.k") == 5
    assert eq({"a": {"k": 5}}, "a.k") is NOT_CONSTRAINED
    assert eq({"k.x": 5}) is NOT_CONSTRAINED
    assert eq({"k": {"$ne": 5}}) is NOT_CONSTRAINED
    assert eq({"k": {"$not": {"$eq": 5}}}) is NOT_CONSTRAINED
    assert eq({"$nor": [{"k": 5}]}) is NOT_CONSTRAINED
    assert eq({"$or": [{"k": 5}, {"x": 1}]}) is NOT_CONSTRAINED
    assert eq({"$or": [{"k": 5}, {"k": 6}]}) is NOT_CONSTRAINED
    assert eq({"$or": [{"k": 5}, {"k": 5.0, "x": 1}]}) == 5  # every branch pins 5
    assert eq({"$or": [{"k": 5}]}) == 5
    assert eq({"x": 5}) is NOT_CONSTRAINED
    assert eq({}) is NOT_CONSTRAINED


def test_in_values_on() -> None:
    iv = lambda flt: compile_filter(flt).in_values_on("k")  # noqa: E731
    assert iv({"k": {"$in": [3, 1, 3.0, 2]}}) == [3, 1, 2]
    assert iv({"k": 4}) == [4]
    assert iv({"k": {"$in": []}}) == []
    assert iv({"$or": [{"k": 1}, {"k": {"$in": [2, 3]}}]}) == [1, 2, 3]
    assert iv({"$or": [{"k": 1}, {"k": {"$gt": 2}}]}) is None
    assert iv({"k": {"$in": [1, 2]}, "$and": [{"k": {"$in": [2, 3]}}]}) == [2]
    assert iv({"k": {"$in": [1, "a"]}, "$and": [{"k": {"$gt": 0}}]}) == [1]
    assert iv({"k": {"$nin": [1]}}) is None
    assert iv({"k": {"$gt": 1}}) is None


def test_bounds_on() -> None:
    b = lambda flt: compile_filter(flt).bounds_on("k")  # noqa: E731
    assert b({"k": {"$gt": 5}}) == Bounds(5, False, INF, True)
    assert b({"k": {"$gte": 5, "$lt": 10}}) == (5, True, 10, False)
    assert b({"k": {"$lt": "m"}}) == ("", True, "m", False)
    assert b({"k": {"$gt": "m"}}) == ("m", False, {}, False)  # strings end below objects
    assert b({"k": {"$gte": None}}) == (None, True, None, True)
    assert b({"k": {"$gt": False}}) == (False, False, True, True)
    assert b({"k": 5}) == (5, True, 5, True)
    assert b({"k": {"$in": [3, 1, 2]}}) == (1, True, 3, True)
    assert b({"$and": [{"k": {"$gt": 1}}, {"k": {"$gte": 3}}]}) == (3, True, INF, True)
    assert b({"$and": [{"k": {"$gt": 3}}, {"k": {"$gte": 3}}]}) == (3, False, INF, True)
    assert b({"$or": [{"k": {"$lt": 0}}, {"k": {"$gt": 10}}]}) == (-INF, True, INF, True)
    assert b({"$or": [{"k": {"$lt": 0}}, {"x": 1}]}) is None
    assert b({"k": {"$gt": MIN_KEY}}) == (MIN_KEY, False, MAX_KEY, True)
    assert b({"k": {"$ne": 1}}) is None
    assert b({"k": {"$exists": True}}) is None
    lo, lo_inc, hi, hi_inc = b({"k": {"$gt": 5, "$lt": 1}})  # unsatisfiable: empty
    assert compare_values(lo, hi) > 0


# ------------------------------------------------------------ filters: random filters

SCALARS = [None, True, False, 0, 1, 1.0, -2, 2.5, INF, -INF, NAN, "", "a", "ab", "b"]
VALUES = SCALARS + [{}, {"k": 1}, {"b": 1}, [], [1], [1, "a"]]
PATHS = ["a", "b", "a.b"]

values = st.sampled_from(VALUES)
# Weighted towards range operators and plain values, which the helpers look at.
operands = st.one_of(*[values] * 5, st.sampled_from([MIN_KEY, MAX_KEY]))
_cmp = st.tuples(st.sampled_from(["$eq", "$ne"] + ["$gt", "$gte", "$lt", "$lte"] * 2), operands)
_in = st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(operands, max_size=3))
_exists = st.tuples(st.just("$exists"), st.booleans())
simple_ops = st.lists(st.one_of(_cmp, _cmp, _in, _exists), min_size=1, max_size=3).map(dict)
op_objects = st.one_of(simple_ops, simple_ops.map(lambda d: {"$not": d}))
range_ops = st.dictionaries(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), values, min_size=1, max_size=2)
in_ops = st.builds(lambda vs: {"$in": vs}, st.lists(values, min_size=1, max_size=3))
conditions = st.one_of(values, range_ops, range_ops, in_ops, op_objects)
leaves = st.dictionaries(st.sampled_from(PATHS), conditions, min_size=1, max_size=2)
filters = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(
            lambda op, xs: {op: xs},
            st.sampled_from(["$and", "$or", "$nor"]),
            st.lists(children, min_size=1, max_size=3),
        ),
        st.builds(lambda leaf, sub: {**leaf, "$and": [sub]}, leaves, children),
    ),
    max_leaves=5,
)
elements = st.one_of(values, st.fixed_dictionaries({"b": values}))
docs = st.fixed_dictionaries(
    {},
    optional={
        "a": st.one_of(
            values, values, values, st.fixed_dictionaries({}, optional={"b": values}), st.lists(elements, max_size=3)
        ),
        "b": values,
    },
)

ARRAY = object()


def array_free_value(doc: dict, path: str) -> Any:
    """The value a shard key would read (missing -> null), or ARRAY if an array lies
    on the way (such documents are outside the helpers' guarantee)."""
    v: Any = doc
    for part in path.split("."):
        if isinstance(v, list):
            return ARRAY
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return ARRAY if isinstance(v, list) else v


def within(v: Any, b: Bounds) -> bool:
    lo, hi = compare_values(v, b.lo), compare_values(v, b.hi)
    return (lo > 0 or (lo == 0 and b.lo_inclusive)) and (hi < 0 or (hi == 0 and b.hi_inclusive))


# Shallow filters match more documents, so they exercise the helpers more often.
shallow_filters = st.one_of(
    leaves,
    st.builds(lambda f, g: {"$or": [f, g]}, leaves, leaves),
    st.builds(lambda f, g: {**f, "$and": [g]}, leaves, leaves),
)


@PROPERTY
@given(st.one_of(shallow_filters, filters), st.lists(docs, min_size=1, max_size=20))
def test_targeting_helpers_are_sound(flt: dict, ds: list[dict]) -> None:
    m = compile_filter(flt)
    for path in PATHS:
        eq, ins, bounds = m.equality_on(path), m.in_values_on(path), m.bounds_on(path)
        for doc in ds:
            x = array_free_value(doc, path)
            if x is ARRAY or not m.matches(doc):
                continue
            if eq is not NOT_CONSTRAINED:
                assert compare_values(x, eq) == 0, (path, doc)
            if ins is not None:
                assert any(compare_values(x, v) == 0 for v in ins), (path, doc)
            if bounds is not None:
                assert within(x, bounds), (path, doc, bounds)


@PROPERTY
@given(filters, filters, docs)
def test_logical_operators_compose(f: dict, g: dict, doc: dict) -> None:
    mf, mg = matches(f, doc), matches(g, doc)
    assert matches({"$and": [f, g]}, doc) == (mf and mg)
    assert matches({"$or": [f, g]}, doc) == (mf or mg)
    assert matches({"$nor": [f, g]}, doc) == (not (mf or mg))


@PROPERTY
@given(st.sampled_from(PATHS), simple_ops, values, st.lists(values, max_size=3), docs)
def test_negations_and_equalities(path: str, ops: dict, v: Any, vs: list, doc: dict) -> None:
    assert matches({path: {"$not": ops}}, doc) == (not matches({path: ops}, doc))
    assert matches({path: {"$ne": v}}, doc) == (not matches({path: v}, doc))
    assert matches({path: {"$eq": v}}, doc) == matches({path: v}, doc)
    assert matches({path: {"$nin": vs}}, doc) == (not matches({path: {"$in": vs}}, doc))
    assert matches({path: {"$in": vs}}, doc) == any(matches({path: x}, doc) for x in vs)
    assert matches({path: {"$exists": True}}, doc) != matches({path: {"$exists": False}}, doc)


# -------------------------------------------------------------------------------- sort


def sort_ids(docs: list[dict], spec: dict) -> list:
    return [d["_id"] for d in sorted(docs, key=sort_key(spec))]


def test_sort_examples() -> None:
    docs = [
        {"_id": 0, "a": "ab"},
        {"_id": 1, "a": "a"},
        {"_id": 2, "a": "b"},
        {"_id": 3},
        {"_id": 4, "a": 10},
        {"_id": 5, "a": None},
        {"_id": 6, "a": 2.5},
        {"_id": 7, "a": [0]},
        {"_id": 8, "a": {"x": 1}},
        {"_id": 9, "a": False},
    ]
    # null/missing < numbers < strings < objects < booleans; missing ties null; an array sorts
    # by its smallest element ascending, its largest descending ([0] as 0)
    assert sort_ids(docs, {"a": 1}) == [3, 5, 7, 6, 4, 1, 0, 2, 8, 9]
    # a shorter prefix sorts after the longer string when descending
    assert sort_ids(docs, {"a": -1}) == [9, 8, 2, 0, 1, 4, 6, 7, 3, 5]
    arrays = [{"_id": 0, "a": [5, 1]}, {"_id": 1, "a": [3]}, {"_id": 2, "a": []}, {"_id": 3, "a": None}]
    assert sort_ids(arrays, {"a": 1}) == [2, 3, 0, 1]  # [] below null; [5, 1] as 1
    assert sort_ids(arrays, {"a": -1}) == [0, 1, 3, 2]  # [5, 1] as 5
    through = [
        {"_id": 0, "a": [{"b": 4}, {"b": 2}]},
        {"_id": 1, "a": [{"b": 3}]},
        {"_id": 2, "a": [{"c": 1}, {"b": 9}]},
    ]
    assert sort_ids(through, {"a.b": 1}) == [2, 0, 1]  # a subdocument without b counts as null
    assert sort_ids(through, {"a.b": -1}) == [2, 0, 1]
    compound = [{"_id": i, "a": i // 2, "b": i % 2} for i in range(4)]
    assert sort_ids(compound, {"a": 1, "b": -1}) == [1, 0, 3, 2]
    assert sort_ids(compound, {"a": -1, "b": 1}) == [2, 3, 0, 1]
    nested = [{"_id": 0, "x": {"y": 2}}, {"_id": 1, "x": {"y": 1}}, {"_id": 2}]
    assert sort_ids(nested, {"x.y": 1}) == [2, 1, 0]
    assert sort_ids([{"_id": 0, "a": 1}, {"_id": 1, "a": 1.0}], {"a": -1}) == [0, 1]  # stable


@pytest.mark.parametrize("spec", [{}, [], None, {"a": 2}, {"a": 0}, {"a": True}, {"a": "asc"}, {"": 1}, {"a.$": 1}])
def test_bad_sort_specs(spec: Any) -> None:
    with pytest.raises(QueryError):
        sort_key(spec)
    with pytest.raises(QueryError):
        merge_sorted([[]], spec)


sort_values = st.one_of(
    values,
    st.text(alphabet="ab\x00é", max_size=3),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.lists(values, max_size=2),
    st.dictionaries(st.sampled_from("ab"), values, max_size=2),
)
sort_docs = st.lists(
    st.fixed_dictionaries(
        {}, optional={"a": sort_values, "b": sort_values, "c": st.fixed_dictionaries({}, optional={"d": sort_values})}
    ),
    max_size=12,
).map(lambda ds: [{"_id": i, **d} for i, d in enumerate(ds)])
sort_specs = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c.d", "c"]), st.sampled_from([1, -1, 1.0])),
    min_size=1,
    max_size=3,
    unique_by=lambda t: t[0],
).map(dict)


def reference_cmp(spec: dict):
    """MongoDB's documented sort: missing is null; an array sorts by its smallest element
    ascending, its largest descending; an empty array below null (EMPTY)."""
    empty = object()

    def value(doc: dict, path: str, direction: int) -> Any:
        v = get_path(doc, path)
        if isinstance(v, list):
            if not v:
                return empty
            pick = min if direction == 1 else max
            return pick(v, key=cmp_to_key(compare_values))
        return None if v is MISSING else v

    def compare(a: Any, b: Any) -> int:
        if a is empty or b is empty:
            return (a is not empty) - (b is not empty)
        return compare_values(a, b)

    def cmp(x: dict, y: dict) -> int:
        for path, direction in spec.items():
            c = compare(value(x, path, direction), value(y, path, direction))
            if c:
                return c if direction == 1 else -c
        return 0

    return cmp


@PROPERTY
@given(sort_docs, sort_specs)
def test_sort_key_agrees_with_reference_comparator(ds: list[dict], spec: dict) -> None:
    expected = [d["_id"] for d in sorted(ds, key=cmp_to_key(reference_cmp(spec)))]
    assert sort_ids(ds, spec) == expected  # both sorts are stable: identical order


@PROPERTY
@given(sort_docs, sort_specs, st.data())
def test_merge_sorted_of_sorted_partitions_is_sorted_union(ds: list[dict], spec: dict, data) -> None:
    k = data.draw(st.integers(1, 4))
    parts: list[list[dict]] = [[] for _ in range(k)]
    for d in ds:
        parts[data.draw(st.integers(0, k - 1))].append(d)
    key = sort_key(spec)
    merged = list(merge_sorted([sorted(p, key=key) for p in parts], spec))
    assert sorted(d["_id"] for d in merged) == [d["_id"] for d in ds]
    assert [key(d) for d in merged] == [key(d) for d in sorted(ds, key=key)]


# -------------------------------------------------------------------------- projection

DOC = {"_id": 7, "a": {"b": 1, "c": 2}, "l": [{"b": 1, "c": 2}, 3, [{"b": 4}]], "z": 0}


@pytest.mark.parametrize(
    "projection, expected",
    [
        (None, DOC),
        ({}, DOC),
        ({"z": 1}, {"_id": 7, "z": 0}),
        ({"z": 1, "_id": 0}, {"z": 0}),
        ({"z": True, "a": 1}, {"_id": 7, "a": {"b": 1, "c": 2}, "z": 0}),  # document order
        ({"a.b": 1}, {"_id": 7, "a": {"b": 1}}),
        ({"a.b": 1, "a.c": 1}, {"_id": 7, "a": {"b": 1, "c": 2}}),
        ({"a.x": 1}, {"_id": 7, "a": {}}),
        ({"z.x": 1}, {"_id": 7}),
        ({"missing": 1}, {"_id": 7}),
        ({"l.b": 1}, {"_id": 7, "l": [{"b": 1}, [{"b": 4}]]}),  # scalars in arrays dropped
        ({"_id": 1}, {"_id": 7}),
        ({"_id": 0}, {"a": {"b": 1, "c": 2}, "l": DOC["l"], "z": 0}),
        ({"a": 0, "l": 0}, {"_id": 7, "z": 0}),
        ({"a": 0, "_id": 1}, {"_id": 7, "l": DOC["l"], "z": 0}),
        ({"a.b": 0, "_id": 0}, {"a": {"c": 2}, "l": DOC["l"], "z": 0}),
        ({"l.b": 0}, {"_id": 7, "a": DOC["a"], "l": [{"c": 2}, 3, [{}]], "z": 0}),
    ],
)
def test_projection_examples(projection: dict | None, expected: dict) -> None:
    before = copy.deepcopy(DOC)
    out = apply_projection(DOC, projection)
    assert out == expected and list(out) == list(expected)
    assert DOC == before


@pytest.mark.parametrize(
    "projection, message",
    [
        ({"a": 1, "z": 0}, "mixes inclusion and exclusion"),
        ({"a": "yes"}, "literals and expressions is not supported"),
        ({"a": {"$meta": "textScore"}}, "not supported"),
        ({"a": 1, "a.b": 1}, "collision"),
        ({"a.b": 0, "a": 0}, "collision"),
        ({"l.$": 1}, "positional"),
        ([("a", 1)], "must be an object"),
    ],
)
def test_bad_projections(projection: Any, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        apply_projection(DOC, projection)


proj_paths = st.sampled_from(["a", "b", "a.b", "c.d", "l.b", "_id"])
doc_values = st.recursive(
    values,
    lambda ch: st.one_of(st.lists(ch, max_size=3), st.dictionaries(st.sampled_from("abcdl"), ch, max_size=3)),
    max_leaves=8,
)
any_docs = st.dictionaries(st.sampled_from(["_id", "a", "b", "c", "l"]), doc_values, max_size=5)


def containers(x: Any) -> set[int]:
    if isinstance(x, dict):
        return {id(x)}.union(*(containers(v) for v in x.values()))
    if isinstance(x, list):
        return {id(x)}.union(*(containers(v) for v in x))
    return set()


@PROPERTY
@given(any_docs, st.lists(proj_paths, min_size=1, max_size=3, unique=True), st.sampled_from([0, 1]))
def test_projection_properties(doc: dict, paths: list[str], flag: int) -> None:
    projection = {p: flag for p in paths}
    try:
        out = apply_projection(doc, projection)
    except QueryError:
        return  # path collisions such as a / a.b
    assert not containers(out) & containers(doc)  # a copy, not a view
    if flag:
        assert set(out) <= {p.split(".")[0] for p in paths} | {"_id"}
        if "_id" in doc:
            same_nan = out["_id"] != out["_id"] and doc["_id"] != doc["_id"]  # NaN is kept, but NaN != NaN
            assert out["_id"] == doc["_id"] or same_nan
    else:
        assert not set(out) & {p for p in paths if "." not in p}
        assert set(out) <= set(doc)


# ----------------------------------------------------------------------------- updates


def test_set_unset_inc() -> None:
    doc = {"_id": 1, "m": 0, "n": {"x": 1}}
    assert apply_update(doc, {"$set": {"a.b.c": 1}}) == {**doc, "a": {"b": {"c": 1}}}
    out = apply_update(doc, {"$set": {"z": 1, "b": 2, "m": 5}})
    assert list(out) == ["_id", "m", "n", "b", "z"] and out["m"] == 5  # new fields in path order
    assert apply_update(doc, {"$set": {"n.y": 2}})["n"] == {"x": 1, "y": 2}
    assert apply_update(doc, {"$unset": {"m": "", "n.x": 1, "nope": 1, "m2.q": 1}}) == {"_id": 1, "n": {}}
    assert apply_update(doc, {"$inc": {"m": 2, "n.x": -1.5, "new": 3}}) == {
        "_id": 1,
        "m": 2,
        "n": {"x": -0.5},
        "new": 3,
    }
    assert apply_update(doc, {"$set": {}}) == doc
    assert apply_update(doc, {"$set": {"_id": 1.0}})["_id"] == 1  # same value: allowed
    assert apply_update(doc, {"$setOnInsert": {"s": 1}}) == doc
    assert apply_update(doc, {"$setOnInsert": {"s": 1}}, is_upsert_insert=True)["s"] == 1


@pytest.mark.parametrize(
    "doc, update, message",
    [
        ({"a": "x"}, {"$inc": {"a": 1}}, "Cannot apply \\$inc to a value of non-numeric type"),
        ({"a": True}, {"$inc": {"a": 1}}, "Cannot apply \\$inc to a value of non-numeric type"),
        ({"a": None}, {"$inc": {"a": 1}}, "Cannot apply \\$inc"),
        ({}, {"$inc": {"a": "1"}}, "non-numeric argument"),
        ({}, {"$inc": {"a": True}}, "non-numeric argument"),
        ({"a": INT64_MAX}, {"$inc": {"a": 1}}, "overflows"),
        ({"a": 5}, {"$set": {"a.b": 1}}, "Cannot create field 'b'"),
        ({"a": [{"b": 1}]}, {"$set": {"a.b": 2}}, "Cannot create field 'b' in element"),
        ({"a": [1]}, {"$set": {"a.0.c": 1}}, "Cannot create field 'c' in element \\{0: 1\\}"),
        ({"a": None}, {"$set": {"a.b": 1}}, "Cannot create field 'b'"),
        ({"_id": 1}, {"$set": {"_id": 2}}, "immutable field '_id'"),
        ({"_id": 1}, {"$unset": {"_id": 1}}, "immutable field '_id'"),
        ({"_id": 1}, {"$inc": {"_id": 1}}, "immutable field '_id'"),
        ({"_id": {"x": 1}}, {"$set": {"_id.x": 2}}, "immutable field '_id'"),
        ({"_id": 1}, {"_id": 2, "a": 1}, "the \\(immutable\\) field '_id' was found to have been altered"),
        ({}, {"$set": {"a": 1}, "b": 2}, "Unknown modifier: b"),
        ({}, {"b": 2, "$set": {"a": 1}}, "The dollar \\(\\$\\) prefixed field '\\$set'"),
        ({"a": 1}, {"$push": {"a": 1}}, "The field 'a' must be an array but is of type int"),
        ({}, {"$rename": {"a": "a"}}, "must differ"),
        ({}, {"$rename": {"a": "a.b"}}, "must not be on the same path"),
        ({}, {"$rename": {"a": 5}}, "must be a string"),
        ({}, {"$mul": {"a": "x"}}, "Cannot multiply with non-numeric argument"),
        ({"a": "x"}, {"$mul": {"a": 2}}, "Cannot apply \\$mul to a value of non-numeric type"),
        ({}, {"$pop": {"a": 2}}, "\\$pop expects 1 or -1"),
        ({}, {"$pullAll": {"a": 1}}, "\\$pullAll requires an array argument"),
        ({}, {"$currentDate": {"a": "x"}}, "is not valid type for \\$currentDate"),
        ({}, {"$bit": {"a": {"nand": 1}}}, "only supports 'and', 'or', and 'xor'"),
        ({"a": 1.5}, {"$bit": {"a": {"and": 1}}}, "non-integral type"),
        ({}, {"$push": {"a": {"$each": 1}}}, "The argument to \\$each in \\$push must be an array"),
        ({}, {"$addToSet": {"a": {"$each": [1], "$slice": 1}}}, "Unrecognized clause in \\$addToSet"),
        ({}, {"$rename": {"a": "b"}, "$set": {"b": 1}}, "would create a conflict at 'b'"),
        ({}, {"$foo": {"a": 1}}, "Unknown modifier: \\$foo"),
        ({}, [{"$match": {"a": 1}}], "\\$match is not allowed to be used within an update"),
        ({}, "x", "must be an object"),
        ({}, {"$set": [("a", 1)]}, "Modifiers operate on fields but we found type array"),
        ({}, {"$set": {"a": 1}, "$inc": {"a": 1}}, "conflict at 'a'"),
        ({}, {"$set": {"a": 1, "a.b": 2}}, "Updating the path 'a.b' would create a conflict at 'a'"),
        ({}, {"$set": {"a.$": 1}}, "positional"),
        ({}, {"$set": {"": 1}}, "An empty update path is not valid"),
        ({}, {"$set": {"a..b": 1}}, "contains an empty field name"),
        ({}, {"_id": [1]}, "The '_id' value cannot be of type array"),
        ({}, {"$set": {"_id": {"$a": 1}}}, "_id fields may not contain '\\$'-prefixed fields"),
        ([], {"$set": {"a": 1}}, "documents must be objects"),
    ],
)
def test_bad_updates(doc: Any, update: Any, message: str) -> None:
    before = copy.deepcopy(doc)
    with pytest.raises(QueryError, match=message):
        apply_update(doc, update)
    assert doc == before


def test_replacement() -> None:
    doc = {"_id": 1, "a": 1}
    out = apply_update(doc, {"b": 2})
    assert out == {"_id": 1, "b": 2} and list(out) == ["_id", "b"]
    out = apply_update(doc, {"b": 2, "_id": 1})
    assert list(out) == ["_id", "b"]
    assert apply_update({"a": 1}, {"b": 2}) == {"b": 2}
    assert apply_update(doc, {"$set": {"a": {"$x": 1}}})["a"] == {"$x": 1}


def test_is_update_operator_doc() -> None:
    assert is_update_operator_doc({"$set": {"a": 1}, "$inc": {"b": 1}}) is True
    assert is_update_operator_doc({"a": 1}) is False
    assert is_update_operator_doc({}) is False  # an empty replacement, as MongoDB
    assert is_update_operator_doc([]) is False  # a pipeline: neither operators nor a replacement
    for bad in ({"a": 1, "$set": {}}, None):
        with pytest.raises(QueryError):
            is_update_operator_doc(bad)


@pytest.mark.parametrize(
    "update, code",
    [
        ({"$foo": {"a": 1}}, "FailedToParse"),
        ({"$set": 5}, "FailedToParse"),
        ({"$set": {"a.$.b.$": 1}}, "BadValue"),  # one positional $ at most
        ({"$pop": {"a": 0}}, "FailedToParse"),
        ({"$mul": {"a": "x"}}, "TypeMismatch"),
        ([{"$sort": {"a": 1}}], "InvalidOptions"),
        ({"$set": {"a.$.b.$": 1}}, "BadValue"),  # one positional $ at most
        ({"$set": {"a": 1, "a.b": 1}}, "ConflictingUpdateOperators"),
        ({"$inc": {"a": "x"}}, "TypeMismatch"),
        ({"a": 1, "$set": {"b": 1}}, "DollarPrefixedFieldName"),
        ({"_id": {"$a": 1}}, "DollarPrefixedFieldName"),
        ({"$set": {"": 1}}, "EmptyFieldName"),
    ],
)
def test_check_update_refuses_before_any_document(update: Any, code: str) -> None:
    """What MongoDB refuses of an update does not depend on a document matching."""
    with pytest.raises(QueryError) as e:
        check_update(update)
    assert e.value.code == code


def test_empty_replacement_keeps_only_the_id() -> None:
    check_update({})
    assert apply_update({"_id": 3, "a": 1}, {}) == {"_id": 3}
    assert update_stored({"_id": 3, "a": 1}, {}) == {"_id": 3}


@pytest.mark.parametrize(
    "doc, message, code",
    [
        ({"_id": [1]}, "can't use an array for _id", "BadValue"),
        ({"_id": Regex("a")}, "can't use a regex for _id", "BadValue"),
        ({"_id": {"$a": 1}}, "_id fields may not contain '\\$'-prefixed fields: \\$a", "DollarPrefixedFieldName"),
        ({"_id": {"a": {"$b": 1}}}, "\\$b is not valid for storage", "DollarPrefixedFieldName"),
    ],
)
def test_insert_refuses_an_invalid_id(doc: Any, message: str, code: str) -> None:
    with pytest.raises(QueryError, match=message) as e:
        check_insert_document(doc)
    assert e.value.code == code


def test_insert_takes_dollar_fields_outside_the_id() -> None:
    for doc in ({"_id": 1, "$a": 1}, {"_id": {"a.b": 1}}, {"a": {"_id": [1]}}, {"_id": 1, "a": {"$b": 1}}):
        check_insert_document(doc)


def test_filter_codes() -> None:
    for flt, code in (
        ({"a": {"$foo": 1}}, "BadValue"),
        ({"$foo": 1}, "BadValue"),
        ({"a": {"$near": [0, 0]}}, "QueryFeatureNotAllowed"),
        ({"$where": "1"}, "QueryFeatureNotAllowed"),
        ({"a": {"$regex": "x", "$options": "q"}}, "Location51108"),
        ({"$expr": {"$nope": 1}}, "InvalidPipelineOperator"),
    ):
        with pytest.raises(QueryError) as e:
            compile_filter(flt)
        assert e.value.code == code, flt


def test_comment_and_constant_filters() -> None:
    assert compile_filter({"$comment": "why", "a": 1}).matches({"a": 1})
    assert compile_filter({"$alwaysTrue": 1}).matches({})
    assert not compile_filter({"$alwaysFalse": 1}).matches({})
    assert compile_filter({"$or": [{"$alwaysFalse": 1}, {"a": 1}]}).matches({"a": 1})


def test_upsert_document() -> None:
    query = {
        "_id": 7,
        "a.b": 2,
        "c": {"$gt": 5},
        "d": {"$eq": 4},
        "$and": [{"e": 3}, {"$and": [{"f": {"x": 1}}]}],
        "$or": [{"g": 1}],
        "$nor": [{"h": 1}],
    }
    out = upsert_document(query, {"$set": {"z": 1}, "$inc": {"n": 2}, "$setOnInsert": {"s": 0}})
    assert out == {"_id": 7, "a": {"b": 2}, "d": 4, "e": 3, "f": {"x": 1}, "n": 2, "s": 0, "z": 1}
    assert list(out)[0] == "_id"
    assert upsert_document({"_id": 7, "a": 1}, {"b": 2}) == {"_id": 7, "b": 2}  # replacement
    assert upsert_document({"a": 1}, {"b": 2}) == {"b": 2}
    assert upsert_document({"a": 1}, {"$set": {"a": 2}}) == {"a": 2}
    assert list(upsert_document({"x": 1}, {"$set": {"_id": 3}})) == ["_id", "x"]
    assert upsert_document({"a": {"$in": [1]}}, {"$set": {"b": 1}}) == {"b": 1}
    with pytest.raises(QueryError, match="immutable"):
        upsert_document({"_id": 1}, {"$set": {"_id": 2}})
    with pytest.raises(QueryError, match="altered"):
        upsert_document({"_id": 1}, {"_id": 2, "x": 1})
    with pytest.raises(QueryError, match="both matched by equality"):
        upsert_document({"a": 1, "a.b": 2}, {"$set": {"x": 1}})
    with pytest.raises(QueryError, match="both matched by equality"):
        upsert_document({"a": 1, "$and": [{"a": 1}]}, {"$set": {"x": 1}})
    with pytest.raises(QueryError, match="unknown operator: \\$foo"):
        upsert_document({"a": {"$foo": 1}}, {"$set": {"x": 1}})


def test_upsert_insert_with_a_generated_id() -> None:
    gen = {"_id": "generated"}
    out = apply_update(gen, {"$set": {"x": 1}}, is_upsert_insert=True, query={"a": 1})
    assert out == {"_id": "generated", "a": 1, "x": 1} and list(out)[0] == "_id"
    out = apply_update(gen, {"$set": {"x": 1}}, is_upsert_insert=True, query={"_id": 5})
    assert out == {"_id": 5, "x": 1}  # the query's _id wins
    out = apply_update(gen, {"y": 1}, is_upsert_insert=True, query={"a": 1})
    assert out == {"_id": "generated", "y": 1}
    assert apply_update({"a": 1}, {"$set": {"b": 1}}, query={"c": 1}) == {"a": 1, "b": 1}  # ignored


update_paths = st.sampled_from(["_id", "a", "b", "a.b", "c.d", "l"])
updates = st.one_of(
    st.dictionaries(
        st.sampled_from(["$set", "$unset", "$inc", "$setOnInsert"]),
        st.dictionaries(update_paths, st.one_of(doc_values, st.integers(-5, 5)), max_size=3),
        min_size=1,
        max_size=3,
    ),
    st.dictionaries(st.sampled_from(["_id", "a", "x"]), doc_values, min_size=1, max_size=3),
)


@PROPERTY
@given(any_docs, updates, st.booleans())
def test_apply_update_never_mutates_its_inputs(doc: dict, update: dict, upsert: bool) -> None:
    doc_before, update_before = repr(doc), repr(update)
    try:
        out = apply_update(doc, update, is_upsert_insert=upsert)
    except QueryError:
        out = None
    assert repr(doc) == doc_before and repr(update) == update_before
    if out is not None:
        assert not containers(out) & (containers(doc) | containers(update))
        if "_id" in doc:
            assert compare_values(out["_id"], doc["_id"]) == 0


numbers = st.one_of(st.integers(-(2**40), 2**40), st.integers(-(2**40), 2**40).map(float))


@PROPERTY
@given(any_docs, st.sampled_from(["n", "a.n"]), numbers, numbers)
def test_inc_then_negative_inc_restores(doc: dict, path: str, start: int | float, by: int | float) -> None:
    doc = {**doc, "a": {"n": start}, "n": start}
    once = apply_update(doc, {"$inc": {path: by}})
    assert get_path(once, path) == start + by
    back = apply_update(once, {"$inc": {path: -by}})
    assert get_path(back, path) == start
    # int or double as the sum is; an int that left the int32 range stays an Int64 (MongoDB's widening)
    assert isinstance(get_path(back, path), float) is isinstance(start + by, float)
    assert back == doc


# ---- update_stored: copy-on-write, comparing only the written fields ----------------------------

_STORED = {"_id": 1, "a": {"b": 1, "c": [1, {"d": 2}]}, "t": True, "n": 1, "s": "x", "e": {}}


@pytest.mark.parametrize(
    "update",
    [
        {"$set": {"s": "x"}},  # the same value: no change
        {"$set": {"s": "y"}},
        {"$set": {"t": 1}},  # true is not 1
        {"$set": {"n": 1.0}},  # 1 and 1.0 are the same number
        {"$set": {"a.b": 1}},
        {"$set": {"a.b": 2, "z": None}},
        {"$set": {"a.x.y": 3}},  # intermediate objects created
        {"$set": {"e.k": 1}},
        {"$unset": {"missing": ""}},
        {"$unset": {"a.missing": ""}},
        {"$unset": {"a.b": ""}},
        {"$inc": {"n": 0}},
        {"$inc": {"n": 2, "m": 1}},
        {"$setOnInsert": {"q": 1}},  # not an upsert's insert: nothing
        {"_id": 1, "s": "x"},  # a replacement
        {"s": "x", "t": True, "n": 1, "a": {"b": 1, "c": [1, {"d": 2}]}, "e": {}},  # the same, as a replacement
    ],
)
def test_update_stored_is_apply_update_and_a_whole_document_comparison(update):
    stored = copy.deepcopy(_STORED)
    expected = apply_update(stored, update)
    changed = encode_value(expected) != encode_value(stored)
    new = update_stored(stored, update)
    assert stored == _STORED, "the stored document is not mutated"
    if changed:
        assert new is not None and encode_value(new) == encode_value(expected)
        assert list(new) == list(expected), "fields keep their order"
    else:
        assert new is None


def test_update_stored_copies_only_what_it_edits_and_never_the_stored_objects():
    stored = copy.deepcopy(_STORED)
    new = update_stored(stored, {"$set": {"a.b": 5}, "$inc": {"n": 1}})
    assert new is not None
    assert new["a"] is not stored["a"] and stored["a"]["b"] == 1 and new["a"]["b"] == 5
    assert new["a"]["c"] is stored["a"]["c"], "an object the update does not edit is shared"
    assert new["e"] is stored["e"]
    # Two edits below one object copy it once, and both land in the copy.
    both = update_stored(stored, {"$set": {"a.b": 7, "a.z": 8}})
    assert both is not None and both["a"]["b"] == 7 and both["a"]["z"] == 8 and "z" not in stored["a"]


def test_update_stored_refuses_what_apply_update_refuses():
    with pytest.raises(QueryError):
        update_stored(copy.deepcopy(_STORED), {"$set": {"_id": 2}})
    with pytest.raises(QueryError):
        update_stored(copy.deepcopy(_STORED), {"$set": {"a.c.x": 1}})  # through an array
    with pytest.raises(QueryError):
        update_stored(copy.deepcopy(_STORED), {"$inc": {"s": 1}})


def test_updates_through_array_positions() -> None:
    """A position in an update path indexes the array (MongoDB), padding with nulls."""
    doc = {"_id": 1, "a": [{"b": 1}, {"b": 2}], "n": [1, 2]}
    assert apply_update(doc, {"$set": {"a.1.b": 5}})["a"] == [{"b": 1}, {"b": 5}]
    assert apply_update(doc, {"$inc": {"n.0": 10}})["n"] == [11, 2]
    assert apply_update(doc, {"$set": {"n.4": 7}})["n"] == [1, 2, None, None, 7]
    assert apply_update(doc, {"$unset": {"n.0": 1}})["n"] == [None, 2]
    assert apply_update(doc, {"$unset": {"a.0.b": 1}})["a"] == [{}, {"b": 2}]
    assert apply_update(doc, {"$set": {"a.3.c": 1}})["a"] == [{"b": 1}, {"b": 2}, None, {"c": 1}]
    assert apply_update({"o": {}}, {"$set": {"o.1": 1}})["o"] == {"1": 1}  # a number names an object's field
    # copy-on-write leaves the stored document alone and sees the change
    new = update_stored(doc, {"$set": {"a.0.b": 9}})
    assert new is not None and new["a"][0] == {"b": 9} and doc["a"][0] == {"b": 1}
    assert update_stored(doc, {"$set": {"a.0.b": 1}}) is None  # the same value: nothing modified
    assert update_stored(doc, {"$unset": {"n.5": 1}}) is None


def test_update_fields_apply_in_mongodb_order() -> None:
    """Components compare numerically when both are numbers (MongoDB 5.0+), else as strings."""
    out = apply_update({"o": {}}, {"$set": {"o.10": 1, "o.9": 1, "o.b": 1, "o.a": 1}})
    assert list(out["o"]) == ["9", "10", "a", "b"]


def test_a_position_in_a_filter_also_names_a_subdocument_field() -> None:
    assert matches({"a.0": 5}, {"a": [5, 6]})
    assert matches({"a.0": 5}, {"a": [{"0": 5}]})  # MongoDB reads both
    assert matches({"a.1.b": 2}, {"a": [{"b": 1}, {"b": 2}]})
    assert not matches({"a.1.b": 1}, {"a": [{"b": 1}, {"b": 2}]})
    assert matches({"a.3": None}, {"a": [1]}) and not matches({"a.3": {"$exists": True}}, {"a": [1]})


# ---------------------------------------------------------------- the other query operators
# Expected answers from MongoDB's documentation of each operator (the query operators pages).


@pytest.mark.parametrize(
    ("flt", "doc", "expected"),
    [
        # $regex: strings (and elements of arrays), options, implicit form, $in and $not
        ({"s": {"$regex": "^ab"}}, {"s": "abc"}, True),
        ({"s": {"$regex": "^AB"}}, {"s": "abc"}, False),
        ({"s": {"$regex": "^AB", "$options": "i"}}, {"s": "abc"}, True),
        ({"s": {"$regex": Regex("^AB", "i")}}, {"s": "abc"}, True),
        ({"s": Regex("b")}, {"s": ["x", "abc"]}, True),
        ({"s": Regex("b")}, {"s": 5}, False),
        ({"s": {"$regex": "^b$", "$options": "m"}}, {"s": "a\nb"}, True),
        ({"s": {"$in": [Regex("^z"), 5]}}, {"s": 5}, True),
        ({"s": {"$in": [Regex("^z"), 5]}}, {"s": "zed"}, True),
        ({"s": {"$nin": [Regex("^z")]}}, {"s": "zed"}, False),
        ({"s": {"$not": Regex("^z")}}, {"s": "abc"}, True),
        ({"s": {"$not": Regex("^z")}}, {}, True),
        ({"s": Regex("x")}, {"s": Regex("x")}, True),  # a stored regex equal to the pattern
        # $type: aliases, numbers, "number", arrays of types, arrays and their elements
        ({"v": {"$type": "string"}}, {"v": "x"}, True),
        ({"v": {"$type": 2}}, {"v": "x"}, True),
        ({"v": {"$type": "int"}}, {"v": 5}, True),
        ({"v": {"$type": "long"}}, {"v": Int64(5)}, True),
        ({"v": {"$type": "long"}}, {"v": 5}, False),
        ({"v": {"$type": "number"}}, {"v": 5.5}, True),
        ({"v": {"$type": ["bool", "null"]}}, {"v": None}, True),
        ({"v": {"$type": "null"}}, {}, False),  # missing is no type
        ({"v": {"$type": "array"}}, {"v": [1]}, True),
        ({"v": {"$type": "string"}}, {"v": [1, "x"]}, True),
        ({"v": {"$type": "object"}}, {"v": {"a": 1}}, True),
        # $size: the array itself, not its elements
        ({"a": {"$size": 2}}, {"a": [1, 2]}, True),
        ({"a": {"$size": 1}}, {"a": [[1, 2]]}, True),
        ({"a": {"$size": 2}}, {"a": [[1, 2]]}, False),
        ({"a": {"$size": 0}}, {"a": []}, True),
        ({"a": {"$size": 0}}, {}, False),
        ({"a.b": {"$size": 2}}, {"a": [{"b": [1]}, {"b": [1, 2]}]}, True),
        ({"a": {"$not": {"$size": 2}}}, {"a": 5}, True),
        # $all: equality to each value, elements or the whole array
        ({"a": {"$all": [1, 2]}}, {"a": [2, 3, 1]}, True),
        ({"a": {"$all": [1, 4]}}, {"a": [2, 3, 1]}, False),
        ({"a": {"$all": [5]}}, {"a": 5}, True),
        ({"a": {"$all": []}}, {"a": [1]}, False),
        ({"a": {"$all": [[1, 2]]}}, {"a": [[1, 2], 3]}, True),
        ({"a": {"$all": [Regex("^x"), "y"]}}, {"a": ["xa", "y"]}, True),
        ({"a": {"$all": [{"$elemMatch": {"b": 1}}, {"$elemMatch": {"c": 2}}]}}, {"a": [{"b": 1}, {"c": 2}]}, True),
        # $elemMatch: objects, values, nested
        ({"a": {"$elemMatch": {"b": 1, "c": 2}}}, {"a": [{"b": 1, "c": 2}]}, True),
        ({"a": {"$elemMatch": {"b": 1, "c": 2}}}, {"a": [{"b": 1}, {"c": 2}]}, False),
        ({"a": {"$elemMatch": {"$gte": 80, "$lt": 85}}}, {"a": [70, 82, 90]}, True),
        ({"a": {"$elemMatch": {"$gte": 80, "$lt": 85}}}, {"a": [70, 90]}, False),
        ({"a": {"$gte": 80, "$lt": 85}}, {"a": [70, 90]}, True),  # without $elemMatch: any elements
        ({"a": {"$elemMatch": {"$gt": 1}}}, {"a": 5}, False),  # not an array
        ({"a": {"$elemMatch": {"$or": [{"b": 1}, {"c": 1}]}}}, {"a": [{"c": 1}]}, True),
        ({"a": {"$elemMatch": {"$elemMatch": {"$gt": 5}}}}, {"a": [[1], [6]]}, True),
        ({"a": {"$elemMatch": {"$regex": "^q"}}}, {"a": ["x", "qq"]}, True),
        # $mod: truncating numbers, the dividend's sign
        ({"n": {"$mod": [4, 0]}}, {"n": 8}, True),
        ({"n": {"$mod": [4, 1]}}, {"n": 9.7}, True),
        ({"n": {"$mod": [4, -1]}}, {"n": -5}, True),
        ({"n": {"$mod": [4, 3]}}, {"n": -5}, False),
        ({"n": {"$mod": [4, 0]}}, {"n": "8"}, False),
        ({"n": {"$mod": [4, 0]}}, {"n": float("nan")}, False),
        ({"n": {"$mod": [2, 1]}}, {"n": [2, 3]}, True),
        # bitwise: positions, masks, negatives (two's complement), binary data
        ({"b": {"$bitsAllSet": [1, 5]}}, {"b": 54}, True),
        ({"b": {"$bitsAllSet": 35}}, {"b": 54}, False),
        ({"b": {"$bitsAnySet": [0, 1]}}, {"b": 2}, True),
        ({"b": {"$bitsAllClear": [0, 3]}}, {"b": 6}, True),
        ({"b": {"$bitsAnyClear": [1, 2]}}, {"b": 6}, False),
        ({"b": {"$bitsAllSet": [63, 100]}}, {"b": -1}, True),
        ({"b": {"$bitsAllSet": [0]}}, {"b": 1.5}, False),
        ({"b": {"$bitsAllSet": [0, 9]}}, {"b": b"\x01\x02"}, True),
        # $expr with aggregation expressions
        ({"$expr": {"$gt": ["$a", "$b"]}}, {"a": 5, "b": 3}, True),
        ({"$expr": {"$gt": ["$a", "$b"]}}, {"a": 1, "b": 3}, False),
        ({"$expr": {"$eq": [{"$add": ["$a", 1]}, 6]}}, {"a": 5}, True),
        ({"$expr": "$flag"}, {"flag": 0}, False),
        ({"$expr": "$flag"}, {"flag": "yes"}, True),
    ],
)
def test_query_operators(flt: dict, doc: dict, expected: bool) -> None:
    assert matches(flt, doc) is expected, (flt, doc)


# ---------------------------------------------------------------- the other update operators
# Expected documents from MongoDB's documentation of each operator (the update operators pages).


@pytest.mark.parametrize(
    ("doc", "update", "expected"),
    [
        ({"_id": 1, "p": 10}, {"$mul": {"p": 2}}, {"_id": 1, "p": 20}),
        ({"_id": 1, "p": 10}, {"$mul": {"p": 1.5}}, {"_id": 1, "p": 15.0}),
        ({"_id": 1}, {"$mul": {"p": 3}}, {"_id": 1, "p": 0}),
        ({"_id": 1, "p": 2**31 - 1}, {"$mul": {"p": 2}}, {"_id": 1, "p": Int64(2**32 - 2)}),
        ({"_id": 1, "lo": 5}, {"$min": {"lo": 3}}, {"_id": 1, "lo": 3}),
        ({"_id": 1, "lo": 5}, {"$min": {"lo": 8}}, {"_id": 1, "lo": 5}),
        ({"_id": 1, "hi": 5}, {"$max": {"hi": 8}}, {"_id": 1, "hi": 8}),
        ({"_id": 1, "hi": 5}, {"$max": {"hi": "x"}}, {"_id": 1, "hi": "x"}),  # strings sort above numbers
        ({"_id": 1}, {"$max": {"hi": 1}}, {"_id": 1, "hi": 1}),
        ({"_id": 1, "a": 1, "b": 2}, {"$rename": {"a": "c"}}, {"_id": 1, "b": 2, "c": 1}),
        ({"_id": 1, "a": {"x": 1}}, {"$rename": {"a.x": "y.z"}}, {"_id": 1, "a": {}, "y": {"z": 1}}),
        ({"_id": 1, "b": 2}, {"$rename": {"a": "c"}}, {"_id": 1, "b": 2}),  # nothing to rename
        ({"_id": 1, "a": [1]}, {"$push": {"a": 2}}, {"_id": 1, "a": [1, 2]}),
        ({"_id": 1}, {"$push": {"a": 2}}, {"_id": 1, "a": [2]}),
        ({"_id": 1, "a": [1]}, {"$push": {"a": [2, 3]}}, {"_id": 1, "a": [1, [2, 3]]}),
        ({"_id": 1, "a": [1]}, {"$push": {"a": {"$each": [2, 3]}}}, {"_id": 1, "a": [1, 2, 3]}),
        ({"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [9], "$position": 1}}}, {"_id": 1, "a": [1, 9, 2]}),
        ({"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [9], "$position": -1}}}, {"_id": 1, "a": [1, 9, 2]}),
        ({"_id": 1, "a": [5, 1]}, {"$push": {"a": {"$each": [3], "$sort": 1}}}, {"_id": 1, "a": [1, 3, 5]}),
        ({"_id": 1, "a": [5, 1]}, {"$push": {"a": {"$each": [3], "$sort": -1, "$slice": 2}}}, {"_id": 1, "a": [5, 3]}),
        ({"_id": 1, "a": [1, 2, 3]}, {"$push": {"a": {"$each": [4], "$slice": -2}}}, {"_id": 1, "a": [3, 4]}),
        ({"_id": 1, "a": [1]}, {"$push": {"a": {"$each": [], "$slice": 0}}}, {"_id": 1, "a": []}),
        (
            {"_id": 1, "q": [{"s": 7}, {"s": 3}]},
            {"$push": {"q": {"$each": [{"s": 5}], "$sort": {"s": 1}}}},
            {"_id": 1, "q": [{"s": 3}, {"s": 5}, {"s": 7}]},
        ),
        ({"_id": 1, "a": [1, 2]}, {"$addToSet": {"a": 2}}, {"_id": 1, "a": [1, 2]}),
        ({"_id": 1, "a": [1, 2]}, {"$addToSet": {"a": 2.0}}, {"_id": 1, "a": [1, 2]}),  # 2 == 2.0
        ({"_id": 1, "a": [1]}, {"$addToSet": {"a": {"$each": [1, 3, 3]}}}, {"_id": 1, "a": [1, 3]}),
        ({"_id": 1, "a": [1, 2, 3]}, {"$pop": {"a": 1}}, {"_id": 1, "a": [1, 2]}),
        ({"_id": 1, "a": [1, 2, 3]}, {"$pop": {"a": -1}}, {"_id": 1, "a": [2, 3]}),
        ({"_id": 1}, {"$pop": {"a": 1}}, {"_id": 1}),
        ({"_id": 1, "a": [1, 5, 6, 1]}, {"$pull": {"a": 1}}, {"_id": 1, "a": [5, 6]}),
        ({"_id": 1, "a": [1, 5, 6]}, {"$pull": {"a": {"$gte": 5}}}, {"_id": 1, "a": [1]}),
        ({"_id": 1, "a": ["x", "yz"]}, {"$pull": {"a": Regex("^y")}}, {"_id": 1, "a": ["x"]}),
        (
            {"_id": 1, "r": [{"i": "A", "s": 5}, {"i": "B", "s": 8}, {"i": "B", "s": 9}]},
            {"$pull": {"r": {"s": 8, "i": "B"}}},
            {"_id": 1, "r": [{"i": "A", "s": 5}, {"i": "B", "s": 9}]},
        ),
        ({"_id": 1, "r": [{"s": 5, "x": 1}, {"s": 9}]}, {"$pull": {"r": {"s": 5}}}, {"_id": 1, "r": [{"s": 9}]}),
        ({"_id": 1, "a": [0, 2, 5, 5, 1]}, {"$pullAll": {"a": [0, 5]}}, {"_id": 1, "a": [2, 1]}),
        ({"_id": 1, "e": 13}, {"$bit": {"e": {"and": 10}}}, {"_id": 1, "e": 8}),
        ({"_id": 1, "e": 3}, {"$bit": {"e": {"or": 5}}}, {"_id": 1, "e": 7}),
        ({"_id": 1, "e": 1}, {"$bit": {"e": {"xor": 5}}}, {"_id": 1, "e": 4}),
        ({"_id": 1, "e": Int64(1)}, {"$bit": {"e": {"or": 2}}}, {"_id": 1, "e": Int64(3)}),
    ],
)
def test_update_operators(doc: dict, update: dict, expected: dict) -> None:
    before = copy.deepcopy(doc)
    out = apply_update(doc, update)
    assert out == expected and [type(v) for v in out.values()] == [type(v) for v in expected.values()]
    assert doc == before
    stored = update_stored(doc, update)  # the copy-on-write path agrees, and says when nothing changed
    assert (stored if stored is not None else doc) == expected
    assert (stored is None) == (encode_value(expected) == encode_value(doc))
    assert doc == before


def test_current_date() -> None:
    import datetime as dt

    out = apply_update({"_id": 1}, {"$currentDate": {"d": True, "t": {"$type": "timestamp"}, "e": {"$type": "date"}}})
    assert isinstance(out["d"], dt.datetime) and isinstance(out["e"], dt.datetime)
    assert abs(out["d"] - dt.datetime.now(dt.UTC).replace(tzinfo=None)) < dt.timedelta(seconds=60)
    assert out["d"].microsecond % 1000 == 0
    from bson import Timestamp

    assert isinstance(out["t"], Timestamp)


@pytest.mark.parametrize(
    ("projection", "expected"),
    [
        ({"a": {"$slice": 2}}, {"_id": 1, "a": [1, 2], "b": "x", "q": [{"s": 1, "t": 1}, {"s": 2, "t": 0}]}),
        ({"a": {"$slice": -1}, "b": 0}, {"_id": 1, "a": [4], "q": [{"s": 1, "t": 1}, {"s": 2, "t": 0}]}),
        ({"a": {"$slice": [1, 2]}, "_id": 0, "b": 1}, {"a": [2, 3], "b": "x"}),
        ({"a": {"$slice": [-2, 5]}, "b": 1}, {"_id": 1, "a": [3, 4], "b": "x"}),
        ({"b": {"$slice": 1}, "_id": 0, "x": 1}, {"b": "x"}),  # not an array: as it is
        ({"q": {"$elemMatch": {"t": 0}}}, {"_id": 1, "q": [{"s": 2, "t": 0}]}),
        ({"q": {"$elemMatch": {"t": 5}}}, {"_id": 1}),
        ({"a": {"$elemMatch": {"$gt": 2}}, "b": 1}, {"_id": 1, "a": [3], "b": "x"}),
    ],
)
def test_projection_operators(projection: dict, expected: dict) -> None:
    doc = {"_id": 1, "a": [1, 2, 3, 4], "b": "x", "q": [{"s": 1, "t": 1}, {"s": 2, "t": 0}]}
    assert apply_projection(doc, projection) == expected


def test_bad_projection_operators() -> None:
    for projection, message in (
        ({"a": {"$slice": "x"}}, "only supports numbers and \\[skip, limit\\]"),
        ({"a": {"$slice": [1, 0]}}, "limit must be positive"),
        ({"a.b": {"$elemMatch": {"x": 1}}}, "nested field"),
        ({"a": {"$meta": "textScore"}}, "not supported"),
    ):
        with pytest.raises(QueryError, match=message):
            apply_projection({}, projection)


# ---------------------------------------------------------------- pipeline-style updates


@pytest.mark.parametrize(
    ("doc", "pipeline", "expected"),
    [
        ({"_id": 1, "a": 1}, [{"$set": {"b": {"$add": ["$a", 1]}}}], {"_id": 1, "a": 1, "b": 2}),
        ({"_id": 1, "a": 1, "b": 2}, [{"$unset": "b"}], {"_id": 1, "a": 1}),
        ({"_id": 1, "a": 1, "b": 2}, [{"$project": {"b": 1}}], {"_id": 1, "b": 2}),
        ({"_id": 1, "a": {"x": 5}}, [{"$replaceRoot": {"newRoot": "$a"}}], {"_id": 1, "x": 5}),  # _id kept
        ({"_id": 1, "a": 1}, [{"$replaceWith": {"_id": 1, "z": "$a"}}], {"_id": 1, "z": 1}),
        ({"_id": 1, "a": 1}, [{"$addFields": {"a": "$$ROOT._id"}}, {"$set": {"c": "$a"}}], {"_id": 1, "a": 1, "c": 1}),
        ({"_id": 1, "a": 1}, [], {"_id": 1, "a": 1}),
    ],
)
def test_pipeline_updates(doc: dict, pipeline: list, expected: dict) -> None:
    check_update(pipeline)
    assert apply_update(doc, pipeline) == expected
    stored = update_stored(doc, pipeline)
    assert (stored if stored is not None else doc) == expected


def test_pipeline_update_refusals_and_upserts() -> None:
    with pytest.raises(QueryError) as e:
        check_update([{"$group": {"_id": 1}}])
    assert e.value.code == "InvalidOptions" and "not allowed to be used within an update" in str(e.value)
    with pytest.raises(QueryError) as e:
        check_update([{"$set": {"a": {"$nope": 1}}}])
    assert e.value.code == "InvalidPipelineOperator"
    with pytest.raises(QueryError) as e:
        apply_update({"_id": 1}, [{"$set": {"_id": 2}}])
    assert e.value.code == "ImmutableField"
    # an upsert starts from the query's equality fields, as an operator update's does
    assert upsert_document({"_id": 3, "k": "x"}, [{"$set": {"n": 1}}]) == {"_id": 3, "k": "x", "n": 1}


# ---------------------------------------------------------------- $[] and $[<identifier>]


@pytest.mark.parametrize(
    ("doc", "update", "filters", "expected"),
    [
        ({"_id": 1, "a": [1, 2, 3]}, {"$inc": {"a.$[]": 10}}, None, {"_id": 1, "a": [11, 12, 13]}),
        ({"_id": 1, "a": [1, 5, 9]}, {"$set": {"a.$[big]": 0}}, [{"big": {"$gte": 5}}], {"_id": 1, "a": [1, 0, 0]}),
        (
            {"_id": 1, "g": [{"s": 80, "k": 1}, {"s": 95, "k": 2}]},
            {"$set": {"g.$[e].top": True}},
            [{"e.s": {"$gte": 90}}],
            {"_id": 1, "g": [{"s": 80, "k": 1}, {"s": 95, "k": 2, "top": True}]},
        ),
        (
            {"_id": 1, "m": [{"r": [1, 7]}, {"r": [8]}]},
            {"$mul": {"m.$[].r.$[x]": 2}},
            [{"x": {"$gt": 5}}],
            {"_id": 1, "m": [{"r": [1, 14]}, {"r": [16]}]},
        ),
        ({"_id": 1, "a": []}, {"$set": {"a.$[]": 1}}, None, {"_id": 1, "a": []}),
        ({"_id": 1, "a": [{"b": 1}]}, {"$unset": {"a.$[].b": 1}}, None, {"_id": 1, "a": [{}]}),
    ],
)
def test_all_and_filtered_positional_updates(doc: dict, update: dict, filters: Any, expected: dict) -> None:
    check_update(update, filters)
    assert apply_update(doc, update, array_filters=filters) == expected
    stored = update_stored(doc, update, filters)
    assert (stored if stored is not None else doc) == expected


@pytest.mark.parametrize(
    ("doc", "update", "filters", "message", "code"),
    [
        ({}, {"$set": {"a.$[x]": 1}}, None, "No array filter found for identifier 'x'", "BadValue"),
        ({}, {"$set": {"a": 1}}, [{"x": 1}], "The array filter for identifier 'x' was not used", "FailedToParse"),
        ({}, {"$set": {"a.$[x]": 1}}, [{"x": 1}, {"x": 2}], "multiple array filters", "FailedToParse"),
        ({}, {"$set": {"a.$[x]": 1}}, [{"x": 1, "y": 2}], "Expected a single top-level field name", "FailedToParse"),
        ({}, {"$set": {"a.$[X]": 1}}, [{"X": 1}], "beginning with a lowercase letter", "BadValue"),
        ({}, {"a": 1}, [{"x": 1}], "only be specified with an update operator", "FailedToParse"),
        ({}, {"$set": {"a.$": 1}}, None, "did not find the match needed", "BadValue"),
        ({"_id": 1}, {"$set": {"a.$[]": 1}}, None, "must exist in the document", "BadValue"),
        (
            {"_id": 1, "a": 5},
            {"$set": {"a.$[]": 1}},
            None,
            "Cannot apply array updates to non-array element",
            "BadValue",
        ),
    ],
)
def test_positional_refusals(doc: dict, update: dict, filters: Any, message: str, code: str) -> None:
    with pytest.raises(QueryError, match=message) as e:
        check_update(update, filters)
        apply_update(doc, update, array_filters=filters)
    assert e.value.code == code


# ---------------------------------------------------------------- the positional $


@pytest.mark.parametrize(
    ("doc", "query", "update", "expected"),
    [
        ({"_id": 1, "g": [85, 80, 80]}, {"g": 80}, {"$set": {"g.$": 82}}, {"_id": 1, "g": [85, 82, 80]}),
        (
            {"_id": 1, "g": [{"s": 80, "m": 1}, {"s": 85, "m": 2}]},
            {"g.s": 85},
            {"$set": {"g.$.m": 9}},
            {"_id": 1, "g": [{"s": 80, "m": 1}, {"s": 85, "m": 9}]},
        ),
        (
            {"_id": 1, "g": [{"s": 80, "m": 1}, {"s": 90, "m": 2}]},
            {"g": {"$elemMatch": {"s": {"$gte": 85}, "m": {"$gt": 1}}}},
            {"$inc": {"g.$.s": 1}},
            {"_id": 1, "g": [{"s": 80, "m": 1}, {"s": 91, "m": 2}]},
        ),
        (
            {"_id": 1, "a": {"g": [1, 2]}},
            {"_id": 1, "a.g": 2},
            {"$unset": {"a.g.$": 1}},
            {"_id": 1, "a": {"g": [1, None]}},
        ),
        ({"_id": 1, "g": [3, 5, 11]}, {"g": {"$gte": 4, "$lt": 9}}, {"$set": {"g.$": 0}}, {"_id": 1, "g": [3, 0, 11]}),
    ],
)
def test_the_positional_operator(doc: dict, query: dict, update: dict, expected: dict) -> None:
    assert compile_filter(query).matches(doc)
    assert apply_update(doc, update, match_filter=query) == expected
    stored = update_stored(doc, update, None, query)
    assert (stored if stored is not None else doc) == expected


def test_the_positional_operator_refusals() -> None:
    doc = {"_id": 1, "g": [{"x": 1, "y": 0}, {"x": 0, "y": 1}], "n": 5}
    for query, update, message, code in (
        ({"n": 5}, {"$set": {"g.$": 1}}, "did not find the match needed", "BadValue"),  # no condition on g
        ({"g.x": 1, "g.y": 1}, {"$set": {"g.$.z": 1}}, "match different elements", "QueryFeatureNotAllowed"),
        ({"g.x": 1}, {"$set": {"g.$.a.$": 1}}, "Too many positional", "BadValue"),
        ({"g.x": 1}, {"$set": {"$.a": 1}}, "first component", "BadValue"),
    ):
        with pytest.raises(QueryError, match=message) as e:
            apply_update(doc, update, match_filter=query)
        assert e.value.code == code
    with pytest.raises(QueryError, match="did not find the match needed"):  # an upsert has no element
        upsert_document({"g": 1}, {"$set": {"g.$": 2}})


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        (r"^\d+$", "12", True),
        (r"^\d+$", "\u0661\u0662", False),  # Arabic-Indic digits: not \d to PCRE (no UCP), unlike Python
        (r"^\w+$", "caf\u00e9", False),
        (r"^[\w]+$", "abc_1", True),
        (r"\bfoo\b", "a foo b", True),
        (r"\b\u00e9", "x\u00e9", True),  # \u00e9 is no word character to PCRE: a boundary before it
        (r"abc\Z", "abc\n", True),  # PCRE's \Z: also before a final newline
        (r"abc\z", "abc\n", False),
        (r"^\s$", "\u00a0", False),
        (r"(?i)^CAF\u00c9$", "caf\u00e9", True),  # caseless matching is Unicode in both
        (r"[]x]", "]", True),
    ],
)
def test_regular_expressions_match_as_pcre(pattern: str, text: str, expected: bool) -> None:
    assert compile_filter({"s": Regex(pattern)}).matches({"s": text}) is expected


def test_pcre_escapes_python_reads_otherwise_are_refused() -> None:
    for pattern in (r"\p{L}", r"\h", r"\v", r"[\D]", r"\R"):
        with pytest.raises(QueryError) as e:
            compile_filter({"s": Regex(pattern)})
        assert e.value.code == "Location51091", pattern
