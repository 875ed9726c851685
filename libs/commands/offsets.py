"""Where the consumed offsets go (docs/reference/command-processor.md, "Where the consumed offsets
go").  A transaction that writes events records the offset after its commands on them (the
`cmd-end` header); one that writes none commits it to the consumer group.  The group must still
get every position within READ_OFFSETS_COMMIT_S (lag monitoring, and the plain reads answered
outside any transaction, which nothing else records): `GroupOffset` says how far behind it is."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from libs.bus import TransactionalProducer
from libs.commands.settings import READ_OFFSETS_COMMIT_S


def resume_at(committed: int | None, recorded: int | None) -> int:
    """Where a new owner resumes the commands: after both the group's offset and the changelog's
    `cmd-end`.  Both only grow, and each is written only by a committed transaction that took
    every command below it, so the larger is where the last committed transaction stopped."""
    return max(committed or 0, recorded or 0)


class GroupOffset:
    """The offset after the last command answered that the consumer group has not got (None:
    it has them all), and since when it has lagged."""

    def __init__(self, group_id: str, topic: str, partition: int) -> None:
        self.group_id, self.topic, self.partition = group_id, topic, partition
        self.behind: int | None = None
        self.since = 0.0  # monotonic

    def lags(self, end: int) -> None:
        """The group has not got `end`: reads no transaction carried, or a transaction that
        recorded it in the changelog only."""
        if self.behind is None:
            self.since = time.monotonic()
        self.behind = end

    def lagged(self, fraction: float = 1.0) -> bool:
        """Has the group lagged `fraction` of READ_OFFSETS_COMMIT_S?"""
        return self.behind is not None and time.monotonic() - self.since >= READ_OFFSETS_COMMIT_S * fraction

    def due_in(self) -> float | None:
        """Seconds until the group has lagged READ_OFFSETS_COMMIT_S (None: it does not lag)."""
        return None if self.behind is None else self.since + READ_OFFSETS_COMMIT_S - time.monotonic()

    def got(self, offset: int | None = None) -> None:
        """A commit gave the group `offset` (None: everything answered so far)."""
        if offset is None or self.behind == offset:
            self.behind = None

    async def send(self, producer: TransactionalProducer, end: int) -> None:
        """Into the producer's open transaction."""
        await producer.send_offsets(self.group_id, self.topic, self.partition, end)

    async def commit_alone(self, producer: TransactionalProducer, first: Callable[[], Awaitable[None]]) -> None:
        """No transaction came to carry the answered commands' offsets: commit them in one of their
        own, once `first` (every read's reply acked) is done."""
        offset = self.behind
        if offset is None:
            return
        await first()
        await producer.begin()
        await self.send(producer, offset)
        await producer.commit()
        self.got(offset)
