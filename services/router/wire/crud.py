"""CRUD over the wire: insert, update, delete, find / getMore / killCursors, count, distinct,
findAndModify, explain, and the sessions commands (endSessions, killSessions).  Each command
document becomes the client operation record the Kafka front takes (`schemas.shard`), run by
`RouterEdge.routing.handle`; results and errors come back in the drivers' shapes (n,
nModified, upserted, writeErrors with MongoDB's codes).

The parsers (`*_record`) and reply shapers are pure; the handlers at the end are the thin
async driver.  Documents are passed through as the wire decoded them (BSON values): only the
session fields are converted, because the domain reads them in Extended JSON
(`session_fields`, `wire_cluster_time`).  The `config` database is read from
`config_db.documents` and filtered, sorted and projected here; writes to it are refused.
"""

from __future__ import annotations

from typing import Any

from bson import Int64, Timestamp

from domain import query
from domain.bsonvalues import type_name
from domain.protocol import ErrorCode
from domain.query import QueryError
from domain.shardkey import encode_value
from libs.errors import CommandError
from schemas import shard as s
from services.router.wire import config_db
from services.router.wire.commands import (
    SERVER_COMMANDS,
    UNAUTHORIZED,
    Connection,
    WireCommandError,
    command_error_code,
)
from services.router.wire.frames import MAX_WRITE_BATCH_SIZE
from services.router.wire.gossip import (
    pinned_read_concern,
    refuse_snapshot_of_config,
    snapshot_time,
    wire_lsid,
    wire_read_concern,
)
from services.router.wire.options import (
    COLLATION,
    HONOURED,
    LET,
    Fields,
    only_if_empty,
    only_if_false,
    refused,
)

# MongoDB's numbers for codes domain.protocol.ErrorCode lacks.
INVALID_LENGTH = (16, "InvalidLength")  # a write batch of 0 or more than maxWriteBatchSize statements

DEFAULT_BATCH_SIZE = 101  # find's first batch, as MongoDB's
UNBOUNDED_BATCH = 2**31 - 1  # a getMore without batchSize: as many as fit a reply (MAX_BATCH_BYTES)
DRAIN_BATCH = 10_000  # router-made results (distinct, batchSize 0) read the router's own cursor in these

WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})


# ------------------------------------------------------------------ the fields each command defines
# (options.py: honoured, or refused with NotImplemented; anything else IDLUnknownField)

INSERT_FIELDS = Fields(
    "insert",
    {
        "documents": HONOURED,
        "ordered": HONOURED,
        "bypassDocumentValidation": HONOURED,  # no validators exist: there is nothing to bypass
    },
)
UPDATE_FIELDS = Fields(
    "update",
    {"updates": HONOURED, "ordered": HONOURED, "bypassDocumentValidation": HONOURED, "let": LET},
)
UPDATE_STATEMENT = Fields(
    "update.updates",
    {
        "q": HONOURED,
        "u": HONOURED,
        "multi": HONOURED,
        "upsert": HONOURED,
        "hint": HONOURED,
        "collation": COLLATION,
        "arrayFilters": HONOURED,
        "c": only_if_empty("c (constants of a pipeline-style update)"),
        "sort": HONOURED,  # MongoDB 8.0: which document an updateOne or replaceOne changes
        "upsertSupplied": refused("upsertSupplied (an internal field of MongoDB's)"),
    },
)
DELETE_FIELDS = Fields("delete", {"deletes": HONOURED, "ordered": HONOURED, "let": LET})
DELETE_STATEMENT = Fields(
    "delete.deletes", {"q": HONOURED, "limit": HONOURED, "hint": HONOURED, "collation": COLLATION}
)
FIND_FIELDS = Fields(
    "find",
    {
        "filter": HONOURED,
        "sort": HONOURED,
        "projection": HONOURED,
        "hint": HONOURED,
        "skip": HONOURED,
        "limit": HONOURED,
        "batchSize": HONOURED,
        "singleBatch": HONOURED,
        "allowDiskUse": HONOURED,  # shardlog's sorts have no memory limit to lift
        "oplogReplay": HONOURED,  # a no-op in MongoDB since 4.4
        "let": LET,
        "collation": COLLATION,
        "min": only_if_empty("min (index bounds)"),
        "max": only_if_empty("max (index bounds)"),
        "returnKey": only_if_false("returnKey"),
        "showRecordId": only_if_false("showRecordId"),
        "tailable": only_if_false("tailable (cursors on capped collections)"),
        "awaitData": only_if_false("awaitData (tailable cursors)"),
        "noCursorTimeout": HONOURED,  # the router holds the rest of every find: it keeps that cursor
        "allowPartialResults": only_if_false("allowPartialResults (an unreachable shard fails the query)"),
        "readOnce": only_if_false("readOnce"),
    },
)
GET_MORE_FIELDS = Fields(
    "getMore",
    {
        "collection": HONOURED,
        "batchSize": HONOURED,
        "term": refused("term (an internal field of MongoDB's)"),
        "lastKnownCommittedOpTime": refused("lastKnownCommittedOpTime (an internal field of MongoDB's)"),
    },
)
KILL_CURSORS_FIELDS = Fields("killCursors", {"cursors": HONOURED})
COUNT_FIELDS = Fields(
    "count",
    {
        "query": HONOURED,
        "limit": HONOURED,
        "skip": HONOURED,
        "hint": HONOURED,
        "collation": COLLATION,
        "fields": HONOURED,  # MongoDB's count takes and ignores it too
    },
)
DISTINCT_FIELDS = Fields("distinct", {"key": HONOURED, "query": HONOURED, "collation": COLLATION, "hint": HONOURED})
FIND_AND_MODIFY_FIELDS = Fields(
    "findAndModify",
    {
        "query": HONOURED,
        "sort": HONOURED,
        "remove": HONOURED,
        "update": HONOURED,
        "new": HONOURED,
        "fields": HONOURED,
        "upsert": HONOURED,
        "bypassDocumentValidation": HONOURED,
        "hint": HONOURED,
        "let": LET,
        "collation": COLLATION,
        "arrayFilters": HONOURED,
    },
)
EXPLAIN_FIELDS = Fields("explain", {"verbosity": HONOURED})
END_SESSIONS_FIELDS = Fields("endSessions", {})
KILL_SESSIONS_FIELDS = Fields("killSessions", {})


