"""The bus on a real broker: aiokafka clients made by `libs.kafka` (acks=all, idempotence,
read_committed, no auto-commit), behind the seam's interface."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import RecordMetadata

from libs import kafka
from libs.bus import Headers, Listener, Message, TopicSpec, UnknownTopic


def _offset_of(sent: asyncio.Future[RecordMetadata]) -> Awaitable[int]:
    """The send's future, resolving to its offset (a future, not a coroutine: never awaited is fine)."""
    out: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[RecordMetadata]) -> None:
        if out.cancelled():
            return
        if f.cancelled():
            out.cancel()
        elif (e := f.exception()) is not None:
            out.set_exception(e)
        else:
            out.set_result(f.result().offset)

    sent.add_done_callback(done)
    return out


class KafkaBus:
    idle_wait_s: float | None = None  # each idle loop keeps its own bound (libs.bus.Bus)

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    async def create_topics(self, specs: list[TopicSpec]) -> None:
        await kafka.ensure_topics(self.bootstrap, specs)

    async def delete_topics(self, names: list[str]) -> None:
        await kafka.delete_topics(self.bootstrap, names)

    async def partitions_for(self, topic: str) -> set[int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="shardlog-metadata")
        await admin.start()
        try:
            [described] = await admin.describe_topics([topic])  # asks the broker: never a stale cache
        finally:
            await admin.close()
        if described["error_code"] or not described["partitions"]:
            raise UnknownTopic(f"topic {topic} does not exist")
        return {p["partition"] for p in described["partitions"]}

    def producer(self, *, client_id: str) -> KafkaProducer:
        return KafkaProducer(kafka.producer(self.bootstrap, client_id=client_id, linger_ms=0))

    def transactional_producer(
        self,
        transactional_id: str,
        *,
        client_id: str,
        batch_bytes: int | None = None,
        retry_backoff_ms: int | None = None,
    ) -> KafkaTransactionalProducer:
        # linger 0: a phase's records are all queued before the sender runs (nothing awaits in
        # between), so lingering only delays each phase of every transaction.
        knobs: dict[str, Any] = {}
        if batch_bytes is not None:
            knobs["batch_bytes"] = batch_bytes
        if retry_backoff_ms is not None:
            knobs["retry_backoff_ms"] = retry_backoff_ms
        return KafkaTransactionalProducer(
            kafka.producer(self.bootstrap, transactional_id=transactional_id, client_id=client_id, linger_ms=0, **knobs)
        )

    def reader(
        self, topic: str, partition: int = 0, *, client_id: str, fetch_wait_ms: int | None = None
    ) -> KafkaReader:
        extra: dict[str, Any] = {} if fetch_wait_ms is None else {"fetch_max_wait_ms": fetch_wait_ms}

        def ends() -> AIOKafkaConsumer:
            return kafka.consumer(self.bootstrap, client_id=f"{client_id}-ends")

        return KafkaReader(
            kafka.consumer(self.bootstrap, client_id=client_id, **extra),
            TopicPartition(topic, partition),
            ends if fetch_wait_ms is not None else None,
        )

    def tail(self, topic: str, *, client_id: str) -> KafkaTail:
        metadata = kafka.producer(self.bootstrap, client_id=client_id)  # partitions_for, then stopped
        return KafkaTail(kafka.consumer(self.bootstrap, client_id=client_id), topic, metadata)

    def member(
        self, group: str, topic: str, *, client_id: str, listener: Listener, session_timeout_ms: int = 10_000
    ) -> KafkaMember:
        c = kafka.consumer(self.bootstrap, group_id=group, client_id=client_id, session_timeout_ms=session_timeout_ms)
        return KafkaMember(c, topic, listener)


class KafkaProducer:
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.p = producer

    async def start(self) -> None:
        await self.p.start()

    async def stop(self) -> None:
        await self.p.stop()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Awaitable[int]:
        sent = await self.p.send(
            topic, value, key=key, headers=list(headers), partition=partition, timestamp_ms=timestamp_ms
        )
        return _offset_of(sent)

    async def partitions_for(self, topic: str) -> set[int]:
        partitions: set[int] = await self.p.partitions_for(topic)
        return partitions


class KafkaTransactionalProducer(KafkaProducer):
    async def begin(self) -> None:
        await self.p.begin_transaction()

    async def send_offsets(self, group: str, topic: str, partition: int, offset: int) -> None:
        await self.p.send_offsets_to_transaction({TopicPartition(topic, partition): offset}, group)

    async def send_many(
        self, topic: str, partition: int, keys: list[bytes], values: list[bytes], last_headers: Headers
    ) -> list[tuple[Awaitable[int], int]]:
        p = self.p
        out: list[tuple[Awaitable[int], int]] = []
        batch, n = p.create_batch(), 0
        last = len(values) - 1
        for i, (key, value) in enumerate(zip(keys, values)):
            headers = list(last_headers) if i == last else []
            if batch.append(timestamp=None, key=key, value=value, headers=headers) is None:  # full: send it
                out.append((_offset_of(await p.send_batch(batch, topic, partition=partition)), n - 1))
                batch, n = p.create_batch(), 0
                if batch.append(timestamp=None, key=key, value=value, headers=headers) is None:
                    raise ValueError(f"a record of {len(value)} bytes does not fit a producer batch")
            n += 1
        out.append((_offset_of(await p.send_batch(batch, topic, partition=partition)), n - 1))
        return out

    async def commit(self) -> None:
        await self.p.commit_transaction()

    async def abort(self) -> None:
        await self.p.abort_transaction()


