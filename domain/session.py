"""A write's session fields, parsed and refused as MongoDB does (docs/decisions/0015).

    lsid       {"id": "<uuid>"}: the logical session (MongoDB's LogicalSessionId)
    txnNumber  an integer >= 0: the retryable write's number within its session
    stmtIds    router -> shard only: the statement ids of a part, one per document of an
               insert (its index in the client's batch), [0] for an update, delete or
               findAndModify; clients may not send them (the router assigns them)

A client's operation is checked by `client_session` (on the router), a shard's part by
`shard_session`.  Writes without an lsid are not recorded; a txnNumber without an lsid, or
on a multi update/delete, is refused (MongoDB's InvalidOptions).  Pure: no I/O, no clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from domain.protocol import ErrorCode
from libs.errors import CommandError

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RetryableWrite:
    """A write to record: its session (the lsid's uuid), txnNumber and statement ids."""

    lsid: str
    txn_number: int
    stmt_ids: tuple[int, ...] = ()


def _type_name(value: Any) -> str:
    """The BSON type name MongoDB's messages use for a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _wrong_type(field: str, value: Any, expected: str) -> CommandError:
    return CommandError(
        ErrorCode.TypeMismatch,
        f"BSON field '{field}' is the wrong type '{_type_name(value)}', expected type '{expected}'",
    )


def parse_lsid(raw: Any) -> str | None:
    """The session's uuid (canonical form), or None without an lsid."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _wrong_type("OperationSessionInfo.lsid", raw, "object")
    if "id" not in raw:
        raise CommandError(
            ErrorCode.IDLFailedToParse, "BSON field 'LogicalSessionId.id' is missing but a required field"
        )
    unknown = sorted(set(raw) - {"id"})
    if unknown:
        raise CommandError(ErrorCode.IDLUnknownField, f"BSON field 'LogicalSessionId.{unknown[0]}' is an unknown field")
    sid = raw["id"]
    if not isinstance(sid, str):
        raise _wrong_type("LogicalSessionId.id", sid, "binData")
    try:
        return str(uuid.UUID(sid))
    except ValueError:
        raise CommandError(ErrorCode.BadValue, f"LogicalSessionId.id {sid!r} is not a UUID") from None


def parse_txn_number(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _wrong_type("OperationSessionInfo.txnNumber", raw, "long")
    if raw < 0:
        # MongoDB: InvalidOptions "Transaction number cannot be negative" (initializeOperationSessionInfo)
        raise CommandError(ErrorCode.InvalidOptions, "Transaction number cannot be negative")
    if raw >= 2**63:
        raise CommandError(ErrorCode.BadValue, f"txnNumber {raw} does not fit a 64-bit integer")
    return raw


def parse_stmt_ids(raw: Any, count: int) -> tuple[int, ...]:
    """A shard part's statement ids: `count` distinct int32s >= 0."""
    if not isinstance(raw, list):
        raise _wrong_type("stmtIds", raw, "array")
    if len(raw) != count:
        raise CommandError(ErrorCode.BadValue, f"stmtIds has {len(raw)} ids for {count} statement(s)")
    for sid in raw:
        if isinstance(sid, bool) or not isinstance(sid, int):
            raise _wrong_type("stmtIds", sid, "int")
        if not 0 <= sid <= INT32_MAX:
            raise CommandError(ErrorCode.BadValue, f"statement id {sid} is out of range (0 to {INT32_MAX})")
    if len(set(raw)) != len(raw):
        raise CommandError(ErrorCode.BadValue, "stmtIds must be unique")
    return tuple(raw)


def _statements(req: Any) -> int:
    """How many statements a write has: one per document of an insert, else one."""
    docs = getattr(req, "docs", None)
    return len(docs) if isinstance(docs, list) else 1


def _session_of(req: Any) -> tuple[str, int] | None:
    """(lsid, txnNumber) of a retryable write, None without a txnNumber; refuses a txnNumber
    without an lsid and a multi write with one."""
    lsid = parse_lsid(getattr(req, "lsid", None))
    txn = parse_txn_number(getattr(req, "txnNumber", None))
    if txn is None:
        return None
    if lsid is None:
        raise CommandError(ErrorCode.InvalidOptions, "Transaction number requires a session ID to also be specified")
    if getattr(req, "multi", False):
        # MongoDB's words for an update (a delete says limit=0).
        what = "limit=0" if req.type == "Delete" else "multi=true"
        raise CommandError(ErrorCode.InvalidOptions, f"Cannot use (or request) retryable writes with {what}")
    return lsid, txn


def client_session(req: Any) -> RetryableWrite | None:
    """A client's write: validated session fields; the write to record (stmtIds still empty:
    the router assigns them), or None when it is not a retryable write."""
    if getattr(req, "stmtIds", None) is not None:
        raise CommandError(ErrorCode.BadValue, "stmtIds are assigned by the router; a client may not send them")
    found = _session_of(req)
    return RetryableWrite(*found) if found is not None else None


def shard_session(req: Any) -> RetryableWrite | None:
    """A router's part for a shard: the write to record, or None (no lsid or no txnNumber)."""
    found = _session_of(req)
    if found is None:
        if getattr(req, "stmtIds", None) is not None:
            raise CommandError(ErrorCode.BadValue, "stmtIds without a txnNumber")
        return None
    return RetryableWrite(*found, parse_stmt_ids(getattr(req, "stmtIds", None), _statements(req)))
