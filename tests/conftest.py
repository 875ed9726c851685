"""Shared fixtures: a real broker (KAFKA_BOOTSTRAP), a fresh cluster name per
test (topic prefix, so tests never see each other), services in-process or as
child processes for kill -9, and bounded waits with clear failure messages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.browser"]  # the `browser` and `screenshot` fixtures (headless chromium)

# Every router a test starts (in process, as a child process or through `make up`) listens for
# MongoDB clients on a free port, never on 27017: tests run side by side and next to a dev cluster.
os.environ["SHARDLOG_ROUTER_PORT"] = "0"
os.environ["SHARDLOG_DASHBOARD_PORT"] = "0"  # and every dashboard (`make up` runs one) on a free HTTP port
os.environ["ZIPKIN_PORT"] = "0"  # and the Zipkin `make up` starts, never on 9411

STOP_BOUND_S = 60  # an in-process cluster's services have this long to stop once cancelled


def pytest_collection_modifyitems(config, items):
    """The layout is the rule: tests/unit never needs a broker, tests/integration always does
    (`make unit` runs the first alone, in under a minute)."""
    misplaced = []
    for item in items:
        part = Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0]
        kafka = item.get_closest_marker("kafka") is not None
        if (part == "unit" and kafka) or (part == "integration" and not kafka):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            "tests/unit is for tests without a broker and tests/integration for tests marked "
            "`kafka`; misplaced: " + ", ".join(misplaced)
        )


@pytest.fixture(scope="session")
def bootstrap() -> str:
    b = os.environ.get("KAFKA_BOOTSTRAP")
    if not b:
        pytest.fail("KAFKA_BOOTSTRAP is not set: run the suite with `make test` (it starts a broker)")
    return b


@pytest.fixture
def cluster(bootstrap, request) -> Iterator[str]:
    """A fresh cluster name with its core topics created; its topics are deleted afterwards.
    A suite leaves hundreds of clusters behind otherwise, and a broker with thousands of
    topics makes every later client's bootstrap (all topics' metadata) and the broker slower."""
    from libs import kafka
    from libs.topics import Topics

    name = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(kafka.ensure_topics(bootstrap, Topics(name).core()))
    yield name
    try:
        asyncio.run(asyncio.wait_for(kafka.delete_cluster_topics(bootstrap, name), 20))
    except Exception as e:  # clean-up only: a broker a test stopped must not fail the test here
        print(f"could not delete the topics of {name}: {e!r}")


@pytest.fixture
def settings(bootstrap, cluster, tmp_path):
    from libs.service import ServiceSettings

    return ServiceSettings(bootstrap, cluster, tmp_path / "data", session_timeout_ms=6000)


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
):
    """Poll `predicate` until truthy; fail with `what` (and `detail()`, e.g. a log tail) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}" + (f"\n{detail()}" if detail else ""))
        time.sleep(interval)


