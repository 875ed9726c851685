"""A healthy broker gives a service no reason to warn (issue 18, point 11).

Kafka 4 verifies a transaction's first write to each partition with the transaction
coordinator (KIP-890); a verification that meets the coordinator busy with another change to
the same transaction answers CONCURRENT_TRANSACTIONS, which the broker reports to clients of
aiokafka's produce version as NOT_ENOUGH_REPLICAS.  aiokafka retries and logs a warning each
time: `make up` logs filled with `NotEnoughReplicasError` on a single healthy broker.
"""

from __future__ import annotations

import asyncio

import pytest

from libs import kafka
from libs.requests import Requester
from libs.topics import TopicSpec
from schemas import config as c

pytestmark = pytest.mark.kafka


def test_a_busy_config_server_logs_no_not_enough_replicas(settings, spawn):
    srv = spawn(settings, "services.config", ready_name="config")
    srv.wait_ready(timeout=90, role="active")
    topics = settings.topics

    async def client(inbox: str) -> None:
        async with Requester(settings.bootstrap, inbox) as r:
            for i in range(150):
                reply = await r.request(
                    topics.config_commands, c.SetSetting(key="chunkDefragmentationThrottlingMS", value=i), timeout=60
                )
                assert reply.ok, reply

    inboxes = [topics.inbox(f"day-one-{n}") for n in range(3)]

    async def go() -> None:
        await kafka.ensure_topics(settings.bootstrap, [TopicSpec(i) for i in inboxes])
        # Several clients with inboxes of their own: a transaction writes events and replies to
        # several partitions, the pattern every command processor has.
        await asyncio.gather(*(client(i) for i in inboxes))

    asyncio.run(go())
    log = srv.log.read_text(errors="replace")
    assert "NotEnoughReplicas" not in log, "\n".join(line for line in log.splitlines() if "NotEnoughReplicas" in line)[
        :4000
    ]
