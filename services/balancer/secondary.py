"""The balancer's secondary loop (MongoDB's secondary thread): collection defragmentation
(defragment.py: one task per collection, its state persisted after every step) and the
auto-merger (automerge.py: a pass every autoMergerIntervalSecs).  Both run only while
the balancer is enabled and inside its window.

Reads: the catalog, the statistics (shard sizes), the migration history (the auto-merger's
window) and the balancer's state (defragmentation per collection, actions in flight, when
the auto-merger last ran).  Writes to `balancer.commands`: IssueActions (its actions carry
`by`, so a new leader's secondary loop finishes them, not its round loop),
SetDefragmentation after every step and MarkAutoMerge after a pass; the executor sends
each action and records its outcome.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

from domain.catalog import Collection
from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.settings import in_window
from domain.shardkey import to_ejson
from libs.faults import fault_point
from schemas import balancer as b
from services.balancer import automerge, defragment
from services.balancer.executor import Executor, Outcome
from services.balancer.history import MigrationHistory
from services.balancer.rounds import new_id, now
from services.balancer.state import BalancerState
from services.balancer.statistics import StatisticsReader

log = logging.getLogger(__name__)

SECONDARY_POLL_S = 0.5  # how often the secondary loop looks for work
RETRY_PAUSE_S = 0.5  # before sending again an action that met a retriable error


class Secondary:
    def __init__(
        self,
        follower: CatalogFollower,
        state: BalancerState,
        statistics: StatisticsReader,
        history: MigrationHistory,
        executor: Executor,
        active: asyncio.Event,
        round_no: Callable[[], int],
    ):
        self.follower, self.state, self.statistics, self.history = follower, state, statistics, history
        self.executor, self.active, self.round_no = executor, active, round_no
        self._live: set[str] = set()  # ids of the actions being run by this instance
        self._last_sent: dict[Hashable, float] = {}  # throttling key -> when its last action was (or will be) sent

    def _allowed(self) -> bool:
        settings = self.follower.catalog.settings
        return settings.balancerEnabled and in_window(settings.balancerWindow, now())

    def _throttle(self, key: Hashable, ms: int) -> float:
        """Seconds to wait before sending the next action under `key`; reserves its slot."""
        t = time.monotonic()
        wait = automerge.throttle_wait(self._last_sent.get(key), t, ms)
        self._last_sent[key] = t + wait
        return wait

    async def _issue(self, actions: Sequence[b.Action]) -> None:
        """Record actions before they are sent.  They are ours from now on: the loop does
        not take them for a previous instance's."""
        self._live.update(a.id for a in actions)
        try:
            await self.executor.record(b.IssueActions(round=self.round_no(), actions=list(actions)))
        except BaseException:
            self._live.difference_update(a.id for a in actions)
            raise

    async def _send(self, action: b.Action, delay: float = 0.0) -> Outcome:
        self._live.add(action.id)
        try:
            if delay:
                await asyncio.sleep(delay)  # throttling
            return await self.executor.run(action)
        finally:
            self._live.discard(action.id)

    async def run(self) -> None:
        """Defragmentation (a task per collection) and the auto-merger (a pass at a time).
        A new leader first finishes what an earlier one issued, then resumes each
        defragmentation from its recorded state."""
        defrags: dict[str, asyncio.Task[None]] = {}
        merger: asyncio.Task[None] | None = None
        try:
            while True:
                if not self.active.is_set():  # a standby: the leader does the work
                    for t in [*defrags.values(), merger]:
                        if t is not None:
                            t.cancel()
                    await self.active.wait()
                orphans = [a for a in self.state.in_flight.values() if a.secondary and a.id not in self._live]
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
        """One collection's defragmentation: send the policy's next actions (at most 50 in
        flight, chunkDefragmentationThrottlingMS apart), fold in each outcome once the
        catalog shows it, and persist the state after every step.  Issues nothing while the
        balancer is disabled or outside its window."""
        running: dict[asyncio.Task[Outcome], dict[str, Any]] = {}
        try:
            doc = self.state.defragmenting[ns]
            started, saved = doc["started"], None
            st = defragment.resume(defragment.from_json(doc["state"]))  # answers to what was in flight are lost
            retrying: list[dict[str, Any]] = []  # met a retriable error: sent again after a pause
            steps = (st.phase, 0)  # (phase, steps this instance took in it): for the fault point
            while True:
                if self.state.defragmenting[ns]["state"]["stopped"] or ns not in self.follower.catalog.collections:
                    st = defragment.stop(st)  # `defragment NS stop`, or dropped: issue nothing more
                issued: list[dict[str, Any]] = []
                if self._allowed() and not st.stopped:
                    st, issued = defragment.next_actions(st, self._defrag_snapshot(ns))
                sends: list[tuple[dict[str, Any], b.Action]] = []
                for a in issued:
                    if (rec := self._defrag_action(ns, a)) is None:  # not chunk bounds: the catalog changed under us
                        st = defragment.on_result(st, a, False, ErrorCode.ChunkChanged)
                    else:
                        sends.append((a, rec))
                if (doc := defragment.to_json(st)) != saved:
                    reply = await self.executor.record(b.SetDefragmentation(ns=ns, started=started, state=doc))
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
        return defragment.Snapshot(
            chunks,
            coll.settings.maxChunkSizeBytes or catalog.settings.maxChunkSizeBytes,
            zones,
            self.statistics.shard_sizes(),
            frozenset(s.id for s in catalog.shards.values() if s.draining),
        )

    def _defrag_action(self, ns: str, a: dict[str, Any]) -> b.Action | None:
        """A policy action as the balancer records and sends it (bounds as the catalog's), or None
        if its bounds are no longer chunk bounds."""
        coll = self.follower.catalog.collections.get(ns)
        lo, hi = (boundary(coll, a[k]) if coll else None for k in ("min", "max"))
        if lo is None or hi is None:
            return None
        by: Literal["defragmentation"] = "defragmentation"
        if a["type"] == "move":
            return b.MigrationAction(
                id=new_id(), by=by, ns=ns, min=lo, max=hi, donor=a["shard"], recipient=a["to"], reason=by
            )
        if a["type"] == "dataSize":  # the snapshot showed every change to the chunk
            return b.DataSizeAction(
                id=new_id(), by=by, ns=ns, min=lo, max=hi, shard=a["shard"], after=self.follower.config_time
            )
        return b.MergeAction(id=new_id(), by=by, ns=ns, min=lo, max=hi, shard=a["shard"])

    # ---------------------------------------------------------- auto-merger

    async def _auto_merge(self) -> None:
        """One auto-merger pass: merge the mergeable runs of every collection it may touch,
        at most 10 merges outstanding, autoMergerThrottlingMS apart within a collection,
        until none is left; the next pass is due autoMergerIntervalSecs after this one drains."""
        try:
            while self._allowed():
                await self.history.wait_for(lambda: self.follower.config_time)  # a chunk just moved must look so
                catalog, t = self.follower.catalog, time.time()
                settings, batch = catalog.settings, list[b.MergeAction]()
                for ns, coll in sorted(catalog.collections.items()):
                    if not automerge.enabled(
                        settings.autoMergerEnabled,
                        coll.settings.autoMergerEnabled and coll.settings.balancerEnabled,
                        self.state.blocks_balancing(ns),
                    ):
                        continue
                    chunks, zones = automerge.from_collection(coll, self.history.last_migrated(coll))
                    batch += [
                        b.MergeAction(
                            id=new_id(),
                            by="autoMerge",
                            ns=ns,
                            shard=a["shard"],
                            min=chunk_bound(coll, a["min"]),
                            max=chunk_bound(coll, a["max"]),
                        )
                        for a in automerge.merge_actions(
                            ns,
                            chunks,
                            zones,
                            now=t,
                            outstanding=len(batch),
                            history_window_secs=settings.minSnapshotHistoryWindowInSeconds,
                        )
                    ]
                if not batch:
                    break
                await self._issue(batch)
                outcomes = await asyncio.gather(
                    *(
                        self._send(a, self._throttle(("autoMerge", a.ns), settings.autoMergerThrottlingMS))
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
        await self.executor.record(b.MarkAutoMerge(at=time.time()))


def boundary(coll: Collection, key: bytes) -> dict[str, Any] | None:
    """The catalog's bound (Extended JSON) that encodes to `key`, if it is a chunk boundary."""
    i = bisect.bisect_left(coll.mins, key)
    if i < len(coll.chunks) and coll.mins[i] == key:
        bound: dict[str, Any] = to_ejson(coll.chunks[i].min)
        return bound
    if i and coll.chunks[i - 1].max_key == key:
        bound = to_ejson(coll.chunks[i - 1].max)
        return bound
    return None


def chunk_bound(coll: Collection, key: bytes) -> dict[str, Any]:
    """The bound of a key the auto-merger took from the catalog's chunks: a chunk boundary."""
    bound = boundary(coll, key)
    if bound is None:
        raise ValueError(f"{coll.ns}: {key.hex()} is not a chunk boundary")
    return bound
