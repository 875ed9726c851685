"""Read the catalog as of a ConfigTime by replaying config.events in memory.

For readers that need no durable copy (the CLI's `status`, tests): "the
catalog as of ConfigTime N" is the fold of events at offsets below N.
"""

from __future__ import annotations

from aiokafka import TopicPartition

from libs import kafka
from schemas import config as schema
from services.config.catalog import Catalog


async def replay_catalog(bootstrap: str, topic: str, *, until: int | None = None) -> Catalog:
    catalog = Catalog(track_changes=False)
    c = kafka.consumer(bootstrap, client_id="shardlog-catalog-reader")
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)

        async def apply(records):
            for rec in records:
                if until is not None and rec.offset >= until:
                    return
                catalog.apply(schema.events.decode(rec.value), rec.offset)

        end = await kafka.catch_up(c, tp, apply)
        catalog.config_time = min(end, until) if until is not None else end
        return catalog
    finally:
        await c.stop()
