"""shardlog range-deletions — every shard's range-deletion tasks, and why each one waits.

The reasons come from the range deleter's own policy (services/range_deleter/deleter.py)
on the same inputs — the shards' tasks and the catalog's settings — so what this
shows is what the service does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from types import ModuleType

import typer
from rich.table import Column, Table

from domain.protocol import ErrorCode
from libs.requests import Requester
from schemas import shard as s
from services.range_deleter import deleter


def _cli() -> ModuleType:
    """cli.main as it runs, looked up at call time (see cli.workload._cli: under `python -m cli.main`
    it is __main__, and a second import would hold an unset context)."""
    running = sys.modules.get("__main__")
    if getattr(getattr(running, "__spec__", None), "name", None) == "cli.main":
        return running
    import cli.main

    return cli.main


async def _list(shards: list[str]) -> dict[str, dict | str]:
    """Each shard's ListMigrations result, or why there is none."""
    ctx = _cli()._ctx

    async with Requester(ctx.bootstrap, ctx.topics.cli_replies, client_id="shardlog-cli") as r:

        async def one(sid: str) -> dict | str:
            try:
                # the outer bound also covers a send that waits for a topic the shard never created
                reply = await asyncio.wait_for(
                    r.request(ctx.topics.shard_requests(sid), s.ListMigrations(), timeout=ctx.timeout), ctx.timeout + 1
                )
            except TimeoutError:
                return f"no answer within {ctx.timeout:g}s (is the shard running?)"
            return reply.result if reply.ok else f"{reply.code}: {reply.error}"

        return dict(zip(shards, await asyncio.gather(*map(one, shards))))


def _bound(v: dict) -> str:
    return json.dumps(v, separators=(",", ":"))


def range_deletions(
    shard: str | None = typer.Option(None, "--shard", help="only this shard's tasks"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Range-deletion tasks of every shard: documents left to delete, and why each task waits."""
    m = _cli()
    cat = m._catalog(None, json_out)
    if shard is not None and shard not in cat.shards:
        m.fail(f"shard {shard!r} does not exist", code=ErrorCode.ShardNotFound, as_json=json_out)
    shards = [shard] if shard is not None else sorted(cat.shards)
    answers = m.run(_list(shards))
    unanswered = {sid: a for sid, a in answers.items() if isinstance(a, str)}
    if shards and len(unanswered) == len(shards):
        m.fail(
            "; ".join(f"shard {sid}: {why}" for sid, why in unanswered.items()),
            code=ErrorCode.ShardUnavailable,
            as_json=json_out,
        )
    tasks = [t for a in answers.values() if isinstance(a, dict) for t in a["rangeDeletions"]]
    plan = deleter.plan(tasks, cat.settings, time.time())
    rows = [
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
    if json_out:
        print(json.dumps({"ok": True, "tasks": rows, "unanswered": unanswered}))
        return
    t = Table(
        "shard",
        "ns",
        Column("range", overflow="fold"),
        "state",
        "left",
        "deleted",
        Column("waiting for", overflow="fold"),
        title=f"range deletions of {m._ctx.cluster!r}",
    )
    for r in rows:
        t.add_row(
            r["shard"],
            r["ns"],
            f"[{_bound(r['min'])}, {_bound(r['max'])})",
            r["state"],
            str(r["left"]),
            str(r["deleted"]),
            r["waiting"] or "nothing: next to delete",
        )
    m.out.print(t if rows else "no range-deletion tasks")
    for sid, why in unanswered.items():
        m.err.print(f"[yellow]warning[/yellow]: shard {sid} skipped: {why}", highlight=False, soft_wrap=True)