# ------------------------------------------------------------------ session fields (pure)


def session_fields(cmd: dict[str, Any], *, write: bool) -> dict[str, Any]:
    """The record's session fields from a command: lsid, and for a write its txnNumber (a
    transaction's statement is made one by the router: wire/transactions.py, route.py)."""
    fields: dict[str, Any] = {"lsid": wire_lsid(cmd.get("lsid"))}
    if write:
        txn = cmd.get("txnNumber")
        fields["txnNumber"] = int(txn) if isinstance(txn, int) and not isinstance(txn, bool) else txn
    return fields


# ------------------------------------------------------------------ field checks (pure)


def _wrong_type(command: str, name: str, value: Any, expected: str) -> CommandError:
    return CommandError(
        ErrorCode.TypeMismatch,
        f"BSON field '{command}.{name}' is the wrong type '{type_name(value)}', expected type '{expected}'",
    )


def _missing(command: str, name: str) -> CommandError:
    return CommandError(ErrorCode.IDLFailedToParse, f"BSON field '{command}.{name}' is missing but a required field")


def _doc(cmd: dict[str, Any], command: str, name: str, default: Any = None) -> Any:
    value = cmd.get(name, default)
    if value is not None and not isinstance(value, dict):
        raise _wrong_type(command, name, value, "object")
    return value


def _bool(cmd: dict[str, Any], command: str, name: str, default: bool) -> bool:
    value = cmd.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):  # MongoDB takes numbers for booleans
        return bool(value)
    raise _wrong_type(command, name, value, "bool")


def _int(cmd: dict[str, Any], command: str, name: str, default: int | None) -> int | None:
    value = cmd.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(command, name, value, "long")
    if isinstance(value, float) and not value.is_integer():
        raise CommandError(ErrorCode.BadValue, f"'{command}.{name}' must be a whole number, not {value}")
    return int(value)


def _non_negative(cmd: dict[str, Any], command: str, name: str, default: int | None) -> int | None:
    value = _int(cmd, command, name, default)
    if value is not None and value < 0:
        raise CommandError(ErrorCode.BadValue, f"{name} value must be non-negative, but received: {value}")
    return value


def namespace(cmd: dict[str, Any]) -> str:
    """`<$db>.<collection>` of a command whose first value names the collection."""
    name = next(iter(cmd))
    coll = cmd[name]
    if not isinstance(coll, str):
        raise CommandError(ErrorCode.InvalidNamespace, f"collection name has invalid type {type_name(coll)}")
    return f"{cmd['$db']}.{coll}"


