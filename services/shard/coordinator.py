"""The driver of the two-phase commits this shard coordinates (protocol/transaction.py;
docs/decisions/0020): a thin async loop around the pure transitions.

For each coordinator record not done, while this instance is the shard's active one:

    preparing   PrepareTransaction to every participant, at once; each answers a prepare stamp
                (yes) or an error (no).  One that does not answer is asked again until
                `transactionLifetimeLimitSeconds` from the coordinator's start, then counts as no.
                -> AdvanceTxnCoordinator(committing, commitAt = the largest stamp) or (aborting)
    committing  CommitTransaction(commitAt) to every participant, asked again until each acks
                -> AdvanceTxnCoordinator(done)
    aborting    AbortTransaction to every participant, likewise -> AdvanceTxnCoordinator(done)

Every step's effect is a record in this shard's changelog, written through its own processor, so
an instance that takes over (or restarts) replays the records and resumes each coordinator at
its state; every request it repeats is answered the same the second time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from domain.follower import CatalogFollower
from libs.bus import Bus, BusError
from libs.commands import Gossip
from libs.faults import fault_point
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import shard as s
from services.shard.protocol import transaction as txns

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 10.0  # one request to a participant
RETRY_S = (0.01, 0.05, 0.2, 1.0)  # pauses between attempts, the last one repeated


@dataclass(frozen=True)
class CoordinatorDeps:
    shard_id: str
    topics: Topics
    bus: Bus
    follower: CatalogFollower  # the settings: transactionLifetimeLimitSeconds
    active: asyncio.Event  # set while this instance is the shard's active one
    coordinators: Callable[[], list[s.TxnCoordinatorRecorded]]  # the records not done
    woken: asyncio.Event  # set when a coordinator record is folded
    # The shard's clock: the votes' prepare stamps reach it (so the decision's commitAt is not
    # ahead of what this shard gossips to the router answering the commit), and the commit
    # carries it to every participant.
    clock: Gossip


class TxnCoordinatorDriver:
    def __init__(self, deps: CoordinatorDeps) -> None:
        self.deps = deps
        self.requester = Requester(
            deps.bus,
            deps.topics.txn_coordinator_inbox(deps.shard_id),
            client_id=f"shard-{deps.shard_id}-txn",
            clock=deps.clock,
        )
        self.running: dict[tuple[str, int], asyncio.Task] = {}
        self.decided = {"commit": 0, "abort": 0}  # (tests, logs)

    async def run(self) -> None:
        d = self.deps
        await d.bus.create_topics([TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        await self.requester.start()
        try:
            while True:
                await d.active.wait()
                d.woken.clear()
                for record in d.coordinators():
                    key = (record.lsid, record.txnNumber)
                    if key not in self.running or self.running[key].done():
                        self.running[key] = asyncio.create_task(self._drive(*key))
                await d.woken.wait()
        finally:
            for task in self.running.values():
                task.cancel()
            await asyncio.gather(*self.running.values(), return_exceptions=True)
            await self.requester.stop()

    def _record(self, lsid: str, txn_number: int) -> s.TxnCoordinatorRecorded | None:
        return next((r for r in self.deps.coordinators() if (r.lsid, r.txnNumber) == (lsid, txn_number)), None)

    async def _drive(self, lsid: str, txn_number: int) -> None:
        """Step one coordinator until it is done (or this instance stops being the active one)."""
        while self.deps.active.is_set() and (record := self._record(lsid, txn_number)) is not None:
            if record.state == "preparing":
                fault_point("txn.coordinator.preparing")
                state, commit_at = await self._votes(record)
                fault_point("txn.coordinator.voted")
                why = "" if state == "committing" else "a participant voted to abort"
                advance = s.AdvanceTxnCoordinator(
                    lsid=lsid, txnNumber=txn_number, state=state, commitAt=commit_at, why=why
                )
            else:
                end: Record = (
                    s.CommitTransaction(lsid=lsid, txnNumber=txn_number, commitAt=record.commitAt)
                    if record.state == "committing"
                    else s.AbortTransaction(lsid=lsid, txnNumber=txn_number)
                )
                fault_point("txn.coordinator.decided")
                await asyncio.gather(*(self._until_acked(p, end) for p in record.participants))
                fault_point("txn.coordinator.ended")
                advance = s.AdvanceTxnCoordinator(lsid=lsid, txnNumber=txn_number, state="done")
                self.decided["commit" if record.state == "committing" else "abort"] += 1
            await self._until_acked(self.deps.shard_id, advance)

    async def _votes(self, record: s.TxnCoordinatorRecorded) -> tuple[str, int | None]:
        limit = self.deps.follower.catalog.settings.transactionLifetimeLimitSeconds
        prepare = s.PrepareTransaction(lsid=record.lsid, txnNumber=record.txnNumber)

        async def vote(participant: str) -> int | None:
            try:
                reply = await asyncio.wait_for(self._answer(participant, prepare), limit)
            except TimeoutError:
                return None  # unreachable all along: a vote to abort
            return int(reply.result["prepareTimestamp"]) if reply.ok and reply.result else None

        stamps = await asyncio.gather(*(vote(p) for p in record.participants))
        return txns.decision_of(dict(zip(record.participants, stamps, strict=True)))

    async def _answer(self, shard: str, req: Record):
        """The shard's reply to `req`, asked again while it does not answer."""
        attempt = 0
        while True:
            try:
                return await self.requester.request(self.deps.topics.shard_requests(shard), req, timeout=ASK_TIMEOUT_S)
            except (BusError, RequestTimeout) as e:
                log.info(
                    "shard %s: transaction coordinator: %s did not answer %s: %s",
                    self.deps.shard_id,
                    shard,
                    req.type,
                    e,
                )
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1

    async def _until_acked(self, shard: str, req: Record) -> None:
        """Ask until `shard` acknowledges `req` (an abort of what it no longer knows is one)."""
        attempt = 0
        while True:
            reply = await self._answer(shard, req)
            if reply.ok or (isinstance(req, s.AbortTransaction) and reply.code == "NoSuchTransaction"):
                return
            log.warning(
                "shard %s: transaction coordinator: %s refused %s: %s: %s",
                self.deps.shard_id,
                shard,
                req.type,
                reply.code,
                reply.error,
            )
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1
