"""Retryable writes against real processes (docs/decisions/0015, issue 12 §4-6): a write
sent again with the same lsid/txnNumber applies once, on one shard and after its range
moved to another (session migration), also when the donor or the recipient is killed
mid-migration; an older txnNumber is TransactionTooOld; findAndModify returns the same
document on retry; bad session fields are refused and change nothing; ForgetSessions
removes a session's records.

One cluster (config server, shards s0 and s1, a router, the range deleter) serves the module; each test uses
its own collection, range-sharded on `k` with its chunk on s0.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
import uuid

import pytest

from libs.client import AsyncCluster, ReturnDocument, ShardlogError
from libs.requests import RequestTimeout
from schemas import config as c
from schemas import shard as s
from tests.conftest import async_wait_until, read_records, wait_until
from tests.integration.test_migration_faults import Cluster, two_shard_cluster

pytestmark = pytest.mark.kafka

_numbers = itertools.count()


@pytest.fixture(scope="module")
def procs(bootstrap, tmp_path_factory):
    cl = two_shard_cluster(
        bootstrap,
        tmp_path_factory.mktemp("rw") / "data",
        f"rw{next(_numbers)}{int(time.time()) % 100000}",
        c.CreateDatabase(db="rw", primary="s0"),
        c.SetSetting(key="orphanCleanupDelaySecs", value=0),  # an aborted clone's orphans go at once
    )
    yield cl
    cl.stop_all()


def new_collection(cl: Cluster) -> str:
    ns = f"rw.c{next(_numbers)}"
    cl.config(c.ShardCollection(ns=ns, key={"k": 1}))
    return ns


def lsid() -> dict:
    return {"id": str(uuid.uuid4())}


async def send(settings, req) -> dict:
    """One operation through the routers, as a driver sends it (our client's retry loop)."""
    async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as cl:
        return await cl.call(req)


def run(settings, req) -> dict:
    return asyncio.run(send(settings, req))


def refused(settings, req) -> ShardlogError:
    with pytest.raises(ShardlogError) as e:
        run(settings, req)
    return e.value


def counter(settings, ns: str, k: int) -> int:
    docs = run(settings, s.Find(ns=ns, filter={"k": k}))["docs"]
    assert len(docs) == 1, docs
    return docs[0]["n"]


def move(cl: Cluster, ns: str, to: str) -> str:
    """Move the whole collection's chunk to `to`; the migration's outcome."""
    reply = cl.config(c.MoveRange(ns=ns, min={"k": {"$minKey": 1}}, max={"k": {"$maxKey": 1}}, to=to))
    return wait_decided(cl, reply.result["id"])


def wait_decided(cl: Cluster, mid: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = cl.ask(cl.settings.topics.config_commands, c.GetMigration(id=mid), timeout=30).result["state"]
        except RequestTimeout:
            state = "active"
        if state != "active":
            return state
        assert time.monotonic() < deadline, f"migration {mid} still active after {timeout}s"
        time.sleep(0.2)


def owner(cl: Cluster, ns: str) -> str:
    from domain.follower import replay_catalog

    catalog = asyncio.run(replay_catalog(cl.settings.bootstrap, cl.settings.topics.config_events))
    return catalog.collections[ns].chunks[0].shard


def write_then_inc(settings, ns: str, session_a: dict, session_b: dict) -> tuple[s.Insert, s.Update]:
    """Insert {k: 1, n: 0} (session A, txnNumber 1) and $inc it (session B, txnNumber 5), each
    sent twice: applied once."""
    insert = s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}], lsid=session_a, txnNumber=1)
    inc = s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}}, lsid=session_b, txnNumber=5)
    for _ in range(2):
        assert run(settings, insert) == {"inserted": 1, "writeErrors": []}
        assert run(settings, inc) == {"matched": 1, "modified": 1}
    assert counter(settings, ns, 1) == 1
    return insert, inc


def retried_after_the_move(settings, ns: str, insert: s.Insert, inc: s.Update) -> None:
    assert run(settings, inc) == {"matched": 1, "modified": 1}
    assert counter(settings, ns, 1) == 1, "the retried $inc applied a second time after the move"
    assert run(settings, insert) == {"inserted": 1, "writeErrors": []}, "the retried insert was not answered inserted"


