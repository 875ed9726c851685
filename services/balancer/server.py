"""The balancer service: one active instance (a command processor on
`balancer.commands`, its state the fold of `balancer.events`) and, in that
instance, the round loop.

A round (every `balancerRoundIntervalSecs`, when enabled and inside the window):
build a snapshot from the catalog and the shards' latest statistics, ask the
policy (a pure function) for splits and migrations, record them as issued, send
the splits and wait for them, then the migrations (in parallel: the policy uses
each shard at most once) and wait for their outcomes, recording each result.
Failures are logged and recorded; the next round starts from the new state.

Actions are recorded before they are sent, so a new leader finishes what the old
one issued (a migration is joined or found decided) instead of issuing it again.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from zoneinfo import ZoneInfo

from aiokafka import TopicPartition

from libs import kafka
from libs.commands import CommandError, CommandProcessor, Decision
from libs.projection import Projection
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, supervised
from libs.shardkey import from_ejson
from libs.store import Store
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import RecordError
from schemas import balancer as b
from schemas import config as cfg
from schemas import stats
from services.balancer import policy, snapshot
from services.balancer.state import BalancerState
from services.config.follower import CatalogFollower
from services.config.settings import Window

log = logging.getLogger(__name__)

MIGRATION_WAIT_S = 3600.0  # a migration may take long (a big range, a slow recipient)


def in_window(window: Window | None, now: dt.datetime) -> bool:
    """Inside the balancing window (seed 000): [start, stop) in its time zone, which may wrap midnight."""
    if window is None:
        return True
    local = now.astimezone(ZoneInfo(window.timeZone)).strftime("%H:%M")
    if window.start <= window.stop:
        return window.start <= local < window.stop
    return local >= window.start or local < window.stop


class StatisticsReader:
    """The latest report of every shard, from the compacted `shard.stats` topic."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self.latest: dict[str, stats.ShardStatistics] = {}
        self._changed = asyncio.Event()

    async def run(self) -> None:
        tp = TopicPartition(self.settings.topics.shard_stats, 0)
        c = kafka.consumer(self.settings.bootstrap, client_id="balancer-stats")
        await c.start()
        try:
            c.assign([tp])
            c.seek(tp, 0)
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
        finally:
            await c.stop()

    def sizes(self, catalog, fresh_from: int) -> tuple[dict[tuple[str, bytes], int], list[str]]:
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

    async def changed(self, timeout: float) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class Balancer:
    name = "balancer"

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        t = settings.topics
        self.follower = CatalogFollower(settings, self.name)
        self.state = BalancerState()
        self.store = Store(settings.data_dir / self.name / "state")
        self.projection = Projection(settings.bootstrap, t.balancer_events, b.events, self.state, self.store,
                                     name=self.name)
        self.processor = CommandProcessor(
            bootstrap=settings.bootstrap, command_topic=t.balancer_commands, command_codec=b.commands,
            projection=self.projection, decide=self.decide, dead_letters=t.dead_letters,
            group_id=f"{settings.cluster}.{self.name}", name=self.name, session_timeout_ms=settings.session_timeout_ms,
            on_role=lambda role: report_ready(settings, self.name, role=role, configTime=self.follower.config_time))
        self.requester = Requester(settings.bootstrap, t.inbox("balancer"), client_id=self.name,
                                   stop_owner_on_failure=True)
        self.statistics = StatisticsReader(settings)
        self.round = 0
        self.activity = "starting"  # what the round loop is doing, for `balancer status`
        self._fresh_from = 0  # statistics must be at least this recent (after our last actions)

    # ------------------------------------------------------------- decide

    def decide(self, cmd) -> Decision:
        if isinstance(cmd, b.GetBalancerState):
            return Decision([], {**self.state.document(), **self.live(cmd.ns, cmd.snapshot)})
        return self.state.decide(cmd)

    def live(self, ns: str | None = None, with_snapshot: bool = False) -> dict:
        settings = self.follower.catalog.settings
        out = {"enabled": settings.balancerEnabled, "inWindow": in_window(settings.balancerWindow, _now()),
               "window": settings.balancerWindow.model_dump() if settings.balancerWindow else None,
               "round": self.round, "activity": self.activity, "configTime": self.follower.config_time}
        if ns is not None or with_snapshot:
            snap = self.snapshot()
            if with_snapshot:
                out["snapshot"] = snap
            if ns is not None:
                out["collection"] = self.collection_status(ns, snap)
        return out

    def snapshot(self) -> dict:
        catalog = self.follower.catalog
        sizes, _ = self.statistics.sizes(catalog, 0)
        busy = {a.get("from") for a in self.state.in_flight.values()} | \
            {a.get("to") for a in self.state.in_flight.values()}
        snap = snapshot.build(catalog, sizes, catalog.settings.shardWeights, busy - {None})
        for coll in snap["collections"]:
            if coll["ns"] in self.state.defragmenting:  # defragmentation owns the collection meanwhile
                coll["balancerEnabled"] = False
        return snap

    def collection_status(self, ns: str, snap: dict) -> dict:
        catalog = self.follower.catalog
        coll = catalog.collections.get(ns)
        if coll is None:
            raise CommandError("NamespaceNotFound", f"collection {ns!r} is not sharded")
        found = [v.to_json() for v in policy.violations(snap, ns)]
        if ns in self.state.defragmenting:
            found.append({"reason": "defragmenting", "detail": f"phase {self.state.defragmenting[ns].get('phase')}"})
        if not coll.settings.allowMigrations:
            found.append({"reason": "migrationsDisallowed", "detail": "set-allow-migrations is false"})
        if not coll.settings.balancerEnabled:
            found.append({"reason": "balancerDisabled", "detail": "balancing is disabled for this collection"})
        return {"ns": ns, "compliant": not [v for v in found if v["reason"] not in ("balancerDisabled",)],
                "violations": found}

    # ------------------------------------------------------------- hosting

    async def run(self) -> None:
        s, t = self.settings, self.settings.topics
        await kafka.ensure_topics(s.bootstrap, [*t.core(), *t.for_balancer(),
                                                TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        at = await self.follower.start()
        await self.projection.start()
        await self.projection.catch_up()
        await self.requester.start()
        report_ready(s, self.name, role="standby", configTime=at)
        tasks = [supervised(asyncio.create_task(self.statistics.run()), "balancer statistics reader"),
                 supervised(asyncio.create_task(self._rounds()), "balancer round loop")]
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

    # -------------------------------------------------------------- rounds

    async def _rounds(self) -> None:
        while True:
            await self.processor.active.wait()
            self.round = self.state.last_round.get("round", 0)
            try:
                if self.state.in_flight:
                    self.activity = "finishing actions issued before a restart"
                    await self._finish_in_flight()
                settings = self.follower.catalog.settings
                if not settings.balancerEnabled:
                    self.activity = "stopped (balancerEnabled is false)"
                elif not in_window(settings.balancerWindow, _now()):
                    self.activity = "outside the balancing window"
                else:
                    await self.balance_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("balancer: round %d failed; the next round starts from the new state", self.round + 1)
            await asyncio.sleep(self.follower.catalog.settings.balancerRoundIntervalSecs)

    async def balance_round(self) -> dict:
        """One round; its summary."""
        catalog = self.follower.catalog
        sizes, stale = self.statistics.sizes(catalog, self._fresh_from)
        if stale:
            self.activity = f"waiting for statistics newer than ConfigTime {self._fresh_from} from {', '.join(stale)}"
            return {"skipped": self.activity}
        snap = self.snapshot()
        snap_sizes = {(c["ns"], i): ch["sizeBytes"] for c in snap["collections"] for i, ch in enumerate(c["chunks"])}
        del snap_sizes  # (sizes are inside the snapshot)
        plan = policy.plan(snap)
        if not plan.splits and not plan.migrations:
            self.activity = "balanced: nothing to do"
            return {"splits": 0, "migrations": 0}
        self.round += 1
        round_no = self.round
        splits = [{"id": uuid.uuid4().hex, "kind": "split", **s.model_dump()} for s in plan.splits]
        moves = [{"id": uuid.uuid4().hex, "kind": "migration", **m.model_dump(by_alias=True)} for m in plan.migrations]
        await self._ask(b.IssueActions(round=round_no, actions=splits + moves))
        self.activity = f"round {round_no}: {len(splits)} split(s), {len(moves)} migration(s)"
        for action in splits:
            await self._run_action(action)
        results = await asyncio.gather(*(self._run_action(a) for a in moves))
        summary = {"splits": len(splits), "migrations": len(moves), "failed": sum(1 for ok in results if not ok),
                   "reasons": sorted({m["reason"] for m in moves})}
        await self._ask(b.CompleteRound(round=round_no, summary=summary))
        self._fresh_from = self.follower.config_time  # the next round needs statistics that show these moves
        throttle = self.follower.catalog.settings.balancerMigrationsThrottlingMs
        if moves and throttle:
            await asyncio.sleep(throttle / 1000)  # seed 000: migration throttling between rounds
        return summary

    async def _finish_in_flight(self) -> None:
        await asyncio.gather(*(self._run_action(a) for a in list(self.state.in_flight.values())))
        self._fresh_from = self.follower.config_time

    async def _run_action(self, action: dict) -> bool:
        """Send one recorded action and wait for its result; record it.  Idempotent: a
        migration already under way is joined, one already decided is found so."""
        try:
            if action["kind"] == "split":
                reply = await self.requester.request(self.settings.topics.config_commands,
                                                     cfg.SplitChunk(ns=action["ns"], at=action["at"]), timeout=60)
                ok, code, error = reply.ok, reply.code, reply.error
            elif action["kind"] == "migration":
                ok, code, error = await self._migrate(action)
            else:
                ok, code, error = False, "BadValue", f"unknown action {action['kind']}"
        except Exception as e:  # recorded as failed; the next round decides again
            ok, code, error = False, "InternalError", f"{type(e).__name__}: {e}"
        if not ok:
            log.warning("balancer: %s of %s failed: %s: %s", action["kind"], action["ns"], code, error)
        await self._ask(b.FinishAction(id=action["id"], ok=ok, code=code, error=error))
        return ok

    async def _migrate(self, a: dict) -> tuple[bool, str | None, str | None]:
        reply = await self.requester.request(self.settings.topics.config_commands,
                                             cfg.MoveRange(ns=a["ns"], min=a["min"], max=a["max"], to=a["to"],
                                                           forceJumbo=a["reason"] == "drain"), timeout=60)
        if not reply.ok:
            return False, reply.code, reply.error
        if not reply.result.get("moved"):
            return True, None, None  # already there (a restart found it done)
        mid = reply.result["id"]
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while (outcome := self.follower.catalog.outcomes.get(mid)) is None:
            if time.monotonic() > deadline:
                return False, "Timeout", f"migration {mid} still running"
            try:
                await self.follower.wait_for(self.follower.config_time + 1, 5.0)
            except TimeoutError:
                pass
        if outcome == "committed":
            return True, None, None
        code, _, why = outcome.removeprefix("aborted: ").partition(": ")
        return False, code if code.isalnum() else "MigrationAborted", why or outcome

    async def _ask(self, cmd) -> dict:
        reply = await self.requester.request(self.settings.topics.balancer_commands, cmd, timeout=60)
        if not reply.ok:
            raise CommandError(reply.code or "Error", reply.error or "")
        return reply.result or {}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
