"""Multi-document transactions through the wire against a real broker (issue 33, decision 0020),
with pymongo as an application uses it: `with_transaction` applies two writes at once or not at
all, a transaction reads one snapshot, the first writer wins (WriteConflict with the
TransientTransactionError label, a plain write waiting for the holder), a transaction writing two
shards commits by two-phase commit, a retried commit answers ok, and a command a
transaction refuses leaves it usable.  Placement changes under an open transaction (a range
migrating in, a drop, a rename) and its lifetime limit end it with a TransientTransactionError,
nothing of it applied."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from bson import MinKey
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from schemas import config as c
from tests.conftest import wait_until

pytestmark = pytest.mark.kafka


def _bank(data_cluster):
    client = data_cluster.mongo_client()
    coll = client.app.bank
    coll.insert_many([{"_id": "a", "v": 100}, {"_id": "b", "v": 0}])
    return client, coll


def test_with_transaction_applies_two_writes_at_once(data_cluster):
    client, coll = _bank(data_cluster)
    seen_outside: list[list[int]] = []

    def transfer(session):
        coll.update_one({"_id": "a"}, {"$inc": {"v": -10}}, session=session)
        coll.update_one({"_id": "b"}, {"$inc": {"v": 10}}, session=session)
        assert [d["v"] for d in coll.find({}, session=session).sort("_id", 1)] == [90, 10]  # its own writes
        seen_outside.append([d["v"] for d in coll.find({}).sort("_id", 1)])

    with client.start_session() as session:
        session.with_transaction(transfer)
        primary = data_cluster.router.follower.catalog.databases["app"].primary
        assert session._transaction.recovery_token == {"recoveryShardId": primary}  # the writer
    assert seen_outside == [[100, 0]], "nothing of a transaction is visible before its commit"
    assert [d["v"] for d in coll.find({}).sort("_id", 1)] == [90, 10]


def test_an_aborted_transaction_leaves_nothing(data_cluster):
    client, coll = _bank(data_cluster)
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "c", "v": 1}, session=session)
        coll.delete_one({"_id": "a"}, session=session)
        assert sorted(d["_id"] for d in coll.find({}, session=session)) == ["b", "c"]
        session.abort_transaction()
    assert sorted(d["_id"] for d in coll.find({})) == ["a", "b"]
    coll.update_one({"_id": "a"}, {"$set": {"v": 1}})  # nothing held: no wait
    assert coll.find_one({"_id": "a"})["v"] == 1


def test_a_transaction_reads_one_snapshot(data_cluster):
    client, coll = _bank(data_cluster)
    with client.start_session() as session:
        session.start_transaction(read_concern=ReadConcern("snapshot"))
        assert coll.find_one({"_id": "a"}, session=session)["v"] == 100
        coll.update_one({"_id": "a"}, {"$set": {"v": 5}})  # committed meanwhile, outside
        coll.insert_one({"_id": "z", "v": 5})
        assert coll.find_one({"_id": "a"}, session=session)["v"] == 100
        assert coll.count_documents({}, session=session) == 2  # an aggregate: the same snapshot
        session.commit_transaction()
    assert coll.find_one({"_id": "a"})["v"] == 5


def test_the_first_writer_wins_and_a_plain_write_waits_for_it(data_cluster):
    client, coll = _bank(data_cluster)
    with client.start_session() as first, client.start_session() as second:
        first.start_transaction()
        coll.update_one({"_id": "a"}, {"$inc": {"v": 1}}, session=first)
        second.start_transaction()
        with pytest.raises(OperationFailure) as e:
            coll.update_one({"_id": "a"}, {"$inc": {"v": 100}}, session=second)
        assert e.value.code == 112 and e.value.has_error_label("TransientTransactionError")
        with pytest.raises(OperationFailure) as e:  # the conflict aborted the second transaction
            second.commit_transaction()
        assert e.value.code == 251
        done: list[float] = []
        plain = threading.Thread(
            target=lambda: (coll.update_one({"_id": "a"}, {"$inc": {"v": 1000}}), done.append(time.monotonic()))
        )
        plain.start()
        time.sleep(1.0)
        assert not done, "a plain write waits while an open transaction holds the document"
        committed = time.monotonic()
        first.commit_transaction()
        plain.join(30)
        assert done and done[0] >= committed
    assert coll.find_one({"_id": "a"})["v"] == 1101


def test_a_transaction_writing_two_shards_commits_by_two_phase_commit(data_cluster):
    data_cluster.command(c.ShardCollection(ns="app.acct", key={"k": 1}))
    client = data_cluster.mongo_client()
    coll = client.app.acct
    client.admin.command("split", "app.acct", middle={"k": 100})
    client.admin.command("moveRange", "app.acct", min={"k": 100}, toShard="s1")
    coll.insert_many([{"_id": 1, "k": 1, "v": 100}, {"_id": 150, "k": 150, "v": 100}])
    before = client.admin.command("ping")["$clusterTime"]["clusterTime"]
    with client.start_session() as session:
        session.start_transaction()
        coll.update_one({"k": 1}, {"$inc": {"v": -10}}, session=session)
        coll.update_one({"k": 150}, {"$inc": {"v": 10}}, session=session)
        assert coll.find_one({"k": 150})["v"] == 100, "nothing visible outside before the commit"
        session.commit_transaction()
        session.commit_transaction()  # retried: the coordinator's shard answers the same
    assert sorted((d["k"], d["v"]) for d in coll.find()) == [(1, 90), (150, 110)]
    # All or nothing at every snapshot: before the commit none of it, after it all of it.
    old = client.app.command("find", "acct", filter={}, readConcern={"level": "snapshot", "atClusterTime": before})
    assert sorted(d["v"] for d in old["cursor"]["firstBatch"]) == [100, 100]
    coll.update_many({}, {"$set": {"u": 1}})  # nothing held on either shard
    assert coll.count_documents({"u": 1}) == 2
    # The commit's answer carries a time at or after the commit on every participant (the
    # participants' prepare stamps reach the coordinator's clock): read there, all of it is seen.
    for n in range(1, 6):
        with client.start_session() as session:
            session.start_transaction()
            coll.update_one({"k": 150}, {"$inc": {"v": 1}}, session=session)  # (s1 votes with its own stamp)
            coll.update_one({"k": 1}, {"$inc": {"v": -1}}, session=session)
            session.commit_transaction()
            at = session.operation_time
        seen = client.app.command("find", "acct", filter={}, readConcern={"level": "snapshot", "atClusterTime": at})
        assert sorted(d["v"] for d in seen["cursor"]["firstBatch"]) == [90 - n, 110 + n], (n, at)


def test_a_retried_commit_answers_ok(data_cluster):
    client, coll = _bank(data_cluster)
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "c", "v": 1}, session=session)
        session.commit_transaction()
        session.commit_transaction()  # pymongo sends commitTransaction again: the same outcome
    assert coll.find_one({"_id": "c"}) == {"_id": "c", "v": 1}


def test_a_refused_command_leaves_the_transaction_usable(data_cluster):
    client, coll = _bank(data_cluster)
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "c", "v": 1}, session=session)
        with pytest.raises(OperationFailure) as e:
            client.app.command("count", "bank", session=session)
        assert e.value.code == 263 and "Cannot run 'count' in a multi-document transaction." in str(e.value)
        assert not e.value.has_error_label("TransientTransactionError")
        coll.insert_one({"_id": "d", "v": 1}, session=session)
        session.commit_transaction()
    assert sorted(d["_id"] for d in coll.find({})) == ["a", "b", "c", "d"]


def test_a_transaction_may_create_its_collection(data_cluster):
    client = data_cluster.mongo_client()
    client.app.other.insert_one({"_id": 0})  # the database exists; the collection does not
    with client.start_session() as session:
        session.with_transaction(lambda s: client.app.fresh.insert_many([{"_id": 1}, {"_id": 2}], session=s))
    assert sorted(d["_id"] for d in client.app.fresh.find({})) == [1, 2]


def test_the_client_library_has_the_same_transactions(data_cluster):
    from libs.client import ShardlogError
    from tests.integration.test_data_path import client_run

    async def go(cl):
        accounts = cl["app"]["lib"]
        await accounts.insert_many([{"_id": "a", "v": 100}, {"_id": "b", "v": 0}])
        session = cl.start_session()

        async def transfer(s):
            await accounts.update_one({"_id": "a"}, {"$inc": {"v": -10}}, session=s)
            await accounts.update_one({"_id": "b"}, {"$inc": {"v": 10}}, session=s)
            assert [d["v"] async for d in accounts.find({}, sort={"_id": 1}, session=s)] == [90, 10]
            assert [d["v"] async for d in accounts.find({}, sort={"_id": 1})] == [100, 0]  # not yet
            with pytest.raises(ShardlogError) as e:
                await accounts.count_documents({}, session=s)
            assert e.value.code == "OperationNotSupportedInTransaction"

        await cl.with_transaction(session, transfer)
        await cl.commit_transaction(session)  # retried: the same outcome
        assert [d["v"] async for d in accounts.find({}, sort={"_id": 1})] == [90, 10]
        await cl.start_transaction(session)
        await accounts.insert_one({"_id": "c", "v": 1}, session=session)
        await cl.abort_transaction(session)
        assert await accounts.count_documents({}) == 2

    client_run(data_cluster, go)


def test_a_commit_on_a_router_that_never_saw_the_transaction_uses_its_recovery_token(data_cluster):
    """MongoDB's recovery: the token's shard answers from its coordinator or its own part; a
    transaction whose commit never began there is aborted, so the answer stays true."""
    client, coll = _bank(data_cluster)
    forget = data_cluster.router.routing.transactions.sessions.clear  # another router, or a restart
    with client.start_session() as session:
        session.start_transaction()
        coll.update_one({"_id": "a"}, {"$set": {"v": 7}}, session=session)
        session.commit_transaction()
        forget()
        session.commit_transaction()  # retried with the recoveryToken: the shard's part committed
    assert coll.find_one({"_id": "a"})["v"] == 7
    with client.start_session() as session:
        session.start_transaction()
        coll.update_one({"_id": "a"}, {"$set": {"v": 8}}, session=session)
        forget()
        with pytest.raises(OperationFailure) as e:
            session.commit_transaction()
        assert e.value.code == 251 and e.value.has_error_label("TransientTransactionError")
    assert coll.find_one({"_id": "a"})["v"] == 7
    coll.update_one({"_id": "a"}, {"$set": {"v": 9}})  # nothing left holding it


def _transient(e: pytest.ExceptionInfo[OperationFailure]) -> tuple[int, bool]:
    return e.value.code, e.value.has_error_label("TransientTransactionError")


def test_a_range_that_migrated_in_since_the_snapshot_is_a_migration_conflict_and_with_transaction_retries(
    data_cluster,
):
    """MongoDB's snapshot transactions: reads go to the owners at the snapshot; a write to a
    range that moved since is MigrationConflict (272), labelled so that with_transaction
    runs the transaction again, at a snapshot after the move."""
    data_cluster.command(c.ShardCollection(ns="app.acct", key={"k": 1}))
    client = data_cluster.mongo_client()
    coll = client.app.acct
    primary = data_cluster.router.follower.catalog.databases["app"].primary
    other = next(sid for sid in data_cluster.shards if sid != primary)
    client.admin.command("split", "app.acct", middle={"k": 100})
    client.admin.command("moveRange", "app.acct", min={"k": MinKey()}, toShard=other)
    coll.insert_many([{"_id": 1, "k": 1, "v": 100}, {"_id": 150, "k": 150, "v": 100}])
    outcomes: list[object] = []

    def transfer(session):
        assert coll.find_one({"k": 1}, session=session)["v"] == 100  # the snapshot is taken, on `other`
        if not outcomes:
            # The range moves in to the shard the transaction reached, and is written there.
            client.admin.command("moveRange", "app.acct", min={"k": 100}, toShard=other)
            coll.update_one({"k": 150}, {"$set": {"v": 7}})
            assert coll.find_one({"k": 150}, session=session)["v"] == 100, "read at the snapshot, from its owner then"
        try:
            coll.update_one({"k": 150}, {"$inc": {"v": 1}}, session=session)
        except OperationFailure as e:
            outcomes.append((e.code, e.has_error_label("TransientTransactionError")))
            raise
        outcomes.append("written")

    with client.start_session() as session:
        session.with_transaction(transfer)
    assert outcomes == [(272, True), "written"]
    assert coll.find_one({"k": 150})["v"] == 8, "the first attempt left nothing; the second applied once"


def test_a_drop_or_a_rename_ends_the_transactions_that_wrote_the_collection(data_cluster):
    """The DDL's critical section aborts them on the shards (MongoDB's drop would wait for them,
    up to their lifetime limit): the commit is NoSuchTransaction, a later statement on the old
    name SnapshotUnavailable, both TransientTransactionError, and nothing of them lands."""
    client = data_cluster.mongo_client()
    dropped, renamed = client.app.dropped, client.app.renamed
    dropped.insert_one({"_id": 1, "v": 0})
    renamed.insert_one({"_id": 1, "v": 0})
    with client.start_session() as a, client.start_session() as b:
        a.start_transaction()
        dropped.update_one({"_id": 1}, {"$set": {"v": 1}}, session=a)
        b.start_transaction()
        renamed.update_one({"_id": 1}, {"$set": {"v": 1}}, session=b)
        dropped.drop()
        renamed.rename("moved")
        records = [r for sh in data_cluster.shards.values() for r in sh.documents.txns.values()]
        assert sorted(r.state for r in records) == ["aborted", "aborted"]
        assert not any(sh.documents.txn_locks for sh in data_cluster.shards.values()), "their documents released"
        with pytest.raises(OperationFailure) as e:
            a.commit_transaction()
        assert _transient(e) == (251, True)
        with pytest.raises(OperationFailure) as e:
            renamed.insert_one({"_id": 2}, session=b)  # would create the collection again
        assert _transient(e) == (246, True)
    assert {"dropped", "renamed"}.isdisjoint(client.app.list_collection_names()), "neither made again"
    assert list(client.app.moved.find({})) == [{"_id": 1, "v": 0}]
    dropped.insert_one({"_id": 1, "v": 5})  # a new collection of the name: nothing of the old transaction in its way
    assert list(dropped.find({})) == [{"_id": 1, "v": 5}]


def test_a_transaction_past_its_lifetime_limit_is_aborted_and_its_documents_released(data_cluster):
    """transactionLifetimeLimitSeconds (a cluster setting): the shard's reaper aborts it; its
    next statement and its commit are NoSuchTransaction with the TransientTransactionError label."""
    client, coll = _bank(data_cluster)
    data_cluster.command(c.SetSetting(key="transactionLifetimeLimitSeconds", value=1))
    primary = data_cluster.shards[data_cluster.router.follower.catalog.databases["app"].primary]
    with client.start_session() as session:
        session.start_transaction()
        coll.update_one({"_id": "a"}, {"$set": {"v": 1}}, session=session)
        wait_until(lambda: primary.reaper.transactions_aborted, 30, "the reaper to abort the transaction past 1 s")
        with pytest.raises(OperationFailure) as e:
            coll.find_one({"_id": "a"}, session=session)
        assert _transient(e) == (251, True)
        with pytest.raises(OperationFailure) as e:
            session.commit_transaction()
        assert _transient(e) == (251, True)
    assert coll.find_one({"_id": "a"})["v"] == 100
    assert not primary.documents.txn_locks


def test_a_migrations_critical_section_waits_for_a_prepared_transaction(data_cluster):
    """As MongoDB's donor: the range leaves only once the prepared transaction is decided (a
    commit after it would land in a range given away), and its committed write goes with it."""
    from libs.requests import Requester
    from schemas import shard as s

    def ask(shard: str, req):
        async def go():
            async with Requester(data_cluster.settings.bootstrap, data_cluster.settings.topics.cli_replies) as r:
                return await r.request(data_cluster.settings.topics.shard_requests(shard), req, timeout=30)

        return data_cluster.call(go())

    data_cluster.command(c.ShardCollection(ns="app.acct", key={"k": 1}))
    client = data_cluster.mongo_client()
    coll = client.app.acct
    coll.insert_one({"_id": 1, "k": 1, "v": 0})
    primary = data_cluster.router.follower.catalog.databases["app"].primary
    other = next(sid for sid in data_cluster.shards if sid != primary)
    donor = data_cluster.shards[primary]

    def owner() -> str:
        return data_cluster.router.follower.catalog.collections["app.acct"].chunks[0].shard

    with client.start_session() as session, ThreadPoolExecutor(1) as pool:
        session.start_transaction()
        coll.update_one({"k": 1}, {"$set": {"v": 1}}, session=session)
        (record,) = donor.documents.txns.values()
        prepared = ask(primary, s.PrepareTransaction(lsid=record.lsid, txnNumber=record.txnNumber))  # a coordinator's
        assert prepared.ok, prepared
        moving = pool.submit(client.admin.command, "moveRange", "app.acct", min={"k": MinKey()}, toShard=other)
        wait_until(lambda: donor.donor.prepare_waits, 30, "the critical section to meet the prepared transaction")
        assert not moving.done() and owner() == primary, "the range waits for the transaction's decision"
        commit_at = prepared.result["prepareTimestamp"]
        assert ask(primary, s.CommitTransaction(lsid=record.lsid, txnNumber=record.txnNumber, commitAt=commit_at)).ok
        moving.result(60)
        session.commit_transaction()  # the router's commit: the participant answers it committed
    assert owner() == other
    assert coll.find_one({"k": 1})["v"] == 1, "committed on the donor before the range left, and moved with it"