def test_a_retry_applies_once_on_one_shard_and_after_its_range_moved(procs):
    """The issue's regression sequence: before session migration the counter read 2 and the
    resent insert was answered DuplicateKey."""
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    insert, inc = write_then_inc(settings, ns, lsid(), lsid())
    assert move(cl, ns, "s1") == "committed" and owner(cl, ns) == "s1"
    retried_after_the_move(settings, ns, insert, inc)
    # A plain insert of the same document (no session) is a duplicate: the record, not luck, answered.
    plain = run(settings, s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}]))
    assert plain["writeErrors"][0]["code"] == "DuplicateKey"


@pytest.mark.parametrize("victim", ["donor", "recipient"])
def test_a_retry_applies_once_when_a_shard_is_killed_mid_migration(procs, victim):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    insert, inc = write_then_inc(settings, ns, lsid(), lsid())
    armed = cl.start(victim, "migration.cloning")  # kill -9 while the clone is being sent or received
    try:
        mid = cl.config(c.MoveRange(ns=ns, min={"k": {"$minKey": 1}}, max={"k": {"$maxKey": 1}}, to="s1")).result["id"]
        wait_until(lambda: armed.proc.poll() is not None, 120, f"the {victim} to hit migration.cloning")
        assert armed.proc.returncode == -9
    finally:
        cl.start(victim)  # restarted without the fault
    outcome = wait_decided(cl, mid)
    # Before the commit (or after an abort) the donor still owns the range: a retry goes there.
    if outcome != "committed":
        retried_after_the_move(settings, ns, insert, inc)
        wait_until(lambda: idle(cl), 120, "both shards to forget the aborted migration and delete its orphans")
        assert move(cl, ns, "s1") == "committed"
    assert owner(cl, ns) == "s1"
    retried_after_the_move(settings, ns, insert, inc)


def idle(cl: Cluster) -> bool:
    for sid in ("s0", "s1"):
        try:
            listed = cl.ask(cl.settings.topics.shard_requests(sid), s.ListMigrations(), timeout=10).result
            if listed["migrations"] or listed["rangeDeletions"]:
                return False
        except RequestTimeout:
            return False
    return True


def test_an_older_txn_number_is_too_old_and_changes_nothing(procs):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    session = lsid()
    run(settings, s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}], lsid=session, txnNumber=3))
    run(settings, s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}}, lsid=session, txnNumber=4))
    e = refused(settings, s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 10}}, lsid=session, txnNumber=3))
    assert e.code == "TransactionTooOld"
    assert counter(settings, ns, 1) == 1


def test_find_and_modify_returns_the_same_document_on_retry(procs):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    run(settings, s.Insert(ns=ns, docs=[{"_id": i, "k": i, "n": 0} for i in range(3)]))
    fam = s.FindAndModify(
        ns=ns, query={"k": 2}, update={"$inc": {"n": 1}}, new=True, fields={"_id": 0}, lsid=lsid(), txnNumber=1
    )
    first = run(settings, fam)
    assert first == {"value": {"k": 2, "n": 1}, "lastErrorObject": {"n": 1, "updatedExisting": True}}
    assert run(settings, fam) == first  # the recorded post-image, not n: 2
    assert counter(settings, ns, 2) == 1

    async def client_api():
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as client:
            coll = client["rw"][ns.split(".")[1]]
            before = await coll.find_one_and_update({"k": 0}, {"$set": {"n": 5}})
            after = await coll.find_one_and_update({"k": 0}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER)
            replaced = await coll.find_one_and_replace(
                {"k": 1}, {"k": 1, "n": 7}, projection={"n": 1, "_id": 0}, return_document=ReturnDocument.AFTER
            )
            deleted = await coll.find_one_and_delete({"k": 2})
            missing = await coll.find_one_and_delete({"k": 2})
            upserted = await coll.find_one_and_update(
                {"k": 9}, {"$set": {"n": 9}}, upsert=True, return_document=ReturnDocument.AFTER
            )
            with pytest.raises(ValueError):
                await coll.find_one_and_update({"k": 0}, {"n": 1})  # not operators
            return before, after, replaced, deleted, missing, upserted

    before, after, replaced, deleted, missing, upserted = asyncio.run(client_api())
    assert before == {"_id": 0, "k": 0, "n": 0} and after == {"_id": 0, "k": 0, "n": 6}
    assert replaced == {"n": 7}
    assert deleted == {"_id": 2, "k": 2, "n": 1} and missing is None
    assert upserted["k"] == 9 and upserted["n"] == 9


