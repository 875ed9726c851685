"""The bus in one process: Kafka's guarantees that shardlog relies on, and no more.

Made for the simulator: no threads, no sockets, and every wait is an asyncio wait on the
running loop (its clock included: `loop.time()` times session timeouts), so a loop whose
scheduling and clock are seeded makes every run repeat exactly.

What it keeps (libs/bus/__init__.py lists the contract): per-partition order with a marker
offset per transaction and partition; read_committed visibility up to the last stable offset;
fencing by transactional id; group offsets committed with their transaction; a group handing a
member's partitions over once it has revoked them (at its poll) or missed its session timeout.

What it leaves out, because shardlog must not depend on it: retention and compaction (every
record stays), transaction timeouts (an abandoned transaction stays open until its id is
started again, which is how every shardlog owner ends one), quotas and record-size limits.

Processes: a client belongs to the simulated process (`PROCESS`, a context variable the
simulator sets per service task) that made it. `crash(process)` is `kill -9` as the bus sees
it: from then on every operation of that process's clients raises `ProcessDead`, so nothing it
would still do (a `finally` that commits offsets, a last reply) reaches the log; its open
transaction stays open until its transactional id starts again, and its group membership
until its session times out, as on a broker.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from libs.bus import BusError as BusError
from libs.bus import Fenced, Headers, Listener, Message, TopicSpec, UnknownTopic

HEALED = "\x00healed"  # the wake-up key of processes waiting for a partition to heal
PROCESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("shardlog_sim_process", default=None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ProcessDead(BaseException):
    """An operation of a crashed process: a BaseException, so that no `except Exception` of the
    service's own carries on as if it were alive."""


class _Client:
    """Whatever a process opens on the bus: refuses to act once the process has crashed."""

    def __init__(self, bus: MemoryBus) -> None:
        self.bus, self.process = bus, PROCESS.get()

    def _alive(self) -> None:
        if self.process is not None and self.process in self.bus.dead:
            raise ProcessDead(self.process)

    async def _reach(self) -> None:
        """Wait while the process is cut off from the bus (a network partition); then act."""
        while True:
            self._alive()
            if self.process is None or self.process not in self.bus.cut_off:
                return
            await self.bus.changed(HEALED, 1.0)


@dataclass(frozen=True)
class MemoryMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


class TxnState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(eq=False)
class _Txn:
    transactional_id: str
    state: TxnState = TxnState.OPEN
    partitions: set[tuple[str, int]] = field(default_factory=set)
    offsets: list[tuple[str, str, int, int]] = field(default_factory=list)  # (group, topic, partition, offset)


@dataclass(eq=False)
class _Entry:
    """One offset of a partition: a record, or a transaction's marker (`record` None)."""

    record: MemoryMessage | None
    txn: _Txn | None = None
    at: float = 0.0  # when it reaches readers (loop time): after its delivery delay, in order

    def visible(self) -> bool:
        return self.record is not None and (self.txn is None or self.txn.state is TxnState.COMMITTED)


@dataclass(eq=False)
class _Log:
    entries: list[_Entry] = field(default_factory=list)
    open_from: dict[_Txn, int] = field(default_factory=dict)  # open transaction -> its first offset here
    arrived: int = 0  # entries below this offset have reached readers

    def append(self, entry: _Entry, now: float, delay: float) -> int:
        """Append `entry`, reaching readers `delay` seconds from `now`, never before the entry
        before it (a partition keeps its order)."""
        offset = len(self.entries)
        entry.at = max(now + delay, self.entries[-1].at if self.entries else now)
        self.entries.append(entry)
        if entry.txn is not None and entry.txn.state is TxnState.OPEN:
            self.open_from.setdefault(entry.txn, offset)
        return offset

    def decided(self, txn: _Txn) -> None:
        self.open_from.pop(txn, None)

    def last_stable(self) -> int:
        """The first offset of a record whose transaction is still open, or that has not reached
        readers yet (read_committed's end, as a reader sees it)."""
        entries, now = self.entries, asyncio.get_running_loop().time()
        while self.arrived < len(entries) and entries[self.arrived].at <= now:
            self.arrived += 1
        return min(self.arrived, *self.open_from.values()) if self.open_from else self.arrived

    def visible_from(self, position: int, limit: int) -> tuple[list[Message], int]:
        """Committed records from `position` up to the last stable offset, at most `limit`; and
        the position after the last entry looked at (markers and aborted records are passed over)."""
        end = self.last_stable()
        out: list[Message] = []
        while position < end and len(out) < limit:
            entry = self.entries[position]
            if entry.visible():
                assert entry.record is not None
                out.append(entry.record)
            position += 1
        return out, position


