"""The wire CRUD commands' pure parts: command document -> client operation record, replies in
the drivers' shapes, session fields and cluster times between BSON and the domain's form."""

from __future__ import annotations

import base64
import uuid

import pytest
from bson import Int64, ObjectId, Timestamp
from bson.binary import Binary
from hypothesis import given
from hypothesis import strategies as st

from domain import clock as vclock
from libs.errors import CommandError
from services.router.wire.commands import WireCommandError, command_error_code, retryable_write_error
from services.router.wire.crud import (
    count_record,
    counted,
    delete_records,
    distinct_record,
    distinct_values,
    find_and_modify_record,
    find_record,
    get_more_record,
    insert_record,
    insert_reply,
    update_records,
)
from services.router.wire.gossip import reply_cluster_time, wire_cluster_time, wire_lsid, wire_read_concern

LSID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _code(exc: pytest.ExceptionInfo[Exception]) -> str | int:
    e = exc.value
    return e.code if isinstance(e, (CommandError, WireCommandError)) else -1


def test_insert_keeps_bson_values_and_converts_the_session_fields():
    oid = ObjectId()
    cmd = {
        "insert": "c",
        "documents": [{"_id": oid, "n": Int64(5)}],
        "ordered": False,
        "lsid": {"id": Binary.from_uuid(LSID)},
        "txnNumber": Int64(7),
        "$db": "app",
    }
    rec = insert_record(cmd)
    assert rec.ns == "app.c" and rec.ordered is False
    assert rec.docs[0]["_id"] is oid  # not JSON-ified: BSON values go through as decoded
    assert rec.lsid == {"id": str(LSID)}
    assert rec.txnNumber == 7 and type(rec.txnNumber) is int


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        ({"insert": "c", "documents": [], "$db": "a"}, 16),  # InvalidLength
        ({"insert": "c", "$db": "a"}, "IDLFailedToParse"),
        ({"insert": "c", "documents": {"_id": 1}, "$db": "a"}, "TypeMismatch"),
        ({"insert": 5, "documents": [{}], "$db": "a"}, "InvalidNamespace"),
    ],
)
def test_malformed_inserts_get_mongodbs_codes(cmd, code):
    with pytest.raises((CommandError, WireCommandError)) as e:
        insert_record(cmd)
    assert _code(e) == code


def test_update_statements_carry_their_batch_index():
    cmd = {
        "update": "c",
        "updates": [
            {"q": {"a": 1}, "u": {"$set": {"b": 1}}},
            {"q": {}, "u": {"x": 1}, "upsert": True},
            {"q": {"a": {"$gt": 1}}, "u": {"$inc": {"n": 1}}, "multi": True},
        ],
        "ordered": False,
        "$db": "app",
    }
    records, ordered = update_records(cmd)
    assert not ordered
    assert [r.stmtId for r in records] == [0, 1, 2]
    assert [(r.multi, r.upsert) for r in records] == [(False, False), (False, True), (True, False)]
    assert records[1].update == {"x": 1}  # a replacement document


@pytest.mark.parametrize(
    ("op", "code"),
    [
        ({"q": {}}, "IDLFailedToParse"),
        ({"u": {}}, "IDLFailedToParse"),
        ({"q": {}, "u": [{"$group": {"_id": 1}}]}, "InvalidOptions"),  # not a stage an update may hold
        ({"q": 1, "u": {}}, "TypeMismatch"),
        ({"q": {}, "u": {"$foo": {"a": 1}}}, "FailedToParse"),  # whatever q matches
        ({"q": {"a": {"$foo": 1}}, "u": {}}, "BadValue"),
        ({"q": {}, "u": {"a": 1}, "multi": True}, "FailedToParse"),  # a replacement of many
        ({"q": {}, "u": {}, "bogus": 1}, "IDLUnknownField"),
        ({"q": {}, "u": {}, "collation": {"locale": "fr"}}, "NotImplemented"),
        ({"q": {}, "u": {}, "sort": {"a": 2}}, "BadValue"),  # a sort is honoured (8.0): a bad one refused
        ({"q": {}, "u": {"$set": {"a.$[x]": 1}}, "arrayFilters": [{"y": 1}]}, "BadValue"),  # no filter for x
        ({"q": {}, "u": {"$set": {"a.$.b.$": 1}}}, "BadValue"),  # two positional $
    ],
)
def test_malformed_update_statements(op, code):
    """Refused: the whole command (its fields), or the statement (its filter or update: a write
    error of that statement, as mongod's)."""
    try:
        records, _ = update_records({"update": "c", "updates": [op], "$db": "a"})
    except CommandError as e:
        assert e.code == code
    else:
        assert isinstance(records[0], CommandError) and records[0].code == code
        assert code in ("FailedToParse", "BadValue", "QueryFeatureNotAllowed", "InvalidOptions")


