"""A read-only, durable copy of the catalog for services other than the config
server: a projection of config.events into the service's own RocksDB, kept
current by tailing the log.  Its position is the ConfigTime the service has seen."""

from __future__ import annotations

import asyncio

from libs.projection import Projection
from libs.service import ServiceSettings, supervised
from libs.store import Store
from schemas import config as schema
from services.config.catalog import Catalog


class CatalogFollower:
    def __init__(self, settings: ServiceSettings, store_name: str):
        self.catalog = Catalog()
        self.store = Store(settings.data_dir / store_name / "catalog")
        self.projection = Projection(
            settings.bootstrap, settings.topics.config_events, schema.events, self.catalog, self.store, name=store_name
        )
        self._tail: asyncio.Task | None = None

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

    async def stop(self) -> None:
        if self._tail:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)
        await self.projection.stop()
        self.store.close()
