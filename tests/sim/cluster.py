"""The whole cluster in one process on the in-memory bus (issue 31 §3): the config server, shards,
a router, the balancer and the range deleter as tasks of the running event loop, talking only
through `libs.bus.memory.MemoryBus`. No broker, no threads: the loop is the only scheduler.

`SimCluster` starts and stops services, kills one (its task cancelled, its store kept or lost)
and restarts it, and gives a client (`libs.client.AsyncCluster` on the same bus)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.bus.memory import MemoryBus
from libs.client import AsyncCluster
from libs.requests import Requester
from libs.service import ServiceSettings
from libs.topics import SHORT_LIVED, TopicSpec
from schemas import Record
from schemas import config as c
from schemas.reply import Reply

WAIT_S = 60.0  # bounded waits for a service to reach a state (the loop runs in real time for now)


async def until(what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise TimeoutError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.01)


class SimCluster:
    def __init__(self, data_dir: Path, shards: tuple[str, ...] = ("s0", "s1"), *, cluster: str = "sim") -> None:
        self.bus = MemoryBus()
        self.data_dir = data_dir
        self.settings = ServiceSettings("memory", cluster, data_dir, session_timeout_ms=6000, transport=self.bus)
        self.shard_ids = shards
        self.services: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._requester: Requester | None = None

    # ------------------------------------------------------------ services

    def _make(self, name: str) -> Any:
        from services.balancer.server import Balancer
        from services.config.server import ConfigServer
        from services.range_deleter.server import RangeDeleter
        from services.router.server import RouterServer
        from services.shard.server import ShardServer

        if name == "config":
            return ConfigServer(self.settings)
        if name.startswith("shard-"):
            return ShardServer(self.settings, name.removeprefix("shard-"))
        if name == "router":
            return RouterServer(self.settings, "r0", port=None)
        if name == "balancer":
            return Balancer(self.settings)
        if name == "range-deleter":
            return RangeDeleter(self.settings)
        raise ValueError(name)

    def start(self, name: str) -> Any:
        service = self.services[name] = self._make(name)
        self.tasks[name] = asyncio.create_task(service.run(), name=f"sim {name}")
        return service

    async def kill(self, name: str, *, lose_store: bool = False) -> None:
        """Stop a service at once (its task cancelled: nothing of an open transaction commits);
        `lose_store`: its RocksDB goes too (a new machine), so it rebuilds from the log."""
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.services.pop(name)
        if lose_store:
            for path in self.data_dir.glob(f"{name}*"):
                shutil.rmtree(path, ignore_errors=True)
            if name == "config":
                shutil.rmtree(self.data_dir / "config-0", ignore_errors=True)

    async def start_all(self, *, balancer: bool = False, range_deleter: bool = False) -> None:
        from libs.topics import Topics

        await self.bus.create_topics(Topics(self.settings.cluster).core())
        config = self.start("config")
        await until("the config server active", config.processor.active.is_set)
        await until("the signing keys", lambda: len(config.catalog.keys) >= 2)
        for sid in self.shard_ids:
            await self.command(c.AddShard(shard=sid))
        for sid in self.shard_ids:
            self.start(f"shard-{sid}")
        router = self.start("router")
        await until("every shard active", lambda: all(self.shard(s).processor.active.is_set() for s in self.shard_ids))
        await until("the router following the catalog", lambda: router.follower._tail is not None)
        if balancer:
            self.start("balancer")
        if range_deleter:
            self.start("range-deleter")

    async def stop_all(self) -> None:
        if self._requester is not None:
            await self._requester.stop()
            self._requester = None
        for name in list(self.tasks):
            await self.kill(name)

    def shard(self, sid: str) -> Any:
        return self.services[f"shard-{sid}"]

    @property
    def config(self) -> Any:
        return self.services["config"]

    @property
    def router(self) -> Any:
        return self.services["router"]

    # ------------------------------------------------------------ asking

    async def command(self, cmd: Record, timeout: float = WAIT_S) -> Reply:
        """A config command; waits until every running shard and router has seen its effect."""
        t = self.settings.topics
        if self._requester is None:
            await self.bus.create_topics([TopicSpec(t.cli_replies, config=SHORT_LIVED)])
            self._requester = Requester(self.bus, t.cli_replies, client_id="sim")
            await self._requester.start()
        reply = await self._requester.request(t.config_commands, cmd, timeout=timeout)
        assert reply.ok, reply
        for name, service in self.services.items():
            if name.startswith("shard-") or name == "router":
                await service.follower.wait_for(reply.configTime, timeout)
        return reply

    def client(self, **kw: Any) -> AsyncCluster:
        return AsyncCluster(self.bus, self.settings.cluster, **kw)
