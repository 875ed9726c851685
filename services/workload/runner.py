"""The YCSB driver: loads and runs the core workloads through the client
library, with `concurrency` operations in flight, and measures them.

- :func:`load` inserts the records ``{"_id": "user…", "field0": …}`` in
  insert_many batches; :func:`run` executes the CoreWorkload operation stream,
  optionally paced to a target rate.
- Per operation kind: a log-linear latency histogram (bounded memory whatever
  the operation count), ops/s, p50/p95/p99/max, and errors counted by code
  (errors are measured, never raised).
- The same measurements go to OpenTelemetry (``shardlog.workload.operations``,
  ``shardlog.workload.latency``); the API is a no-op unless the caller
  installed a MeterProvider.

Latency is measured from when an operation starts, not from its scheduled
time, so a paced run that falls behind does not report the queueing delay
(YCSB's default, "coordinated omission" included).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from opentelemetry import metrics

from libs.client import AsyncCollection, ShardlogError
from services.workload.ycsb import WORKLOADS, CoreWorkload, Operation, Workload

__all__ = [
    "LatencyHistogram",
    "Progress",
    "KindReport",
    "Report",
    "Pacer",
    "RecordNotFound",
    "resolve_workload",
    "load",
    "run",
]

PROGRESS_INTERVAL = 0.5  # seconds between progress callbacks
LOAD_KIND = "insert_many"  # the load phase measures batches

_meter = metrics.get_meter("shardlog.workload")
_operations = _meter.create_counter(
    "shardlog.workload.operations", unit="{operation}", description="workload operations by kind and outcome"
)
_latency = _meter.create_histogram(
    "shardlog.workload.latency",
    unit="ms",
    description="workload operation latency",
    explicit_bucket_boundaries_advisory=[0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000],
)


def resolve_workload(name: str) -> Workload:
    """'ycsb-a', 'a' or 'workloada' -> the core workload A."""
    key = name.lower().removeprefix("ycsb-").removeprefix("workload")
    if key not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join('ycsb-' + k for k in WORKLOADS)})")
    return WORKLOADS[key]


# ---------------------------------------------------------------- measuring


class LatencyHistogram:
    """Microsecond counts in log-linear buckets, like HdrHistogram with two
    significant digits: exact below 128 µs, then 64 buckets per power of two
    (under 1.6 % relative error).  A few thousand counters at most, however
    many operations are recorded."""

    SUB_BITS = 6
    SUB_BUCKETS = 1 << SUB_BITS

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.count = 0
        self.total_us = 0
        self.min_us = 0
        self.max_us = 0

    @classmethod
    def _index(cls, us: int) -> int:
        if us < 2 * cls.SUB_BUCKETS:
            return us
        shift = us.bit_length() - cls.SUB_BITS - 1
        return shift * cls.SUB_BUCKETS + (us >> shift)

    @classmethod
    def _highest(cls, index: int) -> int:
        """The largest value that lands in bucket `index`."""
        shift = max(0, index // cls.SUB_BUCKETS - 1)
        return ((index - shift * cls.SUB_BUCKETS + 1) << shift) - 1

    def record(self, seconds: float) -> None:
        us = max(0, round(seconds * 1e6))
        i = self._index(us)
        if i >= len(self.counts):
            self.counts.extend([0] * (i + 1 - len(self.counts)))
        self.counts[i] += 1
        self.min_us = us if self.count == 0 else min(self.min_us, us)
        self.max_us = max(self.max_us, us)
        self.count += 1
        self.total_us += us

    def percentile_ms(self, p: float) -> float:
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return min(self._highest(i), self.max_us) / 1000
        return self.max_us / 1000  # pragma: no cover - the counts add up to count

    def summary_ms(self) -> dict[str, float]:
        mean = self.total_us / self.count / 1000 if self.count else 0.0
        return {
            "min": self.min_us / 1000,
            "mean": round(mean, 3),
            "p50": self.percentile_ms(50),
            "p95": self.percentile_ms(95),
            "p99": self.percentile_ms(99),
            "max": self.max_us / 1000,
        }


@dataclass(frozen=True)
class Progress:
    """A snapshot for a progress display: `done` of `total` operations (records when loading)."""

    phase: str
    done: int
    total: int
    elapsed_s: float
    ops_per_s: float  # over the last interval; the whole run's in the final snapshot
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    final: bool = False


@dataclass
class KindReport:
    count: int  # successful operations (their latencies are the histogram)
    errors: int
    ops_per_s: float
    latency_ms: dict[str, float]


@dataclass
class Report:
    phase: str  # "load" | "run"
    workload: str
    ns: str
    operations: int  # run: operations; load: records
    elapsed_s: float
    throughput_ops_s: float  # operations (load: records) per second, errors included
    concurrency: int
    target_rate: float | None
    inserted: int  # documents the cluster acknowledged inserting
    kinds: dict[str, KindReport]  # load: the insert_many batches
    errors: dict[str, dict[str, int]]  # kind -> error code -> count

    @property
    def total_errors(self) -> int:
        return sum(sum(by_code.values()) for by_code in self.errors.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "total_errors": self.total_errors}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class _Measurements:
    def __init__(self, phase: str, total: int) -> None:
        self.phase, self.total = phase, total
        self.kinds: dict[str, LatencyHistogram] = {}
        self.overall = LatencyHistogram()
        self.errors: dict[str, Counter[str]] = {}
        self.done = 0
        self.inserted = 0
        self.started = time.perf_counter()
        self.elapsed = 0.0

    def succeeded(self, kind: str, seconds: float, done: int = 1) -> None:
        self.kinds.setdefault(kind, LatencyHistogram()).record(seconds)
        self.overall.record(seconds)
        self.done += done
        _operations.add(1, {"kind": kind, "outcome": "ok"})
        _latency.record(seconds * 1000, {"kind": kind})

    def failed(self, kind: str, error: BaseException, done: int = 1) -> None:
        code = error.code if isinstance(error, ShardlogError) else type(error).__name__
        self.kinds.setdefault(kind, LatencyHistogram())
        self.errors.setdefault(kind, Counter())[code] += 1
        self.done += done
        _operations.add(1, {"kind": kind, "outcome": "error", "error.type": code})

    def snapshot(self, ops_per_s: float, final: bool = False) -> Progress:
        elapsed = self.elapsed if final else time.perf_counter() - self.started
        return Progress(
            self.phase,
            self.done,
            self.total,
            elapsed,
            ops_per_s,
            self.overall.percentile_ms(50),
            self.overall.percentile_ms(95),
            self.overall.percentile_ms(99),
            sum(sum(c.values()) for c in self.errors.values()),
            final,
        )

    def report(self, workload: str, ns: str, concurrency: int, target_rate: float | None) -> Report:
        elapsed = self.elapsed or 1e-9
        kinds = {
            kind: KindReport(
                h.count, sum(self.errors.get(kind, Counter()).values()), round(h.count / elapsed, 1), h.summary_ms()
            )
            for kind, h in sorted(self.kinds.items())
        }
        errors = {kind: dict(c) for kind, c in sorted(self.errors.items())}
        return Report(
            self.phase,
            workload,
            ns,
            self.done,
            round(self.elapsed, 3),
            round(self.done / elapsed, 1),
            concurrency,
            target_rate,
            self.inserted,
            kinds,
            errors,
        )


ProgressCallback = Callable[[Progress], None]


async def _drive(
    m: _Measurements, workers: list[Awaitable[None]], progress: ProgressCallback | None, interval: float
) -> None:
    async def report_progress() -> None:
        last_done, last_t = 0, m.started
        while True:
            await asyncio.sleep(interval)
            now, done = time.perf_counter(), m.done
            progress(m.snapshot((done - last_done) / (now - last_t)))
            last_done, last_t = done, now

    reporter = asyncio.create_task(report_progress()) if progress else None
    try:
        await asyncio.gather(*workers)
    finally:
        m.elapsed = time.perf_counter() - m.started
        if reporter:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
    if progress:
        progress(m.snapshot(m.done / (m.elapsed or 1e-9), final=True))


def _check_concurrency(concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")


# -------------------------------------------------------------------- load


async def load(
    collection: AsyncCollection,
    workload: Workload | str,
    record_count: int,
    *,
    concurrency: int,
    batch_size: int = 100,
    progress: ProgressCallback | None = None,
    seed: int | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
) -> Report:
    """Insert YCSB records 0 .. record_count-1, `concurrency` insert_many batches in flight.

    Batches are unordered, so a reload inserts what is missing and counts the
    rest as DuplicateKey errors.
    """
    _check_concurrency(concurrency)
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    w = resolve_workload(workload) if isinstance(workload, str) else workload
    core = CoreWorkload(w, record_count, seed)
    m = _Measurements("load", record_count)

    async def worker() -> None:
        while core.load_remaining > 0:
            docs = [{"_id": op.key, **op.values} for op in itertools.islice(core.load_operations(), batch_size)]
            started = time.perf_counter()
            try:
                await collection.insert_many(docs, ordered=False)
            except ShardlogError as e:
                # A BulkWriteError is named by its first refusal (e.g. DuplicateKey), more useful than its class.
                first = (e.details.get("writeErrors") or [{}])[0].get("code")
                m.inserted += e.details.get("inserted", 0)
                m.failed(LOAD_KIND, ShardlogError(first, e.message) if first else e, len(docs))
            except Exception as e:
                m.failed(LOAD_KIND, e, len(docs))
            else:
                m.inserted += len(docs)
                m.succeeded(LOAD_KIND, time.perf_counter() - started, len(docs))

    await _drive(m, [worker() for _ in range(concurrency)], progress, progress_interval)
    return m.report("ycsb", collection.ns, concurrency, None)


# --------------------------------------------------------------------- run


class RecordNotFound(ShardlogError):
    """A read or update found no record: the run's --records is more than what was loaded."""

    def __init__(self, key: str):
        super().__init__("NotFound", f"no record {key!r}")


