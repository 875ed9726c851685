"""domain.shardkey: the byte encoding is checked against an independent reference
comparator written straight from MongoDB's ordering rules (not from the encoding)."""

from __future__ import annotations

import copy
import math
import pickle
import re
from itertools import combinations
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.shardkey import (
    INT64_MAX,
    INT64_MIN,
    MAX_KEY,
    MAX_SHARD_KEY_BYTES,
    MIN_KEY,
    InvalidKeyPattern,
    KeyPattern,
    MaxKey,
    MinKey,
    ShardKeyError,
    check_size,
    compare_values,
    encode_value,
    from_ejson,
    hash_value,
    to_ejson,
    to_ejson_bound,
)

PROPERTY = settings(max_examples=200, deadline=None)

# ------------------------------------------------------------------ reference ordering


def ref_rank(v: Any) -> int:
    if v is MIN_KEY:
        return 0
    if v is None:
        return 1
    if isinstance(v, bool):  # before numbers: bool is an int subclass
        return 6
    if isinstance(v, (int, float)):
        return 2
    if isinstance(v, str):
        return 3
    if isinstance(v, dict):
        return 4
    if isinstance(v, list):
        return 5
    if v is MAX_KEY:
        return 7
    raise TypeError(v)


def cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def ref_compare(a: Any, b: Any) -> int:
    ra, rb = ref_rank(a), ref_rank(b)
    if ra != rb:
        return cmp(ra, rb)
    if ra == 2:
        # NaN equals NaN and is below every number; Python compares int/float exactly.
        na, nb = isinstance(a, float) and math.isnan(a), isinstance(b, float) and math.isnan(b)
        if na or nb:
            return cmp(nb, na)
        return cmp(a, b)
    if ra == 3:
        return cmp(a.encode("utf-8"), b.encode("utf-8"))
    if ra == 4:
        for (ka, va), (kb, vb) in zip(a.items(), b.items()):
            c = cmp(ref_rank(va), ref_rank(vb)) or cmp(ka.encode(), kb.encode()) or ref_compare(va, vb)
            if c:
                return c
        return cmp(len(a), len(b))
    if ra == 5:
        for x, y in zip(a, b):
            c = ref_compare(x, y)
            if c:
                return c
        return cmp(len(a), len(b))
    if ra == 6:
        return cmp(a, b)
    return 0  # MinKey, null, MaxKey


def ref_compare_tuples(a: list, b: list) -> int:
    for x, y in zip(a, b):
        c = ref_compare(x, y)
        if c:
            return c
    return cmp(len(a), len(b))


# ------------------------------------------------------------------------ strategies

# Integers near powers of two where float64 images are inexact, and their images.
_near_big = st.builds(
    lambda base, off: min(max(base + off, INT64_MIN), INT64_MAX),
    st.sampled_from([2**53, 2**60, 2**62, 2**63 - 1, -(2**53), -(2**62), -(2**63)]),
    st.integers(-1100, 1100),
)
numbers = st.one_of(
    st.integers(-3, 3),
    st.integers(INT64_MIN, INT64_MAX),
    _near_big,
    _near_big.map(float),
    st.floats(),  # includes NaN, ±inf, -0.0, subnormals
    st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, float("nan"), float("inf"), float("-inf")]),
)
# Small alphabets make equal prefixes (the interesting cases) likely; NUL and
# non-ASCII exercise escaping and UTF-8 byte order.
texts = st.one_of(
    st.text(alphabet="ab\x00\x7fé\uffff\U0001f600", max_size=4),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=6),
)
names = st.text(alphabet="ab\x00é", max_size=3)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts, st.sampled_from([MIN_KEY, MAX_KEY]))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(names, children, max_size=3),
    ),
    max_leaves=8,
)


# ---------------------------------------------------------------------- ordering props


@PROPERTY
@given(st.lists(values, min_size=2, max_size=6))
def test_encoding_order_matches_reference(vs: list) -> None:
    for a, b in combinations(vs, 2):
        expected = ref_compare(a, b)
        assert cmp(encode_value(a), encode_value(b)) == expected, (a, b)
        assert compare_values(a, b) == expected
        assert compare_values(b, a) == -expected


