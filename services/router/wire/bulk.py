"""MongoDB 8.0's `bulkWrite` command (the drivers' client-level bulk write): inserts, updates and
deletes on several namespaces in one command, ordered or not, answered with one result per
operation in a cursor and the totals beside it.

Each operation runs through the router as the `insert` / `update` / `delete` commands' records
do (`crud.py`), in order; consecutive inserts into one namespace go as one Insert.  Operation i
is retryable-write statement i, so a retried bulkWrite (same lsid and txnNumber) applies each
operation once.  The parsers are pure; `_bulk_write` is the thin driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson import Int64

from domain.bsonvalues import type_name
from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import shard as s
from services.router.wire import config_db
from services.router.wire.commands import SERVER_COMMANDS, Connection, command_error_code
from services.router.wire.crud import (
    COMMAND_LEVEL,
    _bool,
    _check_query,
    _check_update,
    _hint,
    _run,
    session_fields,
)
from services.router.wire.frames import MAX_WRITE_BATCH_SIZE
from services.router.wire.options import COLLATION, HONOURED, LET, Fields, only_if_empty, only_if_false, refused

BULK_WRITE_FIELDS = Fields(
    "bulkWrite",
    {
        "ops": HONOURED,
        "nsInfo": HONOURED,
        "ordered": HONOURED,
        "bypassDocumentValidation": HONOURED,  # no validators exist
        "errorsOnly": HONOURED,
        "cursor": HONOURED,
        "let": LET,
    },
)
NS_INFO = Fields(
    "bulkWrite.nsInfo",
    {
        "ns": HONOURED,
        "collectionUUID": refused("collectionUUID"),
        "encryptionInformation": refused("encryptionInformation (queryable encryption)"),
        "isTimeseriesNamespace": only_if_false("isTimeseriesNamespace"),
    },
)
INSERT_OP = Fields("bulkWrite.ops", {"insert": HONOURED, "document": HONOURED})
UPDATE_OP = Fields(
    "bulkWrite.ops",
    {
        "update": HONOURED,
        "filter": HONOURED,
        "updateMods": HONOURED,
        "multi": HONOURED,
        "upsert": HONOURED,
        "hint": HONOURED,
        "collation": COLLATION,
        "arrayFilters": HONOURED,
        "constants": only_if_empty("constants (of a pipeline-style update)"),
        "sort": HONOURED,  # MongoDB 8.0: which document an updateOne or replaceOne changes
    },
)
DELETE_OP = Fields(
    "bulkWrite.ops",
    {"delete": HONOURED, "filter": HONOURED, "multi": HONOURED, "hint": HONOURED, "collation": COLLATION},
)
CURSOR_FIELDS = Fields("bulkWrite.cursor", {"batchSize": HONOURED})
CURSOR_NS = "admin.$cmd.bulkWrite"


@dataclass
class Op:
    """One operation: its index, kind, and the record that runs it (or its refusal)."""

    idx: int
    kind: str  # "insert" | "update" | "delete"
    ns: str
    record: Any  # s.Insert / s.Update / s.Delete, or the CommandError that refuses it


def _namespaces(cmd: dict[str, Any]) -> list[str]:
    info = cmd.get("nsInfo")
    if info is None:
        raise CommandError(ErrorCode.IDLFailedToParse, "BSON field 'bulkWrite.nsInfo' is missing but a required field")
    if not isinstance(info, list) or not info:
        raise CommandError(ErrorCode.BadValue, "bulkWrite nsInfo must be a non-empty array")
    out = []
    for entry in info:
        if not isinstance(entry, dict) or not isinstance(entry.get("ns"), str):
            raise CommandError(
                ErrorCode.TypeMismatch, "each bulkWrite nsInfo entry must be an object with a string 'ns'"
            )
        NS_INFO.check_statement(entry)
        db, dot, coll = entry["ns"].partition(".")
        if not db or not dot or not coll:
            raise CommandError(ErrorCode.InvalidNamespace, f"Invalid namespace specified '{entry['ns']}'")
        if db == "config":
            raise config_db.refuse_write(coll)
        out.append(entry["ns"])
    return out


def parse_ops(cmd: dict[str, Any]) -> tuple[list[Op], bool]:
    """The operations as records (operation i: statement i), and whether they are ordered."""
    namespaces = _namespaces(cmd)
    ops = cmd.get("ops")
    if ops is None:
        raise CommandError(ErrorCode.IDLFailedToParse, "BSON field 'bulkWrite.ops' is missing but a required field")
    if not isinstance(ops, list) or not 1 <= len(ops) <= MAX_WRITE_BATCH_SIZE:
        raise CommandError(
            ErrorCode.InvalidLength,
            f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. Got {len(ops) if isinstance(ops, list) else 0} operations.",
        )
    session = session_fields(cmd, write=True)
    out: list[Op] = []
    for idx, op in enumerate(ops):
        if not isinstance(op, dict) or not op:
            raise CommandError(ErrorCode.TypeMismatch, f"bulkWrite ops entry {idx} must be a non-empty object")
        kind = next(iter(op))
        if kind not in ("insert", "update", "delete"):
            raise CommandError(
                ErrorCode.FailedToParse,
                f"Unrecognized bulkWrite operation '{kind}' (expected insert, update or delete)",
            )
        {"insert": INSERT_OP, "update": UPDATE_OP, "delete": DELETE_OP}[kind].check_statement(op)
        at = op[kind]
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(namespaces):
            raise CommandError(ErrorCode.BadValue, f"BulkWrite ops entry {idx} has an invalid nsInfo index {at}")
        ns = namespaces[at]
        out.append(Op(idx, kind, ns, _record(kind, ns, idx, op, session)))
    return out, _bool(cmd, "bulkWrite", "ordered", True)


def _record(kind: str, ns: str, idx: int, op: dict[str, Any], session: dict[str, Any]) -> Any:
    if kind == "insert":
        doc = op.get("document")
        if not isinstance(doc, dict):
            raise CommandError(
                ErrorCode.TypeMismatch,
                f"BSON field 'bulkWrite.ops.document' is the wrong type '{type_name(doc)}', expected type 'object'",
            )
        return s.Insert(ns=ns, docs=[doc], firstStmtId=idx, **session)
    flt = op.get("filter")
    if not isinstance(flt, dict):
        raise CommandError(ErrorCode.IDLFailedToParse, "BSON field 'bulkWrite.ops.filter' is missing or not an object")
    multi = _bool(op, "bulkWrite.ops", "multi", False)
    try:
        _check_query(flt)
        if kind == "delete":
            return s.Delete(ns=ns, filter=flt, multi=multi, hint=_hint(op, "bulkWrite.ops"), stmtId=idx, **session)
        if "updateMods" not in op:
            raise CommandError(ErrorCode.IDLFailedToParse, "BSON field 'bulkWrite.ops.updateMods' is missing")
        update = _check_update(op["updateMods"], multi, op.get("arrayFilters"))
    except CommandError as e:
        return e  # this operation's error, as a statement's in an update command
    sort = op.get("sort") or None
    if sort is not None and (not isinstance(sort, dict) or multi):
        raise CommandError(ErrorCode.InvalidOptions, "bulkWrite: a sort is an object, and not with multi=true")
    return s.Update(
        ns=ns,
        filter=flt,
        update=update,
        multi=multi,
        upsert=_bool(op, "bulkWrite.ops", "upsert", False),
        hint=_hint(op, "bulkWrite.ops"),
        sort=sort,
        arrayFilters=op.get("arrayFilters") or None,
        stmtId=idx,
        **session,
    )


def _error(idx: int, e: CommandError) -> dict[str, Any]:
    number, name = command_error_code(e.code)
    out: dict[str, Any] = {"ok": 0.0, "idx": idx, "code": number, "codeName": name, "errmsg": e.message}
    out.update({k: e.info[k] for k in ("keyPattern", "keyValue") if e.info and k in e.info})
    return out


def _runs(ops: list[Op]) -> list[list[Op]]:
    """Consecutive inserts into one namespace run as one Insert; everything else alone."""
    runs: list[list[Op]] = []
    for op in ops:
        last = runs[-1] if runs else None
        if (
            last
            and op.kind == "insert"
            and last[-1].kind == "insert"
            and last[-1].ns == op.ns
            and isinstance(op.record, s.Insert)
        ):
            last.append(op)
        else:
            runs.append([op])
    return runs


@SERVER_COMMANDS.register("bulkWrite", admin_only=True, fields=BULK_WRITE_FIELDS)
async def _bulk_write(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    ops, ordered = parse_ops(cmd)
    cursor = cmd.get("cursor") or {}
    if not isinstance(cursor, dict):
        raise CommandError(ErrorCode.TypeMismatch, "BSON field 'bulkWrite.cursor' must be an object")
    CURSOR_FIELDS.check_statement(cursor)
    errors_only = _bool(cmd, "bulkWrite", "errorsOnly", False)
    results: list[dict[str, Any]] = []
    totals = dict.fromkeys(("nErrors", "nInserted", "nMatched", "nModified", "nUpserted", "nDeleted"), 0)
    stop = False
    for run in _runs(ops):
        if stop:
            break
        if isinstance(run[0].record, s.Insert):  # one Insert for the run; its errors are write errors
            first = run[0].record
            record = first.model_copy(update={"docs": [op.record.docs[0] for op in run], "ordered": ordered})
            reply = await _run(conn, record)
            failed = {e["index"]: e for e in reply.get("writeErrors") or []}
            for i, op in enumerate(run):
                if i in failed:
                    e = failed[i]
                    results.append(_error(op.idx, CommandError(e["code"], e["errmsg"], e)))
                    totals["nErrors"] += 1
                elif not (ordered and failed and i > min(failed)):
                    results.append({"ok": 1.0, "idx": op.idx, "n": 1})
                    totals["nInserted"] += 1
            stop = ordered and bool(failed)
            continue
        op = run[0]
        if isinstance(op.record, CommandError):  # refused before routing: this operation's error
            results.append(_error(op.idx, op.record))
            totals["nErrors"] += 1
            stop = ordered
            continue
        try:
            result = await _run(conn, op.record)
        except CommandError as e:
            if e.code in COMMAND_LEVEL:
                raise
            results.append(_error(op.idx, e))
            totals["nErrors"] += 1
            stop = ordered
            continue
        results.append(_tally(op, result, totals))
    shown = [r for r in results if not r["ok"]] if errors_only else results
    batch = cursor.get("batchSize", len(shown) or 1)
    opened = conn.cluster().routing.open_cursor(shown, max(int(batch), 1))
    conn.cluster().routing.tag_cursor(opened["cursorId"], CURSOR_NS)
    return {"cursor": {"id": Int64(opened["cursorId"] or 0), "firstBatch": opened["docs"], "ns": CURSOR_NS}, **totals}


def _tally(op: Op, result: dict[str, Any], totals: dict[str, int]) -> dict[str, Any]:
    """One successful operation's entry in the cursor, counted into the totals."""
    if op.kind == "insert":
        n = int(result["inserted"])
        totals["nInserted"] += n
        return {"ok": 1.0, "idx": op.idx, "n": n}
    if op.kind == "delete":
        totals["nDeleted"] += result["deleted"]
        return {"ok": 1.0, "idx": op.idx, "n": result["deleted"]}
    entry: dict[str, Any] = {"ok": 1.0, "idx": op.idx, "n": result["matched"], "nModified": result["modified"]}
    totals["nMatched"] += result["matched"]
    totals["nModified"] += result["modified"]
    if "upsertedId" in result:
        entry["n"] = 1
        entry["upserted"] = {"_id": result["upsertedId"]}
        totals["nUpserted"] += 1
    return entry
