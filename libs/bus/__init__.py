"""The transport seam: the few things shardlog's services do with Kafka, as one interface.

Two implementations keep the same contract (`tests/bus_contract.py`, run against both):

- `libs.bus.kafka.KafkaBus`: aiokafka on a real broker (production, the integration suite);
- `libs.bus.memory.MemoryBus`: in one process, for the simulator (`tests/sim/`): no broker,
  no threads, every wait an asyncio wait, so a seeded event loop decides every interleaving.

What the contract holds, and all that shardlog may rely on (docs/reference/bus.md says why each):

1. **Per-partition order.** Records of one partition are read in the order they were written,
   each at an offset one above the previous entry; a transaction's commit or abort marker takes
   an offset of its own, as in Kafka, so offsets have gaps a reader never sees.
2. **read_committed.** A reader sees a transaction's records only once it commits, never an
   aborted one's, and stops at the first record of an open transaction (the last stable offset,
   `log_end`), even when later records are committed.
3. **Fencing.** Starting a transactional producer with an id fences every earlier producer with
   that id: its open transaction is aborted, and its next send, offset commit or commit raises
   `Fenced`. A fenced producer never commits again.
4. **Offsets with the transaction.** Group offsets sent in a transaction are committed with it,
   and discarded with it on abort. Kafka shows them to the group once the commit's markers are
   written, moments after the commit returns, and certainly once a producer with the same id
   has started (it waits for them): a new owner reads the group's offset only after that.
5. **Group hand-over.** A consumer group spreads a topic's partitions over its live members; a
   member that leaves (or misses its session timeout) has its partitions revoked (its listener is
   told, when it is still polling) and handed to the others at their next poll.

Errors are aiokafka's classes, so the code that catches them need not know which bus it runs on:
`Fenced` is `ProducerFenced`, `BusError` is `KafkaError`, `UnknownTopic` is
`UnknownTopicOrPartitionError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

from aiokafka.errors import KafkaError as BusError
from aiokafka.errors import ProducerFenced as Fenced
from aiokafka.errors import UnknownTopicOrPartitionError as UnknownTopic

from libs.topics import TopicSpec

__all__ = [
    "Bus",
    "BusError",
    "Fenced",
    "GroupMember",
    "Listener",
    "Message",
    "Producer",
    "Reader",
    "Tail",
    "TopicSpec",
    "TransactionalProducer",
    "UnknownTopic",
]

Headers = Sequence[tuple[str, bytes]]


class Message(Protocol):
    """A record as a reader gets it: the fields of aiokafka's ConsumerRecord that shardlog reads
    (the Kafka bus hands those over as they are: no copy per record on the hot path)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...

    @property
    def timestamp(self) -> int:
        """ms since the epoch, the producer's wall clock."""
        ...


class Listener(Protocol):
    """Told about a group member's partitions, from inside its `poll` (as aiokafka does)."""

    async def on_revoked(self, partitions: Collection[int]) -> None: ...

    async def on_assigned(self, partitions: Collection[int]) -> None: ...


class Producer(Protocol):
    """An idempotent producer (acks=all): each send's future resolves to its offset once written."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

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
        """Queue a record (partition None: the bus picks one; timestamp None: now); the future
        resolves once it is written."""
        ...

    async def partitions_for(self, topic: str) -> set[int]:
        """A topic's partitions as this producer knows them (fetched once, then cached); waits
        for them, so a caller that cannot wait bounds it (UnknownTopic in memory at once)."""
        ...


class TransactionalProducer(Producer, Protocol):
    """A producer with a transactional id; `start` fences every earlier producer with that id."""

    async def begin(self) -> None: ...

    async def send_offsets(self, group: str, topic: str, partition: int, offset: int) -> None: ...

    async def send_many(
        self, topic: str, partition: int, keys: list[bytes], values: list[bytes], last_headers: Headers
    ) -> list[tuple[Awaitable[int], int]]:
        """Many records at once (a migration's clone batch): no future, span or header per
        record, only the last record has `last_headers`. Each future is one producer batch's,
        resolving to its first record's offset, with how many records past that one it holds."""
        ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...


class Reader(Protocol):
    """One partition, read_committed, from a position the caller sets."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def seek(self, offset: int) -> None: ...

    async def position(self) -> int: ...

    async def log_start(self) -> int:
        """The first offset the log still holds (retention moves it on; never, in memory)."""
        ...

    async def log_end(self) -> int:
        """The last stable offset: below it, every transaction is decided."""
        ...

    async def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The first offset whose record's timestamp is at or after `timestamp_ms` (None: none is)."""
        ...

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.1) -> list[Message]:
        """The next committed records from the position (waiting up to `timeout_s` for some)."""
        ...