async def async_wait_until(
    predicate, timeout: float, what: str, interval: float = 0.05, detail: Callable[[], str] | None = None
):
    """As wait_until, without blocking the loop; `detail()` (e.g. a service's log tail) goes into the failure."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}" + (f"\n{detail()}" if detail else ""))
        await asyncio.sleep(interval)


class ServiceProcess:
    """A service in its own process (for kill -9), with its readiness file."""

    def __init__(
        self, settings, module: str, *args: str, ready_name: str, env: dict | None = None, log: Path | None = None
    ):
        self.settings, self.ready_name = settings, ready_name
        self.ready_file = settings.data_dir / f"{ready_name}.ready"
        self.ready_file.unlink(missing_ok=True)
        self.log = log or settings.data_dir.parent / f"{ready_name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        full_env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": settings.bootstrap,
            "SHARDLOG_CLUSTER": settings.cluster,
            "SHARDLOG_DATA_DIR": str(settings.data_dir),
            "SHARDLOG_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args], env=full_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )

    def ready_info(self) -> dict | None:
        try:
            info = json.loads(self.ready_file.read_text())
        except (OSError, ValueError):
            return None
        return info if info.get("pid") == self.proc.pid else None

    def wait_ready(self, timeout: float = 60, role: str | None = None) -> dict:
        def check():
            if self.proc.poll() is not None:
                pytest.fail(f"{self.ready_name} exited with {self.proc.returncode}:\n{self.tail()}")
            info = self.ready_info()
            return info if info and (role is None or info.get("role") == role) else None

        return wait_until(check, timeout, f"{self.ready_name} to be ready{' as ' + role if role else ''}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class ProcessCluster:
    """Services in their own processes (the kill -9 tests): `services` maps a name to
    (module, args, ready name, role to wait for); `start` arms a fault point to kill at."""

    services: dict[str, tuple[str, tuple[str, ...], str, str | None]] = {}

    def __init__(self, settings):
        self.settings = settings
        self.procs: dict[str, ServiceProcess] = {}

    def start(
        self, name: str, fault: str | None = None, *, env: dict[str, str] | None = None, wait: bool = True
    ) -> ServiceProcess:
        """(Re)start a service: the running instance, if any, stops first; `wait`: until it is
        ready (a process armed to die early may never be)."""
        if name in self.procs:
            self.procs[name].stop()
        module, args, ready, role = self.services[name]
        env = {"SHARDLOG_FAULTS": f"{fault}=kill" if fault else "", **(env or {})}
        p = self.procs[name] = ServiceProcess(self.settings, module, *args, ready_name=ready, env=env)
        if wait:
            p.wait_ready(timeout=90, role=role)
        return p

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.stop()

    def ask(self, topic: str, req, timeout: float = 30):
        from libs.requests import Requester

        async def go():
            async with Requester(self.settings.bootstrap, self.settings.topics.cli_replies) as r:
                return await r.request(topic, req, timeout=timeout)

        return asyncio.run(go())

    def config(self, cmd):
        reply = self.ask(self.settings.topics.config_commands, cmd, timeout=60)
        assert reply.ok, reply
        return reply


@pytest.fixture
def spawn():
    """Start services as child processes; every one is stopped at teardown."""
    started: list[ServiceProcess] = []

    def start(settings, module: str, *args: str, ready_name: str, env: dict | None = None) -> ServiceProcess:
        p = ServiceProcess(settings, module, *args, ready_name=ready_name, env=env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def config_server(settings):
    """A config server running in this process, in a background thread's event loop."""
    import threading

    from services.config.server import ConfigServer

    server = ConfigServer(settings)
    loop = asyncio.new_event_loop()
    task_box: dict = {}

    def run():
        asyncio.set_event_loop(loop)
        task_box["task"] = loop.create_task(server.run())
        try:
            loop.run_until_complete(task_box["task"])
        except (asyncio.CancelledError, Exception):
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: server.processor.active.is_set(), 60, "the in-process config server to become active")
    # Its first decision is the signing keys: made before a test sends anything, so offsets are known.
    wait_until(lambda: len(server.catalog.keys) >= 2, 30, "the config server to make its signing keys")
    yield server
    loop.call_soon_threadsafe(task_box["task"].cancel)
    t.join(30)


def read_records(bootstrap: str, topic: str) -> list:
    """Every committed record of a single-partition topic, in order (raw ConsumerRecords)."""
    from aiokafka import TopicPartition

    from libs import kafka

    async def go():
        c = kafka.consumer(bootstrap)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            c.seek(tp, 0)
            out = []

            async def take(records):
                out.extend(records)

            await kafka.catch_up(c, tp, take)
            return out
        finally:
            await c.stop()

    return asyncio.run(go())


