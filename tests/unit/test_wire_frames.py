"""The wire codec (services/router/wire/frames.py): frames pymongo builds parse, frames we
build parse back, every malformed frame is a ProtocolError (and says whether to close)."""

from __future__ import annotations

import struct
import zlib

import bson
import pytest
from bson import Decimal128, Int64, MaxKey, MinKey, ObjectId
from bson.binary import Binary
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import message as pymongo_message
from pymongo.read_preferences import ReadPreference

from services.router.wire import frames as f

# ------------------------------------------------------------------ CRC-32C


def test_crc32c_matches_the_standard_check_value():
    # RFC 3720 (iSCSI) / the CRC catalogue's check value for CRC-32C.
    assert f.crc32c(b"123456789") == 0xE3069283
    assert f.crc32c(b"") == 0


# ------------------------------------------------------------------ OP_MSG


def test_op_msg_round_trips_with_sequences_and_bson_types():
    oid = ObjectId()
    doc = {
        "insert": "c",
        "$db": "test",
        "n": Int64(5),
        "d": Decimal128("1.10"),
        "b": Binary(b"\x00\x01", 4),
        "lo": MinKey(),
        "hi": MaxKey(),
    }
    seq = [{"_id": oid, "x": 1.5}, {"_id": 2, "x": 2**40}]
    for checksum in (False, True):
        frame = f.build_op_msg(7, 0, doc, sequences={"documents": seq}, checksum=checksum)
        header, msg = f.parse_reply(frame)
        assert header == f.Header(len(frame), 7, 0, f.OP_MSG)
        assert isinstance(msg, f.OpMsg)
        assert msg.body == doc and msg.sequences == {"documents": seq}
        assert type(msg.body["n"]) is Int64 and isinstance(msg.body["b"], Binary) and msg.body["b"].subtype == 4
        assert (msg.checksum is not None) is checksum
        assert msg.command() == {**doc, "documents": seq}


def test_frames_built_by_pymongo_parse():
    cmd = {"insert": "c", "ordered": True, "documents": [{"_id": i, "v": "x" * i} for i in range(3)]}
    opts = bson.codec_options.DEFAULT_CODEC_OPTIONS
    request_id, frame, _, _ = pymongo_message._op_msg(0, cmd, "test", ReadPreference.PRIMARY, opts)
    header, msg = f.parse_reply(frame)
    assert header.request_id == request_id and isinstance(msg, f.OpMsg)
    assert msg.body["insert"] == "c" and msg.body["$db"] == "test"
    assert msg.sequences == {"documents": [{"_id": i, "v": "x" * i} for i in range(3)]}
    assert msg.command()["documents"] == cmd["documents"]


def test_a_sequence_may_come_before_the_body():
    body = bson.encode({"insert": "c", "$db": "t"})
    payload = b"documents\x00" + bson.encode({"a": 1})
    sections = b"\x01" + struct.pack("<i", 4 + len(payload)) + payload + b"\x00" + body
    frame = struct.pack("<iiii", 16 + 4 + len(sections), 1, 0, f.OP_MSG) + b"\x00\x00\x00\x00" + sections
    _, msg = f.parse_reply(frame)
    assert isinstance(msg, f.OpMsg) and msg.command() == {"insert": "c", "$db": "t", "documents": [{"a": 1}]}


def _raw_op_msg(flags: int, sections: bytes, request_id: int = 1) -> bytes:
    return struct.pack("<iiiiI", 20 + len(sections), request_id, 0, f.OP_MSG, flags) + sections


def test_op_msg_errors():
    body = b"\x00" + bson.encode({"ping": 1, "$db": "admin"})

    def seq(name: str) -> bytes:
        payload = name.encode() + b"\x00" + bson.encode({"a": 1})
        return b"\x01" + struct.pack("<i", 4 + len(payload)) + payload

    # (frame, code, close, answer): mongod's codes; 223 / 233 / 288 are its "connection fatal"
    # parse errors (closed, no reply); an unknown section kind is answered, then closed (spec).
    cases = {
        "two bodies": (_raw_op_msg(0, body + body), 40430, False, True),
        "no sections": (_raw_op_msg(0, b""), 40587, False, True),
        "only a sequence": (_raw_op_msg(0, seq("documents")), 40587, False, True),
        "duplicate sequence": (_raw_op_msg(0, body + seq("documents") + seq("documents")), 40431, False, True),
        "three sequences": (_raw_op_msg(0, body + seq("a") + seq("b") + seq("c")), 233, True, False),
        "unknown section kind": (_raw_op_msg(0, body + b"\x02" + bson.encode({})), 40432, True, True),
        "unknown required flag": (_raw_op_msg(1 << 5, body), 223, True, False),
        "checksum flag, no room": (_raw_op_msg(f.MSG_CHECKSUM_PRESENT, b"\x00\x00\x00\x00"), 51251, False, True),
        "invalid BSON": (_raw_op_msg(0, b"\x00\x0c\x00\x00\x00\x10a\x00\x01\x00\x00\x00\x01"), 22, False, True),
        "document overruns": (_raw_op_msg(0, b"\x00\xff\x00\x00\x00\x00"), 22, False, True),
    }
    for name, (frame, code, close, answer) in cases.items():
        with pytest.raises(f.ProtocolError) as e:
            f.parse_reply(frame)
        assert (e.value.code, e.value.close, e.value.answer) == (code, close, answer), name


