"""shardlog sessions — the live logical sessions in the sessions store, with their last use."""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer
from rich.table import Table

from cli.context import CLIENT_ID, CliContext, JsonOpt
from domain.logical_sessions import SessionsView, expired, now_ms, timeout_ms
from libs import kafka
from libs.bus import read_to_end

sessions_app = typer.Typer()


@sessions_app.command("sessions")
def sessions(
    ctx: typer.Context,
    show_expired: bool = typer.Option(False, "--expired", help="also the expired ones not yet tombstoned"),
    json_out: bool = JsonOpt,
) -> None:
    """Live logical sessions (the sessions store): lsid, last use, and when each expires."""
    cx = CliContext.of(ctx)
    timeout = timeout_ms(cx.catalog().settings)
    view = SessionsView()

    async def read() -> None:
        async def take(records: list[kafka.KafkaRecord]) -> None:
            for rec in records:
                view.apply(rec.key, rec.value)

        await read_to_end(cx.bootstrap, cx.topics.sessions, take, client_id=CLIENT_ID)

    cx.run(read())
    now = now_ms()
    rows = [
        _row(s.lsid, s.lastUse, now, timeout)
        for s in sorted(view.sessions.values(), key=lambda s: -s.lastUse)
        if show_expired or not expired(s.lastUse, now, timeout)
    ]
    if cx.json:
        cx.print_json({"timeoutMs": timeout, "sessions": rows})
        return
    t = Table("lsid", "last use (UTC)", "idle", "expires in", title=f"sessions of {cx.cluster!r}")
    for r in rows:
        t.add_row(r["lsid"]["id"], r["lastUseIso"], f"{r['idleMs'] / 1000:.1f} s", _left(r["expiresInMs"]))
    cx.out.print(t if rows else "no live sessions")


def _row(lsid: dict[str, Any], last_use: int, now: int, timeout: int) -> dict[str, Any]:
    iso = dt.datetime.fromtimestamp(last_use / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return {
        "lsid": lsid,
        "lastUse": last_use,
        "lastUseIso": iso,
        "idleMs": now - last_use,
        "expiresInMs": last_use + timeout - now,
        "expired": expired(last_use, now, timeout),
    }


def _left(ms: int) -> str:
    return "expired" if ms <= 0 else f"{ms / 1000:.1f} s"
