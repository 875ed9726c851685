"""Collection and database DDL as mongos offers it: drop, dropDatabase, renameCollection,
refineCollectionShardKey, and the currentOp subset that lists the running DDL coordinators.

Each DDL is one request to the config server, whose coordinator (domain/ddl.py) runs it in
checkpointed phases; the command returns once the coordinator is done (domain/ddl_client.py,
the loop the CLI shares) and this router's catalog shows the change, so the client's next
command sees it.  Bad input is refused here, before anything is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from domain import ddl_client
from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from domain.query import QueryError, compile_filter
from libs.errors import CommandError
from libs.requests import RequestTimeout
from schemas import Record
from schemas import ddl as d
from schemas.reply import Reply
from services.router.wire.admin import command_timeout
from services.router.wire.commands import SERVER_COMMANDS, Connection
from services.router.wire.edge import RouterEdge


def _sender(edge: RouterEdge) -> ddl_client.Send:
    async def send(record: Record, timeout: float) -> Reply:
        return await edge.requester.request(edge.settings.topics.config_commands, record, timeout=timeout)

    return send


async def run(edge: RouterEdge, record: Record, timeout: float) -> dict[str, Any]:
    """Run the DDL to its end; its result once this router's catalog has caught up with it."""
    done = await ddl_client.run_ddl(_sender(edge), record, timeout=timeout)
    if done.config_time is not None:
        await edge.follower.wait_for(done.config_time, timeout)
    return {**done.started, **done.result}  # the start's answer too (drop's nIndexesWas)


def _ddl(name: str, parse: Callable[[Any], Record], shape: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    async def handler(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        record = parse(cmd)
        return shape(await run(conn.cluster(), record, command_timeout(cmd)))

    handler.__name__ = f"_{name}"
    return handler


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    return {}


SERVER_COMMANDS.register("drop")(_ddl("drop", sc.parse_drop, sc.drop_reply))
SERVER_COMMANDS.register("dropDatabase")(_ddl("dropDatabase", sc.parse_drop_database, sc.drop_database_reply))
SERVER_COMMANDS.register("renameCollection", admin_only=True)(_ddl("renameCollection", sc.parse_rename_collection, _ok))
SERVER_COMMANDS.register("refineCollectionShardKey", admin_only=True)(
    _ddl("refineCollectionShardKey", sc.parse_refine_collection_shard_key, _ok)
)


# ------------------------------------------------------------------ currentOp


async def running_coordinators(edge: RouterEdge, timeout: float) -> list[dict[str, Any]]:
    """The running coordinators as currentOp entries (the config server's, not this router's view)."""
    try:
        reply = await edge.requester.request(edge.settings.topics.config_commands, d.GetDDL(), timeout=timeout)
    except RequestTimeout:
        raise CommandError(
            ErrorCode.ExceededTimeLimit, f"the config server did not answer GetDDL within {timeout:g} s"
        ) from None
    if not reply.ok:
        raise CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused")
    now = time.time()
    return [sc.current_op_entry(state, now) for state in (reply.result or {}).get("running", [])]


def matching(entries: list[dict[str, Any]], flt: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        query = compile_filter(flt)
    except QueryError as e:
        raise CommandError(ErrorCode.BadValue, str(e)) from None
    return [e for e in entries if query.matches(e)]


@SERVER_COMMANDS.register("currentOp", admin_only=True)
async def _current_op(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """The DDL coordinators only: client operations on the shards are not listed (yet)."""
    flt = sc.current_op_filter(cmd)
    return {"inprog": matching(await running_coordinators(conn.cluster(), command_timeout(cmd)), flt)}
