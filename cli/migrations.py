"""shardlog move-range / move-chunk / move-primary / set-allow-migrations — moving data by hand.

The command goes to the config server like any other; the migration then runs
between the donor and the recipient.  We follow it by asking the donor for its
progress and the config server for the outcome, until it is decided (and, with
--wait-for-delete, until the donor has deleted its copy).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import typer
from rich.live import Live

from cli.context import CliContext, JsonOpt, bound, chunk_range
from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from domain.shardkey import from_ejson
from libs.requests import Requester, RequestTimeout
from schemas import Record
from schemas import config as c
from schemas import shard as s

POLL_S = 0.25
FIGURES_WAIT_S = 10.0  # once decided, how long to wait for the donor's final figures (it may be down)

migrations_app = typer.Typer()


@migrations_app.command("move-range")
def move_range(
    ctx: typer.Context,
    ns: str,
    min: str = typer.Option(..., "--min", help="lower bound (full shard key)"),
    max: str | None = typer.Option(
        None, "--max", help="upper bound; without it the donor moves up to one max chunk size of data from --min"
    ),
    to: str = typer.Option(..., "--to", help="recipient shard"),
    wait_for_delete: bool = typer.Option(
        False, "--wait-for-delete", help="return once the donor has deleted the moved documents"
    ),
    force_jumbo: bool = typer.Option(False, "--force-jumbo", help="move a range over twice the max chunk size"),
    json_out: bool = JsonOpt,
) -> None:
    """Move [min, max) of a sharded collection to another shard, showing progress."""
    cx = CliContext.of(ctx)
    lo = cx.parse_json(min, "--min")
    hi = cx.parse_json(max, "--max") if max is not None else None
    _move(cx, cx.build(sc.move_range, ns, lo, hi, to, force_jumbo=force_jumbo, wait_for_delete=wait_for_delete))


@migrations_app.command("move-chunk")
def move_chunk(
    ctx: typer.Context,
    ns: str,
    find: str = typer.Option(..., "--find", help="a document (its shard key picks the chunk)"),
    to: str = typer.Option(..., "--to", help="recipient shard"),
    wait_for_delete: bool = typer.Option(False, "--wait-for-delete"),
    force_jumbo: bool = typer.Option(False, "--force-jumbo"),
    json_out: bool = JsonOpt,
) -> None:
    """Move the whole chunk holding a document's shard key."""
    cx = CliContext.of(ctx)
    lo, hi = sc.bounds_of(cx.build(sc.chunk_holding, cx.catalog(), ns, cx.parse_json(find, "--find")))
    _move(cx, cx.build(sc.move_range, ns, lo, hi, to, force_jumbo=force_jumbo, wait_for_delete=wait_for_delete))


@migrations_app.command("move-primary")
def move_primary(
    ctx: typer.Context,
    db: str,
    to: str = typer.Option(..., "--to", help="the new primary shard"),
    json_out: bool = JsonOpt,
) -> None:
    """Move a database's primary, with its unsharded collections (writes to them wait meanwhile)."""
    cx = CliContext.of(ctx)
    r = _start(cx, cx.build(sc.move_primary, db, to), "shardlog move-primary")
    if r is None:
        return
    summary = cx.run(_follow(cx, r["id"], r["donor"], False, None))
    if summary["outcome"] != "committed":
        cx.fail(f"primary move {r['id']} {summary['outcome']}", code=ErrorCode.MigrationAborted)
    if cx.json:
        cx.print_json({"db": db, "primary": to, **summary})
    else:
        cx.out.print(f"{db}: primary {r['donor']} -> {to}, {summary['progress'].get('cloned', 0)} documents copied")


