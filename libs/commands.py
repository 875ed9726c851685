"""Command processor: consume commands, decide against current state, and emit
events, replies and the consumed offsets in ONE Kafka transaction.

- Exactly once: events, replies, dead letters and the command offsets commit
  together; a crash before the commit leaves no trace and the commands are
  decided again by whoever takes over.  A transaction that writes events records
  the offsets on them (the `cmd-end` header, projection.COMMAND_END) instead of
  committing them to the consumer group; one that writes none commits them to the
  group.  A new owner resumes at the larger of the two (docs/reference/command-processor.md).
- Group commit: every command of a fetched batch shares one transaction.
- Plain reads outside it: the commands a service calls plain reads (a shard's Find / Count
  without afterClusterTime) at the head of a batch write nothing, so they are answered at once
  through a non-transactional producer; their offsets commit with the next transaction, or
  alone within READ_OFFSETS_COMMIT_S (docs/reference/command-processor.md).
- The consumer group's offset follows within READ_OFFSETS_COMMIT_S too (lag monitoring,
  and a second record of the position): an occasional transaction also commits it.
- One active instance: the member of the consumer group that owns the
  command topic's single partition.  It fences any earlier owner by starting
  a transactional producer with the stable id `<group>.<partition>`, catches
  its projection up to the tip of the event log, then serves.  Standbys wait.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import traceback
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from libs import aio, tracing
from libs.bus import Bus, BusError, Fenced, GroupMember, Message, Producer, TransactionalProducer, connect
from libs.errors import CommandError as CommandError  # re-exported: the processor's importers
from libs.faults import fault_point
from libs.headers import CORRELATION_ID as CORRELATION_ID  # re-exported
from libs.headers import REPLY_TO as REPLY_TO
from libs.headers import VECTOR_TIME as VECTOR_TIME
from libs.projection import COMMAND_END, Projection, fingerprint
from schemas import Codec, Record, RecordError, Tombstone
from schemas.reply import Reply

log = logging.getLogger(__name__)

# How long the offsets of reads answered outside any transaction may stay uncommitted when no
# transaction comes to carry them: a takeover answers at most this much again (harmlessly).  Also
# how far the consumer group's offset may lag the position recorded in the changelog.
READ_OFFSETS_COMMIT_S = float(os.environ.get("SHARDLOG_READ_OFFSETS_COMMIT_S", "1"))
# An inbox's partition for the replies sent outside any transaction (plain reads), when it has
# more than one: a read_committed reader stops at the first open transaction of a partition, and
# the transactions of every processor replying to that inbox keep its first partition busy.
UNTRANSACTED_REPLIES_PARTITION = 1
# How long a reply waits for its inbox's metadata before the inbox counts as gone (deleted with
# its router or client: a read answered again after a restart may name one), and how long it then
# stays gone: waiting the producer's 40 s for every such reply would hold every command back.
INBOX_WAIT_S = float(os.environ.get("SHARDLOG_INBOX_WAIT_S", "2"))
GONE_INBOX_S = 5 * INBOX_WAIT_S
# The transactional producer's retry backoff (docs/reference/settings.md).
TRANSACTION_RETRY_BACKOFF_MS = int(os.environ.get("SHARDLOG_TRANSACTION_RETRY_BACKOFF_MS", "3"))


class Gossip(Protocol):
    """What the runtime needs of a vector clock (domain.clock.VectorClock): tick once per stamped
    event, advance from a request's `vector-time` header, put its own on replies."""

    @property
    def cluster_time(self) -> int: ...

    def tick(self, wall: float | None = None) -> int: ...

    def gossip_in(self, raw: bytes | None) -> None: ...

    def gossip_out(self) -> bytes: ...


class PointReads(Protocol):
    """What a service tells the processor so that it may answer some plain reads while a
    transaction is in flight (docs/reference/command-processor.md, "Point reads during a
    transaction")."""

    def key(self, command: Record) -> bytes | None:
        """The one document a plain read reads, as the key `changed` names it with; None: the
        read may depend on more (it waits for the transaction)."""
        ...

    def changed(self, event: Record) -> tuple[bytes, ...] | None:
        """The documents an event changes (empty: none that a point read reads); None: it may
        change what any read sees."""
        ...


_STAMPED: dict[type, bool] = {}


def stamped(record: Record) -> bool:
    """Does this kind of event carry a ClusterTime stamp (a `ts` field)?"""
    kind = type(record)
    if (has := _STAMPED.get(kind)) is None:
        has = _STAMPED[kind] = "ts" in kind.model_fields
    return has


class BulkEvents(Protocol):
    """Many events of one kind that a decision gives as bytes, not as a Record each: a
    migration's clone batch (docs/reference/chunk-migration.md, "the bulk clone").  The
    processor stamps, encodes, folds and sends them before the decision's `events`."""

    kind: str  # their record type (the producer span's `shardlog.event`)

    def __len__(self) -> int: ...

    def encode(self, ticks: list[int] | None) -> tuple[list[bytes], list[bytes]]:
        """(Kafka keys, values) of the events, the i-th stamped with ticks[i] (None: unstamped)."""
        ...

    def apply(self) -> None:
        """Fold the encoded events into the state (after `encode`, with its stamps)."""
        ...