@PROPERTY
@given(values)
def test_value_equals_itself_and_copies(v: Any) -> None:
    assert ref_compare(v, v) == 0  # sanity of the reference (NaN included)
    assert encode_value(copy.deepcopy(v)) == encode_value(v)
    assert hash_value(copy.deepcopy(v)) == hash_value(v)


@PROPERTY
@given(values, values)
def test_encoding_is_prefix_free(a: Any, b: Any) -> None:
    ea, eb = encode_value(a), encode_value(b)
    if ea != eb:
        assert not eb.startswith(ea) and not ea.startswith(eb), (a, b)


@PROPERTY
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(*[st.lists(values, min_size=n, max_size=n)] * 2)))
def test_concatenation_orders_tuples_lexicographically(pair: tuple[list, list]) -> None:
    a, b = pair
    ea = b"".join(encode_value(v) for v in a)
    eb = b"".join(encode_value(v) for v in b)
    assert cmp(ea, eb) == ref_compare_tuples(a, b), (a, b)


@PROPERTY
@given(st.lists(values, min_size=1, max_size=8))
def test_sorting_by_encoding_is_a_reference_sort(vs: list) -> None:
    ordered = sorted(vs, key=encode_value)
    for a, b in zip(ordered, ordered[1:]):
        assert ref_compare(a, b) <= 0


@PROPERTY
@given(st.one_of(st.integers(INT64_MIN, INT64_MAX), _near_big))
def test_ints_equal_to_their_float_image_hash_and_encode_alike(n: int) -> None:
    f = float(n)
    assert compare_values(n, f) == cmp(n, f)  # Python compares int/float exactly
    if n == f:
        assert encode_value(n) == encode_value(f)
        assert hash_value(n) == hash_value(f)


# ----------------------------------------------------------------- ordering examples


@pytest.mark.parametrize(
    "lo, hi",
    [
        (MIN_KEY, None),
        (None, float("nan")),
        (float("nan"), float("-inf")),
        (float("-inf"), INT64_MIN),
        (INT64_MIN, -1.5),
        (-1, -0.5),
        (0.5, 1),
        (2.0**53, 2**53 + 1),
        (2**53 + 1, 2.0**53 + 2),
        (2**60, 2**60 + 1),
        (2.0**63 - 2048, INT64_MAX),
        (INT64_MAX, 2.0**63),
        (2.0**63, float("inf")),
        (float("inf"), ""),
        ("", "\x00"),
        ("\x00", "\x00\x00"),
        ("\x00", "\x01"),
        ("a", "ab"),
        ("Z", "a"),
        ("\uffff", "\U0001f600"),  # UTF-8 bytes, not UTF-16 code units
        ("zzz", {}),
        ({}, {"a": None}),
        ({"b": None}, {"a": 1}),  # type before field name
        ({"a": 1}, {"b": 1}),  # then field name
        ({"a": 1}, {"a": 2}),  # then value
        ({"a": 1}, {"a": 1, "b": MIN_KEY}),  # prefix first
        ({"a": True}, {"b": False}),  # booleans are one type: field name decides
        ({"z": 1}, []),
        ([], [MIN_KEY]),
        ([1, 2], [1, 2, None]),
        ([1, "a"], [2]),
        ([[1]], [True]),
        ([MAX_KEY], False),
        (False, True),
        (True, MAX_KEY),
    ],
)
def test_ordering_examples(lo: Any, hi: Any) -> None:
    assert ref_compare(lo, hi) == -1
    assert compare_values(lo, hi) == -1
    assert compare_values(hi, lo) == 1
    assert encode_value(lo) < encode_value(hi)


@pytest.mark.parametrize(
    "a, b",
    [
        (1, 1.0),
        (0, -0.0),
        (0.0, -0.0),
        (2**60, float(2**60)),
        (float("nan"), float("-nan")),
        (float("nan"), math.inf - math.inf),
        ({"a": [1, -0.0]}, {"a": [1.0, 0]}),
        (MIN_KEY, MinKey()),
    ],
)
def test_equal_values_encode_and_hash_alike(a: Any, b: Any) -> None:
    assert compare_values(a, b) == 0
    assert encode_value(a) == encode_value(b)
    assert hash_value(a) == hash_value(b)


