"""A shard: a command processor on `shard.<id>.requests` whose events are the
shard's changelog, folded into its RocksDB documents; plus a follower of the
catalog for versions and ownership."""

from __future__ import annotations

import asyncio
import logging

from domain.clock import VectorClock
from domain.follower import CatalogFollower
from domain.protocol import CONFIG_TIME
from libs.bus import Message
from libs.commands import CommandProcessor, Decision, Policy, header
from libs.metrics import MetricsPublisher, OperationCounters, timed
from libs.projection import Projection
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, count_from_env, report_ready, seconds_from_env, supervised
from libs.store import Store
from schemas import Record
from schemas import shard as schema
from services.shard import history
from services.shard.coordinator import CoordinatorDeps, TxnCoordinatorDriver
from services.shard.decide import PointReads, ShardDecider, plain_read, reply_with_events
from services.shard.documents import changelog_key
from services.shard.donor import DonorCoordinator, DonorDeps
from services.shard.indexes import BuilderDeps, IndexBuilder
from services.shard.sessions import ReaperDeps, SessionReaper
from services.shard.statistics import CountingDocuments, StatisticsPublisher

log = logging.getLogger(__name__)

CONFIG_WAIT_S = 10.0
# The changelog producer's batch: a whole clone batch's records (donor.CLONE_BATCH_BYTES of stored
# documents, ~100 bytes of envelope and key each) are one append to the log, not three.
CHANGELOG_BATCH_BYTES = 4 * 1024 * 1024
# How often each instance deletes the history older than minSnapshotHistoryWindowInSeconds.
HISTORY_RECLAIM_ENV = "SHARDLOG_HISTORY_RECLAIM_S"
HISTORY_RECLAIM_BATCH_ENV = "SHARDLOG_HISTORY_RECLAIM_BATCH"  # entries deleted per step, the loop let go between


class ShardPolicy(Policy):
    """A shard's requests decided against its documents (and counted); Find and Count without
    afterClusterTime answered outside the transaction, point reads during one; every reply but
    EnterCriticalSection's leaves with its events; a batch waits for the catalog to reach the
    ConfigTime its requests name (docs/reference/command-processor.md)."""

    plain_reads = True
    one_phase_replies = True
    point_reads = PointReads()

    def __init__(self, shard: ShardServer) -> None:
        self.shard = shard
        self._decide = timed(shard.operations, shard.decider.decide)

    def decide(self, command: Record) -> Decision:
        return self._decide(command)

    def on_role(self, role: str) -> None:
        self.shard._report(role)

    def event_key(self, event: Record) -> bytes | None:
        return changelog_key(event)

    async def prepare(self, records: list[Message]) -> None:
        await self.shard._catch_up_config(records)

    def is_plain_read(self, command: Record) -> bool:
        return plain_read(command)

    def replies_with_events(self, command: Record) -> bool:
        return reply_with_events(command)


