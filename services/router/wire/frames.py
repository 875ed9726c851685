"""MongoDB wire-protocol framing: message headers, OP_MSG, OP_QUERY / OP_REPLY (the legacy
handshake only) and OP_COMPRESSED.  Pure: bytes in, values out, and back; no I/O.

Every malformed input raises :class:`ProtocolError` and nothing else (a hypothesis test
holds the parser to that).  A ProtocolError says whether the byte stream is still in step
(``close=False``: the whole frame was read, answer with an error reply and go on) or not
(``close=True``: close the connection, as mongod does for a bad message length).

BSON is pymongo's ``bson`` (C extension); CRC-32C of OP_MSG's optional checksum is
``google-crc32c`` (Google's C library, with a pure-Python fallback in the same package).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import bson
import google_crc32c
from bson.codec_options import CodecOptions, DatetimeConversion

__all__ = [
    "CODEC_OPTIONS",
    "COMPRESSORS",
    "HEADER_SIZE",
    "MAX_BSON_OBJECT_SIZE",
    "MAX_DOCUMENT_INTERNAL_SIZE",
    "MAX_MESSAGE_SIZE_BYTES",
    "MAX_WRITE_BATCH_SIZE",
    "MSG_CHECKSUM_PRESENT",
    "MSG_EXHAUST_ALLOWED",
    "MSG_MORE_TO_COME",
    "OP_COMPRESSED",
    "OP_MSG",
    "OP_QUERY",
    "OP_REPLY",
    "Header",
    "OpMsg",
    "OpQuery",
    "OpReply",
    "ProtocolError",
    "build_op_msg",
    "build_op_query",
    "build_op_reply",
    "compress",
    "crc32c",
    "decode_document",
    "encode_document",
    "parse_header",
    "parse_message",
    "parse_reply",
    "wants_no_reply",
]

# ------------------------------------------------------------------ constants

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013
# Opcodes a current mongod no longer accepts (OP_UPDATE 2001, OP_INSERT 2002, OP_GET_MORE 2005,
# OP_DELETE 2006, OP_KILL_CURSORS 2007) are "unknown" here too: the connection is closed.

HEADER_SIZE = 16
MAX_MESSAGE_SIZE_BYTES = 48_000_000  # mongod's and mongos's maxMessageSizeBytes
MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024  # maxBsonObjectSize: a user document
MAX_DOCUMENT_INTERNAL_SIZE = MAX_BSON_OBJECT_SIZE + 16 * 1024  # a command may carry 16 KiB of overhead
MAX_WRITE_BATCH_SIZE = 100_000

MSG_CHECKSUM_PRESENT = 1 << 0
MSG_MORE_TO_COME = 1 << 1
MSG_EXHAUST_ALLOWED = 1 << 16
_MSG_REQUIRED_BITS = 0xFFFF  # the low 16 bits: an unknown one set is an error (OP_MSG spec)
_MSG_KNOWN_REQUIRED = MSG_CHECKSUM_PRESENT | MSG_MORE_TO_COME

REPLY_AWAIT_CAPABLE = 1 << 3  # OP_REPLY responseFlags bit 3: what mongod sets on every reply

# OP_COMPRESSED compressor ids.  noop and zlib need nothing outside the standard library;
# snappy (1) and zstd (3) are not implemented.  Which of these the server advertises in
# `hello` is the server's choice (none by default).
COMPRESSORS: dict[str, int] = {"noop": 0, "zlib": 2}
_COMPRESSOR_NAMES = {v: k for k, v in COMPRESSORS.items()}

# What a router's codec decodes with: dict documents, aware UTC datetimes, dates outside
# Python's range kept as DatetimeMS rather than refused, binary UUIDs left as Binary (the
# subtype byte round-trips unchanged).
CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(
    document_class=dict,
    tz_aware=True,
    tzinfo=UTC,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)

# MongoDB's numbers for the protocol-level errors this module raises (error_codes.yml, and
# the Location codes mongod's OpMsg::parse raises for the same faults).
PROTOCOL_ERROR = (17, "ProtocolError")
INVALID_BSON = (22, "InvalidBSON")
ILLEGAL_OP_MSG_FLAG = (223, "IllegalOpMsgFlag")
TOO_MANY_DOCUMENT_SEQUENCES = (233, "TooManyDocumentSequences")
CHECKSUM_MISMATCH = (288, "ChecksumMismatch")
BSON_OBJECT_TOO_LARGE = (10334, "BSONObjectTooLarge")
MULTIPLE_BODIES = (40430, "Location40430")
DUPLICATE_SEQUENCE = (40431, "Location40431")
UNKNOWN_SECTION_KIND = (40432, "Location40432")
DUPLICATE_SEQUENCE_FIELD = (40433, "Location40433")
NO_BODY = (40587, "Location40587")
CHECKSUM_TOO_SHORT = (51251, "Location51251")
MAX_DOCUMENT_SEQUENCES = 2  # mongod refuses a third kind-1 section (bulkWrite needs two)

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_HEADER = struct.Struct("<iiii")
_REPLY_PREFIX = struct.Struct("<iqii")  # responseFlags, cursorID, startingFrom, numberReturned
_COMPRESSED_PREFIX = struct.Struct("<iiB")  # originalOpcode, uncompressedSize, compressorId


class ProtocolError(Exception):
    """A frame or message that cannot be accepted.  Three outcomes, as in mongod:

    - ``close=False``: the frame was read whole; an error reply with ``code`` / ``code_name``
      answers it and the connection goes on;
    - ``close=True, answer=False``: the connection is closed with no reply: the stream is out
      of step (a bad length), or the fault is one mongod counts as fatal to the connection
      (its ConnectionFatalMessageParseError category: IllegalOpMsgFlag, ChecksumMismatch,
      TooManyDocumentSequences), so a driver sees a network error and may retry elsewhere;
    - ``close=True, answer=True``: answer with the error, then close (an unknown section
      kind: mongod answers 40432, the OP_MSG spec says the socket MUST be closed)."""

    def __init__(
        self, message: str, *, code: tuple[int, str] = PROTOCOL_ERROR, close: bool = False, answer: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code, self.code_name = code
        self.close = close
        self.answer = (not close) if answer is None else answer


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class Header:
    length: int  # the whole message, header included
    request_id: int
    response_to: int
    op_code: int


@dataclass
class OpMsg:
    """An OP_MSG: flag bits, the kind-0 body and the kind-1 document sequences by identifier."""

    flags: int
    body: dict[str, Any]
    sequences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checksum: int | None = None  # as received (verified); None when absent
    compressor: str | None = None  # the OP_COMPRESSED compressor it arrived in, if any

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & MSG_MORE_TO_COME)

    @property
    def exhaust_allowed(self) -> bool:
        return bool(self.flags & MSG_EXHAUST_ALLOWED)

    def command(self) -> dict[str, Any]:
        """The command as one document: the body with each sequence as an array field (what a
        driver would have sent without kind-1 sections).  A sequence whose identifier is also a
        body field is a ProtocolError (MongoDB refuses the duplicate)."""
        if not self.sequences:
            return self.body
        doc = dict(self.body)
        for ident, docs in self.sequences.items():
            if ident in doc:
                raise ProtocolError(
                    f"Duplicate field between body and document sequence {ident}", code=DUPLICATE_SEQUENCE_FIELD
                )
            doc[ident] = docs
        return doc


@dataclass
class OpQuery:
    """A legacy OP_QUERY: only the first handshake (`isMaster` / `hello` on `admin.$cmd`)."""

    flags: int
    full_collection_name: str
    number_to_skip: int
    number_to_return: int
    query: dict[str, Any]
    return_fields: dict[str, Any] | None = None
    compressor: str | None = None


@dataclass
class OpReply:
    """A legacy OP_REPLY (what answers an OP_QUERY)."""

    flags: int
    cursor_id: int
    starting_from: int
    documents: list[dict[str, Any]]


# ------------------------------------------------------------------ BSON


def decode_document(data: bytes | memoryview, offset: int, end: int, what: str) -> tuple[dict[str, Any], int]:
    """The BSON document at ``data[offset:]`` (not past ``end``) and the offset after it."""
    if end - offset < 5:
        raise ProtocolError(f"{what}: truncated BSON document", code=INVALID_BSON)
    (size,) = _I32.unpack_from(data, offset)
    if size < 5 or size > end - offset:
        raise ProtocolError(
            f"{what}: BSON document length {size} does not fit in the {end - offset} bytes left", code=INVALID_BSON
        )
    if size > MAX_DOCUMENT_INTERNAL_SIZE:
        raise ProtocolError(
            f"{what}: BSON document is {size} bytes, over the {MAX_DOCUMENT_INTERNAL_SIZE}-byte limit",
            code=BSON_OBJECT_TOO_LARGE,
        )
    raw = bytes(data[offset : offset + size])
    try:
        doc = bson.decode(raw, CODEC_OPTIONS)
    except Exception as e:  # the C decoder raises InvalidBSON, but also e.g. OverflowError, RecursionError
        raise ProtocolError(f"{what}: invalid BSON: {e}", code=INVALID_BSON) from None
    return doc, offset + size


def encode_document(doc: Any) -> bytes:
    """BSON of a reply document.  A value BSON cannot carry is a programming error here, so
    it is raised as is (the server turns it into an InternalError reply)."""
    return bson.encode(doc, codec_options=CODEC_OPTIONS)


def _cstring(data: bytes | memoryview, offset: int, end: int, what: str) -> tuple[str, int]:
    raw = bytes(data[offset:end])
    nul = raw.find(b"\x00")
    if nul < 0:
        raise ProtocolError(f"{what}: unterminated string")
    try:
        return raw[:nul].decode("utf-8"), offset + nul + 1
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: string is not valid UTF-8", code=INVALID_BSON) from None


def crc32c(data: bytes | memoryview) -> int:
    """CRC-32C (Castagnoli), the checksum of OP_MSG."""
    return int(google_crc32c.value(bytes(data)))


# ------------------------------------------------------------------ parsing


def parse_header(data: bytes | memoryview, max_message_size: int = MAX_MESSAGE_SIZE_BYTES) -> Header:
    """The 16-byte header.  A length that cannot be a message (below the header's own size or
    over the limit) leaves the stream unreadable: ProtocolError with ``close``."""
    if len(data) < HEADER_SIZE:
        raise ProtocolError(f"message header is {len(data)} bytes, expected {HEADER_SIZE}", close=True)
    length, request_id, response_to, op_code = _HEADER.unpack_from(data, 0)
    if length < HEADER_SIZE or length > max_message_size:
        raise ProtocolError(
            f"message length {length} is invalid: min {HEADER_SIZE}, max {max_message_size}", close=True
        )
    return Header(length, request_id, response_to, op_code)


def parse_message(
    header: Header,
    body: bytes | memoryview,
    *,
    accept_compressed: bool = True,
    max_message_size: int = MAX_MESSAGE_SIZE_BYTES,
) -> OpMsg | OpQuery | OpReply:
    """The message whose ``header`` was read and whose ``body`` (``header.length - 16`` bytes)
    follows.  OP_COMPRESSED is unwrapped (one level).  An unknown opcode closes the connection:
    its sender expects a reply format we cannot know."""
    if len(body) != header.length - HEADER_SIZE:
        raise ProtocolError(
            f"message body is {len(body)} bytes, the header says {header.length - HEADER_SIZE}", close=True
        )
    if header.op_code == OP_MSG:
        return _parse_op_msg(header, body)
    if header.op_code == OP_QUERY:
        return _parse_op_query(body)
    if header.op_code == OP_REPLY:
        return _parse_op_reply(body)
    if header.op_code == OP_COMPRESSED and accept_compressed:
        return _parse_compressed(header, body, max_message_size)
    raise ProtocolError(f"unsupported opcode {header.op_code}", close=True)


def wants_no_reply(header: Header, body: bytes | memoryview) -> bool:
    """An OP_MSG whose (readable) flags say moreToCome: its sender reads no reply, not even
    an error reply to a message that failed to parse (mongod sends none either)."""
    if header.op_code != OP_MSG or len(body) < 4:
        return False
    return bool(_U32.unpack_from(body, 0)[0] & MSG_MORE_TO_COME)


def parse_reply(frame: bytes) -> tuple[Header, OpMsg | OpQuery | OpReply]:
    """A whole frame (header and body): for tests and clients of this module."""
    header = parse_header(frame)
    if len(frame) != header.length:
        raise ProtocolError(f"frame is {len(frame)} bytes, its header says {header.length}", close=True)
    return header, parse_message(header, memoryview(frame)[HEADER_SIZE:])


def _parse_op_msg(header: Header, body: bytes | memoryview) -> OpMsg:
    end = len(body)
    if end < 4:
        raise ProtocolError("OP_MSG: no flag bits")
    (flags,) = _U32.unpack_from(body, 0)
    unknown = flags & _MSG_REQUIRED_BITS & ~_MSG_KNOWN_REQUIRED
    if unknown:
        raise ProtocolError(
            f"OP_MSG: message contains illegal flags value: {flags:#034b}", code=ILLEGAL_OP_MSG_FLAG, close=True
        )
    checksum: int | None = None
    if flags & MSG_CHECKSUM_PRESENT:
        if end <= 8:
            raise ProtocolError("Invalid message size for an OpMsg containing a checksum", code=CHECKSUM_TOO_SHORT)
        end -= 4
        (checksum,) = _U32.unpack_from(body, end)
        head = _HEADER.pack(header.length, header.request_id, header.response_to, OP_MSG)
        actual = crc32c(head + bytes(body[:end]))
        if actual != checksum:
            raise ProtocolError(
                f"OP_MSG checksum does not match contents: message says {checksum:#010x}, computed {actual:#010x}",
                code=CHECKSUM_MISMATCH,
                close=True,
            )
    offset = 4
    main: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    if offset >= end:
        raise ProtocolError("OP_MSG messages must have a body", code=NO_BODY)
    while offset < end:
        kind = body[offset]
        offset += 1
        if kind == 0:
            if main is not None:
                raise ProtocolError("Multiple body sections in message", code=MULTIPLE_BODIES)
            main, offset = decode_document(body, offset, end, "OP_MSG body")
        elif kind == 1:
            if len(sequences) >= MAX_DOCUMENT_SEQUENCES:
                raise ProtocolError(
                    "Too many document sequences in OP_MSG", code=TOO_MANY_DOCUMENT_SEQUENCES, close=True
                )
            if end - offset < 4:
                raise ProtocolError("OP_MSG: truncated document sequence")
            (size,) = _I32.unpack_from(body, offset)
            if size < 5 or size > end - offset:
                raise ProtocolError(f"OP_MSG: document sequence size {size} does not fit in {end - offset} bytes")
            seq_end = offset + size
            ident, pos = _cstring(body, offset + 4, seq_end, "OP_MSG document sequence identifier")
            if ident in sequences:
                raise ProtocolError(f"Duplicate document sequence: {ident}", code=DUPLICATE_SEQUENCE)
            docs: list[dict[str, Any]] = []
            while pos < seq_end:
                doc, pos = decode_document(body, pos, seq_end, f"OP_MSG document sequence {ident!r}")
                docs.append(doc)
            sequences[ident] = docs
            offset = seq_end
        else:
            # The spec: an unknown payload type MUST be an error and the socket MUST be closed.
            raise ProtocolError(f"Unknown section kind {kind}", code=UNKNOWN_SECTION_KIND, close=True, answer=True)
    if main is None:
        raise ProtocolError("OP_MSG messages must have a body", code=NO_BODY)
    return OpMsg(flags, main, sequences, checksum)


def _parse_op_query(body: bytes | memoryview) -> OpQuery:
    end = len(body)
    if end < 4:
        raise ProtocolError("OP_QUERY: truncated")
    (flags,) = _I32.unpack_from(body, 0)
    name, offset = _cstring(body, 4, end, "OP_QUERY collection name")
    if end - offset < 8:
        raise ProtocolError("OP_QUERY: truncated before numberToSkip / numberToReturn")
    skip, n_return = struct.unpack_from("<ii", body, offset)
    query, offset = decode_document(body, offset + 8, end, "OP_QUERY query")
    fields: dict[str, Any] | None = None
    if offset < end:
        fields, offset = decode_document(body, offset, end, "OP_QUERY returnFieldsSelector")
    if offset != end:
        raise ProtocolError(f"OP_QUERY: {end - offset} bytes after the last document")
    return OpQuery(flags, name, skip, n_return, query, fields)


def _parse_op_reply(body: bytes | memoryview) -> OpReply:
    end = len(body)
    if end < _REPLY_PREFIX.size:
        raise ProtocolError("OP_REPLY: truncated")
    flags, cursor_id, starting_from, n = _REPLY_PREFIX.unpack_from(body, 0)
    offset = _REPLY_PREFIX.size
    docs: list[dict[str, Any]] = []
    while offset < end:
        doc, offset = decode_document(body, offset, end, "OP_REPLY document")
        docs.append(doc)
    if n != len(docs):
        raise ProtocolError(f"OP_REPLY: numberReturned is {n} but {len(docs)} documents follow")
    return OpReply(flags, cursor_id, starting_from, docs)


def _parse_compressed(header: Header, body: bytes | memoryview, max_message_size: int) -> OpMsg | OpQuery | OpReply:
    if len(body) < _COMPRESSED_PREFIX.size:
        raise ProtocolError("OP_COMPRESSED: truncated")
    original, size, compressor_id = _COMPRESSED_PREFIX.unpack_from(body, 0)
    name = _COMPRESSOR_NAMES.get(compressor_id)
    if name is None:
        raise ProtocolError(f"OP_COMPRESSED: unsupported compressor id {compressor_id}")
    if size < 0 or size > max_message_size - HEADER_SIZE:  # the limit holds for the inflated message
        raise ProtocolError(f"OP_COMPRESSED: uncompressed size {size} is invalid")
    payload = bytes(body[_COMPRESSED_PREFIX.size :])
    if name == "noop":
        inner = payload
    else:
        try:
            d = zlib.decompressobj()
            inner = d.decompress(payload, size + 1)  # bounded: never inflate past the declared size
            if not d.eof or d.unused_data or d.unconsumed_tail:
                raise ProtocolError(
                    "OP_COMPRESSED: zlib stream is truncated, longer than declared or followed by bytes"
                )
        except zlib.error as e:
            raise ProtocolError(f"OP_COMPRESSED: zlib: {e}") from None
    if len(inner) != size:
        raise ProtocolError(f"OP_COMPRESSED: uncompressed {len(inner)} bytes, declared {size}")
    if original == OP_COMPRESSED:
        raise ProtocolError("OP_COMPRESSED: nested OP_COMPRESSED")
    inner_header = Header(HEADER_SIZE + size, header.request_id, header.response_to, original)
    message = parse_message(inner_header, inner, accept_compressed=False)
    if isinstance(message, (OpMsg, OpQuery)):
        message.compressor = name
    return message


# ------------------------------------------------------------------ building


def _frame(request_id: int, response_to: int, op_code: int, body: bytes) -> bytes:
    return _HEADER.pack(HEADER_SIZE + len(body), request_id, response_to, op_code) + body


def build_op_msg(
    request_id: int,
    response_to: int,
    body: dict[str, Any],
    *,
    sequences: dict[str, list[dict[str, Any]]] | None = None,
    flags: int = 0,
    checksum: bool = False,
) -> bytes:
    """An OP_MSG frame: one kind-0 section, then one kind-1 section per sequence."""
    parts = [b"\x00", encode_document(body)]
    for ident, docs in (sequences or {}).items():
        payload = ident.encode() + b"\x00" + b"".join(encode_document(d) for d in docs)
        parts += [b"\x01", _I32.pack(4 + len(payload)), payload]
    if checksum:
        flags |= MSG_CHECKSUM_PRESENT
    else:
        flags &= ~MSG_CHECKSUM_PRESENT
    msg = _U32.pack(flags) + b"".join(parts)
    if not checksum:
        return _frame(request_id, response_to, OP_MSG, msg)
    head = _HEADER.pack(HEADER_SIZE + len(msg) + 4, request_id, response_to, OP_MSG)
    return head + msg + _U32.pack(crc32c(head + msg))


def build_op_reply(
    request_id: int, response_to: int, documents: list[dict[str, Any]], *, flags: int = REPLY_AWAIT_CAPABLE
) -> bytes:
    """An OP_REPLY frame (cursor id 0, starting from 0): the answer to an OP_QUERY handshake."""
    docs = b"".join(encode_document(d) for d in documents)
    return _frame(request_id, response_to, OP_REPLY, _REPLY_PREFIX.pack(flags, 0, 0, len(documents)) + docs)


def build_op_query(
    request_id: int,
    query: dict[str, Any],
    *,
    collection: str = "admin.$cmd",
    flags: int = 0,
    number_to_skip: int = 0,
    number_to_return: int = -1,
) -> bytes:
    """An OP_QUERY frame, as a driver sends its first handshake (for tests)."""
    body = (
        _I32.pack(flags)
        + collection.encode()
        + b"\x00"
        + struct.pack("<ii", number_to_skip, number_to_return)
        + encode_document(query)
    )
    return _frame(request_id, 0, OP_QUERY, body)


def compress(frame: bytes, compressor: str) -> bytes:
    """``frame`` (a whole message) wrapped in OP_COMPRESSED with ``compressor`` ("noop" or "zlib")."""
    header = parse_header(frame)
    inner = frame[HEADER_SIZE:]
    cid = COMPRESSORS[compressor]
    payload = inner if compressor == "noop" else zlib.compress(inner)
    body = _COMPRESSED_PREFIX.pack(header.op_code, len(inner), cid) + payload
    return _frame(header.request_id, header.response_to, OP_COMPRESSED, body)