class MemoryBus:
    def __init__(
        self, delivery_delay: Callable[[str, int], float] | None = None, *, idle_wait_s: float | None = None
    ) -> None:
        """`delivery_delay(topic, partition)`: how long a new record takes to reach readers
        and its producer's ack (None: none). Records of one partition arrive in order; of
        different partitions, in whatever order their delays give: the simulator's reordering.
        `idle_wait_s`: how long idle loops may wait in one fetch or poll (libs.bus.Bus; None:
        their own bounds, as on a broker)."""
        self.delivery_delay = delivery_delay
        self.idle_wait_s = idle_wait_s
        self._logs: dict[str, list[_Log]] = {}
        self._epochs: dict[str, int] = {}  # transactional id -> the epoch of its current producer
        self._open: dict[str, _Txn] = {}  # transactional id -> its open transaction
        self._groups: dict[str, _Group] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}  # topic -> waits its next change ends
        self.dead: set[str] = set()  # crashed processes (a restarted service is a new process)
        self.cut_off: set[str] = set()  # processes a network partition keeps from the bus

    def crash(self, process: str) -> None:
        self.dead.add(process)
        self.notify()

    def partition(self, process: str) -> None:
        """Cut `process` off: its operations wait until `heal`; it does not poll, so its group
        membership lapses after its session timeout and a standby takes its partitions over."""
        self.cut_off.add(process)

    def heal(self, process: str) -> None:
        self.cut_off.discard(process)
        self.notify(HEALED)

    # ------------------------------------------------------------ topics

    async def create_topics(self, specs: list[TopicSpec]) -> None:
        for spec in specs:
            self._logs.setdefault(spec.name, [_Log() for _ in range(spec.partitions)])

    async def delete_topics(self, names: list[str]) -> None:
        for name in names:
            self._logs.pop(name, None)

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(len(self._log_list(topic))))

    def _log_list(self, topic: str) -> list[_Log]:
        logs = self._logs.get(topic)
        if logs is None:
            raise UnknownTopic(f"topic {topic} does not exist")
        return logs

    def log(self, topic: str, partition: int) -> _Log:
        logs = self._log_list(topic)
        if not 0 <= partition < len(logs):
            raise UnknownTopic(f"topic {topic} has no partition {partition}")
        return logs[partition]

    # ------------------------------------------------------------ clients

    def producer(self, *, client_id: str) -> MemoryProducer:
        return MemoryProducer(self, client_id)

    def transactional_producer(
        self,
        transactional_id: str,
        *,
        client_id: str,
        batch_bytes: int | None = None,
        retry_backoff_ms: int | None = None,
    ) -> MemoryTransactionalProducer:
        return MemoryTransactionalProducer(self, client_id, transactional_id)

    def reader(
        self, topic: str, partition: int = 0, *, client_id: str, fetch_wait_ms: int | None = None
    ) -> MemoryReader:
        return MemoryReader(self, topic, partition)

    def tail(self, topic: str, *, client_id: str) -> MemoryTail:
        return MemoryTail(self, topic)

    def member(
        self, group: str, topic: str, *, client_id: str, listener: Listener, session_timeout_ms: int = 10_000
    ) -> MemoryMember:
        return MemoryMember(self, self._groups.setdefault(group, _Group(group)), topic, listener, session_timeout_ms)

    # ------------------------------------------------------------ writing, waiting

    def append(self, topic: str, partition: int, entry: _Entry) -> int:
        loop = asyncio.get_running_loop()
        delay = self.delivery_delay(topic, partition) if self.delivery_delay is not None else 0.0
        offset = self.log(topic, partition).append(entry, loop.time(), delay)
        # Readers are woken when what they can read may have changed: when an entry arrives,
        # unless it is a record of a transaction still open then (readers stop before it: its
        # decision wakes them, `decide`) or a marker arriving at once (its decision wakes them
        # right after). Waking them for those only had every reader of the topic look again.
        if entry.at > loop.time():
            loop.call_at(entry.at, self._arrived, topic, entry)
        elif entry.record is not None:
            self._arrived(topic, entry)
        return offset

    def _arrived(self, topic: str, entry: _Entry) -> None:
        if entry.txn is None or entry.record is None or entry.txn.state is not TxnState.OPEN:
            self.notify(topic)

    def acked(self, topic: str, partition: int, offset: int) -> Awaitable[int]:
        """The producer's ack of a record: when it has reached readers."""
        loop = asyncio.get_running_loop()
        f: asyncio.Future[int] = loop.create_future()
        at = self.log(topic, partition).entries[offset].at

        def ack() -> None:
            if not f.done():
                f.set_result(offset)

        if at > loop.time():
            loop.call_at(at, ack)
        else:
            ack()
        return f

    def decide(self, txn: _Txn, state: TxnState) -> None:
        """Commit or abort: a marker on every partition the transaction wrote to, then the outcome
        (and, on commit, its group offsets) visible at once."""
        for topic, partition in sorted(txn.partitions):
            self.append(topic, partition, _Entry(None, txn))
            self.log(topic, partition).decided(txn)
        txn.state = state
        if state is TxnState.COMMITTED:
            for group, topic, partition, offset in txn.offsets:
                self._groups.setdefault(group, _Group(group)).offsets[(topic, partition)] = offset
        if self._open.get(txn.transactional_id) is txn:
            del self._open[txn.transactional_id]
        for topic in {topic for topic, _ in txn.partitions}:
            self.notify(topic)

    def notify(self, topic: str | None = None) -> None:
        """Wake who waits on `topic` (None: everyone)."""
        for t in list(self._waiters) if topic is None else [topic]:
            for waiter in self._waiters.pop(t, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def changed(self, topic: str, timeout_s: float) -> None:
        """Wait until something of `topic` is written or decided (or its group changes), or
        `timeout_s` passes."""
        # One future per wait, woken by the change or the timer: every idle reader of the
        # simulated cluster waits here, so no shielded wait_for and no callback in between.
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.get(topic)
        if waiters is None:
            self._waiters[topic] = [mine]
        else:
            waiters.append(mine)
        timer = loop.call_later(timeout_s, _wake, mine)
        try:
            await mine
        finally:
            timer.cancel()
            waiters = self._waiters.get(topic)  # (`notify` took the list of those it woke)
            if waiters is not None and mine in waiters:
                waiters.remove(mine)

    def message(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        timestamp_ms: int | None = None,
    ) -> MemoryMessage:
        offset = len(self.log(topic, partition).entries)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)  # wall clock, as a Kafka producer stamps
        return MemoryMessage(topic, partition, offset, key, value, tuple(headers), timestamp_ms)


