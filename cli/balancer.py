"""shardlog balancer — what the balancer would do, from a snapshot of the cluster, and the live balancer.

`plan` runs the balancer's own chunk-selection policy (services/balancer/policy.py)
on a snapshot file, offline: no broker needed.  The other commands ask the live
balancer for its state or change the settings it follows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import typer
from pydantic import ValidationError

from cli.context import CliContext, JsonOpt, chunk_range
from domain import sharding_commands as sc
from domain.protocol import ErrorCode
from schemas import balancer as b
from schemas import config as c
from services.balancer import policy

balancer_app = typer.Typer(help="The balancer: its decisions, from a cluster snapshot.", no_args_is_help=True)


@balancer_app.callback()
def _group() -> None:
    """The balancer: its decisions, from a cluster snapshot."""  # a callback keeps `plan` a subcommand


# ------------------------------------------------------------------ offline


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@balancer_app.command("plan")
def plan(
    snapshot: Path = typer.Option(..., "--snapshot", help="snapshot JSON (schemas/json/balancer.snapshot.schema.json)"),
) -> None:
    """One balancing round: the splits and migrations the balancer would issue, as JSON."""
    try:
        raw = json.loads(snapshot.read_text())
    except OSError as e:
        _fail(f"cannot read snapshot {str(snapshot)!r}: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        _fail(f"snapshot {str(snapshot)!r} is not valid JSON: {getattr(e, 'msg', e)}{where}")
    try:
        result = policy.plan(raw)
    except ValidationError as e:
        _fail(f"invalid snapshot: {policy.describe(e)}")
    except ValueError as e:  # SnapshotError, or a bound that is not a shard key value
        _fail(f"invalid snapshot: {e}")
    print(json.dumps(result.to_json(), indent=2))


# ------------------------------------------------------------------ the live balancer


def _state(cx: CliContext, request: b.GetBalancerState) -> dict[str, Any]:
    return cx.request(cx.topics.balancer_commands, request)


def _setting(cx: CliContext, key: str, value: Any, ns: str | None, said: str) -> None:
    cx.send(c.SetSetting(key=key, value=value, ns=ns), lambda r: cx.out.print(said))


@balancer_app.command("status")
def status(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """On or off, inside the window or not, the current round, actions in flight."""
    cx = CliContext.of(ctx)
    st = _state(cx, b.GetBalancerState())
    if cx.json:
        # with mongos's balancerStatus fields (mode, inBalancerRound, numBalancerRounds)
        cx.print_json({**st, **sc.balancer_status_reply(cx.catalog(), st)})
        return
    window = st["window"]
    cx.out.print(
        f"balancer {'on' if st['enabled'] else 'off'}; "
        f"{'inside' if st['inWindow'] else 'outside'} the window"
        + (f" {window['start']}-{window['stop']} {window['timeZone']}" if window else " (none: any time)")
    )
    last = st["lastRound"]
    cx.out.print(
        f"round {last['round']} last completed"
        + (f": {json.dumps(last['summary'])}" if last["summary"] else "")
        + f"; now: {st['activity']}"
    )
    for a in st["inFlight"]:
        what = (
            f"{a['ns']} {a.get('from', '')} -> {a.get('to', '')} ({a.get('reason', '')})"
            if a["kind"] == "migration"
            else a["ns"]
        )
        cx.out.print(f"  in flight: {a['kind']} {what}")
    for ns, d in st["defragmenting"].items():
        if d["state"] != "finished":
            cx.out.print(f"  defragmenting {ns}: phase {d['currentPhase']} ({d['state']})")


@balancer_app.command("collection-status")
def collection_status(ctx: typer.Context, ns: str, json_out: bool = JsonOpt) -> None:
    """Balanced or not, with every violation and its reason."""
    cx = CliContext.of(ctx)
    doc = _state(cx, b.GetBalancerState(ns=ns))["collection"]
    if cx.json:  # with mongos's balancerCollectionStatus fields (chunkSize, balancerCompliant, ...)
        cx.print_json({**doc, **cx.build(sc.collection_status_reply, cx.catalog(), ns, doc)})
        return
    cx.out.print(f"{ns}: {'compliant' if doc['compliant'] else 'not compliant'}")
    for v in doc["violations"]:
        cx.out.print(violation_line(v))


def violation_line(v: dict[str, Any]) -> str:
    """One violation: its kind, the chunk's range and shard when it names one, and why."""
    where = f" {chunk_range(v['min'], v['max'])}" if v.get("min") is not None and v.get("max") is not None else ""
    on = f" on {v['shard']}" if v.get("shard") else ""
    return f"  {v['reason']}{where}{on}: {v.get('detail', '')}"


