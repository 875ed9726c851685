"""One client operation is one trace: the wire command (or the client library's call), the
router's routing span with the shards it reached, each shard's processing of its part and the
shard's Kafka transaction, with the produce spans below; a StaleConfig retry is a span."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import SpanKind

from libs import kafka
from libs.client import AsyncCluster
from libs.commands import REPLY_TO
from libs.requests import Requester
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import Codec
from schemas import config as c
from schemas import shard as s
from tests.conftest import async_wait_until, group_offset_and_log_end, wait_until
from tests.integration.test_data_path import _pause, _resume, client_run
from tests.integration.traces import Spans, is_parent, recorded

pytestmark = pytest.mark.kafka


@pytest.fixture
def spans():
    with recorded() as s:
        yield s


def test_a_pymongo_insert_is_one_trace_from_the_wire_to_the_shards_transaction(data_cluster, spans: Spans):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="tr", primary="s0"))
    cl.command(c.ShardCollection(ns="tr.c", key={"k": 1}))
    coll = cl.mongo_client()["tr"]["c"]
    coll.find_one({})  # the driver's handshake and a first command, before the one we look at
    spans.clear()

    coll.insert_one({"_id": 1, "k": 7})

    t = cl.settings.topics
    wait_until(lambda: spans.named("wire insert"), 30, "the wire command's span")
    wire = spans.one("wire insert")
    tid = wire.context.trace_id
    wait_until(lambda: spans.named("shard-s0 transaction", tid), 30, "the shard's transaction span")
    assert wire.parent is None and wire.kind == SpanKind.SERVER, "a wire command is a trace's root"
    assert wire.attributes["db.system"] == "shardlog" and wire.attributes["db.operation.name"] == "insert"
    assert wire.attributes["db.namespace"] == "tr" and wire.attributes["db.collection.name"] == "c"

    route = spans.one("route Insert", tid)
    assert is_parent(wire, route)
    assert route.attributes["shardlog.shards"] == ("s0",), "the routing span names the shards it reached"
    assert route.attributes["db.namespace"] == "tr" and route.attributes["db.collection.name"] == "c"

    send = spans.one(f"send {t.shard_requests('s0')}", tid)
    assert is_parent(route, send) and send.kind == SpanKind.PRODUCER
    assert send.attributes["messaging.system"] == "kafka" and send.attributes["messaging.operation.type"] == "send"

    process = spans.one("shard-s0 Insert", tid)
    assert is_parent(send, process) and process.kind == SpanKind.CONSUMER
    assert process.attributes["messaging.destination.name"] == t.shard_requests("s0")
    assert isinstance(process.attributes["messaging.kafka.offset"], int)

    txn = spans.one("shard-s0 transaction", tid)
    assert is_parent(process, txn)
    assert txn.attributes["shardlog.transaction.commands"] >= 1 and txn.attributes["shardlog.transaction.events"] >= 1
    # The document's event is written inside the transaction: its produce span is the transaction's child.
    events = [s for s in spans.children(txn) if s.name == f"send {t.shard_changelog('s0')}"]
    assert events and all(e.kind == SpanKind.PRODUCER for e in events)
    assert len(events) == 1, "one produce span for the command's events"
    assert "DocumentWritten" in events[0].attributes["shardlog.events"]
    assert txn.end_time <= process.end_time, "the process span lasts until its transaction committed"
    # No other shard took part.
    assert not [s for s in spans.trace_of(wire) if s.name.startswith(("shard-s1", "shard-s2"))]


def test_a_stale_router_shows_its_staleconfig_retry_as_a_span(data_cluster, spans: Spans):
    cl = data_cluster
    cl.command(c.ShardCollection(ns="tr.s", key={"_id": "hashed"}))
    client_run(cl, lambda client: client["tr"]["s"].insert_many([{"_id": i} for i in range(50)]))
    router = cl.router
    # The router's routing table frozen, then a split it does not see: the owner answers StaleConfig.
    cl.call(_pause(router.follower))
    chunk = cl.config.catalog.collections["tr.s"].chunks[1]
    cl.command_without_router(c.SplitChunk(ns="tr.s", at=[{"_id": (chunk.min["_id"] + chunk.max["_id"]) // 2}]))
    retries = router.routing.stale_retries
    spans.clear()

    async def go(client):
        find = asyncio.create_task(client["tr"]["s"].find({}).to_list())
        await async_wait_until(lambda: router.routing.stale_retries > retries, 30, "a StaleConfig from a shard")
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_resume(router.follower), cl.loop))
        return await find

    assert len(client_run(cl, go)) == 50
    wait_until(lambda: spans.named("shardlog.client Find"), 30, "the client's span")
    client = spans.one("shardlog.client Find")
    assert client.parent is None and client.kind == SpanKind.CLIENT
    tid = client.context.trace_id
    route = spans.one("route Find", tid)
    assert client in spans.ancestors(route), "the router's span belongs to the client's trace"
    retry = spans.named("router StaleConfig retry", tid)
    assert retry, f"no retry span in {spans.names(tid)}"
    assert all(is_parent(route, r) for r in retry)
    first = min(retry, key=lambda s: s.start_time)
    assert first.attributes["shardlog.retry.attempt"] == 1
    assert first.attributes["shardlog.stale.config_time"] > 0
    # The retry's own attempt: the shards asked again are children of the retry span.
    assert any(s.name.startswith("send ") for r in retry for s in spans.children(r))


def test_a_plain_read_is_answered_outside_the_transaction_a_causal_one_inside(data_cluster, spans: Spans):
    """docs/reference/command-processor.md: a Find without afterClusterTime heading a batch writes
    nothing and is answered without a transaction; its offset still commits (with the next
    transaction, or alone within a second).  A causally consistent read stays in the transaction."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="rd", primary="s0"))
    processor = cl.shards["s0"].processor

    async def go(client: AsyncCluster):
        await client.call(s.Insert(ns="rd.c", docs=[{"_id": 1, "v": "x"}]))
        spans.clear()
        plain = await client.call(s.Find(ns="rd.c", filter={"_id": 1}))
        session = client.start_session(causal_consistency=True)
        await client.call(s.Insert(ns="rd.c", docs=[{"_id": 2, "v": "y"}]), session=session)
        causal = await client.call(s.Find(ns="rd.c", filter={"_id": 2}), session=session)
        return plain, causal

    plain, causal = client_run(cl, go)
    assert [d["v"] for d in plain["docs"]] == ["x"] and [d["v"] for d in causal["docs"]] == ["y"]
    wait_until(lambda: len(spans.named("shard-s0 Find")) == 2, 30, "both reads' spans on the shard")
    finds = sorted(spans.named("shard-s0 Find"), key=lambda sp: sp.start_time)
    assert not spans.children(finds[0], "shard-s0 transaction"), "the plain read took no transaction"
    assert spans.children(finds[1], "shard-s0 transaction"), "the causal read was decided in the transaction"

    # A last plain read with nothing after it: its offset commits alone.
    client_run(cl, lambda client: client.call(s.Find(ns="rd.c", filter={"_id": 1})))

    def at_the_end() -> bool:
        at, end = group_offset_and_log_end(cl.settings, "shard-s0", processor.command_topic)
        return at == end

    wait_until(at_the_end, 30, "the answered reads' offsets to commit")


