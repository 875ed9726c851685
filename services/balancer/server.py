"""The balancer service: one active instance (a command processor on
`balancer.commands`, its state the fold of `balancer.events`) and, in that instance,
the loops that do the work.  This module hosts them and answers status queries.

    statistics.py  the shards' latest statistics (shard.stats)
    history.py     when chunk ranges last moved (config.events), for the auto-merger
    rounds.py      the round loop: snapshot, policy, splits and migrations
    secondary.py   the secondary loop: defragmentation and the auto-merger
    executor.py    sends one action by its type and records its outcome

Actions are recorded before they are sent, so a new leader finishes what the old one
issued (a migration is joined or found decided) instead of issuing it again.

Reads: the catalog (its own follower), `balancer.commands`; writes `balancer.events`
(through the command processor) and answers GetBalancerState with the live status.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.settings import in_window
from libs.commands import CommandError, CommandProcessor, Decision, Policy
from libs.dispatch import Dispatch
from libs.projection import Projection
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, supervised
from libs.store import Store
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import Record
from schemas import balancer as b
from services.balancer import automerge, draining, policy, snapshot
from services.balancer.executor import Executor
from services.balancer.history import MigrationHistory
from services.balancer.rounds import Rounds, now
from services.balancer.secondary import Secondary
from services.balancer.state import BalancerState, event_key
from services.balancer.statistics import StatisticsReader

log = logging.getLogger(__name__)


# Commands the hosting instance answers itself (they need the catalog or the live round);
# every other command is the durable state's (`state.py`).
on_hosted: Dispatch[Balancer, Decision] = Dispatch("balancer command")


class BalancerPolicy(Policy):
    """The balancer's commands: the hosting instance's own (on_hosted) or the durable state's;
    events keyed for compaction."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    def decide(self, command: Record) -> Decision:
        return self.balancer.decide(command)

    def on_role(self, role: str) -> None:
        b = self.balancer
        report_ready(b.settings, b.name, role=role, configTime=b.follower.config_time)

    def event_key(self, event: Record) -> bytes | None:
        return event_key(event)


