"""A shard's secondary-index requests, and the driver of their builds.

`IndexDecider` decides BuildIndexes, IndexBuildStep, DropIndexes and ListIndexes with the pure
transitions of `protocol/index_build.py` (fault points `index.*` fire here, before the
decision's transaction commits, for the crash tests).  `IndexBuilder` is the thin driver:
while this instance is the shard's active one, it sends its own shard an `IndexBuildStep`
for every index still building, one after the other, until each is ready or failed.  A
restarted shard's state is the fold of its changelog, so an unfinished build is found there
and goes on from its `scannedTo`.

    SHARDLOG_INDEX_BUILD_BATCH   documents per build step (1000): each step is one short
                                 transaction of the shard, between two of its clients' writes
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from domain.catalog import Catalog
from libs import aio
from libs.bus import Bus, BusError
from libs.commands import Decision
from libs.dispatch import Dispatch
from libs.faults import fault_point
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import indexes as ix
from services.shard.documents import ShardDocuments
from services.shard.protocol import index_build

log = logging.getLogger(__name__)

on_request: Dispatch[IndexDecider, Decision] = Dispatch("shard index request")

STEP_TIMEOUT_S = 30.0
RETRY_PAUSE_S = 1.0  # after a failed step (the broker, a refusal): the next attempt


def step_limit() -> int:
    """SHARDLOG_INDEX_BUILD_BATCH: documents per IndexBuildStep (a positive integer)."""
    raw = os.environ.get("SHARDLOG_INDEX_BUILD_BATCH")
    if not raw:
        return index_build.DEFAULT_STEP_LIMIT
    value = int(raw)
    if value < 1:
        raise ValueError(f"SHARDLOG_INDEX_BUILD_BATCH={raw!r} must be a positive number of documents")
    return value


class IndexDecider:
    """The index requests of one shard; composed into ShardDecider."""

    def __init__(
        self, catalog: Catalog, documents: ShardDocuments, *, fault: Callable[[str], None] = fault_point
    ) -> None:
        self.catalog, self.documents, self.fault = catalog, documents, fault
        self.wake = asyncio.Event()  # set when a build may have begun: the driver looks again

    @staticmethod
    def handles(req: Record) -> bool:
        return on_request.handles(req)

    def decide(self, req: Record) -> Decision:
        return on_request(self, req)

    @on_request.register(ix.BuildIndexes)
    def _build(self, req: ix.BuildIndexes) -> Decision:
        decision = index_build.build_indexes(self.catalog, self.documents, req).decision(self.fault)
        if decision.events:
            self.wake.set()
        return decision

    @on_request.register(ix.IndexBuildStep)
    def _step(self, req: ix.IndexBuildStep) -> Decision:
        return index_build.build_step(self.documents, req).decision(self.fault)

    @on_request.register(ix.DropIndexes)
    def _drop(self, req: ix.DropIndexes) -> Decision:
        return index_build.drop_indexes(self.catalog, self.documents, req).decision(self.fault)

    @on_request.register(ix.ListIndexes)
    def _list(self, req: ix.ListIndexes) -> Decision:
        return Decision([], index_build.list_indexes(self.catalog, self.documents, req))


REQUESTS: tuple[type, ...] = tuple(on_request.table)


@dataclass(frozen=True)
class BuilderDeps:
    shard_id: str
    topics: Topics
    bus: Bus
    active: asyncio.Event  # set while this instance is the shard's active one
    documents: ShardDocuments
    wake: asyncio.Event  # IndexDecider.wake


class IndexBuilder:
    """Sends IndexBuildStep to its own shard for every index still building."""

    def __init__(self, deps: BuilderDeps, *, limit: int | None = None) -> None:
        self.deps = deps
        self.limit = limit if limit is not None else step_limit()
        self.requester = Requester(
            deps.bus,
            deps.topics.inbox(f"shard-{deps.shard_id}-indexes"),
            client_id=f"shard-{deps.shard_id}-indexes",
        )
        self.steps = 0  # steps answered (tests, logs)

    def building(self) -> list[ix.IndexRecorded]:
        return [
            index.record
            for named in list(self.deps.documents.indexes.values())
            for index in list(named.values())
            if index.record.state == index_build.IndexState.BUILDING
        ]

    async def run(self) -> None:
        d = self.deps
        await d.bus.create_topics([TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        await self.requester.start()
        try:
            while True:
                await d.active.wait()
                d.wake.clear()
                work = self.building()
                if not work:
                    try:  # a BuildIndexes decided here wakes us; a standby that took over looks again
                        await aio.wait_for(d.wake.wait(), RETRY_PAUSE_S * 5)
                    except TimeoutError:
                        pass
                    continue
                for record in work:
                    if not d.active.is_set():
                        break
                    await self._step(record)
        finally:
            await self.requester.stop()

    async def _step(self, record: ix.IndexRecorded) -> None:
        d = self.deps
        name = str(record.spec.get("name", ""))
        req = ix.IndexBuildStep(ns=record.ns, name=name, buildId=record.buildId, limit=self.limit)
        try:
            reply = await self.requester.request(d.topics.shard_requests(d.shard_id), req, timeout=STEP_TIMEOUT_S)
        except (RequestTimeout, BusError) as e:
            log.warning("shard %s: index build step of %s.%s failed (%r); retrying", d.shard_id, record.ns, name, e)
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        if not reply.ok:
            log.warning("shard %s: index build step of %s %s refused: %s", d.shard_id, record.ns, name, reply.error)
            await asyncio.sleep(RETRY_PAUSE_S)
            return
        self.steps += 1
        result = reply.result or {}
        if result.get("done"):
            log.info("shard %s: index %s of %s %s", d.shard_id, name, record.ns, result.get("state"))