@migrations_app.command("abort-move-primary")
def abort_move_primary(ctx: typer.Context, db: str, json_out: bool = JsonOpt) -> None:
    """Abort a database's movePrimary that is stuck (e.g. its donor is down): the database
    stays on its old primary, nothing is lost (the recipient's copies are dropped)."""
    cx = CliContext.of(ctx)
    active = cx.run(_active_primary_moves(cx, db))
    if not active:
        cx.fail(f"no movePrimary of {db} is running", code=ErrorCode.NoSuchMigration)
    reply = cx.command(
        c.AbortPrimaryMove(
            id=active[0]["id"], reason="aborted by shardlog abort-move-primary", code=ErrorCode.Interrupted
        ),
        "shardlog abort-move-primary",
    )
    outcome = (reply.result or {}).get("outcome", "")
    if cx.json:
        cx.print_json({"db": db, "id": active[0]["id"], "outcome": outcome})
    else:
        cx.out.print(f"movePrimary {active[0]['id']} of {db}: {outcome}")


async def _active_primary_moves(cx: CliContext, db: str) -> list[dict[str, Any]]:
    async with cx.requester() as r:
        active = (await cx.ask(r, cx.topics.config_commands, c.GetMigration(ns=db)))["active"]
    return [m for m in active if m.get("kind") == "primary"]


@migrations_app.command("set-allow-migrations")
def set_allow_migrations(
    ctx: typer.Context, ns: str, allow: bool = typer.Argument(..., help="true or false"), json_out: bool = JsonOpt
) -> None:
    """Allow or stop migrations of a collection.  Stopping aborts those that have not
    committed (ConflictingOperationInProgress) and returns once none is running."""
    cx = CliContext.of(ctx)
    reply = cx.command(sc.allow_migrations(ns, allow), "shardlog set-allow-migrations")
    aborted = (reply.result or {}).get("aborted", [])
    running = [] if allow else cx.run(_wait_none_running(cx, ns))
    if cx.json:
        cx.print_json({"ns": ns, "allowMigrations": allow, "aborted": aborted, "waitedFor": running})
    else:
        cx.out.print(
            f"migrations of {ns} {'allowed' if allow else 'stopped'}"
            + (f" ({len(aborted)} running aborted: {', '.join(aborted)})" if aborted else "")
            + (f" (waited for {len(running)} to finish)" if running else "")
        )


# ------------------------------------------------------------------ moving a range


def _start(cx: CliContext, command: Record, span_name: str) -> dict[str, Any] | None:
    """Send the move; its result if a migration started, else None after saying why there was nothing to move."""
    r = cx.command(command, span_name).result or {}
    if r.get("moved"):
        return r
    if cx.json:
        cx.print_json({"moved": False, "reason": r.get("reason")})
    else:
        cx.out.print(r.get("reason", "nothing to move"))
    return None


def _move(cx: CliContext, cmd: c.MoveRange) -> None:
    r = _start(cx, cmd, "shardlog move-range")
    if r is None:
        return
    live = None if cx.json or not sys.stdout.isatty() else Live(console=cx.out, refresh_per_second=8)
    started = time.monotonic()
    try:
        if live:
            live.start()
        summary = cx.run(_follow(cx, r["id"], r["donor"], cmd.waitForDelete, live))
    finally:
        if live:
            live.stop()
    _fail_unless_committed(cx, r["id"], summary)
    if cx.json:
        cx.print_json(summary)
    else:
        cx.out.print(
            moved_line(cmd.ns, r["donor"], r["recipient"], summary, time.monotonic() - started, cmd.waitForDelete)
        )


def moved_line(ns: str, donor: str, recipient: str, summary: dict[str, Any], seconds: float, deleted: bool) -> str:
    """The one line a committed move-range prints; `seconds` as this command waited for it."""
    p = summary.get("progress", {})
    critical = f", critical section {p['criticalMs']} ms" if p.get("criticalMs") is not None else ""
    lo, hi = from_ejson(summary["min"]), from_ejson(summary["max"])
    return (
        f"moved {chunk_range(lo, hi) if hi is not None else bound(lo) + ' -->> ...'} of {ns} {donor} -> {recipient}: "
        f"{p.get('cloned', 0)} documents cloned, {p.get('mods', 0)} modifications, {seconds:.1f} s{critical}"
        + ("; donor copy deleted" if deleted else "")
    )