def test_optional_flag_bits_are_ignored_and_exhaust_allowed_is_read():
    frame = _raw_op_msg(f.MSG_EXHAUST_ALLOWED | (1 << 20), b"\x00" + bson.encode({"getMore": Int64(1), "$db": "t"}))
    _, msg = f.parse_reply(frame)
    assert isinstance(msg, f.OpMsg) and msg.exhaust_allowed and not msg.more_to_come


def test_a_wrong_checksum_closes_the_connection():
    frame = bytearray(f.build_op_msg(3, 0, {"ping": 1, "$db": "admin"}, checksum=True))
    frame[-1] ^= 0xFF
    with pytest.raises(f.ProtocolError, match="checksum does not match") as e:
        f.parse_reply(bytes(frame))
    # ChecksumMismatch (288) is fatal to the connection in mongod: closed, no reply.
    assert (e.value.code, e.value.close, e.value.answer) == (288, True, False)


def test_a_sequence_named_like_a_body_field_is_refused():
    frame = f.build_op_msg(1, 0, {"insert": "c", "documents": [], "$db": "t"}, sequences={"documents": [{"a": 1}]})
    _, msg = f.parse_reply(frame)
    assert isinstance(msg, f.OpMsg)
    with pytest.raises(f.ProtocolError, match="Duplicate field between body and document sequence") as e:
        msg.command()
    assert e.value.code == 40433 and not e.value.close


# ------------------------------------------------------------------ headers and limits


def test_header_limits_close_the_connection():
    for length in (0, 15, -1, f.MAX_MESSAGE_SIZE_BYTES + 1):
        with pytest.raises(f.ProtocolError) as e:
            f.parse_header(struct.pack("<iiii", length, 1, 0, f.OP_MSG))
        assert e.value.close
    assert f.parse_header(struct.pack("<iiii", f.MAX_MESSAGE_SIZE_BYTES, 1, 0, f.OP_MSG)).length == 48_000_000
    with pytest.raises(f.ProtocolError):
        f.parse_header(b"\x10\x00")


def test_unknown_and_legacy_write_opcodes_close_the_connection():
    for op in (2001, 2002, 2005, 2006, 2007, 9999):
        frame = struct.pack("<iiii", 20, 1, 0, op) + b"\x00" * 4
        with pytest.raises(f.ProtocolError) as e:
            f.parse_reply(frame)
        assert e.value.close


def test_a_document_over_the_internal_limit_is_refused_before_decoding():
    big = struct.pack("<i", f.MAX_DOCUMENT_INTERNAL_SIZE + 1)
    with pytest.raises(f.ProtocolError) as e:
        f.decode_document(big + b"\x00" * (f.MAX_DOCUMENT_INTERNAL_SIZE + 1), 0, f.MAX_DOCUMENT_INTERNAL_SIZE + 5, "x")
    assert e.value.code == 10334


def test_a_sequence_may_pass_16_mib_in_total_but_no_document_may():
    nine_mib = {"_id": 1, "pad": "x" * (9 * 1024 * 1024)}
    frame = f.build_op_msg(
        1, 0, {"insert": "c", "$db": "t"}, sequences={"documents": [nine_mib, {**nine_mib, "_id": 2}]}
    )
    assert len(frame) > f.MAX_BSON_OBJECT_SIZE
    _, msg = f.parse_reply(frame)
    assert isinstance(msg, f.OpMsg) and [d["_id"] for d in msg.sequences["documents"]] == [1, 2]
    too_big = {"_id": 3, "pad": "x" * f.MAX_DOCUMENT_INTERNAL_SIZE}
    with pytest.raises(f.ProtocolError) as e:
        f.parse_reply(f.build_op_msg(1, 0, {"insert": "c", "$db": "t"}, sequences={"documents": [too_big]}))
    assert e.value.code == 10334 and not e.value.close