def test_bad_session_fields_are_refused_and_change_nothing(procs):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    run(settings, s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}]))
    inc = s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}})
    cases = [
        ({"lsid": "abc", "txnNumber": 1}, "TypeMismatch"),
        ({"lsid": {"id": "nope"}, "txnNumber": 1}, "BadValue"),
        ({"lsid": lsid(), "txnNumber": "1"}, "TypeMismatch"),
        ({"lsid": lsid(), "txnNumber": -1}, "InvalidOptions"),
        ({"txnNumber": 1}, "InvalidOptions"),
        ({"lsid": lsid(), "txnNumber": 1, "stmtIds": [0]}, "BadValue"),
        ({"lsid": lsid(), "txnNumber": 1, "multi": True}, "InvalidOptions"),
    ]
    for fields, expected in cases:
        assert refused(settings, inc.model_copy(update=fields)).code == expected, fields
    assert counter(settings, ns, 1) == 0  # nothing applied, and the router still serves


def test_forget_sessions_removes_a_sessions_records_with_tombstones(procs):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    run(settings, s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}]))
    session = lsid()
    inc = s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}}, lsid=session, txnNumber=1)
    run(settings, inc)
    topic = settings.topics.shard_requests(owner(cl, ns))
    kept = cl.ask(topic, s.ForgetSessions(lsids=[session["id"]], before=time.time() - 3600))
    assert kept.ok and kept.result == {"forgotten": []}  # it wrote within the last hour
    gone = cl.ask(topic, s.ForgetSessions(lsids=[session["id"]], before=time.time() + 1))
    assert gone.ok and gone.result == {"forgotten": [session["id"]]}
    changelog = read_records(settings.bootstrap, settings.topics.shard_changelog(owner(cl, ns)))
    mine = [r for r in changelog if r.key and session["id"].encode() in r.key]
    assert mine and mine[-1].value is None, "the record's key must end with a tombstone (compaction drops it)"
    # Forgotten: the same txnNumber is a new write now (as it would be after the session expired).
    run(settings, inc)
    assert counter(settings, ns, 1) == 2


def test_a_write_without_retry_writes_carries_no_session(procs):
    cl, settings = procs, procs.settings
    ns = new_collection(cl)

    async def go():
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60, retry_writes=False) as plain:
            await plain["rw"][ns.split(".")[1]].insert_one({"_id": 1, "k": 1, "n": 0})
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as retrying:
            coll = retrying["rw"][ns.split(".")[1]]
            session = retrying.start_session()
            await coll.update_one({"k": 1}, {"$inc": {"n": 1}}, session=session)
            await coll.update_one({"k": 1}, {"$inc": {"n": 1}}, session=session)
            return session

    session = asyncio.run(go())
    assert session.txn_number == 2  # one txnNumber per write
    assert counter(settings, ns, 1) == 2
    changelog = read_records(settings.bootstrap, settings.topics.shard_changelog("s0"))
    recorded = [s.changelog.decode(r.value) for r in changelog if r.value and b"RetryableWriteRecorded" in r.value]
    assert {e.lsid for e in recorded if e.statements[0].ns == ns} == {session.lsid["id"]}  # the plain insert: none


