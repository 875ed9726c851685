"""BSON values through the records of the data path (docs/decisions/0016): a document of any
BSON types survives a client request, a shard request, the changelog, a shard's store, a
migration's transfer batch, a retryable write's image and a reply, with the same types; records
and stores written before BSON types read back unchanged; sizes are measured in BSON bytes and
records leave room for the Extended JSON of a 16 MB document."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, ObjectId, Regex, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import protocol
from domain.protocol import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_RECORD_BYTES, check_document_size, record_bytes
from domain.shardkey import MAX_KEY, MIN_KEY, KeyPattern, from_ejson, to_ejson
from libs.errors import CommandError
from libs.ids import new_hex_id, new_object_id
from libs.kafka import MAX_RECORD_BYTES
from libs.topics import LARGE_RECORDS
from schemas import Codec, RecordError
from schemas import config as c
from schemas import reply as r
from schemas import shard as s
from schemas.bsonjson import from_record
from services.shard.documents import decode_doc, encode_doc
from tests.unit.test_bson_types import bson_values, json_values, values

PROPERTY = settings(max_examples=200, deadline=None)
UTC = datetime.UTC

EVERY_TYPE: dict[str, Any] = {
    "_id": ObjectId("65a1b2c3d4e5f60718293a4b"),
    "k": 5,
    "i32": -7,
    "i64": Int64(2**40),
    "small_long": Int64(5),
    "big_int": 2**62,
    "dbl": 1.5,
    "whole_dbl": 2.0,
    "dec": Decimal128("1.10"),
    "date": datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    "old_date": datetime.datetime(1901, 1, 1, tzinfo=UTC),
    "bytes": b"\x00\x01\xff",
    "uuid": Binary(bytes(range(16)), 4),
    "user_bin": Binary(b"xy", 0x80),
    "ts": Timestamp(1_700_000_000, 3),
    "re": Regex("^a.c", "im"),
    "code": Code("function () { return 1; }"),
    "min": bson.MinKey(),
    "max": bson.MaxKey(),
    "null": None,
    "bool": False,
    "str": "é\x01\u2028",
    "nested": {"a": [ObjectId("000000000000000000000001"), {"d": Int64(-1)}], "b": {"c": Decimal128("-0")}},
    "looks_like_a_number": "NaN",
}


def same(a: Any, b: Any) -> bool:
    """Equal with the same types at every depth (NaN equals NaN); MinKey / MaxKey by kind (a
    record decodes them as bson's, a shard's store as the domain's subclass)."""
    if isinstance(a, (bson.MinKey, bson.MaxKey)):
        return isinstance(b, bson.MinKey if isinstance(a, bson.MinKey) else bson.MaxKey)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, Decimal128):  # digits and exponent too; a NaN's sign is not kept
        return a.bid == b.bid or (a.to_decimal().is_nan() and b.to_decimal().is_nan())
    return bool(a == b)


def through(codec: Codec[Any], record: Any) -> Any:
    """A record as another service reads it: encoded, then decoded."""
    return codec.decode(Codec.encode(record))


# ------------------------------------------------------------------ record round trips


@PROPERTY
@given(st.dictionaries(st.text(alphabet="ab_é$.", max_size=3), values, max_size=4))
def test_a_document_of_any_types_survives_every_record_of_the_data_path(doc: dict[str, Any]) -> None:
    doc = {"_id": new_object_id(), **doc}
    got = through(s.requests, s.Insert(ns="d.c", docs=[doc, doc]))
    assert all(same(d, doc) for d in got.docs)
    got = through(s.changelog, s.DocumentWritten(ns="d.c", skey="00", doc=doc))
    assert same(got.doc, doc)
    got = through(s.changelog, s.DocumentRemoved(ns="d.c", skey="00", id=doc["_id"]))
    assert same(got.id, doc["_id"])
    batch = s.TransferBatch(id="m", phase="clone", written=[{"skey": "00", "doc": doc}], removed=[{"id": doc["_id"]}])
    got = through(s.requests, batch)
    assert same(got.written[0]["doc"], doc) and same(got.removed[0]["id"], doc["_id"])
    stmt = s.Statement(stmtId=0, ns="d.c", result={"n": 1, "upserted": doc["_id"]}, image=doc)
    got = through(
        s.changelog, s.RetryableWriteRecorded(lsid="x", txnNumber=1, part="p", statements=[stmt], lastWriteAt=0)
    )
    assert same(got.statements[0].image, doc) and same(got.statements[0].result["upserted"], doc["_id"])
    # A reply carries its result in record form; the router and the client read it back.
    reply = through(r.replies, r.Reply(ok=True, result={"docs": [doc], "cursorId": 0}))
    assert same(from_record(reply.result)["docs"][0], doc)


