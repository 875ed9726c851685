"""The config server: a projection of config.events (the catalog) driving a
command processor on config.commands."""

from __future__ import annotations

import asyncio
import logging
import time

from domain import clock as vclock
from domain.catalog import Catalog
from domain.protocol import ErrorCode
from libs import tracing
from libs.commands import CommandProcessor, Decision, Policy
from libs.projection import Projection
from libs.requests import Requester
from libs.service import ServiceSettings, clear_ready, report_ready, seconds_from_env, supervised
from libs.store import Store
from schemas import Record
from schemas import config as schema
from services.config.coordinator import DDLDriver
from services.config.decide import decide

NAME = "config"
MOVES_CHECK_S = 5.0  # how often the active config server looks for overdue movePrimary operations
MOVE_PRIMARY_TIMEOUT_ENV = "SHARDLOG_MOVE_PRIMARY_TIMEOUT_S"


def move_primary_timeout() -> float:
    """Seconds a movePrimary may stay undecided before the config server aborts it (default 600)."""
    return seconds_from_env(MOVE_PRIMARY_TIMEOUT_ENV, 600.0)


KEYS_CHECK_S = 60.0  # how often the active config server checks that the signing keys it needs exist

log = logging.getLogger(__name__)


class ConfigPolicy(Policy):
    """The config server's commands decided against the catalog; every reply waits for its
    events' acks (routers and the balancer wait for the ConfigTime it names)."""

    def __init__(self, server: ConfigServer) -> None:
        self.server = server

    def decide(self, command: Record) -> Decision:
        return decide(self.server.catalog, command)

    def on_role(self, role: str) -> None:
        self.server._report(role)


class ConfigServer:
    def __init__(self, settings: ServiceSettings, *, instance: str = "0", max_batch: int = 500):
        self.settings = settings
        t = settings.topics
        # Ticked once per config event; resumes from the stamps of its store (docs/decisions/0014).
        self.clock = vclock.VectorClock()
        self.catalog = Catalog(clock=self.clock)
        self.store = Store(settings.data_dir / f"config-{instance}" / "catalog")
        self.projection = Projection(settings.bus, t.config_events, schema.events, self.catalog, self.store, name=NAME)
        self.processor = CommandProcessor(
            bus=settings.bus,
            command_topic=t.config_commands,
            command_codec=schema.commands,
            projection=self.projection,
            policy=ConfigPolicy(self),
            dead_letters=t.dead_letters,
            group_id=settings.topics.group("config"),
            name=NAME,
            max_batch=max_batch,
            session_timeout_ms=settings.session_timeout_ms,
            clock=self.clock,
        )
        self.instance = instance
        self.ddl = DDLDriver(
            bus=settings.bus,
            topics=t,
            catalog=self.catalog,
            requester=Requester(settings.bus, t.ddl_inbox, client_id=f"{NAME}-ddl", clock=self.clock),
            active=self.processor.active,
            settled=self.processor.settled,
            position=lambda: self.projection.position,
        )

    def _report(self, role: str) -> None:
        # An active one also says how long its take-over took (libs.commands: last_activation).
        activation = {"activation": self.processor.last_activation} if role == "active" else {}
        report_ready(self.settings, self.ready_name, role=role, configTime=self.projection.position, **activation)

    @property
    def ready_name(self) -> str:
        return NAME if self.instance == "0" else f"{NAME}-{self.instance}"

    async def run(self) -> None:
        await self.settings.bus.create_topics(self.settings.topics.core())
        await self.projection.start()
        at = await self.projection.catch_up()
        # Ready = replayed and in the group; active or standing by.
        report_ready(self.settings, self.ready_name, role="standby", configTime=at)
        keys = supervised(asyncio.create_task(self._rotate_keys()), f"{NAME} key rotation")
        ddl = supervised(asyncio.create_task(self.ddl.run()), f"{NAME} DDL coordinators")
        moves = supervised(asyncio.create_task(self._bound_primary_moves()), f"{NAME} movePrimary bound")
        try:
            await self.processor.run()
        finally:
            keys.cancel()
            ddl.cancel()
            moves.cancel()
            await asyncio.gather(keys, ddl, moves, return_exceptions=True)
            clear_ready(self.settings, self.ready_name)
            await self.projection.stop()
            self.store.close()

    async def _bound_primary_moves(self) -> None:
        """While active: abort a movePrimary still undecided SHARDLOG_MOVE_PRIMARY_TIMEOUT_S after
        we first saw it (its donor may be down, or never ran), with ExceededTimeLimit.  The abort
        leaves the database on its old primary: a live donor's commit is then refused, and it
        finishes as aborted (its writes unblocked, the recipient's copies dropped)."""
        limit = move_primary_timeout()
        seen: dict[str, float] = {}
        producer = self.settings.bus.producer(client_id=f"{NAME}-moves")
        await producer.start()
        try:
            while True:
                await self.processor.active.wait()
                now = time.monotonic()
                moves = {m.id: m for m in self.catalog.migrations.values() if m.kind == "primary"}
                seen = {mid: seen.get(mid, now) for mid in moves}
                for mid, since in seen.items():
                    if now - since > limit:
                        m = moves[mid]
                        cmd = schema.AbortPrimaryMove(
                            id=mid,
                            reason=f"movePrimary of {m.ns} {m.donor} -> {m.recipient} was not done within "
                            f"{limit:g}s ({MOVE_PRIMARY_TIMEOUT_ENV}); {m.ns} stays on {m.donor}",
                            code=ErrorCode.ExceededTimeLimit,
                        )
                        await (await producer.send(self.settings.topics.config_commands, schema.commands.encode(cmd)))
                        log.warning("%s: %s", NAME, cmd.reason)
                        seen[mid] = now  # asked; ask again after another bound if still undecided
                await asyncio.sleep(min(MOVES_CHECK_S, limit / 4))
        finally:
            await producer.stop()

    async def _rotate_keys(self) -> None:
        """While active: make sure a signing key valid now and the next one exist, by sending
        ourselves RotateClusterTimeKeys when some are due (the decision makes them)."""
        producer = self.settings.bus.producer(client_id=f"{NAME}-keys")
        await producer.start()
        try:
            while True:
                await self.processor.active.wait()
                interval = self.catalog.settings.KeysRotationIntervalSec
                if vclock.keys_to_create(self.catalog.keys, time.time(), interval):
                    with tracing.untraced():  # housekeeping, not work a user asked for: no trace
                        headers = tracing.inject()
                    sent = await producer.send(
                        self.settings.topics.config_commands,
                        schema.commands.encode(schema.RotateClusterTimeKeys()),
                        headers=headers,
                    )
                    await sent
                    log.info("%s: cluster-time signing keys are due; asked for them", NAME)
                    await asyncio.sleep(1.0)  # let the command be decided before looking again
                    continue
                await asyncio.sleep(min(KEYS_CHECK_S, interval / 2))
        finally:
            await producer.stop()