@balancer_app.command("snapshot")
def take_snapshot(ctx: typer.Context) -> None:
    """The live cluster in the snapshot format `plan` reads (to a file: > FILE)."""
    cx = CliContext.of(ctx)
    print(json.dumps(_state(cx, b.GetBalancerState(snapshot=True))["snapshot"], indent=2))


@balancer_app.command("start")
def start(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Balance the cluster (balancerEnabled true)."""
    cx = CliContext.of(ctx)
    cx.send(sc.balancer_enabled(True), lambda r: cx.out.print("balancer started"))


@balancer_app.command("stop")
def stop(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """No new balancing round (migrations under way finish)."""
    cx = CliContext.of(ctx)
    cx.send(sc.balancer_enabled(False), lambda r: cx.out.print("balancer stopped"))


@balancer_app.command("enable")
def enable(ctx: typer.Context, ns: str, json_out: bool = JsonOpt) -> None:
    """Balance this collection."""
    cx = CliContext.of(ctx)
    cx.send(sc.balancer_enabled(True, ns), lambda r: cx.out.print(f"balancing {ns}"))


@balancer_app.command("disable")
def disable(ctx: typer.Context, ns: str, json_out: bool = JsonOpt) -> None:
    """Leave this collection alone."""
    cx = CliContext.of(ctx)
    cx.send(sc.balancer_enabled(False, ns), lambda r: cx.out.print(f"not balancing {ns}"))


@balancer_app.command("window")
def window(
    ctx: typer.Context,
    start: str = typer.Option(None, help="H:MM or HH:MM, e.g. 8:00 or 23:00 (may be after --stop: wraps midnight)"),
    stop: str = typer.Option(None, help="H:MM or HH:MM (not equal to --start; --clear balances at any time)"),
    time_zone: str = typer.Option(None, "--time-zone", help="IANA name, e.g. Europe/Paris"),
    clear: bool = typer.Option(False, "--clear", help="balance at any time"),
    json_out: bool = JsonOpt,
) -> None:
    """The balancing window, with an explicit time zone (it may wrap midnight)."""
    cx = CliContext.of(ctx)
    if clear:
        return _setting(cx, "balancerWindow", None, None, "no balancing window: any time")
    if not (start and stop and time_zone):
        cx.bad_value("give --start, --stop and --time-zone (or --clear)")
    _setting(
        cx,
        "balancerWindow",
        {"start": start, "stop": stop, "timeZone": time_zone},
        None,
        f"balancing window {start}-{stop} {time_zone}",
    )


@balancer_app.command("chunk-size")
def chunk_size(
    ctx: typer.Context,
    ns: str,
    mb: int = typer.Argument(..., help="max chunk size in MB (1-1024)"),
    json_out: bool = JsonOpt,
) -> None:
    """This collection's max chunk size (wins over the cluster's)."""
    _setting(CliContext.of(ctx), "maxChunkSizeBytes", mb * 1024 * 1024, ns, f"{ns}: max chunk size {mb} MB")


@balancer_app.command("throttle")
def throttle(
    ctx: typer.Context,
    ms: int = typer.Argument(..., help="least time from one round's migrations to the next round's, in ms"),
    json_out: bool = JsonOpt,
) -> None:
    """Migration throttling between rounds (balancerMigrationsThrottlingMs)."""
    _setting(CliContext.of(ctx), "balancerMigrationsThrottlingMs", ms, None, f"{ms} ms between migration rounds")


@balancer_app.command("weight")
def weight(
    ctx: typer.Context,
    shard: str,
    value: float = typer.Argument(..., help="capacity weight (default 1)"),
    json_out: bool = JsonOpt,
) -> None:
    """A shard's capacity weight: weight 2 aims for twice the data of weight 1."""
    cx = CliContext.of(ctx)
    cat = cx.catalog()
    if shard not in cat.shards:
        cx.fail(f"shard {shard!r} does not exist", code=ErrorCode.ShardNotFound)
    weights = {**cat.settings.shardWeights, shard: value}
    _setting(cx, "shardWeights", weights, None, f"{shard}: weight {value:g}")
