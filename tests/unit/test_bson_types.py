"""BSON types through the domain (docs/decisions/0016): the record form round trip,
MongoDB's cross-type order (against a reference comparator written from MongoDB's
comparison rules, not from the encoding), hashing, the query engine and sizes."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from decimal import Decimal
from typing import Any

import bson
import pytest
from bson import Binary, Code, DatetimeMS, DBRef, Decimal128, Int64, ObjectId, Regex, Timestamp
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from domain.bsonvalues import RecordFormError, from_record, to_record
from domain.protocol import MAX_DOCUMENT_BYTES, check_document_size, doc_bytes, record_bytes
from domain.query import QueryError, apply_update, compile_filter, sort_key
from domain.shardkey import (
    INT64_MAX,
    INT64_MIN,
    MAX_KEY,
    MIN_KEY,
    KeyPattern,
    compare_values,
    encode_value,
    from_ejson,
    hash_value,
    key_length,
    to_ejson,
)
from libs.errors import CommandError
from schemas import bsonjson

PROPERTY = settings(max_examples=300, deadline=None)
UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)

# ------------------------------------------------------------------ reference ordering

_FLAG_LETTERS = {re.I: "i", re.L: "l", re.M: "m", re.S: "s", re.U: "u", re.X: "x"}


def ref_rank(v: Any) -> int:
    """MongoDB's canonical type order (canonicalizeBSONType)."""
    if isinstance(v, bson.MinKey):
        return 0
    if v is None:
        return 1
    if isinstance(v, bool):
        return 8
    if isinstance(v, (int, float, Decimal128)):
        return 2
    if isinstance(v, Code):  # a str subclass
        return 12 if v.scope is None else 13
    if isinstance(v, str):
        return 3
    if isinstance(v, dict):
        return 4
    if isinstance(v, list):
        return 5
    if isinstance(v, bytes):
        return 6
    if isinstance(v, ObjectId):
        return 7
    if isinstance(v, (datetime.datetime, DatetimeMS)):
        return 9
    if isinstance(v, Timestamp):
        return 10
    if isinstance(v, Regex):
        return 11
    if isinstance(v, bson.MaxKey):
        return 14
    raise TypeError(v)


def cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def exact(v: Any) -> Any:
    """A number as Python compares it exactly (Decimal, int and float mix exactly)."""
    return v.to_decimal() if isinstance(v, Decimal128) else v


def is_nan(v: Any) -> bool:
    x = exact(v)
    return x != x


def millis(v: Any) -> int:
    if isinstance(v, DatetimeMS):
        return int(v)
    return (v - EPOCH) // datetime.timedelta(milliseconds=1)


def ref_compare(a: Any, b: Any) -> int:
    ra, rb = ref_rank(a), ref_rank(b)
    if ra != rb:
        return cmp(ra, rb)
    if ra == 2:  # NaN equals NaN and is below every number; everything else by exact value
        na, nb = is_nan(a), is_nan(b)
        if na or nb:
            return cmp(nb, na)
        return cmp(exact(a), exact(b))
    if ra == 3:
        return cmp(a.encode(), b.encode())
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
    if ra == 6:  # length, then subtype, then bytes
        sa, sb = getattr(a, "subtype", 0), getattr(b, "subtype", 0)
        return cmp((len(a), sa, bytes(a)), (len(b), sb, bytes(b)))
    if ra == 7:
        return cmp(a.binary, b.binary)
    if ra == 8:
        return cmp(a, b)
    if ra in (12, 13):  # the text, then the scope
        c = cmp(str(a).encode(), str(b).encode())
        return c or (ref_compare(a.scope, b.scope) if ra == 13 else 0)
    if ra == 9:  # signed milliseconds
        return cmp(millis(a), millis(b))
    if ra == 10:
        return cmp((a.time, a.inc), (b.time, b.inc))
    if ra == 11:

        def letters(r: Regex[Any]) -> str:
            return "".join(sorted(ch for flag, ch in _FLAG_LETTERS.items() if r.flags & flag))

        return cmp(a.pattern.encode(), b.pattern.encode()) or cmp(letters(a).encode(), letters(b).encode())
    return 0  # MinKey, null, MaxKey


