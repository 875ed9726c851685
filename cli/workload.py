"""shardlog workload — drive the cluster with the YCSB core workloads and measure it.

    shardlog workload load ycsb --records 100000
    shardlog workload run ycsb-a --ops 100000 --records 100000 --rate 2000

Live progress on a terminal, a progress line every few seconds elsewhere;
then a table and the final JSON report (only the JSON with --json).  Metrics
go over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable

import typer
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from cli.context import CliContext, JsonOpt
from domain.protocol import split_ns
from libs.client import AsyncCluster
from libs.errors import CommandError
from services.workload import runner
from services.workload.ycsb import REQUEST_DISTRIBUTIONS, Workload

workload_app = typer.Typer(help="YCSB workloads: load records, run operations, measure them.", no_args_is_help=True)

LINE_EVERY = 5.0  # seconds between progress lines when not on a terminal

NsOpt = typer.Option("ycsb.usertable", "--ns", help="the collection, db.collection")
ConcurrencyOpt = typer.Option(8, "--concurrency", "-c", help="operations in flight (load: insert_many batches)")
SeedOpt = typer.Option(None, "--seed", help="fix the random operation stream and values")
RetryWritesOpt = typer.Option(
    True,
    "--retry-writes/--no-retry-writes",
    help="retryable writes (lsid + txnNumber: a retry applies once); --no-retry-writes: plain writes, sent once",
)


# ---------------------------------------------------------------- helpers


def _workload(cx: CliContext, name: str) -> Workload:
    try:
        return runner.resolve_workload(name)
    except ValueError as e:
        cx.bad_value(str(e))


def _require(cx: CliContext, ok: bool, message: str) -> None:
    if not ok:
        cx.bad_value(message)


def _split_ns(cx: CliContext, ns: str) -> tuple[str, str]:
    try:
        return split_ns(ns)  # the one rule for names, as the router applies it
    except CommandError as e:
        cx.fail(f"--ns: {e.message}", code=e.code, exit_code=2)


def _setup_metrics() -> Callable[[], None]:
    """An OTLP/HTTP MeterProvider when an endpoint is configured, else the API's
    no-op meter (nothing recorded, nothing to pay).  Returns the flush to call
    at the end, so a short run still exports its numbers."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    provider = metrics.get_meter_provider()
    if isinstance(provider, MeterProvider):  # already installed in this process
        return lambda: provider.force_flush(5000)
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    ):
        return lambda: None
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    name = os.environ.get("OTEL_SERVICE_NAME", "shardlog-workload")
    provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
        resource=Resource.create({"service.name": name}),
    )
    metrics.set_meter_provider(provider)
    return lambda: provider.force_flush(5000)


def _ms(v: float) -> str:
    return f"{v:,.2f}"


class ProgressDisplay:
    """rich Live on a terminal (refreshed with each ~0.5 s progress snapshot),
    a line on stderr every LINE_EVERY seconds elsewhere, nothing with --json."""

    def __init__(self, title: str, unit: str, as_json: bool, out: Console, err: Console) -> None:
        self.title, self.unit, self.err = title, unit, err
        self.live = Live(console=out, auto_refresh=False) if not as_json and out.is_terminal else None
        self.lines = not as_json and self.live is None
        self._last_line = time.monotonic()

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def update(self, p: runner.Progress) -> None:
        if self.live:
            self.live.update(self._render(p), refresh=True)
        elif self.lines and (p.final or time.monotonic() - self._last_line >= LINE_EVERY):
            self._last_line = time.monotonic()
            self.err.print(f"{self.title}: {self._figures(p)}", highlight=False, soft_wrap=True)

    def _figures(self, p: runner.Progress) -> str:
        return (
            f"{p.done:,}/{p.total:,} {self.unit}  {p.ops_per_s:,.0f} {self.unit}/s  p50 {_ms(p.p50_ms)} ms  "
            f"p95 {_ms(p.p95_ms)} ms  p99 {_ms(p.p99_ms)} ms  errors {p.errors:,}  {p.elapsed_s:,.1f} s"
        )

    def _render(self, p: runner.Progress) -> Table:
        t = Table.grid(padding=(0, 2))
        t.add_row(
            f"[bold]{self.title}[/bold]", ProgressBar(total=p.total, completed=p.done, width=30), self._figures(p)
        )
        return t


def _execute(
    cx: CliContext,
    title: str,
    unit: str,
    fn: Callable[[AsyncCluster, runner.ProgressCallback], Awaitable[runner.Report]],
    retry_writes: bool = True,
) -> runner.Report:
    """Connect, run fn(cluster, progress) under a progress display, flush the metrics."""
    flush = _setup_metrics()
    try:
        with ProgressDisplay(title, unit, cx.json, cx.out, cx.err) as display:
            return cx.with_client(lambda c: fn(c, display.update), retry_writes=retry_writes)
    finally:
        flush()


