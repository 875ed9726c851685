"""shardlog index create / drop / list — a collection's secondary indexes
(docs/reference/indexes.md).

create and drop start a DDL coordinator on the config server (or join the same one running) and
follow it to its end, as the DDL commands do (domain/ddl_client.py); create shows, on a
terminal, the coordinator's phase and each shard's build (documents scanned of the total), read
from the shards' ListIndexes.  The build is waited for up to SHARDLOG_INDEX_BUILD_TIMEOUT_S
seconds (the root --timeout bounds each request); past it, it goes on (`shardlog ddl status`).
list reads the catalog (with the builds running, if any).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from cli.context import CliContext, JsonOpt, bound
from cli.ddl import progress_line, run_document
from domain import ddl_client, index_ddl
from domain import sharding_commands as sc
from domain.indexes import IndexSpec
from libs.errors import CommandError
from libs.requests import Requester, RequestTimeout
from schemas import Record
from schemas import indexes as ix
from schemas.reply import Reply

index_app = typer.Typer(no_args_is_help=True, help="a collection's secondary indexes: create, drop, list")


# ------------------------------------------------------------------ pure shaping (unit-tested)


def options_text(doc: dict[str, Any]) -> str:
    """An index's options in a few words: unique, sparse, partial {...}."""
    out = []
    if doc.get("unique"):
        out.append("unique")
    if doc.get("sparse"):
        out.append("sparse")
    if "partialFilterExpression" in doc:
        out.append(f"partial {bound(doc['partialFilterExpression'])}")
    return ", ".join(out)


def build_line(state: dict[str, Any], builds: dict[str, dict[str, dict[str, Any]]], now: float) -> str:
    """The coordinator's phase, then each shard's build: `s0 1200/5000`, `s1 ready`."""
    parts = []
    for shard, states in sorted(builds.items()):
        for name, st in states.items():
            what = st["state"] if st["state"] != "building" else f"{st.get('scanned', 0)}/{st.get('total', 0)}"
            parts.append(f"{shard}:{name} {what}")
    return progress_line(state, now) + (f"  {'  '.join(parts)}" if parts else "")


def create_human(result: dict[str, Any], started: dict[str, Any]) -> list[str]:
    reply = index_ddl.create_reply(result, started)
    lines = []
    if reply.get("createdCollectionAutomatically"):
        lines.append("created the collection")
    if reply.get("note"):
        lines.append(f"{reply['note']} ({reply['numIndexesBefore']} indexes)")
    else:
        built = ", ".join(result.get("indexes") or [])
        shards = ", ".join(result.get("shards") or [])
        lines.append(f"built {built} on {shards}: {reply['numIndexesBefore']} -> {reply['numIndexesAfter']} indexes")
    return lines


# ------------------------------------------------------------------ running the DDL


async def _shard_builds(
    cx: CliContext, r: Requester, ns: str, names: list[str], shards: list[str], out: dict[str, Any]
) -> None:
    """One look at each shard's builds of `names` (those it lists: a shard that owns no chunk
    builds nothing), into `out` by shard."""
    for shard in shards:
        with contextlib.suppress(RequestTimeout, CommandError):
            reply = await r.request(cx.topics.shard_requests(shard), ix.ListIndexes(ns=ns), timeout=cx.timeout)
            if reply.ok:
                listed = {index_ddl.index_name(i) for i in (reply.result or {}).get("indexes") or []}
                states = index_ddl.build_states(reply.result or {}, [n for n in names if n in listed])
                if states:
                    out[shard] = states


async def _follow_builds(
    cx: CliContext, r: Requester, ns: str, names: list[str], shards: list[str], out: dict[str, Any]
) -> None:
    """Ask the shards how their builds go until cancelled (the figures `build_line` shows)."""
    while True:
        await _shard_builds(cx, r, ns, names, shards, out)
        await asyncio.sleep(index_ddl.index_build_poll())


def _run(cx: CliContext, record: Record, names: list[str]) -> tuple[ddl_client.DDLRun, dict[str, Any]]:
    live = None if cx.json or not sys.stdout.isatty() else Live(console=cx.out, refresh_per_second=8)
    builds: dict[str, Any] = {}

    async def go() -> ddl_client.DDLRun:
        await cx.check_cluster()
        async with cx.requester() as r:

            async def send(rec: Record, timeout: float) -> Reply:
                return await r.request(cx.topics.config_commands, rec, timeout=min(timeout, cx.timeout))

            follower: asyncio.Task[None] | None = None

            def show(state: dict[str, Any]) -> None:
                nonlocal follower
                if follower is None and names and state.get("op") == "createIndexes" and live is not None:
                    ns = str(state["ns"])
                    follower = asyncio.create_task(
                        _follow_builds(cx, r, ns, names, list(state.get("shards") or []), builds)
                    )
                if live is not None:
                    live.update(build_line(state, builds, time.time()))

            try:
                run = await ddl_client.run_ddl(send, record, timeout=index_ddl.index_build_timeout(), on_state=show)
            finally:
                if follower is not None:
                    follower.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await follower
            if names and run.id is not None and run.result.get("shards"):  # where it ended, per shard
                await _shard_builds(cx, r, str(run.result["ns"]), names, list(run.result["shards"]), builds)
            return run

    run = cx.run_live(live, go())
    return run, builds


