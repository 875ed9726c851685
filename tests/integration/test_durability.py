"""Durability of the local deployment, each test on brokers of its own (so it can stop,
kill -9 and restart them): `make down` then `make up` keeps everything; a whole-machine
crash (kill -9 of every process, the broker included) loses no acknowledged write; the
broker restarts after a kill -9 while the services run; one of three replicated brokers
(and then the controller leader) dies under a YCSB-A mix and a migration."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from infra.deployment import LocalDeployment, partition_leaders, topic_config
from tests.conftest import wait_until

pytestmark = pytest.mark.kafka

SERVICES = ("config", "shard-s0", "shard-s1", "shard-s2", "router", "balancer", "range-deleter", "dashboard")


class Deployment(LocalDeployment):
    """`python -m infra.cluster` (what `make up/down/reset` run) on a private data directory,
    with its own local Kafka on free ports; every step asserts it worked."""

    def __init__(self, tmp_path: Path, brokers: int | None = None):
        super().__init__(
            tmp_path / "deploy",
            "dur",
            brokers,
            env={"SHARDLOG_SESSION_TIMEOUT_MS": "6000", "SHARDLOG_STATS_INTERVAL_S": "1"},
        )

    def run(self, action: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.cluster_action(action, *args, timeout=timeout)

    def up(self) -> str:
        r = self.run("up")
        assert r.returncode == 0, f"up failed:\n{r.stdout}\n{r.stderr}\n{self.logs_tail()}"
        return r.stdout

    def down(self) -> str:
        r = self.run("down")
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def reset(self) -> None:
        self.run("reset", timeout=120)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        r = self.shardlog(*args, timeout=timeout)
        assert r.returncode == 0, f"shardlog {' '.join(args)}: {r.stdout}{r.stderr}"
        return r

    def cli_json(self, *args: str) -> dict:
        return json.loads(self.cli(*args, "--json").stdout)

    def log(self, service: str) -> str:
        return (self.data / "logs" / f"{service}.log").read_text(errors="replace")

    def logs_tail(self, n: int = 15) -> str:
        out = []
        for f in sorted((self.data / "logs").glob("*.log")) if (self.data / "logs").exists() else []:
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def kill9(pids) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)  # every process was started in its own session
        except ProcessLookupError:
            pass
    wait_until(lambda: not any(_alive(p) for p in pids), 15, "the killed processes to be gone")


@pytest.fixture
def deployment(tmp_path):
    made: list[Deployment] = []

    def make(brokers: int | None = None) -> Deployment:
        d = Deployment(tmp_path, brokers)
        made.append(d)
        return d

    yield make
    for d in made:
        d.reset()


# ---------------------------------------------------------------- client workloads


def client(d: Deployment, **kw):
    from libs.client import AsyncCluster

    return AsyncCluster(d.bootstrap, d.cluster, **kw)


def load(d: Deployment, ns: str, docs: list[dict]) -> None:
    async def go():
        async with client(d, timeout=120) as cl:
            db, coll = ns.split(".", 1)
            for i in range(0, len(docs), 500):
                await cl[db][coll].insert_many(docs[i : i + 500], ordered=False)

    asyncio.run(go())


def read_all(d: Deployment, ns: str) -> list[dict]:
    async def go():
        async with client(d, timeout=120) as cl:
            db, coll = ns.split(".", 1)
            return await cl[db][coll].find({}, sort={"_id": 1}).to_list()

    return asyncio.run(go())


class CounterWorkload:
    """A YCSB-A mix on counters in a background thread: half reads, half `$inc`s, plus an
    insert of a new document every tenth operation.  Every write is a retryable write (lsid +
    txnNumber), so the client's retries (across a crash, a broker restart, a leader change) apply once:
    once the workload has finished, every document must hold exactly the increments it issued.
    Latencies are kept to measure the pause clients saw."""

    def __init__(
        self,
        d: Deployment,
        ns: str,
        docs: int,
        ops: int,
        concurrency: int = 8,
        base: dict[int, int] | None = None,
        first_new_id: int | None = None,
    ):
        self.d, self.ns, self.docs, self.ops, self.concurrency = d, ns, docs, ops, concurrency
        self.base = base if base is not None else {i: 0 for i in range(docs)}  # _id -> n before it starts
        self.first_new_id = first_new_id if first_new_id is not None else docs
        self.done_ops = 0
        self.incs = {i: 0 for i in range(docs)}
        self.inserted: list[int] = []
        self.latencies: list[tuple[float, float]] = []  # (start, seconds)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CounterWorkload:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._go())
        except BaseException as e:  # surfaced by wait()
            self.error = e

    async def _go(self) -> None:
        rng = random.Random(7)
        plan = [("read" if rng.random() < 0.5 else "inc", rng.randrange(self.docs)) for _ in range(self.ops)]
        for n, i in enumerate(range(0, len(plan), 10)):
            plan[i] = ("insert", self.first_new_id + n)
        queue = list(reversed(plan))
        db, coll_name = self.ns.split(".", 1)
        async with client(self.d, timeout=240, attempt_timeout=8) as cl:
            coll = cl[db][coll_name]

            async def worker():
                while queue:
                    kind, i = queue.pop()
                    t0 = time.monotonic()
                    if kind == "read":
                        doc = await coll.find_one({"_id": i})
                        assert doc is not None, f"document {i} vanished"
                    elif kind == "inc":
                        r = await coll.update_one({"_id": i}, {"$inc": {"n": 1}})
                        assert r["matched"] == 1, r
                        self.incs[i] += 1
                    else:
                        await coll.insert_one({"_id": i, "n": 0, "k": i})
                        self.inserted.append(i)
                    self.latencies.append((t0, time.monotonic() - t0))
                    self.done_ops += 1

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def wait(self, timeout: float = 400) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"workload not finished after {timeout}s ({self.done_ops}/{self.ops} ops)"
        if self.error is not None:
            raise AssertionError(f"workload failed: {self.error!r}") from self.error

    def max_latency(self, since: float = 0.0) -> float:
        return max((s for t, s in self.latencies if t + s >= since), default=0.0)

    def check_exactly_once(self, docs: list[dict]) -> None:
        by_id = {doc["_id"]: doc for doc in docs}
        assert len(by_id) == len(docs), "a document is stored twice"
        expected = set(self.base) | set(self.inserted)
        assert set(by_id) == expected, (
            f"missing {sorted(expected - set(by_id))[:10]}, unexpected {sorted(set(by_id) - expected)[:10]}"
        )
        wrong = {
            i: (by_id[i]["n"], self.base[i] + n) for i, n in self.incs.items() if by_id[i]["n"] != self.base[i] + n
        }
        assert not wrong, f"$inc applied a different number of times than acknowledged (stored, acked): {wrong}"


def migration_state(d: Deployment, mid: str) -> str:
    """The config server's record of a migration: active, committed or aborted."""
    from libs.requests import Requester
    from libs.topics import Topics
    from schemas import config as c

    async def go():
        t = Topics(d.cluster)
        async with Requester(d.bootstrap, t.cli_replies, client_id="durability-test") as r:
            rep = await r.request(t.config_commands, c.GetMigration(id=mid), timeout=60)
        assert rep.ok, rep
        return rep.result["state"]

    return asyncio.run(go())