class MemoryProducer(_Client):
    def __init__(self, bus: MemoryBus, client_id: str) -> None:
        super().__init__(bus)
        self.client_id = client_id

    async def start(self) -> None:
        await self._reach()

    async def stop(self) -> None:
        pass

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
        await self._reach()
        return self._write(topic, partition or 0, value, key, headers, timestamp_ms, None)

    def _write(
        self,
        topic: str,
        partition: int,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        timestamp_ms: int | None,
        txn: _Txn | None,
    ) -> Awaitable[int]:
        record = self.bus.message(topic, partition, value, key, headers, timestamp_ms)
        return self.bus.acked(topic, partition, self.bus.append(topic, partition, _Entry(record, txn)))

    async def partitions_for(self, topic: str) -> set[int]:
        return await self.bus.partitions_for(topic)


class MemoryTransactionalProducer(MemoryProducer):
    def __init__(self, bus: MemoryBus, client_id: str, transactional_id: str) -> None:
        super().__init__(bus, client_id)
        self.transactional_id = transactional_id
        self.epoch = 0
        self._txn: _Txn | None = None

    async def start(self) -> None:
        """init_transactions: take the next epoch, abort the previous producer's open transaction."""
        await self._reach()
        tid = self.transactional_id
        self.epoch = self.bus._epochs.get(tid, 0) + 1
        self.bus._epochs[tid] = self.epoch
        if (previous := self.bus._open.get(tid)) is not None:
            self.bus.decide(previous, TxnState.ABORTED)

    def _current(self) -> None:
        self._alive()
        if self.bus._epochs.get(self.transactional_id) != self.epoch:
            raise Fenced(f"producer {self.transactional_id} (epoch {self.epoch}) is fenced")

    def _in_transaction(self) -> _Txn:
        self._current()
        if self._txn is None or self._txn.state is not TxnState.OPEN:
            raise BusError(f"producer {self.transactional_id}: no transaction in progress")
        return self._txn

    async def begin(self) -> None:
        await self._reach()
        self._current()
        if self._txn is not None and self._txn.state is TxnState.OPEN:
            raise BusError(f"producer {self.transactional_id}: a transaction is already in progress")
        self._txn = self.bus._open[self.transactional_id] = _Txn(self.transactional_id)

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
        await self._reach()
        partition = partition or 0
        txn = self._in_transaction()
        txn.partitions.add((topic, partition))
        return self._write(topic, partition, value, key, headers, timestamp_ms, txn)

    async def send_offsets(self, group: str, topic: str, partition: int, offset: int) -> None:
        await self._reach()
        self._in_transaction().offsets.append((group, topic, partition, offset))

    async def send_many(
        self, topic: str, partition: int, keys: list[bytes], values: list[bytes], last_headers: Headers
    ) -> list[tuple[Awaitable[int], int]]:
        last = len(values) - 1
        sent = [
            await self.send(topic, value, key=key, headers=last_headers if i == last else (), partition=partition)
            for i, (key, value) in enumerate(zip(keys, values))
        ]
        return [(sent[0], len(sent) - 1)] if sent else []

    async def commit(self) -> None:
        await self._reach()
        self.bus.decide(self._in_transaction(), TxnState.COMMITTED)

    async def abort(self) -> None:
        await self._reach()
        self.bus.decide(self._in_transaction(), TxnState.ABORTED)