class ShardServer:
    def __init__(self, settings: ServiceSettings, shard_id: str, *, instance: str = "0", max_batch: int = 500):
        self.settings, self.shard_id = settings, shard_id
        self.name = f"shard-{shard_id}"  # the consumer group and transactional id: shared by its instances
        # Each instance keeps stores of its own (a standby folds the changelog into its copy) and
        # its own readiness file; the first one keeps the plain name.
        self.ready_name = self.name if instance == "0" else f"{self.name}-{instance}"
        t = settings.topics
        # Ticked once per document write; resumes from the largest stamp of the store and the catalog.
        self.clock = VectorClock()
        self.follower = CatalogFollower(settings, self.ready_name, clock=self.clock)
        self.documents = CountingDocuments()  # ShardDocuments that also counts bytes written, for statistics
        self.documents.clock = self.clock
        self.store = Store(settings.data_dir / self.ready_name / "documents")
        self.projection = Projection(
            settings.bus,
            t.shard_changelog(shard_id),
            schema.changelog,
            self.documents,
            self.store,
            name=self.name,
        )
        self.decider = ShardDecider(shard_id, self.follower.catalog, self.documents, clock=self.clock)
        self.operations = OperationCounters()  # every request decided, for the per-second metric summaries
        self.processor = CommandProcessor(
            bus=settings.bus,
            command_topic=t.shard_requests(shard_id),
            command_codec=schema.requests,
            projection=self.projection,
            policy=ShardPolicy(self),
            dead_letters=t.dead_letters,
            group_id=settings.topics.group(self.name),
            name=self.name,
            max_batch=max_batch,
            session_timeout_ms=settings.session_timeout_ms,
            clock=self.clock,
            batch_bytes=CHANGELOG_BATCH_BYTES,
        )
        self.donor = DonorCoordinator(
            DonorDeps(
                shard_id=shard_id,
                topics=t,
                bus=settings.bus,
                requester=Requester(
                    settings.bus, t.donor_inbox(shard_id), client_id=f"shard-{shard_id}-donor", clock=self.clock
                ),
                follower=self.follower,
                active=self.processor.active,
                documents=self.documents,
                changelog_position=lambda: self.projection.position,
                progress=self.decider.migrations.progress,
                client_busy=self.decider.migrations.client_busy,
            )
        )
        self.reaper = SessionReaper(
            ReaperDeps(
                shard_id=shard_id,
                topics=t,
                bus=settings.bus,
                follower=self.follower,
                active=self.processor.active,
                transactions=self.documents.session_last_writes,
                open_transactions=lambda: list(self.documents.txns.values()),
            )
        )
        self.coordinator_woken = asyncio.Event()
        self.documents.on_coordinator = self.coordinator_woken.set
        self.txn_coordinator = TxnCoordinatorDriver(
            CoordinatorDeps(
                shard_id=shard_id,
                topics=t,
                bus=settings.bus,
                follower=self.follower,
                active=self.processor.active,
                coordinators=lambda: [r for r in self.documents.coordinators.values() if r.state != "done"],
                woken=self.coordinator_woken,
                clock=self.clock,
            )
        )
        self.index_builder = IndexBuilder(
            BuilderDeps(
                shard_id=shard_id,
                topics=t,
                bus=settings.bus,
                active=self.processor.active,
                documents=self.documents,
                wake=self.decider.indexes.wake,
            )
        )
        self.documents.keeps_history = lambda: self.follower.catalog.settings.minSnapshotHistoryWindowInSeconds > 0
        self.history = history.Reclaimer(
            self.store,
            lambda: self.follower.catalog.settings.minSnapshotHistoryWindowInSeconds,
            seconds_from_env(HISTORY_RECLAIM_ENV, 10.0),
            count_from_env(HISTORY_RECLAIM_BATCH_ENV, 10_000),
        )
        self.statistics = StatisticsPublisher(
            settings, shard_id, self.follower.catalog, self.documents, active=self.processor.active
        )
        self.metrics = MetricsPublisher(
            settings.bus, t.metrics, "shard", shard_id, active=self.processor.active, counters=self.operations
        )

    async def _catch_up_config(self, records) -> None:
        """A shard behind the router's ConfigTime first catches up on config.events, then serves."""
        wanted = max((_config_time(header(r.headers, CONFIG_TIME)) for r in records), default=0)
        if wanted > self.follower.config_time:
            try:
                await self.follower.wait_for(wanted, CONFIG_WAIT_S)
            except TimeoutError:  # a causally consistent read is refused then (ShardDecider._read_after)
                log.warning("%s: catalog still behind ConfigTime %d after %.0fs", self.name, wanted, CONFIG_WAIT_S)

    def _report(self, role: str) -> None:
        # An active shard also says how long its activation took (libs.commands: last_activation).
        activation = {"activation": self.processor.last_activation} if role == "active" else {}
        report_ready(self.settings, self.ready_name, role=role, configTime=self.follower.config_time, **activation)

    async def run(self) -> None:
        t = self.settings.topics
        await self.settings.bus.create_topics([*t.core(), *t.for_shard(self.shard_id)])
        at = await self.follower.start()
        await self.projection.start()
        await self.projection.catch_up()
        history.begin(self.store, self.documents.max_ts)  # reads at earlier times: refused
        report_ready(self.settings, self.ready_name, role="standby", configTime=at)
        try:
            await self.statistics.start()  # reports while this instance is the active one
            await self.metrics.start()
            donor = supervised(asyncio.create_task(self.donor.run()), f"{self.name} migration coordinator")
            reaper = supervised(asyncio.create_task(self.reaper.run()), f"{self.name} session reaper")
            coordinator = supervised(
                asyncio.create_task(self.txn_coordinator.run()), f"{self.name} transaction coordinator"
            )
            builder = supervised(asyncio.create_task(self.index_builder.run()), f"{self.name} index builder")
            # Every instance reclaims its own store's history (a standby's grows as the active's).
            reclaim = supervised(asyncio.create_task(self.history.run()), f"{self.name} history reclaimer")
            try:
                await self.processor.run()
            finally:
                for task in (donor, reaper, coordinator, builder, reclaim):
                    task.cancel()
                await asyncio.gather(donor, reaper, coordinator, builder, reclaim, return_exceptions=True)
        finally:
            await self.metrics.stop()
            await self.statistics.stop()  # before the store it scans is closed
            clear_ready(self.settings, self.ready_name)
            await self.projection.stop()
            self.store.close()
            await self.follower.stop()


def _config_time(raw: bytes | None) -> int:
    """The routed-at ConfigTime of a request; a missing or garbled header asks for no wait."""
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0
