"""One move-range is one trace across the config server, the donor and the recipient, each
protocol phase a span with its sizes; the range deletion it leaves is traced in the same trace,
batch by batch; a balancer round's span links to the migrations it issued (their own traces)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from libs.client import AsyncCluster
from libs.requests import Requester
from schemas import config as c
from tests.conftest import async_wait_until, wait_until
from tests.integration.test_migration import MAXK, client_run
from tests.integration.test_range_deleter import running_deleter
from tests.integration.traces import Spans, is_parent, recorded

pytestmark = pytest.mark.kafka

N, SPLIT = 300, 100  # [SPLIT, max) moves: 200 documents
MB = 1024 * 1024


@pytest.fixture
def spans():
    with recorded() as s:
        yield s


def traced_move(cl, cmd: c.MoveRange) -> tuple[int, str]:
    """Send MoveRange under a root span of the test's; (its trace id, the migration's id) once decided."""

    async def go():
        with trace.get_tracer("test").start_as_current_span("test move-range") as root:
            async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
                reply = await r.request(cl.settings.topics.config_commands, cmd, timeout=60)
        assert reply.ok and reply.result["moved"], reply
        mid = reply.result["id"]
        await async_wait_until(lambda: mid in cl.config.catalog.outcomes, 90, f"migration {mid} decided")
        assert cl.config.catalog.outcomes[mid] == "committed"
        return root.get_span_context().trace_id, mid

    return cl.call(go())


def test_a_move_range_is_one_trace_across_config_donor_and_recipient_and_its_deletion_too(data_cluster, spans: Spans):
    cl = data_cluster
    ns = "tm.c"
    cl.command(c.CreateDatabase(db="tm", primary="s0"))
    cl.command(c.ShardCollection(ns=ns, key={"k": 1}))
    cl.command(c.SplitChunk(ns=ns, at=[{"k": SPLIT}]))
    client_run(cl, lambda client: client["tm"]["c"].insert_many([{"_id": i, "k": i} for i in range(N)]))
    cl.command(c.SetSetting(key="orphanCleanupDelaySecs", value=0))
    spans.clear()

    tid, mid = traced_move(cl, c.MoveRange(ns=ns, min={"k": SPLIT}, max={"k": MAXK}, to="s1"))
    wait_until(lambda: spans.named("migration finish", tid), 60, "the donor to finish the migration")
    root = spans.one("test move-range", tid)

    # The config server decides the request; the donor's span continues the context it recorded.
    config = spans.one("config MoveRange", tid)
    assert root in spans.ancestors(config)
    donate = spans.one("migration donate", tid)
    assert is_parent(config, donate), "the donor continues the trace the config server recorded"
    assert donate.attributes["shardlog.migration.id"] == mid and donate.attributes["shardlog.shard"] == "s0"
    assert donate.attributes["shardlog.migration.recipient"] == "s1" and donate.attributes["db.namespace"] == "tm"

    # Each protocol phase is a child span of the donation, with its sizes.
    phases = {p: spans.one(f"migration {p}", tid) for p in ("clone", "catch-up", "critical section", "commit")}
    assert all(is_parent(donate, p) for p in phases.values())
    clone = phases["clone"]
    assert clone.attributes["shardlog.documents"] == N - SPLIT and clone.attributes["shardlog.bytes"] > 0
    batches = spans.named("migration clone batch", tid)
    assert batches and all(is_parent(clone, b) for b in batches)
    assert sum(b.attributes["shardlog.documents"] for b in batches) == N - SPLIT
    assert "shardlog.passes" in phases["catch-up"].attributes and "shardlog.documents" in phases["catch-up"].attributes
    assert phases["commit"].attributes["shardlog.migration.committed"] is True
    order = [phases[p].start_time for p in ("clone", "catch-up", "critical section", "commit")]
    assert order == sorted(order), "the phases run in protocol order"

    # The recipient's processing of each clone batch is in the trace, below the batch that sent it.
    received = [
        s for s in spans.named("shard-s1 TransferBatch", tid) if s.attributes.get("shardlog.migration.phase") == "clone"
    ]
    assert received and all(clone in spans.ancestors(r) for r in received)
    # (the retryable writes' records go as batches of their own, without documents)
    with_documents = [r for r in received if r.attributes["shardlog.documents"]]
    assert with_documents and all(any(b in spans.ancestors(r) for b in batches) for r in with_documents)
    assert sum(r.attributes["shardlog.documents"] for r in received) == N - SPLIT
    assert all(r.kind == SpanKind.CONSUMER for r in received)
    commit_clone = spans.one("shard-s1 CommitClone", tid)
    assert phases["critical section"] in spans.ancestors(commit_clone)
    # The commit reaches the config server in the same trace.
    commit = spans.one("config CommitMigration", tid)
    assert phases["commit"] in spans.ancestors(commit)

    # The donor's range-deletion task keeps the migration's trace: its batches are spans of it.
    with running_deleter(cl) as rd:
        # The shard drops the task when it deletes the last batch, before the deleter hears the reply:
        # wait for the deleter's task span to end too, else stopping it cancels the last batch's span.
        wait_until(
            lambda: (
                rd.status.batches
                and not cl.shards["s0"].documents.range_tasks
                and spans.named("range-deleter task", tid)
            ),
            60,
            "the orphans deleted and the deleter's task span ended",
        )
    tasks = spans.named("range-deleter task", tid)
    assert tasks, f"no range-deletion task span in the migration's trace: {spans.names(tid)}"
    task = tasks[0]
    assert is_parent(config, task) and task.attributes["shardlog.task.id"] == mid
    batch_spans = [b for t in tasks for b in spans.children(t, "range-deleter batch")]
    assert batch_spans and sum(b.attributes.get("shardlog.documents", 0) for b in batch_spans) == N - SPLIT
    deletes = spans.named("shard-s0 DeleteRangeBatch", tid)
    assert deletes and all(any(b in spans.ancestors(d) for b in batch_spans) for d in deletes)


def test_a_balancer_round_links_to_the_migrations_it_issued(settings, monkeypatch, spans: Spans):
    from services.balancer.server import Balancer
    from tests.conftest import InProcessCluster

    monkeypatch.setenv("SHARDLOG_STATS_INTERVAL_S", "0.5")  # fresh statistics for the round
    cl = InProcessCluster(settings, shards=("s0", "s1"))
    try:
        for key, value in (("maxChunkSizeBytes", MB), ("balancerRoundIntervalSecs", 0.5)):
            cl.command(c.SetSetting(key=key, value=value))
        cl.command(c.CreateDatabase(db="tb", primary="s0"))
        cl.command(c.ShardCollection(ns="tb.c", key={"k": 1}))
        cl.command(c.SplitChunk(ns="tb.c", at=[{"k": i * 1000} for i in range(1, 4)]))

        async def load():
            async with AsyncCluster(cl.settings.bootstrap, cl.settings.cluster, timeout=120) as client:
                await client["tb"]["c"].insert_many([{"_id": i, "k": i, "pad": "x" * 1000} for i in range(4000)])

        asyncio.run(load())
        balancer = Balancer(cl.settings)
        task = asyncio.run_coroutine_threadsafe(balancer.run(), cl.loop)
        try:
            wait_until(lambda: spans.named("balancer round"), 120, "a balancer round that issued actions")
        finally:
            task.cancel()
        rnd = spans.named("balancer round")[0]
        assert rnd.parent is None, "a round is a trace of its own"
        assert rnd.attributes["shardlog.migrations"] >= 1
        migrations = [
            s
            for s in spans.named("balancer migration")
            if s.context.span_id in {link.context.span_id for link in rnd.links}
        ]
        assert len(migrations) == rnd.attributes["shardlog.migrations"], "the round links to each migration it issued"
        for m in migrations:
            assert m.parent is None and m.context.trace_id != rnd.context.trace_id, "a migration is its own trace"
            assert [link.context.span_id for link in m.links] == [rnd.context.span_id], "and names its round"
            # The migration's trace holds the config server's decision and the donor's phases.
            config = spans.one("config MoveRange", m.context.trace_id)
            assert m in spans.ancestors(config)
            wait_until(
                lambda m=m: spans.named("migration donate", m.context.trace_id), 30, "the donor's span in the trace"
            )
            assert is_parent(config, spans.one("migration donate", m.context.trace_id))
    finally:
        cl.stop()