class Pacer:
    """Start times `1/rate` apart, handed out in order: a worker sleeps until
    its slot (no busy loop).  A worker behind schedule starts at once, but at
    most `burst` slots are made up after a stall, not the whole backlog."""

    def __init__(self, rate: float, burst: int = 1) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.interval, self.burst = 1.0 / rate, burst
        self._next: float | None = None

    async def wait(self) -> None:
        now = time.monotonic()
        earliest = now - self.burst * self.interval
        slot = now if self._next is None else max(self._next, earliest)
        self._next = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


def _projection(fields: tuple[str, ...] | None) -> dict | None:
    return {f: 1 for f in fields} if fields is not None else None


async def _read(coll: AsyncCollection, op: Operation) -> None:
    if await coll.find_one({"_id": op.key}, projection=_projection(op.fields)) is None:
        raise RecordNotFound(op.key)


async def _update(coll: AsyncCollection, op: Operation) -> None:
    if (await coll.update_one({"_id": op.key}, {"$set": op.values}))["matched"] == 0:
        raise RecordNotFound(op.key)


async def _execute(coll: AsyncCollection, op: Operation) -> None:
    if op.kind == "read":
        await _read(coll, op)
    elif op.kind == "update":
        await _update(coll, op)
    elif op.kind == "insert":
        await coll.insert_one({"_id": op.key, **op.values})
    elif op.kind == "scan":
        await coll.find(
            {"_id": {"$gte": op.key}},
            sort={"_id": 1},
            limit=op.scan_length,
            projection=_projection(op.fields),
            batch_size=max(1, op.scan_length or 1),
        ).to_list()
    else:  # readmodifywrite: measured as one operation, like YCSB's READ-MODIFY-WRITE
        await _read(coll, op)
        await _update(coll, op)


