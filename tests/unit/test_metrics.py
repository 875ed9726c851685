"""Per-second metric summaries: the mergeable latency histogram, the counters, the
fire-and-forget publisher, and `shardlog top`'s rendering of whatever the snapshot holds."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from cli.top import render
from libs.metrics import Histogram, MetricsPublisher, OperationCounters, bucket, operation_name, upper_ms
from schemas import metrics as schema
from schemas import shard as s

latencies = st.floats(min_value=0.0, max_value=100_000.0, allow_nan=False)
seconds = st.lists(st.lists(latencies, max_size=30), min_size=1, max_size=60)  # per-second samples of a minute
quantiles = st.sampled_from([0.5, 0.9, 0.99, 1.0])


def nearest_rank(samples: list[float], q: float) -> float:
    return sorted(samples)[max(1, math.ceil(q * len(samples))) - 1]


@given(seconds, quantiles)
def test_merged_per_second_histograms_give_the_percentiles_of_one_histogram_of_all_samples(per_second, q):
    merged = Histogram()
    for samples in per_second:
        h = Histogram()
        for ms in samples:
            h.record(ms)
        # Through the record, as the dashboard reads it from Kafka.
        wire = schema.OperationFigures(latency=h.counts).model_dump_json()
        merged.merge(schema.OperationFigures.model_validate_json(wire).latency)
    everything = [ms for samples in per_second for ms in samples]
    whole = Histogram()
    for ms in everything:
        whole.record(ms)
    assert merged.counts == whole.counts
    assert merged.percentile(q) == whole.percentile(q)
    if everything:
        true = nearest_rank(everything, q)
        # Within a bucket: the answer is the upper bound of the true percentile's bucket.
        assert merged.percentile(q) == upper_ms(bucket(true))
        assert true <= merged.percentile(q) * (1 + 1e-9)
    else:
        assert merged.percentile(q) == 0.0


@given(st.lists(latencies, min_size=1, max_size=200))
def test_p50_is_at_most_p99(samples):
    h = Histogram()
    for ms in samples:
        h.record(ms)
    assert h.percentile(0.5) <= h.percentile(0.99)


def test_operations_are_named_as_mongodb_names_them_and_counted_per_namespace():
    assert operation_name(s.FindAndModify(ns="a.b", query={})) == "findAndModify"
    c = OperationCounters()
    c.observe_record(s.Insert(ns="db.c", docs=[{"_id": 1}]), 0.002)
    c.observe_record(s.Find(ns="db.c", filter={}), 0.004)
    c.observe("forgetSessions", None, 0.001)
    _, _, total, namespaces = c.take()
    assert total.ops == {"insert": 1, "find": 1, "forgetSessions": 1}
    assert set(namespaces) == {"db.c"} and namespaces["db.c"].ops == {"insert": 1, "find": 1}
    _, _, after, _ = c.take()
    assert after.ops == {}  # counting starts afresh


class SlowProducer:
    """A producer whose broker never acknowledges: every send is accepted, none delivered."""

    def __init__(self):
        self.sent = 0

    async def send(self, *args, **kw):
        self.sent += 1
        return asyncio.get_running_loop().create_future()


class StuckProducer:
    """A producer whose buffer is full: send itself never returns."""

    async def send(self, *args, **kw):
        await asyncio.Event().wait()


def test_summaries_are_dropped_and_counted_when_kafka_does_not_keep_up():
    async def go():
        p = MetricsPublisher("unused:9092", "t.metrics", "shard", "s0", interval_s=0.01, enabled=True)
        slow = SlowProducer()
        await p._send(slow, p.summary())
        await p._send(slow, p.summary())  # the first is still unacknowledged: not queued behind it
        assert (slow.sent, p.dropped) == (1, 1)
        stuck = MetricsPublisher("unused:9092", "t.metrics", "router", "router-x", interval_s=0.01, enabled=True)
        await stuck._send(StuckProducer(), stuck.summary())
        assert stuck.dropped == 1
        stuck.counters.observe("insert", "db.c", 0.001)  # counting goes on regardless
        assert stuck.summary().dropped["summaries"] == 1 and stuck.summary().total.ops == {}

    asyncio.run(go())


def text(renderable) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_top_renders_what_the_snapshot_has_and_tolerates_what_it_lacks():
    assert "per shard" in text(render({}, "http://x"))  # no figures at all: empty tables, no crash
    row = {"opsPerSec": 12.5, "p50Ms": 1.25, "p99Ms": 9.5, "ops": {"insert": 7, "find": 3, "getMore": 2}}
    out = text(
        render(
            {
                "figures": {"windowS": 60, "at": 0, "shards": {"s0": row}, "collections": {"db.c": row}},
                "shards": [{"id": "s0"}, {"id": "s1"}],  # s1 idle: listed all the same
                "migrations": [{"ns": "db.c", "phase": "clone"}],
                "rangeDeletions": [],
                "balancer": {"mode": "full", "enabled": True},
            },
            "http://x",
        )
    )
    assert "12.5" in out and "1.25" in out and "9.50" in out
    assert "s1" in out and "db.c" in out
    assert "migrations in flight: 1" in out and "phase=clone" in out
    assert "pending range deletions: 0" in out and "mode=full" in out
