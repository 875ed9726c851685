"""The dashboard service: an HTTP server (aiohttp) with the cluster page and its snapshot.

    GET /               the page (static/index.html; its JS and CSS under /static/)
    GET /api/snapshot   the cluster picture as JSON (snapshot.assemble), plus the figures block

The snapshot is gathered only while someone asks for it, at most once per GATHER_EVERY_S
however many pages poll, and every query has a short bound (SHARDLOG_DASHBOARD_QUERY_TIMEOUT_S):
a shard or balancer that does not answer in time shows as unknown, and is left alone for
BACKOFF_S before it is asked again, so a slow or dead service costs the page nothing and no
requests pile up in its topic.  The catalog and the statistics are read from the log, never asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.shard_statistics import follow_shard_statistics
from libs import aio, kafka, tracing
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, seconds_from_env, supervised
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import Record, stats
from schemas import balancer as b
from schemas import shard as s
from services.dashboard import snapshot

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
DEFAULT_PORT = 8090
DEFAULT_TRACING_UI = "http://127.0.0.1:9411/zipkin"
GATHER_EVERY_S = 0.5  # pages poll every second; several pages share one gathering
BACKOFF_S = 5.0  # a service that did not answer is asked again only after this long


class FiguresSource(Protocol):
    """What the dashboard needs of services/dashboard/figures.py's Figures."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def last_minute(self) -> dict[str, Any]: ...


