"""The bus contract (libs/bus/__init__.py, points 1-5), one body for both buses: run on the
memory bus by tests/unit/test_bus_memory.py and on a real broker by
tests/integration/test_bus_kafka.py, so the two cannot drift apart.

Each case takes a started bus and a fresh topic prefix, and creates the topics it uses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from libs.bus import Bus, BusError, Fenced, Message, TopicSpec, UnknownTopic, catch_up

WAIT_S = 30.0  # a real broker's group rebalance takes seconds; the memory bus answers at once


class Recorder:
    """A group listener that records what it was told."""

    def __init__(self) -> None:
        self.assigned: list[set[int]] = []
        self.revoked: list[set[int]] = []

    async def on_revoked(self, partitions: Any) -> None:
        self.revoked.append(set(partitions))

    async def on_assigned(self, partitions: Any) -> None:
        self.assigned.append(set(partitions))


async def read(bus: Bus, topic: str, want: int, *, start: int = 0, partition: int = 0) -> list[Message]:
    """Read from `start` until `want` records have come (bounded), then briefly for any more."""
    r = bus.reader(topic, partition, client_id="contract")
    await r.start()
    try:
        r.seek(start)
        out: list[Message] = []
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while len(out) < want and asyncio.get_running_loop().time() < deadline:
            out += await r.fetch(timeout_s=0.2)
        out += await r.fetch(timeout_s=0.5)  # anything beyond is a failure the caller sees
        return out
    finally:
        await r.stop()


async def log_end(bus: Bus, topic: str, partition: int = 0) -> int:
    r = bus.reader(topic, partition, client_id="contract")
    await r.start()
    try:
        return await r.log_end()
    finally:
        await r.stop()


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"not within {WAIT_S}s: {what}"


async def order_and_offsets(bus: Bus, prefix: str) -> None:
    """1. Per-partition order; each record one offset above the last; keys, values, headers kept."""
    topic = f"{prefix}.order"
    await bus.create_topics([TopicSpec(topic)])
    p = bus.producer(client_id="contract")
    await p.start()
    try:
        acks = [
            await p.send(topic, f"v{i}".encode(), key=f"k{i}".encode(), headers=[("h", b"%d" % i)]) for i in range(3)
        ]
        assert [await a for a in acks] == [0, 1, 2]
    finally:
        await p.stop()
    got = await read(bus, topic, 3)
    assert [(m.offset, m.key, m.value, tuple(m.headers)) for m in got] == [
        (i, f"k{i}".encode(), f"v{i}".encode(), (("h", b"%d" % i),)) for i in range(3)
    ]
    assert await log_end(bus, topic) == 3
    r = bus.reader(topic, client_id="contract")
    await r.start()
    try:
        assert await r.log_start() == 0
        r.seek(1)
        seen: list[Message] = []

        async def on_batch(records: list[Message]) -> None:
            seen.extend(records)

        assert await catch_up(r, on_batch) >= 3 and [m.offset for m in seen] == [1, 2]
    finally:
        await r.stop()


async def commit_marker_takes_an_offset(bus: Bus, prefix: str) -> None:
    """1. A committed transaction's marker takes the offset after its records."""
    topic = f"{prefix}.marker"
    await bus.create_topics([TopicSpec(topic)])
    t = bus.transactional_producer(f"{prefix}.marker-txn", client_id="contract")
    p = bus.producer(client_id="contract")
    await t.start()
    await p.start()
    try:
        await t.begin()
        acks = [await t.send(topic, b"a"), await t.send(topic, b"b")]
        await t.commit()
        assert [await a for a in acks] == [0, 1]
        assert await log_end(bus, topic) == 3  # the marker is at 2
        assert await (await p.send(topic, b"c")) == 3
    finally:
        await t.stop()
        await p.stop()
    assert [(m.offset, m.value) for m in await read(bus, topic, 3)] == [(0, b"a"), (1, b"b"), (3, b"c")]


async def open_transaction_holds_readers_back(bus: Bus, prefix: str) -> None:
    """2. Nothing of an open transaction is visible, nor anything after its first record."""
    topic = f"{prefix}.open"
    await bus.create_topics([TopicSpec(topic)])
    t = bus.transactional_producer(f"{prefix}.open-txn", client_id="contract")
    p = bus.producer(client_id="contract")
    await t.start()
    await p.start()
    try:
        await t.begin()
        await (await t.send(topic, b"in-txn"))
        await (await p.send(topic, b"after"))  # committed at once, but above the open transaction
        assert await read(bus, topic, 0) == []
        assert await log_end(bus, topic) == 0
        await t.commit()
    finally:
        await t.stop()
        await p.stop()
    assert [m.value for m in await read(bus, topic, 2)] == [b"in-txn", b"after"]


async def aborted_records_are_never_read(bus: Bus, prefix: str) -> None:
    """2. An aborted transaction's records stay invisible; they and its marker keep their offsets."""
    topic = f"{prefix}.abort"
    await bus.create_topics([TopicSpec(topic)])
    t = bus.transactional_producer(f"{prefix}.abort-txn", client_id="contract")
    await t.start()
    try:
        await t.begin()
        await t.send(topic, b"x")
        await t.abort()
        await t.begin()
        ack = await t.send(topic, b"y")
        await t.commit()
        assert await ack == 2
    finally:
        await t.stop()
    assert [(m.offset, m.value) for m in await read(bus, topic, 1)] == [(2, b"y")]


