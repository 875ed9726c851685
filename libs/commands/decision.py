"""One command decided: what a service's `decide` returns, and what the processor makes of it (its
events stamped by the vector clock and encoded, or its refusal, as a reply).  Pure but for the
clock's ticks; no Kafka, no tracing: deciders and the domain import this module alone."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from libs.errors import CommandError
from libs.headers import VECTOR_TIME
from schemas import Codec, Record, RecordError, Tombstone
from schemas.reply import Reply

log = logging.getLogger(__name__)


class Gossip(Protocol):
    """What the runtime needs of a vector clock (domain.clock.VectorClock): tick once per stamped
    event, advance from a request's `vector-time` header, put its own on replies."""

    @property
    def cluster_time(self) -> int: ...

    def tick(self, wall: float | None = None) -> int: ...

    def gossip_in(self, raw: bytes | None) -> None: ...

    def gossip_out(self) -> bytes: ...


class PointReads(Protocol):
    """What a service tells the processor so that it may answer some plain reads while a
    transaction is in flight (docs/reference/command-processor.md, "Point reads during a
    transaction")."""

    def key(self, command: Record) -> bytes | None:
        """The one document a plain read reads, as the key `changed` names it with; None: the
        read may depend on more (it waits for the transaction)."""
        ...

    def changed(self, event: Record) -> tuple[bytes, ...] | None:
        """The documents an event changes (empty: none that a point read reads); None: it may
        change what any read sees."""
        ...


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


@dataclass
class Decided:
    """A command decided by the processor: its reply (without the positions a transaction
    fills in), its events stamped and encoded, or the reason it is a dead letter."""

    reply: Reply
    command: Record | None = None  # None: it did not decode
    events: list[Record] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    op_time: int | None = None  # the command's last stamp
    dead_letter: str | None = None
    bulk: BulkEvents | None = None  # a clone batch's events, recorded before `events`
    bulk_records: tuple[list[bytes], list[bytes]] = ([], [])  # their stamped (keys, values)


_STAMPED: dict[type, bool] = {}


def stamped(record: Record) -> bool:
    """Does this kind of event carry a ClusterTime stamp (a `ts` field)?"""
    kind = type(record)
    if (has := _STAMPED.get(kind)) is None:
        has = _STAMPED[kind] = "ts" in kind.model_fields
    return has


def stamp(clock: Gossip, event: Record) -> Record:
    """The event with a tick of its own, if its kind is stamped and it carries no stamp yet (a
    transaction's commit gives all its writes one stamp, ticked when decided: decisions/0020)."""
    if not stamped(event) or event.ts is not None:  # type: ignore[attr-defined]
        return event
    return event.model_copy(update={"ts": clock.tick()})


def header(headers: Iterable[tuple[str, bytes]] | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


def encode_value(event: Record) -> bytes | None:
    """An event as its log stores it: JSON, or a null value for a tombstone (which needs a key)."""
    if isinstance(event, Tombstone):
        if not event.key:
            raise ValueError("a tombstone needs a key")
        return None
    return Codec.encode(event)


@dataclass
class Decider:
    """Decides one consumed command at a time for a processor named `name`."""

    name: str
    codec: Codec[Record]
    decide: Decide
    clock: Gossip | None

    def __call__(self, value: bytes | None, headers: Any, offset: int, command: Record | None) -> Decided:
        """The command's decision as a reply; a record that does not decode (`command` None) is
        decoded here and may become a dead letter."""
        if self.clock is not None:
            self.clock.gossip_in(header(headers, VECTOR_TIME))
        try:
            if command is None:
                command = self.codec.decode(value)
            return self._accepted(command, self.decide(command))
        except RecordError as e:
            return Decided(Reply(ok=False, code="BadRecord", error=e.reason), dead_letter=e.reason)
        except CommandError as e:
            return Decided(Reply(ok=False, code=e.code, error=e.message, result=e.info), command)
        except Exception as e:  # a bug in deciding must not wedge the log: report it, decide nothing
            log.error("%s: command at offset %d failed:\n%s", self.name, offset, traceback.format_exc())
            return Decided(Reply(ok=False, code="InternalError", error=f"{type(e).__name__}: {e}"), command)

    def _accepted(self, command: Record, decision: Decision) -> Decided:
        """Stamp the decision's events (the bulk ones first: they precede the others in the log)
        and encode them all before any is applied: an event that cannot be written must refuse
        the command, not leave state the log will never show."""
        clock, bulk = self.clock, decision.bulk
        bulk_records: tuple[list[bytes], list[bytes]] = ([], [])
        op_time: int | None = None  # the command's last stamp
        if bulk is not None and len(bulk):
            wall = time.time()
            ticks = [clock.tick(wall) for _ in range(len(bulk))] if clock is not None else None
            bulk_records = bulk.encode(ticks)
            op_time = ticks[-1] if ticks else None
        events = decision.events
        if clock is not None:
            events = [stamp(clock, e) for e in events]
            op_time = next((e.ts for e in reversed(events) if stamped(e)), op_time)  # type: ignore[attr-defined]
        values = [encode_value(event) for event in events]
        reply = Reply(ok=True, result=decision.result)
        return Decided(reply, command, events, values, op_time, bulk=bulk, bulk_records=bulk_records)