def test_writes_made_during_a_migration_apply_once_when_retried_after_it(procs):
    """Retryable $incs on the moving range while it moves (their records reach the recipient in
    the clone or in the catch-up, whichever they fall in), each retried after the commit."""
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    docs = 200
    run(settings, s.Insert(ns=ns, docs=[{"_id": i, "k": i, "n": 0} for i in range(docs)]))
    acked: list[s.Update] = []

    async def scenario() -> str:
        stop = asyncio.Event()

        async def writer():
            async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as client:
                for n in itertools.count():
                    if stop.is_set():
                        return
                    inc = s.Update(ns=ns, filter={"k": n % docs}, update={"$inc": {"n": 1}}, lsid=lsid(), txnNumber=1)
                    assert (await client.call(inc))["matched"] == 1
                    acked.append(inc)

        task = asyncio.create_task(writer())
        await async_wait_until(lambda: len(acked) >= 5, 30, "writes before the migration starts")
        reply = await asyncio.to_thread(
            cl.config, c.MoveRange(ns=ns, min={"k": {"$minKey": 1}}, max={"k": {"$maxKey": 1}}, to="s1")
        )
        outcome = await asyncio.to_thread(wait_decided, cl, reply.result["id"])
        stop.set()
        await task
        return outcome

    assert asyncio.run(scenario()) == "committed"
    assert owner(cl, ns) == "s1"

    async def retry_all() -> list[dict]:
        async with AsyncCluster(settings.bootstrap, settings.cluster, timeout=60) as client:
            return [await client.call(inc) for inc in acked]

    assert all(r == {"matched": 1, "modified": 1} for r in asyncio.run(retry_all()))
    expected = collections.Counter(inc.filter["k"] for inc in acked)
    found = {d["k"]: d["n"] for d in run(settings, s.Find(ns=ns, filter={}, batchSize=docs))["docs"]}
    assert found == {k: expected.get(k, 0) for k in range(docs)}, "an increment applied twice (or lost)"


def test_a_shard_rebuilt_from_its_changelog_has_the_same_table(procs):
    """Replay folds the tombstones as they were decided: a forgotten session stays forgotten,
    a live one still answers its retry from the record."""
    import shutil

    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    run(settings, s.Insert(ns=ns, docs=[{"_id": 1, "k": 1, "n": 0}]))
    live = s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}}, lsid=lsid(), txnNumber=1)
    gone = s.Update(ns=ns, filter={"k": 1}, update={"$inc": {"n": 1}}, lsid=lsid(), txnNumber=1)
    run(settings, live)
    run(settings, gone)
    forgot = cl.ask(
        settings.topics.shard_requests("s0"), s.ForgetSessions(lsids=[gone.lsid["id"]], before=time.time() + 1)
    )
    assert forgot.result == {"forgotten": [gone.lsid["id"]]}
    cl.procs["donor"].stop()
    shutil.rmtree(settings.data_dir / "shard-s0")  # its store: rebuilt by replaying its changelog
    cl.start("donor")
    assert run(settings, live) == {"matched": 1, "modified": 1}
    assert counter(settings, ns, 1) == 2, "the live session's record was lost in the replay"
    run(settings, gone)
    assert counter(settings, ns, 1) == 3, "the forgotten session's record came back in the replay"


def test_an_insert_over_two_shards_retried_is_answered_inserted_and_writes_nothing(procs):
    """Statement ids are the documents' indexes in the client's batch, whichever shard holds
    each, so a retry of a batch split over shards skips exactly what ran."""
    cl, settings = procs, procs.settings
    ns = new_collection(cl)
    cl.config(c.SplitChunk(ns=ns, at=[{"k": 50}]))
    assert wait_decided(cl, cl.config(c.MoveRange(ns=ns, min={"k": 50}, to="s1")).result["id"]) == "committed"
    batch = s.Insert(ns=ns, docs=[{"_id": i, "k": i} for i in range(100)], lsid=lsid(), txnNumber=1)
    assert run(settings, batch) == {"inserted": 100, "writeErrors": []}
    # The same batch with one more document: the first hundred are answered from the records.
    more = batch.model_copy(update={"docs": [*batch.docs, {"_id": 100, "k": 100}]})
    assert run(settings, more) == {"inserted": 101, "writeErrors": []}
    assert run(settings, s.Count(ns=ns, filter={}))["n"] == 101
