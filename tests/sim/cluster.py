"""The whole cluster in one process on the in-memory bus (issue 31 §3): the config server, shards,
a router and the range deleter (the balancer too, when asked) as tasks of the running event
loop, talking only through `libs.bus.memory.MemoryBus`. No broker, no threads.

Each service runs as a simulated *process* (`libs.bus.memory.PROCESS`, one per start): `crash`
is `kill -9` (the bus refuses the process everything from then on, its tasks are cancelled, its
RocksDB stores closed, or deleted with `lose_store`), and `start` runs a new process of it."""

from __future__ import annotations

import asyncio
import contextvars
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from libs import store as store_module
from libs.bus.memory import PROCESS, MemoryBus
from libs.client import AsyncCluster
from libs.requests import Requester
from libs.service import ServiceSettings
from libs.topics import SHORT_LIVED, Topics, TopicSpec
from schemas import Record
from schemas import config as c
from schemas.reply import Reply

# Imported here, not when a schedule first starts a service: a module's import-time state must
# not depend on which schedule ran first in the process (a seed repeats its schedule).
from services.balancer.server import Balancer
from services.config.server import ConfigServer
from services.range_deleter.server import RangeDeleter
from services.router.server import RouterServer
from services.shard.server import ShardServer
from services.shard.statistics import LAYOUT_POLL_S
from tests.sim.disk import SimDisk

WAIT_S = 120.0  # bounded waits, in simulated seconds (free: the loop jumps to the next timer)
# How long the services' idle loops wait in one fetch or poll (libs.bus.Bus.idle_wait_s): on a
# broker 0.1-0.5 s, each wake-up an empty look; here each costs CPU (docs/reference/simulator.md).
IDLE_WAIT_S = 30.0
# The range deleter's idle rounds (production: every 0.5 s): each asks every shard for its tasks in
# a transaction of its own, half of an idle simulated cluster's CPU at 0.5 s. A deletion still
# starts within a second of its orphanCleanupDelaySecs.
RANGE_DELETER_POLL_S = 1.0
# The config server's DDL driver looks for coordinators it does not run yet every 0.05 s in
# production: 20 idle wake-ups a simulated second.
DDL_SCAN_S = 0.2
# Each active shard's statistics publisher looks for a change of the chunks it owns every 0.1 s
# (LAYOUT_POLL_S), production's: at 0.5 s, seed 229 broke invariant 8 on 3343989 (a snapshot read
# routed without a migration committed, stamped before its time, after it was routed; fixed, the
# shard refuses it as stale: docs/reference/simulator.md, "Not yet").
STATISTICS_LAYOUT_POLL_S = LAYOUT_POLL_S