def test_delete_limit_is_zero_or_one():
    records, _ = delete_records(
        {"delete": "c", "deletes": [{"q": {}, "limit": 0}, {"q": {"a": 1}, "limit": 1}], "$db": "a"}
    )
    assert [(r.multi, r.stmtId) for r in records] == [(True, 0), (False, 1)]
    with pytest.raises(CommandError) as e:
        delete_records({"delete": "c", "deletes": [{"q": {}, "limit": 2}], "$db": "a"})
    assert e.value.code == "FailedToParse"


def test_find_options():
    rec, batch, single = find_record(
        {
            "find": "c",
            "filter": {"a": 1},
            "sort": {"a": -1},
            "skip": Int64(2),
            "limit": 3,
            "projection": {"a": 1},
            "batchSize": 0,
            "singleBatch": True,
            "readConcern": {"afterClusterTime": Timestamp(10, 2)},
            "$db": "app",
        }
    )
    assert (rec.ns, rec.filter, rec.sort, rec.skip, rec.limit, rec.projection) == (
        "app.c",
        {"a": 1},
        {"a": -1},
        2,
        3,
        {"a": 1},
    )
    assert (batch, single) == (0, True)
    assert rec.readConcern == {"afterClusterTime": {"$timestamp": {"t": 10, "i": 2}}}
    rec, batch, _ = find_record({"find": "c", "sort": {}, "$db": "a"})
    assert (rec.sort, batch) == (None, 101)
    for bad in ({"skip": -1}, {"limit": -2}, {"batchSize": -1}):
        with pytest.raises(CommandError) as e:
            find_record({"find": "c", **bad, "$db": "a"})
        assert e.value.code == "BadValue"
    with pytest.raises(CommandError) as e:
        find_record({"find": "c", "filter": [1], "$db": "a"})
    assert e.value.code == "TypeMismatch"


def test_get_more_and_count_and_distinct_records():
    rec, ns = get_more_record({"getMore": Int64(42), "collection": "c", "$db": "a"})
    assert (rec.cursorId, ns) == (42, "a.c") and rec.batchSize > 1000
    rec, _ = get_more_record({"getMore": Int64(42), "collection": "c", "batchSize": 3, "$db": "a"})
    assert rec.batchSize == 3
    count, skip, limit = count_record({"count": "c", "query": {"a": 1}, "skip": 1, "limit": -2, "$db": "a"})
    assert (count.filter, skip, limit) == ({"a": 1}, 1, 2)
    find, key = distinct_record({"distinct": "c", "key": "a.b", "query": {"x": 1}, "$db": "a"})
    assert (find.filter, key) == ({"x": 1}, "a.b")
    with pytest.raises(CommandError):
        distinct_record({"distinct": "c", "$db": "a"})


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000))
def test_count_applies_skip_then_limit(n, skip, limit):
    got = counted(n, skip, limit)
    assert got == len(list(range(n))[skip:][: limit or None])


def test_distinct_values_unwind_arrays_and_use_mongodb_equality():
    docs = [{"a": 1}, {"a": 1.0}, {"a": [2, 1, "x"]}, {"b": 1}, {"a": None}, {"a": {"b": 3}}]
    assert distinct_values(docs, "a") == [None, 1, 2, "x", {"b": 3}]
    assert distinct_values([{"a": {"b": 3}}, {"a": [{"b": 4}]}], "a.b") == [3, 4]


