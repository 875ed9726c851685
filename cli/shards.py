"""shardlog add-shard / remove-shard / create-database — the shards of the cluster and its databases."""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass
from typing import Any

import typer
from aiokafka.structs import ConsumerRecord

from cli.context import CLIENT_ID, CliContext, JsonOpt
from domain import sharding_commands as sc
from domain.catalog import Catalog
from domain.protocol import ErrorCode
from domain.settings import in_window
from libs.bus import read_to_end
from libs.client import shard_unreachable
from schemas import config as c
from services.balancer.draining import removal_status

shards_app = typer.Typer()


ADD_SHARD_WAIT_ENV = "SHARDLOG_ADD_SHARD_WAIT_S"


def add_shard_wait() -> float:
    """How long add-shard waits for the shard's process to answer (SHARDLOG_ADD_SHARD_WAIT_S)."""
    raw = os.environ.get(ADD_SHARD_WAIT_ENV, "")
    try:
        value = float(raw) if raw else 10.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise typer.BadParameter(f"{ADD_SHARD_WAIT_ENV}={raw!r} must be a positive number of seconds")
    return value


@shards_app.command("add-shard")
def add_shard(ctx: typer.Context, shard: str, json_out: bool = JsonOpt) -> None:
    """Add a shard to the cluster.  Its process must be running (`make up SHARDS=4`, or
    `python -m services.shard --shard-id NAME`): as mongos connects to a new shard before
    adding it, the shard is asked to answer first, and an unreachable one is refused."""
    cx = CliContext.of(ctx)
    cmd = cx.build(sc.add_shard, shard)
    if shard not in cx.catalog().shards:  # (re-adding one the catalog has answers ShardAlreadyExists)
        cx.run(_shard_answers(cx, shard, add_shard_wait()))
    cx.send(cmd, lambda r: cx.out.print(f"added shard {sc.add_shard_reply(r)['shardAdded']}"))


async def _shard_answers(cx: CliContext, shard: str, wait: float) -> None:
    """Fail with OperationFailed (HostUnreachable) unless `shard`'s process answers; nothing is recorded then."""
    async with cx.requester() as r:
        why = await shard_unreachable(r, cx.bootstrap, cx.topics, shard, wait)
    if why is not None:
        cx.fail(f"{why} ({ADD_SHARD_WAIT_ENV}={wait:g})", code=ErrorCode.OperationFailed)


@shards_app.command("remove-shard")
def remove_shard(
    ctx: typer.Context,
    shard: str,
    status_only: bool = typer.Option(False, "--status", help="what remains, an estimate of time left, what blocks it"),
    json_out: bool = JsonOpt,
) -> None:
    """Start draining a shard (the balancer moves its chunks and databases, then removes it);
    --status shows what remains."""
    cx = CliContext.of(ctx)
    if status_only:
        return _removal_status(cx, shard)

    def human(r: dict[str, Any]) -> None:
        m = sc.remove_shard_reply(r)  # mongos's shape: state, what remains, dbsToMove
        msg = {
            "completed": f"shard {m['shard']} removed",
            "started": f"draining shard {m['shard']}",
            "ongoing": f"shard {m['shard']} is still draining",
        }[m["state"]]
        if m["state"] != "completed":
            chunks = r.get("remaining", {}).get("chunks", 0)
            msg += f": {chunks} chunks left, primary of {len(m['dbsToMove'])} databases {m['dbsToMove']}"
        cx.out.print(msg)

    cx.send(cx.build(sc.remove_shard, shard), human)


@shards_app.command("create-database")
def create_database(
    ctx: typer.Context,
    db: str,
    primary: str | None = typer.Option(None, help="primary shard (default: least data)"),
    json_out: bool = JsonOpt,
) -> None:
    """Create a database; its unsharded collections live on its primary shard."""
    cx = CliContext.of(ctx)
    cx.send(
        c.CreateDatabase(db=db, primary=primary),
        lambda r: cx.out.print(f"database {r['db']} {'created' if r['created'] else 'exists'}, primary {r['primary']}"),
    )


# ------------------------------------------------------------------ remove-shard --status


@dataclass
class DrainHistory:
    """When draining began and how many chunks have left since (Kafka timestamps, seconds)."""

    since: float | None = None
    moved: int = 0
    last: float | None = None


def _removal_status(cx: CliContext, shard: str) -> None:
    cat, history = cx.run(_drain_history(cx, shard))
    if shard not in cat.shards:
        cx.fail(f"shard {shard!r} does not exist (removed already?)", code=ErrorCode.ShardNotFound)
    doc = _removal_document(cat, shard, history, time.time())
    if cx.json:
        cx.print_json(doc)
        return
    dbs = f" {', '.join(doc['databases'])}" if doc["databases"] else ""
    left = doc["estimatedSecondsLeft"]
    cx.out.print(
        f"shard {shard}: {'draining' if doc['draining'] else 'not draining'}; {doc['chunks']} chunk(s) left, "
        f"primary of {len(doc['databases'])} database(s){dbs}; {doc['movedSoFar']} chunk(s) moved so far"
        + (f"; about {left:.0f} s left" if left is not None else "")
    )
    for b_ in doc["blockers"]:
        cx.out.print(f"  blocked: {b_['reason']}: {b_['detail']}")


def _removal_document(cat: Catalog, shard: str, history: DrainHistory, now: float) -> dict[str, Any]:
    """The balancer's view of the removal, with what blocks it and an estimate from the pace so far."""
    doc = removal_status(cat, shard)
    if not in_window(cat.settings.balancerWindow, dt.datetime.now(dt.UTC)):
        w = cat.settings.balancerWindow
        doc["blockers"].append(
            {"reason": "outsideWindow", "detail": f"outside the balancing window {w.start}-{w.stop} {w.timeZone}"}
        )
    if not doc["draining"]:
        doc["blockers"].insert(0, {"reason": "notDraining", "detail": f"run `shardlog remove-shard {shard}` to start"})
    # Estimate from the pace so far: chunks moved off the shard since draining began.
    if history.since is not None and history.moved:
        per_chunk = (now - history.since) / history.moved
        doc["estimatedSecondsLeft"] = round(per_chunk * (doc["chunks"] + len(doc["databases"])), 1)
    else:
        doc["estimatedSecondsLeft"] = None
    doc["movedSoFar"] = history.moved
    return doc


async def _drain_history(cx: CliContext, shard: str) -> tuple[Catalog, DrainHistory]:
    """The catalog, and the shard's drain so far."""
    cat = Catalog(track_changes=False)
    history = DrainHistory()

    async def take(records: list[ConsumerRecord]) -> None:
        for rec in records:
            e = c.events.decode(rec.value)
            cat.apply(e, rec.offset)
            if e.type == "ShardDraining" and e.shard == shard:
                history.since, history.moved = rec.timestamp / 1000, 0
            elif e.type == "MigrationCommitted" and e.donor == shard and history.since is not None:
                history.moved += 1
                history.last = rec.timestamp / 1000

    await read_to_end(cx.bootstrap, cx.topics.config_events, take, client_id=CLIENT_ID)
    return cat, history