class Tail(Protocol):
    """Every partition of a topic, read_committed, from where each ended when it started: an
    inbox (replies to requests sent from then on)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Message]: ...


class GroupMember(Protocol):
    """A consumer-group member subscribed to one topic, read_committed."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Leave the group: its partitions are revoked (the listener told) and handed over."""
        ...

    def assignment(self) -> set[int]: ...

    def seek(self, partition: int, offset: int) -> None: ...

    def pause(self, partition: int) -> None: ...

    def resume(self, partition: int) -> None: ...

    async def poll(self, *, max_records: int = 500, timeout_s: float = 0.1) -> dict[int, list[Message]]:
        """Heartbeat, take part in a rebalance (the listener is called here), and fetch from the
        assigned, unpaused partitions, each from the group's committed offset or where sought."""
        ...

    async def committed(self, partition: int) -> int | None: ...

    async def commit(self, offsets: dict[int, int]) -> None:
        """Commit offsets outside any transaction (at-least-once consumers: the router)."""
        ...


class Bus(Protocol):
    idle_wait_s: float | None
    """How long a loop whose empty fetch or poll brings it nothing to do may wait in one: None
    on a broker, where each such loop keeps its own bound (0.1-0.5 s); the simulator's memory
    bus sets a long one, since there every wake-up of an idle loop costs CPU and shows nothing
    (docs/reference/simulator.md, "Speed"). Loops with work due on their clock (an offset
    commit) still wait only until it is due."""

    async def create_topics(self, specs: list[TopicSpec]) -> None:
        """Create the topics that do not exist yet."""
        ...

    async def delete_topics(self, names: list[str]) -> None:
        """Delete these topics (a router's inbox and cursors when it stops)."""
        ...

    async def partitions_for(self, topic: str) -> set[int]:
        """A topic's partitions; UnknownTopic when it does not exist."""
        ...

    def producer(self, *, client_id: str) -> Producer: ...

    def transactional_producer(
        self,
        transactional_id: str,
        *,
        client_id: str,
        batch_bytes: int | None = None,
        retry_backoff_ms: int | None = None,
    ) -> TransactionalProducer:
        """`batch_bytes`: the largest producer batch; `retry_backoff_ms`: the pause before a
        refused request is retried (Kafka's knobs; the memory bus has no use for them)."""
        ...

    def reader(self, topic: str, partition: int = 0, *, client_id: str, fetch_wait_ms: int | None = None) -> Reader:
        """A reader of one partition, at offset 0 until sought; `fetch_wait_ms` bounds how long a
        fetch waits at the broker (a seek waits for the fetch in flight)."""
        ...

    def tail(self, topic: str, *, client_id: str) -> Tail: ...

    def member(
        self, group: str, topic: str, *, client_id: str, listener: Listener, session_timeout_ms: int = 10_000
    ) -> GroupMember: ...


OnBatch = Callable[[list[Message]], Awaitable[None]]


def connect(where: str | Bus) -> Bus:
    """A bus: itself, or the Kafka bus of a bootstrap address (how callers that still pass one
    get the seam)."""
    if isinstance(where, str):
        from libs.bus.kafka import KafkaBus

        return KafkaBus(where)
    return where


async def catch_up(r: Reader, on_batch: OnBatch, *, max_records: int = 5000) -> int:
    """Feed `on_batch(records)` until the reader has passed the log's stable end as of now;
    returns the position reached.

    With read_committed, a transaction's commit marker takes an offset no record occupies, so
    Kafka's `position` can stop one short of the end (aiokafka #911): two empty fetches in a
    row after reaching end-1 also mean "caught up"."""
    target = await r.log_end()
    empty = 0
    while (pos := await r.position()) < target:
        # Near the end, fetch briefly: a fetch holding only a commit marker returns no record,
        # so it would sit out its whole wait before the position moves.
        records = await r.fetch(max_records=max_records, timeout_s=0.02 if pos >= target - 1 else 0.2)
        if records:
            empty = 0
            await on_batch(records)
        else:
            empty += 1
            if empty >= 2 and await r.position() >= target - 1:
                break
            if empty >= 50:  # 10 s with nothing below a stable end: a hanging transaction, not "caught up"
                target = await r.log_end()
                empty = 0
    return await r.position()


@asynccontextmanager
async def partition_reader(
    where: str | Bus, topic: str, *, partition: int = 0, start: int | str = 0, client_id: str = "shardlog-reader"
) -> AsyncIterator[Reader]:
    """A started reader of one partition, positioned at `start`: an offset, a negative number
    for that many offsets before the end, or "end"; stopped on exit. The one way shardlog opens
    a partition to read it (a command topic, read by a consumer group, is the processor's)."""
    r = connect(where).reader(topic, partition, client_id=client_id)
    await r.start()
    try:
        if start == "end":
            r.seek(await r.log_end())
        elif isinstance(start, int) and start < 0:
            r.seek(max(0, await r.log_end() + start))
        else:
            r.seek(int(start))
        yield r
    finally:
        await r.stop()


async def read_to_end(
    where: str | Bus,
    topic: str,
    on_batch: OnBatch,
    *,
    partition: int = 0,
    start: int | str = 0,
    client_id: str = "shardlog-reader",
) -> int:
    """Feed every record of a partition from `start` up to its end as of now to `on_batch`;
    returns the position reached (the log's end)."""
    async with partition_reader(where, topic, partition=partition, start=start, client_id=client_id) as r:
        return await catch_up(r, on_batch)
