"""shardlog defragment NS start|stop|status — ask the live balancer to defragment a collection."""

from __future__ import annotations

from enum import Enum
from typing import Any

import typer

from cli.context import CliContext, JsonOpt
from schemas import balancer as b

defragment_app = typer.Typer()


class DefragAction(str, Enum):  # noqa: UP042 (StrEnum would change how typer prints it)
    start = "start"
    stop = "stop"
    status = "status"


@defragment_app.command("defragment")
def defragment(
    ctx: typer.Context,
    ns: str,
    action: DefragAction = typer.Argument(..., help="start, stop or status"),
    json_out: bool = JsonOpt,
) -> None:
    """Defragment a collection (merge and measure, move and merge small chunks, merge); the
    balancer does not balance it meanwhile.  `status`: its phase and progress."""
    cx = CliContext.of(ctx)
    if action is DefragAction.status:
        return _status(cx, ns)
    request = b.StartDefragmentation(ns=ns) if action is DefragAction.start else b.StopDefragmentation(ns=ns)
    res = cx.request(cx.topics.balancer_commands, request)
    if cx.json:
        cx.print_json(res)
    elif action is DefragAction.start:
        cx.out.print(
            f"defragmenting {ns}"
            if res["started"]
            else f"{ns} is already being defragmented (phase {res['status']['currentPhase']})"
        )
    else:
        cx.out.print(
            f"stopping the defragmentation of {ns} (actions in flight finish)"
            if res["stopped"]
            else f"{ns} is not being defragmented"
        )


def _status(cx: CliContext, ns: str) -> None:
    state = cx.request(cx.topics.balancer_commands, b.GetBalancerState())
    doc: dict[str, Any] = state["defragmenting"].get(ns) or {"ns": ns, "currentPhase": None, "state": "never started"}
    if cx.json:
        cx.print_json(doc)
    elif doc["currentPhase"] is None:
        cx.out.print(f"{ns}: not defragmented")
    else:
        cx.out.print(
            f"{ns}: phase {doc['currentPhase']} ({doc['state']}), "
            f"{doc['remainingChunksToProcess']} chunk(s) to process, {doc['outstanding']} in flight; "
            + ", ".join(f"{doc[k]} {k}" for k in ("merges", "dataSizes", "moves", "retries", "restarts"))
        )
