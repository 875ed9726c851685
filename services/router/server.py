"""A router: consumes client operations from `router.requests` (shared by all
routers through one consumer group), routes them to shards, replies to the
client's inbox.  Its only state is the routing-table cache (a catalog
follower) and open cursors.

A router takes each batch of operations off `router.requests` (commits past it)
before it runs any of them: an operation runs at most once, as a mongos runs once
what a connection sent it.  A router that dies loses its in-flight operations; the
client sends them again (a retryable write under the same lsid and txnNumber, which
shards apply once).  Committing only once answered re-ran every operation after the
oldest unanswered one, answered long before: an insert acknowledged before a
dropDatabase re-created the database (docs/decisions/0005, amendment).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable

from domain.clock import VectorClock
from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from libs import tracing
from libs.bus import BusError, GroupMember, Message, Reader, partition_reader
from libs.commands import CORRELATION_ID, REPLY_TO, CommandError, header
from libs.metrics import MetricsPublisher
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, supervised
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import Codec, RecordError
from schemas import shard as schema
from schemas.reply import Reply
from services.router.route import OperationRouter
from services.router.sessions import LogicalSessionCache
from services.router.wire.edge import RouterEdge
from services.router.wire.server import DEFAULT_PORT, WireServer, WireSettings

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256


def wire_address(port: int | None = None, bind: str | None = None) -> tuple[str, int | None]:
    """Where the router listens for MongoDB clients: the arguments, else SHARDLOG_ROUTER_BIND
    (default 127.0.0.1) and SHARDLOG_ROUTER_PORT (default 27017; 0 picks a free port; "off"
    runs the Kafka front alone)."""
    host = bind if bind is not None else os.environ.get("SHARDLOG_ROUTER_BIND", "127.0.0.1")
    if port is not None:
        return host, port
    raw = os.environ.get("SHARDLOG_ROUTER_PORT", str(DEFAULT_PORT))
    return host, None if raw == "off" else int(raw)


class _Taken:
    """The requests member's listener: nothing to do on a rebalance, as every operation a
    router runs is committed (taken) before it runs, and a revoked partition's new owner
    starts after it."""

    async def on_revoked(self, revoked) -> None:
        pass

    async def on_assigned(self, assigned) -> None:
        pass


class _Cursors:
    """This router's cursor topic, polled as the group's partitions are (no offsets to commit:
    read from its end at start-up, its continuations are this process's alone)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    async def poll(self, *, max_records: int, timeout_s: float) -> dict[int, list[Message]]:
        return {0: await self.reader.fetch(max_records=max_records, timeout_s=timeout_s)}

    def assignment(self) -> set[int]:
        return {0}

    async def commit(self, offsets: dict[int, int]) -> None:
        pass

    def seek(self, partition: int, offset: int) -> None:
        pass  # (never taken: nothing to seek back to)


# A poll returns as soon as an operation arrives; the bound only sets how often an idle router
# wakes (0.05 s made the two loops a fifth of a simulated cluster's wake-ups).
IDLE_POLL_S = 0.5


def taken(batch: dict[int, list[Message]]) -> dict[int, int]:
    """The offsets that take a polled batch off its partitions: past each one's last record."""
    return {tp: records[-1].offset + 1 for tp, records in batch.items() if records}


# Operations that may run twice unharmed (a find or a count answers twice; nothing changes):
# they run as soon as they are polled, without waiting for their batch to be taken.  Told from
# the record's first bytes (the client library encodes `type` first); anything else waits.
RUN_AT_ONCE = (b'{"type":"Find",', b'{"type":"Count",', b'{"type":"Explain",')


def runs_at_once(rec: Message) -> bool:
    return rec.value is not None and rec.value.startswith(RUN_AT_ONCE)


async def serve(
    source: GroupMember | _Cursors,
    handle: Callable[[Message], Awaitable[None]],
    *,
    take: bool,
    name: str,
) -> None:
    """Handle operations concurrently as they arrive (up to MAX_IN_FLIGHT).  With `take`, each
    batch's writes (anything but RUN_AT_ONCE) run only once the batch is committed (taken), so
    none runs twice: a batch whose commit fails (a rebalance under way) runs no write here, its
    partitions, if still ours, sought back to fetch it again; else their next owner runs it.
    Batches of reads alone are taken in the background, one commit in flight at a time (a
    commit takes everything polled before it: the next one covers what one skipped), and a
    write's commit waits for it, so commits land in order."""
    tasks: set[asyncio.Task] = set()
    owed: dict[int, int] = {}  # per partition, the offset past what was polled and not yet committed
    background: asyncio.Task | None = None  # a commit of reads alone, in flight

    def run(records: list[Message]) -> None:
        for rec in records:
            task = asyncio.create_task(handle(rec))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    try:
        while True:
            if len(tasks) >= MAX_IN_FLIGHT:  # back-pressure: wait for a slot
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            batch = await source.poll(timeout_s=IDLE_POLL_S, max_records=MAX_IN_FLIGHT - len(tasks))
            records = [rec for recs in batch.values() for rec in recs]
            if not take:
                run(records)
                continue
            run([rec for rec in records if runs_at_once(rec)])
            writes = [rec for rec in records if not runs_at_once(rec)]
            owed.update(taken(batch))
            if not writes:
                if owed and (background is None or background.done()):
                    background = asyncio.create_task(source.commit(dict(owed)))
                    owed.clear()  # (a failed background commit: its reads ran; nothing to run twice)
                continue
            if background is not None:
                await asyncio.gather(background, return_exceptions=True)
                background = None
            try:
                await source.commit(dict(owed))
                owed.clear()
            except BusError as e:
                log.info("%s: batch not taken (%s): left to the partitions' owner", name, e)
                owed.clear()
                mine = source.assignment()
                for tp, recs in batch.items():
                    if recs and tp in mine:
                        source.seek(tp, recs[0].offset)
                continue
            run(writes)
    finally:
        for t in tasks:
            t.cancel()
        if background is not None:
            background.cancel()


class RouterServer:
    def __init__(
        self,
        settings: ServiceSettings,
        instance: str | None = None,
        *,
        port: int | None = None,  # the wire port (see wire_address); tests pass 0
        bind: str | None = None,
    ):
        self.settings = settings
        self.instance = instance or uuid.uuid4().hex[:8]
        self.name = "router" if instance is None else f"router-{self.instance}"
        t = settings.topics
        self.inbox = t.router_inbox(self.instance)
        self.cursor_topic = t.router_cursors(self.instance)
        self.clock = VectorClock()  # never ticked: advanced by the catalog, the shards and signed client times
        self.follower = CatalogFollower(settings, f"router-{self.instance}", clock=self.clock)
        self.requester = Requester(
            settings.bus, self.inbox, client_id=self.name, stop_owner_on_failure=True, clock=self.clock
        )
        self.sessions = LogicalSessionCache(settings, self.follower, self.name)
        self.metrics = MetricsPublisher(settings.bus, t.metrics, "router", f"router-{self.instance}")
        self.routing = OperationRouter(
            t,
            self.follower,
            self.requester,
            self.cursor_topic,
            self.sessions,
            clock=self.clock,
            metrics=self.metrics.counters,
        )
        self.served = 0
        self.wire_host, wire_port = wire_address(port, bind)
        self.wire: WireServer | None = None
        if wire_port is not None:
            wire_settings = WireSettings.from_env()
            self.wire = WireServer(
                self.wire_host,
                wire_port,
                compressors=wire_settings.compressors,
                max_connections=wire_settings.max_connections,
                edge=RouterEdge(
                    settings=settings,
                    instance=self.instance,
                    routing=self.routing,
                    follower=self.follower,
                    requester=self.requester,
                    sessions=self.sessions,
                    clock=self.clock,
                    started=time.time(),
                ),
            )

    @property
    def mongodb_uri(self) -> str | None:
        """The connection string of this router's wire edge, once it listens."""
        if self.wire is None:
            return None
        return f"mongodb://{self.wire_host}:{self.wire.port}/"

    async def run(self) -> None:
        s, t = self.settings, self.settings.topics
        await s.bus.create_topics(
            [
                *t.core(),
                # A second partition for the shards' replies sent outside their transactions (plain
                # reads): on the first, a shard's open transaction would hold them back (its LSO).
                TopicSpec(self.inbox, partitions=2, config=SHORT_LIVED),
                TopicSpec(self.cursor_topic, config=SHORT_LIVED),
            ],
        )
        at = await self.follower.start()
        await self.requester.start()
        await self.sessions.start()
        # Replies to clients go through the producer of the shard requests: one producer, so each
        # produce request carries both (two producers doubled the router's produce requests).
        self.producer = self.requester.producer
        requests = s.bus.member(
            t.group("router"),
            t.router_requests,
            client_id=self.name,
            listener=_Taken(),
            session_timeout_ms=s.session_timeout_ms,
        )
        await requests.start()
        try:
            # Cursor continuations come back to this router only: its own topic, read from now on.
            async with partition_reader(s.bus, self.cursor_topic, start="end", client_id=self.name) as cursors:
                if self.wire is not None:  # after the catalog: the first client sees routing tables
                    await self.wire.start()
                report_ready(s, self.name, configTime=at, inbox=self.inbox, uri=self.mongodb_uri)
                await self.metrics.start()
                cursor_task = supervised(
                    asyncio.create_task(serve(_Cursors(cursors), self._handle, take=False, name=self.name)),
                    f"{self.name} cursors",
                )
                refresh = supervised(asyncio.create_task(self.sessions.run()), f"{self.name} session cache")
                try:
                    await serve(requests, self._handle, take=True, name=self.name)
                finally:
                    cursor_task.cancel()
                    refresh.cancel()
        finally:
            clear_ready(s, self.name)
            await self.metrics.stop()
            if self.wire is not None:
                await self.wire.close()
            await asyncio.gather(
                requests.stop(),
                self.requester.stop(),
                self.sessions.stop(),
                return_exceptions=True,
            )
            await self.follower.stop()
            await s.bus.delete_topics([self.inbox, self.cursor_topic])

    def _internal_error(self, rec, e: Exception) -> dict:
        """A bug met handling `rec`: logged, and answered as InternalError."""
        log.exception("%s: operation at %s@%d failed", self.name, rec.topic, rec.offset)
        return dict(ok=False, code=ErrorCode.InternalError, error=f"{type(e).__name__}: {e}")

    async def _handle(self, rec) -> None:
        reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
        with tracing.process_span(f"{self.name} process", rec.headers, **tracing.record_attributes(rec)) as span:
            try:
                req = schema.requests.decode(rec.value)
                span.update_name(f"router {req.type}")  # consumed; its routing span is "route <type>"
                answer: dict = dict(
                    ok=True, result=await self.routing.handle(req), configTime=self.follower.config_time
                )
            except RecordError as e:
                await self.producer.send(
                    self.settings.topics.dead_letters,
                    rec.value,
                    headers=[
                        ("dlq.reason", e.reason.encode()),
                        ("dlq.topic", rec.topic.encode()),
                        ("dlq.offset", str(rec.offset).encode()),
                    ],
                )
                answer = dict(ok=False, code=ErrorCode.BadRecord, error=e.reason)
            except CommandError as e:
                answer = dict(ok=False, code=e.code, error=e.message, result=e.info)
            except Exception as e:  # a bug: answer clearly rather than leave the client waiting
                answer = self._internal_error(rec, e)
            # Every client reply carries the time of the operation and our signed ClusterTime: one
            # Reply built with them (not built, then copied with them: a model_copy per operation).
            times = dict(operationTime=self.routing.operation_time(), clusterTime=self.routing.signed_cluster_time())
            try:
                reply = Reply(**answer, **times)
            except Exception as e:  # a result a Reply refuses: a bug, answered as above
                reply = Reply(**self._internal_error(rec, e), **times)
            self.served += 1
            if reply_to:
                try:
                    await self.producer.send(
                        reply_to.decode(),
                        Codec.encode(reply),
                        headers=tracing.inject([(CORRELATION_ID, corr)] if corr else []),
                    )
                except BusError as e:  # the client is gone (its inbox deleted): nobody to tell
                    log.info("%s: reply to %s not sent: %s", self.name, reply_to.decode(), e)