def sign(x: int) -> int:
    return (x > 0) - (x < 0)


# ------------------------------------------------------------------------ strategies


def _decimal(sign_: str, coefficient: int, exponent: int) -> Decimal128:
    return Decimal128(f"{sign_}{coefficient}E{exponent}")


decimals = st.one_of(
    st.builds(_decimal, st.sampled_from(["", "-"]), st.integers(0, 10**34 - 1), st.integers(-6176, 6111)),
    st.builds(_decimal, st.sampled_from(["", "-"]), st.integers(0, 10**6), st.integers(-8, 4)),
    st.integers(INT64_MIN, INT64_MAX).map(lambda n: Decimal128(str(n))),
    st.integers(-(2**70), 2**70).map(lambda n: Decimal128(str(n))),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: Decimal128(repr(f))),  # near a double
    st.sampled_from(["NaN", "-NaN", "Infinity", "-Infinity", "0", "-0", "0E-6176", "1E+6144", "-1E-6176"]).map(
        Decimal128
    ),
)
_near_big = st.builds(
    lambda base, off: min(max(base + off, INT64_MIN), INT64_MAX),
    st.sampled_from([2**53, 2**63 - 1, -(2**53), -(2**63)]),
    st.integers(-600, 600),
)
numbers = st.one_of(
    st.integers(-3, 3),
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(INT64_MIN, INT64_MAX).map(Int64),
    _near_big,
    st.floats(),
    decimals,
)
datetimes = st.datetimes(
    min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31), timezones=st.just(UTC)
).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))  # BSON dates are milliseconds
_DT_MIN_MS, _DT_MAX_MS = (
    millis(datetime.datetime.min.replace(tzinfo=UTC)),
    millis(datetime.datetime.max.replace(tzinfo=UTC)),
)
# DatetimeMS is what a date outside Python's range decodes to (DATETIME_AUTO).
far_dates = st.one_of(
    st.integers(INT64_MIN, _DT_MIN_MS - 1), st.integers(_DT_MAX_MS + 1, INT64_MAX), st.sampled_from([INT64_MIN])
).map(DatetimeMS)
binaries = st.one_of(
    st.binary(max_size=5),  # subtype 0 is bytes
    st.builds(Binary, st.binary(max_size=5), st.sampled_from([1, 2, 3, 5, 0x80])),
    st.builds(lambda b: Binary(b, 4), st.binary(min_size=16, max_size=16)),  # a UUID
)
object_ids = st.one_of(st.binary(min_size=12, max_size=12), st.sampled_from([bytes(12), b"\xff" * 12])).map(ObjectId)
timestamps = st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
codes = st.one_of(
    st.builds(Code, st.text(alphabet="ab\x00", max_size=3)),
    st.builds(Code, st.text(alphabet="ab", max_size=2), st.dictionaries(st.sampled_from("xy"), st.integers(0, 2))),
)
regexes = st.builds(Regex, st.text(alphabet="ab.*é", max_size=3), st.sampled_from(["", "i", "m", "im", "imsx", "u"]))
texts = st.text(alphabet="ab\x00é\U0001f600", max_size=4)
names = st.text(alphabet="ab\x00é", max_size=3)
typed_scalars = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    texts,
    binaries,
    object_ids,
    datetimes,
    far_dates,
    timestamps,
    regexes,
    codes,
    st.sampled_from([MIN_KEY, MAX_KEY]),
)
values = st.recursive(
    typed_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(names, children, max_size=3)),
    max_leaves=6,
)
# Documents BSON can hold: no NUL in field names.
bson_values = st.recursive(
    typed_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(alphabet="ab_é", max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)
# Plain JSON, as today's records hold it: no "$" field names, finite floats.
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(INT64_MIN, INT64_MAX),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(alphabet="ab_é.", max_size=3), children, max_size=3),
    ),
    max_leaves=8,
)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types at every depth (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal128):  # the digits and exponent too; NaN's sign is not kept (Extended JSON has none)
        return a.bid == b.bid or (a.to_decimal().is_nan() and b.to_decimal().is_nan())
    return bool(a == b)


