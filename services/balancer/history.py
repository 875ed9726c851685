"""The balancer's migration history: when chunk ranges last moved, for the auto-merger.

Reads `config.events` from `horizon()` seconds ago (found by timestamp, not from the log's
start) and keeps the `MigrationCommitted` records: the moved range, its collection epoch
and when the config server appended it.  Reads again from further back if the window
grows.  Writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from domain.catalog import Collection
from domain.shardkey import from_ejson
from libs.bus import catch_up, partition_reader
from libs.service import ServiceSettings
from schemas import RecordError
from schemas import config as cfg


class MigrationHistory:
    """When chunk ranges last moved, for the auto-merger's history window (both
    minSnapshotHistoryWindowInSeconds and the transaction lifetime limit must have
    passed since a chunk moved before it is merged)."""

    def __init__(self, settings: ServiceSettings, horizon: Callable[[], float]):
        self.settings, self.horizon = settings, horizon
        self.moved: dict[
            str, list[tuple[str, dict[str, Any], dict[str, Any], float]]
        ] = {}  # ns -> (epoch, min, max, unix time)
        self.position = 0  # the next offset of config.events to read
        self.caught_up = asyncio.Event()  # until then, recent migrations may be missing

    async def run(self) -> None:
        s = self.settings
        async with partition_reader(s.bus, s.topics.config_events, client_id="balancer-history") as r:
            while True:
                since = self.horizon()
                found = await r.offset_for_time(int((time.time() - since) * 1000))
                self.position = found if found is not None else await r.log_end()
                r.seek(self.position)
                self.moved.clear()
                self.caught_up.clear()
                await catch_up(r, self._take)
                self.caught_up.set()
                while self.horizon() <= since:
                    await self._take(await r.fetch(timeout_s=0.5))

    async def _take(self, records: Iterable[Any]) -> None:
        for rec in records:
            self.position = rec.offset + 1
            if b"MigrationCommitted" not in rec.value:
                continue  # most events: no need to decode them
            try:
                e = cfg.events.decode(rec.value)
            except RecordError:
                continue
            if isinstance(e, cfg.MigrationCommitted):  # the moved chunk (the donor's control chunk stays put)
                self.moved.setdefault(e.ns, []).extend(
                    (e.epoch, ch.min, ch.max, rec.timestamp / 1000) for ch in e.chunks if ch.shard == e.recipient
                )

    async def wait_for(self, config_time: Callable[[], int], timeout: float = 30.0) -> None:
        """Until every migration the catalog shows at `config_time()` is known here."""
        deadline = time.monotonic() + timeout
        while not self.caught_up.is_set() or self.position < config_time():
            if time.monotonic() > deadline:
                raise TimeoutError(f"migration history behind ConfigTime {config_time()}")
            await asyncio.sleep(0.05)

    def last_migrated(self, coll: Collection) -> dict[bytes, float]:
        """Chunk min key -> when a migration last involved a range overlapping the chunk (a
        split keeps the history; a merged chunk keeps its parts')."""
        cutoff = time.time() - self.horizon()
        self.moved[coll.ns] = kept = [m for m in self.moved.get(coll.ns, ()) if m[3] >= cutoff]  # the rest is history
        moved = [
            (coll.pattern.encode_bound(from_ejson(lo)), coll.pattern.encode_bound(from_ejson(hi)), at)
            for epoch, lo, hi, at in kept
            if epoch == coll.epoch
        ]
        out: dict[bytes, float] = {}
        for ch in coll.chunks if moved else ():
            times = [at for lo, hi, at in moved if lo < ch.max_key and ch.min_key < hi]
            if times:
                out[ch.min_key] = max(times)
        return out