def _batch(cmd: dict[str, Any], command: str, name: str) -> list[Any]:
    if name not in cmd:
        raise _missing(command, name)
    ops = cmd[name]
    if not isinstance(ops, list):
        raise _wrong_type(command, name, ops, "array")
    if not 1 <= len(ops) <= MAX_WRITE_BATCH_SIZE:
        raise WireCommandError(
            INVALID_LENGTH,
            f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. Got {len(ops)} operations.",
        )
    return ops


def _reject_config_write(cmd: dict[str, Any], ns: str) -> None:
    if cmd["$db"] == "config":
        raise config_db.refuse_write(ns.partition(".")[2])


# ------------------------------------------------------------------ command -> record (pure)


def insert_record(cmd: dict[str, Any]) -> s.Insert:
    ns = namespace(cmd)
    docs = _batch(cmd, "insert", "documents")
    return s.Insert(ns=ns, docs=docs, ordered=_bool(cmd, "insert", "ordered", True), **session_fields(cmd, write=True))


def update_records(cmd: dict[str, Any]) -> tuple[list[s.Update | CommandError], bool]:
    """One Update per statement (statement i: stmtId i), and whether the batch is ordered.  A
    statement whose filter or update MongoDB refuses is its refusal (a write error of that
    statement, as mongod reports it), whatever the filter would match."""
    ns = namespace(cmd)
    ops = _batch(cmd, "update", "updates")
    session = session_fields(cmd, write=True)
    records: list[s.Update | CommandError] = []
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise _wrong_type("update", f"updates.{i}", op, "object")
        UPDATE_STATEMENT.check_statement(op)
        if "q" not in op:
            raise _missing("update.updates", "q")
        if "u" not in op:
            raise _missing("update.updates", "u")
        u = op["u"]
        if not isinstance(u, (dict, list)):
            raise _wrong_type("update.updates", "u", u, "object")
        flt = _doc(op, "update.updates", "q", {})
        multi = _bool(op, "update.updates", "multi", False)
        sort = _doc(op, "update.updates", "sort") or None
        if sort and multi:
            raise CommandError(ErrorCode.InvalidOptions, "Cannot specify sort with multi=true")
        try:
            if sort:
                _check_sort(sort)  # a bad sort is this statement's error
            _check_query(flt)
            u = _check_update(u, multi, op.get("arrayFilters"))
        except CommandError as e:
            records.append(e)
            continue
        records.append(
            s.Update(
                ns=ns,
                filter=flt,
                update=u,
                multi=multi,
                upsert=_bool(op, "update.updates", "upsert", False),
                hint=_hint(op, "update.updates"),
                sort=sort,
                arrayFilters=op.get("arrayFilters") or None,
                stmtId=i,
                **session,
            )
        )
    return records, _bool(cmd, "update", "ordered", True)


def delete_records(cmd: dict[str, Any]) -> tuple[list[s.Delete | CommandError], bool]:
    """One Delete per statement, and whether the batch is ordered; a statement whose filter
    MongoDB refuses is its refusal (a write error of that statement)."""
    ns = namespace(cmd)
    ops = _batch(cmd, "delete", "deletes")
    session = session_fields(cmd, write=True)
    records: list[s.Delete | CommandError] = []
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise _wrong_type("delete", f"deletes.{i}", op, "object")
        DELETE_STATEMENT.check_statement(op)
        if "q" not in op:
            raise _missing("delete.deletes", "q")
        if "limit" not in op:
            raise _missing("delete.deletes", "limit")
        limit = _int(op, "delete.deletes", "limit", None)
        if limit not in (0, 1):
            raise CommandError(
                ErrorCode.FailedToParse, f"The limit field in delete objects must be 0 or 1. Got {limit}"
            )
        flt = _doc(op, "delete.deletes", "q", {})
        try:
            _check_query(flt)
        except CommandError as e:
            records.append(e)
            continue
        records.append(
            s.Delete(ns=ns, filter=flt, multi=limit == 0, hint=_hint(op, "delete.deletes"), stmtId=i, **session)
        )
    return records, _bool(cmd, "delete", "ordered", True)