def test_bool_is_not_a_number() -> None:
    assert compare_values(True, 1) == 1
    assert compare_values(False, 0) == 1
    assert compare_values(False, 10**18) == 1
    assert encode_value(True) != encode_value(1)
    assert hash_value(True) != hash_value(1)


def test_int_float_tie_breaks_are_exact() -> None:
    assert float(2**53 + 1) == 2.0**53  # the image is inexact ...
    assert compare_values(2**53 + 1, 2.0**53) == 1  # ... the comparison is not
    assert compare_values(2**53 - 1, 2.0**53) == -1
    assert compare_values(INT64_MAX, 2.0**63) == -1
    assert compare_values(INT64_MAX - 1, INT64_MAX) == -1
    assert compare_values(INT64_MIN, -(2.0**63)) == 0
    assert compare_values(INT64_MIN + 1, -(2.0**63)) == 1


def test_nan_sorts_below_numbers_above_null() -> None:
    nan = float("nan")
    assert compare_values(nan, nan) == 0
    assert compare_values(nan, float("-inf")) == -1
    assert compare_values(nan, INT64_MIN) == -1
    assert compare_values(nan, None) == 1
    assert compare_values([nan], [float("-inf")]) == -1


def test_encoding_is_pinned() -> None:
    # Encodings end up in persisted chunk bounds and under hashes: pin the format.
    assert encode_value(MIN_KEY) == b"\x10"
    assert encode_value(None) == b"\x20"
    assert encode_value(1) == bytes.fromhex("30bff00000000000008000")
    assert encode_value(INT64_MAX) == bytes.fromhex("30c3e00000000000007fff")
    assert encode_value("a\x00") == b"\x40a\x00\xff\x00\x00"
    assert encode_value({"k": True}) == b"\x50\x70k\x00\x00\x01\x00"
    assert encode_value([None]) == b"\x60\x20\x00"
    assert encode_value(MAX_KEY) == b"\xf0"


def test_hash_is_pinned_across_processes() -> None:
    assert hash_value(1) == -7832375711913668377
    assert hash_value(1.0) == -7832375711913668377
    assert hash_value("abc") == -346256425580126975
    assert hash_value({"a": [1]}) == -3738686642277405625
    assert len({hash_value(v) for v in (None, "abc", 0, True, MIN_KEY)}) == 5
    for v in (None, "abc", {"a": [1]}, MAX_KEY):
        h = hash_value(v)
        assert isinstance(h, int) and INT64_MIN <= h <= INT64_MAX


@pytest.mark.parametrize(
    "bad, message",
    [
        ((1, 2), "unsupported shard key value of type tuple"),
        ({1, 2}, "unsupported shard key value of type set"),
        (re.compile("x"), "unsupported shard key value of type Pattern"),  # bytes is binData now (0016)
        (object(), "unsupported shard key value of type object"),
        ({"a": [1, (2,)]}, "type tuple"),
        ({1: "a"}, "field names must be strings"),
        (2**63, "outside the signed 64-bit range"),
        (INT64_MIN - 1, "outside the signed 64-bit range"),
        ("\ud800", "not valid Unicode"),
    ],
)
def test_unsupported_values_raise(bad: Any, message: str) -> None:
    with pytest.raises(ShardKeyError, match=message):
        encode_value(bad)
    with pytest.raises(ValueError):  # ShardKeyError is a ValueError
        hash_value(bad)


def test_deep_nesting_raises_instead_of_recursing_forever() -> None:
    deep: Any = 1
    for _ in range(1000):
        deep = [deep]
    with pytest.raises(ShardKeyError, match="nested deeper"):
        encode_value(deep)


# ------------------------------------------------------------- sentinels and ejson


