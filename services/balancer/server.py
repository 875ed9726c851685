"""The balancer service: one active instance (a command processor on
`balancer.commands`, its state the fold of `balancer.events`) and, in that
instance, the round loop.

A round (when enabled and inside the window; the next one starts at once after a round
in which an action succeeded, `balancerRoundIntervalSecs` after any other, as MongoDB's):
build a snapshot from the catalog and the shards' latest statistics, ask the
policy (a pure function) for splits and migrations, record them as issued, send
the splits and wait for them, then the migrations (in parallel: the policy uses
each shard at most once) and wait for their outcomes, recording each result.
Failures are logged and recorded; the next round starts from the new state.

Actions are recorded before they are sent, so a new leader finishes what the old
one issued (a migration is joined or found decided) instead of issuing it again.

Beside the rounds, a secondary loop (MongoDB's secondary thread) runs collection
defragmentation (defragment.py: one task per collection, its state persisted after
every step) and the auto-merger (automerge.py: a pass every autoMergerIntervalSecs).
Both run only while the balancer is enabled and inside its window.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass

from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.settings import in_window
from domain.shardkey import from_ejson, to_ejson
from libs import kafka
from libs.commands import CommandError, CommandProcessor, Decision
from libs.faults import fault_point
from libs.projection import Projection
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, supervised
from libs.store import Store
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import RecordError, stats
from schemas import balancer as b
from schemas import config as cfg
from services.balancer import automerge, defragment, draining, policy, snapshot
from services.balancer.state import BalancerState, event_key

log = logging.getLogger(__name__)

MIGRATION_WAIT_S = 3600.0  # a migration may take long (a big range, a slow recipient)
DATA_SIZE_WAIT_S = 60.0  # for a statistics report new enough to measure a chunk (reports come every 10 s)
SECONDARY_POLL_S = 0.5  # how often the secondary loop looks for work
RETRY_PAUSE_S = 0.5  # before sending again an action that met a retriable error


@dataclass
class Outcome:
    """The result of one action: `config_time` is where the catalog shows it, `size` answers a dataSize."""

    ok: bool
    code: str | None = None
    error: str | None = None
    config_time: int = 0
    size: int | None = None


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
        except TimeoutError:
            pass


class MigrationHistory:
    """When chunk ranges last moved, for the auto-merger's history window (seed 002): the
    timestamps of the `MigrationCommitted` records of config.events (set when the config
    server appended them).  Only migrations within the window matter, so it reads from
    `horizon()` seconds ago (found by timestamp), not from the log's start, and reads
    again from further back if the window grows."""

    def __init__(self, settings: ServiceSettings, horizon):
        self.settings, self.horizon = settings, horizon
        self.moved: dict[str, list[tuple[str, dict, dict, float]]] = {}  # ns -> (epoch, min, max, unix time)
        self.position = 0  # the next offset of config.events to read
        self.caught_up = asyncio.Event()  # until then, recent migrations may be missing

    async def run(self) -> None:
        s = self.settings
        async with kafka.partition_reader(s.bootstrap, s.topics.config_events, client_id="balancer-history") as (c, tp):
            while True:
                since = self.horizon()
                found = (await c.offsets_for_times({tp: int((time.time() - since) * 1000)}))[tp]
                self.position = found.offset if found else await kafka.log_end(c, tp)
                c.seek(tp, self.position)
                self.moved.clear()
                self.caught_up.clear()
                await kafka.catch_up(c, tp, self._take)
                self.caught_up.set()
                while self.horizon() <= since:
                    batch = await c.getmany(tp, timeout_ms=500)
                    await self._take(batch.get(tp, []))

    async def _take(self, records) -> None:
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

    async def wait_for(self, config_time, timeout: float = 30.0) -> None:
        """Until every migration the catalog shows at `config_time()` is known here."""
        deadline = time.monotonic() + timeout
        while not self.caught_up.is_set() or self.position < config_time():
            if time.monotonic() > deadline:
                raise TimeoutError(f"migration history behind ConfigTime {config_time()}")
            await asyncio.sleep(0.05)

    def last_migrated(self, coll) -> dict[bytes, float]:
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


class Balancer:
    name = "balancer"

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        t = settings.topics
        self.follower = CatalogFollower(settings, self.name)
        self.state = BalancerState()
        self.store = Store(settings.data_dir / self.name / "state")
        self.projection = Projection(
            settings.bootstrap, t.balancer_events, b.events, self.state, self.store, name=self.name
        )
        self.processor = CommandProcessor(
            bootstrap=settings.bootstrap,
            command_topic=t.balancer_commands,
            command_codec=b.commands,
            projection=self.projection,
            decide=self.decide,
            dead_letters=t.dead_letters,
            group_id=f"{settings.cluster}.{self.name}",
            name=self.name,
            session_timeout_ms=settings.session_timeout_ms,
            event_key=event_key,
            on_role=lambda role: report_ready(settings, self.name, role=role, configTime=self.follower.config_time),
        )
        self.requester = Requester(
            settings.bootstrap, t.inbox("balancer"), client_id=self.name, stop_owner_on_failure=True
        )
        self.statistics = StatisticsReader(settings)
        self.history = MigrationHistory(
            settings,
            lambda: max(  # seed 002: both windows must have passed
                self.follower.catalog.settings.minSnapshotHistoryWindowInSeconds,
                automerge.TRANSACTION_LIFETIME_LIMIT_SECS,
            ),
        )
        self._live: set[str] = set()  # ids of the secondary loop's actions being run by this instance
        self._last_sent: dict = {}  # throttling key -> when its last action was (or will be) sent
        self.round = 0
        self.activity = "starting"  # what the round loop is doing, for `balancer status`
        self._fresh_from = 0  # statistics must be at least this recent (after our last actions)
        self._last_migration_end: float | None = None  # monotonic; for balancerMigrationsThrottlingMs

    # ------------------------------------------------------------- decide

    def decide(self, cmd) -> Decision:
        if isinstance(cmd, b.GetBalancerState):
            return Decision([], {**self.state.document(), **self.live(cmd.ns, cmd.snapshot)})
        if isinstance(cmd, b.StartDefragmentation) and cmd.ns not in self.follower.catalog.collections:
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {cmd.ns!r} is not sharded")
        return self.state.decide(cmd)

    def live(self, ns: str | None = None, with_snapshot: bool = False) -> dict:
        settings = self.follower.catalog.settings
        out = {
            "enabled": settings.balancerEnabled,
            "inWindow": in_window(settings.balancerWindow, now()),
            "window": settings.balancerWindow.model_dump() if settings.balancerWindow else None,
            "round": self.round,
            "activity": self.activity,
            "configTime": self.follower.config_time,
        }
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
        busy = {a.get("from") for a in self.state.in_flight.values()} | {
            a.get("to") for a in self.state.in_flight.values()
        }
        snap = snapshot.build(catalog, sizes, catalog.settings.shardWeights, busy - {None})
        for coll in snap["collections"]:
            if self.state.blocks_balancing(coll["ns"]):  # defragmentation owns the collection meanwhile
                coll["balancerEnabled"] = False
        return snap

    def collection_status(self, ns: str, snap: dict) -> dict:
        catalog = self.follower.catalog
        coll = catalog.collections.get(ns)
        if coll is None:
            raise CommandError(ErrorCode.NamespaceNotFound, f"collection {ns!r} is not sharded")
        found = [v.to_json() for v in policy.violations(snap, ns)]
        if self.state.blocks_balancing(ns):
            found.append({"reason": "defragmenting", "detail": f"phase {self.state.defrag_status(ns)['currentPhase']}"})
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
        await kafka.ensure_topics(
            s.bootstrap, [*t.core(), *t.for_balancer(), TopicSpec(self.requester.inbox, config=SHORT_LIVED)]
        )
        at = await self.follower.start()
        await self.projection.start()
        await self.projection.catch_up()
        await self.requester.start()
        report_ready(s, self.name, role="standby", configTime=at)
        tasks = [
            supervised(asyncio.create_task(self.statistics.run()), "balancer statistics reader"),
            supervised(asyncio.create_task(self.history.run()), "balancer migration history reader"),
            supervised(asyncio.create_task(self._rounds()), "balancer round loop"),
            supervised(asyncio.create_task(self._secondary()), "balancer secondary loop"),
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

    # -------------------------------------------------------------- rounds

    async def _rounds(self) -> None:
        while True:
            await self.processor.active.wait()
            self.round = self.state.last_round.get("round", 0)
            summary: dict | None = {}
            try:
                if any("by" not in a for a in self.state.in_flight.values()):
                    self.activity = "finishing actions issued before a restart"
                    await self._finish_in_flight()
                settings = self.follower.catalog.settings
                if not settings.balancerEnabled:
                    self.activity = "stopped (balancerEnabled is false)"
                elif not in_window(settings.balancerWindow, now()):
                    self.activity = "outside the balancing window"
                else:
                    summary = await self.balance_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("balancer: round %d failed; the next round starts from the new state", self.round + 1)
                summary = None
            interval = self.follower.catalog.settings.balancerRoundIntervalSecs
            if summary is not None and "skipped" in summary:
                await self.statistics.changed(interval)  # the reports it waits for, or the interval
            else:
                await asyncio.sleep(round_pause(summary, interval))

    async def balance_round(self) -> dict:
        """One round; its summary."""
        catalog = self.follower.catalog
        sizes, stale = self.statistics.sizes(catalog, self._fresh_from)
        if stale:
            self.activity = f"waiting for statistics newer than ConfigTime {self._fresh_from} from {', '.join(stale)}"
            return {"skipped": self.activity}
        snap = self.snapshot()
        plan = policy.plan(snap)
        splits = [{"id": uuid.uuid4().hex, "kind": "split", **s.model_dump()} for s in plan.splits]
        splits += self._auto_splits(catalog, sizes)
        moves = [{"id": uuid.uuid4().hex, "kind": "migration", **m.model_dump(by_alias=True)} for m in plan.migrations]
        busy = {s for m in moves for s in (m["from"], m["to"])}
        # A draining shard without chunks: its databases move (one at a time), then it goes.
        moves += [{"id": uuid.uuid4().hex, **a} for a in draining.drain_actions(catalog, busy)]
        if not splits and not moves:
            self.activity = "balanced: nothing to do"
            return {"splits": 0, "migrations": 0}
        self.round += 1
        round_no = self.round
        await self._ask(b.IssueActions(round=round_no, actions=splits + moves))
        self.activity = f"round {round_no}: {len(splits)} split(s), {len(moves)} migration(s)"
        split_results = [await self._run_action(action) for action in splits]
        if moves and (
            pause := throttle_left(
                self._last_migration_end,
                time.monotonic(),
                self.follower.catalog.settings.balancerMigrationsThrottlingMs,
            )
        ):
            self.activity += f" (throttled {pause:.1f}s: balancerMigrationsThrottlingMs)"
            await asyncio.sleep(pause)
        results = await asyncio.gather(*(self._run_action(a) for a in moves))
        if moves:
            self._last_migration_end = time.monotonic()
        summary = {
            "splits": len(splits),
            "migrations": len(moves),
            "failed": sum(1 for r in (*split_results, *results) if not r.ok),
            "reasons": sorted({m.get("reason", m["kind"]) for m in moves}),
        }
        await self._ask(b.CompleteRound(round=round_no, summary=summary))
        self._fresh_from = self.follower.config_time  # the next round needs statistics that show these moves
        return summary

    async def _finish_in_flight(self) -> None:
        """The round loop's own actions (the secondary loop finishes those it issued)."""
        await asyncio.gather(*(self._run_action(a) for a in list(self.state.in_flight.values()) if "by" not in a))
        self._fresh_from = self.follower.config_time

    async def _run_action(self, action: dict) -> Outcome:
        """Send one recorded action and wait for its result; record it.  Idempotent: a
        migration already under way is joined, one already decided is found so; a merge
        already done merges nothing."""
        try:
            kind, topic = action["kind"], self.settings.topics.config_commands
            if kind in ("split", "merge"):
                cmd = (
                    cfg.SplitChunk(ns=action["ns"], at=action["at"])
                    if kind == "split"
                    else cfg.MergeChunks(ns=action["ns"], min=action["min"], max=action["max"])
                )
                reply = await self.requester.request(topic, cmd, timeout=60)
                out = Outcome(reply.ok, reply.code, reply.error, reply.configTime or 0)
            elif kind == "migration":
                out = Outcome(*await self._migrate(action))
            elif kind == "movePrimary":
                reply = await self.requester.request(
                    topic, cfg.MovePrimary(db=action["ns"], to=action["to"]), timeout=60
                )
                out = Outcome(*await self._outcome(reply))
            elif kind == "removeShard":
                reply = await self.requester.request(topic, cfg.RemoveShard(shard=action["shard"]), timeout=60)
                out = Outcome(reply.ok, reply.code, reply.error, reply.configTime or 0)
            elif kind == "autoSplit":
                out = await self._auto_split(action)
            elif kind == "dataSize":
                out = await self._data_size(action)
            else:
                out = Outcome(False, "BadValue", f"unknown action {kind}")
        except TimeoutError as e:  # no answer (yet): worth asking again
            out = Outcome(False, "Timeout", str(e))
        except Exception as e:  # recorded as failed; the next round decides again
            out = Outcome(False, "InternalError", f"{type(e).__name__}: {e}")
        if not out.ok:
            log.warning("balancer: %s of %s failed: %s: %s", action["kind"], action["ns"], out.code, out.error)
        await self._ask(b.FinishAction(id=action["id"], ok=out.ok, code=out.code, error=out.error))
        return out

    async def _data_size(self, a: dict) -> Outcome:
        """Seed 002's dataSize, from the statistics the owning shard reports (dataSizeBytes per
        chunk): its first report taken at a ConfigTime at or after `after` (the balancer's
        ConfigTime when it issued the action, which shows the chunk's last change)."""
        coll = self.follower.catalog.collections.get(a["ns"])
        if coll is None:
            return Outcome(False, "NamespaceNotFound", f"{a['ns']} is not sharded")
        lo, hi = (coll.pattern.encode_bound(from_ejson(a[k])) for k in ("min", "max"))
        deadline = time.monotonic() + DATA_SIZE_WAIT_S
        while (report := self.statistics.latest.get(a["shard"])) is None or report.configTime < a["after"]:
            if (left := deadline - time.monotonic()) <= 0:
                return Outcome(False, "Timeout", f"no statistics from {a['shard']} at ConfigTime {a['after']} or later")
            await self.statistics.changed(min(left, 5.0))
        for ch in report.chunks:
            if (
                ch.ns == a["ns"]
                and coll.pattern.encode_bound(from_ejson(ch.min)) == lo
                and coll.pattern.encode_bound(from_ejson(ch.max)) == hi
            ):
                return Outcome(True, size=ch.dataSizeBytes)
        return Outcome(False, "ChunkChanged", f"{a['shard']} no longer owns [{a['min']}, {a['max']}) of {a['ns']}")

    async def _migrate(self, a: dict) -> tuple[bool, str | None, str | None]:
        reply = await self.requester.request(
            self.settings.topics.config_commands,
            cfg.MoveRange(ns=a["ns"], min=a["min"], max=a["max"], to=a["to"], forceJumbo=a["reason"] == "drain"),
            timeout=60,
        )
        return await self._outcome(reply)

    async def _outcome(self, reply) -> tuple[bool, str | None, str | None]:
        """Wait for the outcome of the migration (or primary move) a config reply started."""
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

    # ------------------------------------------------------------ auto-split

    def _auto_splits(self, catalog, sizes: dict) -> list[dict]:
        """Seed 001: chunks of collections with autoSplit grown to the max chunk size."""
        out = []
        for ns, coll in catalog.collections.items():
            if not coll.settings.autoSplit:
                continue
            limit = coll.settings.maxChunkSizeBytes or catalog.settings.maxChunkSizeBytes
            for i, ch in enumerate(coll.chunks):
                if not ch.jumbo and sizes.get((ns, ch.min_key), 0) >= limit:
                    edge = "top" if i == len(coll.chunks) - 1 else "bottom" if i == 0 else None
                    out.append(
                        {
                            "id": uuid.uuid4().hex,
                            "kind": "autoSplit",
                            "ns": ns,
                            "min": to_ejson(ch.min),
                            "max": to_ejson(ch.max),
                            "shard": ch.shard,
                            "limit": limit,
                            "edge": None if coll.pattern.is_hashed else edge,
                        }
                    )
        return out

    async def _auto_split(self, a: dict) -> Outcome:
        """Ask the owner for split points (its split vector) and split there; one shard-key
        value only: mark the chunk jumbo.  Top-chunk optimisation: the new edge chunk of an
        ascending (or descending) key moves off the hot shard."""
        from schemas import shard as s

        topics = self.settings.topics
        vec = await self.requester.request(
            topics.shard_requests(a["shard"]),
            s.SplitVector(ns=a["ns"], chunkMin=a["min"], maxChunkSizeBytes=a["limit"], edge=a.get("edge")),
            timeout=60,
        )
        if not vec.ok:
            return Outcome(False, vec.code, vec.error)
        if vec.result["jumbo"]:
            reply = await self.requester.request(
                topics.config_commands, cfg.MarkJumbo(ns=a["ns"], min=a["min"]), timeout=60
            )
            return Outcome(reply.ok, reply.code, reply.error, reply.configTime or 0)
        points = vec.result["points"]
        if not points:
            return Outcome(True, None, None)
        reply = await self.requester.request(topics.config_commands, cfg.SplitChunk(ns=a["ns"], at=points), timeout=60)
        if not reply.ok or a.get("edge") is None:
            return Outcome(reply.ok, reply.code, reply.error, reply.configTime or 0)
        # The hot edge: inserts of an ascending key all land in the top chunk, so it moves away.
        lo, hi = (points[-1], a["max"]) if a["edge"] == "top" else (a["min"], points[0])
        to = draining.new_primary(self.follower.catalog, exclude={a["shard"]})
        if to is None:
            return Outcome(True, None, None, reply.configTime or 0)
        await self.follower.wait_for(reply.configTime or 0, 30)
        ok, code, error = await self._migrate({"ns": a["ns"], "min": lo, "max": hi, "to": to, "reason": "autoSplit"})
        return Outcome(ok, code, error)

    # ------------------------------------------------------ secondary loop

    def _allowed(self) -> bool:
        settings = self.follower.catalog.settings
        return settings.balancerEnabled and in_window(settings.balancerWindow, now())

    def _throttle(self, key, ms: int) -> float:
        """Seconds to wait before sending the next action under `key`; reserves its slot."""
        now = time.monotonic()
        wait = automerge.throttle_wait(self._last_sent.get(key), now, ms)
        self._last_sent[key] = now + wait
        return wait

    async def _issue(self, actions: list[dict]) -> None:
        """Record actions before they are sent.  They are ours from now on: the secondary
        loop does not take them for a previous instance's."""
        self._live.update(a["id"] for a in actions)
        try:
            await self._ask(b.IssueActions(round=self.round, actions=actions))
        except BaseException:
            self._live.difference_update(a["id"] for a in actions)
            raise

    async def _send(self, action: dict, delay: float = 0.0) -> Outcome:
        self._live.add(action["id"])
        try:
            if delay:
                await asyncio.sleep(delay)  # throttling
            return await self._run_action(action)
        finally:
            self._live.discard(action["id"])

    async def _secondary(self) -> None:
        """Defragmentation (a task per collection) and the auto-merger (a pass at a time).
        A new leader first finishes what an earlier one issued, then resumes each
        defragmentation from its recorded state."""
        defrags: dict[str, asyncio.Task] = {}
        merger: asyncio.Task | None = None
        try:
            while True:
                if not self.processor.active.is_set():  # a standby: the leader does the work
                    for t in [*defrags.values(), merger]:
                        if t is not None:
                            t.cancel()
                    await self.processor.active.wait()
                orphans = [a for a in self.state.in_flight.values() if "by" in a and a["id"] not in self._live]
                if orphans:
                    await asyncio.gather(*(self._send(a) for a in orphans))
                if self._allowed():
                    for ns in list(self.state.defragmenting):
                        if self.state.blocks_balancing(ns) and (ns not in defrags or defrags[ns].done()):
                            defrags[ns] = asyncio.create_task(self._defragment(ns))
                    settings = self.follower.catalog.settings
                    if (
                        settings.autoMergerEnabled
                        and (merger is None or merger.done())
                        and automerge.scan_due(
                            self.state.auto_merged_at or None, time.time(), settings.autoMergerIntervalSecs
                        )
                    ):
                        merger = asyncio.create_task(self._auto_merge())
                await asyncio.sleep(SECONDARY_POLL_S)
        finally:
            for t in [*defrags.values(), merger]:
                if t is not None:
                    t.cancel()

    # ---------------------------------------------------- defragmentation

    async def _defragment(self, ns: str) -> None:
        """One collection's defragmentation (seed 002): send the policy's next actions (at most
        50 in flight, chunkDefragmentationThrottlingMS apart), fold in each outcome once the
        catalog shows it, and persist the state after every step.  Issues nothing while the
        balancer is disabled or outside its window."""
        running: dict[asyncio.Task, dict] = {}
        try:
            doc = self.state.defragmenting[ns]
            started, saved = doc["started"], None
            st = defragment.resume(defragment.from_json(doc["state"]))  # answers to what was in flight are lost
            retrying: list[dict] = []  # met a retriable error: sent again after a pause
            steps = (st.phase, 0)  # (phase, steps this instance took in it): for the fault point
            while True:
                if self.state.defragmenting[ns]["state"]["stopped"] or ns not in self.follower.catalog.collections:
                    st = defragment.stop(st)  # `defragment NS stop`, or dropped: issue nothing more
                issued = []
                if self._allowed() and not st.stopped:
                    st, issued = defragment.next_actions(st, self._defrag_snapshot(ns))
                sends = []
                for a in issued:
                    if (rec := self._defrag_action(ns, a)) is None:  # not chunk bounds: the catalog changed under us
                        st = defragment.on_result(st, a, False, "ChunkChanged")
                    else:
                        sends.append((a, rec))
                if (doc := defragment.to_json(st)) != saved:
                    reply = await self._ask(b.SetDefragmentation(ns=ns, started=started, state=doc))
                    if not reply["applied"]:
                        return  # stopped and started again: a new task runs the new start
                    saved, st = reply["state"], defragment.from_json(reply["state"])
                    steps = (st.phase, steps[1] + 1 if steps[0] == st.phase else 1)
                    fault_point("balancer.defragment_step", tag=f"{steps[0]}#{steps[1]}")
                if sends:
                    await self._issue([rec for _, rec in sends])
                throttling = self.follower.catalog.settings.chunkDefragmentationThrottlingMS
                for a, rec in sends:
                    pause = RETRY_PAUSE_S if a in retrying else 0.0
                    running[asyncio.create_task(self._send(rec, self._throttle("defragment", throttling) + pause))] = a
                retrying = [a for a in retrying if a not in issued]
                if not running:
                    if st.phase == defragment.FINISHED:
                        log.info("balancer: defragmentation of %s finished: %s", ns, defragment.status(st))
                        return
                    await asyncio.sleep(SECONDARY_POLL_S)  # disabled or outside the window
                    continue
                done, _ = await asyncio.wait(running, timeout=SECONDARY_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    a, out = running.pop(t), t.result()
                    if out.config_time:  # the next snapshot must show it
                        await self.follower.wait_for(out.config_time, 30)
                    st = defragment.on_result(st, a, out.ok, out.code, data_size=out.size)
                    if not out.ok and defragment.is_retriable(out.code):
                        retrying.append(a)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("balancer: defragmentation of %s failed; it resumes from its last recorded step", ns)
        finally:
            for t in running:
                t.cancel()

    def _defrag_snapshot(self, ns: str) -> defragment.Snapshot:
        catalog = self.follower.catalog
        coll = catalog.collections[ns]
        chunks, zones = automerge.from_collection(coll)  # no sizes: phase 1 measures every chunk (dataSize)
        shard_sizes = {sh: sum(c.dataSizeBytes for c in r.collections) for sh, r in self.statistics.latest.items()}
        return defragment.Snapshot(
            chunks,
            coll.settings.maxChunkSizeBytes or catalog.settings.maxChunkSizeBytes,
            zones,
            shard_sizes,
            frozenset(s.id for s in catalog.shards.values() if s.draining),
        )

    def _defrag_action(self, ns: str, a: dict) -> dict | None:
        """A policy action as the balancer records and sends it (bounds as the catalog's), or None
        if its bounds are no longer chunk bounds."""
        coll = self.follower.catalog.collections.get(ns)
        lo, hi = (_boundary(coll, a[k]) if coll else None for k in ("min", "max"))
        if lo is None or hi is None:
            return None
        rec = {"id": uuid.uuid4().hex, "by": "defragmentation", "ns": ns, "min": lo, "max": hi}
        if a["type"] == "move":
            return {**rec, "kind": "migration", "from": a["shard"], "to": a["to"], "reason": "defragmentation"}
        rec.update(kind=a["type"], shard=a["shard"])
        if a["type"] == "dataSize":
            rec["after"] = self.follower.config_time  # the snapshot showed every change to the chunk
        return rec

    # ---------------------------------------------------------- auto-merger

    async def _auto_merge(self) -> None:
        """One auto-merger pass (seed 002): merge the mergeable runs of every collection it may
        touch, at most 10 merges outstanding, autoMergerThrottlingMS apart within a collection,
        until none is left; the next pass is due autoMergerIntervalSecs after this one drains."""
        try:
            while self._allowed():
                await self.history.wait_for(lambda: self.follower.config_time)  # a chunk just moved must look so
                catalog, now = self.follower.catalog, time.time()
                settings, batch = catalog.settings, []
                for ns, coll in sorted(catalog.collections.items()):
                    if not automerge.enabled(
                        settings.autoMergerEnabled,
                        coll.settings.autoMergerEnabled and coll.settings.balancerEnabled,
                        self.state.blocks_balancing(ns),
                    ):
                        continue
                    chunks, zones = automerge.from_collection(coll, self.history.last_migrated(coll))
                    batch += [
                        {
                            "id": uuid.uuid4().hex,
                            "kind": "merge",
                            "by": "autoMerge",
                            "ns": ns,
                            "shard": a["shard"],
                            "min": _boundary(coll, a["min"]),
                            "max": _boundary(coll, a["max"]),
                        }
                        for a in automerge.merge_actions(
                            ns,
                            chunks,
                            zones,
                            now=now,
                            outstanding=len(batch),
                            history_window_secs=settings.minSnapshotHistoryWindowInSeconds,
                        )
                    ]
                if not batch:
                    break
                await self._issue(batch)
                outcomes = await asyncio.gather(
                    *(
                        self._send(a, self._throttle(("autoMerge", a["ns"]), settings.autoMergerThrottlingMS))
                        for a in batch
                    )
                )
                if not any(o.ok for o in outcomes):
                    break  # what is left fails: the next pass tries again
                await self.follower.wait_for(max(o.config_time for o in outcomes), 30)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("balancer: auto-merger pass failed")
        await self._ask(b.MarkAutoMerge(at=time.time()))

    async def _ask(self, cmd) -> dict:
        reply = await self.requester.request(self.settings.topics.balancer_commands, cmd, timeout=60)
        if not reply.ok:
            raise CommandError(reply.code or "Error", reply.error or "")
        return reply.result or {}


def _boundary(coll, key: bytes) -> dict | None:
    """The catalog's bound (Extended JSON) that encodes to `key`, if it is a chunk boundary."""
    i = bisect.bisect_left(coll.mins, key)
    if i < len(coll.chunks) and coll.mins[i] == key:
        return to_ejson(coll.chunks[i].min)
    if i and coll.chunks[i - 1].max_key == key:
        return to_ejson(coll.chunks[i - 1].max)
    return None


def round_pause(summary: dict | None, interval_secs: float) -> float:
    """Seconds before the next round, as MongoDB's main balancer thread: at once after a
    round in which some action succeeded (balancerMigrationsThrottlingMs then spaces the
    migrations), the full round interval after a quiet one, one whose actions all failed
    (no busy loop on a persistent error) or one that raised (summary None)."""
    summary = summary or {}
    issued = summary.get("splits", 0) + summary.get("migrations", 0)
    return 0.0 if summary.get("failed", 0) < issued else interval_secs


def throttle_left(last_migration_end: float | None, now: float, throttle_ms: int) -> float:
    """Seconds to wait before issuing migrations so that at least `throttle_ms` separates
    them from the end of the previous round's migrations (MongoDB's balancerMigrationsThrottlingMs)."""
    if last_migration_end is None:
        return 0.0
    return max(0.0, throttle_ms / 1000 - (now - last_migration_end))


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
