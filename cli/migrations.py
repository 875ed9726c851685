"""shardlog move-range / move-chunk / set-allow-migrations — moving data by hand.

The command goes to the config server like any other; the migration then runs
between the donor and the recipient.  We follow it by asking the donor for its
progress and the config server for the outcome, until it is decided (and, with
--wait-for-delete, until the donor has deleted its copy).
"""

from __future__ import annotations

import asyncio
import json
import sys

import typer
from rich.live import Live

from domain.protocol import ErrorCode
from domain.shardkey import from_ejson, to_ejson
from libs.requests import Requester, RequestTimeout
from schemas import config as c
from schemas import shard as s

POLL_S = 0.25


def register(app: typer.Typer, ctx, helpers) -> None:
    """Add the commands to `app`; `ctx()` gives cli.main's context, `helpers` its module."""
    m = helpers
    JsonOpt = m.JsonOpt

    @app.command("move-range")
    def move_range(
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
        lo = m.parse_json(min, "--min", json_out)
        hi = m.parse_json(max, "--max", json_out) if max is not None else None
        _move(
            c.MoveRange(ns=ns, min=lo, max=hi, to=to, forceJumbo=force_jumbo, waitForDelete=wait_for_delete),
            wait_for_delete,
            json_out,
        )

    @app.command("move-chunk")
    def move_chunk(
        ns: str,
        find: str = typer.Option(..., "--find", help="a document (its shard key picks the chunk)"),
        to: str = typer.Option(..., "--to", help="recipient shard"),
        wait_for_delete: bool = typer.Option(False, "--wait-for-delete"),
        force_jumbo: bool = typer.Option(False, "--force-jumbo"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Move the whole chunk holding a document's shard key."""
        doc = m.parse_json(find, "--find", json_out)
        cat = m._catalog(None, json_out)
        coll = cat.collections.get(ns)
        if coll is None:
            m.fail(f"collection {ns!r} is not sharded", code=ErrorCode.NamespaceNotFound, as_json=json_out)
        try:
            key = coll.pattern.encode_doc(doc)
        except Exception as e:
            m.fail(f"--find: {e}", code=ErrorCode.BadValue, as_json=json_out, exit_code=2)
        chunk = coll.chunks[coll.chunk_index(key)]
        _move(
            c.MoveRange(
                ns=ns,
                min=to_ejson(chunk.min),
                max=to_ejson(chunk.max),
                to=to,
                forceJumbo=force_jumbo,
                waitForDelete=wait_for_delete,
            ),
            wait_for_delete,
            json_out,
        )

    @app.command("move-primary")
    def move_primary(
        db: str, to: str = typer.Option(..., "--to", help="the new primary shard"), json_out: bool = JsonOpt
    ) -> None:
        """Move a database's primary, with its unsharded collections (writes to them wait meanwhile)."""
        reply = m.run(m._request(c.MovePrimary(db=db, to=to), "shardlog move-primary"))
        if not reply.ok:
            m.fail(reply.error or "", code=reply.code or "Error", as_json=json_out)
        r = reply.result or {}
        if not r.get("moved"):
            print(json.dumps({"ok": True, "moved": False, "reason": r.get("reason")})) if json_out else m.out.print(
                r.get("reason", "nothing to move")
            )
            return
        summary = m.run(_follow(r["id"], r["donor"], False, None, json_out))
        if summary["outcome"] != "committed":
            m.fail(f"primary move {r['id']} {summary['outcome']}", code=ErrorCode.MigrationAborted, as_json=json_out)
        if json_out:
            print(json.dumps({"ok": True, "db": db, "primary": to, **summary}))
        else:
            m.out.print(f"{db}: primary {r['donor']} -> {to}, {summary['progress'].get('cloned', 0)} documents copied")

    @app.command("set-allow-migrations")
    def set_allow_migrations(
        ns: str, allow: bool = typer.Argument(..., help="true or false"), json_out: bool = JsonOpt
    ) -> None:
        """Allow or stop migrations of a collection.  Stopping aborts those that have not
        committed and returns once none is running."""
        reply = m.run(
            m._request(c.SetSetting(ns=ns, key="allowMigrations", value=allow), "shardlog set-allow-migrations")
        )
        if not reply.ok:
            m.fail(reply.error or "", code=reply.code or "Error", as_json=json_out)
        running = [] if allow else m.run(_wait_none_running(ns))
        if json_out:
            print(json.dumps({"ok": True, "ns": ns, "allowMigrations": allow, "waitedFor": running}))
        else:
            m.out.print(
                f"migrations of {ns} {'allowed' if allow else 'stopped'}"
                + (f" (waited for {len(running)} to finish)" if running else "")
            )

    def _move(cmd: c.MoveRange, wait_for_delete: bool, json_out: bool) -> None:
        reply = m.run(m._request(cmd, "shardlog move-range"))
        if not reply.ok:
            m.fail(reply.error or "", code=reply.code or "Error", as_json=json_out)
        r = reply.result or {}
        if not r.get("moved"):
            if json_out:
                print(json.dumps({"ok": True, "moved": False, "reason": r.get("reason")}))
            else:
                m.out.print(r.get("reason", "nothing to move"))
            return
        live = None if json_out or not sys.stdout.isatty() else Live(console=m.out, refresh_per_second=8)
        try:
            if live:
                live.start()
            summary = m.run(_follow(r["id"], r["donor"], wait_for_delete, live, json_out))
        finally:
            if live:
                live.stop()
        if summary["outcome"] != "committed":
            m.fail(
                f"migration {r['id']} aborted: {summary.get('reason') or summary['outcome']}",
                code=summary.get("code") or ErrorCode.MigrationAborted,
                as_json=json_out,
            )
        if json_out:
            print(json.dumps({"ok": True, **summary}))
        else:
            p = summary.get("progress", {})
            m.out.print(
                f"moved [{m.b(from_ejson(summary['min']))}, {m.b(from_ejson(summary['max']))}) of {cmd.ns} "
                f"{r['donor']} -> {r['recipient']}: {p.get('cloned', 0)} documents cloned, "
                f"{p.get('mods', 0)} modifications, {p.get('seconds', '?')} s, critical section "
                f"{p.get('criticalMs', '?')} ms" + ("; donor copy deleted" if wait_for_delete else "")
            )

    async def _follow(mid: str, donor: str, wait_for_delete: bool, live, json_out: bool) -> dict:
        t = ctx().topics
        async with Requester(ctx().bootstrap, t.cli_replies, client_id="shardlog-cli") as r:
            progress: dict = {}
            while True:
                state = await _ask(r, t.config_commands, c.GetMigration(id=mid))
                try:
                    shard = await _ask(r, t.shard_requests(donor), s.ListMigrations(), timeout=5)
                    progress = shard.get("progress", {}).get(mid, progress)
                except RequestTimeout:
                    pass  # the donor is restarting: the outcome still comes from the config server
                if live is not None:
                    live.update(_progress_line(mid, state["state"], progress))
                # Decided; the donor's figures are final once it recorded the decision.
                if state["state"] != "active" and (
                    not progress or "criticalMs" in progress or progress.get("phase") in ("done", "aborting")
                ):
                    break
                await asyncio.sleep(POLL_S)
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
                while True:
                    shard = await _ask(r, t.shard_requests(donor), s.ListMigrations())
                    task = next((x for x in shard["rangeDeletions"] if x["id"] == mid), None)
                    if task is None:
                        break
                    if live is not None:
                        live.update(
                            f"waiting for the donor to delete the moved documents: {task['left']} left"
                            + (f" ({task['waiting']})" if task.get("waiting") else "")
                        )
                    await asyncio.sleep(POLL_S)
            return summary

    async def _wait_none_running(ns: str) -> list[str]:
        t = ctx().topics
        seen: set[str] = set()
        async with Requester(ctx().bootstrap, t.cli_replies, client_id="shardlog-cli") as r:
            while True:
                active = (await _ask(r, t.config_commands, c.GetMigration(ns=ns)))["active"]
                if not active:
                    return sorted(seen)
                seen |= {x["id"] for x in active}
                await asyncio.sleep(POLL_S)

    async def _ask(r: Requester, topic: str, req, timeout: float | None = None) -> dict:
        reply = await r.request(topic, req, timeout=timeout or ctx().timeout)
        if not reply.ok:
            m.fail(reply.error or "", code=reply.code or "Error", as_json="--json" in sys.argv)
        return reply.result or {}


def _progress_line(mid: str, state: str, p: dict) -> str:
    phase = p.get("phase", "starting")
    line = f"migration {mid[:8]} [{state}] {phase}: {p.get('cloned', 0)} documents cloned, {p.get('mods', 0)} mods"
    if p.get("waiting"):
        line += f" (waiting: {p['waiting']})"
    return line
