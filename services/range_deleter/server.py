"""The range deleter: deletes the orphans migrations leave behind (docs/reference/range-deletion.md).

Every shard keeps a range-deletion task for a range it gave away (ready once the
migration committed) or received in a migration that aborted.  Each round this
service asks every shard for its tasks (`ListMigrations`), picks one with the
policy (`deleter.plan`) and deletes it in batches of `rangeDeleterBatchSize`,
`rangeDeleterBatchDelayMS` apart (`DeleteRangeBatch`), until it is done or the
shard says to wait.  It keeps no state of its own: a batch and the task's
progress are one shard transaction, so after a restart the task in progress is
simply listed again, and resumed first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field

from domain.follower import CatalogFollower
from libs import tracing
from libs.bus import BusError
from libs.faults import fault_point
from libs.requests import Requester, RequestTimeout
from libs.service import ServiceSettings, clear_ready, report_ready
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import shard as s
from services.range_deleter import deleter

log = logging.getLogger(__name__)

# Idle: seconds between polls of the shards.  Shards do not announce new or newly ready
# tasks, so this bounds how late a deletion starts after its orphanCleanupDelaySecs.
POLL_S = 0.5
LIST_TIMEOUT_S = 5.0  # a shard that does not list its tasks in time is skipped for the round
BATCH_TIMEOUT_S = 30.0
RETRY_S = 30.0  # a task whose batch failed waits this long, so it cannot starve the others
PROGRESS_LOG_S = 5.0


@dataclass
class Status:
    """What the deleter is doing, for tests and logs."""

    rounds: int = 0  # polls of every shard so far
    tasks: list[dict] = field(default_factory=list)  # as last listed, each with "waitingFor": the policy's reason
    current: dict | None = None  # the task being deleted
    last_batch: dict | None = None  # the last DeleteRangeBatch result, with its "shard"
    batches: int = 0


class RangeDeleter:
    def __init__(self, settings: ServiceSettings, name: str = "range-deleter", *, poll_s: float = POLL_S):
        """`poll_s`: seconds between idle rounds (POLL_S; the simulator's are longer: each round
        is a transaction on every shard, the largest share of an idle cluster's CPU there)."""
        self.settings, self.name, self.poll_s = settings, name, poll_s
        self.inbox = settings.topics.range_deleter_inbox
        self.follower = CatalogFollower(settings, name)
        self.requester = Requester(settings.bus, self.inbox, client_id=name, stop_owner_on_failure=True)
        self.status = Status()
        self._held: dict[deleter.Key, tuple[float, str]] = {}  # task -> (monotonic time it may retry, why)
        self._skipped: dict[str, str] = {}  # shard -> why it was skipped, to log a change once
        self._topics: set[str] = set()  # shards whose request topic is known to exist

    async def run(self) -> None:
        settings = self.settings
        await settings.bus.create_topics([*settings.topics.core(), TopicSpec(self.inbox, config=SHORT_LIVED)])
        at = await self.follower.start()
        await self.requester.start()
        report_ready(settings, self.name, configTime=at, inbox=self.inbox)
        try:
            while True:
                if not await self.run_round():
                    await asyncio.sleep(self.poll_s)
        finally:
            clear_ready(settings, self.name)
            await self.requester.stop()
            await self.follower.stop()
            log.info("%s stopped at ConfigTime %d", self.name, self.follower.config_time)

    async def run_round(self) -> bool:
        """Poll every shard, delete at most one task; True if something was deleted."""
        tasks = await self.poll()
        now = time.monotonic()
        self._held = {k: v for k, v in self._held.items() if v[0] > now}
        held = {k: f"{why}; retried in {math.ceil(until - now)} s" for k, (until, why) in self._held.items()}
        p = deleter.plan(tasks, self.follower.catalog.settings, time.time(), held)
        self.status.tasks = [{**t, "waitingFor": p.waiting[deleter.key(t)]} for t in tasks]
        self.status.rounds += 1
        return p.next is not None and await self.delete(p.next)

    async def poll(self) -> list[dict]:
        shards = sorted(self.follower.catalog.shards)
        if new := [sid for sid in shards if sid not in self._topics]:
            # A shard added but never started has no request topic yet: a send would block on metadata.
            await self.settings.bus.create_topics([spec for sid in new for spec in self.settings.topics.for_shard(sid)])
            self._topics.update(new)
        with tracing.untraced():  # a poll every round: not a trace each
            return [t for tasks in await asyncio.gather(*map(self._list, shards)) for t in tasks]

    async def _list(self, sid: str) -> list[dict]:
        try:
            reply = await self.requester.request(
                self.settings.topics.shard_requests(sid), s.ListMigrations(), timeout=LIST_TIMEOUT_S
            )
            why = None if reply.ok else f"{reply.code}: {reply.error}"
        except (RequestTimeout, BusError) as e:
            why = str(e)
        if why is None:
            if self._skipped.pop(sid, None) is not None:
                log.info("shard %s answers again", sid)
            return reply.result["rangeDeletions"]
        if self._skipped.get(sid) != why:  # log once, not every round
            log.warning("shard %s skipped until it lists its range deletions: %s", sid, why)
        self._skipped[sid] = why
        return []

    async def delete(self, task: dict) -> bool:
        """Delete one task batch by batch until done, or the shard says wait; True if anything was deleted.
        Traced in the task's trace: the migration's that created it (its recorded traceparent),
        else a trace of its own; each batch is a child span."""
        with tracing.span(
            "range-deleter task",
            context=tracing.context_of(task.get("traceparent") or ""),
            attributes={
                **tracing.db_attributes(task["ns"], "deleteRange"),
                "shardlog.shard": task["shard"],
                "shardlog.task.id": task["id"],
                "shardlog.task.why": task.get("why", ""),
            },
        ) as span:
            progressed = await self._delete(task)
            span.set_attribute("shardlog.task.progressed", progressed)
            return progressed

    async def _delete(self, task: dict) -> bool:
        sid, tid = task["shard"], task["id"]
        topic = self.settings.topics.shard_requests(sid)
        log.info(
            "deleting task %s on %s (%s): %s [%s, %s), %d documents",
            tid,
            sid,
            task.get("why"),
            task["ns"],
            json.dumps(task["min"]),
            json.dumps(task["max"]),
            task.get("left", 0),
        )
        self.status.current = dict(task)
        progressed, logged = False, time.monotonic()
        try:
            while True:
                cs = self.follower.catalog.settings  # re-read every batch: a changed setting applies at once
                try:
                    with tracing.span(
                        "range-deleter batch", {"shardlog.batch.limit": cs.rangeDeleterBatchSize}
                    ) as batch:
                        reply = await self.requester.request(
                            topic, s.DeleteRangeBatch(task=tid, limit=cs.rangeDeleterBatchSize), timeout=BATCH_TIMEOUT_S
                        )
                        if reply.ok and batch.is_recording():
                            batch.set_attribute("shardlog.documents", (reply.result or {}).get("deleted", 0))
                except (RequestTimeout, BusError) as e:
                    return self._hold(task, str(e), progressed)
                if not reply.ok:
                    return self._hold(task, f"DeleteRangeBatch refused: {reply.code}: {reply.error}", progressed)
                r = reply.result or {}
                self.status.last_batch, self.status.batches = {"shard": sid, **r}, self.status.batches + 1
                if r.get("waiting"):
                    log.info("task %s on %s waits: %s", tid, sid, r["waiting"])
                    return progressed
                if r["deleted"]:
                    progressed = True
                    fault_point("range_deleter.mid_deletion")
                    # left as listed, less what was deleted since (orphans take no writes)
                    left = max(0, task.get("left", 0) - (r["total"] - task.get("deleted", 0)))
                    self.status.current.update(deleted=r["total"], left=left)
                    if not r["done"] and time.monotonic() - logged >= PROGRESS_LOG_S:
                        log.info("task %s on %s: %d deleted, %d left", tid, sid, r["total"], left)
                        logged = time.monotonic()
                if r["done"]:
                    log.info("task %s on %s done: %d documents deleted", tid, sid, r.get("total", task["deleted"]))
                    return True
                await asyncio.sleep(cs.rangeDeleterBatchDelayMS / 1000)
        finally:
            self.status.current = None

    def _hold(self, task: dict, why: str, progressed: bool) -> bool:
        log.warning("task %s on %s held back %gs: %s", task["id"], task["shard"], RETRY_S, why)
        self._held[deleter.key(task)] = (time.monotonic() + RETRY_S, why)
        return progressed
