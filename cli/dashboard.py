"""shardlog dashboard — the live cluster page, served in the foreground until Ctrl-C.

The same service `make up` runs (services/dashboard): this command only hosts it, on its own
catalog copy (a scratch directory unless --data-dir is given), and prints the page's URL.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import typer

from cli.context import CliContext
from libs.service import ServiceSettings, run_service
from services.dashboard.server import Dashboard, load_figures

dashboard_app = typer.Typer()


@dashboard_app.command("dashboard")
def dashboard(
    ctx: typer.Context,
    port: int = typer.Option(None, "--port", help="HTTP port (default: $SHARDLOG_DASHBOARD_PORT or 8090; 0: any free)"),
    bind: str = typer.Option(
        None, "--bind", help="address to listen on (default: $SHARDLOG_DASHBOARD_BIND or 127.0.0.1)"
    ),
    data_dir: Path = typer.Option(None, "--data-dir", help="where to keep its catalog copy (default: a scratch dir)"),
) -> None:
    """Serve the live cluster page (shards, chunks, migrations, balancer, range deletions) and print its URL."""
    cx = CliContext.of(ctx)
    cx.run(cx.check_cluster())  # a clear error now, rather than a page that never fills
    with tempfile.TemporaryDirectory(prefix="shardlog-dashboard-") as scratch:
        settings = ServiceSettings.from_env(bootstrap=cx.bootstrap, cluster=cx.cluster, data_dir=data_dir or scratch)
        try:
            board = Dashboard(settings, port=port, bind=bind, figures=load_figures(settings, instance="cli"))
        except ValueError as e:
            cx.bad_value(str(e))

        async def serve() -> None:
            task = asyncio.create_task(board.run())
            serving = asyncio.create_task(board.serving.wait())
            await asyncio.wait([task, serving], return_when=asyncio.FIRST_COMPLETED)
            if not board.serving.is_set():
                serving.cancel()
                try:
                    await task
                except OSError as e:  # the port is taken, the address is not ours
                    raise SystemExit(f"error: cannot serve on {board.host}:{board.port}: {e.strerror or e}") from None
                return
            print(f"shardlog dashboard of cluster {cx.cluster!r}: {board.url}  (Ctrl-C stops it)", flush=True)
            await task

        run_service("dashboard", serve)