@PROPERTY
@given(st.dictionaries(st.text(alphabet="ab_é", max_size=3), bson_values, max_size=4))
def test_filters_updates_and_queries_keep_their_values(doc: dict[str, Any]) -> None:
    flt = {"$and": [doc, {"x": {"$in": list(doc.values())}}]}
    got = through(s.requests, s.Find(ns="d.c", filter=flt, sort={"k": -1}, projection={"a": 1}))
    assert same(got.filter, flt)
    got = through(s.requests, s.Update(ns="d.c", filter=doc, update={"$set": doc}, upsert=True))
    assert same(got.filter, doc) and same(got.update, {"$set": doc})
    got = through(s.requests, s.FindAndModify(ns="d.c", query=doc, update=doc, fields={"_id": 0}))
    assert same(got.query, doc) and same(got.update, doc)
    got = through(s.requests, s.Count(ns="d.c", filter=doc))
    assert same(got.filter, doc)


def test_every_type_by_name() -> None:
    got = through(s.changelog, s.DocumentWritten(ns="d.c", skey="00", doc=EVERY_TYPE))
    assert same(got.doc, EVERY_TYPE)
    assert type(got.doc["small_long"]) is Int64 and type(got.doc["i32"]) is int and type(got.doc["whole_dbl"]) is float
    raw = json.loads(Codec.encode(s.DocumentWritten(ns="d.c", skey="00", doc=EVERY_TYPE)))
    assert raw["doc"]["_id"] == {"$oid": "65a1b2c3d4e5f60718293a4b"}
    assert raw["doc"]["date"] == {"$date": "2024-01-02T03:04:05.678Z"}
    assert raw["doc"]["small_long"] == {"$numberLong": "5"} and raw["doc"]["i32"] == -7
    # Stored by a shard and read back: the same types (MinKey/MaxKey as the domain's).
    assert same(decode_doc(encode_doc(EVERY_TYPE)), EVERY_TYPE)
    assert decode_doc(encode_doc(EVERY_TYPE))["min"] is MIN_KEY


def test_records_built_in_python_keep_the_values_they_were_given() -> None:
    # A router forwards what it decoded: building a record does not parse Extended JSON again.
    doc = {"_id": ObjectId(), "w": {"$oid": "not one"}}  # a filter-like value stays a dict in memory
    assert s.Insert(ns="d.c", docs=[doc]).docs[0] is doc


# ------------------------------------------------------------------ what was stored before


OLD_CHANGELOG = (
    b'{"type":"DocumentWritten","v":1,"ts":null,"ns":"d.c","skey":"3000","doc":'
    b'{"_id":"65a1b2c3d4e5f60718293a4b","k":1,"f":2.5,"big":9007199254740993,"a":[null,true,"x"],'
    b'"o":{"y":{}}}}'
)
OLD_MIGRATION = (
    b'{"type":"MigrationRecorded","v":1,"id":"m1","role":"donor","ns":"d.c","epoch":"e",'
    b'"min":{"k":{"$minKey":1}},"max":{"k":10},"peer":"s1","state":"cloning","decision":null,"cloned":0,"mods":0}'
)


def test_records_written_before_bson_types_decode_the_same_and_encode_byte_for_byte() -> None:
    ev = s.changelog.decode(OLD_CHANGELOG)
    assert ev.doc == json.loads(OLD_CHANGELOG)["doc"]
    assert same(ev.doc, json.loads(OLD_CHANGELOG)["doc"])  # an ObjectId-like string stays a string
    assert Codec.encode(ev) == OLD_CHANGELOG
    mig = s.changelog.decode(OLD_MIGRATION)
    assert mig.min == {"k": {"$minKey": 1}}  # bounds stay Extended JSON in memory, as before
    assert Codec.encode(mig) == OLD_MIGRATION
    assert from_ejson(mig.min) == {"k": MIN_KEY}


@PROPERTY
@given(st.dictionaries(st.text(alphabet="ab_é.", max_size=3), json_values, max_size=4))
def test_a_plain_json_document_is_stored_as_before(doc: dict[str, Any]) -> None:
    old = json.dumps(doc, separators=(",", ":")).encode()  # a shard's store before BSON types
    assert encode_doc(doc) == old
    assert same(decode_doc(old), doc)


