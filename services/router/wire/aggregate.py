"""aggregate over the wire: the pipeline is split as mongos splits it: what can run on the
shards ($match first, as a find filter) is pushed down, the rest runs on the router over the
merged stream (`domain/aggregation.py`, pure)."""

from __future__ import annotations

from typing import Any

from bson.int64 import Int64

from domain.aggregation import PipelineError, ShardPart, parse, run, split
from domain.protocol import ErrorCode
from schemas import shard as s
from services.router.wire import config_db
from services.router.wire.admin import command_timeout
from services.router.wire.commands import SERVER_COMMANDS, Connection, WireCommandError
from services.router.wire.ddl import running_coordinators
from services.router.wire.edge import RouterEdge
from services.router.wire.gossip import pinned_read_concern, refuse_snapshot_of_config, snapshot_time
from services.router.wire.options import COLLATION, HONOURED, LET, Fields, only_if_false, refused

DEFAULT_BATCH_SIZE = 101  # MongoDB's first batch when cursor.batchSize is not given
DRAIN_BATCH_SIZE = 10_000  # the router reads the shards' find in batches this large
INVALID_BSON_FIELD_VALUE = (51024, "Location51024")

AGGREGATE_FIELDS = Fields(
    "aggregate",
    {
        "pipeline": HONOURED,
        "explain": HONOURED,
        "cursor": HONOURED,
        "allowDiskUse": HONOURED,  # the router's stages have no memory limit to lift
        "bypassDocumentValidation": HONOURED,  # no validators exist (and no $out / $merge)
        "hint": HONOURED,  # the shards' planner takes it with the pushed-down $match
        "let": LET,
        "collation": COLLATION,
        "fromMongos": refused("fromMongos (an internal field of MongoDB's)"),
        "needsMerge": refused("needsMerge (an internal field of MongoDB's)"),
        "exchange": refused("exchange (an internal field of MongoDB's)"),
        "isMapReduceCommand": only_if_false("isMapReduceCommand"),
    },
)
CURSOR_FIELDS = Fields("aggregate.cursor", {"batchSize": HONOURED})