class KafkaReader:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        ends: Callable[[], AIOKafkaConsumer] | None = None,
    ) -> None:
        self.c, self.tp = consumer, tp
        # A second connection for the log's end, for readers that long-poll: on the reader's own,
        # a ListOffsets request waits behind the fetch in flight (up to its fetch_max_wait_ms),
        # and a router asks for config.events' end at every snapshot it picks.  Made at first use.
        self._make_ends, self._ends_lock = ends, asyncio.Lock()
        self._ends: AIOKafkaConsumer | None = None
        self._stopped = False

    async def start(self) -> None:
        await self.c.start()
        self.c.assign([self.tp])
        self.c.seek(self.tp, 0)

    async def stop(self) -> None:
        try:
            await self.c.stop()
        finally:
            async with self._ends_lock:
                self._stopped = True
                if self._ends is not None:
                    await self._ends.stop()
                    self._ends = None

    def seek(self, offset: int) -> None:
        self.c.seek(self.tp, offset)

    async def position(self) -> int:
        position: int = await self.c.position(self.tp)
        return position

    async def log_start(self) -> int:
        starts: dict[TopicPartition, int] = await self.c.beginning_offsets([self.tp])
        return starts[self.tp]

    async def log_end(self) -> int:
        if self._make_ends is None:
            return await kafka.log_end(self.c, self.tp)
        async with self._ends_lock:
            if self._stopped:
                raise RuntimeError(f"the reader of {self.tp} is stopped")
            if self._ends is None:
                ends = self._make_ends()
                try:
                    await ends.start()
                except BaseException:
                    await ends.stop()
                    raise
                self._ends = ends
            ends = self._ends
        return await kafka.log_end(ends, self.tp)

    async def offset_for_time(self, timestamp_ms: int) -> int | None:
        found = (await self.c.offsets_for_times({self.tp: timestamp_ms}))[self.tp]
        return int(found.offset) if found else None

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.1) -> list[Message]:
        batch = await self.c.getmany(self.tp, timeout_ms=int(timeout_s * 1000), max_records=max_records)
        records: list[Message] = batch.get(self.tp, [])
        return records


class KafkaTail:
    def __init__(self, consumer: AIOKafkaConsumer, topic: str, producer: AIOKafkaProducer) -> None:
        self.c, self.topic, self._metadata = consumer, topic, producer

    async def start(self) -> None:
        await asyncio.gather(self.c.start(), self._metadata.start())
        try:
            partitions = await self._metadata.partitions_for(self.topic)
        finally:
            await self._metadata.stop()
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self.c.assign(tps)
        ends: dict[TopicPartition, int] = await self.c.end_offsets(tps)
        for tp in tps:
            self.c.seek(tp, ends[tp])

    async def stop(self) -> None:
        await self.c.stop()

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Message]:
        batch: dict[TopicPartition, list[Message]] = await self.c.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )
        return [rec for records in batch.values() for rec in records]


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types
    def __init__(self, topic: str, listener: Listener) -> None:
        self.topic, self.listener = topic, listener

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        if mine := {tp.partition for tp in revoked if tp.topic == self.topic}:
            await self.listener.on_revoked(mine)

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        if mine := {tp.partition for tp in assigned if tp.topic == self.topic}:
            await self.listener.on_assigned(mine)


class KafkaMember:
    def __init__(self, consumer: AIOKafkaConsumer, topic: str, listener: Listener) -> None:
        self.c, self.topic, self.listener = consumer, topic, listener

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    async def start(self) -> None:
        await self.c.start()
        self.c.subscribe([self.topic], listener=_Rebalance(self.topic, self.listener))

    async def stop(self) -> None:
        await self.c.stop()  # leaves the group: the revocation listener runs first

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.c.assignment() if tp.topic == self.topic}

    def seek(self, partition: int, offset: int) -> None:
        self.c.seek(self._tp(partition), offset)

    def pause(self, partition: int) -> None:
        self.c.pause(self._tp(partition))

    def resume(self, partition: int) -> None:
        self.c.resume(self._tp(partition))

    async def poll(self, *, max_records: int = 500, timeout_s: float = 0.1) -> dict[int, list[Message]]:
        batch: dict[TopicPartition, list[Any]] = await self.c.getmany(
            timeout_ms=int(timeout_s * 1000), max_records=max_records
        )
        return {tp.partition: records for tp, records in batch.items() if records}

    async def committed(self, partition: int) -> int | None:
        offset: int | None = await self.c.committed(self._tp(partition))
        return offset

    async def commit(self, offsets: dict[int, int]) -> None:
        await self.c.commit({self._tp(p): o for p, o in offsets.items()})
