"""Command processor: consume commands, decide against current state, and emit
events, replies and the consumed offsets in ONE Kafka transaction.

- Exactly once: events, replies, dead letters and the command offsets commit
  together; a crash before the commit leaves no trace and the commands are
  decided again by whoever takes over.
- Group commit: every command of a fetched batch shares one transaction.
- One active instance: the member of the consumer group that owns the
  command topic's single partition.  It fences any earlier owner by starting
  a transactional producer with the stable id `<group>.<partition>`, catches
  its projection up to the tip of the event log, then serves.  Standbys wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced
from aiokafka.structs import RecordMetadata
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from libs import kafka, tracing
from libs.faults import fault_point
from libs.projection import Projection, fingerprint
from schemas import Codec, Record, RecordError, Tombstone
from schemas.reply import Reply

log = logging.getLogger(__name__)

REPLY_TO, CORRELATION_ID = "reply-to", "correlation-id"
# How long a reply waits for its inbox's metadata before the inbox counts as gone (its requester
# deleted it), and how long it then counts as gone before it is looked up again.
INBOX_WAIT_S = 2.0
GONE_INBOX_MEMORY_S = 60.0
VECTOR_TIME = "vector-time"  # the vector clock's gossip on every request and reply (docs/decisions/0014)


class Gossip(Protocol):
    """What the runtime needs of a vector clock (domain.clock.VectorClock): tick once per stamped
    event, advance from a request's `vector-time` header, put its own on replies."""

    @property
    def cluster_time(self) -> int: ...

    def tick(self, wall: float | None = None) -> int: ...

    def gossip_in(self, raw: bytes | None) -> None: ...

    def gossip_out(self) -> bytes: ...


_STAMPED: dict[type, bool] = {}


def stamped(record: Record) -> bool:
    """Does this kind of event carry a ClusterTime stamp (a `ts` field)?"""
    kind = type(record)
    if (has := _STAMPED.get(kind)) is None:
        has = _STAMPED[kind] = "ts" in kind.model_fields
    return has


