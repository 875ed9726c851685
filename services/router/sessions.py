"""The router's logical session cache (docs/decisions/0015): the driver of
`domain.logical_sessions.SessionCache`.

Every client operation with an lsid marks its session used; every
`logicalSessionRefreshMillis` the cache writes what `SessionCache.flush` says to the
sessions store (`<cluster>.sessions`).  endSessions / killSessions write their
tombstones at once, so the reply means the store no longer has them.  Writes to the
store go through one lock, so an end is never overtaken by a flush that still had the
session.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from domain.follower import CatalogFollower
from domain.logical_sessions import (
    SessionCache,
    SessionsReader,
    check_lsid,
    now_ms,
    refresh_period,
    session_id,
    timeout_ms,
)
from libs.bus import BusError, Producer
from libs.service import ServiceSettings
from schemas import Codec

log = logging.getLogger(__name__)


class LogicalSessionCache:
    def __init__(self, settings: ServiceSettings, follower: CatalogFollower, name: str) -> None:
        self.bus, self.topic, self.name = settings.bus, settings.topics.sessions, name
        self.follower = follower
        self.cache = SessionCache()
        self.store = SessionsReader(self.bus, self.topic, client_id=f"{name}-sessions")
        self._lock = asyncio.Lock()
        self._producer: Producer | None = None
        self.flushes = 0

    async def start(self) -> None:
        self._producer = self.bus.producer(client_id=f"{self.name}-sessions")
        await self._producer.start()
        await self.store.start()

    async def stop(self) -> None:
        await self.store.stop()
        if self._producer is not None:
            await self._producer.stop()

    def use(self, lsid: Any) -> dict[str, Any]:
        """Mark an operation's session used; its checked lsid (or MongoDB's error for it)."""
        checked = check_lsid(lsid)
        self.cache.use(checked, now_ms())
        return checked

    async def end(self, lsids: list[dict[str, Any]]) -> None:
        """Remove these sessions from the cache and the store (endSessions, killSessions)."""
        ids = [session_id(lsid) for lsid in lsids]
        async with self._lock:
            self.cache.end(ids)
            await self._write([], ids)

    async def run(self) -> None:
        """Flush every logicalSessionRefreshMillis (read again each time: a setting may change)."""
        while True:
            await refresh_period(self.follower)
            try:
                await self.flush()
            except BusError as e:  # the next refresh tries again with what is still due
                log.warning("%s: session refresh failed: %s", self.name, e)

    async def flush(self) -> None:
        async with self._lock:
            plan = self.cache.flush(now_ms(), timeout_ms(self.follower.catalog.settings), self.store.view.sessions)
            await self._write([(session_id(s.lsid), Codec.encode(s)) for s in plan.upserts], plan.tombstones)
            self.flushes += 1
            if plan.upserts or plan.tombstones:
                log.debug("%s: refreshed %d sessions, ended %d", self.name, len(plan.upserts), len(plan.tombstones))

    async def _write(self, upserts: list[tuple[str, bytes]], tombstones: list[str]) -> None:
        if self._producer is None:
            raise RuntimeError(f"{self.name}: session cache not started")
        sent = [await self._producer.send(self.topic, value, key=sid.encode()) for sid, value in upserts]
        sent += [await self._producer.send(self.topic, None, key=sid.encode()) for sid in tombstones]
        if sent:
            await asyncio.gather(*sent)  # acknowledged (acks=all) before the caller replies
