"""kill -9 at every step of two-phase commit (issue 33 §3), in the coordinator shard, the other
participant and the router: every transaction ends committed on every participant or aborted
on every participant, and the client's retried commitTransaction reports that outcome.
The router's cases freeze the coordinator at each of its steps, kill -9 the router meanwhile,
and let the client's retried commit reach a restarted router that never saw the transaction:
it learns the outcome from the recoveryToken's shard.

One cluster of real processes (config server, shards s0 and s1, a router) serves the matrix.
Accounts k=1 (on s0) and k=150 (on s1) hold 100 each; each case moves 10 from one to the
other in a pymongo transaction that writes s0 first (so s0 coordinates), with one service
restarted armed to die at a step; the commit is retried after the victim is back.  Then:
the total is still 200, the two balances moved together or not at all, and if any commit
answered ok, they moved; and the accounts are writable again (no prepared transaction
left holding them)."""

from __future__ import annotations

import itertools
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from schemas import config as c
from tests.conftest import wait_until
from tests.integration.test_migration_faults import two_shard_cluster

pytestmark = pytest.mark.kafka

CASES = [
    ("donor", "txn.coordinator.preparing"),
    ("donor", "txn.coordinator.voted"),
    ("donor", "txn.coordinator.decided"),
    ("donor", "txn.coordinator.ended"),
    ("donor", "txn.participant.preparing"),
    ("recipient", "txn.participant.preparing"),
    ("recipient", "txn.participant.committing"),
]
DECIDED = {"txn.coordinator.decided", "txn.coordinator.ended", "txn.participant.committing"}
_numbers = itertools.count()


@pytest.fixture(scope="module")
def bank(bootstrap, tmp_path_factory):
    cl = two_shard_cluster(
        bootstrap,
        tmp_path_factory.mktemp("txnfaults") / "data",
        f"tx{next(_numbers)}{int(time.time()) % 100000}",
        c.CreateDatabase(db="bank", primary="s0"),
        c.ShardCollection(ns="bank.acct", key={"k": 1}),
        c.SplitChunk(ns="bank.acct", at=[{"k": 100}]),
    )
    cl.config(c.MoveRange(ns="bank.acct", min={"k": 100}, to="s1"))
    mc = client(cl)
    wait_until(
        lambda: mc.config.chunks.find_one({"min": {"k": 100}}, {"shard": 1})["shard"] == "s1", 120, "k >= 100 on s1"
    )
    mc.close()
    yield cl
    cl.stop_all()


def client(cl) -> MongoClient:
    uri = cl.procs["router"].ready_info()["uri"]
    return MongoClient(uri, serverSelectionTimeoutMS=60_000, socketTimeoutMS=120_000)


def balances(coll) -> tuple[int, int]:
    docs = {d["k"]: d["v"] for d in coll.find({"k": {"$in": [1, 150]}})}
    return docs[1], docs[150]


def commit_in_background(session, outcomes: list[str]) -> threading.Event:
    """commitTransaction in a thread (its victim dies meanwhile): "ok" or the error in `outcomes`;
    the event is set once it answered."""
    done = threading.Event()

    def commit() -> None:
        try:
            session.commit_transaction()
            outcomes.append("ok")
        except PyMongoError as e:
            outcomes.append(f"error: {e}")
        finally:
            done.set()

    threading.Thread(target=commit, daemon=True).start()
    return done


def retried_commit(session) -> str:
    """The drivers' retry of an unknown commit result (same lsid and txnNumber; pymongo adds the
    recoveryToken): "ok", or "aborted" if it was aborted everywhere (NoSuchTransaction)."""
    try:
        session.commit_transaction()
        return "ok"
    except OperationFailure as e:
        assert e.code == 251, e
        return "aborted"


@pytest.mark.parametrize("service, fault", CASES)
def test_kill9_during_two_phase_commit_ends_all_or_nothing(bank, service, fault):
    mc = client(bank)
    coll = mc.bank.acct
    coll.update_one({"k": 1}, {"$set": {"v": 100}}, upsert=True)
    coll.update_one({"k": 150}, {"$set": {"v": 100}}, upsert=True)
    victim = bank.start(service, fault)
    outcomes: list[str] = []
    with mc.start_session() as session:
        session.start_transaction()
        coll.update_one({"k": 1}, {"$inc": {"v": -10}}, session=session)  # s0 first: it coordinates
        coll.update_one({"k": 150}, {"$inc": {"v": 10}}, session=session)
        done = commit_in_background(session, outcomes)
        assert wait_until(
            lambda: victim.proc.poll() is not None, 120, f"{service} to die at {fault}", detail=lambda: str(outcomes)
        )
        assert victim.proc.returncode == -9, victim.tail()
        bank.start(service)  # back, unarmed
        assert done.wait(180), "the commit never answered"
        if outcomes[-1] != "ok":
            outcomes.append(retried_commit(session))
    moved = balances(coll)
    assert sum(moved) == 200 and moved in ((90, 110), (100, 100)), (moved, outcomes)
    if "ok" in outcomes:
        assert moved == (90, 110), (moved, outcomes)
    if fault in DECIDED:
        assert moved == (90, 110), f"the decision was durable before {fault}: {outcomes}"
    # Nothing left prepared: both accounts take plain writes again.
    coll.update_one({"k": 1}, {"$inc": {"v": 0}})
    coll.update_one({"k": 150}, {"$inc": {"v": 0}})
    mc.close()


COORDINATOR_STEPS = [
    "txn.coordinator.preparing",
    "txn.coordinator.voted",
    "txn.coordinator.decided",
    "txn.coordinator.ended",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frozen(pid: int) -> bool:
    """SIGSTOPped (the fault point's `stop`): state T in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.parametrize("step", COORDINATOR_STEPS)
def test_the_router_killed_while_its_coordinator_is_at_a_step(bank, step):
    port = _free_port()  # the restarted router listens where the client's connections went
    router_env = {"SHARDLOG_ROUTER_PORT": str(port)}
    bank.start("router", env=router_env)
    mc = client(bank)
    coll = mc.bank.acct
    coll.update_one({"k": 1}, {"$set": {"v": 100}}, upsert=True)
    coll.update_one({"k": 150}, {"$set": {"v": 100}}, upsert=True)
    coordinator = bank.start("donor", env={"SHARDLOG_FAULTS": f"{step}=stop"})
    outcomes: list[str] = []
    try:
        with mc.start_session() as session:
            session.start_transaction()
            coll.update_one({"k": 1}, {"$inc": {"v": -10}}, session=session)  # s0 first: it coordinates
            coll.update_one({"k": 150}, {"$inc": {"v": 10}}, session=session)
            done = commit_in_background(session, outcomes)
            assert wait_until(lambda: _frozen(coordinator.proc.pid), 120, f"the coordinator to freeze at {step}")
            bank.procs["router"].kill9()
            coordinator.signal(signal.SIGCONT)
            bank.start("router", env=router_env)  # it never saw the transaction
            assert done.wait(180), "the commit never answered"
            if outcomes[-1] != "ok":
                outcomes.append(retried_commit(session))
        # Every vote was yes and the coordinator lived on: it committed, and the commit says so.
        assert balances(coll) == (90, 110) and outcomes[-1] == "ok", (balances(coll), outcomes)
        coll.update_one({"k": 1}, {"$inc": {"v": 0}})  # nothing left prepared
        coll.update_one({"k": 150}, {"$inc": {"v": 0}})
    finally:
        mc.close()
        coordinator.signal(signal.SIGCONT)  # (a failed case leaves no frozen, armed shard to the next)
        bank.start("donor")  # unarmed, for the next case
