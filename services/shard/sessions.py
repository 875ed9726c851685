"""The shard's session reaper (docs/decisions/0015): the records of expired sessions go.

Every `logicalSessionRefreshMillis`, while this instance is the shard's active one, the
reaper picks the transactions-table entries whose last write is older than
`logicalSessionTimeoutMinutes` and whose session is not live in the sessions store
(`forgettable`, pure), and asks its own shard to forget them: `ForgetSessions` on the
shard's request topic, decided like any write, so the removal is a changelog tombstone per
record key in one transaction and compaction then drops the records.  `before` (now minus
the timeout) lets the shard keep a session that wrote again after it was picked.

A session used only for reads keeps its records while the store has it live: the router
refreshes it there.  With a refresh period longer than the timeout a just-used session
might not be in the store yet; its last write is then younger than the timeout, so it
is kept anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from domain.follower import CatalogFollower
from domain.logical_sessions import SessionsReader, now_ms, refresh_period, timeout_ms
from libs.bus import Bus, BusError
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import shard as s

log = logging.getLogger(__name__)

FORGET_BATCH = 500  # sessions per ForgetSessions: one shard transaction stays small
REQUEST_TIMEOUT_S = 30.0
SETTINGS_RECHECK_S = 1.0  # the transaction reaper reads transactionLifetimeLimitSeconds this often at least


def forgettable(
    entries: Iterable[tuple[str, float]], is_live: Callable[[str], bool], now_s: float, timeout_s: float
) -> list[str]:
    """The sessions (lsid uuids) whose records may go: last write (unix seconds) at least the
    timeout ago, and not live in the sessions store.  Sorted, each once."""
    before = now_s - timeout_s
    return sorted({lsid for lsid, last_write in entries if last_write <= before and not is_live(lsid)})


def expired_transactions(records: Iterable[s.TxnRecorded], now_s: float, limit_s: float) -> list[s.AbortTransaction]:
    """The aborts of the transactions still in progress `limit_s` after they began here
    (transactionLifetimeLimitSeconds).  A prepared one is not the shard's to end: only its
    coordinator's decision ends it."""
    return [
        s.AbortTransaction(lsid=r.lsid, txnNumber=r.txnNumber)
        for r in records
        if r.state == "in-progress" and r.startedAt + limit_s <= now_s
    ]


def transaction_reaper_period(limit_s: float) -> float:
    return min(max(limit_s / 4, 0.05), 15.0)


@dataclass(frozen=True)
class ReaperDeps:
    shard_id: str
    topics: Topics
    bus: Bus
    follower: CatalogFollower  # the settings: timeout and refresh period
    active: asyncio.Event  # set while this instance is the shard's active one
    transactions: Callable[[], Iterable[tuple[str, float]]]  # (lsid, last write) of every entry
    open_transactions: Callable[[], Iterable[s.TxnRecorded]] = tuple  # multi-document ones (decisions/0020)


class SessionReaper:
    def __init__(self, deps: ReaperDeps) -> None:
        self.deps = deps
        self.requester = Requester(
            deps.bus, deps.topics.session_reaper_inbox(deps.shard_id), client_id=f"shard-{deps.shard_id}-sessions"
        )
        self.store = SessionsReader(deps.bus, deps.topics.sessions, client_id=f"shard-{deps.shard_id}-sessions")
        self.forgotten = 0  # sessions this reaper has had forgotten (tests, logs)
        self.transactions_aborted = 0  # transactions over their lifetime limit aborted
        self.passes = 0

    async def run(self) -> None:
        d = self.deps
        await d.bus.create_topics([TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        await self.requester.start()
        await self.store.start()
        expiring = asyncio.create_task(self.run_transactions())
        try:
            while True:
                await d.active.wait()
                await refresh_period(d.follower)
                if not d.active.is_set():
                    continue
                try:
                    await self.reap()
                except (BusError, RequestTimeout) as e:  # the next pass picks them again
                    log.warning("shard %s: session reaping failed: %s", d.shard_id, e)
        finally:
            expiring.cancel()
            await asyncio.gather(expiring, return_exceptions=True)
            await asyncio.gather(self.store.stop(), self.requester.stop(), return_exceptions=True)

    async def run_transactions(self) -> None:
        """Abort the multi-document transactions over their lifetime limit, every quarter of it;
        the limit is read again at least every second, so a shorter one set meanwhile is
        followed at once rather than after the old period."""
        d = self.deps
        last = time.monotonic()
        while True:
            await d.active.wait()
            limit = d.follower.catalog.settings.transactionLifetimeLimitSeconds
            if (wait := last + transaction_reaper_period(limit) - time.monotonic()) > 0:
                await asyncio.sleep(min(wait, SETTINGS_RECHECK_S))
                continue
            last = time.monotonic()
            if not d.active.is_set():
                continue
            for abort in expired_transactions(d.open_transactions(), time.time(), limit):
                try:
                    reply = await self.requester.request(
                        d.topics.shard_requests(d.shard_id), abort, timeout=REQUEST_TIMEOUT_S
                    )
                except (BusError, RequestTimeout) as e:  # the next pass picks it again
                    log.warning("shard %s: aborting an expired transaction failed: %s", d.shard_id, e)
                    break
                if reply.ok:
                    self.transactions_aborted += 1
                    log.info(
                        "shard %s: aborted transaction %d of session %s: over its lifetime limit",
                        d.shard_id,
                        abort.txnNumber,
                        abort.lsid,
                    )

    async def reap(self) -> int:
        """One pass: ask the shard to forget every forgettable session; how many were asked for."""
        d = self.deps
        timeout = timeout_ms(d.follower.catalog.settings)
        now = now_ms()
        view = self.store.view
        lsids = forgettable(d.transactions(), lambda lsid: view.is_live(lsid, now, timeout), now / 1000, timeout / 1000)
        before = (now - timeout) / 1000
        for i in range(0, len(lsids), FORGET_BATCH):
            part = lsids[i : i + FORGET_BATCH]
            reply = await self.requester.request(
                d.topics.shard_requests(d.shard_id),
                s.ForgetSessions(lsids=part, before=before),
                timeout=REQUEST_TIMEOUT_S,
            )
            if not reply.ok:
                log.warning("shard %s: ForgetSessions refused: %s: %s", d.shard_id, reply.code, reply.error)
                return i
            self.forgotten += len(part)
        self.passes += 1
        if lsids:
            log.info("shard %s: asked to forget the records of %d expired sessions", d.shard_id, len(lsids))
        return len(lsids)
