"""The live figures of the last minute: a faust app aggregating `<cluster>.metrics`.

Shards and routers publish one `schemas.metrics.MetricSummary` per second (libs/metrics.py).
This faust app (at-least-once, one agent of concurrency 1) keeps them in a windowed table
keyed by source ("shard:s0", "router:router-1a2b"): tumbling one-second windows by the
record's timestamp (the summary's start), kept for the last minute, RocksDB-backed
(faust's `rocksdb://` store on rocksdict) and recovered from the table's changelog topic.
Within a window a summary is stored under its start, so a summary delivered twice (at
least once) replaces itself: the table is an idempotent latest-value store.

`Figures.last_minute()` merges the windows of the last 60 s: ops/s, p50/p99 (from the merged
latency histograms, libs.metrics.Histogram) and ops by type, per shard (what the shard
decided), per collection (what the routers served on it, client-seen) and per router.

A record of `metrics` that does not parse (not JSON, unknown type or version, missing
fields) goes to `<cluster>.deadletter` with the reason, like every dead letter, and the app
goes on.  faust runs as a mode Service inside the caller's event loop (the dashboard's
aiohttp server's), with faust's own web server off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import faust
from faust.types import EventT, StreamT

from libs import kafka
from libs.metrics import Histogram
from libs.service import ServiceSettings
from schemas import RecordError
from schemas import metrics as schema

log = logging.getLogger(__name__)

WINDOW_S = 60
START_TIMEOUT_S = 60.0
CORE_OPS = ("insert", "find", "update", "delete")  # always present in `ops`, even at 0


class Figures:
    """One per dashboard process."""

    def __init__(self, settings: ServiceSettings, instance: str = "main") -> None:
        self.settings = settings
        # Each dashboard instance is its own faust app (consumer group and table changelog): with
        # one shared group, a second dashboard (`shardlog dashboard` beside `make up`'s) would be
        # given no partition of `metrics` and show no figures.
        self.app_id = f"{settings.cluster}.dashboard.figures" + ("" if instance == "main" else f".{instance}")
        self.topics = settings.topics
        self.dead_lettered = 0
        self.aggregated = 0
        self.app: faust.App | None = None
        self._windows: Any = None  # the windowed table (faust's WindowWrapper)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Join the faust app in the running loop; returns once it reads `metrics`."""
        t = self.topics
        await kafka.ensure_topics(
            self.settings.bootstrap, [s for s in t.core() if s.name in (t.metrics, t.dead_letters)]
        )
        datadir = self.settings.data_dir / "dashboard-figures"
        datadir.mkdir(parents=True, exist_ok=True)
        app = faust.App(
            self.app_id,  # the consumer group; prefixes the changelog topic
            broker=f"kafka://{self.settings.bootstrap}",
            store="rocksdb://",  # rocksdict, faust's RocksDB driver when python-rocksdb is absent
            datadir=str(datadir),
            web_enabled=False,  # the dashboard's own server serves the figures
            autodiscover=False,
            processing_guarantee="at_least_once",
            topic_partitions=1,
            topic_replication_factor=1,
        )
        source = app.topic(t.metrics, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self._windows = app.Table("summaries", default=dict, partitions=1).tumbling(
            1.0, expires=timedelta(seconds=WINDOW_S + 10)
        )
        app.agent(source, name="aggregate", concurrency=1)(self._aggregate)
        self.app = app
        await app.start()
        await _wait_until(lambda: bool(app.consumer.assignment()), START_TIMEOUT_S, "the figures' consumer to join")

    async def stop(self) -> None:
        if self.app is not None:
            await self.app.stop()
            self.app = None

    # ------------------------------------------------------------ the stream

    async def _aggregate(self, stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                summary = schema.summaries.decode(event.value)
            except RecordError as e:
                await self._dead_letter(event, e.reason)
                continue
            try:
                self._store(summary)
            except Exception:  # a bug here must not stop the figures: this summary is lost, say so
                log.exception("figures: %s@%d not aggregated", event.message.topic, event.message.offset)
                continue
            self.aggregated += 1

    def _store(self, summary: schema.MetricSummary) -> None:
        key = f"{summary.role}:{summary.name}"
        window = dict(self._windows[key].current())
        window[repr(summary.start)] = summary.model_dump(mode="json", exclude={"type", "v"})
        self._windows[key] = window

    async def _dead_letter(self, event: EventT[bytes], reason: str) -> None:
        msg = event.message
        log.warning("figures: %s@%d dead-lettered: %s", msg.topic, msg.offset, reason)
        assert self.app is not None
        await self.app.producer.send_and_wait(
            self.topics.dead_letters,
            msg.key,
            msg.value,
            None,
            None,
            [
                ("dlq.reason", reason.encode()),
                ("dlq.topic", msg.topic.encode()),
                ("dlq.partition", str(msg.partition).encode()),
                ("dlq.offset", str(msg.offset).encode()),
            ],
        )
        self.dead_lettered += 1

    # ------------------------------------------------------------ the figures

    def last_minute(self) -> dict[str, Any]:
        """The last minute's figures, JSON-ready; never raises (an empty picture instead)."""
        now = time.time()
        out: dict[str, Any] = {
            "windowS": WINDOW_S,
            "at": round(now, 3),
            "shards": {},
            "collections": {},
            "routers": {},
            "dropped": {"spans": 0, "summaries": 0},
        }
        try:
            summaries = self._summaries(now - WINDOW_S)
        except Exception:  # a store being recovered or closed: say nothing rather than fail the page
            log.exception("figures: reading the windows failed")
            return out
        by_source: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for s in summaries:
            by_source.setdefault((s["role"], s["name"]), []).append(s)
        routers_covered = 0.0
        namespaces: dict[str, list[dict[str, Any]]] = {}
        for (role, name), group in sorted(by_source.items()):
            covered = _covered(group)
            out["shards" if role == "shard" else "routers"][name] = _row([s["total"] for s in group], covered)
            latest = max(group, key=lambda s: s["start"])["dropped"]
            for kind in ("spans", "summaries"):
                out["dropped"][kind] += int(latest.get(kind, 0))
            if role == "router":
                routers_covered = max(routers_covered, covered)
                for s in group:
                    for ns, figures in s["namespaces"].items():
                        namespaces.setdefault(ns, []).append(figures)
        for ns, figures in sorted(namespaces.items()):
            out["collections"][ns] = _row(figures, routers_covered)
        return out

    def _summaries(self, since: float) -> list[dict[str, Any]]:
        if self._windows is None:
            return []
        got = []
        for key, window in list(self._windows.table.items()):
            _, (start, _end) = key
            if start < since - 1:
                continue  # an expired window not cleaned up yet
            got.extend(s for s in window.values() if s["start"] >= since)
        return got


def _covered(group: list[dict[str, Any]]) -> float:
    """The seconds a source's summaries cover (at least 1: a first summary is a second's)."""
    return max(1.0, min(float(WINDOW_S), sum(float(s["seconds"]) for s in group)))


def _row(figures: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    ops = dict.fromkeys(CORE_OPS, 0)
    latency = Histogram()
    for f in figures:
        for op, n in f["ops"].items():
            ops[op] = ops.get(op, 0) + int(n)
        latency.merge({int(i): int(n) for i, n in f["latency"].items()})
    return {
        "opsPerSec": round(sum(ops.values()) / max(seconds, 1.0), 3),
        "p50Ms": round(latency.percentile(0.50), 3),
        "p99Ms": round(latency.percentile(0.99), 3),
        "ops": ops,
    }


async def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