class Balancer:
    name = "balancer"

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        t = settings.topics
        self.follower = CatalogFollower(settings, self.name)
        self.state = BalancerState()
        self.store = Store(settings.data_dir / self.name / "state")
        self.projection = Projection(settings.bus, t.balancer_events, b.events, self.state, self.store, name=self.name)
        self.processor = CommandProcessor(
            bus=settings.bus,
            command_topic=t.balancer_commands,
            command_codec=b.commands,
            projection=self.projection,
            policy=BalancerPolicy(self),
            dead_letters=t.dead_letters,
            group_id=settings.topics.group(self.name),
            name=self.name,
            session_timeout_ms=settings.session_timeout_ms,
        )
        self.requester = Requester(settings.bus, t.balancer_inbox, client_id=self.name, stop_owner_on_failure=True)
        self.statistics = StatisticsReader(settings)
        self.history = MigrationHistory(
            settings,
            lambda: max(  # both windows must have passed since a chunk moved
                self.follower.catalog.settings.minSnapshotHistoryWindowInSeconds,
                automerge.TRANSACTION_LIFETIME_LIMIT_SECS,
            ),
        )
        self.executor = Executor(settings, self.follower, self.requester, self.statistics)
        self.rounds = Rounds(
            self.follower,
            self.state,
            self.statistics,
            self.executor,
            self.processor.active,
            self.snapshot,
            self.collection_status,
        )
        self.secondary = Secondary(
            self.follower,
            self.state,
            self.statistics,
            self.history,
            self.executor,
            self.processor.active,
            lambda: self.rounds.round,
        )

    @property
    def round(self) -> int:
        return self.rounds.round

    @property
    def activity(self) -> str:
        return self.rounds.activity

    # ------------------------------------------------------------- decide

    def decide(self, cmd: Record) -> Decision:
        return on_hosted(self, cmd) if on_hosted.handles(cmd) else self.state.decide(cmd)

    @on_hosted.register(b.GetBalancerState)
    def _get_state(self, cmd: b.GetBalancerState) -> Decision:
        """The state's document and the live status (round, window, snapshot) only this instance has."""
        return Decision([], {**self.state.document(), **self.live(cmd.ns, cmd.snapshot)})

    @on_hosted.register(b.StartDefragmentation)
    def _start_defragmentation(self, cmd: b.StartDefragmentation) -> Decision:
        if cmd.ns not in self.follower.catalog.collections:  # the state does not know the catalog
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {cmd.ns!r} is not sharded")
        return self.state.decide(cmd)

    def live(self, ns: str | None = None, with_snapshot: bool = False) -> dict[str, Any]:
        settings = self.follower.catalog.settings
        out: dict[str, Any] = {
            "enabled": settings.balancerEnabled,
            "inWindow": in_window(settings.balancerWindow, now()),
            "window": settings.balancerWindow.model_dump() if settings.balancerWindow else None,
            "round": self.round,
            "activity": self.activity,
            "notCompliant": self.rounds.not_compliant,  # as of the last quiet round
            "configTime": self.follower.config_time,
        }
        if ns is not None or with_snapshot:
            snap = self.snapshot()
            if with_snapshot:
                out["snapshot"] = snap
            if ns is not None:
                out["collection"] = self.collection_status(ns, snap)
        return out

    def snapshot(self) -> dict[str, Any]:
        catalog = self.follower.catalog
        sizes, _ = self.statistics.sizes(catalog)
        snap = snapshot.build(catalog, sizes, catalog.settings.shardWeights, self.state.busy_shards())
        for coll in snap["collections"]:
            if self.state.blocks_balancing(coll["ns"]):  # defragmentation owns the collection meanwhile
                coll["balancerEnabled"] = False
        return snap

    def collection_status(self, ns: str, snap: dict[str, Any]) -> dict[str, Any]:
        catalog = self.follower.catalog
        coll = catalog.collections.get(ns)
        if coll is None:
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {ns!r} is not sharded")
        found = [v.to_json() for v in policy.violations(snap, ns)]
        for shard in sorted(s.id for s in catalog.shards.values() if s.draining):
            found += [
                {k: v for k, v in b_.items() if k != "ns"} for b_ in draining.stranded(catalog, shard) if b_["ns"] == ns
            ]
        if self.state.blocks_balancing(ns):
            status = self.state.defrag_status(ns) or {}
            found.append({"reason": "defragmenting", "detail": f"phase {status['currentPhase']}"})
        if not coll.settings.allowMigrations:
            found.append({"reason": "migrationsDisallowed", "detail": "set-allow-migrations is false"})
        if not coll.settings.balancerEnabled:
            found.append({"reason": "balancerDisabled", "detail": "balancing is disabled for this collection"})
        return {
            "ns": ns,
            "compliant": not [v for v in found if v["reason"] not in ("balancerDisabled",)],
            "violations": found,
        }

    # ------------------------------------------------------------- hosting

    async def run(self) -> None:
        s, t = self.settings, self.settings.topics
        await s.bus.create_topics([*t.core(), *t.for_balancer(), TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        at = await self.follower.start()
        await self.projection.start()
        await self.projection.catch_up()
        await self.requester.start()
        report_ready(s, self.name, role="standby", configTime=at)
        tasks = [
            supervised(asyncio.create_task(self.statistics.run()), "balancer statistics reader"),
            supervised(asyncio.create_task(self.history.run()), "balancer migration history reader"),
            supervised(asyncio.create_task(self.rounds.run()), "balancer round loop"),
            supervised(asyncio.create_task(self.secondary.run()), "balancer secondary loop"),
        ]
        try:
            await self.processor.run()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            clear_ready(s, self.name)
            await self.requester.stop()
            await self.projection.stop()
            self.store.close()
            await self.follower.stop()
