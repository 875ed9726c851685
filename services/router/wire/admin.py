"""Sharding administration as mongos offers it (addShard, shardCollection, moveRange, the
balancer and zone commands, ...): each maps to the config command the CLI sends, through the
one implementation both share (`domain/sharding_commands.py`).

A command that changes the catalog returns once this router's catalog projection has
reached the reply's ConfigTime, so the client's next read (a find on config.chunks, a routed
write) sees the change.  moveChunk / moveRange / movePrimary return once the migration is
decided, as MongoDB's do.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from typing import Any

from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from libs.bus import BusError
from libs.client import shard_unreachable
from libs.errors import CommandError
from libs.requests import RequestTimeout
from schemas import Record
from schemas import balancer as b
from schemas import config as c
from schemas import shard as s
from services.router.wire.commands import SERVER_COMMANDS, Connection
from services.router.wire.config_db import documents, from_wire, object_id, version_timestamp
from services.router.wire.edge import RouterEdge
from services.router.wire.options import Fields, only_if_false

# How long an admin command waits for the config server's reply, and a migration for its
# outcome, unless the command's maxTimeMS says otherwise (seconds; docs/reference/wire-protocol.md).
ADMIN_TIMEOUT_S = float(os.environ.get("SHARDLOG_WIRE_ADMIN_TIMEOUT", "120"))
# How long balancerStatus / balancerCollectionStatus wait for the balancer service.
BALANCER_TIMEOUT_S = float(os.environ.get("SHARDLOG_WIRE_BALANCER_TIMEOUT", "3"))
# How long addShard waits for the new shard's process to answer (as mongos connects to it).
ADD_SHARD_WAIT_S = float(os.environ.get("SHARDLOG_ADD_SHARD_WAIT_S", "10"))
POLL_S = 0.02  # how often a migration's outcome is looked up in the router's catalog


def command_timeout(cmd: Mapping[str, Any]) -> float:
    ms = cmd.get("maxTimeMS")
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms > 0:
        return float(ms) / 1000
    return ADMIN_TIMEOUT_S


def _doc(cmd: Mapping[str, Any]) -> dict[str, Any]:
    """The command with BSON MinKey/MaxKey as the records' Extended JSON."""
    out: dict[str, Any] = from_wire(dict(cmd))
    return out


async def config_command(edge: RouterEdge, record: Record, timeout: float = ADMIN_TIMEOUT_S) -> dict[str, Any]:
    """Send a config command; its result once this router's catalog shows its effect."""
    try:
        reply = await edge.requester.request(edge.settings.topics.config_commands, record, timeout=timeout)
    except RequestTimeout:
        raise CommandError(
            ErrorCode.ExceededTimeLimit, f"the config server did not answer {record.type} within {timeout:g} s"
        ) from None
    if not reply.ok:
        raise CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused", reply.result)
    if reply.configTime is not None:
        await edge.follower.wait_for(reply.configTime, timeout)
    return reply.result or {}


async def balancer_state(edge: RouterEdge, request: b.GetBalancerState) -> dict[str, Any]:
    try:
        reply = await edge.requester.request(
            edge.settings.topics.balancer_commands, request, timeout=BALANCER_TIMEOUT_S
        )
    except (RequestTimeout, BusError):  # not running, or never started (no topic yet)
        raise CommandError(
            ErrorCode.HostUnreachable, f"the balancer did not answer within {BALANCER_TIMEOUT_S:g} s: is it running?"
        ) from None
    if not reply.ok:
        raise CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused")
    return reply.result or {}