def contains_nan(v: Any) -> bool:
    if isinstance(v, dict):
        return any(contains_nan(x) for x in v.values())
    if isinstance(v, list):
        return any(contains_nan(x) for x in v)
    return isinstance(v, (float, Decimal128)) and is_nan(v)


# ---------------------------------------------------------------------- record form


@PROPERTY
@given(values)
def test_record_round_trip_is_the_identity(v: Any) -> None:
    record = json.loads(json.dumps(to_record(v)))  # what a Kafka record carries
    assert same(from_record(record), v)


@PROPERTY
@given(json_values)
def test_plain_json_is_its_own_record_form(v: Any) -> None:
    assert json.dumps(to_record(v)) == json.dumps(v)
    assert same(from_record(json.loads(json.dumps(v))), v)


@PROPERTY
@given(st.dictionaries(st.text(alphabet="ab_é", max_size=3), bson_values, max_size=4))
def test_record_form_keeps_bson_bytes(doc: dict[str, Any]) -> None:
    assume(not contains_nan(doc))  # a NaN's sign and payload are not kept (Extended JSON has one NaN)
    # What pymongo wrote comes back byte for byte: every type, int32/int64/double kept.
    assert bson.encode(from_record(json.loads(json.dumps(to_record(doc))))) == bson.encode(doc)


def test_record_form_of_each_type() -> None:
    oid = ObjectId("0102030405060708090a0b0c")
    doc = {
        "_id": oid,
        "i": 1,
        "l": Int64(1),
        "f": 1.0,
        "d": Decimal128("1.10"),
        "t": datetime.datetime(2026, 11, 24, 5, 0, 0, 123000, tzinfo=UTC),
        "ts": Timestamp(7, 8),
        "b": b"\x01",
        "u": Binary(bytes(16), 4),
        "r": Regex("^a", "i"),
        "lo": MIN_KEY,
        "ref": DBRef("c", Int64(3)),
    }
    assert to_record(doc) == {
        "_id": {"$oid": "0102030405060708090a0b0c"},
        "i": 1,
        "l": {"$numberLong": "1"},
        "f": 1.0,
        "d": {"$numberDecimal": "1.10"},
        "t": {"$date": "2026-11-24T05:00:00.123Z"},
        "ts": {"$timestamp": {"t": 7, "i": 8}},
        "b": {"$binary": {"base64": "AQ==", "subType": "00"}},
        "u": {"$binary": {"base64": "AAAAAAAAAAAAAAAAAAAAAA==", "subType": "04"}},
        "r": {"$regularExpression": {"pattern": "^a", "options": "i"}},
        "lo": {"$minKey": 1},
        "ref": {"$ref": "c", "$id": {"$numberLong": "3"}},
    }
    back = from_record(to_record(doc))
    assert same(back, doc)
    assert back["lo"] is MIN_KEY  # the domain's sentinel, which services compare by identity


def test_record_form_errors() -> None:
    with pytest.raises(RecordFormError, match="set"):
        to_record({"x": {1}})
    with pytest.raises(RecordFormError, match="field names"):
        to_record({1: 2})
    with pytest.raises(RecordFormError, match="ObjectId"):
        from_record({"x": {"$oid": "zz"}})
    with pytest.raises(RecordFormError, match="minKey"):
        from_record({"x": {"$minKey": 2}})


def test_the_schemas_codec_gives_bson_keys_and_the_domain_its_sentinels() -> None:
    record = {"lo": {"$minKey": 1}, "hi": [{"$maxKey": 1}]}
    plain = bsonjson.from_record(record)
    assert type(plain["lo"]) is bson.MinKey and type(plain["hi"][0]) is bson.MaxKey
    assert from_ejson(plain) == {"lo": MIN_KEY, "hi": [MAX_KEY]}  # what services do with bounds
    assert from_record(record)["lo"] is MIN_KEY and from_record(record)["hi"][0] is MAX_KEY


def test_stored_chunk_bounds_read_the_same() -> None:
    # Bounds in today's records ({"$minKey": 1}, plain numbers and strings).
    for bound in ({"x": {"$minKey": 1}}, {"x": {"$maxKey": 1}}, {"x": 5, "y": "a"}, {"h": -(2**62)}):
        assert from_record(bound) == from_ejson(bound)
        assert to_record(from_record(bound)) == to_ejson(from_ejson(bound)) == bound