def test_sentinels_are_singletons() -> None:
    assert MinKey() is MIN_KEY and MaxKey() is MAX_KEY
    assert repr(MIN_KEY) == "MIN_KEY" and repr(MAX_KEY) == "MAX_KEY"
    assert MIN_KEY == MIN_KEY and MIN_KEY != MAX_KEY
    assert MIN_KEY != {"$minKey": 1} and MIN_KEY != None and MAX_KEY != 1  # noqa: E711
    assert len({MIN_KEY, MAX_KEY, MinKey()}) == 2
    assert pickle.loads(pickle.dumps(MIN_KEY)) is MIN_KEY
    assert copy.deepcopy({"x": MAX_KEY})["x"] is MAX_KEY


def test_ejson_round_trip() -> None:
    ejson = {"a": {"$minKey": 1}, "b": [{"$maxKey": 1}, {"c": {"$minKey": 1}}], "d": {"$x": 1}}
    native = from_ejson(ejson)
    assert native == {"a": MIN_KEY, "b": [MAX_KEY, {"c": MIN_KEY}], "d": {"$x": 1}}
    assert to_ejson(native) == ejson
    assert from_ejson({"$minKey": 1.0}) is MIN_KEY
    assert from_ejson(5) == 5 and from_ejson("s") == "s" and from_ejson(None) is None
    assert ejson["a"] == {"$minKey": 1}  # the input is not mutated


@pytest.mark.parametrize("bad", [{"$minKey": 0}, {"$maxKey": True}, {"$maxKey": "1"}])
def test_malformed_ejson_sentinel_raises(bad: dict) -> None:
    with pytest.raises(ShardKeyError, match="must be 1"):
        from_ejson(bad)


# -------------------------------------------------------------------- key patterns


def test_parse_normalises() -> None:
    kp = KeyPattern.parse({"x": 1.0, "a.b": 1, "y": "hashed"})
    assert kp.fields == ("x", "a.b", "y")
    assert kp.hashed_field == "y" and kp.is_hashed
    assert kp.spec == {"x": 1, "a.b": 1, "y": "hashed"}
    assert type(kp.spec["x"]) is int
    assert kp == KeyPattern.parse({"x": 1, "a.b": 1, "y": "hashed"})
    assert hash(kp) == hash(KeyPattern.parse(kp.spec))
    assert kp != KeyPattern.parse({"y": "hashed", "x": 1, "a.b": 1})  # order matters
    assert not KeyPattern.parse({"x": 1}).is_hashed
    assert KeyPattern.parse({"_id": "hashed", "x": 1}).hashed_field == "_id"
    assert KeyPattern.parse({f"f{i}": 1 for i in range(32)}).fields[-1] == "f31"
    assert "KeyPattern" in repr(kp) and "'hashed'" in repr(kp)


@pytest.mark.parametrize(
    "spec, message",
    [
        (None, "must be a non-empty object"),
        ([("x", 1)], "must be a non-empty object"),
        ({}, "must be a non-empty object"),
        ({1: 1}, "field names must be strings"),
        ({"": 1}, "must not be empty"),
        ({"$x": 1}, "must not start with '\\$'"),
        ({"a.$x": 1}, "must not start with '\\$'"),
        ({"a\0b": 1}, "must not contain a NUL"),
        ({"a..b": 1}, "empty path component"),
        ({".a": 1}, "empty path component"),
        ({"a.": 1}, "empty path component"),
        ({"x": -1}, 'must be ascending \\(1\\) or "hashed".*descending'),
        ({"x": 2}, "must be ascending \\(1\\) or \"hashed\", got 2 for field 'x'"),
        ({"x": True}, 'ascending \\(1\\) or "hashed"'),
        ({"x": "1"}, 'ascending \\(1\\) or "hashed"'),
        ({"x": "Hashed"}, 'ascending \\(1\\) or "hashed"'),
        ({"x": "2dsphere"}, 'ascending \\(1\\) or "hashed"'),
        ({"x": "hashed", "y": "hashed"}, "at most one hashed field"),
        ({f"f{i}": 1 for i in range(33)}, "at most 32 fields, got 33"),
    ],
)
def test_parse_rejects(spec: Any, message: str) -> None:
    with pytest.raises(InvalidKeyPattern, match=message):
        KeyPattern.parse(spec)


