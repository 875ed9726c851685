"""shardlog balancer — what the balancer would do, from a snapshot of the cluster.

`plan` runs the balancer's own chunk-selection policy (services/balancer/policy.py)
on a snapshot file, offline: no broker needed.  `shardlog defragment NS
start|stop|status` asks the live balancer to defragment a collection.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import NoReturn

import typer
from pydantic import ValidationError

from domain.protocol import ErrorCode
from services.balancer import policy

balancer_app = typer.Typer(help="The balancer: its decisions, from a cluster snapshot.", no_args_is_help=True)


@balancer_app.callback()
def _group() -> None:
    """The balancer: its decisions, from a cluster snapshot."""  # a callback keeps `plan` a subcommand


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


class DefragAction(str, Enum):  # noqa: UP042 (StrEnum would change how typer prints it)
    start = "start"
    stop = "stop"
    status = "status"


def register(app: typer.Typer, m) -> None:
    """Add `balancer` to the main CLI, with the commands that talk to a cluster; `m` is cli.main."""
    from schemas import balancer as b
    from schemas import config as c

    JsonOpt = m.JsonOpt

    def balancer_state(req, as_json: bool) -> dict:
        async def go():
            from libs.requests import Requester

            async with Requester(m._ctx.bootstrap, m._ctx.topics.cli_replies, client_id="shardlog-cli") as r:
                return await r.request(m._ctx.topics.balancer_commands, req, timeout=m._ctx.timeout)

        reply = m.run(go())
        if not reply.ok:
            m.fail(reply.error or "", code=reply.code or "Error", as_json=as_json)
        return reply.result or {}

    def setting(key: str, value, ns: str | None, as_json: bool, said: str) -> None:
        m.send(c.SetSetting(key=key, value=value, ns=ns), as_json, lambda r: m.out.print(said))

    @balancer_app.command("status")
    def status(json_out: bool = JsonOpt) -> None:
        """On or off, inside the window or not, the current round, actions in flight."""
        st = balancer_state(b.GetBalancerState(), json_out)
        if json_out:
            print(json.dumps({"ok": True, **st}))
            return
        m.out.print(
            f"balancer {'on' if st['enabled'] else 'off'}; "
            f"{'inside' if st['inWindow'] else 'outside'} the window"
            + (
                f" {st['window']['start']}-{st['window']['stop']} {st['window']['timeZone']}"
                if st["window"]
                else " (none: any time)"
            )
        )
        last = st["lastRound"]
        m.out.print(
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
            m.out.print(f"  in flight: {a['kind']} {what}")
        for ns, d in st["defragmenting"].items():
            if d["state"] != "finished":
                m.out.print(f"  defragmenting {ns}: phase {d['currentPhase']} ({d['state']})")

    @balancer_app.command("collection-status")
    def collection_status(ns: str, json_out: bool = JsonOpt) -> None:
        """Balanced or not, with every violation and its reason."""
        doc = balancer_state(b.GetBalancerState(ns=ns), json_out)["collection"]
        if json_out:
            print(json.dumps({"ok": True, **doc}))
            return
        m.out.print(f"{ns}: {'compliant' if doc['compliant'] else 'not compliant'}")
        for v in doc["violations"]:
            m.out.print(f"  {v['reason']}: {v.get('detail', '')}")

    @balancer_app.command("snapshot")
    def take_snapshot() -> None:
        """The live cluster in the snapshot format `plan` reads (to a file: > FILE)."""
        print(json.dumps(balancer_state(b.GetBalancerState(snapshot=True), False)["snapshot"], indent=2))

    @balancer_app.command("start")
    def start(json_out: bool = JsonOpt) -> None:
        """Balance the cluster (balancerEnabled true)."""
        setting("balancerEnabled", True, None, json_out, "balancer started")

    @balancer_app.command("stop")
    def stop(json_out: bool = JsonOpt) -> None:
        """No new balancing round (migrations under way finish)."""
        setting("balancerEnabled", False, None, json_out, "balancer stopped")

    @balancer_app.command("enable")
    def enable(ns: str, json_out: bool = JsonOpt) -> None:
        """Balance this collection."""
        setting("balancerEnabled", True, ns, json_out, f"balancing {ns}")

    @balancer_app.command("disable")
    def disable(ns: str, json_out: bool = JsonOpt) -> None:
        """Leave this collection alone."""
        setting("balancerEnabled", False, ns, json_out, f"not balancing {ns}")

    @balancer_app.command("window")
    def window(
        start: str = typer.Option(None, help="HH:MM"),
        stop: str = typer.Option(None, help="HH:MM"),
        time_zone: str = typer.Option(None, "--time-zone", help="IANA name, e.g. Europe/Paris"),
        clear: bool = typer.Option(False, "--clear", help="balance at any time"),
        json_out: bool = JsonOpt,
    ) -> None:
        """The balancing window, with an explicit time zone (it may wrap midnight)."""
        if clear:
            return setting("balancerWindow", None, None, json_out, "no balancing window: any time")
        if not (start and stop and time_zone):
            m.fail(
                "give --start, --stop and --time-zone (or --clear)",
                code=ErrorCode.BadValue,
                as_json=json_out,
                exit_code=2,
            )
        setting(
            "balancerWindow",
            {"start": start, "stop": stop, "timeZone": time_zone},
            None,
            json_out,
            f"balancing window {start}-{stop} {time_zone}",
        )

    @balancer_app.command("chunk-size")
    def chunk_size(
        ns: str, mb: int = typer.Argument(..., help="max chunk size in MB (1-1024)"), json_out: bool = JsonOpt
    ) -> None:
        """This collection's max chunk size (wins over the cluster's)."""
        setting("maxChunkSizeBytes", mb * 1024 * 1024, ns, json_out, f"{ns}: max chunk size {mb} MB")

    @balancer_app.command("throttle")
    def throttle(
        ms: int = typer.Argument(..., help="least time from one round's migrations to the next round's, in ms"),
        json_out: bool = JsonOpt,
    ) -> None:
        """Migration throttling between rounds (balancerMigrationsThrottlingMs)."""
        setting("balancerMigrationsThrottlingMs", ms, None, json_out, f"{ms} ms between migration rounds")

    @balancer_app.command("weight")
    def weight(
        shard: str, value: float = typer.Argument(..., help="capacity weight (default 1)"), json_out: bool = JsonOpt
    ) -> None:
        """A shard's capacity weight: weight 2 aims for twice the data of weight 1."""
        cat = m._catalog(None, json_out)
        if shard not in cat.shards:
            m.fail(f"shard {shard!r} does not exist", code=ErrorCode.ShardNotFound, as_json=json_out)
        weights = {**cat.settings.shardWeights, shard: value}
        setting("shardWeights", weights, None, json_out, f"{shard}: weight {value:g}")

    @app.command("defragment")
    def defragment(
        ns: str, action: DefragAction = typer.Argument(..., help="start, stop or status"), json_out: bool = JsonOpt
    ) -> None:
        """Defragment a collection (merge and measure, move and merge small chunks, merge); the
        balancer does not balance it meanwhile.  `status`: its phase and progress."""
        if action is DefragAction.status:
            doc = balancer_state(b.GetBalancerState(), json_out)["defragmenting"].get(ns)
            doc = doc or {"ns": ns, "currentPhase": None, "state": "never started"}
            if json_out:
                print(json.dumps({"ok": True, **doc}))
            elif doc["currentPhase"] is None:
                m.out.print(f"{ns}: not defragmented")
            else:
                m.out.print(
                    f"{ns}: phase {doc['currentPhase']} ({doc['state']}), "
                    f"{doc['remainingChunksToProcess']} chunk(s) to process, {doc['outstanding']} in flight; "
                    + ", ".join(f"{doc[k]} {k}" for k in ("merges", "dataSizes", "moves", "retries", "restarts"))
                )
            return
        req = b.StartDefragmentation(ns=ns) if action is DefragAction.start else b.StopDefragmentation(ns=ns)
        res = balancer_state(req, json_out)
        if json_out:
            print(json.dumps({"ok": True, **res}))
        elif action is DefragAction.start:
            m.out.print(
                f"defragmenting {ns}"
                if res["started"]
                else f"{ns} is already being defragmented (phase {res['status']['currentPhase']})"
            )
        else:
            m.out.print(
                f"stopping the defragmentation of {ns} (actions in flight finish)"
                if res["stopped"]
                else f"{ns} is not being defragmented"
            )

    app.add_typer(balancer_app, name="balancer")
