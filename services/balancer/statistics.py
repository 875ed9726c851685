"""The balancer's statistics reader: the latest report of every shard.

Reads `shard.stats` (compacted: one report per shard, its data size per chunk and per
collection, and the ConfigTime it was taken at).  Writes nothing: the round loop turns
the reports into chunk sizes for the policy, the executor answers dataSize from them.
"""

from __future__ import annotations

import asyncio
import logging

from domain.catalog import Catalog
from domain.shardkey import from_ejson
from libs import kafka
from libs.service import ServiceSettings
from schemas import RecordError, stats

log = logging.getLogger(__name__)


class StatisticsReader:
    """The latest report of every shard, from the compacted `shard.stats` topic."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.latest: dict[str, stats.ShardStatistics] = {}
        self._changed = asyncio.Event()

    async def run(self) -> None:
        s = self.settings
        async with kafka.partition_reader(s.bootstrap, s.topics.shard_stats, client_id="balancer-stats") as (c, tp):
            while True:
                batch = await c.getmany(tp, timeout_ms=500)
                for rec in batch.get(tp, []):
                    try:
                        report = stats.statistics.decode(rec.value)
                    except RecordError as e:
                        log.warning("balancer: unreadable statistics at offset %d: %s", rec.offset, e.reason)
                        continue
                    self.latest[report.shard] = report
                    self._changed.set()

    def sizes(self, catalog: Catalog, fresh_from: int) -> tuple[dict[tuple[str, bytes], int], list[str]]:
        """(ns, chunk min key) -> data size, from reports taken at ConfigTime >= fresh_from;
        and the shards owning chunks whose report is older (their sizes are unknown)."""
        out: dict[tuple[str, bytes], int] = {}
        stale = []
        owners = {ch.shard for coll in catalog.collections.values() for ch in coll.chunks}
        for shard in sorted(owners):
            report = self.latest.get(shard)
            if report is None or report.configTime < fresh_from:
                stale.append(shard)
                continue
            for ch in report.chunks:
                coll = catalog.collections.get(ch.ns)
                if coll is not None:
                    out[(ch.ns, coll.pattern.encode_bound(from_ejson(ch.min)))] = ch.dataSizeBytes
        return out, stale

    def shard_sizes(self) -> dict[str, int]:
        """Shard -> its data of every sharded collection, as last reported."""
        return {sh: sum(c.dataSizeBytes for c in r.collections) for sh, r in self.latest.items()}

    async def changed(self, timeout: float) -> None:
        """Until a new report comes in, or `timeout` seconds."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass
