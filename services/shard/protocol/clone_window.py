"""The donor's window of clone batches in flight (docs/reference/chunk-migration.md, "the
bulk clone"): pure bookkeeping, driven by `donor.DonorCoordinator`.

    open     a batch may be sent: fewer than `limit` are unacknowledged (and no barrier)
    sent     a batch goes out: it gets the next sequence number
    acked    its reply arrived (replies may come in any order; a late duplicate is ignored)
    timeout  no reply for a while: every unacknowledged batch is sent again, in order
    drained  every batch sent was acknowledged: the barrier before the sessions batches
             and the mods pass, which must not overtake a clone batch

A batch is idempotent on the recipient (its documents are written as they are on the donor,
and none is written by anyone else before the clone is committed), so sending one twice
is harmless; the window only bounds the bytes in flight and keeps resends in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

B = TypeVar("B")


@dataclass
class CloneWindow(Generic[B]):
    limit: int  # batches in flight at most (migrationCloneBatchesInFlight; 1 while throttled)
    _unacked: dict[int, B] = field(default_factory=dict)  # by sequence number, in sending order
    _next: int = 0

    def open(self) -> bool:
        """Whether another batch may be sent now."""
        return len(self._unacked) < max(1, self.limit)

    def sent(self, batch: B) -> int:
        """Record a batch sent; its sequence number."""
        seq = self._next
        self._next += 1
        self._unacked[seq] = batch
        return seq

    def acked(self, seq: int) -> B | None:
        """Record a batch's reply; the batch (None: acknowledged already, or never sent)."""
        return self._unacked.pop(seq, None)

    def timed_out(self) -> Iterator[tuple[int, B]]:
        """Every unacknowledged batch, in the order they were first sent: to send again."""
        yield from list(self._unacked.items())

    @property
    def in_flight(self) -> int:
        return len(self._unacked)

    def drained(self) -> bool:
        return not self._unacked
