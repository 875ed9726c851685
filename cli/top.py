"""shardlog top — the cluster's live figures in the terminal, like mongotop/mongostat.

Reads GET <dashboard>/api/snapshot (the dashboard service: `make up` starts it) once a
second and shows per shard and per collection ops/s, p50/p99 latency and ops by type over
the last minute, with migrations in flight, pending range deletions and the balancer's state.
`--json` prints one sample; `--once` one table.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cli.context import CliContext, JsonOpt

top_app = typer.Typer()

DEFAULT_URL = "http://127.0.0.1:8090"
URL_ENV = "SHARDLOG_DASHBOARD_URL"
REFRESH_S = 1.0
FETCH_TIMEOUT_S = 3.0
OPS = ("insert", "find", "update", "delete")


class Unreachable(Exception):
    pass


@top_app.command("top")
def top(
    ctx: typer.Context,
    url: str = typer.Option(None, "--url", help=f"the dashboard (default: ${URL_ENV} or {DEFAULT_URL})"),
    once: bool = typer.Option(False, "--once", help="print one table and exit"),
    json_out: bool = JsonOpt,
) -> None:
    """Live ops/s, p50/p99 and ops by type per shard and collection, migrations, range deletions, balancer."""
    cx = CliContext.of(ctx)
    base = (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
    try:
        snapshot = fetch(base)
    except Unreachable as e:
        cx.fail(
            f"cannot reach the dashboard at {base} ({e}): start it with `make up` (or `shardlog dashboard`), "
            f"or point --url / ${URL_ENV} at it",
            code="DashboardUnavailable",
        )
    if cx.json:
        cx.print_json({"url": base, **snapshot})
        return
    if once:
        cx.out.print(render(snapshot, base))
        return
    try:
        with Live(render(snapshot, base), console=cx.out, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(REFRESH_S)
                try:
                    snapshot = fetch(base)
                    live.update(render(snapshot, base))
                except Unreachable as e:  # keep the last picture, say why it is not moving
                    live.update(Group(render(snapshot, base), Text(f"dashboard unreachable: {e}", style="red")))
                    continue
    except KeyboardInterrupt:
        pass


def fetch(base: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{base}/api/snapshot", timeout=FETCH_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError) as e:
        raise Unreachable(str(getattr(e, "reason", e))) from None
    if not isinstance(body, dict):
        raise Unreachable("the snapshot is not a JSON object")
    return body


def render(snapshot: dict[str, Any], base: str) -> RenderableType:
    figures = snapshot.get("figures") or {}
    window = figures.get("windowS", 60)
    parts: list[RenderableType] = [
        Text(f"shardlog top — {base} — last {window}s, at {_clock(figures.get('at'))}", style="bold"),
        _figures_table("shard", figures.get("shards") or {}, _ids(snapshot.get("shards"))),
        _figures_table("collection", figures.get("collections") or {}, _ids(snapshot.get("collections"), "ns")),
    ]
    parts.append(_list_line("migrations in flight", snapshot.get("migrations")))
    parts.append(_list_line("pending range deletions", snapshot.get("rangeDeletions")))
    parts.append(_balancer_line(snapshot.get("balancer")))
    dropped = figures.get("dropped") or {}
    if any(dropped.values()):
        parts.append(Text("dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())), style="yellow"))
    return Group(*parts)


def _figures_table(what: str, rows: dict[str, Any], known: list[str]) -> Table:
    names = sorted(set(rows) | set(known))
    t = Table(title=f"per {what}", title_justify="left")
    # Names are what a reader looks for: never cut; the figures' columns give way instead.
    t.add_column(what, no_wrap=True, min_width=max([len(what), *map(len, names)]))
    for column in ("ops/s", "p50 ms", "p99 ms", *OPS, "other"):
        t.add_column(column, justify="right")
    for name in names:
        row = rows.get(name) or {}
        ops = row.get("ops") or {}
        other = sum(int(n) for op, n in ops.items() if op not in OPS)
        t.add_row(
            name,
            _num(row.get("opsPerSec")),
            _num(row.get("p50Ms"), 2),
            _num(row.get("p99Ms"), 2),
            *(str(ops.get(op, 0)) for op in OPS),
            str(other),
        )
    return t


def _ids(items: Any, field: str = "id") -> list[str]:
    """Names from the snapshot's own lists (or maps), so idle shards and collections show too."""
    if isinstance(items, dict):
        return [str(k) for k in items]
    if isinstance(items, list):
        return [
            str(i.get(field) or i.get("name")) for i in items if isinstance(i, dict) and (i.get(field) or i.get("name"))
        ]
    return []


def _list_line(what: str, items: Any) -> RenderableType:
    if not isinstance(items, list):
        return Text(f"{what}: -", style="dim")
    lines = [Text(f"{what}: {len(items)}")]
    for item in items[:10]:
        if isinstance(item, dict):
            shown = {k: v for k, v in item.items() if isinstance(v, (str, int, float, bool))}
            lines.append(Text("  " + " ".join(f"{k}={v}" for k, v in list(shown.items())[:8]), style="dim"))
    return Group(*lines)


def _balancer_line(balancer: Any) -> Text:
    if not isinstance(balancer, dict):
        return Text("balancer: -", style="dim")
    shown = {k: v for k, v in balancer.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return Text("balancer: " + (" ".join(f"{k}={v}" for k, v in shown.items()) or "{}"))


def _num(value: Any, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def _clock(at: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "-"