def test_a_wrapper_where_a_document_belongs_is_a_dead_letter_not_a_crash() -> None:
    raw = b'{"type":"Insert","v":1,"ns":"d.c","docs":[{"$oid":"65a1b2c3d4e5f60718293a4b"}]}'
    with pytest.raises(RecordError, match="document"):
        s.requests.decode(raw)
    with pytest.raises(RecordError, match="Extended JSON"):
        s.requests.decode(b'{"type":"Insert","v":1,"ns":"d.c","docs":[{"_id":{"$oid":"zz"}}]}')


# ------------------------------------------------------------------ bounds and shard keys


def test_typed_bounds_travel_in_config_records_and_read_back_typed() -> None:
    oid, when = ObjectId("65a1b2c3d4e5f60718293a4b"), datetime.datetime(2024, 5, 1, tzinfo=UTC)
    bound = {"o": oid, "t": when, "l": Int64(3)}
    ejson = to_ejson(bound)
    assert ejson == {"o": {"$oid": str(oid)}, "t": {"$date": "2024-05-01T00:00:00Z"}, "l": {"$numberLong": "3"}}
    cmd = c.commands.decode(Codec.encode(c.SplitChunk(ns="d.c", at=[bound])))
    assert same(from_ejson(cmd.at[0]), bound)  # BSON values given to a bound are written as Extended JSON
    pattern = KeyPattern.parse({"o": 1, "t": 1, "l": 1})
    assert pattern.encode_bound(from_ejson(ejson)) == pattern.encode_bound(bound)
    assert from_ejson({"k": {"$maxKey": 1}, "j": bson.MinKey()}) == {"k": MAX_KEY, "j": MIN_KEY}
    assert from_ejson({"k": {"$maxKey": 1}})["k"] is MAX_KEY


# ------------------------------------------------------------------ ids


def test_new_ids() -> None:
    assert isinstance(new_object_id(), ObjectId) and new_object_id() != new_object_id()
    assert len(new_hex_id()) == 24 and int(new_hex_id(), 16) >= 0  # epochs stay strings


# ------------------------------------------------------------------ sizes


def test_the_document_limit_is_in_bson_bytes() -> None:
    # Just under 16 MB of BSON is accepted although its JSON (every byte escaped) is 6x larger.
    filler = "\x01" * (MAX_DOCUMENT_BYTES - 64)
    doc = {"_id": 1, "s": filler}
    assert len(bson.encode(doc)) <= MAX_DOCUMENT_BYTES
    check_document_size(doc)
    n = record_bytes(doc)
    assert MAX_DOCUMENT_BYTES * 5 < n <= MAX_DOCUMENT_RECORD_BYTES
    # ... and its record, with an envelope, fits a Kafka record.
    assert len(Codec.encode(s.DocumentWritten(ns="d.c", skey="00" * 256, doc=doc))) <= MAX_RECORD_BYTES
    # One byte more of BSON is refused, with MongoDB's BSONObjectTooLarge number.
    with pytest.raises(CommandError) as e:
        check_document_size({"_id": 1, "s": "a" * (MAX_DOCUMENT_BYTES - 16)})
    assert e.value.code == "DocumentTooLarge" and protocol.ErrorCode.DocumentTooLarge.number == 10334


def test_a_document_whose_record_form_would_not_fit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny typed values grow the most as Extended JSON (a regex: 4 bytes of BSON, ~50 of JSON).
    doc = {f"\x01{i:03}": Regex("") for i in range(100)}
    assert record_bytes(doc) > 7 * len(bson.encode(doc))
    monkeypatch.setattr(protocol, "MAX_DOCUMENT_BYTES", len(bson.encode(doc)))
    monkeypatch.setattr(protocol, "MAX_DOCUMENT_RECORD_BYTES", 6 * len(bson.encode(doc)))
    with pytest.raises(CommandError, match="as Extended JSON") as e:
        check_document_size(doc)
    assert e.value.code == "DocumentTooLarge"


def test_kafka_limits_agree() -> None:
    assert int(LARGE_RECORDS["max.message.bytes"]) == MAX_RECORD_BYTES
    # One document's record form, a migration clone batch of others (2 MiB) and the envelope fit.
    assert MAX_DOCUMENT_RECORD_BYTES + 2 * 1024 * 1024 + 64 * 1024 <= MAX_RECORD_BYTES
    assert MAX_RECORD_BYTES < 100 * 1024 * 1024  # the brokers' default socket.request.max.bytes