def consistent_snapshot(d: Deployment) -> dict:
    """What a restart must bring back unchanged: catalog, settings, range-deletion tasks."""
    status = d.cli_json("status", "--verbose")
    settings = d.cli_json("settings", "get")
    deletions = d.cli_json("range-deletions")
    # A shard that did not answer is left out of "tasks": say so, not "the task is gone".
    assert not deletions["unanswered"], f"shards did not answer ListMigrations: {deletions}\n{d.logs_tail(40)}"
    tasks = deletions["tasks"]
    for t in tasks:
        t.pop("waiting", None)  # "3590 s left": time passes
    for doc in (status, settings):
        doc.pop("configTime", None)
    return {"status": status, "settings": settings, "tasks": tasks}


# ------------------------------------------------------------------------- tests


def test_down_then_up_brings_back_every_write_the_catalog_and_pending_work(deployment):
    d = deployment()
    first = d.up()
    assert "formatting a new 1-broker cluster" in first
    d.cli("shard-collection", "app.kv", "--key", '{"k": 1}')
    d.cli("split", "app.kv", "--at", '{"k": 500}')
    d.cli("settings", "set", "orphanCleanupDelaySecs", "3600")  # the donor's range deletion stays pending
    d.cli("settings", "set", "balancerEnabled", "false")
    docs = [{"_id": i, "k": i, "v": "x" * 200} for i in range(2000)]
    load(d, "app.kv", docs)
    moved = d.cli_json("move-range", "app.kv", "--min", '{"k": 500}', "--max", '{"k": 1000}', "--to", "s1")
    assert moved["outcome"] == "committed", moved
    before = consistent_snapshot(d)
    assert [t["state"] for t in before["tasks"]] == ["ready"] and before["tasks"][0]["left"] == 500
    stored = read_all(d, "app.kv")
    assert len(stored) == 2000
    broker_before = d.broker_pids()

    d.down()
    assert not any(_alive(p) for p in [*broker_before.values(), *d.service_pids().values()]), "down left processes"
    assert (d.data / "kafka" / "node-1" / "data" / "meta.properties").exists(), "down must keep the broker's data"

    second = d.up()
    assert "formatting" not in second
    assert sorted(d.broker_pids()) == sorted(broker_before) and d.bootstrap, second
    # Every service resumed from its checkpoint: nothing replayed from zero.
    for service in ("config", "shard-s0", "shard-s1"):
        log = d.log(service)
        restart = log[log.rindex("no checkpoint") if "no checkpoint" in log else 0 :]
        assert "from its checkpoint at offset" in restart, (
            f"{service} did not resume from a checkpoint:\n{restart[-2000:]}"
        )
    after = consistent_snapshot(d)
    assert after == before, f"after down/up: {after}\nbefore: {before}\n{d.logs_tail(40)}"
    assert migration_state(d, moved["id"]) == "committed", "the migration's decision survives the restart"
    assert read_all(d, "app.kv") == stored
    # And the cluster takes writes again, through the same router and shards.
    load(d, "app.kv", [{"_id": 5000, "k": 5000}])
    assert len(read_all(d, "app.kv")) == 2001