class CommandError(Exception):
    """A command refused by the domain: `code` (MongoDB's name where one exists) and a message."""

    def __init__(self, code: str, message: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.info = (
            code,
            message,
            info,
        )  # info: details for the caller (e.g. StaleConfig's versions)


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


def header(headers: tracing.Headers | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


class CommandProcessor:
    def __init__(
        self,
        *,
        bootstrap: str,
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
        prepare: Callable[[list[kafka.KafkaRecord]], Awaitable[None]] | None = None,
        clock: Gossip | None = None,
        batch_bytes: int = 1024 * 1024,
    ) -> None:
        self.bootstrap, self.command_topic, self.codec = bootstrap, command_topic, command_codec
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
        self.tp = TopicPartition(command_topic, 0)
        self.transactional_id = f"{group_id}.{self.tp.partition}"
        self.active = asyncio.Event()
        self.fenced = False
        self.commands_done = 0
        self._lock = asyncio.Lock()  # held for a whole transaction; revocation waits for it
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None  # transactional, while active
        self._assigned = asyncio.Event()
        self._assigned_at = 0.0  # when the group gave us the partition (monotonic)
        self.last_activation: dict[str, float] = {}  # the last take-over's timings, in seconds
        self._hold_until = 0.0
        self._gone: dict[str, float] = {}  # reply inboxes found missing, and when (_live_inboxes)

    # ------------------------------------------------------------ lifecycle

    @property
    def consumer(self) -> AIOKafkaConsumer:
        """The consumer group member reading commands, while `run()` runs."""
        if self._consumer is None:
            raise RuntimeError(f"{self.name}: not running")
        return self._consumer

    @property
    def producer(self) -> AIOKafkaProducer:
        """The transactional producer, while active."""
        if self._producer is None:
            raise RuntimeError(f"{self.name}: not active")
        return self._producer

    async def run(self) -> None:
        processor = self

        # aiokafka ships no types, so its listener base is Any to the type checker.
        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
                if processor.tp in revoked:
                    async with processor._lock:
                        processor._assigned.clear()
                        await processor._deactivate("partition revoked")

            async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
                if processor.tp in assigned:
                    processor._assigned_at = time.monotonic()
                    processor._assigned.set()

        self._consumer = consumer = kafka.consumer(
            self.bootstrap, group_id=self.group_id, client_id=self.name, session_timeout_ms=self.session_timeout_ms
        )
        await consumer.start()
        consumer.subscribe([self.command_topic], listener=Listener())
        try:
            while True:
                if not self._assigned.is_set():
                    # Standby: heartbeat through getmany until the partition is ours, and keep
                    # the projection warm so that taking over needs only a short catch-up.
                    await consumer.getmany(timeout_ms=100)
                    if not self._assigned.is_set():  # (just assigned: activate without another wait)
                        await self.projection.poll(timeout_ms=100)
                    continue
                if not self.active.is_set():
                    if time.monotonic() < self._hold_until:  # fenced: let the group speak first
                        consumer.pause(self.tp)  # (activation seeks to the committed offset)
                        await consumer.getmany(timeout_ms=100)
                        continue
                    await self._activate()
                    continue
                await self._serve_batch()
        finally:
            await self._deactivate("stopping")
            await consumer.stop()

    async def _activate(self) -> None:
        async with self._lock:
            if not self._assigned.is_set():
                return
            t0 = time.monotonic()
            consumer = self.consumer
            consumer.pause(self.tp)  # nothing is fetched until the committed offset is known
            self._producer = kafka.producer(
                self.bootstrap,
                transactional_id=self.transactional_id,
                client_id=self.name,
                batch_bytes=self.batch_bytes,
            )
            await self._producer.start()  # init_transactions: fences every earlier owner
            t_fenced = time.monotonic()
            # Only now is the committed offset final (the fenced owner cannot commit any more).
            committed = await consumer.committed(self.tp)
            consumer.seek(self.tp, committed if committed is not None else 0)
            # A standby's state is its store at its position: rewind, don't reload (O(state)).
            self.projection.rewind()
            t_committed = time.monotonic()
            at = await self.projection.catch_up()
            consumer.resume(self.tp)
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
                "%s: active at ConfigTime %d, commands from offset %s; %.3fs after the assignment "
                "(fence %.3fs, committed offset %.3fs, catch-up %.3fs)",
                self.name,
                at,
                committed,
                done - self._assigned_at,
                t_fenced - t0,
                t_committed - t_fenced,
                done - t_committed,
            )

    async def _deactivate(self, why: str) -> None:
        was = self.active.is_set()
        self.active.clear()
        if self._producer is not None:
            try:
                await self._producer.stop()
            except Exception:  # a fenced producer may refuse to close cleanly
                pass
            self._producer = None
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
        batch = await self.consumer.getmany(self.tp, timeout_ms=100, max_records=self.max_batch)
        records = batch.get(self.tp)
        if not records:
            return
        if self.prepare is not None:
            await self.prepare(records)
        async with self._lock:
            if not self.active.is_set():
                return  # revoked while fetching: the new owner decides these
            try:
                await self._transact(records)
            except (ProducerFenced, KafkaError) as e:
                # Someone else owns the log now (or the transaction failed): forget the
                # in-memory state this batch built and rebuild it from the store.
                self.fenced = isinstance(e, ProducerFenced)
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

    async def _transact(self, records: list[kafka.KafkaRecord]) -> None:
        # Per command, a process span (its consumption and decision) and below it a span of the
        # batch's transaction, in that command's trace: both end when the transaction does.
        spans: list[trace.Span] = []
        transactions: list[trace.Span] = []
        began = time.time_ns()
        try:
            await self._transact_traced(records, began, spans, transactions)
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

    async def _transact_traced(
        self,
        records: list[kafka.KafkaRecord],
        began: int,
        spans: list[trace.Span],
        transactions: list[trace.Span],
    ) -> None:
        p = self.producer
        events_topic = self.projection.topic
        await p.begin_transaction()
        # Kafka 4 verifies a transaction's first write to each partition with the transaction
        # coordinator (KIP-890); meeting the coordinator mid-change of the same transaction (the
        # consumer offsets' AddOffsetsToTxn, or adding another partition) answers aiokafka's
        # produce as NOT_ENOUGH_REPLICAS, retried and logged as a warning on a healthy broker.
        # So the coordinator's changes come first: the offsets now, and each phase's partitions
        # (events, then replies) are added together before their first write goes out.
        await p.send_offsets_to_transaction({self.tp: records[-1].offset + 1}, self.group_id)
        # Per command: the futures of its events (each with how many records past the one it names
        # it covers: a bulk batch's names its first), its reply and where to send it (or None), its headers.
        pending: list[
            tuple[list[tuple[asyncio.Future[RecordMetadata], int]], tuple[Reply, bytes] | None, tracing.Headers]
        ] = []
        last_value: bytes | None = None  # the batch's last event, for the checkpoint's fingerprint (None: a tombstone)
        for rec in records:
            reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
            span = tracing.tracer.start_span(
                f"{self.name} process",
                context=tracing.extract(rec.headers),
                kind=trace.SpanKind.CONSUMER,
                attributes=tracing.record_attributes(rec),
            )
            spans.append(span)
            with trace.use_span(span, end_on_exit=False):
                futures: list[tuple[asyncio.Future[RecordMetadata], int]] = []
                events: list[Record] = []
                values: list[bytes | None] = []
                bulk: BulkEvents | None = None
                bulk_records: tuple[list[bytes], list[bytes]] = ([], [])
                op_time: int | None = None  # the command's last stamp
                clock = self.clock
                if clock is not None:
                    clock.gossip_in(header(rec.headers, VECTOR_TIME))
                try:
                    command = self.codec.decode(rec.value)
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
                    await p.send(self.dead_letters, rec.value, key=rec.key, headers=_dead_letter_headers(rec, e.reason))
                    reply = Reply(ok=False, code="BadRecord", error=e.reason)
                except CommandError as e:
                    reply = Reply(ok=False, code=e.code, error=e.message, result=e.info)
                except Exception as e:  # a bug in deciding must not wedge the log: report it, decide nothing
                    log.error("%s: command at offset %d failed:\n%s", self.name, rec.offset, traceback.format_exc())
                    reply = Reply(ok=False, code="InternalError", error=f"{type(e).__name__}: {e}")
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
                if reply.ok:
                    # Applying a decided event cannot fail but through a bug; if it does, the
                    # exception aborts the whole transaction rather than commit half a command.
                    with trace.use_span(txn, end_on_exit=False):
                        if bulk is not None and bulk_records[1]:
                            bulk.apply()
                            keys, bulk_values = bulk_records
                            attributes: dict[str, AttributeValue] = {
                                "shardlog.event": bulk.kind,
                                "shardlog.events": len(bulk_values),
                            }
                            with tracing.producer_span(events_topic, **attributes):
                                futures += await self._send_bulk(p, events_topic, keys, bulk_values)
                            last_value = bulk_values[-1]
                        for event, value in zip(events, values):
                            self.projection.state.apply(event, -1)  # its offset is known once acked
                            with tracing.producer_span(events_topic, **{"shardlog.event": event.type}):
                                key = event.key if isinstance(event, Tombstone) else self.event_key(event)
                                futures.append(
                                    (await p.send(events_topic, value, key=key, headers=tracing.inject()), 0)
                                )
                            last_value = value
                    txn.set_attribute("shardlog.transaction.events", len(events) + len(bulk_records[1]))
                if not reply.ok:
                    span.set_attribute("shardlog.error", reply.code)
                headers = [(CORRELATION_ID, corr)] if corr else []
                if clock is not None:
                    reply = reply.model_copy(update={"operationTime": op_time or clock.cluster_time})
                pending.append((futures, (reply, reply_to) if reply_to else None, tracing.inject(headers)))
        # Events must be acked before replies can name the ConfigTime that shows them; every
        # event is, before the first reply goes out (so the replies' partitions join together).
        last_offset: int | None = None
        answers: list[tuple[str, Reply, tracing.Headers]] = []
        for futures, to_send, reply_headers in pending:
            for f, more in futures:
                last_offset = (await f).offset + more
            if to_send is not None:
                answer, reply_to = to_send
                at = (
                    last_offset + 1 if last_offset is not None else self.projection.position
                )  # events so far in this batch count
                answers.append((reply_to.decode(), answer.model_copy(update={"configTime": at}), reply_headers))
        live = await self._live_inboxes({inbox for inbox, _, _ in answers})
        for inbox, answer, reply_headers in answers:
            if inbox not in live:
                continue  # its requester is gone (_live_inboxes)
            if self.clock is not None:
                reply_headers = [*reply_headers, (VECTOR_TIME, self.clock.gossip_out())]
            await p.send(inbox, Codec.encode(answer), headers=reply_headers)
        fault_point(f"{self.name}.before_commit", tag=_tag(records))
        await p.commit_transaction()
        fault_point(f"{self.name}.after_commit", tag=_tag(records))
        self.commands_done += len(records)
        if last_offset is not None:
            self.projection.advance(last_offset + 1, fingerprint(last_value))

    async def _send_bulk(
        self, p: AIOKafkaProducer, topic: str, keys: list[bytes], values: list[bytes]
    ) -> list[tuple[asyncio.Future[RecordMetadata], int]]:
        """Send bulk records as whole producer batches (no per-record future, span or trace
        header); each future with how many records past its first the batch holds."""
        out: list[tuple[asyncio.Future[RecordMetadata], int]] = []
        batch, n = p.create_batch(), 0
        for key, value in zip(keys, values):
            if batch.append(timestamp=None, key=key, value=value) is None:  # full: send it, start the next
                out.append((await p.send_batch(batch, topic, partition=self.projection.tp.partition), n - 1))
                batch, n = p.create_batch(), 0
                if batch.append(timestamp=None, key=key, value=value) is None:
                    raise ValueError(f"a record of {len(value)} bytes does not fit a producer batch")
            n += 1
        out.append((await p.send_batch(batch, topic, partition=self.projection.tp.partition), n - 1))
        return out

    async def _live_inboxes(self, inboxes: set[str]) -> set[str]:
        """The inboxes replies can go to, their metadata known (so the replies go out without a pause).

        A requester that is gone (a router or client stopped, its inbox deleted, while its request
        waited uncommitted: across a restart, a crash or a take-over) cannot read its reply.  aiokafka
        would wait `request_timeout_ms` for the missing topic and then fail the transaction, and the
        next owner would decide the same batch again, forever.  So its reply is dropped, as a MongoDB
        server drops the reply to a closed connection; the command's effects still commit."""
        p = self.producer
        now = time.monotonic()
        self._gone = {inbox: since for inbox, since in self._gone.items() if now - since < GONE_INBOX_MEMORY_S}

        async def known(inbox: str) -> str | None:
            if inbox in self._gone:
                return None
            try:
                await asyncio.wait_for(p.partitions_for(inbox), INBOX_WAIT_S)
                return inbox
            except (TimeoutError, KafkaError) as e:
                self._gone[inbox] = time.monotonic()
                log.warning(
                    "%s: reply inbox %s is gone (%s): its replies are dropped", self.name, inbox, type(e).__name__
                )
                return None

        return {inbox for inbox in await asyncio.gather(*map(known, inboxes)) if inbox is not None}

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


def _tag(records: list[kafka.KafkaRecord]) -> str:
    """A fault-point tag: the text of the last command, so a test can aim at one command."""
    try:
        value: bytes = records[-1].value
        return value.decode()
    except Exception:
        return ""


def _dead_letter_headers(rec: kafka.KafkaRecord, reason: str) -> list[tuple[str, bytes]]:
    return [
        ("dlq.reason", reason.encode()),
        ("dlq.topic", rec.topic.encode()),
        ("dlq.partition", str(rec.partition).encode()),
        ("dlq.offset", str(rec.offset).encode()),
        *[(k, v) for k, v in (rec.headers or ()) if k in (REPLY_TO, CORRELATION_ID)],
    ]