def _batch_size(cmd: dict[str, Any]) -> int:
    """cursor.batchSize, checked as MongoDB's IDL checks it."""
    cursor = cmd.get("cursor")
    if cursor is None:
        if cmd.get("explain"):
            return DEFAULT_BATCH_SIZE
        raise WireCommandError.of(
            ErrorCode.FailedToParse, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    if not isinstance(cursor, dict):
        raise WireCommandError.of(
            ErrorCode.TypeMismatch,
            f"BSON field 'aggregate.cursor' is the wrong type '{type(cursor).__name__}', expected type 'object'",
        )
    CURSOR_FIELDS.check_statement(cursor)
    size = cursor.get("batchSize", DEFAULT_BATCH_SIZE)
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise WireCommandError.of(
            ErrorCode.TypeMismatch,
            f"BSON field 'cursor.batchSize' is the wrong type '{type(size).__name__}', expected types '[long, int, "
            "decimal, double]'",
        )
    if size < 0:
        raise WireCommandError(
            INVALID_BSON_FIELD_VALUE, f"BSON field 'batchSize' value must be >= 0, actual value '{size}'"
        )
    return int(size)


def _stages(cmd: dict[str, Any]) -> Any:
    if "pipeline" not in cmd:
        raise WireCommandError.of(
            ErrorCode.IDLFailedToParse, "BSON field 'aggregate.pipeline' is missing but a required field"
        )
    try:
        return parse(cmd["pipeline"])
    except PipelineError as e:
        raise WireCommandError((e.code, e.code_name), e.message) from None


async def _shard_docs(
    edge: RouterEdge, ns: str, part: ShardPart, cmd: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The shards' answer to the pushed-down part: one find through the router, drained, with
    the command's readConcern (a snapshot read's time pinned by the caller) and hint."""
    read_concern = cmd.get("readConcern")
    hint = cmd.get("hint")
    if hint is not None and not isinstance(hint, (str, dict)):
        raise WireCommandError.of(
            ErrorCode.TypeMismatch,
            f"BSON field 'aggregate.hint' is the wrong type '{type(hint).__name__}', expected types '[string, object]'",
        )
    first = await edge.routing.handle(
        s.Find(
            ns=ns,
            filter=part.filter,
            sort=part.sort,
            skip=part.skip,
            limit=part.limit,
            projection=part.projection,
            batchSize=DRAIN_BATCH_SIZE,
            readConcern=read_concern,
            hint=hint or None,
        )
    )
    docs, cursor = list(first["docs"]), first["cursorId"]
    while cursor:
        more = await edge.routing.handle(s.GetMore(cursorId=cursor, batchSize=DRAIN_BATCH_SIZE))
        docs += more["docs"]
        cursor = more["cursorId"]
    return docs, list(first.get("shards", []))


@SERVER_COMMANDS.register("aggregate", fields=AGGREGATE_FIELDS)
async def aggregate(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    db: str = cmd["$db"]
    coll = cmd["aggregate"]
    if coll == 1 and db == "admin" and _current_op_first(cmd):
        return await _current_op(conn, cmd)
    stages = _stages(cmd)
    if not isinstance(coll, str):
        if coll == 1 and not isinstance(coll, bool):
            # Database-level aggregates ($currentOp, $listLocalSessions, ...) need stages we do not have.
            first = stages[0].name if stages else "aggregate"
            raise WireCommandError.of(
                ErrorCode.InvalidNamespace, f"{{aggregate: 1}} is not valid for '{first}'; a collection is required."
            )
        raise WireCommandError.of(
            ErrorCode.TypeMismatch,
            "Invalid command format: the 'aggregate' field must specify a collection name or 1",
        )
    if not coll:
        raise WireCommandError.of(ErrorCode.InvalidNamespace, f"Invalid namespace specified '{db}.'")
    ns = f"{db}.{coll}"
    batch_size = _batch_size(cmd)
    shard_part, merge_part = split(stages)
    edge = conn.cluster()
    if cmd.get("explain"):
        targets = (
            []
            if db == "config"
            else (await edge.routing.handle(s.Explain(ns=ns, filter=shard_part.filter, verbosity="queryPlanner")))[
                "shards"
            ]
        )
        return {
            "mergeType": "mongos",
            "splitPipeline": {"shardsPart": shard_part.as_pipeline(), "mergerPart": merge_part.as_pipeline()},
            "shards": {shard: {} for shard in targets},
        }
    shards: list[str] = []
    read_concern = pinned_read_concern(cmd.get("readConcern"), edge.routing.clock.cluster_time)
    cmd = {**cmd, "readConcern": read_concern}
    refuse_snapshot_of_config(ns, read_concern)
    try:
        if db == "config":  # the router's own catalog projection: the whole pipeline runs here
            docs = run(stages, await config_db.documents(edge, coll))
        else:
            raw, shards = await _shard_docs(edge, ns, shard_part, cmd)
            docs = merge_part.run(raw)
    except PipelineError as e:
        raise WireCommandError((e.code, e.code_name), e.message) from None
    first = edge.routing.open_cursor(docs, batch_size, tuple(shards))
    edge.routing.tag_cursor(first["cursorId"], ns)
    cursor = {"firstBatch": first["docs"], "id": Int64(first["cursorId"]), "ns": ns}
    if (at := snapshot_time(read_concern)) is not None:
        cursor["atClusterTime"] = at
    return {"cursor": cursor}


def _current_op_first(cmd: dict[str, Any]) -> bool:
    pipeline = cmd.get("pipeline")
    return (
        isinstance(pipeline, list) and bool(pipeline) and isinstance(pipeline[0], dict) and "$currentOp" in pipeline[0]
    )


async def _current_op(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """`[{$currentOp: {...}}, ...]` on admin (mongosh's db.currentOp()): the running DDL
    coordinators (ddl.py's currentOp subset), the rest of the pipeline run here."""
    edge = conn.cluster()
    try:
        stages = parse(cmd["pipeline"][1:])
        docs = run(stages, await running_coordinators(edge, command_timeout(cmd)))
    except PipelineError as e:
        raise WireCommandError((e.code, e.code_name), e.message) from None
    first = edge.routing.open_cursor(docs, _batch_size(cmd))
    return {"cursor": {"firstBatch": first["docs"], "id": Int64(first["cursorId"]), "ns": "admin.$cmd.aggregate"}}