async def until(what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise TimeoutError(f"not within {timeout:g}s: {what}")
        await asyncio.sleep(0.05)


@contextmanager
def stores_by_process() -> Iterator[dict[str, list[store_module.Store]]]:
    """Which process opened which RocksDB store (closed for it when it crashes: a dead process
    holds no lock)."""
    opened: dict[str, list[store_module.Store]] = {}
    original = store_module.Store.__init__

    def recording(self: store_module.Store, path: str | Path) -> None:
        original(self, path)
        opened.setdefault(PROCESS.get() or "", []).append(self)

    store_module.Store.__init__ = recording  # type: ignore[method-assign]
    try:
        yield opened
    finally:
        store_module.Store.__init__ = original  # type: ignore[method-assign]


class SimCluster:
    def __init__(
        self,
        data_dir: Path,
        shards: tuple[str, ...] = ("s0", "s1"),
        *,
        cluster: str = "sim",
        stores: dict[str, list[store_module.Store]] | None = None,
        delivery_delay: Callable[[str, int], float] | None = None,
        disk: SimDisk | None = None,
    ) -> None:
        self.bus = MemoryBus(delivery_delay, idle_wait_s=IDLE_WAIT_S)
        self.data_dir = data_dir
        self.settings = ServiceSettings("memory", cluster, data_dir, session_timeout_ms=6000, transport=self.bus)
        self.shard_ids = shards
        self.services: dict[str, Any] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.process: dict[str, str] = {}  # service name -> its current process
        self.starts: dict[str, int] = {}
        self.stores = stores if stores is not None else {}
        self.disk = disk  # the stores in memory (tests/sim/disk.py); None: RocksDB under data_dir
        self._requester: Requester | None = None

    # ------------------------------------------------------------ services

    @staticmethod
    def _instance(name: str) -> tuple[str, str]:
        """("shard-s0", "1") for the standby "shard-s0-1"; ("config", "0") for "config"."""
        base, _, instance = name.rpartition("-")
        return (base, instance) if instance.isdigit() and base else (name, "0")

    def _make(self, name: str) -> Any:
        base, instance = self._instance(name)
        if base == "config":
            config = ConfigServer(self.settings, instance=instance)
            config.ddl.scan_s = DDL_SCAN_S
            return config
        if base.startswith("shard-"):
            shard = ShardServer(self.settings, base.removeprefix("shard-"), instance=instance)
            shard.statistics.layout_poll_s = STATISTICS_LAYOUT_POLL_S
            return shard
        if name == "router":
            return RouterServer(self.settings, "r0", port=None)
        if name == "balancer":
            return Balancer(self.settings)
        if name == "range-deleter":
            return RangeDeleter(self.settings, poll_s=RANGE_DELETER_POLL_S)
        raise ValueError(name)

    def start(self, name: str) -> Any:
        """Run a new process of service `name`."""
        n = self.starts[name] = self.starts.get(name, 0) + 1
        pid = self.process[name] = f"{name}#{n}"
        ctx = contextvars.copy_context()
        ctx.run(PROCESS.set, pid)
        service = self.services[name] = ctx.run(self._make, name)
        self.tasks[name] = asyncio.get_running_loop().create_task(service.run(), name=pid, context=ctx)
        return service

    def alive(self, name: str) -> bool:
        return name in self.tasks and not self.tasks[name].done()

    async def crash(self, name: str, *, lose_store: bool = False) -> None:
        """kill -9: nothing more of the process reaches the bus; its stores close (or are lost)."""
        pid = self.process[name]
        self.bus.crash(pid)
        await self._end(name, pid)
        if lose_store:
            for path in self._data_dirs(name):
                if self.disk is not None:
                    self.disk.lose(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)

    async def stop(self, name: str) -> None:
        """A graceful stop (SIGTERM): the service's own shutdown runs."""
        await self._end(name, self.process[name])

    async def _end(self, name: str, pid: str) -> None:
        loop = asyncio.get_running_loop()
        if hasattr(loop, "thaw"):
            loop.thaw(pid, every=True)  # a frozen process is killed (or stopped) as it stands
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.services.pop(name, None)
        for store in self.stores.pop(pid, []):
            try:
                store.close()
            except Exception:
                pass  # closed by the service's own shutdown

    def store_paths(self, pattern: str) -> list[Path]:
        """The stores under the data directory whose path (relative to it) matches `pattern`."""
        if self.disk is not None:
            return self.disk.paths(pattern, self.data_dir)
        return sorted(self.data_dir.glob(pattern))

    def _data_dirs(self, name: str) -> list[Path]:
        base, instance = self._instance(name)
        if base == "config":
            return [self.data_dir / f"config-{instance}"]
        if name == "router":
            return [self.data_dir / "router-r0"]
        return [self.data_dir / name]

    async def start_all(self, *, balancer: bool = False, range_deleter: bool = True, standbys: bool = False) -> None:
        """Every service; with `standbys`, a second instance of the config server and of each
        shard, which takes over when the first one's group membership lapses."""
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
        if standbys:
            for name in ["config-1", *(f"shard-{s}-1" for s in self.shard_ids)]:
                self.start(name)
        if balancer:
            self.start("balancer")
        if range_deleter:
            self.start("range-deleter")

    async def stop_all(self) -> None:
        if self._requester is not None:
            try:
                await self._requester.stop()
            finally:
                self._requester = None
        for name in list(self.tasks):
            await self.stop(name)

    def _active(self, base: str) -> Any:
        """The instance of `base` that serves (its processor active), else its first one."""
        instances = [svc for name, svc in self.services.items() if self._instance(name)[0] == base]
        serving = [svc for svc in instances if svc.processor.active.is_set()]
        if serving:
            return serving[0]
        if base in self.services:
            return self.services[base]
        if instances:
            return instances[0]
        raise KeyError(base)

    def shard(self, sid: str) -> Any:
        """Shard `sid`'s serving instance."""
        return self._active(f"shard-{sid}")

    @property
    def config(self) -> Any:
        """The serving config server."""
        return self._active("config")

    def cut_off(self, name: str) -> None:
        """A network partition between service `name` and the bus."""
        self.bus.partition(self.process[name])

    def heal(self, name: str) -> None:
        self.bus.heal(self.process[name])

    @property
    def router(self) -> Any:
        return self.services["router"]

    # ------------------------------------------------------------ asking

    async def ask_config(self, cmd: Record, timeout: float = WAIT_S) -> Reply:
        """A config command's reply (not checked)."""
        t = self.settings.topics
        if self._requester is None:
            await self.bus.create_topics([TopicSpec(t.cli_replies, config=SHORT_LIVED)])
            self._requester = Requester(self.bus, t.cli_replies, client_id="sim")
            await self._requester.start()
        return await self._requester.request(t.config_commands, cmd, timeout=timeout)

    async def command(self, cmd: Record, timeout: float = WAIT_S) -> Reply:
        """A config command that must succeed; waits until every running shard and router has
        seen its effect."""
        reply = await self.ask_config(cmd, timeout)
        assert reply.ok, reply
        await self.seen(reply, timeout)
        return reply

    async def seen(self, reply: Reply, timeout: float = WAIT_S) -> None:
        """Until every running shard and router has seen the effect of a config command (one
        crashed meanwhile sees it by replay when it restarts)."""
        for name, service in list(self.services.items()):
            if (name.startswith("shard-") or name == "router") and self.alive(name):
                await service.follower.wait_for(reply.configTime, timeout)

    def client(self, **kw: Any) -> AsyncCluster:
        return AsyncCluster(self.bus, self.settings.cluster, **kw)
