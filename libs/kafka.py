"""aiokafka clients with the settings shardlog relies on.

aiokafka's defaults (acks=1, no idempotence, auto-commit, read_uncommitted)
are wrong for an event-sourced system; every client is made here instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import ConsumerRecord

from libs.topics import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # re-exported: set with the topics' configs
from libs.topics import TopicSpec

log = logging.getLogger(__name__)

# MAX_RECORD_BYTES: the largest record a producer sends and a consumer fetches, and every document-carrying topic's
# max.message.bytes (libs.topics.LARGE_RECORDS): one document's record form (at most
# domain.protocol.MAX_DOCUMENT_RECORD_BYTES, 96 MiB: 6x a 16 MiB BSON document, docs/decisions/0016)
# plus a batch of others (a 2 MiB migration clone batch) and the envelope.  It stays below the
# brokers' socket.request.max.bytes (Kafka's default, 100 MiB), which caps a whole produce request.


def producer(
    bootstrap: str,
    *,
    transactional_id: str | None = None,
    client_id: str = "shardlog",
    linger_ms: int = 2,
    transaction_timeout_ms: int = 60_000,
    batch_bytes: int = 1024 * 1024,
    retry_backoff_ms: int = 10,
) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        transactional_id=transactional_id,
        transaction_timeout_ms=transaction_timeout_ms,
        linger_ms=linger_ms,
        max_request_size=MAX_RECORD_BYTES,
        # 16 KB (the default) splits a transaction of many small records into many requests:
        # a migration batch of 2,000 documents took ~4x longer.
        max_batch_size=batch_bytes,
        # aiokafka's 100 ms default turns a transaction that starts while the previous
        # commit is still completing (a routine retry on Kafka 4) into a 100 ms stall.
        retry_backoff_ms=retry_backoff_ms,
    )


def consumer(
    bootstrap: str,
    *,
    group_id: str | None = None,
    client_id: str = "shardlog",
    session_timeout_ms: int = 10_000,
    **kw: Any,
) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=group_id,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(500, session_timeout_ms // 5),
        fetch_max_bytes=MAX_RECORD_BYTES * 2,
        max_partition_fetch_bytes=MAX_RECORD_BYTES,
        **kw,
    )


@dataclass(frozen=True)
class Replication:
    """How every shardlog topic is replicated: `factor` copies, of which `min_insync` must have
    a write before it is acknowledged (producers use acks=all)."""

    factor: int
    min_insync: int


async def replication(admin: AIOKafkaAdminClient) -> Replication:
    """SHARDLOG_REPLICATION_FACTOR / SHARDLOG_MIN_INSYNC_REPLICAS, else the brokers' own
    `default.replication.factor` / `min.insync.replicas` (`make up` and compose set 3 / 2 with
    three brokers, 1 / 1 with one).  Read from the brokers rather than counted, so a topic
    created while a broker is down is refused instead of created with fewer copies."""
    factor, min_insync = os.environ.get("SHARDLOG_REPLICATION_FACTOR"), os.environ.get("SHARDLOG_MIN_INSYNC_REPLICAS")
    if factor is None or min_insync is None:
        brokers = (await admin.describe_cluster())["brokers"]
        (res,) = await admin.describe_configs(
            [
                ConfigResource(
                    ConfigResourceType.BROKER,
                    str(brokers[0]["node_id"]),
                    {"default.replication.factor": None, "min.insync.replicas": None},
                )
            ]
        )
        entries = {
            e["config_names"]: e["config_value"] for r in res.to_object()["resources"] for e in r["config_entries"]
        }
        factor = factor or entries.get("default.replication.factor", "1")
        min_insync = min_insync or entries.get("min.insync.replicas", "1")
    r = Replication(int(factor), int(min_insync))
    if not 1 <= r.min_insync <= r.factor:
        raise ValueError(f"min.insync.replicas {r.min_insync} must be between 1 and the replication factor {r.factor}")
    return r


async def ensure_topics(bootstrap: str, specs: list[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet, replicated as `replication()` says; returns the names created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            rep = await replication(admin)
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            s.name,
                            s.partitions,
                            rep.factor,
                            topic_configs={"min.insync.replicas": str(rep.min_insync), **s.config},
                        )
                        for s in missing
                    ]
                )
            except TopicAlreadyExistsError:
                pass  # created concurrently by another starter: fine
        # Metadata propagates asynchronously: wait until every topic is visible.
        for _ in range(100):
            if not (absent := {s.name for s in specs} - set(await admin.list_topics())):
                break
            await asyncio.sleep(0.05)
        else:  # create_topics reports per-topic errors in its response instead of raising
            raise RuntimeError(
                f"could not create the topics {sorted(absent)} (see the broker's log; with a "
                f"replication factor above the number of live brokers, Kafka refuses them)"
            )
        return [s.name for s in missing]
    finally:
        await admin.close()


async def missing_topics(bootstrap: str, names: list[str]) -> list[str]:
    """Which of `names` do not exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        return [n for n in names if n not in existing]
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [n for n in names if n in existing]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