def test_more_to_come_is_read_from_the_raw_flags_even_when_the_message_is_broken():
    broken = _raw_op_msg(f.MSG_MORE_TO_COME, b"\x00\xff\xff")
    header = f.parse_header(broken)
    assert f.wants_no_reply(header, broken[16:])
    with pytest.raises(f.ProtocolError):
        f.parse_message(header, broken[16:])
    plain = _raw_op_msg(0, b"\x00")
    assert not f.wants_no_reply(f.parse_header(plain), plain[16:])
    query = f.build_op_query(1, {"isMaster": 1}, flags=f.MSG_MORE_TO_COME)
    assert not f.wants_no_reply(f.parse_header(query), query[16:])  # OP_QUERY has no such flag


def test_the_inflated_size_of_a_compressed_message_is_held_to_the_limit():
    frame = f.compress(f.build_op_msg(1, 0, {"ping": 1, "pad": "x" * 2000, "$db": "admin"}), "zlib")
    header = f.parse_header(frame)
    assert isinstance(f.parse_message(header, frame[16:], max_message_size=4096), f.OpMsg)
    with pytest.raises(f.ProtocolError, match="uncompressed size"):
        f.parse_message(header, frame[16:], max_message_size=1024)


# ------------------------------------------------------------------ OP_QUERY / OP_REPLY


def test_op_query_handshake_and_op_reply_round_trip():
    frame = f.build_op_query(9, {"isMaster": 1, "helloOk": True, "client": {"driver": {"name": "x"}}})
    header, q = f.parse_reply(frame)
    assert header.op_code == f.OP_QUERY and isinstance(q, f.OpQuery)
    assert q.full_collection_name == "admin.$cmd" and q.number_to_return == -1 and q.query["helloOk"] is True
    reply = f.build_op_reply(10, 9, [{"ok": 1.0, "ismaster": True}])
    header, r = f.parse_reply(reply)
    assert header.response_to == 9 and isinstance(r, f.OpReply)
    assert r.documents == [{"ok": 1.0, "ismaster": True}] and r.flags == f.REPLY_AWAIT_CAPABLE


def test_op_reply_count_must_match():
    frame = bytearray(f.build_op_reply(1, 1, [{"a": 1}]))
    struct.pack_into("<i", frame, 16 + 16, 2)
    with pytest.raises(f.ProtocolError, match="numberReturned"):
        f.parse_reply(bytes(frame))


# ------------------------------------------------------------------ OP_COMPRESSED


@pytest.mark.parametrize("compressor", ["noop", "zlib"])
def test_compressed_messages_unwrap(compressor):
    inner = f.build_op_msg(5, 0, {"ping": 1, "$db": "admin"}, checksum=True)
    frame = f.compress(inner, compressor)
    header, msg = f.parse_reply(frame)
    assert header.op_code == f.OP_COMPRESSED and header.request_id == 5
    assert isinstance(msg, f.OpMsg) and msg.body == {"ping": 1, "$db": "admin"} and msg.compressor == compressor


def test_compressed_frames_from_pymongo_parse():
    from pymongo.compression_support import ZlibContext

    _, frame, _, _ = pymongo_message._op_msg(
        0, {"ping": 1}, "admin", None, bson.codec_options.DEFAULT_CODEC_OPTIONS, ctx=ZlibContext(-1)
    )
    _, msg = f.parse_reply(frame)
    assert isinstance(msg, f.OpMsg) and msg.body == {"ping": 1, "$db": "admin"} and msg.compressor == "zlib"


def test_compression_bombs_and_bad_compressors_are_refused():
    inner = f.build_op_msg(1, 0, {"ping": 1, "x": "a" * 10_000, "$db": "admin"})[16:]
    payload = zlib.compress(inner)
    for declared, cid, data in ((100, 2, payload), (len(inner), 1, payload), (len(inner), 3, payload)):
        body = struct.pack("<iiB", f.OP_MSG, declared, cid) + data
        frame = struct.pack("<iiii", 16 + len(body), 1, 0, f.OP_COMPRESSED) + body
        with pytest.raises(f.ProtocolError):
            f.parse_reply(frame)


# ------------------------------------------------------------------ fuzz

_VALID = [
    f.build_op_msg(1, 0, {"ping": 1, "$db": "admin"}),
    f.build_op_msg(
        2, 0, {"insert": "c", "$db": "t"}, sequences={"documents": [{"_id": ObjectId(), "a": [1, {"b": None}]}]}
    ),
    f.build_op_msg(3, 0, {"find": "c", "filter": {"x": {"$gt": Decimal128("1")}}, "$db": "t"}, checksum=True),
    f.build_op_query(4, {"isMaster": 1, "helloOk": True}),
    f.build_op_reply(5, 4, [{"ok": 1.0}, {"a": "b"}]),
    f.compress(f.build_op_msg(6, 0, {"ping": 1, "$db": "admin"}), "zlib"),
    f.compress(f.build_op_msg(7, 0, {"ping": 1, "$db": "admin"}), "noop"),
]