def aborted_message(mid: str, summary: dict[str, Any]) -> str:
    """Why a migration did not commit, in one line: the config server's outcome text already
    starts with "aborted: " (and may carry the code), the reason field does not."""
    why = summary.get("reason") or str(summary["outcome"]).removeprefix("aborted").removeprefix(": ")
    lo, hi = summary.get("min"), summary.get("max")
    where = f" ({chunk_range(from_ejson(lo), from_ejson(hi))})" if lo is not None and hi is not None else ""
    return f"migration {mid}{where} aborted" + (f": {why}" if why else "")


def _fail_unless_committed(cx: CliContext, mid: str, summary: dict[str, Any]) -> None:
    """An aborted migration fails with the abort's code and reason (structured fields)."""
    if summary["outcome"] != "committed":
        cx.fail(aborted_message(mid, summary), code=summary.get("code") or ErrorCode.MigrationAborted)


# ------------------------------------------------------------------ following a migration


async def _follow(cx: CliContext, mid: str, donor: str, wait_for_delete: bool, live: Live | None) -> dict[str, Any]:
    """Poll until the migration is decided (and, with wait_for_delete, the donor's copy is gone): its summary."""
    async with cx.requester() as r:
        state, progress = await _until_decided(cx, r, mid, donor, live)
        mig = state.get("migration") or {}
        summary = {
            "id": mid,
            "outcome": state["state"],
            "progress": progress,
            "min": progress.get("min", mig.get("min")),
            "max": progress.get("max", mig.get("max")),
        }
        if "reason" in state:  # aborted: why, as fields
            summary.update(code=state["code"], reason=state["reason"])
        if wait_for_delete and state["state"] == "committed":
            await _until_deleted(cx, r, mid, donor, live)
        return summary


async def _until_decided(
    cx: CliContext, r: Requester, mid: str, donor: str, live: Live | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config server's last answer on the migration, and the donor's last progress figures."""
    t = cx.topics
    progress: dict[str, Any] = {}
    decided_at: float | None = None
    while True:
        state = await cx.ask(r, t.config_commands, c.GetMigration(id=mid))
        try:
            shard = await cx.ask(r, t.shard_requests(donor), s.ListMigrations(), timeout=5)
            progress = shard.get("progress", {}).get(mid, progress)
        except RequestTimeout:
            pass  # the donor is restarting: the outcome still comes from the config server
        if live is not None:
            live.update(_progress_line(mid, state["state"], progress))
        # Decided; the donor's figures are final once it recorded the decision (a donor that is
        # down never says so: the config server's outcome is the answer after FIGURES_WAIT_S).
        if state["state"] != "active":
            decided_at = decided_at or time.monotonic()
            if (
                not progress
                or "criticalMs" in progress
                or progress.get("phase") in ("done", "aborting")
                or time.monotonic() - decided_at > FIGURES_WAIT_S
            ):
                return state, progress
        await asyncio.sleep(POLL_S)


async def _until_deleted(cx: CliContext, r: Requester, mid: str, donor: str, live: Live | None) -> None:
    while True:
        shard = await cx.ask(r, cx.topics.shard_requests(donor), s.ListMigrations())
        task = next((x for x in shard["rangeDeletions"] if x["id"] == mid), None)
        if task is None:
            return
        if live is not None:
            live.update(
                f"waiting for the donor to delete the moved documents: {task['left']} left"
                + (f" ({task['waiting']})" if task.get("waiting") else "")
            )
        await asyncio.sleep(POLL_S)


async def _wait_none_running(cx: CliContext, ns: str) -> list[str]:
    seen: set[str] = set()
    async with cx.requester() as r:
        while True:
            active = (await cx.ask(r, cx.topics.config_commands, c.GetMigration(ns=ns)))["active"]
            if not active:
                return sorted(seen)
            seen |= {x["id"] for x in active}
            await asyncio.sleep(POLL_S)


def _progress_line(mid: str, state: str, p: dict[str, Any]) -> str:
    phase = p.get("phase", "starting")
    line = f"migration {mid[:8]} [{state}] {phase}: {p.get('cloned', 0)} documents cloned, {p.get('mods', 0)} mods"
    if p.get("waiting"):
        line += f" (waiting: {p['waiting']})"
    return line