def find_record(cmd: dict[str, Any]) -> tuple[s.Find, int, bool]:
    """The Find, the first batch's size (0: an empty first batch, everything left in the
    cursor), and singleBatch."""
    ns = namespace(cmd)
    batch = _non_negative(cmd, "find", "batchSize", DEFAULT_BATCH_SIZE)
    assert batch is not None
    record = s.Find(
        ns=ns,
        filter=_doc(cmd, "find", "filter", {}),
        sort=_doc(cmd, "find", "sort") or None,
        skip=_non_negative(cmd, "find", "skip", 0) or 0,
        limit=_non_negative(cmd, "find", "limit", 0) or 0,
        projection=_doc(cmd, "find", "projection"),
        batchSize=max(batch, 1),
        readConcern=wire_read_concern(cmd.get("readConcern")),
        hint=_hint(cmd, "find"),  # issue 15: the shards' planner takes it
        **session_fields(cmd, write=False),
    )
    return record, batch, _bool(cmd, "find", "singleBatch", False)


def get_more_record(cmd: dict[str, Any]) -> tuple[s.GetMore, str]:
    cid = cmd["getMore"]
    if isinstance(cid, bool) or not isinstance(cid, int):
        raise _wrong_type("getMore", "getMore", cid, "long")
    coll = cmd.get("collection")
    if not isinstance(coll, str):
        raise (
            _missing("getMore", "collection") if coll is None else _wrong_type("getMore", "collection", coll, "string")
        )
    size = _non_negative(cmd, "getMore", "batchSize", None)
    return (
        s.GetMore(cursorId=int(cid), batchSize=size or UNBOUNDED_BATCH, lsid=wire_lsid(cmd.get("lsid"))),
        f"{cmd['$db']}.{coll}",
    )


def count_record(cmd: dict[str, Any]) -> tuple[s.Count, int, int]:
    """The Count, and the skip and limit applied to its n here (limit 0: none; a negative
    limit counts as its absolute value, as in MongoDB)."""
    record = s.Count(
        ns=namespace(cmd),
        filter=_doc(cmd, "count", "query", {}) or {},
        readConcern=wire_read_concern(cmd.get("readConcern")),
        hint=_hint(cmd, "count"),
        **session_fields(cmd, write=False),
    )
    skip = _non_negative(cmd, "count", "skip", 0) or 0
    limit = abs(_int(cmd, "count", "limit", 0) or 0)
    return record, skip, limit


def counted(n: int, skip: int, limit: int) -> int:
    n = max(0, n - skip)
    return min(n, limit) if limit else n


def distinct_record(cmd: dict[str, Any]) -> tuple[s.Find, str]:
    key = cmd.get("key")
    if key is None:
        raise _missing("distinct", "key")
    if not isinstance(key, str):
        raise _wrong_type("distinct", "key", key, "string")
    record = s.Find(
        ns=namespace(cmd),
        filter=_doc(cmd, "distinct", "query", {}) or {},
        batchSize=DRAIN_BATCH,
        readConcern=wire_read_concern(cmd.get("readConcern")),
        hint=_hint(cmd, "distinct"),
        **session_fields(cmd, write=False),
    )
    return record, key


def _leaves(value: Any, parts: list[str], out: list[Any]) -> None:
    """The values at a dotted path, fanning out over arrays of subdocuments; a leaf array
    gives its elements (MongoDB's distinct counts the elements, not the array)."""
    if not parts:
        out.extend(value if isinstance(value, list) else [value])
    elif isinstance(value, dict):
        if parts[0] in value:
            _leaves(value[parts[0]], parts[1:], out)
    elif isinstance(value, list):
        for element in value:
            if isinstance(element, dict):
                _leaves(element, parts, out)


def distinct_values(docs: list[dict[str, Any]], key: str) -> list[Any]:
    """MongoDB's distinct: the values at `key` (arrays unwound; a missing field counts
    nothing), each once by MongoDB equality, in MongoDB order."""
    seen: dict[bytes, Any] = {}
    for doc in docs:
        found: list[Any] = []
        _leaves(doc, key.split("."), found)
        for v in found:
            seen.setdefault(encode_value(v), v)
    return [seen[k] for k in sorted(seen)]