def test_bson_min_and_max_keys_are_the_domain_sentinels() -> None:
    assert MIN_KEY == bson.MinKey() and hash(MIN_KEY) == hash(bson.MinKey())
    assert MAX_KEY == bson.MaxKey() and hash(MAX_KEY) == hash(bson.MaxKey())
    assert from_ejson({"a": [bson.MinKey(), bson.MaxKey()]}) == {"a": [MIN_KEY, MAX_KEY]}
    assert from_ejson(bson.MinKey()) is MIN_KEY
    assert bson.decode(bson.encode({"a": MIN_KEY, "b": MAX_KEY})) == {"a": bson.MinKey(), "b": bson.MaxKey()}
    assert encode_value(bson.MinKey()) == encode_value(MIN_KEY)
    assert encode_value(bson.MaxKey()) == encode_value(MAX_KEY)


# ------------------------------------------------------------------------- ordering


@PROPERTY
@given(values, values)
def test_encoding_order_is_mongodb_order(a: Any, b: Any) -> None:
    assert sign(compare_values(a, b)) == ref_compare(a, b)


@PROPERTY
@given(st.lists(typed_scalars, min_size=2, max_size=2), st.lists(typed_scalars, min_size=2, max_size=2))
def test_compound_keys_order_like_tuples(a: list[Any], b: list[Any]) -> None:
    # Concatenations stay ordered although a decimal may extend a number's encoding.
    pattern = KeyPattern.parse({"x": 1, "y": 1})
    ea = pattern.encode_bound({"x": a[0], "y": a[1]})
    eb = pattern.encode_bound({"x": b[0], "y": b[1]})
    assert sign(cmp(ea, eb)) == (ref_compare(a[0], b[0]) or ref_compare(a[1], b[1]))


@PROPERTY
@given(numbers, numbers)
def test_number_order_across_int_long_double_decimal(a: Any, b: Any) -> None:
    assert sign(compare_values(a, b)) == ref_compare(a, b)
    assert (encode_value(a) == encode_value(b)) == (ref_compare(a, b) == 0)


@PROPERTY
@given(st.lists(values, max_size=6), st.sampled_from([1, -1]))
def test_sort_key_follows_mongodb_order_both_ways(vs: list[Any], direction: int) -> None:
    # A top-level array sorts by its smallest or largest element, not as a value (test_query.py).
    docs = [{"k": v} for v in vs if not isinstance(v, list)]
    ordered = [d["k"] for d in sorted(docs, key=sort_key({"k": direction}))]
    for x, y in zip(ordered, ordered[1:]):
        assert ref_compare(x, y) * direction <= 0


def test_decimal_encodings_extend_the_equal_numbers() -> None:
    for n in (0, 1, -1, 5, 2**53 + 1, INT64_MAX, INT64_MIN):
        assert encode_value(Decimal128(str(n))) == encode_value(n) == encode_value(Int64(n))
    for f in (0.5, -0.25, 2.0**100, float("inf"), float("-inf")):  # doubles of at most 34 digits
        assert encode_value(Decimal128(Decimal(f))) == encode_value(f)
    assert encode_value(Decimal128("NaN")) == encode_value(float("nan"))
    assert encode_value(Decimal128("-0")) == encode_value(0.0) == encode_value(-0.0)
    # exact value, as MongoDB compares a decimal with a double
    assert compare_values(Decimal128("0.1"), 0.1) < 0 < compare_values(Decimal128("0.3"), 0.1 + 0.2) + 2
    assert compare_values(Decimal128("1E+400"), float("inf")) < 0 < compare_values(Decimal128("1E+400"), 1.7e308)
    assert compare_values(0.0, Decimal128("1E-6176")) < 0 < compare_values(0.0, Decimal128("-1E-6176"))