def test_find_and_modify_record():
    rec = find_and_modify_record(
        {
            "findAndModify": "c",
            "query": {"a": 1},
            "sort": {"a": 1},
            "update": {"$inc": {"n": 1}},
            "new": True,
            "upsert": True,
            "fields": {"n": 1},
            "txnNumber": Int64(3),
            "lsid": {"id": Binary.from_uuid(LSID)},
            "$db": "a",
        }
    )
    assert (rec.query, rec.sort, rec.update, rec.new, rec.upsert, rec.fields, rec.txnNumber) == (
        {"a": 1},
        {"a": 1},
        {"$inc": {"n": 1}},
        True,
        True,
        {"n": 1},
        3,
    )
    assert find_and_modify_record({"findandmodify": "c", "remove": True, "$db": "a"}).remove


def test_write_errors_get_mongodbs_numbers():
    reply = insert_reply(
        {
            "inserted": 1,
            "writeErrors": [
                {"index": 1, "code": "DuplicateKey", "errmsg": "E11000 duplicate key"},
                {"index": 2, "code": "DocumentTooLarge", "errmsg": "too big"},
                {"index": 3, "code": "ShardKeyNotFound", "errmsg": "no key"},
            ],
        }
    )
    assert reply == {
        "n": 1,
        "writeErrors": [
            {"index": 1, "code": 11000, "errmsg": "E11000 duplicate key"},
            {"index": 2, "code": 10334, "errmsg": "too big"},
            {"index": 3, "code": 61, "errmsg": "no key"},
        ],
    }
    assert insert_reply({"inserted": 2, "writeErrors": []}) == {"n": 2}
    assert command_error_code("DocumentTooLarge") == (10334, "BSONObjectTooLarge")
    assert command_error_code("ShardUnavailable") == (89, "NetworkTimeout")
    assert command_error_code("NoSuchThing") == (1, "InternalError")


def test_retryable_write_error_labels_only_retryable_writes():
    write = {"insert": "c", "txnNumber": Int64(1)}
    assert retryable_write_error("insert", write, 89)
    assert retryable_write_error("findAndModify", {"findAndModify": "c", "txnNumber": 1}, 11602)
    assert not retryable_write_error("insert", {"insert": "c"}, 89)  # no txnNumber: not retried
    assert not retryable_write_error("insert", write, 11000)  # the statement's own failure
    assert not retryable_write_error("insert", write, 13388)  # StaleConfig after the router's retries
    assert not retryable_write_error("find", {"find": "c", "txnNumber": 1}, 89)
    assert not retryable_write_error("insert", {**write, "autocommit": False}, 89)


def test_lsids_and_read_concern():
    assert wire_lsid({"id": Binary.from_uuid(LSID)}) == {"id": str(LSID)}
    assert wire_lsid({"id": LSID}) == {"id": str(LSID)}
    assert wire_lsid({"id": 5}) == {"id": 5}  # left for the domain to refuse (TypeMismatch)
    assert wire_lsid("x") == "x"
    assert wire_read_concern({"level": "local"}) == {"level": "local"}


@given(
    st.integers(1, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.binary(min_size=20, max_size=20),
    st.integers(0, 2**63 - 1),
)
def test_cluster_time_round_trips_between_bson_and_the_domain(secs, inc, proof, key_id):
    t = vclock.LogicalTime(secs, inc).packed
    signed = {
        "clusterTime": vclock.to_ejson(t),
        "signature": {
            "hash": {"$binary": {"base64": base64.b64encode(proof).decode(), "subType": "00"}},
            "keyId": key_id,
        },
    }
    on_wire = reply_cluster_time(signed)
    assert on_wire["clusterTime"] == Timestamp(secs, inc)
    assert isinstance(on_wire["signature"]["keyId"], Int64)
    back = wire_cluster_time(on_wire)
    assert back == signed
    parsed = vclock.parse_signed_cluster_time(back)
    assert (parsed.time, parsed.key_id, parsed.proof) == (t, key_id, proof)


def test_find_takes_a_hint_by_name_or_key_pattern():
    assert find_record({"find": "c", "hint": "a_1", "$db": "a"})[0].hint == "a_1"
    assert find_record({"find": "c", "hint": {"a": 1}, "$db": "a"})[0].hint == {"a": 1}
    assert find_record({"find": "c", "hint": {}, "$db": "a"})[0].hint is None
    with pytest.raises(CommandError) as e:
        find_record({"find": "c", "hint": 5, "$db": "a"})
    assert e.value.code == "TypeMismatch"
