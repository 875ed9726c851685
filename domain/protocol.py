"""What every service and client agrees on when they talk: headers, size limits, how a
document is measured, namespace and name rules, and the error codes of replies.

Topic and inbox names are `libs.topics`'s; record shapes are `schemas`'.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import bson
from bson.errors import InvalidDocument

from domain.bsonvalues import to_record
from libs.errors import CommandError
from libs.topics import SHARD_ID

# ------------------------------------------------------------------ headers

CONFIG_TIME = "config-time"  # on a shard request: the ConfigTime the router routed at
# VECTOR_TIME ("vector-time"), the clock's gossip on every request and reply: domain.clock

# ------------------------------------------------------------------ limits

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024  # MongoDB's BSON document limit, in doc_bytes
# A record carries a document as relaxed Extended JSON, which can be larger than its BSON:
# ~1.33x for binary (base64), ~2.7x for many doubles, 6x for strings of control characters
# (JSON escapes each as \u00XX).  Every document under 16 MB of BSON whose record form is at
# most 6x that fits; a document dense with tiny typed values under 4-byte control-character
# names (a regex is 4 bytes of BSON, ~48 of Extended JSON) can grow more and is refused
# (DocumentTooLarge) rather than failing in Kafka.  libs.kafka.MAX_RECORD_BYTES leaves room
# for this plus one batch (MAX_BATCH_BYTES) and the envelope.
MAX_DOCUMENT_RECORD_BYTES = 6 * MAX_DOCUMENT_BYTES
_MAX_RECORD_GROWTH = 16  # no document's record form is more than this many times its BSON
MAX_BATCH_BYTES = 8 * 1024 * 1024  # a reply batch stays well below Kafka's record limit, in record_bytes
CURSOR_TIMEOUT_S = 600  # MongoDB's cursorTimeoutMillis: 10 minutes, on routers and shards alike


def doc_bytes(doc: dict[str, Any]) -> int:
    """A document's size in BSON bytes (``bson.encode``), as MongoDB measures it for the
    16 MB limit (docs/decisions/0016).  A document BSON cannot hold (an integer beyond
    64 bits, a field name with a NUL: never from a driver) is measured by its record form."""
    try:
        return len(bson.encode(doc))
    except (InvalidDocument, OverflowError, TypeError, ValueError):
        return record_bytes(doc)


def record_bytes(doc: dict[str, Any]) -> int:
    """A document's size in a record: compact Extended JSON (``domain.bsonvalues``); for a
    plain JSON document, its compact JSON.  Kafka's record limits are in these bytes, so
    batches are measured with it (MAX_BATCH_BYTES)."""
    return len(json.dumps(to_record(doc), separators=(",", ":")).encode())


def check_document_size(doc: dict[str, Any]) -> None:
    """DocumentTooLarge (MongoDB's BSONObjectTooLarge, 10334) for a document over 16 MB of BSON,
    or one whose record form would not fit a record (MAX_DOCUMENT_RECORD_BYTES)."""
    size = doc_bytes(doc)
    if size > MAX_DOCUMENT_BYTES:
        raise CommandError(
            ErrorCode.DocumentTooLarge, f"document is {size} bytes; the limit is {MAX_DOCUMENT_BYTES} (16 MB)"
        )
    if size * _MAX_RECORD_GROWTH > MAX_DOCUMENT_RECORD_BYTES and (n := record_bytes(doc)) > MAX_DOCUMENT_RECORD_BYTES:
        raise CommandError(
            ErrorCode.DocumentTooLarge,
            f"document is {size} bytes, but {n} as Extended JSON; shardlog's limit for that is "
            f"{MAX_DOCUMENT_RECORD_BYTES} (6 x 16 MB)",
        )


# ------------------------------------------------------------------ error codes


class ErrorCode(StrEnum):
    """The `code` of an error reply: MongoDB's name, and its number where MongoDB has the code.

    The value is the name (what a reply carries); `number` is what the wire protocol will
    send as `code`.  Codes with no number are shardlog's own (transport and tooling)."""

    number: int | None

    def __new__(cls, name: str, number: int | None = None) -> ErrorCode:
        member = str.__new__(cls, name)
        member._value_ = name
        member.number = number
        return member

    InternalError = ("InternalError", 1)
    BadValue = ("BadValue", 2)
    HostUnreachable = ("HostUnreachable", 6)
    FailedToParse = ("FailedToParse", 9)
    TypeMismatch = ("TypeMismatch", 14)
    InvalidLength = ("InvalidLength", 16)
    IllegalOperation = ("IllegalOperation", 20)
    AlreadyInitialized = ("AlreadyInitialized", 23)
    NamespaceNotFound = ("NamespaceNotFound", 26)
    CursorNotFound = ("CursorNotFound", 43)
    LockBusy = ("LockBusy", 46)
    NamespaceExists = ("NamespaceExists", 48)
    CommandNotFound = ("CommandNotFound", 59)
    ShardKeyNotFound = ("ShardKeyNotFound", 61)
    ImmutableField = ("ImmutableField", 66)
    ShardNotFound = ("ShardNotFound", 70)
    InvalidOptions = ("InvalidOptions", 72)
    InvalidNamespace = ("InvalidNamespace", 73)
    CannotSplit = ("CannotSplit", 87)
    NetworkTimeout = ("NetworkTimeout", 89)
    OperationFailed = ("OperationFailed", 96)
    ShutdownInProgress = ("ShutdownInProgress", 91)
    ConflictingOperationInProgress = ("ConflictingOperationInProgress", 117)
    CommandFailed = ("CommandFailed", 125)
    NamespaceNotSharded = ("NamespaceNotSharded", 118)
    StaleEpoch = ("StaleEpoch", 150)
    ChunkTooBig = ("ChunkTooBig", 153)
    ZoneStillInUse = ("ZoneStillInUse", 163)
    ZoneNotFound = ("ZoneNotFound", 177)
    RangeOverlapConflict = ("RangeOverlapConflict", 178)
    PrimarySteppedDown = ("PrimarySteppedDown", 189)
    ChunkRangeCleanupPending = ("ChunkRangeCleanupPending", 200)
    TransactionTooOld = ("TransactionTooOld", 225)
    # multi-document transactions (issue 33, docs/decisions/0020)
    WriteConflict = ("WriteConflict", 112)
    NoSuchTransaction = ("NoSuchTransaction", 251)
    TransactionCommitted = ("TransactionCommitted", 256)
    OperationNotSupportedInTransaction = ("OperationNotSupportedInTransaction", 263)
    PreparedTransactionInProgress = ("PreparedTransactionInProgress", 267)
    TransactionExceededLifetimeLimitSeconds = ("TransactionExceededLifetimeLimitSeconds", 290)
    # a read or write met a prepared transaction's documents: the router asks again (MongoDB's
    # operation waits inside the shard); never sent to a client
    PrepareConflict = ("PrepareConflict", None)
    ExceededTimeLimit = ("ExceededTimeLimit", 262)
    # reads at a past cluster time (issue 32, docs/decisions/0019)
    SnapshotTooOld = ("SnapshotTooOld", 239)
    SnapshotUnavailable = ("SnapshotUnavailable", 246)
    StaleChunkHistory = ("StaleChunkHistory", 250)
    # a transaction's statement or commit meets a range that migrated after its snapshot
    MigrationConflict = ("MigrationConflict", 272)
    # the vector clock and causal consistency (docs/decisions/0014)
    NoSuchKey = ("NoSuchKey", 4)
    MaxTimeMSExpired = ("MaxTimeMSExpired", 50)
    UnsupportedFormat = ("UnsupportedFormat", 115)
    TimeProofMismatch = ("TimeProofMismatch", 204)
    ClusterTimeFailsRateLimiter = ("ClusterTimeFailsRateLimiter", 209)
    KeyNotFound = ("KeyNotFound", 211)
    # secondary indexes (domain/indexes.py)
    IndexNotFound = ("IndexNotFound", 27)
    CannotCreateIndex = ("CannotCreateIndex", 67)
    IndexAlreadyExists = ("IndexAlreadyExists", 68)
    IndexOptionsConflict = ("IndexOptionsConflict", 85)
    IndexKeySpecsConflict = ("IndexKeySpecsConflict", 86)
    CannotIndexParallelArrays = ("CannotIndexParallelArrays", 171)
    InvalidIndexSpecificationOption = ("InvalidIndexSpecificationOption", 197)
    IndexBuildAborted = ("IndexBuildAborted", 276)
    AmbiguousIndexKeyPattern = ("AmbiguousIndexKeyPattern", 181)
    CannotDropShardKeyIndex = ("CannotDropShardKeyIndex", 370)
    DuplicateKey = ("DuplicateKey", 11000)
    # the query and update language (domain/query.py) and the options commands carry (issue 38)
    PathNotViable = ("PathNotViable", 28)
    ConflictingUpdateOperators = ("ConflictingUpdateOperators", 40)
    DollarPrefixedFieldName = ("DollarPrefixedFieldName", 52)
    InvalidIdField = ("InvalidIdField", 53)
    EmptyFieldName = ("EmptyFieldName", 56)
    UnknownReplWriteConcern = ("UnknownReplWriteConcern", 79)
    UnsatisfiableWriteConcern = ("UnsatisfiableWriteConcern", 100)
    InvalidPipelineOperator = ("InvalidPipelineOperator", 168)
    QueryFeatureNotAllowed = ("QueryFeatureNotAllowed", 224)  # an operator MongoDB has and shardlog refuses
    NotImplemented = ("NotImplemented", 238)  # an option MongoDB has and shardlog refuses
    UnsatisfiableCommitQuorum = ("UnsatisfiableCommitQuorum", 278)  # a createIndexes commitQuorum above 1
    APIVersionError = ("APIVersionError", 322)
    APIStrictError = ("APIStrictError", 323)
    Interrupted = ("Interrupted", 11601)
    InterruptedDueToReplStateChange = ("InterruptedDueToReplStateChange", 11602)
    IDLFailedToParse = ("IDLFailedToParse", 40414)  # a required field missing (e.g. lsid without id)
    IDLUnknownField = ("IDLUnknownField", 40415)
    StaleConfig = ("StaleConfig", 13388)
    StaleShardVersion = ("StaleShardVersion", 63)  # MongoDB's obsolete name for StaleConfig; still retried
    # MongoDB's names for these are BSONObjectTooLarge (10334) and ShardKeyTooBig; the
    # wire protocol maps them.
    DocumentTooLarge = ("DocumentTooLarge", 10334)
    ShardKeyTooLarge = ("ShardKeyTooLarge", None)
    # shardlog's own
    ShardAlreadyExists = ("ShardAlreadyExists", None)
    ZoneRangeNotFound = ("ZoneRangeNotFound", None)
    NoSuchMigration = ("NoSuchMigration", None)
    MigrationAborted = ("MigrationAborted", None)
    RangeDeletionPending = ("RangeDeletionPending", None)
    ChunkChanged = ("ChunkChanged", None)  # the balancer: an action's range is no longer a chunk of its owner
    BadRecord = ("BadRecord", None)  # a record that does not parse (it also goes to the dead letters)
    BadReply = ("BadReply", None)
    Timeout = ("Timeout", None)
    KafkaUnavailable = ("KafkaUnavailable", None)
    ClusterNotFound = ("ClusterNotFound", None)
    ShardUnavailable = ("ShardUnavailable", None)


# ------------------------------------------------------------------ names

DB_FORBIDDEN = set('/\\. "$*<>:|?\x00')
RESERVED_DBS = {"admin", "config", "local"}


def check_shard_name(name: str) -> None:
    if not SHARD_ID.match(name):
        raise CommandError(ErrorCode.BadValue, f"invalid shard name {name!r}: use 1-64 of A-Z a-z 0-9 _ -")


def check_db_name(db: str) -> None:
    if not db or len(db) >= 64 or any(ch in DB_FORBIDDEN for ch in db):
        raise CommandError(
            ErrorCode.InvalidNamespace,
            f'invalid database name {db!r}: 1-63 characters, none of / \\ . space " $ * < > : | ?',
        )
    if db in RESERVED_DBS:
        raise CommandError(ErrorCode.InvalidNamespace, f"database {db!r} is reserved")


def valid_collection_name(coll: str) -> bool:
    """MongoDB's rule for any collection name: not empty, no NUL, not starting with '.'
    ('db..c' names no collection)."""
    return bool(coll) and not coll.startswith(".") and "\x00" not in coll


def split_ns(ns: str) -> tuple[str, str]:
    """'db.coll' -> (db, coll), or InvalidNamespace with what is wrong."""
    db, dot, coll = ns.partition(".")
    if not dot or not coll:
        raise CommandError(ErrorCode.InvalidNamespace, f"invalid namespace {ns!r}: expected 'database.collection'")
    check_db_name(db)
    if not valid_collection_name(coll) or len(ns.encode()) > 255 or "$" in coll or coll.startswith("system."):
        raise CommandError(
            ErrorCode.InvalidNamespace,
            f"invalid collection name in {ns!r}: a collection name does not start with '.', holds no '$' or NUL, "
            "is not 'system.*', and the namespace is at most 255 bytes",
        )
    return db, coll


def check_zone_name(zone: str) -> None:
    if not zone or len(zone) > 64 or "\x00" in zone:
        raise CommandError(ErrorCode.BadValue, f"invalid zone name {zone!r}: 1-64 characters")