def test_type_order_of_one_value_each() -> None:
    ordered = [
        MIN_KEY,
        None,
        Decimal128("-Infinity"),
        Int64(1),
        "a",
        {},
        [],
        b"",
        Binary(b"\x00", 0x80),
        ObjectId(bytes(12)),
        False,
        True,
        DatetimeMS(INT64_MIN),
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime.datetime(1970, 1, 1, tzinfo=UTC),
        Timestamp(0, 0),
        Timestamp(0, 1),
        Timestamp(1, 0),
        Regex(""),
        Regex("a"),
        Regex("a", "i"),
        Code(""),
        Code("a"),
        Code("", {}),
        Code("", {"a": 1}),
        MAX_KEY,
    ]
    encodings = [encode_value(v) for v in ordered]
    assert encodings == sorted(encodings) and len(set(encodings)) == len(encodings)


def test_existing_encodings_keep_their_bytes() -> None:
    # Golden bytes: chunk bounds and store keys written before BSON types must not move.
    assert encode_value(1) == bytes.fromhex("30bff00000000000008000")
    assert encode_value(INT64_MAX) == bytes.fromhex("30c3e00000000000007fff")
    assert encode_value("ab") == bytes.fromhex("4061620000")
    assert encode_value({"a": [None, True]}) == bytes.fromhex("50606100002070010000")
    assert encode_value(MIN_KEY) == b"\x10" and encode_value(MAX_KEY) == b"\xf0"
    assert hash_value(1) == int.from_bytes(
        hashlib.md5(bytes.fromhex("30bff00000000000008000")).digest()[:8], "little", signed=True
    )


def test_a_naive_datetime_is_utc() -> None:
    naive = datetime.datetime(2020, 1, 1)
    assert encode_value(naive) == encode_value(naive.replace(tzinfo=UTC)) == encode_value(DatetimeMS(naive))


def test_dbref_compares_as_its_object() -> None:
    ref = DBRef("c", 5)
    assert encode_value(ref) == encode_value({"$ref": "c", "$id": 5})


# -------------------------------------------------------------------------- hashing


@pytest.mark.parametrize(
    ("value", "expected"),
    [  # MongoDB's src/mongo/db/hasher_test.cpp (BSONElementHasher::hash64, seed 0)
        (ObjectId("010203040506070809101112"), -5588663249627035708),
        (ObjectId("000000000000000000000000"), -4293118519463489418),
        (bytes([0, 1, 2, 3, 4, 6]), 7252465090394235301),  # BinDataGeneral
        (Binary(bytes([0, 1, 2, 3, 4, 6]), 0x80), 5736670452907618262),  # bdtCustom
        (Binary(bytes(range(16)), 4), 6084661258071355978),  # newUUID
        (DatetimeMS(0x5566778811223344), 4476222765095560467),
        (datetime.datetime(1970, 1, 1, tzinfo=UTC), -1178696894582842035),
        (Regex("mongodb"), -7275792090268217043),
        (Regex(".*", "i"), 7095855029187981886),
        (Code("func f() { return 1; }"), 6861638109178014270),
    ],
)
def test_new_types_hash_as_mongodb(value: Any, expected: int) -> None:
    assert hash_value(value) == expected


def test_timestamps_hash_with_their_own_canonical_type() -> None:
    # Not checked against a MongoDB server: the published vector predates Timestamp's
    # canonical type 47 (MongoDB 3.0) and hashes it as a date (45).  We use 47.
    assert hash_value(Timestamp(0x55667788, 0x11223344)) != hash_value(DatetimeMS(0x5566778811223344))


@PROPERTY
@given(values, values)
def test_equal_values_hash_equal(a: Any, b: Any) -> None:
    if compare_values(a, b) == 0:
        assert hash_value(a) == hash_value(b)


@PROPERTY
@given(st.integers(INT64_MIN, INT64_MAX))
def test_numbers_of_every_type_hash_alike(n: int) -> None:
    assert hash_value(n) == hash_value(Int64(n)) == hash_value(Decimal128(str(n)))


def test_hashed_bounds_accept_int64() -> None:
    pattern = KeyPattern.parse({"h": "hashed"})
    assert pattern.validate_bound({"h": Int64(-5)}) == {"h": -5}
    key = pattern.extract({"h": ObjectId("010203040506070809101112")})
    assert key == {"h": -5588663249627035708}


# --------------------------------------------------------------------- query engine