def find_and_modify_record(cmd: dict[str, Any]) -> s.FindAndModify:
    name = next(iter(cmd))
    update = cmd.get("update")
    if update is not None and not isinstance(update, (dict, list)):
        raise _wrong_type(name, "update", update, "object")
    flt = _doc(cmd, name, "query", {}) or {}
    _check_query(flt)
    if update is not None:
        update = _check_update(update, False, cmd.get("arrayFilters"))
    return s.FindAndModify(
        ns=namespace(cmd),
        query=flt,
        sort=_doc(cmd, name, "sort") or None,
        update=update,
        remove=_bool(cmd, name, "remove", False),
        new=_bool(cmd, name, "new", False),
        upsert=_bool(cmd, name, "upsert", False),
        fields=_doc(cmd, name, "fields"),
        hint=_hint(cmd, name),
        arrayFilters=cmd.get("arrayFilters") or None,
        **session_fields(cmd, write=True),
    )


def _check_query(flt: dict[str, Any]) -> None:
    """A filter is refused as MongoDB refuses it, before it is routed: whatever it would match."""
    try:
        query.compile_filter(flt)
    except QueryError as e:
        raise CommandError(e.code, str(e)) from None


def _check_sort(sort: dict[str, Any]) -> None:
    try:
        query.sort_key(sort)
    except QueryError as e:
        raise CommandError(e.code, str(e)) from None


def _check_update(update: Any, multi: bool, array_filters: Any = None) -> dict[str, Any] | list[Any]:
    """An update is refused as MongoDB refuses it, whatever it would match (the shard checks it
    again, for clients that reach it without the wire)."""
    try:
        query.check_update(update, array_filters)
    except QueryError as e:
        raise CommandError(e.code, str(e)) from None
    assert isinstance(update, (dict, list))  # check_update refused anything else
    if multi and isinstance(update, dict) and update and not query.is_update_operator_doc(update):
        raise CommandError(ErrorCode.FailedToParse, "multi update is not supported for replacement-style update")
    return update


# ------------------------------------------------------------------ replies (pure)


def write_error(index: int, code: str, message: str, info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A writeErrors element as mongos sends it: MongoDB's number, the message (a DuplicateKey's
    keyPattern and keyValue too)."""
    number, _ = command_error_code(code)
    extra: dict[str, Any] = {k: info[k] for k in ("keyPattern", "keyValue") if info and k in info}
    return {"index": index, "code": number, "errmsg": message, **extra}


def insert_reply(result: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = {"n": result["inserted"]}
    errors = [write_error(e["index"], e["code"], e["errmsg"], e) for e in result.get("writeErrors") or []]
    if errors:
        reply["writeErrors"] = errors
    return reply


def cursor_reply(result: dict[str, Any], ns: str, batch: str) -> dict[str, Any]:
    cursor = {batch: result["docs"], "id": Int64(result.get("cursorId") or 0), "ns": ns}
    if (at := result.get("atClusterTime")) is not None:  # a snapshot read: the time it read at
        cursor["atClusterTime"] = Timestamp(at >> 32, at & 0xFFFFFFFF)
    return {"cursor": cursor}


# Errors of one statement that are the whole command's (mongos answers them at the top level,
# and a driver retries a retryable write on them): anything but the statement's own failure.
COMMAND_LEVEL = frozenset(
    {
        ErrorCode.TransactionTooOld,
        # a transaction's statement fails as a whole (the transaction is aborted): mongod's too
        ErrorCode.WriteConflict,
        ErrorCode.NoSuchTransaction,
        ErrorCode.TransactionCommitted,
        ErrorCode.OperationNotSupportedInTransaction,
        ErrorCode.PreparedTransactionInProgress,
        ErrorCode.SnapshotTooOld,
        ErrorCode.SnapshotUnavailable,
        ErrorCode.StaleChunkHistory,
        ErrorCode.MigrationConflict,
        ErrorCode.InvalidOptions,
        ErrorCode.InvalidNamespace,
        ErrorCode.TypeMismatch,
        ErrorCode.IDLFailedToParse,
        ErrorCode.IDLUnknownField,
        ErrorCode.KeyNotFound,
        ErrorCode.TimeProofMismatch,
        ErrorCode.ClusterTimeFailsRateLimiter,
        ErrorCode.ShardUnavailable,
        ErrorCode.Timeout,
        ErrorCode.KafkaUnavailable,
        ErrorCode.ExceededTimeLimit,
        ErrorCode.ShutdownInProgress,
        ErrorCode.PrimarySteppedDown,
        ErrorCode.InterruptedDueToReplStateChange,
        ErrorCode.NetworkTimeout,
        ErrorCode.HostUnreachable,
    }
)


# ------------------------------------------------------------------ handlers


async def _run(conn: Connection, record: Any) -> dict[str, Any]:
    """One client operation through the router, noting its operationTime for the reply."""
    routing = conn.cluster().routing
    try:
        return await routing.handle(record)
    finally:
        conn.operation_time = max(conn.operation_time, routing.reached_time())


async def _statements(
    conn: Connection, records: list[Any], ordered: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run a batch's statements one after another: (index, result) per success, writeErrors;
    ordered stops at the first error.  A command-level failure is raised as it is."""
    results: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for i, record in enumerate(records):
        if isinstance(record, CommandError):  # refused before routing (update_records): this statement's
            errors.append(write_error(i, record.code, record.message, record.info))
            if ordered:
                break
            continue
        try:
            results.append({"index": i, **await _run(conn, record)})
        except CommandError as e:
            if e.code in COMMAND_LEVEL:
                raise
            errors.append(write_error(i, e.code, e.message, e.info))
            if ordered:
                break
    return results, errors