async def wait_for_outcome(edge: RouterEdge, mid: str, timeout: float) -> None:
    """Until migration `mid` is decided in this router's catalog; its abort is the error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (outcome := edge.follower.catalog.outcome(mid)) is None:
        if loop.time() > deadline:
            raise CommandError(
                ErrorCode.ExceededTimeLimit, f"migration {mid} still running after {timeout:g} s (it goes on)"
            )
        await asyncio.sleep(POLL_S)
    if not outcome.committed:
        code = outcome.code or ErrorCode.OperationFailed
        try:
            known = ErrorCode(code).number is not None
        except ValueError:
            known = False
        raise CommandError(
            code if known else ErrorCode.OperationFailed, f"migration {mid} aborted: {outcome.reason or outcome.code}"
        )


# ------------------------------------------------------------------ one record, {ok: 1}


def _simple(name: str) -> None:
    parse, shape = sc.SIMPLE[name]

    async def handler(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
        edge = conn.cluster()
        record = parse(_doc(cmd))
        if isinstance(record, c.AddShard) and record.shard not in edge.follower.catalog.shards:
            wait = min(ADD_SHARD_WAIT_S, command_timeout(cmd))
            why = await shard_unreachable(edge.requester, edge.settings.bus, edge.settings.topics, record.shard, wait)
            if why is not None:
                raise CommandError(ErrorCode.OperationFailed, why)
        result = await config_command(edge, record, command_timeout(cmd))
        return shape(result) if shape is not None else {}

    SERVER_COMMANDS.register(name, admin_only=True)(handler)


for _name in sc.SIMPLE:
    _simple(_name)


@SERVER_COMMANDS.register("shardCollection", "shardcollection", admin_only=True)
async def _shard_collection(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    record = sc.parse_shard_collection(_doc(cmd))
    edge = conn.cluster()
    if (check := sc.existing_documents_check(edge.follower.catalog, record)) is not None:
        primary, request = check  # refused, nothing changes: the collection stays unsharded
        reply = await edge.requester.request(
            edge.settings.topics.shard_requests(primary), request, timeout=command_timeout(cmd)
        )
        if not reply.ok:
            raise CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused")
    result = await config_command(edge, record, command_timeout(cmd))
    return sc.shard_collection_reply(record, result)


@SERVER_COMMANDS.register("split", admin_only=True)
async def _split(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    req = sc.parse_split(_doc(cmd), edge.follower.catalog)
    at = req.at
    if at is None:  # find / bounds: the owner halves the chunk at its median
        assert req.owner is not None
        reply = await edge.requester.request(
            edge.settings.topics.shard_requests(req.owner),
            s.SplitVector(ns=req.ns, find=req.find, chunkMin=req.chunk_min, median=True),
            timeout=command_timeout(cmd),
        )
        if not reply.ok:
            raise CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused")
        at = sc.median_points(reply.result or {})
    await config_command(edge, sc.split(req.ns, at), command_timeout(cmd))
    return {}


async def _move(edge: RouterEdge, record: Record, timeout: float) -> dict[str, Any]:
    result = await config_command(edge, record, timeout)
    if result.get("moved") and result.get("id"):
        await wait_for_outcome(edge, result["id"], timeout)
    return result


@SERVER_COMMANDS.register("moveChunk", "movechunk", admin_only=True)
async def _move_chunk(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _move(edge, sc.parse_move_chunk(_doc(cmd), edge.follower.catalog), command_timeout(cmd))
    return {"millis": int((loop.time() - began) * 1000)}


@SERVER_COMMANDS.register("moveRange", admin_only=True)
async def _move_range(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    await _move(edge, sc.parse_move_range(_doc(cmd)), command_timeout(cmd))
    return {}


@SERVER_COMMANDS.register("movePrimary", "moveprimary", admin_only=True)
async def _move_primary(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    await _move(conn.cluster(), sc.parse_move_primary(_doc(cmd)), command_timeout(cmd))
    return {}


# ------------------------------------------------------------------ the balancer


@SERVER_COMMANDS.register("balancerStart", admin_only=True, fields=Fields("balancerStart"))
async def _balancer_start(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    await config_command(conn.cluster(), sc.balancer_enabled(True), command_timeout(cmd))
    return {}


@SERVER_COMMANDS.register("balancerStop", admin_only=True, fields=Fields("balancerStop"))
async def _balancer_stop(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    await config_command(conn.cluster(), sc.balancer_enabled(False), command_timeout(cmd))
    return {}


@SERVER_COMMANDS.register("balancerStatus", admin_only=True, fields=Fields("balancerStatus"))
async def _balancer_status(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    state = await balancer_state(edge, b.GetBalancerState())
    return sc.balancer_status_reply(edge.follower.catalog, state)


@SERVER_COMMANDS.register("balancerCollectionStatus", admin_only=True, fields=Fields("balancerCollectionStatus"))
async def _balancer_collection_status(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    ns = sc.namespace(cmd)
    sc.collection_of(edge.follower.catalog, ns)
    state = await balancer_state(edge, b.GetBalancerState(ns=ns))
    return sc.collection_status_reply(edge.follower.catalog, ns, state.get("collection") or {})


@SERVER_COMMANDS.register("configureCollectionBalancing", admin_only=True)
async def _configure_collection_balancing(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    edge = conn.cluster()
    records = sc.parse_configure_collection_balancing(cmd)
    sc.collection_of(edge.follower.catalog, sc.namespace(cmd))
    for record in records:
        await config_command(edge, record, command_timeout(cmd))
    return {}


# ------------------------------------------------------------------ the router itself


@SERVER_COMMANDS.register("listShards", admin_only=True, fields=Fields("listShards"))
async def _list_shards(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return {"shards": await documents(conn.cluster(), "shards")}


@SERVER_COMMANDS.register("flushRouterConfig", "flushrouterconfig", admin_only=True, fields=Fields("flushRouterConfig"))
async def _flush_router_config(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """Our routing table is a projection that follows config.events: "flushing" it is
    catching up to the end of the log as of now."""
    edge = conn.cluster()
    try:
        await edge.follower.refresh(command_timeout(cmd))
    except TimeoutError:
        raise CommandError(ErrorCode.ExceededTimeLimit, "the catalog did not catch up in time") from None
    return {"flushed": True}


# fullMetadata: true lists the chunks too (not answered here: refused unless false).
GET_SHARD_VERSION = Fields(
    "getShardVersion", {"fullMetadata": only_if_false("the routing table's chunks (fullMetadata)")}
)


@SERVER_COMMANDS.register("getShardVersion", "getshardversion", admin_only=True, fields=GET_SHARD_VERSION)
async def _get_shard_version(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    """The routing table's version of a collection, as mongos answers it."""
    edge = conn.cluster()
    ns = sc.namespace(cmd)
    coll = sc.collection_of(edge.follower.catalog, ns)
    v = coll.version()
    out: dict[str, Any] = {
        "version": version_timestamp(v.major, v.minor),
        "versionEpoch": object_id(coll.epoch),
    }
    return out


@SERVER_COMMANDS.register("isdbgrid", fields=Fields("isdbgrid"))
async def _isdbgrid(conn: Connection, cmd: dict[str, Any]) -> dict[str, Any]:
    return {"isdbgrid": 1, "hostname": socket.gethostname()}
