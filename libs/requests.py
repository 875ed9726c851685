"""Request/reply over Kafka: send a record to a topic, await its reply on an inbox.

The request carries `reply-to` (the inbox topic) and a `correlation-id` in its
headers; the inbox is read from its end as of start-up, read_committed (a
reply inside an aborted transaction was never sent).
"""

from __future__ import annotations

import asyncio
import uuid

from libs import aio, tracing
from libs.bus import Bus, Producer, Tail, connect
from libs.commands import CORRELATION_ID, REPLY_TO, VECTOR_TIME, Gossip, header
from libs.service import supervised
from schemas import Codec, Record, RecordError
from schemas.reply import Reply, replies


class RequestTimeout(TimeoutError):
    pass


class Requester:
    def __init__(
        self,
        bus: str | Bus,
        inbox: str,
        *,
        client_id: str = "shardlog-client",
        stop_owner_on_failure: bool = False,
        clock: Gossip | None = None,
    ) -> None:
        self.bus, self.inbox, self.client_id = connect(bus), inbox, client_id
        self.clock = clock  # gossips its times on every request, advanced by every reply's
        self.stop_owner_on_failure = stop_owner_on_failure  # a service stops; a client library only logs
        self._waiting: dict[bytes, asyncio.Future[Reply]] = {}
        self._producer: Producer | None = None
        self._tail: Tail | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def producer(self) -> Producer:
        """Its producer, while started: a service may send its other records through it too, so
        that aiokafka puts them in the same produce requests (stopped by `stop`)."""
        if self._producer is None:
            raise RuntimeError(f"{self.client_id}: requester not started")
        return self._producer

    async def start(self) -> None:
        self._producer = producer = self.bus.producer(client_id=self.client_id)
        # Every partition of the inbox (a router's has a second one for the replies sent outside
        # any transaction: libs.commands.settings.UNTRANSACTED_REPLIES_PARTITION), from its end: replies
        # to requests sent from now on come after.
        self._tail = tail = self.bus.tail(self.inbox, client_id=self.client_id)
        await asyncio.gather(producer.start(), tail.start())
        self._reader = supervised(
            asyncio.create_task(self._read(tail)),
            f"{self.client_id} reply reader",
            stop_owner=self.stop_owner_on_failure,
        )

    async def stop(self) -> None:
        if self._reader:
            self._reader.cancel()
        await asyncio.gather(*(c.stop() for c in (self._producer, self._tail) if c), return_exceptions=True)

    async def __aenter__(self) -> Requester:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _read(self, tail: Tail) -> None:
        wait = self.bus.idle_wait_s or 0.5  # an empty fetch only fetches again
        while True:
            for rec in await tail.fetch(timeout_s=wait):
                if self.clock is not None:  # a late reply's times are news too
                    self.clock.gossip_in(header(rec.headers, VECTOR_TIME))
                fut = self._waiting.pop(header(rec.headers, CORRELATION_ID) or b"", None)
                if fut is None or fut.done():
                    continue
                with tracing.process_span("receive reply", rec.headers, **{"messaging.destination.name": rec.topic}):
                    try:
                        fut.set_result(replies.decode(rec.value))
                    except RecordError as e:
                        fut.set_result(Reply(ok=False, code="BadReply", error=e.reason))

    async def send(
        self,
        topic: str,
        record: Record | bytes,
        *,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Reply]:
        """Send without waiting for the reply; returns the future of the reply."""
        if self._producer is None:
            raise RuntimeError(f"{self.client_id}: requester not started")
        corr = uuid.uuid4().hex.encode()
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[corr] = fut
        value = record if isinstance(record, bytes) else Codec.encode(record)
        with tracing.producer_span(topic):
            gossip = [(VECTOR_TIME, self.clock.gossip_out())] if self.clock is not None else []
            headers = tracing.inject(
                [(REPLY_TO, self.inbox.encode()), (CORRELATION_ID, corr), *gossip, *(headers or [])]
            )
            await (await self._producer.send(topic, value, key=key, headers=headers))
        return fut

    def forget(self, fut: asyncio.Future[Reply]) -> None:
        """Stop waiting for the reply of a request sent with `send` (it was sent again)."""
        self._waiting = {k: f for k, f in self._waiting.items() if f is not fut}

    async def request(
        self,
        topic: str,
        record: Record | bytes,
        *,
        timeout: float = 30.0,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Reply:
        fut = await self.send(topic, record, key=key, headers=headers)
        try:
            return await aio.wait_for(fut, timeout)
        except TimeoutError:
            self.forget(fut)
            raise RequestTimeout(f"no reply from {topic} within {timeout:g}s (is the service running?)") from None
