"""domain/indexes.py: index specs as MongoDB checks them, the keys a document puts into an index,
and entries whose byte order is the index's order."""

from __future__ import annotations

import datetime
import functools
import uuid

import pytest
from bson import Binary, Decimal128, Int64, MinKey, ObjectId, Regex, Timestamp
from hypothesis import given
from hypothesis import strategies as st

from domain.indexes import (
    ID_INDEX,
    IndexSpec,
    check_new,
    check_unique_with_shard_key,
    duplicate_key_info,
    duplicate_key_message,
    entries,
    entry_key,
    index_keys,
    key_prefix,
    server_form,
)
from domain.protocol import ErrorCode
from domain.shardkey import compare_values, encode_value
from libs.errors import CommandError


def code_of(call) -> str:
    with pytest.raises(CommandError) as e:
        call()
    return e.value.code


# ------------------------------------------------------------------ specs


def test_a_spec_gets_mongodbs_default_name_and_lists_as_mongodb_lists_it():
    spec = IndexSpec.parse({"key": {"a": 1, "b.c": -1}, "unique": True})
    assert spec.name == "a_1_b.c_-1"
    assert spec.key == (("a", 1), ("b.c", -1))
    assert spec.to_mongo() == {"v": 2, "key": {"a": 1, "b.c": -1}, "name": "a_1_b.c_-1", "unique": True}
    assert ID_INDEX.to_mongo() == {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    # Any positive or negative number is a direction, as in MongoDB.
    assert IndexSpec.parse({"key": {"x": 2.5, "y": -7}}).key == (("x", 1), ("y", -1))


@pytest.mark.parametrize(
    ("spec", "code"),
    [
        ({"key": {}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": 0}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": "text"}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": "hashed"}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": True}}, ErrorCode.CannotCreateIndex),
        ({"key": {"$a": 1}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a..b": 1}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": 1}, "name": ""}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": 1}, "name": "*"}, ErrorCode.BadValue),
        ({"key": {"a": 1}, "name": 5}, ErrorCode.TypeMismatch),
        ({"key": {"a": 1}, "bogus": 1}, ErrorCode.InvalidIndexSpecificationOption),
        ({"key": {"a": 1}, "expireAfterSeconds": 5}, ErrorCode.NotImplemented),
        ({"key": {"a": 1}, "sparse": True, "partialFilterExpression": {"a": 1}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": 1}, "partialFilterExpression": {"a": {"$bogus": 1}}}, ErrorCode.CannotCreateIndex),
        ({"key": {"a": 1}, "name": "_id_"}, ErrorCode.BadValue),
        ({"name": "a_1"}, ErrorCode.FailedToParse),
        ("a_1", ErrorCode.TypeMismatch),
    ],
)
def test_a_bad_spec_gets_mongodbs_code(spec, code):
    assert code_of(lambda: IndexSpec.parse(spec)) == code


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("$a", "Index key contains an illegal field name: field name starts with '$'."),
        ("a.$b", "Index key contains an illegal field name: field name starts with '$'."),
        ("a.b.$", "Index key contains an illegal field name: field name starts with '$'."),
        ("a.$id", "Index key contains an illegal field name: field name starts with '$'."),  # DBRef: refused
        ("a..b", "Index keys cannot contain an empty field."),
        ("a.", "Index keys cannot contain an empty field."),
        (".a", "Index keys cannot contain an empty field."),
        (".", "Index keys cannot contain an empty field."),
        ("", "Index keys cannot be an empty field."),
        ("_fts", "Index key contains an illegal field name: '_fts'"),
    ],
)
def test_a_bad_key_path_gets_mongodbs_message(path, message):
    with pytest.raises(CommandError) as e:
        IndexSpec.parse({"key": {"a": 1, path: 1}})
    assert (e.value.code, e.value.message) == (ErrorCode.CannotCreateIndex, message)


def test_dollars_and_dots_inside_a_component_are_fine():
    assert IndexSpec.parse({"key": {"a$.b$c": 1, "_fts.x": 1}}).paths == ("a$.b$c", "_fts.x")


