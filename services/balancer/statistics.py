"""The balancer's statistics reader: the latest report of every shard.

Reads `shard.stats` (compacted: one report per shard, its data size per chunk and per
collection, and the ConfigTime it was taken at).  Writes nothing: the round loop turns
the reports into chunk sizes for the policy, the executor answers dataSize from them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

from domain.catalog import Catalog
from domain.shard_statistics import follow_shard_statistics
from domain.shardkey import from_ejson, to_ejson
from libs import aio
from libs.service import ServiceSettings
from schemas import stats

log = logging.getLogger(__name__)


class StatisticsReader:
    """The latest report of every shard, from the compacted `shard.stats` topic."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.latest: dict[str, stats.ShardStatistics] = {}
        self._changed = asyncio.Event()

    async def run(self) -> None:
        await follow_shard_statistics(self.settings, "balancer", self._on_report)

    def _on_report(self, report: stats.ShardStatistics) -> None:
        self.latest[report.shard] = report
        self._changed.set()

    def sizes(self, catalog: Catalog, current: Collection[str] = ()) -> tuple[dict[tuple[str, bytes], int], list[str]]:
        """(ns, chunk min key) -> data size; and the shards whose sizes are not known yet:
        those owning chunks with no report at all, and those of `current` (the shards the
        balancer's last actions changed) whose report does not show the chunks they own
        now.  A shard reports as soon as its chunks change (services/shard/statistics.py),
        so a round waits for those reports only, not for the next periodic ones.

        A chunk is sized only by a report on exactly its range (the newest such report, of
        the collection's incarnation), whoever made it: right after a migration the donor's
        last report may still describe the chunk (the same data, so its size holds) or a
        range it has since split, and the recipient's report may be newer or older.  Sizing
        a chunk from a report on another range (a former layout) gave wrong sizes until
        both shards reported again; a chunk no report describes is left out (unknown)."""
        found: dict[tuple[str, bytes, bytes], tuple[int, int]] = {}  # (ns, min, max) -> (configTime, size)
        for report in self.latest.values():
            epochs = {c.ns: c.epoch for c in report.collections}
            for ch in report.chunks:
                coll = catalog.collections.get(ch.ns)
                if coll is None or epochs.get(ch.ns, coll.epoch) != coll.epoch:
                    continue
                k = (
                    ch.ns,
                    coll.pattern.encode_bound(from_ejson(ch.min)),
                    coll.pattern.encode_bound(from_ejson(ch.max)),
                )
                if (seen := found.get(k)) is None or seen[0] < report.configTime:
                    found[k] = (report.configTime, ch.dataSizeBytes)
        out: dict[tuple[str, bytes], int] = {}
        owned: dict[str, list[tuple[str, Any, Any]]] = {}  # shard -> its chunks (ns, min, max), as a report lists them
        for ns in sorted(catalog.collections):
            coll = catalog.collections[ns]
            for c in coll.chunks:
                owned.setdefault(c.shard, []).append((ns, c.min, c.max))
                if (hit := found.get((ns, c.min_key, c.max_key))) is not None:
                    out[(ns, c.min_key)] = hit[1]
        stale = []
        for shard in sorted(set(owned) | set(current)):
            last = self.latest.get(shard)
            if shard in owned and last is None:
                stale.append(shard)
            elif shard in current and not shows(last, owned.get(shard, [])):
                stale.append(shard)
        return out, stale

    def shard_sizes(self) -> dict[str, int]:
        """Shard -> its data of every sharded collection, as last reported."""
        return {sh: sum(c.dataSizeBytes for c in r.collections) for sh, r in self.latest.items()}

    async def changed(self, timeout: float) -> None:
        """Until a new report comes in, or `timeout` seconds."""
        self._changed.clear()
        try:
            await aio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass


def shows(report: stats.ShardStatistics | None, chunks: list[tuple[str, Any, Any]]) -> bool:
    """Whether `report` lists exactly `chunks` (ns, min, max in key order, by namespace):
    the shard's layout as the balancer's catalog has it."""
    if report is None:
        return not chunks
    if len(report.chunks) != len(chunks):
        return False
    return all(
        r.ns == ns and r.min == to_ejson(lo) and r.max == to_ejson(hi) for r, (ns, lo, hi) in zip(report.chunks, chunks)
    )
