"""shardlog zone — tag shards with zones, pin key ranges of a collection to them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from cli.context import CliContext, JsonOpt
from domain import sharding_commands as sc

zone_app = typer.Typer(help="Zones: tag shards, pin key ranges to them.", no_args_is_help=True)

MinOpt = typer.Option(..., "--min")
MaxOpt = typer.Option(..., "--max")


def _print_zones(cx: CliContext) -> Callable[[dict[str, Any]], None]:
    return lambda r: cx.out.print(f"shard {r['shard']} zones: {', '.join(r['zones']) or '-'}")


@zone_app.command("add-shard")
def zone_add_shard(ctx: typer.Context, shard: str, zone: str, json_out: bool = JsonOpt) -> None:
    """Tag SHARD with ZONE."""
    cx = CliContext.of(ctx)
    cx.send(sc.add_shard_to_zone(shard, zone), _print_zones(cx))


@zone_app.command("remove-shard")
def zone_remove_shard(ctx: typer.Context, shard: str, zone: str, json_out: bool = JsonOpt) -> None:
    """Untag SHARD from ZONE."""
    cx = CliContext.of(ctx)
    cx.send(sc.remove_shard_from_zone(shard, zone), _print_zones(cx))


@zone_app.command("add-range")
def zone_add_range(
    ctx: typer.Context,
    ns: str,
    min: str = MinOpt,
    max: str = MaxOpt,
    zone: str = typer.Option(...),
    json_out: bool = JsonOpt,
) -> None:
    """Pin the key range [min, max) of NS to ZONE."""
    cx = CliContext.of(ctx)
    lo, hi = cx.parse_json(min, "--min"), cx.parse_json(max, "--max")
    cx.send(
        cx.build(sc.zone_range, ns, lo, hi, zone),
        lambda r: cx.out.print(f"{r['ns']} [{min}, {max}) -> zone {r['zone']}"),
    )


@zone_app.command("remove-range")
def zone_remove_range(
    ctx: typer.Context, ns: str, min: str = MinOpt, max: str = MaxOpt, json_out: bool = JsonOpt
) -> None:
    """Unpin the key range [min, max) of NS."""
    cx = CliContext.of(ctx)
    lo, hi = cx.parse_json(min, "--min"), cx.parse_json(max, "--max")
    cx.send(
        cx.build(sc.zone_range, ns, lo, hi, None),
        lambda r: cx.out.print(f"{r['ns']} [{min}, {max}) no longer in zone {r['zone']}"),
    )
