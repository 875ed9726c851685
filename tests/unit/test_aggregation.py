"""domain.aggregation: pipeline parsing (MongoDB's codes), stages, expressions, accumulators,
and the split between the shards' find and the router's merge.

Concrete cases follow MongoDB's documentation of each stage and operator; the property test
checks that splitting never changes a result: the shard part run as the router runs a find
(each shard sorts and limits its own documents, the router merges, skips and limits), then
the merge part, equals the whole pipeline over the same documents in the same natural order."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.aggregation import PipelineError, ShardPart, parse, run, split
from domain.query import apply_projection, compile_filter, merge_sorted, sort_key

PROPERTY = settings(max_examples=300, deadline=None)


def agg(pipeline: list[dict[str, Any]], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return run(parse(pipeline), docs)


def code_of(pipeline: Any, docs: list[dict[str, Any]] | None = None) -> int:
    with pytest.raises(PipelineError) as e:
        run(parse(pipeline), docs or [{"_id": 1, "a": 1, "s": "x", "arr": [1]}])
    return e.value.code


SALES = [
    {"_id": 1, "item": "abc", "price": 10, "qty": 2, "tags": ["a", "b"]},
    {"_id": 2, "item": "jkl", "price": 20, "qty": 1, "tags": []},
    {"_id": 3, "item": "xyz", "price": 5, "qty": 10, "tags": ["c"]},
    {"_id": 4, "item": "xyz", "price": 5, "qty": 20},
    {"_id": 5, "item": "abc", "price": 10, "qty": 10, "tags": None},
]


# ------------------------------------------------------------------------------ stages


def test_group_accumulators():
    out = agg(
        [
            {
                "$group": {
                    "_id": "$item",
                    "total": {"$sum": {"$multiply": ["$price", "$qty"]}},
                    "n": {"$sum": 1},
                    "c": {"$count": {}},
                    "avg": {"$avg": "$qty"},
                    "lo": {"$min": "$qty"},
                    "hi": {"$max": "$qty"},
                    "first": {"$first": "$_id"},
                    "last": {"$last": "$_id"},
                    "ids": {"$push": "$_id"},
                    "prices": {"$addToSet": "$price"},
                }
            },
            {"$sort": {"_id": 1}},
        ],
        SALES,
    )
    assert out == [
        {"_id": "abc", "total": 120, "n": 2, "c": 2, "avg": 6.0, "lo": 2, "hi": 10, "first": 1, "last": 5,
         "ids": [1, 5], "prices": [10]},
        {"_id": "jkl", "total": 20, "n": 1, "c": 1, "avg": 1.0, "lo": 1, "hi": 1, "first": 2, "last": 2,
         "ids": [2], "prices": [20]},
        {"_id": "xyz", "total": 150, "n": 2, "c": 2, "avg": 15.0, "lo": 10, "hi": 20, "first": 3, "last": 4,
         "ids": [3, 4], "prices": [5]},
    ]  # fmt: skip


def test_group_null_id_and_document_id():
    assert agg([{"$group": {"_id": None, "n": {"$sum": "$qty"}}}], SALES) == [{"_id": None, "n": 43}]
    out = agg([{"$group": {"_id": {"i": "$item", "p": "$price", "m": "$missing"}}}, {"$sort": {"_id.i": 1}}], SALES)
    assert out == [{"_id": {"i": "abc", "p": 10}}, {"_id": {"i": "jkl", "p": 20}}, {"_id": {"i": "xyz", "p": 5}}]
    # A missing _id expression groups as null; $min/$max/$avg of nothing are null.
    assert agg([{"$group": {"_id": "$nope", "m": {"$min": "$nope"}, "a": {"$avg": "$item"}}}], SALES) == [
        {"_id": None, "m": None, "a": None}
    ]
    # 1 and 1.0 are one group.
    assert len(agg([{"$group": {"_id": "$k"}}], [{"k": 1}, {"k": 1.0}])) == 1


def test_count_documents_pipeline_of_pymongo():
    # pymongo's count_documents: [$match, $skip?, $limit?, $group {_id: 1, n: {$sum: 1}}]
    pipeline = [{"$match": {"item": "xyz"}}, {"$skip": 0}, {"$limit": 5}, {"$group": {"_id": 1, "n": {"$sum": 1}}}]
    assert agg(pipeline, SALES) == [{"_id": 1, "n": 2}]
    assert agg([{"$match": {"item": "none"}}, {"$group": {"_id": 1, "n": {"$sum": 1}}}], SALES) == []


def test_unwind_forms():
    out = agg([{"$unwind": "$tags"}, {"$project": {"tags": 1}}], SALES)
    assert out == [{"_id": 1, "tags": "a"}, {"_id": 1, "tags": "b"}, {"_id": 3, "tags": "c"}]
    out = agg(
        [
            {"$unwind": {"path": "$tags", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": True}},
            {"$project": {"tags": 1, "i": 1}},
        ],
        SALES,
    )
    assert out == [
        {"_id": 1, "tags": "a", "i": 0},
        {"_id": 1, "tags": "b", "i": 1},
        {"_id": 2, "i": None},  # an empty array: the field goes
        {"_id": 3, "tags": "c", "i": 0},
        {"_id": 4, "i": None},
        {"_id": 5, "tags": None, "i": None},
    ]
    # A non-array value is a one-element array.
    assert agg([{"$unwind": "$x"}], [{"_id": 1, "x": 7}]) == [{"_id": 1, "x": 7}]


def test_sort_skip_limit_count():
    out = agg([{"$sort": {"price": -1, "_id": 1}}, {"$skip": 1}, {"$limit": 2}, {"$project": {"_id": 1}}], SALES)
    assert out == [{"_id": 1}, {"_id": 5}]
    assert agg([{"$count": "n"}], SALES) == [{"n": 5}]
    assert agg([{"$match": {"qty": 99}}, {"$count": "n"}], SALES) == []


def test_project_inclusion_exclusion_computed():
    doc = [{"_id": 1, "a": {"b": 2, "c": 3}, "s": "Hi", "arr": [10, 20, 30]}]
    assert agg([{"$project": {"a.b": 1}}], doc) == [{"_id": 1, "a": {"b": 2}}]
    assert agg([{"$project": {"a": {"c": 1}, "_id": 0}}], doc) == [{"a": {"c": 3}}]
    assert agg([{"$project": {"a": 0, "arr": 0}}], doc) == [{"_id": 1, "s": "Hi"}]
    assert agg([{"$project": {"_id": 0, "s": 1, "t": "$a.b"}}], doc) == [{"s": "Hi", "t": 2}]
    assert agg([{"$project": {"_id": 0, "t": "$a.b"}}], doc) == [{"t": 2}]
    assert agg([{"$project": {"t": "$a.b"}}], doc) == [{"_id": 1, "t": 2}]
    out = agg(
        [
            {
                "$project": {
                    "s": 1,
                    "up": {"$toUpper": "$s"},
                    "low": {"$toLower": "$s"},
                    "sum": {"$add": ["$a.b", "$a.c", 1]},
                    "diff": {"$subtract": ["$a.c", "$a.b"]},
                    "q": {"$divide": ["$a.c", "$a.b"]},
                    "cat": {"$concat": ["$s", "-", "x"]},
                    "n": {"$size": "$arr"},
                    "last": {"$arrayElemAt": ["$arr", -1]},
                    "past": {"$arrayElemAt": ["$arr", 5]},
                    "big": {"$cond": {"if": {"$gt": ["$a.b", 1]}, "then": "yes", "else": "no"}},
                    "big2": {"$cond": [{"$lte": ["$a.b", 1]}, "yes", "no"]},
                    "dflt": {"$ifNull": ["$nope", "$also_not", "d"]},
                    "logic": {"$and": [{"$or": [False, 1]}, {"$not": [0]}]},
                    "eqnull": {"$eq": ["$nope", None]},
                    "lit": {"$literal": "$s"},
                    "const": "text",
                    "obj": {"x": "$a.b", "y": "$nope"},
                }
            }
        ],
        doc,
    )
    assert out == [
        {"_id": 1, "s": "Hi", "up": "HI", "low": "hi", "sum": 6, "diff": 1, "q": 1.5, "cat": "Hi-x", "n": 3,
         "last": 30, "big": "yes", "big2": "no", "dflt": "d", "logic": True, "eqnull": False, "lit": "$s",
         "const": "text", "obj": {"x": 2}}
    ]  # fmt: skip


def test_field_path_fans_out_over_arrays():
    docs = [{"_id": 1, "items": [{"p": 1}, {"p": 2}, {"q": 3}]}]
    assert agg([{"$project": {"ps": "$items.p"}}], docs) == [{"_id": 1, "ps": [1, 2]}]


def test_add_fields_set_unset():
    docs = [{"_id": 1, "a": {"b": 1}, "c": 2}]
    assert agg([{"$addFields": {"a.d": {"$add": ["$c", 1]}, "e": "$c"}}], docs) == [
        {"_id": 1, "a": {"b": 1, "d": 3}, "c": 2, "e": 2}
    ]
    assert agg([{"$set": {"a": {"z": 0}}}], docs) == [{"_id": 1, "a": {"b": 1, "z": 0}, "c": 2}]
    assert agg([{"$unset": ["a", "c"]}], docs) == [{"_id": 1}]
    assert agg([{"$unset": "a.b"}], docs) == [{"_id": 1, "a": {}, "c": 2}]
    assert docs == [{"_id": 1, "a": {"b": 1}, "c": 2}]  # inputs untouched


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("pipeline", "code"),
    [
        ({"$match": {}}, 14),  # not an array
        ([1], 14),
        ([{"$match": {}, "$limit": 1}], 40323),
        ([{}], 40323),
        ([{"$bogus": 1}], 40324),
        ([{"$lookup": {"from": "x"}}], 40324),
        ([{"$out": "x"}], 40324),
        ([{"$group": {"_id": None, "x": {"$median": "$a"}}}], 15952),
        ([{"$group": {"x": {"$sum": 1}}}], 15955),
        ([{"$group": {"_id": None, "x": 1}}], 40234),
        ([{"$group": {"_id": None, "x": {"$sum": 1, "$max": 1}}}], 40238),
        ([{"$group": {"_id": None, "a.b": {"$sum": 1}}}], 40235),
        ([{"$group": {"_id": None, "x": {"$sum": [1, 2]}}}], 40237),
        ([{"$group": 1}], 15947),
        ([{"$limit": 0}], 15958),
        ([{"$limit": -1}], 5107201),
        ([{"$limit": "x"}], 5107201),
        ([{"$limit": 1.5}], 5107201),
        ([{"$skip": -1}], 5107200),
        ([{"$skip": "x"}], 5107200),
        ([{"$match": 1}], 15959),
        ([{"$match": {"a": {"$regex": "("}}}], 51091),  # an invalid pattern
        ([{"$sort": 1}], 15973),
        ([{"$sort": {}}], 15976),
        ([{"$sort": {"a": 2}}], 15975),
        ([{"$count": 1}], 40156),
        ([{"$count": "$x"}], 40158),
        ([{"$count": "a.b"}], 40160),
        ([{"$unwind": 1}], 15981),
        ([{"$unwind": "a"}], 28818),
        ([{"$unwind": {"includeArrayIndex": "i"}}], 28812),
        ([{"$unwind": {"path": "$a", "preserveNullAndEmptyArrays": 1}}], 28809),
        ([{"$unwind": {"path": "$a", "includeArrayIndex": "$i"}}], 28822),
        ([{"$unwind": {"path": "$a", "other": 1}}], 28811),
        ([{"$project": {}}], 51272),
        ([{"$project": {"a": 1, "b": 0}}], 31254),
        ([{"$project": {"a": 1, "a.b": 1}}], 31250),
        ([{"$project": {"x": {"$regexMatch": {}}}}], 168),
        ([{"$project": {"x": {"$add": 1, "$subtract": 2}}}], 15983),
        ([{"$project": {"x": {"$eq": [1]}}}], 16020),
        ([{"$project": {"x": {"$cond": {"if": 1, "then": 2}}}}], 17082),
        ([{"$project": {"x": {"$cond": {"if": 1, "then": 2, "else": 3, "z": 4}}}}], 17083),
        ([{"$project": {"x": {"$ifNull": ["$a"]}}}], 1257300),
        ([{"$project": {"x": "$$NOW"}}], 17276),
        ([{"$project": {"x": "$a..b"}}], 15998),
        ([{"$addFields": 1}], 40272),
        ([{"$unset": 1}], 31002),
        ([{"$unset": [1]}], 31120),
        # errors while running
        ([{"$project": {"x": {"$add": ["$s", 1]}}}], 16554),
        ([{"$project": {"x": {"$multiply": ["$s", 1]}}}], 16555),
        ([{"$project": {"x": {"$subtract": ["$s", 1]}}}], 16556),
        ([{"$project": {"x": {"$divide": ["$a", 0]}}}], 16608),
        ([{"$project": {"x": {"$divide": ["$s", 1]}}}], 16609),
        ([{"$project": {"x": {"$concat": ["$s", 1]}}}], 16702),
        ([{"$project": {"x": {"$size": "$s"}}}], 17124),
        ([{"$project": {"x": {"$arrayElemAt": ["$s", 0]}}}], 28689),
        ([{"$project": {"x": {"$arrayElemAt": ["$arr", "$s"]}}}], 28690),
        ([{"$project": {"x": {"$arrayElemAt": ["$arr", 0.5]}}}], 28691),
    ],
)
def test_refusals_carry_mongodbs_codes(pipeline, code):
    assert code_of(pipeline) == code


def test_error_names():
    with pytest.raises(PipelineError) as e:
        parse([{"$bogus": 1}])
    assert (e.value.code_name, e.value.message) == ("Location40324", "Unrecognized pipeline stage name: '$bogus'")
    with pytest.raises(PipelineError) as e:
        parse([{"$project": {"x": {"$foo": 1}}}])
    assert e.value.code_name == "InvalidPipelineOperator"
    assert "Unrecognized expression '$foo'" in e.value.message


# ------------------------------------------------------------------------------- split


def test_split_pushes_matches_sort_skip_limit_and_plain_projection():
    stages = parse(
        [
            {"$match": {"a": 1}},
            {"$match": {"b": {"$gt": 2}}},
            {"$sort": {"c": -1}},
            {"$skip": 2},
            {"$limit": 5},
            {"$project": {"c": 1}},
            {"$group": {"_id": "$c"}},
        ]
    )
    shard, merge = split(stages)
    assert shard == ShardPart({"$and": [{"a": 1}, {"b": {"$gt": 2}}]}, {"c": -1}, 2, 5, {"c": 1})
    assert merge.as_pipeline() == [{"$group": {"_id": "$c"}}]


def test_split_keeps_what_find_cannot_do_on_the_router():
    shard, merge = split(parse([{"$limit": 3}, {"$skip": 1}]))
    assert shard == ShardPart({}, None, 0, 3) and merge.as_pipeline() == [{"$skip": 1}]
    shard, merge = split(parse([{"$match": {"a": 1}}, {"$project": {"x": "$a"}}, {"$match": {"b": 1}}]))
    assert shard == ShardPart({"a": 1}) and [st.name for st in merge.stages] == ["$project", "$match"]
    shard, merge = split(parse([{"$group": {"_id": None}}, {"$match": {"_id": None}}]))
    assert shard == ShardPart({}) and len(merge.stages) == 2
    assert split(parse([{"$unwind": "$a"}, {"$sort": {"a": 1}}]))[0] == ShardPart({})


def find_like_the_router(part: ShardPart, shards: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """route.py's find over in-memory shards: each filters, sorts and keeps skip+limit (and
    projects when there is no sort); the router merges, skips, limits and projects."""
    matcher = compile_filter(part.filter)
    want = part.skip + part.limit if part.limit else 0
    streams = []
    for docs in shards:
        mine = [d for d in docs if matcher.matches(d)]
        if part.sort:
            mine.sort(key=sort_key(part.sort))
        if want:
            mine = mine[:want]
        if not part.sort and part.projection is not None:
            mine = [apply_projection(d, part.projection) for d in mine]
        streams.append(mine)
    merged = merge_sorted(streams, part.sort) if part.sort else itertools.chain(*streams)
    out = list(itertools.islice(merged, part.skip, want or None))
    if part.sort and part.projection is not None:
        out = [apply_projection(d, part.projection) for d in out]
    return out


small = st.integers(-3, 3)
maybe = st.one_of(small, st.none())
doc_fields = st.fixed_dictionaries(
    {},
    optional={
        "a": maybe,
        "b": st.sampled_from(["x", "y", "z"]),
        "c": st.lists(small, max_size=3),
        "d": st.fixed_dictionaries({}, optional={"e": small}),
    },
)
direction = st.sampled_from([1, -1])
stage = st.one_of(
    st.builds(lambda k: {"$match": {"a": {"$gt": k}}}, small),
    st.builds(lambda b: {"$match": {"b": b}}, st.sampled_from(["x", "y"])),
    st.builds(lambda vs: {"$match": {"a": {"$in": vs}}}, st.lists(maybe, max_size=3)),
    st.just({"$match": {}}),
    st.builds(lambda x, y: {"$sort": {"a": x, "b": y}}, direction, direction),
    st.builds(lambda x: {"$sort": {"d.e": x}}, direction),
    st.builds(lambda n: {"$skip": n}, st.integers(0, 4)),
    st.builds(lambda n: {"$limit": n}, st.integers(1, 5)),
    st.sampled_from(
        [
            {"$project": {"a": 1}},
            {"$project": {"b": 0}},
            {"$project": {"_id": 0, "a": 1, "d.e": 1}},
            {"$project": {"c": 0, "d": 0}},
            {"$project": {"x": {"$add": ["$a", 1]}, "b": 1}},
            {"$project": {"_id": 0, "x": {"$add": ["$a", 1]}, "b": 1}},
            {"$project": {"_id": 0, "x": "$d.e"}},
            {"$project": {"big": {"$cond": [{"$gte": ["$a", 0]}, "$b", {"$ifNull": ["$a", "none"]}]}}},
            {"$addFields": {"y": {"$concat": ["$b", "!"]}, "d.f": {"$size": {"$ifNull": ["$c", []]}}}},
            {"$set": {"first": {"$arrayElemAt": ["$c", 0]}}},
            {"$unset": "a"},
            {"$unwind": "$c"},
            {"$unwind": {"path": "$c", "preserveNullAndEmptyArrays": True, "includeArrayIndex": "i"}},
            {"$count": "n"},
            {
                "$group": {
                    "_id": "$b",
                    "n": {"$sum": 1},
                    "s": {"$sum": "$a"},
                    "mx": {"$max": "$a"},
                    "mn": {"$min": "$a"},
                    "f": {"$first": "$a"},
                    "l": {"$last": "$_id"},
                    "ids": {"$push": "$_id"},
                    "set": {"$addToSet": "$a"},
                    "avg": {"$avg": "$a"},
                }
            },
            {"$group": {"_id": {"b": "$b", "pos": {"$gt": ["$a", 0]}}, "n": {"$count": {}}}},
        ]
    ),
)


@PROPERTY
@given(
    docs=st.lists(doc_fields, max_size=12),
    owners=st.lists(st.integers(0, 2), min_size=12, max_size=12),
    pipeline=st.lists(stage, max_size=6),
)
def test_split_then_merge_equals_the_whole_pipeline(docs, owners, pipeline):
    docs = [{"_id": i, **d} for i, d in enumerate(docs)]
    shards: list[list[dict[str, Any]]] = [[], [], []]
    for d, owner in zip(docs, owners):
        shards[owner].append(d)
    natural = [d for shard in shards for d in shard]  # the router reads the shards in order
    stages = parse(pipeline)
    shard_part, merge_part = split(stages)

    def outcome(fn):  # a document the pipeline cannot take ($size of a number) fails both ways alike
        try:
            return fn()
        except PipelineError as e:
            return ("error", e.code, e.message)

    split_run = outcome(lambda: merge_part.run(find_like_the_router(shard_part, shards)))
    assert split_run == outcome(lambda: run(stages, natural))
