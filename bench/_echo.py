"""The raw request/reply echo of bench_e2e.py and bench_wire.py: plain aiokafka
processes with the same Kafka hops as a router in front of shards.

    python bench/_echo.py front --bootstrap B --requests A --backs B0,B1,B2 --inbox I --group G --ready F
    python bench/_echo.py back  --bootstrap B --requests Bi --events Ei --group Gi --ready F
    python bench/_echo.py tcp-front --bootstrap B --backs B0,B1,B2 --inbox I --port P --ready F

A request's value is `R<key>` (read) or `W<key>\\n<fields JSON>` (update).

front (like a router): a member of consumer group G on A (the client topic, 4
partitions like router.requests).  Loop: getmany (<= 256 records, 100 ms); every
record at once (asyncio.gather): pick the back by crc32(key) % len(backs), produce
the request unchanged there with reply-to = its own inbox and a fresh correlation
id, waiting for the ack (send_and_wait, as libs.requests.Requester does), await the
back's reply on the inbox, then produce the reply bytes unchanged to the client's
reply-to topic (not waiting for that ack); when the whole batch is answered,
commit its offsets to the group.  That is the router's loop, minus decoding,
targeting, pydantic and tracing.

tcp-front (like a router's wire edge, for bench_wire.py): an asyncio TCP server (one task
per connection, requests answered in order, one at a time, as a driver uses a connection)
speaking a minimal framing: a request is a 4-byte big-endian length then the same `R…` /
`W…` value; the reply is a 4-byte length then the back's reply bytes.  Per request: pick
the back by crc32(key), produce the request there with reply-to = its inbox and a fresh
correlation id, waiting for the ack, await the reply on the inbox, write it to the socket.
Two Kafka hops per request (front -> back -> front), like router -> shard -> router; no
decoding, no BSON.  Ready = {"pid": ..., "port": ...} once listening and the inbox is
positioned (--port 0 picks a free port).

back (like a shard's command processor): a member of consumer group Gi on Bi (one
partition) with a transactional producer, transactional.id `Gi.0`.  Per fetched
batch (<= 500 records, 100 ms): begin_transaction; per record: for an update, one
~1.1 KB "event" (the stored record with the update applied) to Ei, then the reply
(reads: a fixed ~1.1 KB record, like a YCSB document; updates:
`{"matched":1,"modified":1}`) to the reply-to topic with the correlation id;
send_offsets_to_transaction(next offset, Gi); commit_transaction.  With
--two-phase it first waits for the batch's event acks before sending any reply,
as the processor does (its replies name the ConfigTime of their events).  No
state, no decoding: the same record is returned for every key.  With
--events-per-update N an update writes N events (the document, then N-1 small
records, as a shard's DocumentWritten + RetryableWriteRecorded).

Both use libs.kafka's client factories (acks=all, idempotent, read_committed,
retry_backoff_ms=10, the same fetch sizes) so client settings match shardlog's;
no OpenTelemetry.  Ready = the file given with --ready holds {"pid": ...}, once
the partitions are assigned (and, for back, the transactional producer is
initialised).  SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import uuid
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiokafka import TopicPartition  # noqa: E402

from libs import kafka  # noqa: E402
from libs.commands import CORRELATION_ID, REPLY_TO, header  # noqa: E402

FRONT_MAX_BATCH = 256  # services.router.server.MAX_IN_FLIGHT
BACK_MAX_BATCH = 500  # the shard processor's max_batch
# A YCSB record as the shard returns it: 10 fields of 100 characters, JSON.
RECORD = json.dumps(
    {"_id": "user" + "0" * 19, **{f"field{i}": "x" * 100 for i in range(10)}}, separators=(",", ":")
).encode()
WRITE_REPLY = b'{"matched":1,"modified":1}'


def ready(path: str) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid()}))
    tmp.replace(path)


def key_of(value: bytes) -> bytes:
    return value[1:].split(b"\n", 1)[0]


async def front(a) -> None:
    backs = a.backs.split(",")
    consumer = kafka.consumer(a.bootstrap, group_id=a.group, client_id=a.client_id)
    inbox_consumer = kafka.consumer(a.bootstrap, client_id=a.client_id)
    producer = kafka.producer(a.bootstrap, client_id=a.client_id, linger_ms=0)
    await asyncio.gather(consumer.start(), inbox_consumer.start(), producer.start())
    waiting: dict[bytes, asyncio.Future] = {}
    itp = TopicPartition(a.inbox, 0)
    inbox_consumer.assign([itp])
    inbox_consumer.seek(itp, (await inbox_consumer.end_offsets([itp]))[itp])

    async def read_inbox():
        while True:
            batch = await inbox_consumer.getmany(itp, timeout_ms=500)
            for rec in batch.get(itp, []):
                fut = waiting.pop(header(rec.headers, CORRELATION_ID) or b"", None)
                if fut is not None and not fut.done():
                    fut.set_result(rec.value)

    slots = asyncio.Semaphore(FRONT_MAX_BATCH)
    inbox = a.inbox.encode()

    async def handle(rec) -> None:
        async with slots:
            reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
            back = backs[zlib.crc32(key_of(rec.value)) % len(backs)]
            c = uuid.uuid4().hex.encode()
            fut = asyncio.get_running_loop().create_future()
            waiting[c] = fut
            await producer.send_and_wait(back, rec.value, headers=[(REPLY_TO, inbox), (CORRELATION_ID, c)])
            value = await asyncio.wait_for(fut, 30)
            await producer.send(reply_to.decode(), value, headers=[(CORRELATION_ID, corr)])

    reader = asyncio.create_task(read_inbox())
    consumer.subscribe([a.requests])
    announced = False
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=FRONT_MAX_BATCH)
            if not announced and consumer.assignment():
                ready(a.ready)
                announced = True
            records = [r for recs in batch.values() for r in recs]
            if not records:
                continue
            await asyncio.gather(*(handle(r) for r in records))
            await consumer.commit({TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})
    finally:
        reader.cancel()
        await asyncio.gather(consumer.stop(), inbox_consumer.stop(), producer.stop(), return_exceptions=True)


async def tcp_front(a) -> None:
    backs = a.backs.split(",")
    inbox_consumer = kafka.consumer(a.bootstrap, client_id=a.client_id)
    producer = kafka.producer(a.bootstrap, client_id=a.client_id, linger_ms=0)
    await asyncio.gather(inbox_consumer.start(), producer.start())
    waiting: dict[bytes, asyncio.Future] = {}
    itp = TopicPartition(a.inbox, 0)
    inbox_consumer.assign([itp])
    inbox_consumer.seek(itp, (await inbox_consumer.end_offsets([itp]))[itp])
    inbox = a.inbox.encode()

    async def read_inbox():
        while True:
            batch = await inbox_consumer.getmany(itp, timeout_ms=500)
            for rec in batch.get(itp, []):
                fut = waiting.pop(header(rec.headers, CORRELATION_ID) or b"", None)
                if fut is not None and not fut.done():
                    fut.set_result(rec.value)

    async def forward(value: bytes) -> bytes:
        back = backs[zlib.crc32(key_of(value)) % len(backs)]
        c = uuid.uuid4().hex.encode()
        fut = asyncio.get_running_loop().create_future()
        waiting[c] = fut
        await producer.send_and_wait(back, value, headers=[(REPLY_TO, inbox), (CORRELATION_ID, c)])
        return await asyncio.wait_for(fut, 30)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                reply = await forward(await reader.readexactly(n))
                writer.write(len(reply).to_bytes(4, "big") + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    reader_task = asyncio.create_task(read_inbox())
    server = await asyncio.start_server(connection, "127.0.0.1", a.port)
    port = server.sockets[0].getsockname()[1]
    tmp = Path(a.ready + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "port": port}))
    tmp.replace(a.ready)
    try:
        async with server:
            await server.serve_forever()
    finally:
        reader_task.cancel()
        await asyncio.gather(inbox_consumer.stop(), producer.stop(), return_exceptions=True)


async def back(a) -> None:
    tp = TopicPartition(a.requests, 0)
    consumer = kafka.consumer(a.bootstrap, group_id=a.group, client_id=a.client_id)
    producer = kafka.producer(a.bootstrap, transactional_id=f"{a.group}.0", client_id=a.client_id)
    await asyncio.gather(consumer.start(), producer.start())
    consumer.subscribe([a.requests])
    announced = False
    try:
        while True:
            batch = await consumer.getmany(tp, timeout_ms=100, max_records=BACK_MAX_BATCH)
            if not announced and tp in consumer.assignment():
                ready(a.ready)
                announced = True
            records = batch.get(tp)
            if not records:
                continue
            await producer.begin_transaction()
            replies = []
            events = []
            for rec in records:
                reply_to, corr = header(rec.headers, REPLY_TO), header(rec.headers, CORRELATION_ID)
                if rec.value[:1] == b"W":
                    key, _, fields = rec.value[1:].partition(b"\n")
                    event = RECORD[:-1] + b',"update":' + fields + b"}"
                    for i in range(a.events_per_update):  # the first ~1.1 KB, the others small
                        value = event if i == 0 else b'{"recorded":' + key + b"}"
                        events.append(await producer.send(a.events, value, key=key + b"/%d" % i))
                    reply = WRITE_REPLY
                else:
                    reply = RECORD
                if a.two_phase:
                    replies.append((reply_to, reply, corr))
                else:
                    await producer.send(reply_to.decode(), reply, headers=[(CORRELATION_ID, corr)])
            if a.two_phase:
                for f in events:
                    await f
                for reply_to, reply, corr in replies:
                    await producer.send(reply_to.decode(), reply, headers=[(CORRELATION_ID, corr)])
            await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, a.group)
            await producer.commit_transaction()
    finally:
        await asyncio.gather(consumer.stop(), producer.stop(), return_exceptions=True)


def main() -> None:
    p = argparse.ArgumentParser(description="raw aiokafka echo for bench_e2e.py and bench_wire.py")
    p.add_argument("role", choices=["front", "back", "tcp-front"])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--requests", help="front, back: the topic consumed")
    p.add_argument("--group", help="front, back: the consumer group")
    p.add_argument("--port", type=int, default=0, help="tcp-front: the TCP port (0: a free one)")
    p.add_argument("--ready", required=True)
    p.add_argument("--client-id", default="echo", help="the Kafka client id (bench_e2e counts requests by it)")
    p.add_argument("--backs", help="front: the back topics, comma-separated")
    p.add_argument("--inbox", help="front: its reply inbox")
    p.add_argument("--events", help="back: where update events go")
    p.add_argument("--two-phase", action="store_true", help="back: event acks before replies")
    p.add_argument(
        "--events-per-update",
        type=int,
        default=1,
        help="back: events per update (the first the ~1.1 KB document, the others ~40 B, as a write's record)",
    )
    a = p.parse_args()

    async def guarded():
        role = {"front": front, "back": back, "tcp-front": tcp_front}[a.role]
        task = asyncio.create_task(role(a))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(guarded())


if __name__ == "__main__":
    main()
