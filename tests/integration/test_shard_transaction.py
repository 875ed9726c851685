"""A shard's command processor around its transaction (docs/reference/command-processor.md): the
replies leave with their events inside the transaction (one phase) and stay invisible until it
commits; a point read of a document no uncommitted event touches is answered while the
transaction is in flight, from the committed state, and a read of a touched one waits for it.

Each test holds the shard's transaction open at its commit (an in-process cluster: the
processor's producer's `commit` waits for the test), so what is visible before the
commit is observed, not raced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from libs import kafka
from libs.commands import CommandProcessor
from libs.requests import Requester
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import config as c
from schemas import shard as s
from tests.integration.test_data_path import client_run

pytestmark = pytest.mark.kafka


@contextlib.asynccontextmanager
async def commit_held(processor: CommandProcessor) -> AsyncIterator[tuple[asyncio.Event, asyncio.Event]]:
    """(reached, release): the processor's next commits wait for `release`; `reached` is set
    when one is waiting (its transaction's events and replies are sent)."""
    producer = processor.producer
    commit = producer.commit
    reached, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        reached.set()
        await release.wait()
        await commit()

    producer.commit = held  # type: ignore[method-assign]
    try:
        yield reached, release
    finally:
        release.set()
        producer.commit = commit  # type: ignore[method-assign]


async def _inbox(cl, name: str) -> str:
    inbox = cl.settings.topics.inbox(name)
    await kafka.ensure_topics(cl.settings.bootstrap, [TopicSpec(inbox, config=SHORT_LIVED)])
    return inbox


def test_a_point_read_is_answered_while_a_transaction_is_in_flight_from_committed_data_only(data_cluster):
    cl = data_cluster
    cl.command(c.CreateDatabase(db="pr", primary="s0"))
    docs = [{"_id": 1, "v": "old"}, {"_id": 2, "v": "old"}]
    client_run(cl, lambda client: client.call(s.Insert(ns="pr.c", docs=docs)))
    shard = cl.shards["s0"]
    processor, topic = shard.processor, cl.settings.topics.shard_requests("s0")

    async def go():
        routing = s.Routing(configTime=shard.follower.config_time)
        writer_inbox, reader_inbox = await _inbox(cl, "test-pr-writer"), await _inbox(cl, "test-pr-reader")
        async with (
            Requester(cl.settings.bootstrap, writer_inbox, client_id="test-pr-writer") as writer,
            Requester(cl.settings.bootstrap, reader_inbox, client_id="test-pr-reader") as reader,
            commit_held(processor) as (reached, release),
        ):
            update = s.Update(ns="pr.c", filter={"_id": 1}, update={"$set": {"v": "new"}}, routing=routing)
            written = await writer.send(topic, update)
            await asyncio.wait_for(reached.wait(), 30)  # the update's transaction is in flight
            touched = await reader.send(topic, s.Find(ns="pr.c", filter={"_id": 1}, routing=routing))
            counted = await reader.send(topic, s.Count(ns="pr.c", filter={}, routing=routing))
            untouched = await reader.send(topic, s.Find(ns="pr.c", filter={"_id": 2}, routing=routing))
            during = await asyncio.wait_for(untouched, 30)
            # The reader's replies arrive in the order they were sent: the two before it would
            # have been answered before it.
            waited = {"touched": touched.done(), "count": counted.done(), "write": written.done()}
            release.set()
            return during, waited, await asyncio.wait_for(written, 30), await asyncio.wait_for(touched, 30)

    during, waited, written, after = cl.call(go())
    assert during.ok and during.result["docs"] == [{"_id": 2, "v": "old"}], "answered during the transaction"
    assert waited == {"touched": False, "count": False, "write": False}, (
        "a read of a document the transaction writes, and a read that is not a point read, wait for its commit"
    )
    assert written.ok and written.result["modified"] == 1
    assert after.ok and after.result["docs"] == [{"_id": 1, "v": "new"}], "answered after the commit, with it"


def test_a_shard_reply_leaves_with_its_events_and_is_invisible_until_the_commit(data_cluster):
    """One phase: the reply is produced in the transaction before the commit (a read_uncommitted
    reader sees it; the last stable offset, all a read_committed reader sees, stays below it), and
    names the changelog position before its batch, not the one after its events (two phases)."""
    cl = data_cluster
    cl.command(c.CreateDatabase(db="op", primary="s0"))
    client_run(cl, lambda client: client.call(s.Insert(ns="op.c", docs=[{"_id": 1, "v": "old"}])))
    shard = cl.shards["s0"]
    processor, topic = shard.processor, cl.settings.topics.shard_requests("s0")
    changelog = TopicPartition(cl.settings.topics.shard_changelog("s0"), 0)

    async def go():
        routing = s.Routing(configTime=shard.follower.config_time)
        inbox = await _inbox(cl, "test-one-phase")
        reply_tp = TopicPartition(inbox, 0)
        uncommitted = AIOKafkaConsumer(bootstrap_servers=cl.settings.bootstrap, isolation_level="read_uncommitted")
        committed = AIOKafkaConsumer(bootstrap_servers=cl.settings.bootstrap, isolation_level="read_committed")
        await uncommitted.start()
        await committed.start()
        try:
            async with (
                Requester(cl.settings.bootstrap, inbox, client_id="test-one-phase") as r,
                commit_held(processor) as (reached, release),
            ):
                before = processor.projection.position
                update = s.Update(ns="op.c", filter={"_id": 1}, update={"$set": {"v": "new"}}, routing=routing)
                reply = await r.send(topic, update)
                await asyncio.wait_for(reached.wait(), 30)
                # Every send of the transaction is acked before its commit: the reply is in the log.
                uncommitted.assign([reply_tp])
                await uncommitted.seek_to_beginning(reply_tp)
                seen = await uncommitted.getmany(reply_tp, timeout_ms=10_000)
                in_log = [m.offset for m in seen.get(reply_tp, [])]
                stable = (await committed.end_offsets([reply_tp]))[reply_tp]
                uncommitted.assign([changelog])
                uncommitted.seek(changelog, before)
                written = await uncommitted.getmany(changelog, timeout_ms=10_000)
                first_event = min(m.offset for m in written.get(changelog, []))
                events_stable = (await committed.end_offsets([changelog]))[changelog]
                early = reply.done()
                release.set()
                answer = await asyncio.wait_for(reply, 30)
            events_after = (await committed.end_offsets([changelog]))[changelog]
            return before, in_log, stable, (first_event, events_stable), early, answer, events_after
        finally:
            await uncommitted.stop()
            await committed.stop()

    before, in_log, stable, (first_event, events_stable), early, answer, events_after = cl.call(go())
    assert in_log, "the reply was produced inside the transaction, before its commit"
    assert stable <= in_log[0], "a read_committed reader cannot reach the reply before the commit"
    assert events_stable <= first_event, "nor the reply's events"
    assert not early, "the requester (read_committed) had no reply before the commit"
    assert answer.ok and answer.result["modified"] == 1
    assert events_after > before, "the update's events committed"
    assert answer.configTime == before, (
        "a one-phase reply names the changelog position before its batch (two phases name the one after its events)"
    )
