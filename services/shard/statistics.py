"""A shard's statistics for the balancer, published to `shard.stats`.

Every `interval_s` (env SHARDLOG_STATS_INTERVAL_S, default 10 s), once as soon as
the shard serves, and as soon as the chunks it owns change (a migration, split or
merge committed: the balancer's next round waits for a report that shows them,
docs/reference/balancer.md), the active instance of a shard reports for every
chunk it owns per its catalog: the number of documents, their stored size, and
the bytes of documents written into the chunk since its previous report.  The
topic is compacted and keyed by shard id: the latest report per shard survives.

Bytes written are counted by `CountingDocuments`, the shard's document state
with one addition: the stored size of every `DocumentWritten` the shard itself
decides (offset -1, see `libs.commands`) is remembered per (ns, shard key).
Counts are pending until the batch's transaction commits (`drain_changes`,
called by `Projection.advance`) and are dropped if it aborts (`load`, called by
`Projection.reset`), so only committed writes are reported; replays of the
changelog (catch-up, a standby following the active instance) are not counted.
The bytes are attributed to chunks when a report is made, by locating each
shard key in the chunk list the report describes; writes into chunks the shard
no longer owns, and into unsharded collections, are not reported.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Iterator

from domain.catalog import Catalog, Chunk
from domain.shardkey import encode_value, to_ejson
from libs.bus import BusError
from libs.service import ServiceSettings, seconds_from_env
from libs.store import Store
from schemas import Codec, Record
from schemas import ddl as dd
from schemas import shard as ev
from schemas import stats as schema
from services.shard.documents import DOCS, ShardDocuments, doc_key, ns_prefix

log = logging.getLogger(__name__)

INTERVAL_ENV = "SHARDLOG_STATS_INTERVAL_S"
DEFAULT_INTERVAL_S = 10.0
YIELD_EVERY = 2000  # documents scanned between two yields to the event loop
LAYOUT_POLL_S = 0.1  # how often the publisher looks for a change of the chunks it owns


def interval_from_env() -> float:
    return seconds_from_env(INTERVAL_ENV, DEFAULT_INTERVAL_S)


WriteKey = tuple[str, bytes]  # (ns, encoded shard key)


class CountingDocuments(ShardDocuments):
    """`ShardDocuments` that also counts the stored bytes of the documents this
    shard writes, per (ns, shard key), for the statistics publisher."""

    def __init__(self) -> None:
        super().__init__()
        self._pending_written: dict[WriteKey, int] = {}  # decided in the open batch
        self._written: dict[WriteKey, int] = {}  # committed, not reported yet

    def load(self, store: Store) -> None:
        super().load(store)
        self._pending_written = {}  # the open batch's writes were aborted (or never were)

    def apply(self, event: Record, offset: int) -> None:
        super().apply(event, offset)
        if isinstance(event, dd.LocalDataDropped):  # the collection is gone: nothing of it to report
            for counts in (self._pending_written, self._written):
                for k in [k for k in counts if _dropped(event, k[0])]:
                    del counts[k]
        if offset < 0 and isinstance(event, ev.DocumentWritten):  # decided here, not replayed
            skey = bytes.fromhex(event.skey)
            raw = self._changes.get(doc_key(event.ns, skey, encode_value(event.doc["_id"])))
            if raw is not None:
                k = (event.ns, skey)
                self._pending_written[k] = self._pending_written.get(k, 0) + len(raw)

    def tentative(self):
        return super().tentative(), dict(self._pending_written)

    def restore(self, saved) -> None:
        changes, self._pending_written = saved
        super().restore(changes)

    def drain_changes(self) -> dict[bytes, bytes | None]:
        # Called when the batch is committed with its checkpoint: its writes happened.
        for k, n in self._pending_written.items():
            self._written[k] = self._written.get(k, 0) + n
        self._pending_written = {}
        return super().drain_changes()

    def take_written(self) -> dict[WriteKey, int]:
        """The committed bytes written since the last call, per (ns, shard key)."""
        out, self._written = self._written, {}
        return out

    def give_back_written(self, taken: dict[WriteKey, int]) -> None:
        """Undo `take_written` (a report that could not be published)."""
        for k, n in taken.items():
            self._written[k] = self._written.get(k, 0) + n

    def range_sizes(self, ns: str, lo: bytes, hi: bytes) -> Iterator[int]:
        """The stored size of every document with a shard key in [lo, hi), the
        batch's pending writes included: `scan` without decoding the documents.
        The overlay and the store iterator are both taken at the first `next()`,
        so the sizes are of one consistent state even if the caller pauses."""
        base = DOCS + ns_prefix(ns)
        start, stop = base + lo, base + hi
        pending = [(k, v) for k, v in self._changes.items() if start <= k < stop]
        overlaid = {k for k, _ in pending}
        for k, v in self._stored(start, stop):
            if k not in overlaid:
                yield len(v)
        for _, v in pending:
            if v is not None:
                yield len(v)


class StatisticsPublisher:
    def __init__(
        self,
        settings: ServiceSettings,
        shard_id: str,
        catalog: Catalog,
        documents: CountingDocuments,
        interval_s: float | None = None,
        *,
        active: asyncio.Event | None = None,
    ):
        """`active`: publish only while it is set (the shard instance that serves its
        partition); None: always."""
        self.settings, self.shard_id, self.catalog, self.documents = settings, shard_id, catalog, documents
        self.interval_s = interval_s if interval_s is not None else interval_from_env()
        self.active = active
        self.layout_poll_s = LAYOUT_POLL_S  # (the simulator looks less often: tests/sim/cluster.py)
        self.published = 0
        self._last_report = time.monotonic()
        self._reported_layout: tuple[tuple[str, str, tuple[int, int]], ...] | None = None  # of the last report sent
        self._computed_layout: tuple[tuple[str, str, tuple[int, int]], ...] | None = None
        self._producer = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._producer = self.settings.bus.producer(client_id=f"shard-{self.shard_id}-stats")
        await self._producer.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def _run(self) -> None:
        while True:
            if self.active is not None and not self.active.is_set():
                await self.active.wait()
            try:
                await self.publish_once()
            except (TimeoutError, BusError, OSError) as e:
                log.warning(
                    "shard %s: statistics not published (%s); retrying in %.1fs", self.shard_id, e, self.interval_s
                )
            except Exception:  # a bug: say so, but keep the shard serving and reporting
                log.exception("shard %s: computing statistics failed", self.shard_id)
            await self._until_due()

    def layout(self) -> tuple[tuple[str, str, tuple[int, int]], ...]:
        """What identifies the chunks this shard owns: every commit that moves, splits or
        merges one of them changes its shard version (a donor's control chunk is bumped)."""
        cols = self.catalog.collections
        return tuple((ns, cols[ns].epoch, cols[ns].shard_version(self.shard_id).pair) for ns in sorted(cols))

    async def _until_due(self) -> None:
        """Until the interval has passed, or the chunks this shard owns are no longer those
        of its last report (a cheap look every `layout_poll_s`, LAYOUT_POLL_S: versions are cached)."""
        deadline = time.monotonic() + self.interval_s
        while (left := deadline - time.monotonic()) > 0:
            if self._reported_layout is not None and self.layout() != self._reported_layout:
                return
            await asyncio.sleep(min(self.layout_poll_s, left))

    async def publish_once(self) -> schema.ShardStatistics:
        written = self.documents.take_written()
        try:
            report = await self.compute(written)
            await (
                await self._producer.send(
                    self.settings.topics.shard_stats, Codec.encode(report), key=self.shard_id.encode()
                )
            )
        except BaseException:
            self.documents.give_back_written(written)  # reported next time
            raise
        self._last_report = time.monotonic()
        self._reported_layout = self._computed_layout
        self.published += 1
        return report

    async def compute(self, written: dict[WriteKey, int]) -> schema.ShardStatistics:
        """The report on the chunks this shard owns now, with `written` attributed to them."""
        config_time = self.catalog.config_time
        layout = self.layout()  # taken with the chunk list below, with no await between
        window = time.monotonic() - self._last_report
        # A snapshot of the layout: the catalog may move on while the documents are scanned.
        owned: list[tuple[str, str, list[Chunk]]] = []
        for ns in sorted(self.catalog.collections):
            coll = self.catalog.collections[ns]
            mine = [ch for ch in coll.chunks if ch.shard == self.shard_id]
            if mine:
                owned.append((ns, coll.epoch, mine))
        chunks: list[schema.ChunkStatistics] = []
        collections: list[schema.CollectionStatistics] = []
        by_ns: dict[str, list[tuple[bytes, int]]] = {}
        for (ns, skey), n in written.items():
            by_ns.setdefault(ns, []).append((skey, n))
        work = 0  # documents (and chunks: a seek and a pass over the overlay each) since the last yield
        for ns, epoch, mine in owned:
            written_here = _attribute(by_ns.get(ns, []), mine)
            totals = [0, 0, 0]
            for i, ch in enumerate(mine):
                docs = size = 0
                work += 1
                for n in self.documents.range_sizes(ns, ch.min_key, ch.max_key):
                    docs += 1
                    size += n
                    work += 1
                    if work >= YIELD_EVERY:
                        work = 0
                        await asyncio.sleep(0)  # let the shard serve between slices of the scan
                if work >= YIELD_EVERY:
                    work = 0
                    await asyncio.sleep(0)
                chunks.append(
                    schema.ChunkStatistics(
                        ns=ns,
                        min=to_ejson(ch.min),
                        max=to_ejson(ch.max),
                        documents=docs,
                        dataSizeBytes=size,
                        bytesWrittenSinceLastReport=written_here[i],
                    )
                )
                totals[0] += docs
                totals[1] += size
                totals[2] += written_here[i]
            collections.append(
                schema.CollectionStatistics(
                    ns=ns,
                    epoch=epoch,
                    chunks=len(mine),
                    documents=totals[0],
                    dataSizeBytes=totals[1],
                    bytesWrittenSinceLastReport=totals[2],
                )
            )
        self._computed_layout = layout
        return schema.ShardStatistics(
            shard=self.shard_id,
            configTime=config_time,
            timestamp=time.time(),
            windowSeconds=round(window, 3),
            chunks=chunks,
            collections=collections,
        )


def _dropped(event: dd.LocalDataDropped, ns: str) -> bool:
    return ns == event.ns if event.ns is not None else ns.partition(".")[0] == event.db


def _attribute(written: list[tuple[bytes, int]], mine: list[Chunk]) -> list[int]:
    """Bytes written per chunk of `mine` (sorted, not necessarily contiguous): a key
    belongs to the last chunk starting at or below it if it is also below its max."""
    out = [0] * len(mine)
    mins = [ch.min_key for ch in mine]
    for skey, n in written:
        i = bisect.bisect_right(mins, skey) - 1
        if i >= 0 and skey < mine[i].max_key:
            out[i] += n
    return out
