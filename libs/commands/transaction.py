"""A fetched batch's transaction, in the steps docs/reference/command-processor.md names, in its
order.  Each step says what it expects and what it leaves:

    1. begin          the transaction open; the group's offset sent first when it has lagged
    2. decide         each command decided against the state its predecessors left
    3. produce        its events applied to the state and sent (on each, the consumed offsets)
    4. reply early    a one-phase reply sent right after its events (position: the batch's start)
    5. await acks     every event acked: the positions that show each command's effect are known
    6. reply          the other replies, each naming the position after its events
    7. commit         events, replies, dead letters and offsets visible at once, or none of them
    8. advance        the projection's checkpoint moved past the events and the commands

Steps 2-4 run per command, inside its spans (traced.py).  Kafka 4 verifies a transaction's first
write to each partition with the transaction coordinator (KIP-890); meeting the coordinator
mid-change of the same transaction (the group's offsets, or another partition) is answered as
NOT_ENOUGH_REPLICAS and retried.  So the group's offsets go before any write, and each phase's
partitions (events, then replies) join together before its first write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.util.types import AttributeValue

from libs import tracing
from libs.bus import Message
from libs.commands.batch import Pending
from libs.commands.decision import Decided, header
from libs.commands.traced import BatchTrace
from libs.faults import fault_point
from libs.headers import CORRELATION_ID, REPLY_TO, VECTOR_TIME
from libs.projection import COMMAND_END, fingerprint
from schemas import Codec, Tombstone

if TYPE_CHECKING:
    from libs.commands.processor import CommandProcessor


class BatchTransaction:
    """`commands` decided in one transaction that commits the consumed offsets up to `end`."""

    def __init__(self, processor: CommandProcessor, commands: list[Pending], end: int) -> None:
        self.p, self.commands, self.end = processor, commands, end
        self.producer = processor.producer
        self.trace = BatchTrace(processor.name, processor.transactional_id, commands)
        self.recorded = [(COMMAND_END, str(end).encode())]  # on every event: any that compaction keeps tells
        self.to_group = False  # the group takes the offsets (else the events record them)
        self.wrote_events = False
        self.last_offset: int | None = None  # the batch's last event's, once acked
        self.last_value: bytes | None = None  # its value, for the checkpoint's fingerprint (None: a tombstone)

    async def run(self) -> None:
        error: BaseException | None = None
        try:
            await self.begin()
            await self.ready_early_replies()
            for c in self.commands:
                with self.trace.command(c):
                    self.decide(c)
                    await self.dead_letter(c)
                    with self.trace.transaction(c):
                        await self.produce(c)
                    self.address(c)
                    await self.reply_early(c)
            await self.offsets_before_first_write()  # no event: before any reply
            await self.await_acks()
            await self.reply()
            await self.commit()
            self.advance()
        except BaseException as e:
            error = e
            raise
        finally:
            self.trace.end(error)

    # 1 -------------------------------------------------------------------------------- begin

    async def begin(self) -> None:
        """Expects no open transaction; leaves one open, holding the group's offsets when the
        group has lagged half of READ_OFFSETS_COMMIT_S (so that under load it follows without
        transactions of its own)."""
        await self.producer.begin()
        if self.p.group.lagged(0.5):
            await self.p.group.send(self.producer, self.end)
            self.to_group = True

    async def offsets_before_first_write(self) -> None:
        """Before a write that is not an event, when no event came first: the group takes the
        offsets (the transaction may write no event at all)."""
        if not (self.to_group or self.wrote_events):
            await self.p.group.send(self.producer, self.end)
            self.to_group = True

    async def ready_early_replies(self) -> None:
        """With one-phase replies, every read reply must be below them on its inbox, and every
        inbox's metadata known, so that no send pauses between the events and the replies the
        sender should take in one request."""
        if not self.p.policy.one_phase_replies:
            return
        await self.p.reads.acked(shared=True)
        for inbox in {to for c in self.commands if (to := header(c.rec.headers, REPLY_TO))}:
            await self.p.inboxes.partitions(self.producer, inbox.decode())

    # 2 ------------------------------------------------------------------------------- decide

    def decide(self, c: Pending) -> None:
        """Leaves `c.decided` (the plain-read pass may have decided it already)."""
        head = c.head
        if head is not None and head.decided is not None:
            c.decided = head.decided
        else:
            c.decided = self.p.decider(c.rec.value, c.rec.headers, c.rec.offset, head.command if head else None)

    async def dead_letter(self, c: Pending) -> None:
        """A command that does not decode goes to the dead letters, with why and whence."""
        reason = c.decided.dead_letter if c.decided is not None else None
        if reason is None:
            return
        await self.offsets_before_first_write()
        await self.producer.send(
            self.p.dead_letters, c.rec.value, key=c.rec.key, headers=dead_letter_headers(c.rec, reason)
        )

    # 3 ------------------------------------------------------------------------------ produce

    async def produce(self, c: Pending) -> None:
        """An accepted command's events, applied to the state and sent: a clone batch's first,
        then the decision's.  Applying a decided event cannot fail but through a bug; if it does,
        the exception aborts the whole transaction rather than commit half a command."""
        decided = c.decided
        if decided is None or not decided.reply.ok:
            return
        if decided.bulk is not None and decided.bulk_records[1]:
            await self._produce_bulk(c, decided)
        if decided.events:
            kinds: AttributeValue = [e.type for e in decided.events]
            with self.trace.producing(self.p.projection.topic, **{"shardlog.events": kinds}):
                await self._produce_events(c, decided)

    async def _produce_bulk(self, c: Pending, decided: Decided) -> None:
        """A clone batch: whole producer batches, no header per record but the position on its
        last; no point read is answered before the commit."""
        assert decided.bulk is not None
        keys, values = decided.bulk_records
        self.wrote_events = True
        self.p.uncommitted.everything()
        decided.bulk.apply()
        projection = self.p.projection
        attributes: dict[str, AttributeValue] = {"shardlog.event": decided.bulk.kind, "shardlog.events": len(values)}
        with self.trace.producing(projection.topic, **attributes):
            c.acks += await self.producer.send_many(projection.topic, projection.partition, keys, values, self.recorded)
        c.event_count += len(values)
        self.last_value = values[-1]

    async def _produce_events(self, c: Pending, decided: Decided) -> None:
        """One traceparent for the command's events (one per event costs more than the rest of a
        small write's sending); each applied with offset -1: it is known once acked."""
        self.wrote_events = True
        headers = tracing.inject(self.recorded)
        self.p.uncommitted.note(decided.events, self.p.policy.point_reads)
        state, topic, event_key = self.p.projection.state, self.p.projection.topic, self.p.policy.event_key
        for event, value in zip(decided.events, decided.values):
            state.apply(event, -1)
            key = event.key if isinstance(event, Tombstone) else event_key(event)
            c.acks.append((await self.producer.send(topic, value, key=key, headers=headers), 0))
            self.last_value = value
        c.event_count += len(decided.events)

    # 4 ------------------------------------------------------------------------- reply early

    def address(self, c: Pending) -> None:
        """Leaves `c.reply` (with its operationTime) and where it goes (None: nobody asked, or
        the requester is gone), its headers naming the command's span."""
        decided = c.decided
        assert decided is not None
        reply, clock = decided.reply, self.p.clock
        if clock is not None:
            reply = reply.model_copy(update={"operationTime": decided.op_time or clock.cluster_time})
        c.reply = reply
        reply_to, corr = header(c.rec.headers, REPLY_TO), header(c.rec.headers, CORRELATION_ID)
        if reply_to and not self.p.inboxes.gone(reply_to.decode()):
            c.reply_to = reply_to.decode()
            c.reply_headers = tracing.inject([(CORRELATION_ID, corr)] if corr else [])

    async def reply_early(self, c: Pending) -> None:
        """One phase: no reader sees the reply before the commit (read_committed), and the commit
        waits for every ack; its position is the batch's start (a lower bound)."""
        policy, command = self.p.policy, c.decided.command if c.decided is not None else None
        if c.reply_to is None or command is None or not policy.one_phase_replies:
            return
        if not policy.replies_with_events(command):
            return
        await self.offsets_before_first_write()
        assert c.reply is not None
        early = c.reply.model_copy(update={"configTime": self.p.projection.position})
        await self.producer.send(c.reply_to, Codec.encode(early), headers=self._gossiped(c.reply_headers), partition=0)
        c.reply_to = None

    def _gossiped(self, headers: tracing.Headers) -> tracing.Headers:
        clock = self.p.clock
        return [*headers, (VECTOR_TIME, clock.gossip_out())] if clock is not None else list(headers)

    # 5 -------------------------------------------------------------------------- await acks

    async def await_acks(self) -> None:
        """Every event acked, before the first reply goes out (so the replies' partitions join
        together); leaves each waiting reply's position: after its events and its predecessors'."""
        for c in self.commands:
            for ack, more in c.acks:
                self.last_offset = await ack + more
            if c.reply_to is not None:
                last = self.last_offset
                c.position = last + 1 if last is not None else self.p.projection.position

    # 6 ------------------------------------------------------------------------------- reply

    async def reply(self) -> None:
        """The replies that waited for the acks, to the inboxes that exist (partition 0: not the
        plain reads'), once every read reply sent before is acked."""
        waiting = [c for c in self.commands if c.reply_to is not None]
        reachable = {
            i for i in {c.reply_to for c in waiting} if i and await self.p.inboxes.partitions(self.producer, i)
        }
        await self.p.reads.acked()
        for c in waiting:
            if c.reply_to in reachable:
                assert c.reply is not None
                answer = c.reply.model_copy(update={"configTime": c.position})
                await self.producer.send(
                    c.reply_to, Codec.encode(answer), headers=self._gossiped(c.reply_headers), partition=0
                )

    # 7 ------------------------------------------------------------------------------ commit

    async def commit(self) -> None:
        """Leaves the batch committed, and the group told, or known to lag, the offsets."""
        tag = _tag(self.commands)
        fault_point(f"{self.p.name}.before_commit", tag=tag)
        await self.producer.commit()
        fault_point(f"{self.p.name}.after_commit", tag=tag)
        self.p.commands_done += len(self.commands)
        if self.to_group:
            self.p.group.got()  # this commit took them (reads answered meanwhile come after)
        else:
            self.p.group.lags(self.end)  # recorded in the changelog only

    # 8 ----------------------------------------------------------------------------- advance

    def advance(self) -> None:
        """The projection's checkpoint past the batch's events and commands: the state is all
        committed again."""
        if self.last_offset is not None:
            self.p.projection.advance(self.last_offset + 1, fingerprint(self.last_value), self.end)
        self.p.uncommitted.clear()


def _tag(commands: list[Pending]) -> str:
    """A fault-point tag: the text of the last command, so a test can aim at one command."""
    try:
        return (commands[-1].rec.value or b"").decode()
    except Exception:
        return ""


def dead_letter_headers(rec: Message, reason: str) -> list[tuple[str, bytes]]:
    return [
        ("dlq.reason", reason.encode()),
        ("dlq.topic", rec.topic.encode()),
        ("dlq.partition", str(rec.partition).encode()),
        ("dlq.offset", str(rec.offset).encode()),
        *[(k, v) for k, v in (rec.headers or ()) if k in (REPLY_TO, CORRELATION_ID)],
    ]