def test_a_plain_read_fetched_after_a_write_of_its_batch_is_answered_first_from_the_committed_state(
    data_cluster, spans: Spans
):
    """The write is not acknowledged before its batch commits, so a read of the same batch may be
    answered as if it came first: outside the transaction, from the committed state."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="rh", primary="s0"))
    client_run(cl, lambda client: client.call(s.Insert(ns="rh.c", docs=[{"_id": 1, "v": "old"}])))
    shard = cl.shards["s0"]
    processor, topic = shard.processor, cl.settings.topics.shard_requests("s0")
    inbox = cl.settings.topics.inbox("test-read-hoist")

    async def go():
        await kafka.ensure_topics(cl.settings.bootstrap, [TopicSpec(inbox, config=SHORT_LIVED)])
        routing = s.Routing(configTime=shard.follower.config_time)
        async with Requester(cl.settings.bootstrap, inbox, client_id="test-read-hoist") as r:
            processor.member.pause(processor.partition)  # both requests are in the log before it fetches again
            try:
                write = await r.send(
                    topic, s.Update(ns="rh.c", filter={"_id": 1}, update={"$set": {"v": "new"}}, routing=routing)
                )
                read = await r.send(topic, s.Find(ns="rh.c", filter={"_id": 1}, routing=routing))
            finally:
                processor.member.resume(processor.partition)
            return await asyncio.wait_for(write, 30), await asyncio.wait_for(read, 30)

    spans.clear()
    written, read = cl.call(go())
    assert written.ok and written.result["modified"] == 1, written
    assert read.ok and [d["v"] for d in read.result["docs"]] == ["old"], "answered before the write, not after"
    wait_until(lambda: spans.named("shard-s0 Find") and spans.named("shard-s0 Update"), 30, "the shard's spans")
    assert not spans.children(spans.one("shard-s0 Find"), "shard-s0 transaction")
    assert spans.children(spans.one("shard-s0 Update"), "shard-s0 transaction")
    now = client_run(cl, lambda client: client.call(s.Find(ns="rh.c", filter={"_id": 1})))
    assert [d["v"] for d in now["docs"]] == ["new"]


def test_a_reply_to_an_inbox_that_is_gone_is_dropped_without_holding_the_shard_back(data_cluster):
    """A read answered again after a restart may name an inbox deleted meanwhile (with its router):
    its reply is dropped, and the shard neither waits out the producer's metadata timeout nor
    gives up its transaction for it."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="rg", primary="s0"))
    client_run(cl, lambda client: client.call(s.Insert(ns="rg.c", docs=[{"_id": 1}])))
    shard = cl.shards["s0"]
    processor, topic = shard.processor, cl.settings.topics.shard_requests("s0")
    producer_before = cl.call(_current_producer(processor))
    gone = cl.settings.topics.inbox("never-created")

    async def ask_for_the_gone_inbox():
        p = kafka.producer(cl.settings.bootstrap, client_id="test-gone-inbox")
        await p.start()
        try:
            for req in (s.Find(ns="rg.c", filter={"_id": 1}), s.Insert(ns="rg.c", docs=[{"_id": 2}])):
                routed = req.model_copy(update={"routing": s.Routing(configTime=shard.follower.config_time)})
                await p.send_and_wait(topic, Codec.encode(routed), headers=[(REPLY_TO, gone.encode())])
        finally:
            await p.stop()

    asyncio.run(ask_for_the_gone_inbox())
    found = client_run(cl, lambda client: client.call(s.Find(ns="rg.c", filter={})))
    assert sorted(d["_id"] for d in found["docs"]) == [1, 2], "both were decided; their replies dropped"
    assert cl.call(_current_producer(processor)) is producer_before, "the shard never stood by"


async def _current_producer(processor):
    return processor.producer