def test_whole_machine_crash_then_up_loses_no_acknowledged_write(deployment):
    d = deployment()
    d.up()
    d.cli("shard-collection", "app.counters", "--key", '{"_id": "hashed"}')
    load(d, "app.counters", [{"_id": i, "n": 0} for i in range(200)])
    catalog = consistent_snapshot(d)
    w = CounterWorkload(d, "app.counters", docs=200, ops=1500).start()
    wait_until(lambda: w.done_ops >= 400 or w.error, 120, "the workload to get going")
    # The whole machine dies: every service and the broker, mid-write.
    kill9([*d.service_pids().values(), *d.broker_pids().values()])
    crashed_at = time.monotonic()
    out = d.up()  # the broker recovers its log; every service resumes; the client retries meanwhile
    assert "ready" in out
    w.wait()
    assert w.done_ops == 1500
    w.check_exactly_once(read_all(d, "app.counters"))
    snapshot = consistent_snapshot(d)
    assert snapshot["status"]["collections"] == catalog["status"]["collections"]
    print(f"\nwhole-machine crash: clients paused at most {w.max_latency(crashed_at):.1f}s (restart included)")


def test_broker_kill9_restarts_within_seconds_while_services_run(deployment):
    d = deployment()
    d.up()
    d.cli("shard-collection", "app.counters", "--key", '{"_id": "hashed"}')
    load(d, "app.counters", [{"_id": i, "n": 0} for i in range(200)])
    services = d.service_pids()
    catalog = consistent_snapshot(d)
    w = CounterWorkload(d, "app.counters", docs=200, ops=1500).start()
    wait_until(lambda: w.done_ops >= 300 or w.error, 120, "the workload to get going")
    kill9(d.broker_pids().values())
    killed_at = time.monotonic()
    out = d.up()  # restarts the dead broker like any dead service; the running services stay
    restart_s = time.monotonic() - killed_at
    assert out.count("already running") == len(SERVICES), out
    assert d.service_pids() == services and all(_alive(p) for p in services.values())
    w.wait()
    w.check_exactly_once(read_all(d, "app.counters"))
    assert consistent_snapshot(d) == catalog
    print(
        f"\nbroker kill -9: restarted and serving in {restart_s:.1f}s; clients paused at most "
        f"{w.max_latency(killed_at):.1f}s"
    )


def _quorum_leader(d: Deployment) -> int:
    """The KRaft controller leader, from a live node's quorum-state file."""
    leader = d.controller_leader()
    assert leader is not None, "no live node names a controller leader"
    return leader


class Migration:
    """A MoveRange driven from the test: started, then observed through the donor's progress
    and the config server's decision (no CLI process, so the test can wait for "cloning")."""

    def __init__(self, d: Deployment, cmd):
        from libs.requests import Requester
        from libs.topics import Topics

        self.d, self.t = d, Topics(d.cluster)
        self.requester = lambda: Requester(d.bootstrap, self.t.cli_replies, client_id="durability-test")
        self.cmd = cmd

    async def _ask(self, topic, req, timeout=30):
        async with self.requester() as r:
            rep = await r.request(topic, req, timeout=timeout)
        assert rep.ok, rep
        return rep.result

    def start(self) -> dict:
        started = asyncio.run(self._ask(self.t.config_commands, self.cmd, timeout=60))
        assert started.get("moved"), started
        self.id, self.donor = started["id"], started["donor"]
        return started

    def progress(self) -> dict:
        from schemas import shard as s

        return (
            asyncio.run(self._ask(self.t.shard_requests(self.donor), s.ListMigrations()))
            .get("progress", {})
            .get(self.id, {})
        )

    def outcome(self, timeout: float = 240) -> str:
        from schemas import config as c

        async def go():
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    state = (await self._ask(self.t.config_commands, c.GetMigration(id=self.id)))["state"]
                except Exception:  # a broker is changing leaders: ask again
                    state = "active"
                if state != "active":
                    return state
                await asyncio.sleep(0.2)
            raise AssertionError(f"migration {self.id} undecided after {timeout}s")

        return asyncio.run(go())


