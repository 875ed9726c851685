"""createIndexes, dropIndexes and listIndexes as mongos offers them (docs/reference/indexes.md).

createIndexes and dropIndexes are DDL coordinators on the config server (domain/ddl.py's index
phases): the command returns once the coordinator is done (domain/ddl_client.py) and this
router's catalog shows the change, so the client's next listIndexes sees it.  listIndexes is
answered from this router's catalog, which lists every collection's indexes.  Bad input is
refused here with MongoDB's codes, before anything is sent (domain/sharding_commands.py).
Their fields are checked by those parsers (`only_fields`), not by a Fields table: each is
honoured or refused there, and each index option by domain/indexes.IndexSpec.parse.
"""

from __future__ import annotations

from typing import Any

from bson import Int64

from domain import ddl_client, index_ddl
from domain import sharding_commands as sc
from services.router.wire.admin import command_timeout
from services.router.wire.commands import SERVER_COMMANDS, Connection
from services.router.wire.ddl import _sender


def _timeout(cmd: dict[str, Any]) -> float:
    """maxTimeMS when given; else the index build bound (SHARDLOG_INDEX_BUILD_TIMEOUT_S)."""
    return command_timeout(cmd) if "maxTimeMS" in cmd else index_ddl.index_build_timeout()


@SERVER_COMMANDS.register("createIndexes")
async def _create_indexes(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record = sc.parse_create_indexes(cmd)
    edge = conn.cluster()
    timeout = _timeout(cmd)
    run = await ddl_client.run_ddl(_sender(edge), record, timeout=timeout)
    if run.config_time is not None:
        await edge.follower.wait_for(run.config_time, timeout)
    return index_ddl.create_reply(run.result, run.started)


@SERVER_COMMANDS.register("dropIndexes", "deleteIndexes")
async def _drop_indexes(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    if "deleteIndexes" in cmd and "dropIndexes" not in cmd:
        cmd = {"dropIndexes": cmd["deleteIndexes"], **{k: v for k, v in cmd.items() if k != "deleteIndexes"}}
    record = sc.parse_drop_indexes(cmd)
    edge = conn.cluster()
    timeout = command_timeout(cmd)
    run = await ddl_client.run_ddl(_sender(edge), record, timeout=timeout)
    if run.config_time is not None:
        await edge.follower.wait_for(run.config_time, timeout)
    return index_ddl.drop_reply({**run.started, **run.result}, record.index)


@SERVER_COMMANDS.register("listIndexes")
async def _list_indexes(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    ns = sc.parse_list_indexes(cmd)
    edge = conn.cluster()
    docs = sc.list_indexes(edge.follower.catalog, ns)
    cursor_ns = f"{cmd['$db']}.$cmd.listIndexes.{ns.partition('.')[2]}"
    batch = sc.cursor_options(cmd)
    if batch is not None and batch < len(docs):
        opened = edge.routing.open_cursor(docs, batch)  # continued by getMore like any find
        return {"cursor": {"id": Int64(opened["cursorId"] or 0), "ns": cursor_ns, "firstBatch": opened["docs"]}}
    return {"cursor": {"id": Int64(0), "ns": cursor_ns, "firstBatch": docs}}