@dataclass
class Decision:
    events: list[Record] = field(default_factory=list)
    result: dict[str, Any] | None = None  # the reply's result: JSON
    bulk: BulkEvents | None = None  # recorded before `events`


# decide(command) -> Decision, raising CommandError; must not mutate state:
# the processor applies the events, so the next command of the batch sees them.
Decide = Callable[[Record], Decision]


@dataclass
class Decided:
    """A command decided by the processor: its reply (without the positions a transaction
    fills in), its events stamped and encoded, or the reason it is a dead letter."""

    reply: Reply
    command: Record | None = None  # None: it did not decode
    events: list[Record] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    op_time: int | None = None  # the command's last stamp
    dead_letter: str | None = None
    bulk: BulkEvents | None = None  # a clone batch's events, recorded before `events`
    bulk_records: tuple[list[bytes], list[bytes]] = ([], [])  # their stamped (keys, values)


@dataclass
class Head:
    """The first command of a transaction, already decoded (and decided, with its span) by the
    plain-read pass."""

    command: Record
    span: trace.Span | None = None
    decided: Decided | None = None


def header(headers: tracing.Headers | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


class CommandProcessor:
    def __init__(
        self,
        *,
        bus: str | Bus,
        command_topic: str,
        command_codec: Codec[Record],
        projection: Projection,
        decide: Decide,
        dead_letters: str,
        group_id: str,
        name: str,
        max_batch: int = 500,
        session_timeout_ms: int = 10_000,
        on_role: Callable[[str], None] | None = None,
        event_key: Callable[[Record], bytes | None] | None = None,
        prepare: Callable[[list[Message]], Awaitable[None]] | None = None,
        clock: Gossip | None = None,
        batch_bytes: int = 1024 * 1024,
        plain_read: Callable[[Record], bool] | None = None,
        one_phase: Callable[[Record], bool] | None = None,
        point_reads: PointReads | None = None,
    ) -> None:
        self.bus, self.command_topic, self.codec = connect(bus), command_topic, command_codec
        self.projection, self.decide, self.dead_letters = projection, decide, dead_letters
        self.group_id, self.name, self.max_batch = group_id, name, max_batch
        self.session_timeout_ms = session_timeout_ms
        self.on_role = on_role or (lambda role: None)  # told "active" / "standby"
        self.event_key = event_key or (lambda event: None)  # the Kafka key of an event (compaction)
        self.prepare = prepare  # awaited before a batch is decided (e.g. catch up to its ConfigTime)
        # With a clock: each event with a `ts` field is stamped with a tick of its own, replies carry
        # operationTime and the clock's gossip, requests' gossip advances it.
        self.clock = clock
        self.batch_bytes = batch_bytes  # the producer's batch: a decision's bulk events fill whole ones
        # A command that never writes and may be answered from the committed state outside the
        # transaction, when it heads a batch (docs/reference/command-processor.md).
        self.plain_read = plain_read
        # A command whose reply may leave with its events, before their acks (one produce for
        # both); the others' replies wait for the acks, to name the changelog position after
        # their events.  None: every reply waits (docs/reference/command-processor.md).
        self.one_phase = one_phase
        # Which plain reads read one document, and which documents an event changes: such a read
        # is answered while a transaction is in flight when none of its events touches that
        # document (docs/reference/command-processor.md).  None: reads wait for the transaction.
        self.point_reads = point_reads
        self.partition = 0  # the command topic's one partition
        self.transactional_id = f"{group_id}.{self.partition}"
        self.active = asyncio.Event()
        self.fenced = False
        self.commands_done = 0
        self._lock = asyncio.Lock()  # held for a whole transaction; revocation waits for it
        self._member: GroupMember | None = None
        self._producer: TransactionalProducer | None = None  # while active
        self._read_producer: Producer | None = None  # idempotent, plain reads' replies, while active
        # Plain reads' replies not yet known acked, each with whether it went to a partition that
        # transactional replies use too (an inbox with one partition).
        self._read_sends: list[tuple[Awaitable[int], bool]] = []
        # The offset after the last command answered that the consumer group has not got: plain
        # reads answered outside any transaction (recorded nowhere yet until a transaction comes),
        # or commands whose transaction recorded them in the changelog only.
        self._group_behind: int | None = None
        self._group_behind_since = 0.0  # since when (monotonic) the group has lagged
        self._gone_inboxes: dict[str, float] = {}  # inbox -> until when (monotonic) it counts as gone
        # The documents (point_reads.changed keys) that events applied to the state but not yet
        # committed change; None: some such event may change what any read sees.
        self._uncommitted: set[bytes] | None = set()
        # Commands fetched while the last transaction was in flight and not answered then, and
        # the offset after the last command fetched then (answered or not); None: nothing fetched.
        self._carried: list[Message] = []
        self._carried_end: int | None = None
        self._assigned = asyncio.Event()
        self._assigned_at = 0.0  # when the group gave us the partition (monotonic)
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
        processor = self

        class Listener:
            async def on_revoked(self, revoked: Collection[int]) -> None:
                if processor.partition in revoked:
                    async with processor._lock:
                        processor._assigned.clear()
                        await processor._deactivate("partition revoked")

            async def on_assigned(self, assigned: Collection[int]) -> None:
                if processor.partition in assigned:
                    processor._assigned_at = time.monotonic()
                    processor._assigned.set()

        self._member = member = self.bus.member(
            self.group_id,
            self.command_topic,
            client_id=self.name,
            listener=Listener(),
            session_timeout_ms=self.session_timeout_ms,
        )
        await member.start()
        try:
            while True:
                if not self._assigned.is_set():
                    # Standby: heartbeat through polls until the partition is ours, and keep
                    # the projection warm so that taking over needs only a short catch-up.
                    await member.poll(timeout_s=0.1)
                    if not self._assigned.is_set():  # (just assigned: activate without another wait)
                        await self.projection.poll(timeout_ms=100)
                    continue
                if not self.active.is_set():
                    if time.monotonic() < self._hold_until:  # fenced: let the group speak first
                        member.pause(self.partition)  # (activation seeks to where the commands resume)
                        await member.poll(timeout_s=0.1)
                        continue
                    await self._activate()
                    continue
                await self._serve_batch()
                if (
                    self._group_behind is not None
                    and time.monotonic() - self._group_behind_since >= READ_OFFSETS_COMMIT_S
                ):
                    await self._guarded(self._commit_group_offset)
        finally:
            await self._deactivate("stopping")
            await member.stop()

    async def _activate(self) -> None:
        async with self._lock:
            if not self._assigned.is_set():
                return
            t0 = time.monotonic()
            member = self.member
            member.pause(self.partition)  # nothing is fetched until the committed offset is known
            # linger 0: a phase's records are all queued before the sender runs (nothing awaits
            # in between), so lingering only delays each phase of every transaction.
            # retry_backoff_ms: a transaction begun while the broker still writes the previous one's
            # markers is refused (CONCURRENT_TRANSACTIONS, ~a third of a busy shard's transactions)
            # and retried after this backoff; the markers take a few ms.
            self._producer = self.bus.transactional_producer(
                self.transactional_id,
                client_id=self.name,
                batch_bytes=self.batch_bytes,
                retry_backoff_ms=TRANSACTION_RETRY_BACKOFF_MS,
            )
            await self._producer.start()  # init_transactions: fences every earlier owner
            t_fenced = time.monotonic()
            if self.plain_read is not None:
                self._read_producer = self.bus.producer(client_id=f"{self.name}-reads")
                await self._read_producer.start()
            # Only now is the committed offset final (the fenced owner cannot commit any more; its
            # last transactions are complete, their markers written: init_transactions waits).
            committed = await member.committed(self.partition)
            # A standby's state is its store at its position: rewind, don't reload (O(state)).
            self.projection.rewind()
            t_committed = time.monotonic()
            at = await self.projection.catch_up()
            # And only now is the position recorded in the changelog final: the transactions that
            # wrote events recorded it there instead of in the group.  Resume after both.
            recorded = self.projection.command_end
            start = max(committed or 0, recorded or 0)
            member.seek(self.partition, start)
            if start != (committed or 0):  # the group learns it soon (lag monitoring)
                self._group_behind, self._group_behind_since = start, time.monotonic()
            member.resume(self.partition)
            done = time.monotonic()
            # Where a take-over's time goes (bench/bench_takeover.py reads it from the readiness file).
            self.last_activation = {
                "fenceS": round(t_fenced - t0, 4),
                "committedS": round(t_committed - t_fenced, 4),
                "catchUpS": round(done - t_committed, 4),
                "totalS": round(done - t0, 4),
                "sinceAssignedS": round(done - self._assigned_at, 4),
            }
            self.active.set()
            self.on_role("active")
            log.info(
                "%s: active at ConfigTime %d, commands from offset %d (group's %s, changelog's %s); "
                "%.3fs after the assignment (fence %.3fs, committed offset %.3fs, catch-up %.3fs)",
                self.name,
                at,
                start,
                committed,
                recorded,
                done - self._assigned_at,
                t_fenced - t0,
                t_committed - t_fenced,
                done - t_committed,
            )

    async def _deactivate(self, why: str) -> None:
        was = self.active.is_set()
        self.active.clear()
        if was and self._group_behind is not None and self._producer is not None:
            # Answered reads' offsets, so that the next owner does not answer them again (to
            # inboxes that may be gone by then), and the group's offset current; a producer in
            # a failed transaction cannot.
            try:
                await self._commit_group_offset()
            except Exception as e:
                log.info("%s: answered commands' offsets not committed (%s: %s)", self.name, type(e).__name__, e)
        if self._producer is not None:
            try:
                await self._producer.stop()
            except Exception:  # a fenced producer may refuse to close cleanly
                pass
            self._producer = None
        if self._read_producer is not None:
            try:
                await self._read_producer.stop()
            except Exception:
                pass
            self._read_producer = None
        # Uncommitted read offsets: the next owner answers those reads again; and decides the
        # commands fetched meanwhile (activation seeks to where the last commit left them).
        self._read_sends, self._group_behind = [], None
        self._carried, self._carried_end = [], None
        self._uncommitted = set()  # a failed batch has already reset the state from the store
        if was:
            # Events applied while active moved the store, not the projection's consumer: seek it
            # to the state's position so standby polling applies nothing twice.  (No batch is in
            # flight here; a failed one has already reset the state from the store.)
            self.projection.rewind()
            self.on_role("standby")
            log.info("%s: standing by (%s)", self.name, why)

    # ------------------------------------------------------------- serving

    def settled(self) -> bool:
        """No batch is being decided: every event applied to the state is committed to the log."""
        return not self._lock.locked()

    async def _serve_batch(self) -> None:
        if self._carried:  # fetched while the last transaction was in flight: they come first
            records, end = self._carried, self._carried_end
            self._carried, self._carried_end = [], None
        else:
            batch = await self.member.poll(timeout_s=0.1, max_records=self.max_batch)
            records, end = batch.get(self.partition) or [], None
        if not records:
            return
        if self.prepare is not None:
            await self.prepare(records)
        await self._guarded(lambda: self._serve(records, end if end is not None else records[-1].offset + 1))

    async def _serve(self, records: list[Message], end: int) -> None:
        """Serve `records`; `end` is the offset after them (or after the last command answered
        past them while the previous transaction was in flight)."""
        if self._read_producer is not None:
            rest = await self._answer_reads(records)
        else:
            rest = [(rec, None) for rec in records]
        if rest:
            await self._transact_answering(rest, end)
        else:
            self._group_lags(end)

    def _group_lags(self, end: int) -> None:
        """The consumer group has not got `end` (the offset after commands answered): plain reads
        no transaction carried, or a transaction that recorded it in the changelog only.  The
        group gets it within READ_OFFSETS_COMMIT_S, with a transaction or alone."""
        if self._group_behind is None:
            self._group_behind_since = time.monotonic()
        self._group_behind = end

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` (a transaction) holding the lock; a failed transaction stands this instance by."""
        async with self._lock:
            if not self.active.is_set():
                return  # revoked while fetching: the new owner decides these
            try:
                await work()
            except BusError as e:  # Fenced among them
                # Someone else owns the log now (or the transaction failed): forget the
                # in-memory state this batch built and rebuild it from the store.
                self.fenced = isinstance(e, Fenced)
                log.error(
                    "%s: transaction failed (%s: %s); reloading state and standing by", self.name, type(e).__name__, e
                )
                # If the group moved the partition, revocation tells us within a session
                # timeout; if it is still ours after that (we were fenced by a zombie), activating
                # again fences it in turn and re-reads the committed offset.
                self.projection.reset()
                await self._deactivate(type(e).__name__)
                if self.fenced:
                    self._hold_until = time.monotonic() + self.session_timeout_ms / 1000

    # ------------------------------------------------- plain reads, outside

    async def _answer_reads(self, records: list[Message]) -> list[tuple[Message, Head | None]]:
        """Answer the batch's plain reads outside any transaction, from the committed state, before
        any command of the batch is decided; returns the others, in order, for the transaction,
        with what is known of each (decoded; decided too for a read that wrote after all: from it
        on, every command goes to the transaction).  A read fetched after a write of the same batch
        is answered as if before it: that write is not acknowledged until the batch commits, so
        the two are concurrent (docs/reference/command-processor.md)."""
        assert self.plain_read is not None
        rest: list[tuple[Message, Head | None]] = []
        for i, rec in enumerate(records):
            try:
                command = self.codec.decode(rec.value)
            except RecordError:
                rest.append((rec, None))  # a dead letter is a write: the transaction's
                continue
            if not self.plain_read(command):
                rest.append((rec, Head(command)))
                continue
            span = self._read_span(rec, command)
            with trace.use_span(span, end_on_exit=False):
                decided = self._decide(rec, command)
                if decided.events:  # it wrote after all (a rekey): it and the rest are the transaction's
                    rest.append((rec, Head(command, span, decided)))
                    rest.extend((r, None) for r in records[i + 1 :])
                    break
                await self._reply_read(rec, decided.reply, span)
            span.end()
        return rest

    def _read_span(self, rec: Message, command: Record) -> trace.Span:
        span = tracing.tracer.start_span(
            f"{self.name} {command.type}",
            context=tracing.extract(rec.headers),
            kind=trace.SpanKind.CONSUMER,
            attributes=tracing.record_attributes(rec),
        )
        if span.is_recording():
            span.set_attributes(tracing.db_attributes(getattr(command, "ns", None), command.type))
        return span

    async def _reply_read(self, rec: Message, reply: Reply, span: trace.Span) -> None:
        """Send a plain read's reply outside any transaction (its inbox's second partition when
        it has one); its ConfigTime is the committed position."""
        p = self._read_producer
        assert p is not None
        self.commands_done += 1
        reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
        if not reply.ok:
            span.set_attribute("shardlog.error", reply.code or "")
        if not reply_to:
            return
        update: dict[str, Any] = {"configTime": self.projection.position}
        if self.clock is not None:
            update["operationTime"] = self.clock.cluster_time
        headers = tracing.inject([(CORRELATION_ID, corr)] if corr else [])
        if self.clock is not None:
            headers = [*headers, (VECTOR_TIME, self.clock.gossip_out())]
        reply = reply.model_copy(update=update)
        inbox = reply_to.decode()
        partitions = await self._inbox_partitions(p, inbox)  # known after the first: no pause
        if partitions is not None:
            to = UNTRANSACTED_REPLIES_PARTITION if UNTRANSACTED_REPLIES_PARTITION in partitions else None
            send = await p.send(inbox, Codec.encode(reply), headers=headers, partition=to)
            self._read_sends.append((send, to is None))

    # ------------------------------------------ point reads, during a transaction

    async def _transact_answering(self, commands: list[tuple[Message, Head | None]], end: int) -> None:
        """`_transact`, and meanwhile answer the point reads fetched after its commands whose
        document none of its events touches; the other commands fetched meanwhile are carried
        to the next batch."""
        if self.point_reads is None or self._read_producer is None:
            await self._transact(commands, end)
            return
        txn = asyncio.ensure_future(self._transact(commands, end))
        try:
            answered_end = await self._answer_meanwhile(txn)
        except BaseException:
            txn.cancel()
            await asyncio.gather(txn, return_exceptions=True)
            raise
        await txn  # its failure is the batch's
        if answered_end is not None:
            if self._carried:
                self._carried_end = answered_end  # the next transaction commits their offsets too
            else:
                self._group_lags(answered_end)

    async def _answer_meanwhile(self, txn: asyncio.Future[None]) -> int | None:
        """Until `txn` ends: fetch, answer the point reads it cannot change, carry the rest.
        Returns the offset after the last command fetched (None: none was)."""
        point_reads, plain_read = self.point_reads, self.plain_read
        assert point_reads is not None and plain_read is not None
        member, end = self.member, None
        while not txn.done() and len(self._carried) < self.max_batch:
            fetch = asyncio.ensure_future(member.poll(timeout_s=0.1, max_records=self.max_batch - len(self._carried)))
            either: list[asyncio.Future[Any]] = [txn, fetch]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done():
                fetch.cancel()  # nothing is taken from the fetcher's buffer but when it returns
            records = (await asyncio.gather(fetch, return_exceptions=True))[0]
            if isinstance(records, BaseException):
                if isinstance(records, asyncio.CancelledError):
                    continue
                raise records
            batch = records.get(self.partition) or []
            if not batch:
                continue
            end = batch[-1].offset + 1
            if self.prepare is not None:
                await self.prepare(batch)
            for rec in batch:
                if not await self._answer_point_read(rec, point_reads, plain_read):
                    self._carried.append(rec)
        return end

    async def _answer_point_read(
        self, rec: Message, point_reads: PointReads, plain_read: Callable[[Record], bool]
    ) -> bool:
        """Answer `rec` now if it is a point read of a document no uncommitted event changes."""
        uncommitted = self._uncommitted
        if uncommitted is None:
            return False
        try:
            command = self.codec.decode(rec.value)
        except RecordError:
            return False
        if not plain_read(command) or (key := point_reads.key(command)) is None or key in uncommitted:
            return False
        span = self._read_span(rec, command)
        with trace.use_span(span, end_on_exit=False):
            decided = self._decide(rec, command)
            if decided.events:  # it writes after all (a rekey): the next transaction decides it again
                span.end()
                return False
            await self._reply_read(rec, decided.reply, span)
        span.end()
        return True

    async def _inbox_partitions(self, p: Producer, inbox: str) -> set[int] | None:
        """The partitions of a requester's inbox, or None when it is gone (its reply is dropped:
        nobody waits for it)."""
        if self._gone_inboxes and time.monotonic() < self._gone_inboxes.get(inbox, 0.0):
            return None
        try:
            partitions: set[int] = await aio.wait_for(p.partitions_for(inbox), INBOX_WAIT_S)
            return partitions
        except (TimeoutError, BusError):
            log.warning("%s: inbox %s not found within %gs: its replies are dropped", self.name, inbox, INBOX_WAIT_S)
            self._gone_inboxes[inbox] = time.monotonic() + GONE_INBOX_S
            return None

    async def _reads_acked(self, *, shared: bool = False) -> None:
        """Every read reply sent so far is acked: before a commit takes their offsets (a lost reply
        fails the commit, so the read is answered again); `shared`: only those sent to a partition
        that transactional replies use too, before a transaction's replies go out (a read's reply
        queued behind our open transaction on the same inbox partition would stay invisible to
        read_committed consumers until it commits)."""
        sends = self._read_sends
        self._read_sends = [(f, on_shared) for f, on_shared in sends if not on_shared] if shared else []
        for f, on_shared in sends:
            if on_shared or not shared:
                await f

    async def _commit_group_offset(self) -> None:
        """No transaction came to give the consumer group the answered commands' offsets (plain
        reads', or those recorded in the changelog only): commit them alone."""
        offset = self._group_behind
        if offset is None:
            return
        await self._reads_acked()
        p = self.producer
        await p.begin()
        await p.send_offsets(self.group_id, self.command_topic, self.partition, offset)
        await p.commit()
        if self._group_behind == offset:
            self._group_behind = None

    # -------------------------------------------------------- transactions

    def _decide(self, rec: Message, command: Record | None) -> Decided:
        """One command's decision, its events stamped and encoded, as a reply; a record that does
        not decode (`command` None) is decoded here and may become a dead letter."""
        clock = self.clock
        if clock is not None:
            clock.gossip_in(header(rec.headers, VECTOR_TIME))
        events: list[Record] = []
        values: list[bytes | None] = []
        bulk: BulkEvents | None = None
        bulk_records: tuple[list[bytes], list[bytes]] = ([], [])
        op_time: int | None = None  # the command's last stamp
        try:
            if command is None:
                command = self.codec.decode(rec.value)
                span = trace.get_current_span()
                span.update_name(f"{self.name} {command.type}")
                if span.is_recording():
                    span.set_attributes(tracing.db_attributes(getattr(command, "ns", None), command.type))
            decision = self.decide(command)
            events, bulk = decision.events, decision.bulk
            if bulk is not None and len(bulk):
                # Stamped first: the bulk records precede the decision's events in the log.
                wall = time.time()
                ticks = [clock.tick(wall) for _ in range(len(bulk))] if clock is not None else None
                bulk_records = bulk.encode(ticks)
                op_time = ticks[-1] if ticks else None
            if clock is not None:
                events = [self._stamp(clock, e) for e in events]
                op_time = next((e.ts for e in reversed(events) if stamped(e)), op_time)  # type: ignore[attr-defined]
            # Encode every event before applying any: an event that cannot be written
            # must refuse the command, not leave state the log will never show.
            values = [_value(event) for event in events]
            reply = Reply(ok=True, result=decision.result)
        except RecordError as e:
            return Decided(Reply(ok=False, code="BadRecord", error=e.reason), dead_letter=e.reason)
        except CommandError as e:
            reply = Reply(ok=False, code=e.code, error=e.message, result=e.info)
        except Exception as e:  # a bug in deciding must not wedge the log: report it, decide nothing
            log.error("%s: command at offset %d failed:\n%s", self.name, rec.offset, traceback.format_exc())
            reply = Reply(ok=False, code="InternalError", error=f"{type(e).__name__}: {e}")
        if not reply.ok:
            return Decided(reply, command)
        return Decided(reply, command, events, values, op_time, bulk=bulk, bulk_records=bulk_records)

    async def _transact(self, commands: list[tuple[Message, Head | None]], end: int) -> None:
        """Decide `commands` (with what is known of each) in one transaction that commits the
        consumed offsets up to `end`."""
        # Per command, a process span (its consumption and decision) and below it a span of the
        # batch's transaction, in that command's trace: both end when the transaction does.
        spans: list[trace.Span] = []
        transactions: list[trace.Span] = []
        began = time.time_ns()
        try:
            await self._transact_traced(commands, end, began, spans, transactions)
        except BaseException as e:
            for t in transactions:
                t.record_exception(e)
                t.set_status(trace.StatusCode.ERROR, f"{type(e).__name__}: {e}")
            raise
        finally:
            for t in transactions:
                t.end()
            for t in spans:
                t.end()
            for _, known in commands:
                if known is not None and known.span is not None and known.span not in spans:
                    known.span.end()

    async def _transact_traced(
        self,
        commands: list[tuple[Message, Head | None]],
        end: int,
        began: int,
        spans: list[trace.Span],
        transactions: list[trace.Span],
    ) -> None:
        p = self.producer
        events_topic = self.projection.topic
        await p.begin()
        # The consumed offsets (up to `end`, past the plain reads answered before this batch's
        # transaction too) commit with it in one of two places.  A transaction that writes events
        # records them on its events (the COMMAND_END header: no AddOffsetsToTxn, TxnOffsetCommit
        # and __consumer_offsets marker, most of a small transaction's cost to the broker); one
        # that writes none commits them to the consumer group.  Its first write decides which.
        # The group also gets them when it has lagged half of READ_OFFSETS_COMMIT_S (lag
        # monitoring), so that under load it follows without transactions of their own.
        # Kafka 4 verifies a transaction's first write to each partition with the transaction
        # coordinator (KIP-890); meeting the coordinator mid-change of the same transaction (the
        # consumer offsets' AddOffsetsToTxn, or adding another partition) answers aiokafka's
        # produce as NOT_ENOUGH_REPLICAS, retried and logged as a warning on a healthy broker.
        # So the coordinator's changes come first: the group's offsets before any write, and each
        # phase's partitions (events, then replies) are added together before their first write.
        to_group = (
            self._group_behind is not None and time.monotonic() - self._group_behind_since >= READ_OFFSETS_COMMIT_S / 2
        )
        if to_group:
            await p.send_offsets(self.group_id, self.command_topic, self.partition, end)
        wrote_events = False

        async def group_first() -> None:
            """Before a write that is not an event, when no event came first: the group takes the
            offsets (the transaction may write no event at all), before that write."""
            nonlocal to_group
            if not (to_group or wrote_events):
                await p.send_offsets(self.group_id, self.command_topic, self.partition, end)
                to_group = True

        recorded = [(COMMAND_END, str(end).encode())]  # on every event: any of them that compaction keeps tells
        records = [rec for rec, _ in commands]
        if self.one_phase is not None:
            # Replies go out with the events: every read reply must be below them on its inbox
            # (_reads_acked), and every inbox's metadata known, so that no send pauses between
            # the events and replies the sender should take in one request.
            await self._reads_acked(shared=True)
            for to in {to for r in records if (to := header(r.headers, REPLY_TO))}:
                await self._inbox_partitions(p, to.decode())
        # Per command: the futures of its events (each with how many records past the one it names
        # it covers: a bulk batch's names its first), its reply and where to send it (or None), its headers.
        pending: list[tuple[list[tuple[Awaitable[int], int]], tuple[Reply, bytes] | None, tracing.Headers]] = []
        last_value: bytes | None = None  # the batch's last event, for the checkpoint's fingerprint (None: a tombstone)
        for rec, known in commands:
            reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
            if known is not None and known.span is not None:
                span = known.span
            else:
                span = tracing.tracer.start_span(
                    f"{self.name} process" if known is None else f"{self.name} {known.command.type}",
                    context=tracing.extract(rec.headers),
                    kind=trace.SpanKind.CONSUMER,
                    attributes=tracing.record_attributes(rec),
                )
                if known is not None and span.is_recording():
                    cmd = known.command
                    span.set_attributes(tracing.db_attributes(getattr(cmd, "ns", None), cmd.type))
            spans.append(span)
            with trace.use_span(span, end_on_exit=False):
                futures: list[tuple[Awaitable[int], int]] = []
                if known is not None and known.decided is not None:
                    decided = known.decided
                else:
                    decided = self._decide(rec, known.command if known is not None else None)
                reply = decided.reply
                if decided.dead_letter is not None:
                    await group_first()  # the first write may not be an event
                    await p.send(
                        self.dead_letters,
                        rec.value,
                        key=rec.key,
                        headers=_dead_letter_headers(rec, decided.dead_letter),
                    )
                # The batch's transaction as this command's trace sees it: its events are
                # written inside it (their producer spans are its children).
                txn = tracing.tracer.start_span(
                    f"{self.name} transaction",
                    start_time=began,
                    attributes={
                        "messaging.system": tracing.KAFKA,
                        "shardlog.transaction.id": self.transactional_id,
                        "shardlog.transaction.commands": len(records),
                    },
                )
                transactions.append(txn)
                events, values = decided.events, decided.values
                if reply.ok:
                    # Applying a decided event cannot fail but through a bug; if it does, the
                    # exception aborts the whole transaction rather than commit half a command.
                    bulk, (keys, bulk_values) = decided.bulk, decided.bulk_records
                    if bulk is not None and bulk_values:
                        # A clone batch: whole producer batches under one span, no header per record
                        # but the position on its last.
                        wrote_events = True
                        with trace.use_span(txn, end_on_exit=False):
                            self._uncommitted = None  # a clone batch: no point read before the commit
                            bulk.apply()
                            attributes: dict[str, AttributeValue] = {
                                "shardlog.event": bulk.kind,
                                "shardlog.events": len(bulk_values),
                            }
                            with tracing.producer_span(events_topic, **attributes):
                                futures += await p.send_many(
                                    events_topic, self.projection.partition, keys, bulk_values, recorded
                                )
                            last_value = bulk_values[-1]
                    # One producer span for the command's events (a span and a traceparent per
                    # event cost more than the rest of a small write's sending).
                    if events:
                        with (
                            trace.use_span(txn, end_on_exit=False),
                            tracing.producer_span(events_topic, **{"shardlog.events": [e.type for e in events]}),
                        ):
                            wrote_events = True
                            event_headers = tracing.inject(recorded)
                            if self.point_reads is not None:
                                self._note_uncommitted(events)
                            for event, value in zip(events, values):
                                self.projection.state.apply(event, -1)  # its offset is known once acked
                                key = event.key if isinstance(event, Tombstone) else self.event_key(event)
                                futures.append((await p.send(events_topic, value, key=key, headers=event_headers), 0))
                                last_value = value
                    txn.set_attribute("shardlog.transaction.events", len(events) + len(bulk_values))
                if not reply.ok:
                    span.set_attribute("shardlog.error", reply.code or "")
                headers = [(CORRELATION_ID, corr)] if corr else []
                if self.clock is not None:
                    reply = reply.model_copy(update={"operationTime": decided.op_time or self.clock.cluster_time})
                if reply_to and self._gone_inboxes and time.monotonic() < self._gone_inboxes.get(reply_to.decode(), 0):
                    reply_to = None  # its requester is gone
                if (
                    reply_to
                    and self.one_phase is not None
                    and (decided_command := decided.command) is not None
                    and self.one_phase(decided_command)
                ):
                    # One phase: no reader sees it before the commit (read_committed), and the commit
                    # waits for every ack; its position is the batch's start (a lower bound).
                    await group_first()  # the first write may not be an event
                    early = reply.model_copy(update={"configTime": self.projection.position})
                    early_headers = tracing.inject(headers)
                    if self.clock is not None:
                        early_headers = [*early_headers, (VECTOR_TIME, self.clock.gossip_out())]
                    await p.send(reply_to.decode(), Codec.encode(early), headers=early_headers, partition=0)
                    reply_to = None
                to_send = (reply, reply_to) if reply_to else None
                pending.append((futures, to_send, tracing.inject(headers) if to_send else []))
        await group_first()  # no event: before any reply
        # Events must be acked before replies can name the ConfigTime that shows them; every
        # event is, before the first reply goes out (so the replies' partitions join together).
        last_offset: int | None = None
        answers: list[tuple[str, Reply, tracing.Headers]] = []
        for futures, to_send, reply_headers in pending:
            for f, more in futures:
                last_offset = await f + more
            if to_send is not None:
                answer, reply_to = to_send
                at = (
                    last_offset + 1 if last_offset is not None else self.projection.position
                )  # events so far in this batch count
                answers.append((reply_to.decode(), answer.model_copy(update={"configTime": at}), reply_headers))
        reachable = {inbox for inbox in {inbox for inbox, _, _ in answers} if await self._inbox_partitions(p, inbox)}
        await self._reads_acked()
        for inbox, answer, reply_headers in answers:
            if inbox not in reachable:
                continue  # its requester is gone
            if self.clock is not None:
                reply_headers = [*reply_headers, (VECTOR_TIME, self.clock.gossip_out())]
            await p.send(inbox, Codec.encode(answer), headers=reply_headers, partition=0)  # not the reads'
        fault_point(f"{self.name}.before_commit", tag=_tag(records))
        await p.commit()
        fault_point(f"{self.name}.after_commit", tag=_tag(records))
        self.commands_done += len(records)
        if to_group:
            self._group_behind = None  # this commit took them (reads answered meanwhile come after)
        else:
            self._group_lags(end)  # recorded in the changelog only
        if last_offset is not None:
            self.projection.advance(last_offset + 1, fingerprint(last_value), end)
        self._uncommitted = set()  # the state is all committed again

    def _note_uncommitted(self, events: list[Record]) -> None:
        """Before `events` are applied: the documents they change stop being readable until the
        commit (a point read of one of them waits for the next batch)."""
        assert self.point_reads is not None
        for event in events:
            if self._uncommitted is None:
                return
            changed = self.point_reads.changed(event)
            if changed is None:
                self._uncommitted = None
            else:
                self._uncommitted.update(changed)

    @staticmethod
    def _stamp(clock: Gossip, event: Record) -> Record:
        return event.model_copy(update={"ts": clock.tick()}) if stamped(event) else event


def _value(event: Record) -> bytes | None:
    """An event as its log stores it: JSON, or a null value for a tombstone (which needs a key)."""
    if isinstance(event, Tombstone):
        if not event.key:
            raise ValueError("a tombstone needs a key")
        return None
    return Codec.encode(event)


def _tag(records: list[Message]) -> str:
    """A fault-point tag: the text of the last command, so a test can aim at one command."""
    try:
        return (records[-1].value or b"").decode()
    except Exception:
        return ""


def _dead_letter_headers(rec: Message, reason: str) -> list[tuple[str, bytes]]:
    return [
        ("dlq.reason", reason.encode()),
        ("dlq.topic", rec.topic.encode()),
        ("dlq.partition", str(rec.partition).encode()),
        ("dlq.offset", str(rec.offset).encode()),
        *[(k, v) for k, v in (rec.headers or ()) if k in (REPLY_TO, CORRELATION_ID)],
    ]