async def delete_cluster_topics(bootstrap: str, cluster: str) -> list[str]:
    """Delete every topic of `cluster` (named `<cluster>.…`, inboxes included); the names deleted.
    A broker keeps each partition's files and state, and every aiokafka client's bootstrap reads
    the metadata of every topic: clusters left behind slow everything that shares the broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        mine = [n for n in await admin.list_topics() if n.startswith(f"{cluster}.")]
        if mine:
            await admin.delete_topics(mine)
        return mine
    finally:
        await admin.close()


async def log_end(c: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """The last stable offset (read_committed end) of an assigned partition."""
    ends: dict[TopicPartition, int] = await c.end_offsets([tp])
    return ends[tp]


async def catch_up(c: AIOKafkaConsumer, tp: TopicPartition, on_batch: OnBatch, *, max_records: int = 5000) -> int:
    """Feed `on_batch(records)` until the consumer has passed the log's stable end as of now
    (libs.bus.catch_up, on an assigned consumer of the caller's)."""
    from libs.bus import catch_up as bus_catch_up
    from libs.bus.kafka import KafkaReader

    return await bus_catch_up(KafkaReader(c, tp), on_batch, max_records=max_records)


KafkaRecord: TypeAlias = ConsumerRecord[bytes, bytes]  # key and value as bytes: no deserializers
OnBatch = Callable[[list[KafkaRecord]], Awaitable[None]]


@asynccontextmanager
async def partition_reader(
    bootstrap: str, topic: str, *, partition: int = 0, start: int | str = 0, client_id: str = "shardlog-reader"
) -> AsyncIterator[tuple[AIOKafkaConsumer, TopicPartition]]:
    """A started consumer assigned to one partition, positioned at `start`: an offset, a
    negative number for that many offsets before the end, or "end"; stopped on exit.

    The one way shardlog opens a partition to read it (a command topic, read by a consumer
    group, is the command processor's and the router's business)."""
    c = consumer(bootstrap, client_id=client_id)
    await c.start()
    try:
        tp = TopicPartition(topic, partition)
        c.assign([tp])
        if start == "end":
            c.seek(tp, await log_end(c, tp))
        elif isinstance(start, int) and start < 0:
            c.seek(tp, max(0, await log_end(c, tp) + start))
        else:
            c.seek(tp, int(start))
        yield c, tp
    finally:
        await c.stop()


# ------------------------------------------------------------ request counts (benches)

REQUEST_COUNTS_ENV = "SHARDLOG_KAFKA_REQUEST_COUNTS"


def count_requests(directory: str) -> None:
    """Count every request this process sends to a broker, by client id and Kafka API, into
    `<directory>/<pid>.json` (rewritten every 0.2 s by a daemon thread): bench_e2e
    --count-requests reads the files before and after a run.  Off unless the variable is set."""
    import json
    import threading
    import time
    from collections import Counter
    from pathlib import Path

    from aiokafka.conn import AIOKafkaConnection

    counts: Counter[str] = Counter()
    send = AIOKafkaConnection.send

    def counting_send(self: AIOKafkaConnection, request: Any, expect_response: bool = True) -> Any:
        counts[f"{self._client_id}\t{type(request).__name__.split('_')[0]}"] += 1
        return send(self, request, expect_response)

    AIOKafkaConnection.send = counting_send
    out = Path(directory) / f"{os.getpid()}.json"

    def dump() -> None:
        while True:
            try:
                snapshot = dict(counts)
            except RuntimeError:  # a new key was added meanwhile by the event loop's thread
                continue
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(snapshot))
            tmp.replace(out)
            time.sleep(0.2)

    threading.Thread(target=dump, name="kafka-request-counts", daemon=True).start()


if os.environ.get(REQUEST_COUNTS_ENV):
    count_requests(os.environ[REQUEST_COUNTS_ENV])
