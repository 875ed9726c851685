"""shardlog drop-collection / drop-database / rename-collection / refine-shard-key, and
`shardlog ddl status` — collection and database DDL (docs/reference/ddl.md).

Each command starts a DDL coordinator on the config server (or joins the same one running)
and follows it to its end, showing its phase as it changes: the loop the wire edge shares
(domain/ddl_client.py).  The root `--timeout` bounds the wait; a DDL still running then goes on
(`shardlog ddl status ID` follows it).  Another DDL holding the database is waited for up to
SHARDLOG_DDL_LOCK_WAIT seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from cli.context import CliContext, JsonOpt, bound
from domain import ddl_client
from domain import sharding_commands as sc
from schemas import Record
from schemas import ddl as d
from schemas.reply import Reply

ddl_app = typer.Typer()  # the DDL commands, at the top level
ddl_status_app = typer.Typer(no_args_is_help=True)  # `shardlog ddl ...`


# ------------------------------------------------------------------ pure shaping (unit-tested)


def run_document(run: ddl_client.DDLRun) -> dict[str, Any]:
    """The --json answer of a DDL command: its result, the coordinator (None: nothing to do),
    whether it joined a running one, the phases seen, and the ConfigTime that shows it."""
    result = {k: v for k, v in run.result.items() if k not in ("id", "started", "joined")}
    return {**result, "id": run.id, "joined": run.joined, "phases": run.phases, "configTime": run.config_time}


def age(state: dict[str, Any], now: float) -> str:
    secs = max(0.0, now - float(state.get("startedAt") or now))
    return f"{secs:.1f}s" if secs < 120 else f"{secs / 60:.1f}m"


def target(state: dict[str, Any]) -> str:
    """What the DDL does, in a few words."""
    params = state.get("params") or {}
    if state.get("op") == "renameCollection":
        return f"{state['ns']} -> {params.get('to')}" + (" (dropTarget)" if params.get("dropTarget") else "")
    if state.get("op") == "refineCollectionShardKey":
        return f"{state['ns']} key {bound(params.get('key'))}"
    return str(state.get("ns"))


def progress_line(state: dict[str, Any], now: float) -> str:
    return f"{state.get('op')} {target(state)} [{state.get('phase')}] {age(state, now)} ({str(state.get('id'))[:8]})"


def outcome_line(state: dict[str, Any]) -> str:
    """How a finished coordinator ended, in one line."""
    if state.get("ok"):
        return f"done: ok {bound(state.get('result') or {})}"
    return f"done: rolled back, {state.get('code')}: {state.get('reason')}"


# ------------------------------------------------------------------ running a DDL


def _run(cx: CliContext, record: Record, human: Any) -> None:
    """Start the DDL and follow it (the phase live on a terminal); print its outcome."""
    live = None if cx.json or not sys.stdout.isatty() else Live(console=cx.out, refresh_per_second=8)

    async def go() -> ddl_client.DDLRun:
        await cx.check_cluster()
        async with cx.requester() as r:

            async def send(rec: Record, timeout: float) -> Reply:
                return await r.request(cx.topics.config_commands, rec, timeout=min(timeout, cx.timeout))

            def show(state: dict[str, Any]) -> None:
                if live is not None:
                    live.update(progress_line(state, time.time()))

            return await ddl_client.run_ddl(send, record, timeout=cx.timeout, on_state=show)

    run = cx.run_live(live, go())
    if cx.json:
        cx.print_json(run_document(run))
        return
    human(run.result)
    if run.id is not None:
        joined = " (joined the one running)" if run.joined else ""
        cx.out.print(f"[dim]DDL {run.id}{joined}: {' -> '.join(run.phases)}; ConfigTime {run.config_time}[/dim]")


@ddl_app.command("drop-collection")
def drop_collection(ctx: typer.Context, ns: str, json_out: bool = JsonOpt) -> None:
    """Drop a collection, sharded or not, with its documents on every shard (a missing one: ok)."""
    cx = CliContext.of(ctx)
    _run(
        cx,
        cx.build(sc.drop_collection, ns),
        lambda r: cx.out.print(f"dropped {ns}" if r.get("dropped") else f"{ns} does not exist: nothing to drop"),
    )


@ddl_app.command("drop-database")
def drop_database(ctx: typer.Context, db: str, json_out: bool = JsonOpt) -> None:
    """Drop a database: every collection of it, then the database (a missing one: ok)."""
    cx = CliContext.of(ctx)
    _run(
        cx,
        cx.build(sc.drop_database, db),
        lambda r: cx.out.print(
            f"dropped database {db}" + (f": {', '.join(r['collections'])}" if r.get("collections") else "")
            if r.get("dropped")
            else f"database {db} does not exist: nothing to drop"
        ),
    )


@ddl_app.command("rename-collection")
def rename_collection(
    ctx: typer.Context,
    ns: str,
    to: str = typer.Argument(..., help="the new namespace, in the same database"),
    drop_target: bool = typer.Option(False, "--drop-target", help="drop TO first if it exists"),
    json_out: bool = JsonOpt,
) -> None:
    """Rename a collection (sharded or not) within its database."""
    cx = CliContext.of(ctx)
    _run(cx, cx.build(sc.rename_collection, ns, to, drop_target), lambda r: cx.out.print(f"renamed {ns} -> {to}"))


@ddl_app.command("refine-shard-key")
def refine_shard_key(
    ctx: typer.Context,
    ns: str,
    key: str = typer.Argument(..., help='the new key, the current one as its prefix, e.g. \'{"x": 1, "y": 1}\''),
    json_out: bool = JsonOpt,
) -> None:
    """Extend a sharded collection's shard key with more fields."""
    cx = CliContext.of(ctx)
    pattern = cx.parse_json(key, "KEY")
    _run(
        cx,
        cx.build(sc.refine_shard_key, ns, pattern),
        lambda r: cx.out.print(f"refined the shard key of {ns} to {bound(r.get('key', pattern))}"),
    )


# ------------------------------------------------------------------ ddl status


@ddl_status_app.command("status")
def status(
    ctx: typer.Context,
    id: str | None = typer.Argument(None, help="one coordinator (running or finished); all running without it"),
    json_out: bool = JsonOpt,
) -> None:
    """The running DDL coordinators (op, namespace, phase, age), or one with its outcome."""
    cx = CliContext.of(ctx)
    state = cx.command(d.GetDDL(id=id), "shardlog ddl status").result or {}
    now = time.time()
    if cx.json:
        cx.print_json(state)
        return
    if id is None:
        running = state.get("running") or []
        if not running:
            cx.out.print("no DDL coordinator running")
            return
        table = Table("id", "op", "target", "phase", "age", "shards")
        for c in running:
            table.add_row(c["id"], c["op"], target(c), c["phase"], age(c, now), ",".join(c.get("shards") or []))
        cx.out.print(table)
        return
    if state.get("state") == "unknown":
        cx.fail(f"no DDL coordinator {id}", code="NoSuchKey")
    cx.out.print(f"{state['id']}: {state['op']} {target(state)}")
    if state.get("state") == "done":
        cx.out.print(outcome_line(state))
    else:
        reason = f" ({state.get('code')}: {state.get('reason')})" if state.get("code") else ""
        cx.out.print(f"running: phase {state['phase']}{reason}, {age(state, now)}, shards {state.get('shards')}")
