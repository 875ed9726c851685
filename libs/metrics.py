"""Per-second metric summaries: in-process counters and their fire-and-forget publisher.

Shards and routers count the operations they handle (by type and by namespace) and
their latency in a mergeable `Histogram`; every `interval_s` (SHARDLOG_METRICS_INTERVAL_S,
default 1 s) a `MetricsPublisher` sends what was counted as one `schemas.metrics.MetricSummary`
to `<cluster>.metrics` and starts counting afresh.  SHARDLOG_METRICS=off publishes nothing.

Publishing never touches the data path: counting is a few dict updates, and sending is the
publisher's own task with its own producer, outside every transaction.  When Kafka is slow
(the previous summary still unacknowledged, or a send not accepted within an interval) the
summary is dropped and counted in `dropped`, which every later summary reports.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from libs import aio, tracing
from libs.bus import Bus, BusError, connect
from libs.service import seconds_from_env
from schemas import Codec
from schemas import metrics as schema

log = logging.getLogger(__name__)

INTERVAL_ENV = "SHARDLOG_METRICS_INTERVAL_S"
ENABLED_ENV = "SHARDLOG_METRICS"
DEFAULT_INTERVAL_S = 1.0

# Bucket i holds latencies in (GROWTH**(i-1), GROWTH**i] microseconds: each bucket is ~9 % wider
# than the one below, so a percentile read from the buckets is within 9 % of the true one, and
# 1 µs .. 100 s takes ~210 buckets (a second's summary holds only the few that occurred).
GROWTH = 2 ** (1 / 8)
_LOG_GROWTH = math.log(GROWTH)


def bucket(ms: float) -> int:
    """The bucket of a latency in milliseconds (0: a microsecond or less)."""
    us = ms * 1000.0
    return 0 if us <= 1.0 else math.ceil(math.log(us) / _LOG_GROWTH)


def upper_ms(index: int) -> float:
    """The largest latency bucket `index` holds, in milliseconds."""
    return float(GROWTH**index / 1000.0)


class Histogram:
    """Latencies as counts per log-scaled bucket: merging two is adding their counts, so the
    percentiles of a minute read from sixty per-second histograms are those of one histogram
    of all the minute's samples."""

    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    def record(self, ms: float) -> None:
        i = bucket(ms)
        self.counts[i] = self.counts.get(i, 0) + 1

    def merge(self, counts: Mapping[int, int]) -> None:
        for i, n in counts.items():
            self.counts[i] = self.counts.get(i, 0) + n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> float:
        """The nearest-rank q-quantile (0 < q <= 1) as its bucket's upper bound in ms; 0 when empty."""
        total = self.total
        if total == 0:
            return 0.0
        rank = max(1, math.ceil(q * total))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return upper_ms(i)
        return upper_ms(max(self.counts))  # not reached: seen ends at total >= rank


def operation_name(record: object) -> str:
    """A request's operation as MongoDB names it: Insert -> insert, FindAndModify -> findAndModify."""
    kind = str(getattr(record, "type", type(record).__name__))
    return kind[:1].lower() + kind[1:]


class _Figures:
    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.latency = Histogram()

    def add(self, op: str, ms: float) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1
        self.latency.record(ms)

    def record(self) -> schema.OperationFigures:
        return schema.OperationFigures(ops=dict(self.ops), latency=dict(self.latency.counts))


