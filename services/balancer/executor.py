"""The balancer's action executor: sends one recorded action and waits for its outcome.

Each action type (schemas/balancer.py) has its handler, found by type (`run_action`).
Reads: the catalog (through the CatalogFollower: where an action shows, and a migration's
outcome) and the shards' statistics (a dataSize's answer).  Writes: requests to
`config.commands` (SplitChunk, MergeChunks, MoveRange, MovePrimary, RemoveShard,
MarkJumbo) and to a shard's requests (SplitVector); then the action's outcome to
`balancer.commands` (FinishAction), as structured fields: ok, code and reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from domain.follower import CatalogFollower
from domain.protocol import ErrorCode
from domain.shardkey import from_ejson
from libs.dispatch import Dispatch
from libs.errors import CommandError
from libs.requests import Requester
from libs.service import ServiceSettings
from schemas import Record
from schemas import balancer as b
from schemas import config as cfg
from schemas import shard as s
from schemas.reply import Reply
from services.balancer import draining
from services.balancer.statistics import StatisticsReader

log = logging.getLogger(__name__)

MIGRATION_WAIT_S = 3600.0  # a migration may take long (a big range, a slow recipient)
DATA_SIZE_WAIT_S = 60.0  # for a statistics report new enough to measure a chunk (reports come every 10 s)
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    """The result of one action: `code` and `reason` say why it failed; `config_time` is
    where the catalog shows it, `size` answers a dataSize."""

    ok: bool
    code: str | None = None
    reason: str | None = None
    config_time: int = 0
    size: int | None = None

    @classmethod
    def of(cls, reply: Reply) -> Outcome:
        return cls(reply.ok, reply.code, reply.error, reply.configTime or 0)


run_action: Dispatch[Executor, Awaitable[Outcome]] = Dispatch("balancer action")


class Executor:
    def __init__(
        self,
        settings: ServiceSettings,
        follower: CatalogFollower,
        requester: Requester,
        statistics: StatisticsReader,
    ):
        self.settings, self.follower, self.requester, self.statistics = settings, follower, requester, statistics

    async def record(self, cmd: Record) -> dict[str, Any]:
        """Send a command to the balancer's own log; its result."""
        reply = await self.requester.request(self.settings.topics.balancer_commands, cmd, timeout=REQUEST_TIMEOUT_S)
        if not reply.ok:
            raise CommandError(reply.code or "Error", reply.error or "")
        return reply.result or {}

    async def run(self, action: b.Action) -> Outcome:
        """Send one recorded action and wait for its result; record it.  Idempotent: a
        migration already under way is joined, one already decided is found so; a merge
        already done merges nothing."""
        try:
            out = await run_action(self, action)
        except TimeoutError as e:  # no answer (yet): worth asking again
            out = Outcome(False, ErrorCode.Timeout, str(e))
        except Exception as e:  # recorded as failed; the next round decides again
            out = Outcome(False, ErrorCode.InternalError, f"{type(e).__name__}: {e}")
        if not out.ok:
            log.warning("balancer: %s of %s failed: %s: %s", action.kind, action.ns, out.code, out.reason)
        await self.record(b.FinishAction(id=action.id, ok=out.ok, code=out.code, error=out.reason))
        return out

    async def _config(self, cmd: Record) -> Reply:
        return await self.requester.request(self.settings.topics.config_commands, cmd, timeout=REQUEST_TIMEOUT_S)

    # ------------------------------------------------------------ by type

    @run_action.register(b.SplitAction)
    async def _split(self, a: b.SplitAction) -> Outcome:
        return Outcome.of(await self._config(cfg.SplitChunk(ns=a.ns, at=a.at)))

    @run_action.register(b.MergeAction)
    async def _merge(self, a: b.MergeAction) -> Outcome:
        return Outcome.of(await self._config(cfg.MergeChunks(ns=a.ns, min=a.min, max=a.max)))

    @run_action.register(b.RemoveShardAction)
    async def _remove_shard(self, a: b.RemoveShardAction) -> Outcome:
        return Outcome.of(await self._config(cfg.RemoveShard(shard=a.shard)))

    @run_action.register(b.MovePrimaryAction)
    async def _move_primary(self, a: b.MovePrimaryAction) -> Outcome:
        return await self._decided(await self._config(cfg.MovePrimary(db=a.ns, to=a.recipient)))

    @run_action.register(b.MigrationAction)
    async def _migration(self, a: b.MigrationAction) -> Outcome:
        out = await self.migrate(a.ns, a.min, a.max, a.recipient, force_jumbo=a.reason == "drain")
        return Outcome(out.ok, out.code, out.reason)

    async def migrate(
        self, ns: str, lo: dict[str, Any], hi: dict[str, Any] | None, to: str, force_jumbo: bool = False
    ) -> Outcome:
        reply = await self._config(cfg.MoveRange(ns=ns, min=lo, max=hi, to=to, forceJumbo=force_jumbo))
        return await self._decided(reply)

    async def _decided(self, reply: Reply) -> Outcome:
        """Wait for the outcome of the migration (or primary move) a config reply started."""
        if not reply.ok:
            return Outcome(False, reply.code, reply.error)
        result = reply.result or {}
        if not result.get("moved"):
            return Outcome(True)  # already there (a restart found it done)
        mid = result["id"]
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while (outcome := self.follower.catalog.outcome(mid)) is None:
            if time.monotonic() > deadline:
                return Outcome(False, ErrorCode.Timeout, f"migration {mid} still running")
            try:
                await self.follower.wait_for(self.follower.config_time + 1, 5.0)
            except TimeoutError:
                pass
        if outcome.committed:
            return Outcome(True)
        return Outcome(False, outcome.code or ErrorCode.MigrationAborted, outcome.reason)

    @run_action.register(b.DataSizeAction)
    async def _data_size(self, a: b.DataSizeAction) -> Outcome:
        """MongoDB's dataSize, from the statistics the owning shard reports (dataSizeBytes per
        chunk): its first report taken at a ConfigTime at or after `after` (the balancer's
        ConfigTime when it issued the action, which shows the chunk's last change)."""
        coll = self.follower.catalog.collections.get(a.ns)
        if coll is None:
            return Outcome(False, ErrorCode.NamespaceNotFound, f"{a.ns} is not sharded")
        lo, hi = (coll.pattern.encode_bound(from_ejson(k)) for k in (a.min, a.max))
        deadline = time.monotonic() + DATA_SIZE_WAIT_S
        while (report := self.statistics.latest.get(a.shard)) is None or report.configTime < a.after:
            if (left := deadline - time.monotonic()) <= 0:
                return Outcome(
                    False, ErrorCode.Timeout, f"no statistics from {a.shard} at ConfigTime {a.after} or later"
                )
            await self.statistics.changed(min(left, 5.0))
        for ch in report.chunks:
            if (
                ch.ns == a.ns
                and coll.pattern.encode_bound(from_ejson(ch.min)) == lo
                and coll.pattern.encode_bound(from_ejson(ch.max)) == hi
            ):
                return Outcome(True, size=ch.dataSizeBytes)
        return Outcome(False, ErrorCode.ChunkChanged, f"{a.shard} no longer owns [{a.min}, {a.max}) of {a.ns}")

    @run_action.register(b.AutoSplitAction)
    async def _auto_split(self, a: b.AutoSplitAction) -> Outcome:
        """Ask the owner for split points (its split vector) and split there; one shard-key
        value only: mark the chunk jumbo.  Top-chunk optimisation: the new edge chunk of an
        ascending (or descending) key moves off the hot shard."""
        vec = await self.requester.request(
            self.settings.topics.shard_requests(a.shard),
            s.SplitVector(ns=a.ns, chunkMin=a.min, maxChunkSizeBytes=a.limit, edge=a.edge),
            timeout=REQUEST_TIMEOUT_S,
        )
        if not vec.ok:
            return Outcome(False, vec.code, vec.error)
        result = vec.result or {}
        if result["jumbo"]:
            return Outcome.of(await self._config(cfg.MarkJumbo(ns=a.ns, min=a.min)))
        points = result["points"]
        if not points:
            return Outcome(True)
        reply = await self._config(cfg.SplitChunk(ns=a.ns, at=points))
        if not reply.ok or a.edge is None:
            return Outcome.of(reply)
        # The hot edge: inserts of an ascending key all land in the top chunk, so it moves away.
        lo, hi = (points[-1], a.max) if a.edge == "top" else (a.min, points[0])
        to = draining.new_primary(self.follower.catalog, exclude={a.shard})
        if to is None:
            return Outcome(True, config_time=reply.configTime or 0)
        await self.follower.wait_for(reply.configTime or 0, 30)
        out = await self.migrate(a.ns, lo, hi, to)
        return Outcome(out.ok, out.code, out.reason)
