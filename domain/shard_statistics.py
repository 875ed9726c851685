"""Following the shards' statistics: the latest report of every shard, as the balancer and the
dashboard read them from `shard.stats` (compacted: one report per shard, keyed by shard id).

Reads `shard.stats` from its start and then its tail; writes nothing.  A report that does not
parse is logged and skipped: the shard publishes a fresh one within its interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from libs.bus import partition_reader
from libs.service import ServiceSettings
from schemas import RecordError, stats

log = logging.getLogger(__name__)


async def follow_shard_statistics(
    settings: ServiceSettings, reader: str, on_report: Callable[[stats.ShardStatistics], None]
) -> None:
    """Call `on_report` with every report on `shard.stats`, oldest first, then as they come (never returns)."""
    topic, bus = settings.topics.shard_stats, settings.bus
    wait = bus.idle_wait_s or 0.5  # an empty fetch only fetches again
    async with partition_reader(bus, topic, client_id=f"{reader}-stats") as r:
        while True:
            for rec in await r.fetch(timeout_s=wait):
                try:
                    report = stats.statistics.decode(rec.value)
                except RecordError as e:
                    log.warning("%s: unreadable statistics at offset %d: %s", reader, rec.offset, e.reason)
                    continue
                on_report(report)
