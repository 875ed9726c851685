"""The DDL coordinators' driver (domain/ddl.py has the state machine; docs/decisions/0018).

Runs in the config server while it is the active instance.  For every coordinator the catalog
shows unfinished, it does the work of the checkpointed phase, then sends `AdvanceDDL` to
`config.commands` (decided like any command, by services/config/decide.py) and waits until
its own catalog shows the next phase.  A restarted or newly active config server finds the
same coordinators in its replayed catalog and starts each again at its checkpointed phase.

    reads   config.events (through the config server's catalog), topics.ddl_inbox (replies)
    writes  config.commands (AdvanceDDL), shard.<id>.requests (EnterDDLCriticalSection,
            DropLocalData, RenameLocalBatch, RekeyLocalBatch, ExitDDLCriticalSection;
            BuildIndexes, ListIndexes, DropIndexes for the index DDLs)

Fault points, for the crash tests: `ddl.<phase>@<op>` fires once the phase is checkpointed and
before its work, `ddl.<phase>.done@<op>` after its work, before the next checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from domain.bsonvalues import from_record
from domain.catalog import Catalog
from domain.ddl import Coordinator, Phase, before_point_of_no_return, next_phase
from domain.index_ddl import build_states, index_build_poll
from domain.protocol import CONFIG_TIME, ErrorCode
from libs.bus import Bus, BusError
from libs.faults import fault_point
from libs.requests import Requester, RequestTimeout
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import ddl as d
from schemas import indexes as ix

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
SCAN_S = 0.05  # how often the driver looks for coordinators it does not run yet
LOCAL_BATCH = 2000  # documents per RenameLocalBatch / RekeyLocalBatch
# A shard's refusal with one of these is waited out; any other, before the point of no return,
# rolls the DDL back (after it, the coordinator retries: it only goes forward).
RETRIABLE = {
    ErrorCode.StaleConfig,
    ErrorCode.ShardUnavailable,
    ErrorCode.Timeout,
    ErrorCode.KafkaUnavailable,
    ErrorCode.InterruptedDueToReplStateChange,
    ErrorCode.PrimarySteppedDown,
    ErrorCode.PrepareConflict,  # a prepared transaction's decision comes first (decisions/0020)
}


class Refused(Exception):
    """A request of the coordinator was refused: `code`, `reason`."""

    def __init__(self, code: str | None, reason: str, info: dict[str, Any] | None = None):
        super().__init__(f"{code}: {reason}")
        self.code, self.reason, self.info = code, reason, info


class NotActive(RuntimeError):
    pass


class DDLDriver:
    def __init__(
        self,
        *,
        bus: Bus,
        topics: Topics,
        catalog: Catalog,
        requester: Requester,
        active: asyncio.Event,
        settled: Callable[[], bool] = lambda: True,
        position: Callable[[], int] | None = None,
        fault: Callable[..., None] = fault_point,
    ):
        self.bus, self.topics, self.catalog = bus, topics, catalog
        self.requester, self.active, self.fault = requester, active, fault
        # The command processor applies a decision's events to the catalog before its transaction
        # commits: `settled` says none is in flight (what the catalog shows is in the log), and
        # `position` is the committed ConfigTime the shards must reach before they decide.
        self.settled = settled
        self.position = position or (lambda: self.catalog.config_time)
        self._running: dict[str, asyncio.Task[None]] = {}
        self.scan_s = SCAN_S  # (the simulator looks less often: tests/sim/cluster.py)
        self.progress: dict[str, dict[str, object]] = {}  # live progress by coordinator id (ddl status)

    async def run(self) -> None:
        await self.bus.create_topics([TopicSpec(self.requester.inbox, config=SHORT_LIVED)])
        await self.requester.start()
        try:
            while True:
                if not self.active.is_set():
                    await self._stop_all()
                    await self.active.wait()
                for cid in list(self.catalog.ddl):
                    if cid not in self._running:
                        self._running[cid] = asyncio.create_task(self._drive(cid), name=f"ddl {cid}")
                for cid, task in list(self._running.items()):
                    if task.done():
                        del self._running[cid]
                        self.progress.pop(cid, None)
                        if (
                            not task.cancelled()
                            and (e := task.exception()) is not None
                            and not isinstance(e, NotActive)
                        ):
                            log.error("DDL coordinator %s stopped: %r; it will resume from its phase", cid, e)
                            await asyncio.sleep(1.0)  # a failing peer is not retried in a tight loop
                await asyncio.sleep(self.scan_s)
        finally:
            await self._stop_all()
            await self.requester.stop()

    async def _stop_all(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._running.clear()

    # ------------------------------------------------------------ one coordinator

    async def _drive(self, cid: str) -> None:
        while (c := await self._committed(cid)) is not None:
            phase = c.phase
            self.progress[cid] = {"phase": str(phase), "since": time.time()}
            self.fault(f"ddl.{phase}", c.op)
            try:
                await self._work(c, phase)
            except Refused as e:
                if not before_point_of_no_return(phase, c.op) or phase == Phase.ROLLBACK:
                    raise  # retried from the phase by run(): after the point of no return we go forward
                log.warning("DDL %s %s of %s: %s; rolling back", cid, c.op, c.ns, e)
                await self._advance(c, phase, Phase.ROLLBACK, code=e.code, reason=e.reason, info=e.info)
                continue
            self.fault(f"ddl.{phase}.done", c.op)
            try:
                await self._advance(c, phase, next_phase(phase, c.op))
            except Refused as e:  # the commit's re-check failed: nothing changed, roll back
                if not before_point_of_no_return(phase, c.op):
                    raise
                log.warning("DDL %s %s of %s refused at %s: %s; rolling back", cid, c.op, c.ns, phase, e)
                await self._advance(c, phase, Phase.ROLLBACK, code=e.code, reason=e.reason)

    async def _committed(self, cid: str) -> Coordinator | None:
        """Coordinator `cid` as the log has it: a phase not yet committed is not acted on (a
        crash before the commit would leave shards doing what the log never recorded)."""
        while not self.settled():
            self._check_active()
            await asyncio.sleep(0.005)
        return self.catalog.ddl.get(cid)

    async def _work(self, c: Coordinator, phase: Phase) -> None:
        shards = [s for s in c.shards if s in self.catalog.shards]
        if phase == Phase.FREEZE:
            await self._migrations_stopped(c)
        elif phase == Phase.BLOCK_CRUD:
            section = d.EnterDDLCriticalSection(
                id=c.id, namespaces=c.namespaces(), db=c.db if c.op == "dropDatabase" else None
            )
            await asyncio.gather(*(self._ask_shard(s, section) for s in shards))
        elif phase == Phase.BUILD:
            await self._build(c)
        elif phase == Phase.APPLY and c.op == "dropIndexes":
            # Every shard: one that no longer owns chunks may still hold the index.
            drop = ix.DropIndexes(ns=c.ns, names=list(c.params["names"]), missingOk=True)
            await asyncio.gather(*(self._ask_shard(s, drop) for s in shards))
        elif phase == Phase.APPLY:
            await asyncio.gather(*(self._apply(c, s) for s in shards))
        elif phase == Phase.ROLLBACK and c.op == "createIndexes":
            # No half index anywhere: the builds are dropped wherever they ran (or not).
            names = [r["name"] for r in c.params["indexes"]]
            drop = ix.DropIndexes(ns=c.ns, names=names, missingOk=True)
            await asyncio.gather(*(self._ask_shard(s, drop) for s in shards))
        elif c.op in ("createIndexes", "dropIndexes"):
            return  # commit (the advance carries the catalog change); no critical section to leave
        elif phase in (Phase.RELEASE, Phase.ROLLBACK):
            await asyncio.gather(*(self._ask_shard(s, d.ExitDDLCriticalSection(id=c.id)) for s in shards))

    async def _build(self, c: Coordinator) -> None:
        """createIndexes' buildIndexes phase: BuildIndexes on every shard that owns chunks of the
        collection and its primary (migrations are frozen: the set is stable, and the same
        after a restart), then ListIndexes on each until every new index is ready there.  One
        that failed anywhere (a duplicate key under a unique index) is Refused: the rollback."""
        coll = self.catalog.collections.get(c.ns)
        build = ix.BuildIndexes(
            ns=c.ns,
            indexes=[from_record(r) for r in c.params["indexes"]],
            buildId=c.id,
            shardKey=coll.pattern.spec if coll is not None else None,
        )
        names = [r["name"] for r in c.params["indexes"]]
        await asyncio.gather(*(self._build_on(c, s, build, names) for s in self.catalog.index_shards(c.ns)))

    async def _build_on(self, c: Coordinator, shard: str, build: ix.BuildIndexes, names: list[str]) -> None:
        await self._ask_shard(shard, build)  # answered at once: the shard's own driver scans
        while True:
            listed = await self._ask_shard(shard, ix.ListIndexes(ns=c.ns))
            states = build_states(listed, names)
            self.progress[c.id][f"built@{shard}"] = states
            if (failed := next((st for st in states.values() if st["state"] == "failed"), None)) is not None:
                error = failed.get("error") or {}
                info = {k: error[k] for k in ("keyPattern", "keyValue") if k in error}
                raise Refused(
                    error.get("code") or ErrorCode.IndexBuildAborted,
                    error.get("errmsg") or "index build failed",
                    info or None,
                )
            if all(st["state"] == "ready" for st in states.values()):
                return
            self._check_active()
            await asyncio.sleep(index_build_poll())

    async def _migrations_stopped(self, c: Coordinator) -> None:
        """The catalog refuses new migrations of what `c` holds and the commits of running ones
        (they abort): wait until none is left."""
        while True:
            left = [
                m.id
                for m in self.catalog.migrations.values()
                if (c.covers(m.ns) if m.kind == "range" else m.ns == c.db)
            ]
            if not left:
                return
            self.progress[c.id]["waitingFor"] = left
            self._check_active()
            await asyncio.sleep(0.2)

    async def _apply(self, c: Coordinator, shard: str) -> None:
        """One shard's part of the catalog change: its documents follow."""
        if c.op == "dropCollection":
            await self._ask_shard(shard, d.DropLocalData(id=c.id, ns=c.ns))
        elif c.op == "dropDatabase":
            await self._ask_shard(shard, d.DropLocalData(id=c.id, db=c.ns))
        elif c.op == "renameCollection":
            # The target's old documents go first (dropTarget; none otherwise).  The shard does a
            # drop once per (id, namespace), so a rerun of this phase keeps what was renamed.
            await self._ask_shard(shard, d.DropLocalData(id=c.id, ns=c.params["to"]))
            moved = 0
            while True:
                r = await self._ask_shard(
                    shard, d.RenameLocalBatch(id=c.id, ns=c.ns, to=c.params["to"], limit=LOCAL_BATCH)
                )
                moved += int(r.get("moved", 0))
                self.progress[c.id][f"moved@{shard}"] = moved
                if r.get("done"):
                    return
        else:
            after: str | None = None
            rewritten = 0
            while True:
                r = await self._ask_shard(shard, d.RekeyLocalBatch(id=c.id, ns=c.ns, after=after, limit=LOCAL_BATCH))
                rewritten += int(r.get("rewritten", 0))
                self.progress[c.id][f"rekeyed@{shard}"] = rewritten
                if r.get("done"):
                    return
                after = r.get("after")

    # ------------------------------------------------------------ requests

    def _check_active(self) -> None:
        if not self.active.is_set():
            raise NotActive("the config server is no longer the active instance")

    async def _ask(self, topic: str, record: Record) -> dict:
        """A request answered ok, retried on timeouts and retriable refusals (every request of
        the coordinator is idempotent); any other refusal raises Refused."""
        while True:
            self._check_active()
            headers = [(CONFIG_TIME, str(self.position()).encode())]
            try:
                reply = await self.requester.request(topic, record, timeout=REQUEST_TIMEOUT_S, headers=headers)
            except RequestTimeout:
                log.info("DDL: %s to %s not answered yet; asking again", record.type, topic)
                continue
            except BusError as e:
                log.info("DDL: %s to %s failed (%r); asking again", record.type, topic, e)
                await asyncio.sleep(0.5)
                continue
            if reply.ok:
                return dict(reply.result or {})
            if reply.code in RETRIABLE:
                await asyncio.sleep(0.2)
                continue
            raise Refused(reply.code, reply.error or "refused")

    async def _ask_shard(self, shard: str, record: Record) -> dict:
        return await self._ask(self.topics.shard_requests(shard), record)

    async def _advance(
        self,
        c: Coordinator,
        phase: Phase,
        to: Phase,
        *,
        code: str | None = None,
        reason: str | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Checkpoint `to`, then wait until our own catalog shows it (the next loop reads it)."""
        cmd = d.AdvanceDDL(id=c.id, phase=phase, to=to, code=code, reason=reason, result=info or {})
        await self._ask(self.topics.config_commands, cmd)
        deadline = time.monotonic() + 30.0
        while (now := self.catalog.ddl.get(c.id)) is not None and now.phase == phase:
            self._check_active()
            if time.monotonic() > deadline:
                raise TimeoutError(f"DDL {c.id}: the catalog does not show the advance from {phase} after 30 s")
            await asyncio.sleep(0.01)
