"""shardlog settings — cluster settings, and a collection's own with --ns."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from cli.context import CliContext, JsonOpt
from domain.protocol import ErrorCode
from schemas import config as c

settings_app = typer.Typer(help="Cluster and collection settings.", no_args_is_help=True)


def _value(text: str) -> Any:
    """A setting value: JSON if it parses (numbers, true/false, objects), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@settings_app.command("set")
def settings_set(
    ctx: typer.Context,
    key: str,
    value: str = typer.Argument(..., help="JSON value; 'null' resets to the default"),
    ns: str | None = typer.Option(None, help="set for this collection only"),
    json_out: bool = JsonOpt,
) -> None:
    """Set a cluster setting (or a collection's with --ns)."""
    cx = CliContext.of(ctx)
    cx.send(
        c.SetSetting(key=key, value=_value(value), ns=ns),
        lambda r: cx.out.print(
            f"{r['key']} = {json.dumps(r['value'])}"
            + (f" for {r['ns']}" if r["ns"] else "")
            + ("" if r["changed"] else " (unchanged)")
        ),
    )


@settings_app.command("get")
def settings_get(
    ctx: typer.Context,
    ns: str | None = typer.Option(None, help="this collection's settings"),
    json_out: bool = JsonOpt,
) -> None:
    """Show cluster settings (or a collection's with --ns)."""
    cx = CliContext.of(ctx)
    cat = cx.catalog()
    if ns is not None:
        if ns not in cat.collections:
            cx.fail(f"collection {ns!r} is not sharded", code=ErrorCode.NamespaceNotFound)
        values = cat.collections[ns].settings.model_dump()
    else:
        values = cat.settings.model_dump()
    if cx.json:
        cx.print_json({"configTime": cat.config_time, "ns": ns, "settings": values})
        return
    t = Table("setting", "value", title=f"settings{' of ' + ns if ns else ''} at ConfigTime {cat.config_time}")
    for k, v in values.items():
        t.add_row(k, json.dumps(v))
    cx.out.print(t)