def _print_report(cx: CliContext, report: runner.Report) -> None:
    line = json.dumps({"ok": True, **report.to_dict()})
    if cx.json:
        print(line)
        return
    out = cx.out
    t = Table(
        "kind",
        "ok",
        "errors",
        "ops/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        title=f"{report.workload} {report.phase} on {report.ns}",
    )
    for kind, k in report.kinds.items():
        lat = k.latency_ms
        t.add_row(
            kind,
            f"{k.count:,}",
            f"{k.errors:,}",
            f"{k.ops_per_s:,.1f}",
            _ms(lat["p50"]),
            _ms(lat["p95"]),
            _ms(lat["p99"]),
            _ms(lat["max"]),
        )
    out.print(t)
    unit = "records" if report.phase == "load" else "ops"
    out.print(
        f"{report.operations:,} {unit} in {report.elapsed_s:,.2f} s: {report.throughput_ops_s:,.1f} {unit}/s, "
        f"{report.inserted:,} inserted, {report.total_errors:,} errors",
        highlight=False,
    )
    for kind, by_code in report.errors.items():
        out.print(
            f"[red]errors[/red] {kind}: " + ", ".join(f"{code} {n:,}" for code, n in by_code.items()), highlight=False
        )
    print(line)  # the final JSON report, for humans too


# --------------------------------------------------------------- commands


@workload_app.command("load")
def load_cmd(
    ctx: typer.Context,
    workload: str = typer.Argument(..., help="ycsb (every core workload reads the same records)"),
    records: int = typer.Option(..., "--records", help="records to insert"),
    ns: str = NsOpt,
    concurrency: int = ConcurrencyOpt,
    batch_size: int = typer.Option(100, "--batch-size", help="records per insert_many"),
    seed: int | None = SeedOpt,
    retry_writes: bool = RetryWritesOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Insert the YCSB records (user…, field0..field9 of 100 characters)."""
    cx = CliContext.of(ctx)
    w = _workload(cx, "a" if workload.lower() == "ycsb" else workload)
    _require(cx, records >= 1, "--records must be >= 1")
    _require(cx, concurrency >= 1, "--concurrency must be >= 1")
    _require(cx, batch_size >= 1, "--batch-size must be >= 1")
    db, coll = _split_ns(cx, ns)
    report = _execute(
        cx,
        "ycsb load",
        "records",
        lambda c, progress: runner.load(
            c[db][coll], w, records, concurrency=concurrency, batch_size=batch_size, progress=progress, seed=seed
        ),
        retry_writes,
    )
    _print_report(cx, report)


@workload_app.command("run")
def run_cmd(
    ctx: typer.Context,
    workload: str = typer.Argument(..., help="ycsb-a, ycsb-b, ycsb-c, ycsb-d, ycsb-e or ycsb-f"),
    ops: int = typer.Option(..., "--ops", help="operations to execute"),
    records: int = typer.Option(
        1000,
        "--records",
        help="records loaded; the collection's documents when more (a run's inserts continue after an earlier run's)",
    ),
    rate: float | None = typer.Option(None, "--rate", help="target ops/s (default: as fast as possible)"),
    concurrency: int = ConcurrencyOpt,
    distribution: str | None = typer.Option(
        None, "--distribution", help="zipfian, uniform or latest (default: the workload's)"
    ),
    ns: str = NsOpt,
    seed: int | None = SeedOpt,
    retry_writes: bool = RetryWritesOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Run a YCSB core workload against loaded records and measure it."""
    cx = CliContext.of(ctx)
    w = _workload(cx, workload)
    _require(cx, ops >= 1, "--ops must be >= 1")
    _require(cx, records >= 1, "--records must be >= 1")
    _require(cx, rate is None or rate > 0, "--rate must be > 0")
    _require(cx, concurrency >= 1, "--concurrency must be >= 1")
    _require(
        cx,
        distribution is None or distribution in REQUEST_DISTRIBUTIONS,
        f"--distribution must be one of {', '.join(REQUEST_DISTRIBUTIONS)}",
    )
    db, coll = _split_ns(cx, ns)
    report = _execute(
        cx,
        f"ycsb-{w.name}",
        "ops",
        lambda c, progress: runner.run(
            c[db][coll],
            w,
            ops,
            concurrency=concurrency,
            rate=rate,
            record_count=records,
            progress=progress,
            request_distribution=distribution,
            seed=seed,
        ),
        retry_writes,
    )
    _print_report(cx, report)
