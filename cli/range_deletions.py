"""shardlog range-deletions — every shard's range-deletion tasks, and why each one waits.

The reasons come from the range deleter's own policy (services/range_deleter/deleter.py)
on the same inputs — the shards' tasks and the catalog's settings — so what this
shows is what the service does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import typer
from rich.table import Column, Table

from cli.context import CliContext, JsonOpt, chunk_range
from domain.protocol import ErrorCode
from schemas import shard as s
from services.range_deleter import deleter

range_deletions_app = typer.Typer()


@range_deletions_app.command("range-deletions")
def range_deletions(
    ctx: typer.Context,
    shard: str | None = typer.Option(None, "--shard", help="only this shard's tasks"),
    json_out: bool = JsonOpt,
) -> None:
    """Range-deletion tasks of every shard: documents left to delete, and why each task waits."""
    cx = CliContext.of(ctx)
    cat = cx.catalog()
    if shard is not None and shard not in cat.shards:
        cx.fail(f"shard {shard!r} does not exist", code=ErrorCode.ShardNotFound)
    shards = [shard] if shard is not None else sorted(cat.shards)
    answers = cx.run(_list(cx, shards))
    unanswered = {sid: a for sid, a in answers.items() if isinstance(a, str)}
    if shards and len(unanswered) == len(shards):
        cx.fail("; ".join(f"shard {sid}: {why}" for sid, why in unanswered.items()), code=ErrorCode.ShardUnavailable)
    tasks = [t for a in answers.values() if isinstance(a, dict) for t in a["rangeDeletions"]]
    rows = _rows(tasks, deleter.plan(tasks, cat.settings, time.time()))
    if cx.json:
        cx.print_json({"tasks": rows, "unanswered": unanswered})
        return
    _print_rows(cx, rows)
    for sid, why in unanswered.items():
        cx.err.print(f"[yellow]warning[/yellow]: shard {sid} skipped: {why}", highlight=False, soft_wrap=True)


async def _list(cx: CliContext, shards: list[str]) -> dict[str, dict[str, Any] | str]:
    """Each shard's ListMigrations result, or why there is none."""
    async with cx.requester() as r:

        async def one(sid: str) -> dict[str, Any] | str:
            try:
                # the outer bound also covers a send that waits for a topic the shard never created
                reply = await asyncio.wait_for(
                    r.request(cx.topics.shard_requests(sid), s.ListMigrations(), timeout=cx.timeout), cx.timeout + 1
                )
            except TimeoutError:
                return f"no answer within {cx.timeout:g}s (is the shard running?)"
            return reply.result if reply.ok else f"{reply.code}: {reply.error}"

        return dict(zip(shards, await asyncio.gather(*map(one, shards))))


def _rows(tasks: list[dict[str, Any]], plan: deleter.Plan) -> list[dict[str, Any]]:
    return [
        {
            "shard": t["shard"],
            "id": t["id"],
            "ns": t["ns"],
            "min": t["min"],
            "max": t["max"],
            "state": deleter.state(t),
            "left": t["left"],
            "deleted": t["deleted"],
            "readyAt": t["readyAt"],
            "why": t["why"],
            "waiting": plan.waiting[deleter.key(t)],
        }
        for t in sorted(tasks, key=lambda t: (t["shard"], t["readyAt"] or 0.0, t["id"]))
    ]


def _print_rows(cx: CliContext, rows: list[dict[str, Any]]) -> None:
    t = Table(
        "shard",
        "ns",
        Column("range", overflow="fold"),
        "state",
        "left",
        "deleted",
        Column("waiting for", overflow="fold"),
        title=f"range deletions of {cx.cluster!r}",
    )
    for r in rows:
        t.add_row(
            r["shard"],
            r["ns"],
            chunk_range(r["min"], r["max"]),
            r["state"],
            str(r["left"]),
            str(r["deleted"]),
            r["waiting"] or "nothing: next to delete",
        )
    cx.out.print(t if rows else "no range-deletion tasks")
