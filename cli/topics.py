"""shardlog topics — the Kafka topics of the cluster."""

from __future__ import annotations

import typer

from cli.context import CliContext, JsonOpt
from libs import kafka

topics_app = typer.Typer(help="Kafka topics of the cluster.", no_args_is_help=True)


@topics_app.command("create")
def topics_create(ctx: typer.Context, json_out: bool = JsonOpt) -> None:
    """Create the cluster's core topics (idempotent)."""
    cx = CliContext.of(ctx)
    created = cx.run(kafka.ensure_topics(cx.bootstrap, cx.topics.core()))
    if cx.json:
        cx.print_json({"created": created})
    else:
        cx.out.print(f"created {', '.join(created)}" if created else "all topics already exist")
