"""The balancer's round loop.

A round (when enabled and inside the window; the next one starts at once after a round
in which an action succeeded, `balancerRoundIntervalSecs` after any other, as MongoDB's):
build a snapshot from the catalog and the shards' latest statistics, ask the policy (a
pure function) for splits and migrations, record them as issued, send the splits and
wait for them, then the migrations (in parallel: the policy uses each shard at most once)
and wait for their outcomes, recording each result.  Failures are logged and recorded;
the next round starts from the new state.

Reads: the catalog, the statistics, the balancer's state (actions in flight, last round).
Writes to `balancer.commands`: IssueActions before sending, CompleteRound after; the
executor sends each action and records its outcome.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from opentelemetry import trace

from domain.catalog import Catalog
from domain.follower import CatalogFollower
from domain.settings import in_window
from domain.shardkey import from_ejson, to_ejson
from libs import tracing
from schemas import balancer as b
from services.balancer import draining, policy
from services.balancer.executor import Executor, Outcome
from services.balancer.state import BalancerState
from services.balancer.statistics import StatisticsReader

log = logging.getLogger(__name__)


class Rounds:
    def __init__(
        self,
        follower: CatalogFollower,
        state: BalancerState,
        statistics: StatisticsReader,
        executor: Executor,
        active: asyncio.Event,
        snapshot: Callable[[], dict[str, Any]],
        collection_status: Callable[[str, dict[str, Any]], dict[str, Any]],
    ):
        self.follower, self.state, self.statistics, self.executor = follower, state, statistics, executor
        self.active, self.snapshot, self.collection_status = active, snapshot, collection_status
        self.not_compliant: dict[str, list[str]] = {}  # ns -> why, found when a round had nothing to do
        self.round = 0
        self.activity = "starting"  # what the round loop is doing, for `balancer status`
        self._changed: set[str] = set()  # shards our last actions changed: their next report must show it
        self._last_migration_end: float | None = None  # monotonic; for balancerMigrationsThrottlingMs

    async def run(self) -> None:
        while True:
            await self.active.wait()
            self.round = self.state.last_round.get("round", 0)
            summary: dict[str, Any] | None = {}
            try:
                if any(not a.secondary for a in self.state.in_flight.values()):
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
                await self._until_news(interval)  # the reports it waits for, or the interval
            else:
                await asyncio.sleep(round_pause(summary, interval))

    async def balance_round(self) -> dict[str, Any]:
        """One round; its summary."""
        catalog = self.follower.catalog
        sizes, stale = self.statistics.sizes(catalog, self._changed)
        if stale:
            self.activity = f"waiting for statistics that show the chunks of {', '.join(stale)}"
            return {"skipped": self.activity}
        plan = policy.plan(self.snapshot())
        splits: list[b.SplitAction | b.AutoSplitAction] = [
            b.SplitAction(id=new_id(), ns=s.ns, chunk=b.ChunkRangeDoc(**s.chunk.model_dump()), at=s.at)
            for s in plan.splits
        ]
        splits += auto_splits(catalog, sizes)
        moves: list[b.MigrationAction | b.MovePrimaryAction | b.RemoveShardAction] = [
            b.MigrationAction(
                id=new_id(), ns=m.ns, donor=m.donor, recipient=m.recipient, min=m.min, max=m.max, reason=m.reason
            )
            for m in plan.migrations
        ]
        busy = {s for m in plan.migrations for s in (m.donor, m.recipient)}
        # A draining shard without chunks: its databases move (one at a time), then it goes.
        moves += draining.drain_actions(catalog, busy, new_id)
        if not splits and not moves:
            self.not_compliant = self._not_compliant()
            self.activity = (
                "nothing to do, but not compliant: "
                + "; ".join(f"{ns}: {', '.join(why)}" for ns, why in self.not_compliant.items())
                if self.not_compliant
                else "balanced: nothing to do"
            )
            return {"splits": 0, "migrations": 0}
        self.not_compliant = {}
        self.round += 1
        # A round that issues actions is a trace of its own; rounds with nothing to do are not traced.
        with tracing.span(
            "balancer round",
            context=tracing.ROOT,
            attributes={
                "shardlog.balancer.round": self.round,
                "shardlog.splits": len(splits),
                "shardlog.migrations": len(moves),
            },
        ) as span:
            return await self._issue(catalog, splits, moves, span)

    async def _issue(
        self,
        catalog: Catalog,
        splits: list[b.SplitAction | b.AutoSplitAction],
        moves: list[b.MigrationAction | b.MovePrimaryAction | b.RemoveShardAction],
        round_span: trace.Span,
    ) -> dict[str, Any]:
        round_no = self.round
        await self.executor.record(b.IssueActions(round=round_no, actions=[*splits, *moves]))
        self.activity = f"round {round_no}: {len(splits)} split(s), {len(moves)} migration(s)"
        split_results = [await self.executor.run(action) for action in splits]
        if moves and (
            pause := throttle_left(
                self._last_migration_end,
                time.monotonic(),
                self.follower.catalog.settings.balancerMigrationsThrottlingMs,
            )
        ):
            self.activity += f" (throttled {pause:.1f}s: balancerMigrationsThrottlingMs)"
            await asyncio.sleep(pause)
        results = await asyncio.gather(*(self._move(a, round_span) for a in moves))
        if moves:
            self._last_migration_end = time.monotonic()
        summary = {
            "splits": len(splits),
            "migrations": len(moves),
            "failed": sum(1 for r in (*split_results, *results) if not r.ok),
            "reasons": sorted({m.reason if isinstance(m, b.MigrationAction) else m.kind for m in moves}),
        }
        await self.executor.record(b.CompleteRound(round=round_no, summary=summary))
        # The next round needs statistics that show what these actions changed (the shards
        # report as soon as their chunks change; failed actions changed nothing).
        self._changed = {
            s for a, r in zip([*splits, *moves], [*split_results, *results]) if r.ok for s in changed_shards(catalog, a)
        }
        return summary

    async def _move(
        self, action: b.MigrationAction | b.MovePrimaryAction | b.RemoveShardAction, round_span: trace.Span
    ) -> Outcome:
        """A migration the round issued is a trace of its own (one move-range, one trace), linked
        both ways with the round's: the round's span lists its migrations, each names its round."""
        with tracing.span(
            f"balancer {action.kind}",
            {
                **tracing.db_attributes(action.ns, action.kind),
                "shardlog.balancer.round": self.round,
                "shardlog.balancer.action": action.id,
            },
            context=tracing.ROOT,
            links=[trace.Link(round_span.get_span_context())],
        ) as span:
            round_span.add_link(span.get_span_context())
            return await self.executor.run(action)

    async def _until_news(self, timeout: float) -> None:
        """Until a shard reports or the catalog moves on (a report may show a layout the
        catalog here does not have yet), or `timeout` seconds."""
        waits = [
            asyncio.create_task(self.statistics.changed(timeout)),
            asyncio.create_task(self.follower.wait_for(self.follower.config_time + 1, timeout)),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _not_compliant(self) -> dict[str, list[str]]:
        """Per collection the balancer cannot bring into compliance, its violations in
        short (reason, with the zone or shard it names): what `balancer status` shows
        instead of "balanced" when a round finds nothing it may do."""
        snap = self.snapshot()
        out: dict[str, list[str]] = {}
        for ns in sorted(self.follower.catalog.collections):
            status = self.collection_status(ns, snap)
            if status["compliant"]:
                continue
            counts: dict[str, int] = {}
            for v in status["violations"]:
                if v["reason"] == "balancerDisabled":
                    continue
                what = v["reason"] + (f" (zone {v['zone']!r})" if v.get("zone") else "")
                what += f" on {v['shard']}" if v.get("shard") else ""
                counts[what] = counts.get(what, 0) + 1
            out[ns] = [f"{w} ×{n}" if n > 1 else w for w, n in counts.items()]
        return out

    async def _finish_in_flight(self) -> None:
        """The round loop's own actions (the secondary loop finishes those it issued)."""
        actions = [a for a in self.state.in_flight.values() if not a.secondary]
        results = await asyncio.gather(*(self.executor.run(a) for a in actions))
        catalog = self.follower.catalog
        self._changed = {s for a, r in zip(actions, results) if r.ok for s in changed_shards(catalog, a)}


