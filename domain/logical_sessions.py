"""Logical sessions (docs/decisions/0015, seed 001 "Logical Sessions"): the sessions store, as
routers and shards read it, and the router's logical session cache.

- The store is `<cluster>.sessions` (`schemas.sessions`): compacted, keyed by the lsid's id,
  the latest `Session` (lsid, lastUse in epoch ms) of every session; a tombstone ends one.
- A session is **expired** when its last use is older than `logicalSessionTimeoutMinutes`;
  it is **live** when the store has it and it is not expired.
- `SessionCache` is a router's cache (pure): operations mark their session used; every
  `logicalSessionRefreshMillis` a `flush` says which sessions to write to the store (used
  since the last flush, unless the store already has a later use) and which to tombstone
  (expired in the store and not used here: nobody else deletes them, and the topic must stay
  bounded), and drops the expired ones from the cache.
- `SessionsReader` keeps the store's live sessions in memory (read to the end, then tail).

Several routers may tombstone the same expired session: harmless, compaction keeps one.  A
router that tombstones a session another router has just used (its view of the store lagging
by less than one poll) loses that use until the session's next use: shards keep a session's
records while its last write is younger than the timeout anyway, so nothing is reaped early.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.session import parse_lsid
from domain.settings import ClusterSettings
from libs.bus import Bus, Message, connect, partition_reader, read_to_end
from libs.errors import CommandError
from libs.service import supervised
from schemas import RecordError
from schemas.sessions import Session, sessions

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def timeout_ms(settings: ClusterSettings) -> int:
    return max(1, int(settings.logicalSessionTimeoutMinutes * 60_000))


async def refresh_period(follower: CatalogFollower) -> None:
    """Sleep one logicalSessionRefreshMillis, in steps of at most a second, so that a changed
    setting takes effect within a second rather than after the old period."""
    start = time.monotonic()
    while True:
        left = follower.catalog.settings.logicalSessionRefreshMillis / 1000 - (time.monotonic() - start)
        if left <= 0:
            return
        await asyncio.sleep(min(left, 1.0))


def expired(last_use_ms: int, now: int, timeout: int) -> bool:
    """A session (or a record) last used `timeout` ms or more ago."""
    return last_use_ms <= now - timeout


def session_id(lsid: Mapping[str, Any]) -> str:
    """The store's key of a (checked) lsid: its id, as text."""
    return str(lsid["id"])


def check_lsid(value: Any) -> dict[str, Any]:
    """A client's lsid, `{"id": "<uuid>"}` in canonical form, or MongoDB's error for it
    (`domain.session.parse_lsid`: TypeMismatch, IDLFailedToParse, IDLUnknownField, BadValue)."""
    sid = parse_lsid(value)
    if sid is None:
        raise CommandError(ErrorCode.TypeMismatch, "BSON field 'lsid' is the wrong type 'null', expected type 'object'")
    return {"id": sid}


def check_lsids(value: Any, command: str) -> list[dict[str, Any]]:
    """The lsids of an endSessions / killSessions: an array of lsids, each checked; all or nothing."""
    if not isinstance(value, list):
        raise CommandError(
            ErrorCode.TypeMismatch,
            f"BSON field '{command}' is the wrong type '{type(value).__name__}', expected type 'array'",
        )
    return [check_lsid(v) for v in value]


# --------------------------------------------------------------------- the store, in memory


@dataclass
class SessionsView:
    """The store's sessions as its topic says (the fold of `<cluster>.sessions`)."""

    sessions: dict[str, Session] = field(default_factory=dict)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        sid = key.decode(errors="replace")
        if value is None:
            self.sessions.pop(sid, None)
            return
        try:
            self.sessions[sid] = sessions.decode(value)
        except RecordError as e:  # not ours to repair: the next write of that session replaces it
            log.warning("sessions store: unreadable record for %s: %s", sid, e.reason)

    def is_live(self, sid: str, now: int, timeout: int) -> bool:
        s = self.sessions.get(sid)
        return s is not None and not expired(s.lastUse, now, timeout)

    def live(self, now: int, timeout: int) -> list[Session]:
        return [s for s in self.sessions.values() if not expired(s.lastUse, now, timeout)]


class SessionsReader:
    """A `SessionsView` kept current: `start()` reads the store to its end, then tails it."""

    def __init__(self, bus: str | Bus, topic: str, *, client_id: str = "shardlog-sessions") -> None:
        self.bus, self.topic, self.client_id = bus, topic, client_id
        self.view = SessionsView()
        self.position = 0
        self._tail: asyncio.Task[None] | None = None

    async def _apply(self, records: list[Message]) -> None:
        for rec in records:
            self.view.apply(rec.key, rec.value)
            self.position = rec.offset + 1

    async def start(self) -> None:
        self.position = await read_to_end(self.bus, self.topic, self._apply, client_id=self.client_id)
        self._tail = supervised(asyncio.create_task(self._follow()), f"{self.client_id} sessions reader")

    async def _follow(self) -> None:
        bus = connect(self.bus)
        wait = bus.idle_wait_s or 0.5  # an empty fetch only fetches again
        async with partition_reader(bus, self.topic, start=self.position, client_id=self.client_id) as r:
            while True:
                await self._apply(await r.fetch(timeout_s=wait))

    async def stop(self) -> None:
        if self._tail:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)


# --------------------------------------------------------------------- the router's cache


@dataclass
class CachedSession:
    lsid: dict[str, Any]
    last_use: int
    flushed: int = -1  # the last use written to the store


@dataclass(frozen=True)
class Flush:
    """What one refresh writes to the store."""

    upserts: list[Session]
    tombstones: list[str]  # session ids


@dataclass
class SessionCache:
    """A router's logical session cache: lsid id -> the session and its last use here."""

    sessions: dict[str, CachedSession] = field(default_factory=dict)

    def use(self, lsid: dict[str, Any], now: int) -> None:
        sid = session_id(lsid)
        cached = self.sessions.get(sid)
        if cached is None:
            self.sessions[sid] = CachedSession(lsid, now)
        else:
            cached.last_use = max(cached.last_use, now)

    def end(self, ids: Iterable[str]) -> None:
        for sid in ids:
            self.sessions.pop(sid, None)

    def flush(self, now: int, timeout: int, store: Mapping[str, Session]) -> Flush:
        upserts = []
        for sid, cached in list(self.sessions.items()):
            if expired(cached.last_use, now, timeout):
                del self.sessions[sid]  # idle here for the whole timeout: the store expires it
                continue
            stored = store.get(sid)
            if cached.last_use > cached.flushed and (stored is None or stored.lastUse < cached.last_use):
                upserts.append(Session(lsid=cached.lsid, lastUse=cached.last_use))
            cached.flushed = cached.last_use
        tombstones = [sid for sid, s in store.items() if expired(s.lastUse, now, timeout) and sid not in self.sessions]
        return Flush(upserts, sorted(tombstones))
