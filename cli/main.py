"""shardlog — the operator's entry point.

Every subcommand prints for humans, or JSON with `--json`; an error exits
non-zero with one line.  Cluster address from --bootstrap / $KAFKA_BOOTSTRAP,
cluster name (topic prefix) from --cluster / $SHARDLOG_CLUSTER.

One Typer app per command group, each in its own module, all added here:

    dead_letters     dead-letters
    shards           add-shard, remove-shard, create-database
    chunks           shard-collection, split, merge
    documents        insert, find, count, explain
    status           status
    range_deletions  range-deletions
    sessions         sessions
    migrations       move-range, move-chunk, move-primary, abort-move-primary, set-allow-migrations
    defragment       defragment
    ddl              drop-collection, drop-database, rename-collection, refine-shard-key, ddl status
    zones            zone add-shard | remove-shard | add-range | remove-range
    settings         settings set | get
    top              top
    topics           topics create
    workload         workload load | run
    dashboard        dashboard (the live cluster page)
    balancer         balancer plan | status | collection-status | snapshot | start | stop | ...

The root callback builds the CliContext (cli/context.py) every command reads from `ctx.obj`.
"""

from __future__ import annotations

import typer

from cli import (
    balancer,
    chunks,
    dashboard,
    ddl,
    dead_letters,
    defragment,
    documents,
    indexes,
    migrations,
    range_deletions,
    sessions,
    settings,
    shards,
    status,
    top,
    topics,
    workload,
    zones,
)
from cli.context import DEFAULT_BOOTSTRAP, CliContext

app = typer.Typer(
    help="Operate a shardlog cluster.", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
)


@app.callback()
def main(
    ctx: typer.Context,
    bootstrap: str = typer.Option(None, "--bootstrap", envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers"),
    cluster: str = typer.Option("shardlog", "--cluster", envvar="SHARDLOG_CLUSTER", help="cluster name (topic prefix)"),
    timeout: float = typer.Option(30.0, "--timeout", help="seconds to wait for a reply"),
) -> None:
    # The cluster name is checked where its topics are first needed, once the command's --json is known.
    ctx.obj = CliContext(bootstrap or DEFAULT_BOOTSTRAP, cluster, timeout)


# Commands at the top level, then the named groups (`shardlog --help` lists them in this order).
for commands in (
    dead_letters.dead_letters_app,
    shards.shards_app,
    chunks.chunks_app,
    documents.documents_app,
    status.status_app,
    range_deletions.range_deletions_app,
    sessions.sessions_app,
    migrations.migrations_app,
    defragment.defragment_app,
    ddl.ddl_app,
    dashboard.dashboard_app,
    top.top_app,
):
    app.add_typer(commands)
app.add_typer(zones.zone_app, name="zone")
app.add_typer(settings.settings_app, name="settings")
app.add_typer(topics.topics_app, name="topics")
app.add_typer(workload.workload_app, name="workload")
app.add_typer(balancer.balancer_app, name="balancer")
app.add_typer(ddl.ddl_status_app, name="ddl")
app.add_typer(indexes.index_app, name="index")

if __name__ == "__main__":
    app()
