"""What a service tells its command processor: how it decides a command, and the few behaviours
in which services differ.  One object per service (`ConfigPolicy`, `ShardPolicy`,
`BalancerPolicy`); the defaults are the plain case: every reply waits for its events' acks, no
command is read outside the transaction, events are unkeyed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.commands.decision import Decision, PointReads
from schemas import Record

if TYPE_CHECKING:
    from libs.bus import Message


class Policy:
    # Some commands never write and may be answered from the committed state outside the
    # transaction (`is_plain_read`): the processor then runs a second, plain producer.
    plain_reads: bool = False
    # Some replies may leave with their events, before the acks (`replies_with_events`): the
    # processor then readies the batch's inboxes before its first event.
    one_phase_replies: bool = False
    # Which plain reads read one document, and which documents an event changes: such a read is
    # answered while a transaction is in flight when none of its events touches that document.
    # None: plain reads wait for the transaction.
    point_reads: PointReads | None = None

    def decide(self, command: Record) -> Decision:
        """The command's events and result, raising CommandError to refuse it.  Must not mutate
        state: the processor applies the events, so the next command of the batch sees them."""
        raise NotImplementedError

    def on_role(self, role: str) -> None:
        """Told "active" once the processor serves, "standby" once it no longer does."""

    def event_key(self, event: Record) -> bytes | None:
        """The Kafka key of an event (what compaction keeps the last of); None: unkeyed."""
        return None

    async def prepare(self, records: list[Message]) -> None:
        """Awaited before a fetched batch is decided (a shard catches up to its ConfigTime)."""

    def is_plain_read(self, command: Record) -> bool:
        """Does this command never write, so that it may be answered outside the transaction
        when it heads a batch (only asked when `plain_reads`)?"""
        return False

    def replies_with_events(self, command: Record) -> bool:
        """May this command's reply leave with its events, before their acks, naming the
        changelog position before its batch (only asked when `one_phase_replies`)?"""
        return False