def group_offset_and_log_end(settings, member: str, topic: str) -> tuple[int, int]:
    """The consumer group `member`'s committed offset on a command topic (-1: none) and that
    topic's end (a command processor's lag)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from libs import kafka

    async def go() -> tuple[int, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(settings.topics.group(member))
        finally:
            await admin.close()
        at = offsets.get(TopicPartition(topic, 0))
        async with kafka.partition_reader(settings.bootstrap, topic) as (c, tp):
            end = await kafka.log_end(c, tp)
        return (at.offset if at is not None else -1), end

    return asyncio.run(go())


def wait_group_stable(settings, member: str, members: int, timeout: float = 60) -> None:
    """Until the consumer group `member` is Stable with `members` members: no rebalance (whose
    revocation commits the group's offset) is still to come."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def state() -> tuple[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap)
        await admin.start()
        try:
            g = (await admin.describe_consumer_groups([settings.topics.group(member)]))[0].to_object()["groups"][0]
            return g["state"], len(g["members"])
        finally:
            await admin.close()

    wait_until(
        lambda: asyncio.run(state()) == ("Stable", members), timeout, f"group {member}: Stable, {members} members"
    )


def active_and_standby(
    a: ServiceProcess, b: ServiceProcess, timeout: float = 30
) -> tuple[ServiceProcess, ServiceProcess]:
    """Two instances of a service, once one says it is active and the other standing by (the
    group, not their order of start, decides which): (active, standby)."""

    def roles() -> tuple[ServiceProcess, ServiceProcess] | None:
        pair = ((a.ready_info() or {}).get("role"), (b.ready_info() or {}).get("role"))
        return {("active", "standby"): (a, b), ("standby", "active"): (b, a)}.get(pair)  # type: ignore[arg-type]

    return wait_until(roles, timeout, "one instance active, the other standing by")


def read_events(bootstrap: str, topic: str, *, keys: bool = False) -> list:
    """Every config event, as (offset, record); the cluster-time signing keys the config server
    makes on its own (ClusterTimeKeyCreated) only with `keys`."""
    from schemas import config as schema

    events = [(r.offset, schema.events.decode(r.value)) for r in read_records(bootstrap, topic)]
    return [(o, e) for o, e in events if keys or e.type != "ClusterTimeKeyCreated"]


def cli(settings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the real `shardlog` command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "--bootstrap", settings.bootstrap, "--cluster", settings.cluster, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


class OriginTask(asyncio.Task):
    """A task that remembers the source file of the code that created it (outside asyncio):
    tests that look for leaked tasks can then set aside the Kafka client library's own, which
    come and go with its broker connections and fetches, not with anything the test does."""

    origin = "?"


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__)


def _origin_task_factory(loop, coro, **kw):
    task = OriginTask(coro, loop=loop, **kw)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
        frame = frame.f_back
    if frame is not None:
        task.origin = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return task


def kafka_client_task(task: asyncio.Task) -> bool:
    """Created inside aiokafka (its connections, fetches, metadata, group heartbeats)."""
    return f"{os.sep}aiokafka{os.sep}" in getattr(task, "origin", "?")


class InProcessCluster:
    """Config server, shards and a router as tasks on one event loop in a background thread
    ("a host process can run several services"); they still talk only through Kafka."""

    def __init__(self, settings, shards=("s0", "s1", "s2")):
        import threading

        from services.config.server import ConfigServer
        from services.router.server import RouterServer
        from services.shard.server import ShardServer

        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.loop.set_task_factory(_origin_task_factory)
        self.config = ConfigServer(settings)
        self.shards = {sid: ShardServer(settings, sid) for sid in shards}
        self.router = RouterServer(settings)
        self.tasks = []
        self.clients: list = []  # pymongo clients from mongo_client()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self):
        from libs.requests import Requester
        from schemas import config as c

        self.tasks.append(asyncio.create_task(self.config.run()))
        await async_wait_until(lambda: self.config.processor.active.is_set(), 60, "config server active")
        await async_wait_until(lambda: len(self.config.catalog.keys) >= 2, 30, "the signing keys")
        async with Requester(self.settings.bootstrap, self.settings.topics.cli_replies) as r:
            for sid in self.shards:
                reply = await r.request(self.settings.topics.config_commands, c.AddShard(shard=sid), timeout=60)
                assert reply.ok, reply
        for s in self.shards.values():
            self.tasks.append(asyncio.create_task(s.run()))
        self.tasks.append(asyncio.create_task(self.router.run()))
        await async_wait_until(
            lambda: all(s.processor.active.is_set() for s in self.shards.values()), 60, "every shard active"
        )
        await async_wait_until(lambda: self.router.follower._tail is not None, 60, "the router to follow the catalog")
        await async_wait_until(
            lambda: self.router.wire is None or self.router.wire._server is not None, 60, "the router's wire edge"
        )

        # the last things each service starts (tasks of their own): a test that begins now sees a
        # cluster at rest, and can count its tasks
        def background_started() -> bool:
            shards = self.shards.values()
            readers = [r for s in shards for r in (s.donor.requester, s.index_builder.requester, s.reaper.requester)]
            return (
                self.router.sessions.store._tail is not None
                and all(s.reaper.store._tail is not None for s in shards)
                and all(r._reader is not None for r in readers)
            )

        await async_wait_until(background_started, 60, "each shard's donor, index builder and session reaper")

    def command(self, cmd):
        """Send a config command and wait until the router and shards have seen its effect."""
        from libs.requests import Requester

        async def go():
            async with Requester(self.settings.bootstrap, self.settings.topics.cli_replies) as r:
                reply = await r.request(self.settings.topics.config_commands, cmd, timeout=60)
            assert reply.ok, reply
            await self.router.follower.wait_for(reply.configTime, 30)
            for s in self.shards.values():
                await s.follower.wait_for(reply.configTime, 30)
            return reply

        return self.call(go())

    def command_without_router(self, cmd):
        """A config command whose effect the shards see before it returns (the router may lag)."""
        from libs.requests import Requester

        async def go():
            async with Requester(self.settings.bootstrap, self.settings.topics.cli_replies) as r:
                reply = await r.request(self.settings.topics.config_commands, cmd, timeout=60)
            assert reply.ok, reply
            for s in self.shards.values():
                await s.follower.wait_for(reply.configTime, 30)
            return reply

        return self.call(go())

    @property
    def uri(self) -> str:
        """The router's MongoDB connection string (pymongo, mongosh)."""
        uri = self.router.mongodb_uri
        assert uri is not None, "the router has no wire edge"
        return uri

    def mongo_client(self, **kw):
        """A pymongo MongoClient on the router, closed by stop()."""
        import pymongo

        client = pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=10_000, **kw)
        self.clients.append(client)
        return client

    def served(self, kind: str, ns: str) -> dict:
        return {sid: s.decider.served[(kind, ns)] for sid, s in self.shards.items()}

    def stop(self):
        for client in self.clients:
            client.close()

        async def stop_all():
            # Cancel again until every task is done: a cancellation that lands as an awaited
            # operation completes can be swallowed (asyncio.wait_for on 3.11, a library's own
            # retry loop), and one cancel would leave that service running. At the bound, say
            # which tasks still run and where.
            deadline = time.monotonic() + STOP_BOUND_S
            pending = set(self.tasks)
            while pending and time.monotonic() < deadline:
                for t in pending:
                    t.cancel()
                _, pending = await asyncio.wait(pending, timeout=1.0)
            if pending:
                where = "\n".join(f"{t.get_name()}: {t.get_stack(limit=8)}" for t in pending)
                raise TimeoutError(f"{len(pending)} service task(s) still running {STOP_BOUND_S}s after stop:\n{where}")

        try:
            self.call(stop_all(), timeout=STOP_BOUND_S + 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture
def data_cluster(settings):
    c = InProcessCluster(settings)
    yield c
    c.stop()
