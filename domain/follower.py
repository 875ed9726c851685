"""The catalog as services other than the config server read it.

- `CatalogFollower`: a read-only, durable copy: a projection of config.events into the
  service's own RocksDB, kept current by tailing the log.  Its position is the ConfigTime
  the service has seen.
- `replay_catalog`: the catalog as of a ConfigTime, replayed in memory, for readers that
  need no durable copy (the CLI's `status`, tests): "the catalog as of ConfigTime N" is the
  fold of the events at offsets below N.
"""

from __future__ import annotations

import asyncio

from domain.catalog import Catalog
from domain.clock import VectorClock
from libs import aio
from libs.bus import Bus, Message, read_to_end
from libs.projection import Projection
from libs.service import ServiceSettings, supervised
from libs.store import Store
from schemas import config as schema


class CatalogFollower:
    def __init__(self, settings: ServiceSettings, store_name: str, clock: VectorClock | None = None) -> None:
        self.catalog = Catalog(clock=clock)  # with a clock: the events' stamps advance it
        self.store = Store(settings.data_dir / store_name / "catalog")
        self.projection = Projection(
            settings.bus, settings.topics.config_events, schema.events, self.catalog, self.store, name=store_name
        )
        self._tail: asyncio.Task[None] | None = None

    @property
    def config_time(self) -> int:
        return self.projection.position

    async def start(self) -> int:
        """Replay to the tip, then keep following in the background; returns the ConfigTime reached."""
        await self.projection.start()
        at = await self.projection.catch_up()
        self._tail = supervised(
            asyncio.create_task(self.projection.follow()), f"{self.projection.name} catalog follower"
        )
        return at

    async def wait_for(self, config_time: int, timeout: float = 30.0) -> None:
        await self.projection.wait_for(config_time, timeout)

    async def refresh(self, timeout: float) -> None:
        """Catch up to the end of config.events as of now (the tail applies it; this waits).
        The log is written only in transactions, so its last offset is a commit or abort
        marker, which the projection's position (last record + 1) never reaches: reaching the
        offset before it is the end.  TimeoutError after `timeout` seconds."""
        end = await self.projection.log_end()

        async def reached() -> None:
            while await self.projection.fetched_to() < end - 1:
                try:
                    await self.projection.wait_for(end, 0.05)
                except TimeoutError:
                    pass

        await aio.wait_for(reached(), timeout)

    def pause(self) -> None:
        """Stop applying config.events until `resume()`: a router with a stale catalog, for tests
        (the tail keeps running, so `refresh` and `wait_for` simply wait)."""
        self.projection.pause()

    def resume(self) -> None:
        self.projection.resume()

    async def stop(self) -> None:
        if self._tail:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)
        await self.projection.stop()
        self.store.close()


async def replay_catalog(bus: str | Bus, topic: str, *, until: int | None = None) -> Catalog:
    catalog = Catalog(track_changes=False)

    async def apply(records: list[Message]) -> None:
        for rec in records:
            if until is not None and rec.offset >= until:
                return
            catalog.apply(schema.events.decode(rec.value), rec.offset)

    end = await read_to_end(bus, topic, apply, client_id="shardlog-catalog-reader")
    catalog.config_time = min(end, until) if until is not None else end
    return catalog
