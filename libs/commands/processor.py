"""The command processor's loop: consume commands, decide them against the current state, and
emit events, replies and the consumed offsets in ONE Kafka transaction per fetched batch.

- Exactly once: events, replies, dead letters and the command offsets commit together; a crash
  before the commit leaves no trace and the commands are decided again by whoever takes over
  (transaction.py; where the offsets go: offsets.py).
- Group commit: every command of a fetched batch shares one transaction.
- Plain reads outside it, and point reads during it (reads.py).
- One active instance: the member of the consumer group that owns the command topic's single
  partition.  It fences any earlier owner, catches its projection up to the tip of the event
  log, then serves (activation.py).  Standbys keep their projection warm.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection

from libs.bus import Bus, BusError, Fenced, GroupMember, Message, TransactionalProducer, connect
from libs.commands import activation, reads
from libs.commands.batch import Pending
from libs.commands.decision import Decider, Gossip
from libs.commands.inboxes import Inboxes
from libs.commands.offsets import GroupOffset
from libs.commands.policy import Policy
from libs.commands.transaction import BatchTransaction
from libs.projection import Projection
from schemas import Codec, Record

log = logging.getLogger(__name__)

POLL_S = 0.1  # the active instance's poll: how often it looks at its clock-driven duties when idle


class CommandProcessor:
    def __init__(
        self,
        *,
        bus: str | Bus,
        command_topic: str,
        command_codec: Codec[Record],
        projection: Projection,
        policy: Policy,
        dead_letters: str,
        group_id: str,
        name: str,
        max_batch: int = 500,
        session_timeout_ms: int = 10_000,
        clock: Gossip | None = None,
        batch_bytes: int = 1024 * 1024,
    ) -> None:
        self.bus, self.command_topic, self.codec = connect(bus), command_topic, command_codec
        self.projection, self.policy, self.dead_letters = projection, policy, dead_letters
        self.group_id, self.name, self.max_batch = group_id, name, max_batch
        self.session_timeout_ms = session_timeout_ms
        # With a clock: each event with a `ts` field is stamped with a tick of its own, replies carry
        # operationTime and the clock's gossip, requests' gossip advances it.
        self.clock = clock
        self.decider = Decider(name, command_codec, policy.decide, clock)
        self.batch_bytes = batch_bytes  # the producer's batch: a decision's bulk events fill whole ones
        self.partition = 0  # the command topic's one partition
        self.transactional_id = f"{group_id}.{self.partition}"
        self.active = asyncio.Event()
        self.fenced = False
        self.commands_done = 0
        self._lock = asyncio.Lock()  # held for a whole transaction; revocation waits for it
        self._member: GroupMember | None = None
        self._producer: TransactionalProducer | None = None  # while active
        self.group = GroupOffset(group_id, command_topic, self.partition)
        self.inboxes = Inboxes(name)
        self.reads = reads.ReadReplies(self.inboxes, clock)
        self.uncommitted = reads.Uncommitted()
        # Commands fetched while the last transaction was in flight and not answered then, and
        # the offset after the last command fetched then (answered or not); None: nothing fetched.
        self.carried: list[Message] = []
        self.carried_end: int | None = None
        self._assigned = asyncio.Event()
        self.assigned_at = 0.0  # when the group gave us the partition (monotonic)
        self.last_activation: dict[str, float] = {}  # the last take-over's timings, in seconds
        self._hold_until = 0.0

    # ------------------------------------------------------------ lifecycle

    @property
    def member(self) -> GroupMember:
        """The consumer group member reading commands, while `run()` runs."""
        if self._member is None:
            raise RuntimeError(f"{self.name}: not running")
        return self._member

    @property
    def producer(self) -> TransactionalProducer:
        """The transactional producer, while active."""
        if self._producer is None:
            raise RuntimeError(f"{self.name}: not active")
        return self._producer

    async def run(self) -> None:
        self._member = member = self.bus.member(
            self.group_id,
            self.command_topic,
            client_id=self.name,
            listener=_Listener(self),
            session_timeout_ms=self.session_timeout_ms,
        )
        await member.start()
        try:
            while True:
                await self._step()
        finally:
            await activation.deactivate(self, "stopping")
            await member.stop()

    async def _step(self) -> None:
        """One turn of the loop: stand by, activate, or serve a batch."""
        member = self.member
        if not self._assigned.is_set():
            # Standby: heartbeat through polls until the partition is ours, and keep the
            # projection warm so that taking over needs only a short catch-up.
            await member.poll(timeout_s=0.1)
            if not self._assigned.is_set():  # (just assigned: activate without another wait)
                await self.projection.poll(timeout_ms=100)
        elif not self.active.is_set():
            if time.monotonic() < self._hold_until:  # fenced: let the group speak first
                member.pause(self.partition)  # (activation seeks to where the commands resume)
                await member.poll(timeout_s=0.1)
            else:
                async with self._lock:
                    if self._assigned.is_set():
                        await activation.activate(self)
        else:
            await self._serve_batch()
            if self.group.lagged():
                await self._guarded(self.commit_group_offset)

    # ------------------------------------------------------------- serving

    def settled(self) -> bool:
        """No batch is being decided: every event applied to the state is committed to the log."""
        return not self._lock.locked()

    async def _serve_batch(self) -> None:
        if self.carried:  # fetched while the last transaction was in flight: they come first
            records, end = self.carried, self.carried_end
            self.carried, self.carried_end = [], None
        else:
            batch = await self.member.poll(timeout_s=self._poll_wait(), max_records=self.max_batch)
            records, end = batch.get(self.partition) or [], None
        if not records:
            return
        await self.policy.prepare(records)
        await self._guarded(lambda: self._serve(records, end if end is not None else records[-1].offset + 1))

    def _poll_wait(self) -> float:
        """How long the active instance's poll waits for commands: POLL_S; on a bus that lets idle
        loops wait longer (the simulator's, libs.bus.Bus.idle_wait_s), as long as that while no
        answered read's offset lags, else until the first POLL_S poll after its commit is due
        (`_step` commits it when a poll comes back empty), as POLL_S polls would reach it."""
        longer = self.bus.idle_wait_s
        if longer is None:
            return POLL_S
        due = self.group.due_in()
        return longer if due is None else min(longer, max(1, math.ceil(due / POLL_S)) * POLL_S)

    async def _serve(self, records: list[Message], end: int) -> None:
        """Serve `records`; `end` is the offset after them (or after the last command answered
        past them while the previous transaction was in flight)."""
        if self.policy.plain_reads:
            rest = await reads.answer_reads(self, records)
        else:
            rest = [Pending(rec, None) for rec in records]
        if not rest:
            self.group.lags(end)
        elif self.policy.point_reads is None or not self.policy.plain_reads:
            await self.transact(rest, end)
        else:
            await self._transact_answering(rest, end)

    async def transact(self, commands: list[Pending], end: int) -> None:
        """Decide `commands` in one transaction that commits the consumed offsets up to `end`."""
        await BatchTransaction(self, commands, end).run()

    async def _transact_answering(self, commands: list[Pending], end: int) -> None:
        """`transact`, and meanwhile answer the point reads fetched after its commands whose
        document none of its events touches; the other commands fetched meanwhile are carried
        to the next batch."""
        txn = asyncio.ensure_future(self.transact(commands, end))
        try:
            answered_end = await reads.answer_meanwhile(self, txn)
        except BaseException:
            txn.cancel()
            await asyncio.gather(txn, return_exceptions=True)
            raise
        await txn  # its failure is the batch's
        if answered_end is not None:
            if self.carried:
                self.carried_end = answered_end  # the next transaction commits their offsets too
            else:
                self.group.lags(answered_end)

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` (a transaction) holding the lock; a failed transaction stands this instance by."""
        async with self._lock:
            if not self.active.is_set():
                return  # revoked while fetching: the new owner decides these
            try:
                await work()
            except BusError as e:  # Fenced among them
                await self._failed(e)

    async def _failed(self, e: BusError) -> None:
        """Someone else owns the log now (or the transaction failed): forget the in-memory state
        this batch built, rebuild it from the store and stand by.  If the group moved the
        partition, revocation tells us within a session timeout; if it is still ours after that
        (we were fenced by a zombie), activating again fences it in turn."""
        self.fenced = isinstance(e, Fenced)
        log.error("%s: transaction failed (%s: %s); reloading state and standing by", self.name, type(e).__name__, e)
        self.projection.reset()
        await activation.deactivate(self, type(e).__name__)
        if self.fenced:
            self._hold_until = time.monotonic() + self.session_timeout_ms / 1000

    async def commit_group_offset(self) -> None:
        """No transaction came to give the consumer group the answered commands' offsets (plain
        reads', or those recorded in the changelog only): commit them alone."""
        await self.group.commit_alone(self.producer, self.reads.acked)


class _Listener:
    """The consumer group's word on the command partition."""

    def __init__(self, processor: CommandProcessor) -> None:
        self.processor = processor

    async def on_revoked(self, revoked: Collection[int]) -> None:
        p = self.processor
        if p.partition in revoked:
            async with p._lock:
                p._assigned.clear()
                await activation.deactivate(p, "partition revoked")

    async def on_assigned(self, assigned: Collection[int]) -> None:
        p = self.processor
        if p.partition in assigned:
            p.assigned_at = time.monotonic()
            p._assigned.set()