class MemoryReader(_Client):
    def __init__(self, bus: MemoryBus, topic: str, partition: int) -> None:
        super().__init__(bus)
        self.topic, self.partition = topic, partition
        self._position = 0

    async def start(self) -> None:
        self.bus.log(self.topic, self.partition)  # an unknown topic fails here

    async def stop(self) -> None:
        pass

    def seek(self, offset: int) -> None:
        self._position = offset

    async def position(self) -> int:
        return self._position

    async def log_start(self) -> int:
        return 0  # no retention: every record stays

    async def log_end(self) -> int:
        return self.bus.log(self.topic, self.partition).last_stable()

    async def offset_for_time(self, timestamp_ms: int) -> int | None:
        entries = self.bus.log(self.topic, self.partition).entries
        return next((i for i, e in enumerate(entries) if e.record and e.record.timestamp >= timestamp_ms), None)

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.1) -> list[Message]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        bus, process = self.bus, self.process
        while True:
            if process is not None and (process in bus.dead or process in bus.cut_off):
                await self._reach()  # (the rest of the time, no coroutine to make)
            out, self._position = bus.log(self.topic, self.partition).visible_from(self._position, max_records)
            if out or (left := deadline - loop.time()) <= 0:
                return out
            await self.bus.changed(self.topic, left)


class MemoryTail(_Client):
    def __init__(self, bus: MemoryBus, topic: str) -> None:
        super().__init__(bus)
        self.topic = topic
        self._positions: list[int] = []

    async def start(self) -> None:
        self._positions = [log.last_stable() for log in self.bus._log_list(self.topic)]

    async def stop(self) -> None:
        pass

    async def fetch(self, *, max_records: int = 500, timeout_s: float = 0.5) -> list[Message]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        bus, process = self.bus, self.process
        while True:
            if process is not None and (process in bus.dead or process in bus.cut_off):
                await self._reach()
            out: list[Message] = []
            for p, log in enumerate(self.bus._log_list(self.topic)):
                records, self._positions[p] = log.visible_from(self._positions[p], max_records - len(out))
                out += records
            if out or (left := deadline - loop.time()) <= 0:
                return out
            await self.bus.changed(self.topic, left)


# ---------------------------------------------------------------- consumer groups


@dataclass(eq=False)
class _Group:
    name: str
    members: list[MemoryMember] = field(default_factory=list)  # live, in the order they joined
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    generation: int = 0

    def change(self) -> None:
        self.generation += 1

    def holder(self, topic: str, partition: int) -> MemoryMember | None:
        return next((m for m in self.members if m.topic == topic and partition in m._held), None)

    def target(self, member: MemoryMember, partitions: int) -> set[int]:
        """The range assignor: each live member of the topic gets a contiguous share, in join order."""
        peers = [m for m in self.members if m.topic == member.topic]
        i, n = peers.index(member), len(peers)
        share, extra = divmod(partitions, n)
        start = i * share + min(i, extra)
        return set(range(start, start + share + (1 if i < extra else 0)))