def dashboard_address(port: int | None = None, bind: str | None = None) -> tuple[str, int]:
    """(host, port): arguments first, else SHARDLOG_DASHBOARD_BIND (default 127.0.0.1) and
    SHARDLOG_DASHBOARD_PORT (default 8090; 0 picks a free port)."""
    host = bind or os.environ.get("SHARDLOG_DASHBOARD_BIND") or "127.0.0.1"
    if port is None:
        raw = os.environ.get("SHARDLOG_DASHBOARD_PORT") or str(DEFAULT_PORT)
        try:
            port = int(raw)
        except ValueError:
            raise ValueError(f"SHARDLOG_DASHBOARD_PORT={raw!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"dashboard port {port} is not in 0-65535")
    return host, port


class Dashboard:
    name = "dashboard"

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        port: int | None = None,
        bind: str | None = None,
        figures: FiguresSource | None = None,
        tracing_ui: str | None = None,
    ) -> None:
        self.settings = settings
        self.host, self.port = dashboard_address(port, bind)
        self.figures = figures
        self.links = snapshot.Links(tracing_ui or os.environ.get("SHARDLOG_TRACING_UI_URL") or DEFAULT_TRACING_UI)
        self.query_timeout = seconds_from_env("SHARDLOG_DASHBOARD_QUERY_TIMEOUT_S", 1.0)
        self.follower = CatalogFollower(settings, self.name)
        self.requester = Requester(settings.bootstrap, settings.topics.dashboard_inbox, client_id=self.name)
        self.reports: dict[str, stats.ShardStatistics] = {}
        self.rounds: list[dict[str, Any]] = []
        self._quiet_until: dict[str, tuple[float, str]] = {}  # topic -> (monotonic time to ask again, why)
        self._last: dict[str, Any] | None = None
        self._taken = 0.0
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self.serving = asyncio.Event()  # set once the page is served (self.port is then the real one)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    # ------------------------------------------------------------- HTTP

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_json_errors])
        app.router.add_get("/", self._page)
        app.router.add_get("/api/snapshot", self._snapshot)
        app.router.add_static("/static/", STATIC, show_index=False)
        return app

    async def _page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def _snapshot(self, request: web.Request) -> web.Response:
        return web.json_response(await self.snapshot(), headers={"Cache-Control": "no-store"})

    # ------------------------------------------------------------- the snapshot

    async def snapshot(self) -> dict[str, Any]:
        """The latest picture, gathered anew if the last one is older than GATHER_EVERY_S; never raises."""
        async with self._lock:  # concurrent pages wait for one gathering and share it
            if self._last is None or time.monotonic() - self._taken >= GATHER_EVERY_S:
                self._last = await self._gather()
                self._taken = time.monotonic()
            return self._last

    async def _gather(self) -> dict[str, Any]:
        catalog = self.follower.catalog
        t = self.settings.topics
        sids = sorted(catalog.shards)
        try:
            *answers, state = await asyncio.gather(
                *(self._ask(t.shard_requests(sid), s.ListMigrations()) for sid in sids),
                self._ask(t.balancer_commands, b.GetBalancerState()),
            )
            self.rounds = snapshot.remember_round(self.rounds, state)
            return snapshot.assemble(
                cluster=self.settings.cluster,
                catalog=catalog,
                reports=dict(self.reports),
                shards=dict(zip(sids, answers)),
                balancer=state,
                rounds=self.rounds,
                figures=self._figures(),
                links=self.links,
                now=time.time(),
            )
        except Exception as e:  # a bug in one part must not take the page down: say what failed
            log.exception("dashboard: the snapshot failed")
            return {
                "cluster": self.settings.cluster,
                "at": time.time(),
                "errors": {"snapshot": f"{type(e).__name__}: {e}"},
            }

    async def _ask(self, topic: str, request: Record) -> dict[str, Any] | str:
        """A service's answer, or why there is none (within the query timeout)."""
        quiet = self._quiet_until.get(topic)
        if quiet is not None and time.monotonic() < quiet[0]:
            return quiet[1]
        bound = self.query_timeout
        try:
            # the outer bound also covers a send that waits for metadata (a topic not there yet);
            # untraced: a page left open must not fill the tracing UI with its polls
            with tracing.untraced():
                reply = await aio.wait_for(self.requester.request(topic, request, timeout=bound), bound + 0.5)
        except TimeoutError:  # RequestTimeout is one
            why = f"unknown: no answer within {bound:g}s (asked again in {BACKOFF_S:g}s)"
            self._quiet_until[topic] = (time.monotonic() + BACKOFF_S, why)
            return why
        except Exception as e:
            return f"unknown: {type(e).__name__}: {e}"
        self._quiet_until.pop(topic, None)
        return (reply.result or {}) if reply.ok else f"{reply.code}: {reply.error}"

    def _figures(self) -> dict[str, Any]:
        if self.figures is None:
            return snapshot.empty_figures()
        try:
            return self.figures.last_minute()
        except Exception as e:  # the contract says it never raises; the page stays up if it does
            return {**snapshot.empty_figures(), "error": f"{type(e).__name__}: {e}"}

    # ------------------------------------------------------------- statistics

    async def _read_statistics(self) -> None:
        """Every shard's latest report, from the compacted shard.stats topic."""
        await follow_shard_statistics(self.settings, "dashboard", self._on_report)

    def _on_report(self, report: stats.ShardStatistics) -> None:
        self.reports[report.shard] = report

    # ------------------------------------------------------------- hosting

    async def run(self) -> None:
        st, t = self.settings, self.settings.topics
        await kafka.ensure_topics(
            st.bootstrap, [*t.core(), *t.for_balancer(), TopicSpec(self.requester.inbox, config=SHORT_LIVED)]
        )
        at = await self.follower.start()
        await self.requester.start()
        if self.figures is not None:
            await self.figures.start()
        reader = supervised(asyncio.create_task(self._read_statistics()), "dashboard statistics reader")
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
            if self.port == 0:  # the port the system picked
                self.port = self._runner.addresses[0][1]
            report_ready(st, self.name, configTime=at, url=self.url, port=self.port)
            self.serving.set()
            await asyncio.Event().wait()
        finally:
            clear_ready(st, self.name)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await self._runner.cleanup()
            if self.figures is not None:
                await self.figures.stop()
            await self.requester.stop()
            await self.follower.stop()


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown paths and methods answer JSON in MongoDB's error shape, not aiohttp's HTML."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: ErrorCode.CommandNotFound, 405: ErrorCode.IllegalOperation}.get(e.status, ErrorCode.BadValue)
        what = {404: "no such page", 405: f"method {request.method} not allowed on"}.get(e.status, e.reason)
        return web.json_response(
            {"ok": 0, "errmsg": f"{what} {request.path}", "code": code.number, "codeName": str(code)},
            status=e.status,
        )


def load_figures(settings: ServiceSettings, instance: str = "main") -> FiguresSource:
    """The figures aggregation (services/dashboard/figures.py) of this dashboard instance."""
    from services.dashboard.figures import Figures

    return Figures(settings, instance)