class OperationCounters:
    """What one service handled since the last `take`: operations by type, overall and per
    namespace, with their latency."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.started = time.time()
        self._total = _Figures()
        self._namespaces: dict[str, _Figures] = {}

    def observe(self, op: str, ns: str | None, seconds: float) -> None:
        ms = seconds * 1000.0
        self._total.add(op, ms)
        if ns:
            figures = self._namespaces.get(ns)
            if figures is None:
                figures = self._namespaces[ns] = _Figures()
            figures.add(op, ms)

    def observe_record(self, record: object, seconds: float) -> None:
        """An operation given as its request record (its type and, if it names one, namespace)."""
        ns = getattr(record, "ns", None)
        self.observe(operation_name(record), ns if isinstance(ns, str) else None, seconds)

    def take(self) -> tuple[float, float, schema.OperationFigures, dict[str, schema.OperationFigures]]:
        """(start, seconds, total, per namespace) of what was counted; counting starts afresh."""
        start, total, namespaces = self.started, self._total, self._namespaces
        self._reset()
        return (
            start,
            max(self.started - start, 1e-6),
            total.record(),
            {ns: f.record() for ns, f in namespaces.items()},
        )


R = TypeVar("R")
T = TypeVar("T")


def timed(counters: OperationCounters, handle: Callable[[R], T]) -> Callable[[R], T]:
    """`handle` (a request's record -> its result) that also counts each request and its duration."""

    def run(record: R) -> T:
        started = time.perf_counter()
        try:
            return handle(record)
        finally:
            counters.observe_record(record, time.perf_counter() - started)

    return run


def enabled_from_env() -> bool:
    raw = os.environ.get(ENABLED_ENV, "on").strip().lower()
    if raw not in ("on", "off", "1", "0", "true", "false"):
        raise ValueError(f"{ENABLED_ENV}={raw!r}: use on or off")
    return raw in ("on", "1", "true")


def interval_from_env() -> float:
    return seconds_from_env(INTERVAL_ENV, DEFAULT_INTERVAL_S)


class MetricsPublisher:
    """Publishes the counters of one shard or router every interval, fire-and-forget."""

    def __init__(
        self,
        bus: str | Bus,
        topic: str,
        role: str,
        name: str,
        *,
        active: asyncio.Event | None = None,
        interval_s: float | None = None,
        enabled: bool | None = None,
        counters: OperationCounters | None = None,
    ) -> None:
        """`active`: publish only while it is set (a shard's serving instance); None: always.
        `counters`: what the service counts into (new ones if not given)."""
        self.bus, self.topic, self.role, self.name = connect(bus), topic, role, name
        self.active = active
        self.interval_s = interval_s if interval_s is not None else interval_from_env()
        self.enabled = enabled if enabled is not None else enabled_from_env()
        self.counters = counters if counters is not None else OperationCounters()
        self.published = 0
        self.dropped = 0
        self._in_flight: asyncio.Future[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def summary(self) -> schema.MetricSummary:
        """What was counted since the last summary, as the next one (counting starts afresh)."""
        start, seconds, total, namespaces = self.counters.take()
        return schema.MetricSummary(
            role="shard" if self.role == "shard" else "router",
            name=self.name,
            start=start,
            seconds=seconds,
            total=total,
            namespaces=namespaces,
            dropped={"summaries": self.dropped, "spans": tracing.dropped_spans()},
        )

    async def _run(self) -> None:
        producer = self.bus.producer(client_id=f"{self.name}-metrics")
        try:
            while True:
                try:
                    await producer.start()
                    break
                except (BusError, OSError) as e:
                    log.warning("%s: metrics not published yet (%s)", self.name, e)
                    await asyncio.sleep(self.interval_s)
            self.counters.take()  # from now on
            next_at = time.monotonic()
            while True:
                next_at += self.interval_s
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                summary = self.summary()
                if self.active is not None and not self.active.is_set():
                    continue  # a standby handles nothing: nothing to say
                await self._send(producer, summary)
        finally:
            await producer.stop()

    async def _send(self, producer: Any, summary: schema.MetricSummary) -> None:
        if self._in_flight is not None and not self._in_flight.done():
            self.dropped += 1  # Kafka has not taken the previous one yet: do not queue behind it
            return
        try:
            delivery: asyncio.Future[Any] = await aio.wait_for(
                producer.send(
                    self.topic,
                    Codec.encode(summary),
                    key=self.name.encode(),
                    timestamp_ms=int(summary.start * 1000),  # the aggregation's windows go by it
                ),
                self.interval_s,
            )
        except (BusError, TimeoutError, OSError) as e:
            self.dropped += 1
            log.debug("%s: metric summary dropped (%s)", self.name, e)
            return
        self._in_flight = delivery
        delivery.add_done_callback(self._delivered)

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.dropped += 1
        else:
            self.published += 1


Owner = TypeVar("Owner", bound="Measured")


class Measured(Protocol):
    metrics: OperationCounters


def measured(
    handle: Callable[[Owner, R], Awaitable[T]],
) -> Callable[[Owner, R], Awaitable[T]]:
    """A method handling one operation (given as its request record), also counted with its
    duration in its owner's `metrics`: the client-seen time of a router's operation."""

    @functools.wraps(handle)
    async def run(owner: Owner, record: R) -> T:
        started = time.perf_counter()
        try:
            return await handle(owner, record)
        finally:
            owner.metrics.observe_record(record, time.perf_counter() - started)

    return run