class MemoryMember(_Client):
    def __init__(self, bus: MemoryBus, group: _Group, topic: str, listener: Listener, session_timeout_ms: int) -> None:
        super().__init__(bus)
        self.group, self.topic, self.listener = group, topic, listener
        self.session_timeout_s = session_timeout_ms / 1000
        self._held: set[int] = set()
        self._generation = -1
        self._positions: dict[int, int] = {}
        self._paused: set[int] = set()
        self._last_seen = 0.0
        self._rebalancing: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.bus._log_list(self.topic)  # an unknown topic fails here
        self._join()

    def _join(self) -> None:
        self._last_seen = asyncio.get_running_loop().time()
        self.group.members.append(self)
        self.group.change()

    async def stop(self) -> None:
        self._alive()  # a crashed member does not leave: its session times out
        if self in self.group.members:
            await self._revoke()
            self.group.members.remove(self)
            self.group.change()
            self.bus.notify(self.topic)

    def assignment(self) -> set[int]:
        return set(self._held)

    def seek(self, partition: int, offset: int) -> None:
        self._positions[partition] = offset

    def pause(self, partition: int) -> None:
        self._paused.add(partition)

    def resume(self, partition: int) -> None:
        self._paused.discard(partition)

    async def committed(self, partition: int) -> int | None:
        return self.group.offsets.get((self.topic, partition))

    async def commit(self, offsets: dict[int, int]) -> None:
        await self._reach()
        # As Kafka's coordinator refuses a member evicted from the group (its session lapsed:
        # CommitFailedError) or a partition it does not hold: a router frozen or cut off past its
        # session must not take operations that the partition's new owner runs too.
        if self not in self.group.members or not set(offsets) <= self._held:
            raise BusError(f"member of {self.group.name}: not the owner of {sorted(offsets)} any more")
        for partition, offset in offsets.items():
            self.group.offsets[(self.topic, partition)] = offset

    async def _revoke(self) -> None:
        held, self._held = self._held, set()
        for p in held:
            self._positions.pop(p, None)
        if held:
            await self.listener.on_revoked(held)
            self.bus.notify(self.topic)  # a member waiting for these may take them now

    async def _rebalance(self) -> None:
        """Take part in a rebalance: evict members past their session timeout, revoke what this
        member holds beyond its share, take the share others have released.

        Whatever tells the listener runs in a task of its own, which a poll cancelled meanwhile
        does not interrupt (aiokafka's coordinator runs the listener, not the task in `getmany`):
        a cancelled poll must not leave a revocation half done, the partitions gone from the
        member while its owner, stopped in `on_revoked`, still believes them its own. Polls
        meanwhile wait for the same rebalance."""
        running = self._rebalancing
        if running is not None and not running.done():
            await asyncio.shield(running)
            return
        loop = asyncio.get_running_loop()
        now, group = loop.time(), self.group
        if self in group.members:  # (the common case, a member in a stable group: no task)
            self._last_seen = now
            for m in [m for m in group.members if now - m._last_seen > m.session_timeout_s]:
                group.members.remove(m)  # what it held is free now; it learns at its next poll
                group.change()
            if self._generation == group.generation:
                return
        self._rebalancing = loop.create_task(self._rebalance_told())
        await asyncio.shield(self._rebalancing)

    async def _rebalance_told(self) -> None:
        now = asyncio.get_running_loop().time()
        group = self.group
        if self not in group.members:  # evicted while silent: its partitions are gone, it joins again
            await self._revoke()
            self._join()
        self._last_seen = now
        for m in [m for m in group.members if now - m._last_seen > m.session_timeout_s]:
            group.members.remove(m)  # what it held is free now; it learns at its next poll
            group.change()
        if self._generation == group.generation:
            return
        target = group.target(self, len(self.bus._log_list(self.topic)))
        if self._held - target:
            await self._revoke()  # eager: give everything back, take the share below
        free = {p for p in target - self._held if group.holder(self.topic, p) is None}
        if free:
            self._held |= free
            await self.listener.on_assigned(set(self._held))
        if self._held == target:
            self._generation = group.generation

    async def poll(self, *, max_records: int = 500, timeout_s: float = 0.1) -> dict[int, list[Message]]:
        """Records, or none once `timeout_s` has passed or the member's partitions have changed
        (its owner learns it at once, however long its idle poll: libs.bus.Bus.idle_wait_s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        held = set(self._held)
        bus, process = self.bus, self.process
        while True:
            if process is not None and (process in bus.dead or process in bus.cut_off):
                await self._reach()
            await self._rebalance()
            out: dict[int, list[Message]] = {}
            left = max_records
            for p in sorted(self._held - self._paused):
                if left <= 0:
                    break
                start = self._positions.get(p)
                if start is None:
                    start = self.group.offsets.get((self.topic, p), 0)
                records, self._positions[p] = self.bus.log(self.topic, p).visible_from(start, left)
                if records:
                    out[p], left = records, left - len(records)
            if out or (wait := deadline - loop.time()) <= 0 or self._held != held:
                return out
            await self.bus.changed(self.topic, min(wait, self.session_timeout_s / 3))