def test_conflicts_are_mongodbs():
    a = IndexSpec.parse({"key": {"a": 1}})
    existing = [ID_INDEX, a]
    assert check_new(existing, IndexSpec.parse({"key": {"a": 1}})) is True  # already there: ok
    assert check_new(existing, IndexSpec.parse({"key": {"b": 1}})) is False
    assert code_of(lambda: check_new(existing, IndexSpec.parse({"key": {"a": 1}, "name": "other"}))) == (
        ErrorCode.IndexOptionsConflict
    )
    assert code_of(lambda: check_new(existing, IndexSpec.parse({"key": {"b": 1}, "name": "a_1"}))) == (
        ErrorCode.IndexKeySpecsConflict
    )
    assert code_of(lambda: check_new(existing, IndexSpec.parse({"key": {"a": 1}, "unique": True}))) == (
        ErrorCode.IndexOptionsConflict
    )
    # The same key with other options under another name is another index (MongoDB's signature).
    assert check_new(existing, IndexSpec.parse({"key": {"a": 1}, "unique": True, "name": "a_u"})) is False
    many = [IndexSpec.parse({"key": {f"f{i}": 1}}) for i in range(64)]
    assert code_of(lambda: check_new(many, IndexSpec.parse({"key": {"z": 1}}))) == ErrorCode.CannotCreateIndex


def test_unique_needs_the_shard_key_as_its_prefix():
    unique = IndexSpec.parse({"key": {"email": 1}, "unique": True})
    check_unique_with_shard_key(unique, None)  # unsharded: any unique index
    check_unique_with_shard_key(unique, {"email": 1})
    check_unique_with_shard_key(IndexSpec.parse({"key": {"r": 1, "email": 1}, "unique": True}), {"r": 1})
    assert code_of(lambda: check_unique_with_shard_key(unique, {"_id": 1})) == ErrorCode.CannotCreateIndex
    assert code_of(lambda: check_unique_with_shard_key(unique, {"email": "hashed"})) == ErrorCode.CannotCreateIndex
    check_unique_with_shard_key(IndexSpec.parse({"key": {"email": 1}}), {"_id": 1})  # not unique: any


# ------------------------------------------------------------------ keys


def keys(key, doc, **options):
    return index_keys(IndexSpec.parse({"key": key, **options}), doc)


def test_keys_of_scalars_missing_fields_and_arrays():
    assert keys({"a": 1}, {"_id": 1, "a": 5}) == ([(5,)], False)
    assert keys({"a": 1}, {"_id": 1}) == ([(None,)], False)  # missing is null
    assert keys({"a": 1}, {"_id": 1, "a": [3, 1, 3]}) == ([(3,), (1,)], True)  # one key per distinct element
    assert keys({"a": 1}, {"_id": 1, "a": []}) == ([([],)], True)
    assert keys({"a": 1}, {"_id": 1, "a": [[1, 2]]}) == ([([1, 2],)], True)  # nested arrays stay whole
    assert keys({"a.b": 1}, {"_id": 1, "a": [{"b": 1}, {"b": [2, 3]}, {"c": 0}, 7]}) == ([(1,), (2,), (3,)], True)
    assert keys({"a.b": 1}, {"_id": 1, "a": {"b": {"c": 1}}}) == ([({"c": 1},)], False)
    assert keys({"a.1": 1}, {"_id": 1, "a": [5, 6]}) == ([(6,)], False)  # a position
    assert keys({"a": 1, "b": -1}, {"_id": 1, "a": [1, 2], "b": "x"}) == ([(1, "x"), (2, "x")], True)


def test_parallel_arrays_are_refused():
    assert (
        code_of(lambda: keys({"a": 1, "b": 1}, {"_id": 1, "a": [1], "b": [2]})) == ErrorCode.CannotIndexParallelArrays
    )


def test_sparse_and_partial_indexes_skip_documents():
    assert keys({"a": 1}, {"_id": 1}, sparse=True) == ([], False)
    assert keys({"a": 1, "b": 1}, {"_id": 1, "b": 2}, sparse=True) == ([(None, 2)], False)
    partial = {"partialFilterExpression": {"n": {"$gt": 5}}}
    assert keys({"a": 1}, {"_id": 1, "a": 1, "n": 3}, **partial) == ([], False)
    assert keys({"a": 1}, {"_id": 1, "a": 1, "n": 9}, **partial) == ([(1,)], False)