def test_filters_on_typed_values() -> None:
    oid, later = ObjectId("0102030405060708090a0b0c"), datetime.datetime(2026, 1, 1, tzinfo=UTC)
    docs = [
        {"_id": oid, "at": later, "n": Int64(5)},
        {"_id": "0102030405060708090a0b0c", "at": "2026-01-01", "n": Decimal128("5.0")},
        {"_id": 1, "at": DatetimeMS(0), "n": 5.5},
    ]

    def ids(flt: dict[str, Any]) -> list[Any]:
        m = compile_filter(flt)
        return [d["_id"] for d in docs if m.matches(d)]

    assert ids({"_id": oid}) == [oid]  # an ObjectId is not its hex string
    assert ids({"_id": {"$gt": ObjectId(bytes(12))}}) == [oid]  # only ObjectIds
    assert ids({"at": {"$gte": EPOCH}}) == [oid, 1]  # only dates, DatetimeMS and datetime alike
    assert ids({"at": {"$lt": "9"}}) == ["0102030405060708090a0b0c"]
    assert ids({"n": 5}) == [oid, "0102030405060708090a0b0c"]  # 5 == Int64(5) == Decimal128("5.0")
    assert ids({"n": {"$gt": Decimal128("5.4999")}}) == [1]
    assert ids({"n": {"$in": [Decimal128("5.5"), "x"]}}) == [1]
    assert compile_filter({"at": {"$gt": later}}).bounds_on("at") == (later, False, Timestamp(0, 0), False)


def test_code_is_not_a_string() -> None:
    m = compile_filter({"f": "x"})
    assert m.matches({"f": "x"}) and not m.matches({"f": Code("x")})
    assert compile_filter({"f": {"$gte": Code("")}}).matches({"f": Code("x")})
    assert not compile_filter({"f": {"$gte": Code("")}}).matches({"f": Code("x", {})})


def test_regex_values() -> None:
    docs = [{"r": Regex("^a", "i")}, {"r": "abc"}]
    assert [compile_filter({"r": {"$eq": Regex("^a", "i")}}).matches(d) for d in docs] == [True, False]
    # elsewhere a regex matches as a pattern: strings it matches, and a stored regex equal to it
    for flt in ({"r": Regex("^a")}, {"r": {"$in": [Regex("^a")]}}):
        assert [compile_filter(flt).matches(d) for d in docs] == [False, True]
    assert compile_filter({"r": Regex("^a", "i")}).matches(docs[0])
    with pytest.raises(QueryError, match="Can't have regex as arg to \\$ne"):
        compile_filter({"r": {"$ne": Regex("^a")}})


@pytest.mark.parametrize(
    ("start", "by", "result"),
    [
        (1, 2, 3),
        (2**31 - 1, 1, Int64(2**31)),  # int32 overflow widens to int64
        (-(2**31), -1, Int64(-(2**31) - 1)),
        (Int64(1), 1, Int64(2)),  # a long stays a long
        (1, Int64(1), Int64(2)),
        (2**40, -(2**40), Int64(0)),  # an int beyond int32 is a long in BSON
        (1, 0.5, 1.5),
        (Int64(1), 1.0, 2.0),
        (Decimal128("1"), 1, Decimal128("2")),
        (1, Decimal128("0.10"), Decimal128("1.10")),
        (Decimal128("1"), 0.1, Decimal128("1.100000000000000")),  # the double as 15 digits
        (Decimal128("0"), 1.0, Decimal128("1.00000000000000")),  # exactly 15, trailing zeros kept
        (Decimal128("0"), 123456.789, Decimal128("123456.789000000")),
        (Decimal128("0"), 1e-20, Decimal128("1.00000000000000E-20")),
        (Decimal128("1"), 0.0, Decimal128("1")),  # zero is not quantized
        (Decimal128("9.999999999999999999999999999999999E+6144"), Decimal128("1E+6144"), Decimal128("Infinity")),
    ],
)
def test_inc_widens_as_mongodb(start: Any, by: Any, result: Any) -> None:
    out = apply_update({"_id": 1, "n": start}, {"$inc": {"n": by}})["n"]
    assert same(out, result)


