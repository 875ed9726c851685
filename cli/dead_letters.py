"""shardlog dead-letters — records that did not parse, with the reason and where they came from."""

from __future__ import annotations

from typing import Any

import typer
from aiokafka.structs import ConsumerRecord
from rich.table import Table

from cli.context import CLIENT_ID, CliContext, JsonOpt
from libs.bus import read_to_end

dead_letters_app = typer.Typer()


@dead_letters_app.command("dead-letters")
def dead_letters(
    ctx: typer.Context, limit: int = typer.Option(20, help="show the last N"), json_out: bool = JsonOpt
) -> None:
    """Records that did not parse, with the reason and where they came from."""
    cx = CliContext.of(ctx)
    rows = [_row(r) for r in cx.run(_last(cx, limit))]
    if cx.json:
        cx.print_json({"deadLetters": rows})
        return
    t = Table("offset", "from", "reason", "value", title=f"dead letters of {cx.cluster!r}")
    for row in rows:
        t.add_row(str(row["offset"]), row["from"], row["reason"] or "", row["value"])
    cx.out.print(t if rows else "no dead letters")


async def _last(cx: CliContext, limit: int) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []

    async def take(records: list[ConsumerRecord]) -> None:
        got.extend(records)

    # commit markers take offsets too: start twice as far back
    await read_to_end(cx.bootstrap, cx.topics.dead_letters, take, start=-limit * 2, client_id=CLIENT_ID)
    return got[-limit:]


def _row(r: ConsumerRecord) -> dict[str, Any]:
    h = {k: v.decode(errors="replace") for k, v in r.headers or ()}
    return {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "reason": h.get("dlq.reason"),
        "from": f"{h.get('dlq.topic')}@{h.get('dlq.offset')}",
        "value": (r.value or b"")[:200].decode(errors="replace"),
    }
