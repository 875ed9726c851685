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
from libs import kafka
from libs.projection import Projection
from libs.service import ServiceSettings, supervised
from libs.store import Store
from schemas import config as schema


class CatalogFollower:
    def __init__(self, settings: ServiceSettings, store_name: str) -> None:
        self.catalog = Catalog()
        self.store = Store(settings.data_dir / store_name / "catalog")
        self.projection = Projection(
            settings.bootstrap, settings.topics.config_events, schema.events, self.catalog, self.store, name=store_name
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

    async def stop(self) -> None:
        if self._tail:
            self._tail.cancel()
            await asyncio.gather(self._tail, return_exceptions=True)
        await self.projection.stop()
        self.store.close()


async def replay_catalog(bootstrap: str, topic: str, *, until: int | None = None) -> Catalog:
    catalog = Catalog(track_changes=False)

    async def apply(records: list[kafka.KafkaRecord]) -> None:
        for rec in records:
            if until is not None and rec.offset >= until:
                return
            catalog.apply(schema.events.decode(rec.value), rec.offset)

    end = await kafka.read_to_end(bootstrap, topic, apply, client_id="shardlog-catalog-reader")
    catalog.config_time = min(end, until) if until is not None else end
    return catalog
