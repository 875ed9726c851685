"""Reads outside any transaction (docs/reference/command-processor.md, "Plain reads outside the
transaction" and "Point reads during a transaction").

A service's plain reads (a shard's Find / Count without afterClusterTime) write nothing.  At the
head of a batch they are answered at once from the committed state through a plain producer;
while a batch's transaction is in flight, the point reads fetched meanwhile whose document none of
its events touches are too.  Their offsets commit with the next transaction, or alone within
READ_OFFSETS_COMMIT_S."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from libs import tracing
from libs.bus import Message, Producer
from libs.commands.batch import Head, Pending
from libs.commands.decision import Decided, Gossip, PointReads, header
from libs.commands.inboxes import Inboxes
from libs.commands.settings import UNTRANSACTED_REPLIES_PARTITION
from libs.commands.traced import consumer_span
from libs.headers import CORRELATION_ID, REPLY_TO, VECTOR_TIME
from schemas import Codec, Record, RecordError
from schemas.reply import Reply

if TYPE_CHECKING:
    from libs.commands.processor import CommandProcessor


class Uncommitted:
    """The documents (PointReads.changed keys) that events applied to the state but not yet
    committed change; `keys` None: some such event may change what any read sees."""

    def __init__(self) -> None:
        self.keys: set[bytes] | None = set()

    def note(self, events: Iterable[Record], point_reads: PointReads | None) -> None:
        """Before `events` are applied: the documents they change stop being readable until the
        commit (a point read of one of them waits for the next batch)."""
        if point_reads is None:
            return
        for event in events:
            if self.keys is None:
                return
            changed = point_reads.changed(event)
            if changed is None:
                self.keys = None
            else:
                self.keys.update(changed)

    def everything(self) -> None:
        self.keys = None

    def readable(self, key: bytes) -> bool:
        return self.keys is not None and key not in self.keys

    def clear(self) -> None:
        self.keys = set()


class ReadReplies:
    """Plain reads' replies, through an idempotent producer, each remembered until acked with
    whether it went to a partition that transactional replies use too (an inbox with one)."""

    def __init__(self, inboxes: Inboxes, clock: Gossip | None) -> None:
        self.inboxes, self.clock = inboxes, clock
        self.producer: Producer | None = None  # while active
        self._sends: list[tuple[Awaitable[int], bool]] = []

    async def send(self, rec: Message, reply: Reply, position: int) -> None:
        """The reply to the inbox `rec` names (its second partition when it has one), naming the
        committed position `position`."""
        p, reply_to = self.producer, header(rec.headers, REPLY_TO)
        assert p is not None
        if not reply_to:
            return
        corr = header(rec.headers, CORRELATION_ID)
        update: dict[str, Any] = {"configTime": position}
        headers = tracing.inject([(CORRELATION_ID, corr)] if corr else [])
        if self.clock is not None:
            update["operationTime"] = self.clock.cluster_time
            headers = [*headers, (VECTOR_TIME, self.clock.gossip_out())]
        partitions = await self.inboxes.partitions(p, reply_to.decode())
        if partitions is not None:
            to = UNTRANSACTED_REPLIES_PARTITION if UNTRANSACTED_REPLIES_PARTITION in partitions else None
            sent = await p.send(
                reply_to.decode(), Codec.encode(reply.model_copy(update=update)), headers=headers, partition=to
            )
            self._sends.append((sent, to is None))

    async def acked(self, *, shared: bool = False) -> None:
        """Every reply sent so far is acked: before a commit takes their offsets (a lost reply
        fails the commit, so the read is answered again); `shared`: only those sent to a partition
        that transactional replies use too, before a transaction's replies go out (one queued
        behind our open transaction would stay invisible to read_committed readers until then)."""
        sends = self._sends
        self._sends = [(f, on_shared) for f, on_shared in sends if not on_shared] if shared else []
        for f, on_shared in sends:
            if on_shared or not shared:
                await f

    def forget(self) -> None:
        """Standing by: unacked replies' reads are answered again by the next owner."""
        self._sends = []