def test_duplicate_key_errors_read_as_mongodbs():
    spec = IndexSpec.parse({"key": {"email": 1}, "unique": True})
    assert duplicate_key_message("app.users", spec, ("a@x",)) == (
        'E11000 duplicate key error collection: app.users index: email_1 dup key: { email: "a@x" }'
    )
    assert duplicate_key_info(spec, ("a@x",)) == {"keyPattern": {"email": 1}, "keyValue": {"email": "a@x"}}


def test_duplicate_keys_print_as_the_server_prints_them():
    """Not Extended JSON and not mongosh's form: BSONObj::toString's, as mongod's errmsg has it."""
    spec = IndexSpec.parse({"key": {"k": 1, "b.c": -1, "n": 1}, "unique": True})
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    key = (oid, {"x": "y", "z": [1, 2.0, None], "e": {}}, Int64(5))
    assert duplicate_key_message("db.c", spec, key) == (
        "E11000 duplicate key error collection: db.c index: k_1_b.c_-1_n_1 dup key: "
        "{ k: ObjectId('65a1b2c3d4e5f60718293a4b'), b.c: { x: \"y\", z: [ 1, 2.0, null ], e: {} }, n: 5 }"
    )
    assert duplicate_key_info(spec, key)["keyValue"]["k"] == {"$oid": "65a1b2c3d4e5f60718293a4b"}


@pytest.mark.parametrize(
    ("value", "printed"),
    [
        (True, "true"),
        (1.5, "1.5"),
        (-0.0, "-0.0"),
        (1e20, "1e+20.0"),  # appendDoubleNice: "%.16g", then ".0" without a "."
        ("it's", '"it\'s"'),
        ("é" * 100, '"' + "é" * 75 + '..."'),  # past 159 bytes: 150 bytes, then ..."
        ([], "[]"),
        (datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "new Date(1704067200000)"),
        (Timestamp(5, 1), "Timestamp(5, 1)"),
        (Regex("a.c", "im"), "/a.c/im"),
        (Binary(b"ab", 0), "BinData(0, 6162)"),
        (Binary(uuid.UUID(int=1).bytes, 4), 'UUID("00000000-0000-0000-0000-000000000001")'),
        (Decimal128("1.50"), "1.50"),
        (MinKey(), "MinKey"),
    ],
)
def test_server_form_of_each_type(value, printed):
    assert server_form(value) == printed


# ------------------------------------------------------------------ entry order

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.sampled_from("xy"), st.integers(-3, 3), max_size=2),
)
directions = st.lists(st.sampled_from([1, -1]), min_size=1, max_size=3)


@given(
    directions.flatmap(
        lambda ds: st.tuples(
            st.just(ds), st.lists(st.tuples(*[scalars] * len(ds), st.integers(0, 5)), min_size=2, max_size=8)
        )
    )
)
def test_entries_sort_in_the_indexs_order(case):
    """Byte order of entries == MongoDB's order per field (reversed for -1), then _id."""
    dirs, rows = case
    spec = IndexSpec.make("i", tuple((f"f{i}", d) for i, d in enumerate(dirs)))

    def cmp(r1, r2):
        for i, d in enumerate(dirs):
            c = compare_values(r1[i], r2[i]) * d
            if c:
                return c
        return compare_values(r1[-1], r2[-1])

    by_bytes = sorted(rows, key=lambda r: entry_key(spec, r[:-1], r[-1]))
    by_order = sorted(rows, key=functools.cmp_to_key(cmp))
    assert [entry_key(spec, r[:-1], r[-1]) for r in by_bytes] == [entry_key(spec, r[:-1], r[-1]) for r in by_order]
    for r in rows:  # a unique index's check: the entry starts with its prefix
        assert entry_key(spec, r[:-1], r[-1]).startswith(key_prefix(spec, r[:-1]))


def test_entries_of_a_document():
    spec = IndexSpec.parse({"key": {"tags": 1}})
    out, multikey = entries(spec, {"_id": 7, "tags": ["a", "b"]})
    assert multikey and sorted(out.values()) == [("a",), ("b",)]
    assert set(out) == {entry_key(spec, ("a",), 7), entry_key(spec, ("b",), 7)}
    assert all(k.endswith(encode_value(7)) for k in out)