async def run(
    collection: AsyncCollection,
    workload: Workload | str,
    operation_count: int,
    *,
    concurrency: int,
    rate: float | None = None,
    record_count: int,
    progress: ProgressCallback | None = None,
    request_distribution: str | None = None,
    seed: int | None = None,
    progress_interval: float = PROGRESS_INTERVAL,
) -> Report:
    """Execute `operation_count` operations of the workload over `record_count`
    loaded records (or the collection's documents, when more: earlier runs' inserts): `concurrency` workers share one operation stream, paced
    to `rate` ops/s when given (else as fast as they go)."""
    _check_concurrency(concurrency)
    if operation_count < 1:
        raise ValueError("operation_count must be >= 1")
    w = resolve_workload(workload) if isinstance(workload, str) else workload
    # YCSB inserts keys recordcount, recordcount+1, ...: after a run that inserted (ycsb-d, then
    # ycsb-e), the records there are is the recordcount that continues the key sequence.
    record_count = max(record_count, await collection.count_documents({}))
    core = CoreWorkload(
        w, record_count, seed, operation_count=operation_count, request_distribution=request_distribution
    )
    pacer = Pacer(rate, burst=concurrency) if rate is not None else None
    m = _Measurements("run", operation_count)
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < operation_count:
            issued += 1
            if pacer:
                await pacer.wait()
            # Drawn when it starts, so 'latest' sees the inserts acknowledged so far.
            op = core.next_operation()
            started = time.perf_counter()
            try:
                await _execute(collection, op)
            except Exception as e:
                m.failed(op.kind, e)
            else:
                m.succeeded(op.kind, time.perf_counter() - started)
                if op.kind == "insert":
                    m.inserted += 1
            finally:
                if op.kind == "insert":
                    core.acknowledge_insert(op.keynum)  # done or failed, as YCSB does

    await _drive(m, [worker() for _ in range(concurrency)], progress, progress_interval)
    return m.report(f"ycsb-{w.name}", collection.ns, concurrency, rate)