def test_global_bounds() -> None:
    kp = KeyPattern.parse({"x": 1, "y": "hashed"})
    assert kp.global_min() == {"x": MIN_KEY, "y": MIN_KEY}
    assert list(kp.global_max()) == ["x", "y"] and set(kp.global_max().values()) == {MAX_KEY}
    lo, hi = kp.encode_bound(kp.global_min()), kp.encode_bound(kp.global_max())
    for doc in ({}, {"x": MAX_KEY}, {"x": 1, "y": 2}, {"x": {"z": True}}):
        assert lo < kp.encode_doc(doc) < hi


# ---------------------------------------------------------------------------- bounds


def test_validate_bound_accepts_ejson_and_hashes() -> None:
    kp = KeyPattern.parse({"x": 1, "h": "hashed"})
    assert kp.validate_bound({"x": {"$minKey": 1}, "h": {"$maxKey": 1}}) == {"x": MIN_KEY, "h": MAX_KEY}
    assert kp.validate_bound({"x": "m", "h": INT64_MIN}) == {"x": "m", "h": INT64_MIN}
    assert kp.validate_bound({"x": {"a": [1]}, "h": 0})["x"] == {"a": [1]}
    assert to_ejson_bound({"x": MIN_KEY, "h": 5}) == {"x": {"$minKey": 1}, "h": 5}
    assert kp.to_ejson_bound(kp.global_max()) == {"x": {"$maxKey": 1}, "h": {"$maxKey": 1}}


@pytest.mark.parametrize(
    "bound, message",
    [
        ([1, 2], "must name exactly the shard key fields x, h in"),
        ({"x": 1}, "must name exactly the shard key fields x, h in"),
        ({"h": 1, "x": 1}, "in that order"),
        ({"x": 1, "h": 1, "z": 1}, "must name exactly"),
        ({"x": 1, "h": 1.0}, "hashed field 'h' must be a signed 64-bit integer"),
        ({"x": 1, "h": "a"}, "hashed field 'h'"),
        ({"x": 1, "h": True}, "hashed field 'h'"),
        ({"x": 1, "h": None}, "hashed field 'h'"),
        ({"x": 1, "h": 2**63}, "hashed field 'h'"),
        ({"x": [1], "h": 1}, "cannot be arrays"),
        ({"x": (1,), "h": 1}, "unsupported shard key value of type tuple"),
        ({"x": "s" * 600, "h": 1}, "512-byte limit"),
        ({"x": {"$minKey": 2}, "h": 1}, "must be 1"),
    ],
)
def test_validate_bound_rejects(bound: Any, message: str) -> None:
    kp = KeyPattern.parse({"x": 1, "h": "hashed"})
    with pytest.raises(ShardKeyError, match=message):
        kp.validate_bound(bound)


@PROPERTY
@given(st.lists(st.tuples(numbers | texts | st.none(), st.integers(INT64_MIN, INT64_MAX)), min_size=2, max_size=5))
def test_bound_encoding_orders_compound_keys(rows: list[tuple[Any, int]]) -> None:
    kp = KeyPattern.parse({"x": 1, "h": "hashed"})
    for (xa, ha), (xb, hb) in combinations(rows, 2):
        a = kp.validate_bound({"x": xa, "h": ha})
        b = kp.validate_bound({"x": xb, "h": hb})
        assert cmp(kp.encode_bound(a), kp.encode_bound(b)) == ref_compare_tuples([xa, ha], [xb, hb])


def test_check_size() -> None:
    check_size({"x": "s" * (MAX_SHARD_KEY_BYTES - 3)})  # tag + string + terminator = 512
    with pytest.raises(ShardKeyError, match="513 bytes"):
        check_size({"x": "s" * (MAX_SHARD_KEY_BYTES - 2)})
    with pytest.raises(ShardKeyError, match="512-byte limit"):
        KeyPattern.parse({"x": 1}).check_size({"x": "s" * 1000})


# --------------------------------------------------------------------------- extract