def changed_shards(catalog: Catalog, action: Any) -> set[str]:
    """The shards whose chunks an action changes: a migration's donor and recipient, the
    owner of a split chunk (a primary move or a removal changes no chunk)."""
    if isinstance(action, b.MigrationAction):
        return {action.donor, action.recipient}
    if isinstance(action, b.AutoSplitAction):
        return {action.shard}
    if isinstance(action, b.SplitAction):
        coll = catalog.collections.get(action.ns)
        if coll is not None:
            return {coll.chunks[coll.chunk_index(coll.pattern.encode_bound(from_ejson(action.chunk.min)))].shard}
    return set()


def auto_splits(catalog: Catalog, sizes: dict[tuple[str, bytes], int]) -> list[b.SplitAction | b.AutoSplitAction]:
    """Chunks of collections with autoSplit grown to the max chunk size."""
    out: list[b.SplitAction | b.AutoSplitAction] = []
    for ns, coll in catalog.collections.items():
        if not coll.settings.autoSplit:
            continue
        limit = coll.settings.maxChunkSizeBytes or catalog.settings.maxChunkSizeBytes
        for i, ch in enumerate(coll.chunks):
            if not ch.jumbo and sizes.get((ns, ch.min_key), 0) >= limit:
                edge: Literal["top", "bottom"] | None = (
                    "top" if i == len(coll.chunks) - 1 else "bottom" if i == 0 else None
                )
                out.append(
                    b.AutoSplitAction(
                        id=new_id(),
                        ns=ns,
                        min=to_ejson(ch.min),
                        max=to_ejson(ch.max),
                        shard=ch.shard,
                        limit=limit,
                        edge=None if coll.pattern.is_hashed else edge,
                    )
                )
    return out


def round_pause(summary: dict[str, Any] | None, interval_secs: float) -> float:
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


def new_id() -> str:
    return uuid.uuid4().hex


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