def test_inc_refuses_int64_overflow_and_non_numbers() -> None:
    with pytest.raises(QueryError, match="overflows"):
        apply_update({"n": Int64(INT64_MAX)}, {"$inc": {"n": 1}})
    with pytest.raises(QueryError, match="non-numeric"):
        apply_update({"n": EPOCH}, {"$inc": {"n": 1}})
    with pytest.raises(QueryError, match="non-numeric argument"):
        apply_update({"n": 1}, {"$inc": {"n": ObjectId()}})


def test_set_and_id_immutability_with_typed_values() -> None:
    oid = ObjectId()
    doc = {"_id": oid, "a": 1}
    out = apply_update(doc, {"$set": {"at": EPOCH, "d": Decimal128("1.5")}})
    assert same(out, {"_id": oid, "a": 1, "at": EPOCH, "d": Decimal128("1.5")})
    with pytest.raises(QueryError, match="immutable"):
        apply_update(doc, {"$set": {"_id": str(oid)}})
    assert apply_update(doc, {"$set": {"_id": ObjectId(str(oid))}})["_id"] == oid


# ---------------------------------------------------------------------------- sizes


def test_doc_bytes_is_bson_bytes() -> None:
    doc = {"_id": ObjectId(), "at": EPOCH, "n": Int64(1), "s": "é"}
    assert doc_bytes(doc) == len(bson.encode(doc))
    assert doc_bytes({"a": 1}) == 12  # int32: 4 + 1 + 2 + 4 + 1


def test_record_bytes_of_plain_json_is_its_compact_json() -> None:
    doc = {"_id": 1, "a": [1.5, "x", None, True], "b": {"c": "é"}}
    assert record_bytes(doc) == len(json.dumps(doc, separators=(",", ":")).encode())


def test_a_document_bson_cannot_hold_is_measured_by_its_record_form() -> None:
    doc = {"big": 2**70}
    assert doc_bytes(doc) == record_bytes(doc)


def test_the_16_mb_limit_is_in_bson_bytes() -> None:
    # JSON escapes a control character in 6 bytes, BSON stores it in 1: under the limit in BSON.
    doc = {"s": "\x01" * (MAX_DOCUMENT_BYTES - 100)}
    assert record_bytes(doc) > MAX_DOCUMENT_BYTES >= doc_bytes(doc)
    check_document_size(doc)
    with pytest.raises(CommandError):
        check_document_size({"b": bytes(MAX_DOCUMENT_BYTES)})


@given(values)
@settings(max_examples=100, deadline=None)
def test_every_value_encodes_and_sizes(v: Any) -> None:
    assume(not isinstance(v, (dict, list)) or v)
    encode_value(v)
    doc_bytes({"v": v})


def test_type_names_are_mongodbs_aliases():
    import datetime as dt

    from bson import Binary, Decimal128, Int64, ObjectId, Regex, Timestamp

    from domain.bsonvalues import type_name

    cases = [
        (None, "null"),
        (True, "bool"),
        (1, "int"),
        (2**31, "long"),
        (Int64(1), "long"),
        (1.5, "double"),
        ("s", "string"),
        (ObjectId(), "objectId"),
        (dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "date"),
        (Decimal128("1"), "decimal"),
        (Timestamp(1, 1), "timestamp"),
        (Regex("a"), "regex"),
        (Binary(b"x", 4), "binData"),
    ]
    for value, name in cases:
        assert type_name(value) == name, value
    assert type_name({}) == "object" and type_name([]) == "array"


# ------------------------------------------------------------------ key_length


@PROPERTY
@given(st.lists(values, min_size=1, max_size=4))
def test_key_length_splits_a_concatenation_of_encodings(vs: list) -> None:
    """A migration's donor splits stored keys (shard key values, then _id) by `key_length`
    alone: it must find every encoding's end, whatever the types (decimals continue a
    number's encoding with 0xFF, strings escape NUL)."""
    parts = [encode_value(v) for v in vs]
    key = b"".join(parts)
    at = 0
    for part in parts:
        assert key_length(key, at) == len(part)
        at += len(part)
    assert at == len(key)


def test_key_length_refuses_what_is_no_encoding() -> None:
    for bad in (b"", b"\x30\x00", b"\x40ab", b"\x01", b"\x50\x30"):
        with pytest.raises(ValueError):
            key_length(bad)