def _footer(cx: CliContext, run: ddl_client.DDLRun) -> None:
    if run.id is not None:
        joined = " (joined the one running)" if run.joined else ""
        cx.out.print(f"[dim]DDL {run.id}{joined}: {' -> '.join(run.phases)}; ConfigTime {run.config_time}[/dim]")


@index_app.command("create")
def create(
    ctx: typer.Context,
    ns: str = typer.Argument(..., help="the collection, db.coll (created if missing)"),
    key: str = typer.Argument(..., help='the key pattern, e.g. \'{"a": 1, "b": -1}\''),
    unique: bool = typer.Option(False, "--unique", help="unique (sharded: the shard key must be its prefix)"),
    name: str | None = typer.Option(None, "--name", help="the index's name (default: MongoDB's, a_1_b_-1)"),
    sparse: bool = typer.Option(False, "--sparse", help="leave out documents that have none of its fields"),
    partial: str | None = typer.Option(None, "--partial", help='partialFilterExpression, e.g. \'{"a": {"$gt": 5}}\''),
    json_out: bool = JsonOpt,
) -> None:
    """Build an index on every shard that owns chunks of NS, then list it (createIndexes)."""
    cx = CliContext.of(ctx)
    pattern = cx.parse_json(key, "KEY")
    flt = cx.parse_ejson(partial, "--partial") if partial is not None else None
    spec = sc.index_spec(pattern, name=name, unique=unique, sparse=sparse, partial=flt)
    record = cx.build(sc.create_indexes, ns, [spec])
    run, builds = _run(cx, record, [cx.build(lambda: IndexSpec.parse(spec).name)])
    if cx.json:
        cx.print_json({**run_document(run), **index_ddl.create_reply(run.result, run.started), "builds": builds})
        return
    for line in create_human(run.result, run.started):
        cx.out.print(line)
    _footer(cx, run)


@index_app.command("drop")
def drop(
    ctx: typer.Context,
    ns: str = typer.Argument(..., help="the collection, db.coll"),
    name: str | None = typer.Argument(None, help="the index's name"),
    all_: bool = typer.Option(False, "--all", help="every index but _id_ and the shard key's"),
    key: str | None = typer.Option(None, "--key", help="the index with this key pattern"),
    json_out: bool = JsonOpt,
) -> None:
    """Drop an index (by name, or by --key) or every one (--all) of NS (dropIndexes)."""
    cx = CliContext.of(ctx)
    if sum((name is not None, all_, key is not None)) != 1:
        cx.bad_value("give one of NAME, --all or --key")
    target: Any = index_ddl.ALL if all_ else (cx.parse_json(key, "--key") if key is not None else name)
    record = cx.build(sc.drop_indexes, ns, target)
    run, _ = _run(cx, record, [])
    result = {**run.started, **run.result}
    if cx.json:
        cx.print_json(
            {
                **run_document(run),
                **index_ddl.drop_reply(result, target),
                "dropped": result.get("names", result.get("dropped", [])),
            }
        )
        return
    dropped = result.get("dropped") or result.get("names") or []
    cx.out.print(f"dropped {', '.join(dropped)} of {ns}" if dropped else f"{ns}: nothing to drop")
    _footer(cx, run)


@index_app.command("list")
def list_(
    ctx: typer.Context,
    ns: str = typer.Argument(..., help="the collection, db.coll"),
    json_out: bool = JsonOpt,
) -> None:
    """The indexes of NS as listIndexes shows them, and a build running on it if any."""
    cx = CliContext.of(ctx)
    cx.build(sc.collection_ns, {"listIndexes": ns.partition(".")[2], "$db": ns.partition(".")[0]})
    cat = cx.catalog()
    try:
        docs = sc.list_indexes(cat, ns)
    except CommandError as e:
        cx.fail(e.message, code=e.code)
    running = [c.record() for c in cat.ddl.values() if c.ns == ns and c.op in ("createIndexes", "dropIndexes")]
    if cx.json:
        cx.print_json({"ns": ns, "indexes": docs, "running": running})
        return
    table = Table("name", "key", "options")
    for d in docs:
        table.add_row(d["name"], bound(d["key"]), options_text(d))
    cx.out.print(table)
    for c in running:
        cx.out.print(f"running: {progress_line(c, time.time())}")