def _parse_anything(frame: bytes) -> None:
    try:
        header, msg = f.parse_reply(frame)
        if isinstance(msg, f.OpMsg):
            msg.command()
    except f.ProtocolError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_errors(data):
    _parse_anything(data)
    # and with a correct length prefix, so the parser gets past the header
    for op in (f.OP_MSG, f.OP_QUERY, f.OP_REPLY, f.OP_COMPRESSED):
        _parse_anything(struct.pack("<iiii", 16 + len(data), 1, 0, op) + data)


@st.composite
def _mutated(draw):
    frame = bytearray(draw(st.sampled_from(_VALID)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "length"]))
        if not frame:
            break
        i = draw(st.integers(0, len(frame) - 1))
        if kind == "flip":
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            frame[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del frame[i:]
        elif kind == "insert":
            frame[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del frame[i : i + draw(st.integers(1, 8))]
        else:  # rewrite an int32 somewhere (lengths, sizes, opcodes) with a nasty value
            j = draw(st.integers(0, max(0, len(frame) - 4)))
            value = draw(st.sampled_from([0, 1, 4, 5, 15, 16, -1, 2**31 - 1, -(2**31), len(frame), len(frame) + 1]))
            frame[j : j + 4] = struct.pack("<i", value)
    # keep the outer length right half of the time, so mutations reach the body parsers
    if frame[:4] and draw(st.booleans()) and len(frame) >= 4:
        frame[0:4] = struct.pack("<i", len(frame))
    return bytes(frame)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_frames_raise_only_protocol_errors(frame):
    _parse_anything(frame)


# ------------------------------------------------------------------ build -> parse round trips

_keys = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=8).filter(
    lambda k: not k.startswith("$")
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(allow_nan=False),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=20),
    st.binary(max_size=20).map(lambda b: Binary(b, 0)),
    st.builds(ObjectId),
    st.sampled_from([MinKey(), MaxKey(), Decimal128("1.10"), Decimal128("-0")]),
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4), max_leaves=12
)
_docs = st.dictionaries(_keys, _values, max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=_docs,
    sequences=st.dictionaries(
        st.sampled_from(["documents", "updates", "ops"]), st.lists(_docs, max_size=4), max_size=2
    ),
    flags=st.sampled_from([0, f.MSG_MORE_TO_COME, f.MSG_EXHAUST_ALLOWED, f.MSG_EXHAUST_ALLOWED | (1 << 30)]),
    checksum=st.booleans(),
    compressor=st.sampled_from([None, "noop", "zlib"]),
    request_id=st.integers(-(2**31), 2**31 - 1),
)
def test_built_op_msg_frames_parse_back(body, sequences, flags, checksum, compressor, request_id):
    body = {"cmd": 1, **body, "$db": "t"}
    frame = f.build_op_msg(request_id, 0, body, sequences=sequences, flags=flags, checksum=checksum)
    if compressor is not None:
        frame = f.compress(frame, compressor)
    header, msg = f.parse_reply(frame)
    assert header.request_id == request_id and header.length == len(frame)
    assert isinstance(msg, f.OpMsg) and msg.compressor == compressor
    assert bson.encode(msg.body) == bson.encode(body)  # byte-equal: types and key order kept
    assert {k: [bson.encode(d) for d in v] for k, v in msg.sequences.items()} == {
        k: [bson.encode(d) for d in v] for k, v in sequences.items()
    }
    assert msg.flags & ~f.MSG_CHECKSUM_PRESENT == flags and (msg.checksum is not None) is checksum


@settings(max_examples=100, deadline=None)
@given(docs=st.lists(_docs, max_size=4), request_id=st.integers(0, 2**31 - 2))
def test_built_op_query_and_op_reply_frames_parse_back(docs, request_id):
    query = {"isMaster": 1, **(docs[0] if docs else {})}
    _, q = f.parse_reply(f.build_op_query(request_id, query))
    assert isinstance(q, f.OpQuery) and bson.encode(q.query) == bson.encode(query)
    header, r = f.parse_reply(f.build_op_reply(request_id + 1, request_id, docs))
    assert header.response_to == request_id and isinstance(r, f.OpReply)
    assert [bson.encode(d) for d in r.documents] == [bson.encode(d) for d in docs]
