"""The command processor: the runtime that turns a service's commands into events, exactly once.

The config server, each shard and the balancer run one.  It reads the service's command topic
(one partition, owned by one member of a consumer group) and writes, in one Kafka transaction
per fetched batch, the events to the service's changelog, the replies to the requesters' inboxes,
dead letters, and the consumed offsets (docs/reference/command-processor.md).

    policy.py       what a service tells the runtime (decide, and its optional behaviours)
    decision.py     one command decided: stamped, encoded, as a reply (pure)
    batch.py        a batch's commands as the transaction's steps fill them in
    transaction.py  a batch's transaction, its steps named and run in order
    traced.py       the spans wrapped around those steps
    reads.py        plain reads answered outside any transaction, and point reads during one
    offsets.py      where the consumed offsets go, and when the consumer group gets them
    inboxes.py      which requesters' inboxes exist (a reply to a gone one is dropped)
    activation.py   taking the partition over (fence, catch up, resume) and standing by
    processor.py    the loop: standby, activate, serve batches
    settings.py     its knobs (docs/reference/settings.md)

Importing this package loads only the light modules: a decider needs `Decision` and
`CommandError`, not Kafka's client or OpenTelemetry; `CommandProcessor` loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from libs.commands.decision import BulkEvents, Decide, Decision, Gossip, PointReads, header, stamp, stamped
from libs.commands.policy import Policy
from libs.errors import CommandError
from libs.headers import CORRELATION_ID, REPLY_TO, VECTOR_TIME

if TYPE_CHECKING:
    from libs.commands.processor import CommandProcessor

__all__ = [
    "CORRELATION_ID",
    "REPLY_TO",
    "VECTOR_TIME",
    "BulkEvents",
    "CommandError",
    "CommandProcessor",
    "Decide",
    "Decision",
    "Gossip",
    "PointReads",
    "Policy",
    "header",
    "stamp",
    "stamped",
]


def __getattr__(name: str) -> Any:
    if name == "CommandProcessor":  # loads aiokafka and OpenTelemetry: only for a service's runtime
        from libs.commands.processor import CommandProcessor

        return CommandProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
