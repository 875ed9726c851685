"""Run a DDL and await its coordinator: the one way the wire edge and the CLI both do it.

    start   send the request (DropCollection ... RefineCollectionShardKey) to config.commands;
            ConflictingOperationInProgress (another DDL holds the database) is retried every
            LOCK_RETRY_S until the lock wait (SHARDLOG_DDL_LOCK_WAIT) is over, then is the error
    no-op   `started` False (a missing collection or database): that reply is the result
    await   GetDDL(id) until its state is "done", within the caller's timeout: ok -> its result;
            rolled back -> CommandError(code, reason)

How the records travel is the caller's: `send(record, timeout) -> Reply` (a router's requester,
or the CLI's).  A timeout while awaiting leaves the coordinator running (it finishes on its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from domain import ddl
from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import Record
from schemas import ddl as d
from schemas.reply import Reply

Send = Callable[[Record, float], Awaitable[Reply]]
OnState = Callable[[dict[str, Any]], None]

LOCK_RETRY_S = 0.2  # between attempts while another DDL holds the database
POLL_S = 0.15  # between GetDDL looks at a running coordinator


@dataclass
class DDLRun:
    """How a DDL ended: its result, the coordinator's id (None: a no-op), the ConfigTime after
    which the change is visible, and the phases it was seen in."""

    result: dict[str, Any]
    id: str | None = None
    config_time: int | None = None
    joined: bool = False
    phases: list[str] = field(default_factory=list)
    started: dict[str, Any] = field(default_factory=dict)  # the start's answer (createIndexes' counts)


def _refused(reply: Reply) -> CommandError:
    return CommandError(reply.code or ErrorCode.InternalError, reply.error or "refused", reply.result)


async def start_ddl(send: Send, record: Record, *, timeout: float, lock_wait: float | None = None) -> Reply:
    """Send the request; while another DDL holds the database, again every LOCK_RETRY_S until
    the lock wait is over (then ConflictingOperationInProgress is the answer)."""
    loop = asyncio.get_running_loop()
    wait = ddl.ddl_lock_wait() if lock_wait is None else lock_wait
    deadline = loop.time() + wait
    while True:
        reply = await send(record, timeout)
        if reply.ok:
            return reply
        if reply.code != ErrorCode.ConflictingOperationInProgress:
            raise _refused(reply)
        left = deadline - loop.time()
        if left <= 0:  # the whole wait is over (a last attempt was made at its end)
            raise CommandError(
                ErrorCode.ConflictingOperationInProgress,
                f"{reply.error} (waited {wait:g} s: SHARDLOG_DDL_LOCK_WAIT)",
            )
        await asyncio.sleep(min(LOCK_RETRY_S, left))


async def await_ddl(
    send: Send, cid: str, *, timeout: float, on_state: OnState | None = None, poll: float = POLL_S
) -> tuple[dict[str, Any], Reply]:
    """GetDDL(cid) until it is done (within `timeout`): its last state and reply."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise CommandError(
                ErrorCode.ExceededTimeLimit,
                f"DDL {cid} still running after {timeout:g} s (it goes on: `shardlog ddl status {cid}`)",
            )
        reply = await send(d.GetDDL(id=cid), left)
        if not reply.ok:
            raise _refused(reply)
        state: dict[str, Any] = reply.result or {}
        if state.get("state") == "unknown":
            raise CommandError(ErrorCode.NoSuchKey, f"the config server knows no DDL coordinator {cid}")
        if on_state is not None:
            on_state(state)
        if state.get("state") == "done":
            return state, reply
        await asyncio.sleep(min(poll, max(0.0, deadline - loop.time())))


async def run_ddl(
    send: Send,
    record: Record,
    *,
    timeout: float,
    lock_wait: float | None = None,
    on_state: OnState | None = None,
) -> DDLRun:
    """Start the DDL (or join the same one running) and await its outcome."""
    try:
        reply = await start_ddl(send, record, timeout=timeout, lock_wait=lock_wait)
        started: dict[str, Any] = reply.result or {}
        if not started.get("started"):
            return DDLRun(started, None, reply.configTime, started=started)
        cid = str(started["id"])
        phases: list[str] = []

        def seen(state: dict[str, Any]) -> None:
            if state.get("phase") and (not phases or phases[-1] != state["phase"]):
                phases.append(state["phase"])
            if on_state is not None:
                on_state(state)

        state, last = await await_ddl(send, cid, timeout=timeout, on_state=seen)
    except TimeoutError:  # a request that got no reply (RequestTimeout)
        raise CommandError(
            ErrorCode.ExceededTimeLimit, f"the config server did not answer {record.type} within {timeout:g} s"
        ) from None
    return DDLRun(sc.ddl_outcome(state), cid, last.configTime, bool(started.get("joined")), phases, started)