@SERVER_COMMANDS.register("insert", fields=INSERT_FIELDS)
async def _insert(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record = insert_record(cmd)
    _reject_config_write(cmd, record.ns)
    return insert_reply(await _run(conn, record))


@SERVER_COMMANDS.register("update", fields=UPDATE_FIELDS)
async def _update(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    records, ordered = update_records(cmd)
    _reject_config_write(cmd, namespace(cmd))
    results, errors = await _statements(conn, records, ordered)
    upserted = [{"index": r["index"], "_id": r["upsertedId"]} for r in results if "upsertedId" in r]
    reply: dict[str, Any] = {
        "n": sum(r["matched"] for r in results) + len(upserted),
        "nModified": sum(r["modified"] for r in results),
    }
    if upserted:
        reply["upserted"] = upserted
    if errors:
        reply["writeErrors"] = errors
    return reply


@SERVER_COMMANDS.register("delete", fields=DELETE_FIELDS)
async def _delete(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    records, ordered = delete_records(cmd)
    _reject_config_write(cmd, namespace(cmd))
    results, errors = await _statements(conn, records, ordered)
    reply: dict[str, Any] = {"n": sum(r["deleted"] for r in results)}
    if errors:
        reply["writeErrors"] = errors
    return reply


@SERVER_COMMANDS.register("findAndModify", "findandmodify", fields=FIND_AND_MODIFY_FIELDS)
async def _find_and_modify(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record = find_and_modify_record(cmd)
    _reject_config_write(cmd, record.ns)
    result = await _run(conn, record)
    return {"lastErrorObject": result["lastErrorObject"], "value": result["value"]}


async def _config_docs(conn: Connection, ns: str, flt: dict[str, Any], read_concern: Any) -> list[dict[str, Any]]:
    """The matching documents of a `config.<coll>` collection, from the router's catalog."""
    refuse_snapshot_of_config(ns, read_concern)
    matcher = query.compile_filter(flt)
    return [d for d in await config_db.documents(conn.cluster(), ns.partition(".")[2]) if matcher.matches(d)]


async def _drain(conn: Connection, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every document of a router cursor's result (the router holds the rest in memory)."""
    docs, cid = list(result["docs"]), result.get("cursorId") or 0
    while cid:
        more = await _run(conn, s.GetMore(cursorId=cid, batchSize=UNBOUNDED_BATCH))
        docs += more["docs"]
        cid = more["cursorId"]
    return docs


async def _find_docs(conn: Connection, record: s.Find) -> list[dict[str, Any]]:
    """All documents a find returns (no batching), the config database included."""
    if record.ns.startswith("config."):
        try:
            docs = await _config_docs(conn, record.ns, record.filter, record.readConcern)
            if record.sort:
                docs.sort(key=query.sort_key(record.sort))
            docs = docs[record.skip : record.skip + record.limit if record.limit else None]
            return [query.apply_projection(d, record.projection) for d in docs] if record.projection else docs
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
    return await _drain(conn, await _run(conn, record.model_copy(update={"batchSize": DRAIN_BATCH})))


@SERVER_COMMANDS.register("find", fields=FIND_FIELDS)
async def _find(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record, batch, single = find_record(cmd)
    routing = conn.cluster().routing
    if record.ns.startswith("config.") or batch == 0:
        session = str(record.lsid["id"]) if isinstance(record.lsid, dict) and "id" in record.lsid else None
        if record.lsid is not None:
            routing.sessions.use(record.lsid)
        # A snapshot read's time chosen here, so that the reply can name it (batchSize 0: the
        # documents wait in the router, read at that time).
        read_concern = pinned_read_concern(record.readConcern, routing.clock.cluster_time)
        docs = await _find_docs(conn, record.model_copy(update={"readConcern": read_concern}))
        result = routing.open_cursor(docs, batch, session=session)
        if (at := snapshot_time(read_concern)) is not None:
            result = {**result, "atClusterTime": (at.time << 32) | at.inc}
    else:
        result = await _run(conn, record)
    if single and result.get("cursorId"):
        routing.kill_cursors([result["cursorId"]])
        result = {**result, "cursorId": 0}
    if result.get("cursorId"):
        routing.tag_cursor(result["cursorId"], record.ns, _bool(cmd, "find", "noCursorTimeout", False))
    return cursor_reply(result, record.ns, "firstBatch")


@SERVER_COMMANDS.register("getMore", fields=GET_MORE_FIELDS)
async def _get_more(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record, ns = get_more_record(cmd)
    cursor = conn.cluster().routing.cursors.get(record.cursorId)
    if cursor is not None and cursor.ns is not None and cursor.ns != ns:
        raise WireCommandError(
            UNAUTHORIZED,
            f"Requested getMore on namespace '{ns}', but cursor belongs to a different namespace {cursor.ns}",
        )
    return cursor_reply(await _run(conn, record), ns, "nextBatch")


@SERVER_COMMANDS.register("killCursors", fields=KILL_CURSORS_FIELDS)
async def _kill_cursors(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    namespace(cmd)
    ids = cmd.get("cursors")
    if not isinstance(ids, list):
        raise _missing("killCursors", "cursors") if ids is None else _wrong_type("killCursors", "cursors", ids, "array")
    for cid in ids:
        if isinstance(cid, bool) or not isinstance(cid, int):
            raise _wrong_type("killCursors", "cursors", cid, "long")
    killed, missing = conn.cluster().routing.kill_cursors([int(c) for c in ids])
    return {
        "cursorsKilled": [Int64(c) for c in killed],
        "cursorsNotFound": [Int64(c) for c in missing],
        "cursorsAlive": [],
        "cursorsUnknown": [],
    }


@SERVER_COMMANDS.register("count", fields=COUNT_FIELDS)
async def _count(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record, skip, limit = count_record(cmd)
    if record.ns.startswith("config."):
        try:
            n = len(await _config_docs(conn, record.ns, record.filter, record.readConcern))
        except QueryError as e:
            raise CommandError(e.code, str(e)) from None
    else:
        n = (await _run(conn, record))["n"]
    return {"n": counted(n, skip, limit)}


@SERVER_COMMANDS.register("distinct", fields=DISTINCT_FIELDS)
async def _distinct(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """Router-side: the shards return the matching documents, the router takes their values."""
    record, key = distinct_record(cmd)
    read_concern = pinned_read_concern(cmd.get("readConcern"), conn.cluster().routing.clock.cluster_time)
    record = record.model_copy(update={"readConcern": read_concern, **({"projection": {key: 1}} if key else {})})
    out: dict[str, Any] = {"values": distinct_values(await _find_docs(conn, record), key)}
    if (at := snapshot_time(read_concern)) is not None:
        out["atClusterTime"] = at
    return out


@SERVER_COMMANDS.register("explain", fields=EXPLAIN_FIELDS)
async def _explain(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """mongos's explain: which shards a find / count / update / delete / findAndModify / distinct
    targets, and each shard's plan (winningPlan, rejectedPlans) and, unless the verbosity is
    queryPlanner, its executionStats (issue 15: domain/planner.py)."""
    inner = cmd.get("explain")
    if not isinstance(inner, dict) or not inner:
        raise _wrong_type("explain", "explain", inner, "object")
    name = next(iter(inner))
    inner = {**inner, "$db": cmd["$db"]}
    explained = SERVER_COMMANDS.table.get(name)
    if explained is not None and explained.fields is not None:
        explained.fields.check(inner)  # the explained command's options: honoured or refused, as when run
    verbosity = cmd.get("verbosity", "allPlansExecution")
    if verbosity not in ("queryPlanner", "executionStats", "allPlansExecution"):
        raise CommandError(
            ErrorCode.FailedToParse,
            f"verbosity string must be one of queryPlanner, executionStats, allPlansExecution: {verbosity!r}",
        )
    shape: dict[str, Any] = {}
    if name == "find":
        record, _, _ = find_record(inner)
        flt = record.filter
        shape = {"sort": record.sort, "projection": record.projection, "skip": record.skip, "limit": record.limit}
        shape["hint"] = record.hint
    elif name == "count":
        flt = _doc(inner, name, "query", {}) or {}
        shape["hint"] = _hint(inner, name)
    elif name in ("update", "delete"):
        ops = inner.get("updates" if name == "update" else "deletes")
        first = ops[0] if isinstance(ops, list) and ops and isinstance(ops[0], dict) else {}
        flt = first.get("q", {})
        shape["hint"] = _hint(first, name)
    elif name in ("findAndModify", "findandmodify", "distinct"):
        flt = _doc(inner, name, "query", {}) or {}
        if name != "distinct":
            shape["sort"] = _doc(inner, name, "sort") or None
    else:
        raise CommandError(ErrorCode.CommandNotFound, f"Explain failed due to unknown command: {name}")
    result = await _run(conn, s.Explain(ns=namespace(inner), filter=flt, verbosity=verbosity, **shape))
    shards = result["shards"]
    plans = result.get("plans", [])
    stage = "SINGLE_SHARD" if len(shards) == 1 else ("SHARD_MERGE_SORT" if shape.get("sort") else "SHARD_MERGE")
    out: dict[str, Any] = {
        "queryPlanner": {
            "mongosPlannerVersion": 1,
            "winningPlan": {
                "stage": stage,
                "shards": [{"shardName": p["shard"], "namespace": result["ns"], **p["queryPlanner"]} for p in plans]
                or [{"shardName": sh, "namespace": result["ns"]} for sh in shards],
            },
        },
        "shardlog": {
            "reason": result["reason"],
            "sharded": result["sharded"],
            "configTime": result["configTime"],
            "plans": [{"shard": p["shard"], "summary": p.get("summary")} for p in plans],
        },
        "command": {k: v for k, v in inner.items() if k != "$db"},
    }
    if verbosity != "queryPlanner":
        per_shard = [{"shardName": p["shard"], **p["executionStats"]} for p in plans if "executionStats" in p]
        out["executionStats"] = {
            "nReturned": sum(x["nReturned"] for x in per_shard),
            "executionTimeMillis": max((x["executionTimeMillis"] for x in per_shard), default=0),
            "totalKeysExamined": sum(x["totalKeysExamined"] for x in per_shard),
            "totalDocsExamined": sum(x["totalDocsExamined"] for x in per_shard),
            "executionStages": {
                "stage": stage,
                "nReturned": sum(x["nReturned"] for x in per_shard),
                "totalKeysExamined": sum(x["totalKeysExamined"] for x in per_shard),
                "totalDocsExamined": sum(x["totalDocsExamined"] for x in per_shard),
                "shards": per_shard,
            },
        }
    return out


def _hint(cmd: dict[str, Any], where: str) -> Any:
    """A `hint`: an index name or key pattern (None when absent or empty)."""
    hint = cmd.get("hint")
    if hint is None or hint == {} or hint == "":
        return None
    if not isinstance(hint, (str, dict)):
        raise _wrong_type(where, "hint", hint, "string or object")
    return hint


# ------------------------------------------------------------------ sessions


def _lsids(cmd: dict[str, Any]) -> Any:
    """endSessions / killSessions' lsids in the domain's form (killSessions' `uid` dropped:
    there are no users)."""
    raw = next(iter(cmd.values()))
    if not isinstance(raw, list):
        return raw
    out = []
    for lsid in raw:
        if isinstance(lsid, dict) and "uid" in lsid:
            lsid = {k: v for k, v in lsid.items() if k != "uid"}
        out.append(wire_lsid(lsid))
    return out


@SERVER_COMMANDS.register("endSessions", fields=END_SESSIONS_FIELDS)
async def _end_sessions(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    if conn.edge is None:
        return {}  # the Kafka-less skeleton keeps no sessions (and advertises none)
    await _run(conn, s.EndSessions(lsids=_lsids(cmd)))
    return {}


@SERVER_COMMANDS.register("killSessions", fields=KILL_SESSIONS_FIELDS)
async def _kill_sessions(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    await _run(conn, s.KillSessions(lsids=_lsids(cmd)))
    return {}