def test_one_of_three_brokers_then_the_controller_leader_killed_under_load(deployment):
    from schemas import config as c

    d = deployment(brokers=3)
    d.up()
    boot = d.bootstrap
    assert len(boot.split(",")) == 3
    ns = "app.counters"
    d.cli("settings", "set", "balancerEnabled", "false")
    d.cli("shard-collection", ns, "--key", '{"_id": 1}')
    d.cli("split", ns, "--at", '{"_id": 300}')
    load(d, ns, [{"_id": i, "n": 0, "pad": "p" * 2000} for i in range(600)])
    changelog = f"{d.cluster}.shard.s0.changelog"
    events = f"{d.cluster}.config.events"
    layout = partition_leaders(boot, [changelog, events])
    assert all(len(p["replicas"]) == 3 for p in layout.values()), layout
    assert topic_config(boot, changelog, "min.insync.replicas") == "2"

    for n, phase in enumerate(("partition leader", "controller leader")):
        # kill -9 a broker while a YCSB-A mix runs and a migration moves a range off s0.
        chunks = d.cli_json("status", "--verbose")["collections"][0]["chunks"]
        moving = next(ch for ch in chunks if ch["shard"] == "s0")
        to = ("s1", "s2")[n]
        base = {doc["_id"]: doc["n"] for doc in read_all(d, ns)}
        w = CounterWorkload(d, ns, docs=600, ops=1200, base=base, first_new_id=10_000 * (n + 1)).start()
        wait_until(lambda w=w: w.done_ops >= 150 or w.error, 120, "the workload to get going")
        m = Migration(d, c.MoveRange(ns=ns, min=moving["min"], max=moving["max"], to=to))
        m.start()
        wait_until(
            lambda m=m: m.progress().get("phase") not in (None, "preparing"), 60, "the migration to start cloning"
        )
        victim = partition_leaders(boot, [changelog])[changelog]["leader"] if n == 0 else _quorum_leader(d)
        kill9([d.broker_pids()[victim]])
        killed_at = time.monotonic()
        w.wait()
        outcome = m.outcome()
        pause = w.max_latency(killed_at)
        # The migration committed or aborted, and the catalog and the documents agree with it.
        chunks = d.cli_json("status", "--verbose")["collections"][0]["chunks"]
        owner = next(ch["shard"] for ch in chunks if ch["min"] == moving["min"])
        assert outcome in ("committed", "aborted") and owner == (to if outcome == "committed" else "s0"), (
            outcome,
            chunks,
        )
        w.check_exactly_once(read_all(d, ns))
        # Restart the broker: it rejoins and catches up (every replica back in sync).
        out = d.up()
        assert f"broker {victim} ready" in out, out
        wait_until(
            lambda: all(len(p["isr"]) == 3 for p in partition_leaders(boot, [changelog, events]).values()),
            60,
            f"broker {victim} to rejoin every ISR",
            detail=lambda: str(partition_leaders(boot, [changelog, events])),
        )
        print(f"\n{phase} (broker {victim}) killed mid-migration: {outcome}; clients paused at most {pause:.2f}s")


def test_a_lost_broker_log_is_refused_by_name_and_reset_is_explicit(deployment):
    d = deployment()
    d.up()
    d.cli("shard-collection", "app.kv", "--key", '{"k": 1}')
    load(d, "app.kv", [{"_id": i, "k": i} for i in range(100)])
    d.down()
    # The broker's data is lost under the services' stores (deleted by hand, a new disk, ...).
    lost = d.local_kafka("reset")
    assert lost.returncode == 0, lost.stderr
    refused = d.run("up")
    assert refused.returncode != 0, "a store ahead of its log must not be rebuilt from the shorter log"
    said = refused.stdout + refused.stderr
    assert "the log it was built from is gone" in said and "`make reset`" in said, said
    assert (d.data / "services" / "config-0" / "catalog").exists(), "the refused store must be left as it was"
    # Again: it keeps refusing, and nothing was rebuilt in between.
    assert d.run("up").returncode != 0
    # Deleting is explicit and says what it removes; then an empty cluster starts.
    reset = d.run("reset")
    assert reset.returncode == 0, reset.stderr
    assert "deleted" in reset.stdout and str(d.data / "services") in reset.stdout, reset.stdout
    assert not (d.data / "services").exists() and not (d.data / "kafka").exists()
    d.up()
    assert d.cli_json("status")["collections"] == []