# ----------------------------------------------------------------- at the head of a batch


async def answer_reads(p: CommandProcessor, records: list[Message]) -> list[Pending]:
    """Answer the batch's plain reads before any command of it is decided; returns the others, in
    order, for the transaction, with what is known of each (decoded; decided too for a read that
    wrote after all: from it on, every command goes to the transaction).  A read fetched after a
    write of the same batch is answered as if before it: that write is not acknowledged until the
    batch commits, so the two are concurrent."""
    rest: list[Pending] = []
    for i, rec in enumerate(records):
        try:
            command = p.codec.decode(rec.value)
        except RecordError:
            rest.append(Pending(rec, None))  # a dead letter is a write: the transaction's
            continue
        if not p.policy.is_plain_read(command):
            rest.append(Pending(rec, Head(command)))
            continue
        span, decided = _read(p, rec, command)
        if decided.events:  # it wrote after all (a rekey): it and the rest are the transaction's
            rest.append(Pending(rec, Head(command, span, decided)))
            rest.extend(Pending(r, None) for r in records[i + 1 :])
            break
        await _reply(p, rec, decided, span)
    return rest


def _read(p: CommandProcessor, rec: Message, command: Record) -> tuple[trace.Span, Decided]:
    span = consumer_span(p.name, rec, command)
    with trace.use_span(span, end_on_exit=False):
        return span, p.decider(rec.value, rec.headers, rec.offset, command)


async def _reply(p: CommandProcessor, rec: Message, decided: Decided, span: trace.Span) -> None:
    p.commands_done += 1
    if not decided.reply.ok:
        span.set_attribute("shardlog.error", decided.reply.code or "")
    with trace.use_span(span, end_on_exit=True):
        await p.reads.send(rec, decided.reply, p.projection.position)


# ------------------------------------------------------------- while a transaction runs


async def answer_meanwhile(p: CommandProcessor, txn: asyncio.Future[None]) -> int | None:
    """Until `txn` ends: fetch, answer the point reads it cannot change, carry the rest to the
    next batch.  Returns the offset after the last command fetched (None: none was)."""
    end = None
    while not txn.done() and len(p.carried) < p.max_batch:
        batch = await _fetch_unless_done(p, txn)
        if not batch:
            continue
        end = batch[-1].offset + 1
        await p.policy.prepare(batch)
        for rec in batch:
            if not await _answer_point_read(p, rec):
                p.carried.append(rec)
    return end


async def _fetch_unless_done(p: CommandProcessor, txn: asyncio.Future[None]) -> list[Message]:
    """A fetch of the commands after those in flight, given up when `txn` ends first (nothing is
    taken from the fetcher's buffer but when it returns)."""
    fetch = asyncio.ensure_future(p.member.poll(timeout_s=0.1, max_records=p.max_batch - len(p.carried)))
    either: list[asyncio.Future[Any]] = [txn, fetch]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not fetch.done():
        fetch.cancel()
    records = (await asyncio.gather(fetch, return_exceptions=True))[0]
    if isinstance(records, asyncio.CancelledError):
        return []
    if isinstance(records, BaseException):
        raise records
    return records.get(p.partition) or []


async def _answer_point_read(p: CommandProcessor, rec: Message) -> bool:
    """Answer `rec` now if it is a point read of a document no uncommitted event changes."""
    point_reads = p.policy.point_reads
    if point_reads is None or p.uncommitted.keys is None:
        return False
    try:
        command = p.codec.decode(rec.value)
    except RecordError:
        return False
    if not p.policy.is_plain_read(command) or (key := point_reads.key(command)) is None:
        return False
    if not p.uncommitted.readable(key):
        return False
    span, decided = _read(p, rec, command)
    if decided.events:  # it writes after all (a rekey): the next transaction decides it again
        span.end()
        return False
    await _reply(p, rec, decided, span)
    return True