def test_extract_walks_dotted_paths_and_defaults_to_null() -> None:
    kp = KeyPattern.parse({"a.b.c": 1, "x": 1, "a.z": 1})
    doc = {"x": {"y": 1}, "a": {"b": {"c": 7, "d": 0}, "z": None}}
    assert kp.extract(doc) == {"a.b.c": 7, "x": {"y": 1}, "a.z": None}
    assert list(kp.extract(doc)) == ["a.b.c", "x", "a.z"]
    assert kp.extract({}) == {"a.b.c": None, "x": None, "a.z": None}
    assert kp.extract({"a": 5})["a.b.c"] is None  # a path through a scalar is missing
    assert kp.extract({"a": {"b": "str"}})["a.b.c"] is None
    # Missing and explicit null are the same key, as in MongoDB.
    assert kp.encode_doc({"x": None}) == kp.encode_doc({})


def test_extract_hashes_the_hashed_field() -> None:
    kp = KeyPattern.parse({"u.id": "hashed"})
    assert kp.extract({"u": {"id": 1}}) == {"u.id": hash_value(1)}
    assert kp.extract({"u": {"id": 1.0}}) == kp.extract({"u": {"id": 1}})
    assert kp.extract({}) == {"u.id": hash_value(None)}
    assert kp.encode_doc({"u": {"id": "k"}}) == encode_value(hash_value("k"))


@pytest.mark.parametrize(
    "doc",
    [{"a": [1]}, {"a": {"b": []}}, {"a": [{"b": 1}]}, {"a": {"b": [1], "c": 1}}],
)
@pytest.mark.parametrize("spec", [{"a.b": 1}, {"a.b": "hashed"}])
def test_extract_rejects_arrays(doc: dict, spec: dict) -> None:
    kp = KeyPattern.parse(spec)
    with pytest.raises(ShardKeyError, match="shard key values cannot be arrays \\(field 'a.b'\\)"):
        kp.extract(doc)


def test_extract_allows_arrays_nested_in_object_values() -> None:
    kp = KeyPattern.parse({"a": 1})
    assert kp.extract({"a": {"b": [1, 2]}}) == {"a": {"b": [1, 2]}}


def test_extract_rejects_non_documents() -> None:
    with pytest.raises(ShardKeyError, match="document must be an object"):
        KeyPattern.parse({"a": 1}).extract([{"a": 1}])  # type: ignore[arg-type]


# ------------------------------------------------------------- replay's fast paths


@given(st.integers(INT64_MIN, INT64_MAX))
def test_an_exact_int_is_encoded_as_the_general_number_encoding(v):
    from domain.shardkey import _NUMBER, _number_body

    assert encode_value(v) == bytes([_NUMBER]) + _number_body(v)


@pytest.mark.parametrize(
    "v", [0, 1, -1, 2, 2**52, 2**53 - 1, 2**53, 2**53 + 1, -(2**53), -(2**53) - 1, INT64_MAX, INT64_MIN]
)
def test_simple_bound_key_of_an_int_at_the_edges_of_its_one_pack_encodings(v):
    from domain.shardkey import simple_bound_key

    assert simple_bound_key("x", {"x": v}) == KeyPattern.parse({"x": 1}).encode_bound(from_ejson({"x": v}))


_simple_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.text(max_size=4),
    st.sampled_from([{"$minKey": 1}, {"$maxKey": 1}, {"$minKey": 1.0}, {"$maxKey": True}, {"$other": 1}]),
    st.floats(allow_nan=False),
    st.booleans(),
)


@given(st.sampled_from(["x", "y"]), _simple_values)
def test_simple_bound_key_is_encode_bound_of_the_parsed_bound_or_none(name, v):
    from domain.shardkey import simple_bound_key

    bound = {name: v}
    key = simple_bound_key("x", bound)
    if key is not None:
        assert key == KeyPattern.parse({"x": 1}).encode_bound(from_ejson(bound))
    else:  # left to the parser: another field, a value out of range, any other shape
        in_range = type(v) is int and INT64_MIN <= v <= INT64_MAX
        sentinel = type(v) is dict and v in ({"$minKey": 1}, {"$maxKey": 1}) and type(*v.values()) is int
        assert name != "x" or not (in_range or type(v) is str or sentinel)