async def a_new_producer_fences_the_old(bus: Bus, prefix: str) -> None:
    """3. Starting a producer with the same id aborts the old one's transaction; it cannot commit."""
    topic = f"{prefix}.fence"
    await bus.create_topics([TopicSpec(topic)])
    tid = f"{prefix}.fence-txn"
    zombie = bus.transactional_producer(tid, client_id="zombie")
    await zombie.start()
    owner = bus.transactional_producer(tid, client_id="owner")
    try:
        await zombie.begin()
        await (await zombie.send(topic, b"zombie"))
        await owner.start()  # fences the zombie: its open transaction is aborted
        with pytest.raises(Fenced):
            await zombie.commit()
        await owner.begin()
        await owner.send(topic, b"owner")
        await owner.commit()
    finally:
        for producer in (zombie, owner):
            try:
                await producer.stop()
            except BusError:
                pass  # a fenced producer may refuse to close cleanly
    assert [m.value for m in await read(bus, topic, 1)] == [b"owner"]


async def offsets_commit_with_their_transaction(bus: Bus, prefix: str) -> None:
    """4. Group offsets sent in a transaction count only when it commits."""
    topic, group = f"{prefix}.offsets", f"{prefix}.offsets-group"
    await bus.create_topics([TopicSpec(topic)])
    t = bus.transactional_producer(f"{prefix}.offsets-txn", client_id="contract")
    member = bus.member(group, topic, client_id="contract", listener=Recorder())
    await t.start()
    await member.start()
    try:
        await t.begin()
        await t.send_offsets(group, topic, 0, 5)
        await t.abort()
        assert await member.committed(0) is None
        await t.begin()
        await t.send_offsets(group, topic, 0, 7)
        await t.commit()

        async def committed() -> bool:  # Kafka writes the offsets' marker just after the commit returns
            return await member.committed(0) == 7

        await until("the committed transaction's offset in the group", committed)
    finally:
        await t.stop()
        await member.stop()


async def a_group_hands_a_partition_over(bus: Bus, prefix: str) -> None:
    """5. A member that leaves is told its partition is revoked, and the next member gets it,
    reading from the group's committed offset."""
    topic, group = f"{prefix}.group", f"{prefix}.group-group"
    await bus.create_topics([TopicSpec(topic)])
    p = bus.producer(client_id="contract")
    await p.start()
    for v in (b"first", b"second"):
        await (await p.send(topic, v))
    await p.stop()
    first, second = Recorder(), Recorder()
    a = bus.member(group, topic, client_id="a", listener=first, session_timeout_ms=6000)
    await a.start()
    got: dict[int, list[Message]] = {}

    async def a_reads() -> bool:
        got.update(await a.poll(timeout_s=0.2))
        return bool(got)

    await until("the first member assigned and reading", a_reads)
    assert a.assignment() == {0} and first.assigned[-1] == {0}
    assert [m.value for m in got[0]] == [b"first", b"second"]
    await a.commit({0: 1})  # the second record is not done: the next owner starts there
    b = bus.member(group, topic, client_id="b", listener=second, session_timeout_ms=6000)
    await b.start()
    try:
        # b joined: a takes part in the rebalance at its polls; a keeps or yields the single
        # partition, and b gets nothing while a holds it.
        for _ in range(5):
            await a.poll(timeout_s=0.1)
            await b.poll(timeout_s=0.1)
            assert not (a.assignment() & b.assignment()), "one partition, two owners"
        await a.stop()
        assert {0} in first.revoked, "the member that left was told"
        taken: dict[int, list[Message]] = {}

        async def b_reads() -> bool:
            taken.update(await b.poll(timeout_s=0.2))
            return bool(taken)

        await until("the second member to take the partition over", b_reads)
        assert b.assignment() == {0}
        assert [m.value for m in taken[0]] == [b"second"]
    finally:
        await b.stop()


async def a_tail_reads_every_partition_from_its_start(bus: Bus, prefix: str) -> None:
    """An inbox: what was there before the tail started is not read; what comes after is, from
    every partition."""
    topic = f"{prefix}.inbox"
    await bus.create_topics([TopicSpec(topic, partitions=2)])
    p = bus.producer(client_id="contract")
    await p.start()
    tail = bus.tail(topic, client_id="contract")
    try:
        assert await p.partitions_for(topic) == {0, 1}
        await (await p.send(topic, b"before", partition=0))
        await tail.start()
        await (await p.send(topic, b"p0", partition=0))
        await (await p.send(topic, b"p1", partition=1))
        got: list[Message] = []

        async def both() -> bool:
            got.extend(await tail.fetch(timeout_s=0.2))
            return len(got) >= 2

        await until("the tail to read both partitions", both)
        assert sorted((m.partition, m.value) for m in got) == [(0, b"p0"), (1, b"p1")]
    finally:
        await p.stop()
        await tail.stop()


async def topics_and_partitions(bus: Bus, prefix: str) -> None:
    topic = f"{prefix}.parts"
    await bus.create_topics([TopicSpec(topic, partitions=2)])
    await bus.create_topics([TopicSpec(topic, partitions=2)])  # creating it again is harmless
    assert await bus.partitions_for(topic) == {0, 1}
    with pytest.raises(UnknownTopic):
        await bus.partitions_for(f"{prefix}.never-created")


CASES = [
    order_and_offsets,
    commit_marker_takes_an_offset,
    open_transaction_holds_readers_back,
    aborted_records_are_never_read,
    a_new_producer_fences_the_old,
    offsets_commit_with_their_transaction,
    a_group_hands_a_partition_over,
    a_tail_reads_every_partition_from_its_start,
    topics_and_partitions,
]
