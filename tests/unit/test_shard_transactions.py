"""A shard's part in multi-document transactions (issue 33, docs/decisions/0020): statements
decided on the snapshot with the transaction's own writes over it, kept aside in TxnRecorded
until a commit applies them all with one stamp; first writer wins; abort leaves nothing; the
records and locks come back from the store."""

from __future__ import annotations

import pytest

from domain.clock import LogicalTime, VectorClock
from libs.commands import stamp
from libs.errors import CommandError
from schemas import shard as s
from services.shard import history
from services.shard.documents import ShardDocuments
from services.shard.protocol import transaction as txns
from tests.unit.test_shard_snapshot_reads import NS, WALL, StampingShard

A, B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"


@pytest.fixture
def shard(tmp_path):
    from schemas import config as c

    sh = StampingShard(tmp_path)
    sh.config(c.CreateDatabase(db="d", primary="a"))
    history.begin(sh.store, 0)
    sh.write(s.Insert(ns=NS, docs=[{"_id": i, "v": 0} for i in range(3)], routing=sh.routing(NS)))
    yield sh
    sh.close()


def txn(shard, lsid: str, number: int = 1, read_at: int | None = None) -> s.Txn:
    shard.wall += 1
    return s.Txn(lsid=lsid, txnNumber=number, readAt=read_at if read_at is not None else shard.clock.tick())


def latest(shard) -> list[dict]:
    return shard.decider.decide(s.Find(ns=NS, routing=shard.routing(NS), sort={"_id": 1})).result["docs"]


def at(shard, ts: int) -> list[dict]:
    rc = {"level": "snapshot", "atClusterTime": LogicalTime.unpack(ts).to_ejson()}
    return shard.decider.decide(s.Find(ns=NS, routing=shard.routing(NS), readConcern=rc, sort={"_id": 1})).result[
        "docs"
    ]


def test_writes_wait_aside_until_the_commit_applies_them_all_with_one_stamp(shard):
    t = txn(shard, A)
    r = shard.routing(NS)
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=r, txn=t))
    shard.write(s.Insert(ns=NS, docs=[{"_id": 9, "v": 9}], routing=r, txn=t))
    shard.write(s.Delete(ns=NS, filter={"_id": 2}, routing=r, txn=t))
    shard.write(s.Update(ns=NS, filter={"_id": 9}, update={"$inc": {"v": 1}}, routing=r, txn=t))
    assert latest(shard) == [{"_id": i, "v": 0} for i in range(3)], "nothing applied before the commit"
    mine = shard.decider.decide(s.Find(ns=NS, routing=r, sort={"_id": 1}, txn=t)).result["docs"]
    assert mine == [{"_id": 0, "v": 0}, {"_id": 1, "v": 1}, {"_id": 9, "v": 10}], "the transaction reads its writes"
    record = shard.documents.txns[A]
    assert record.state == "in-progress" and len(record.writes) == 3, "one entry per document: its final image"

    committed = shard.write(s.CommitTransaction(lsid=A, txnNumber=1))
    stamps = {e.ts for e in shard.log_stamped[-4:] if isinstance(e, (s.DocumentWritten, s.DocumentRemoved))}
    assert stamps == {committed}, "every write of the transaction carries the commit's one stamp"
    assert latest(shard) == mine
    assert at(shard, committed - 1) == [{"_id": i, "v": 0} for i in range(3)], "before the stamp: none of it"
    assert at(shard, committed) == mine, "at the stamp: all of it"
    assert shard.decider.decide(s.CommitTransaction(lsid=A, txnNumber=1)).events == [], "a retried commit"
    assert shard.decider.decide(s.CommitTransaction(lsid=A, txnNumber=1)).result == {"committedAt": committed}


def test_the_first_writer_wins_inside_and_outside_transactions(shard):
    r = shard.routing(NS)
    ta, tb = txn(shard, A), txn(shard, B)
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": "a"}}, routing=r, txn=ta))
    for req in (
        s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": "b"}}, routing=r, txn=tb),
        s.Delete(ns=NS, filter={"v": 0}, multi=True, routing=r),  # outside: the router retries it
    ):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(req)
        assert e.value.code == "WriteConflict"
    shard.write(s.Update(ns=NS, filter={"_id": 2}, update={"$set": {"v": "b"}}, routing=r, txn=tb))  # another doc
    shard.write(s.CommitTransaction(lsid=A, txnNumber=1))
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": "c"}}, routing=r))  # released
    assert [d["v"] for d in latest(shard)] == [0, "c", 0]


def test_a_transaction_reads_its_snapshot_and_conflicts_with_what_changed_since(shard):
    r = shard.routing(NS)
    t = txn(shard, A)
    shard.wall += 1
    shard.write(s.Update(ns=NS, filter={"_id": 2}, update={"$set": {"v": "later"}}, routing=r))
    seen = shard.decider.decide(s.Find(ns=NS, routing=r, sort={"_id": 1}, txn=t)).result["docs"]
    assert seen == [{"_id": i, "v": 0} for i in range(3)], "a write after the snapshot is not seen"
    shard.write(s.Update(ns=NS, filter={"_id": 0}, update={"$set": {"v": 1}}, routing=r, txn=t))  # unchanged doc
    for req in (
        s.Update(ns=NS, filter={"v": 0}, update={"$set": {"v": 1}}, multi=True, routing=r, txn=t),
        s.Insert(ns=NS, docs=[{"_id": 2}], routing=r, txn=t),
        s.Delete(ns=NS, filter={"v": "later"}, routing=r, txn=t),  # matches as it is now
    ):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(req)
        assert e.value.code == "WriteConflict", req


def test_an_abort_leaves_nothing_and_releases_its_documents(shard):
    r = shard.routing(NS)
    t = txn(shard, A)
    shard.write(s.Delete(ns=NS, filter={}, multi=True, routing=r, txn=t))
    shard.write(s.AbortTransaction(lsid=A, txnNumber=1))
    assert latest(shard) == [{"_id": i, "v": 0} for i in range(3)]
    shard.write(s.Update(ns=NS, filter={"_id": 0}, update={"$set": {"v": 5}}, routing=r))
    assert shard.decider.decide(s.AbortTransaction(lsid=A, txnNumber=1)).events == [], "a retried abort"
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.CommitTransaction(lsid=A, txnNumber=1))
    assert e.value.code == "NoSuchTransaction"


@pytest.mark.parametrize(
    "req, code",
    [
        (s.CommitTransaction(lsid=B, txnNumber=1), "NoSuchTransaction"),
        (s.AbortTransaction(lsid=A, txnNumber=7), "NoSuchTransaction"),
        (s.Insert(ns=NS, docs=[{"_id": 5}], txn=s.Txn(lsid=A, txnNumber=1, readAt=1)), "TransactionTooOld"),
    ],
)
def test_unknown_and_superseded_transactions_get_mongodbs_errors_and_change_nothing(shard, req, code):
    t = txn(shard, A, number=2)
    shard.write(s.Insert(ns=NS, docs=[{"_id": 7}], routing=shard.routing(NS), txn=t))
    before = shard.stored()
    if getattr(req, "ns", None):
        req = req.model_copy(update={"routing": shard.routing(NS)})
    with pytest.raises(CommandError) as e:
        shard.decider.decide(req)
    assert e.value.code == code
    assert shard.stored() == before


def test_a_committed_transaction_refuses_statements_and_aborts(shard):
    t = txn(shard, A)
    r = shard.routing(NS)
    shard.write(s.Insert(ns=NS, docs=[{"_id": 5}], routing=r, txn=t))
    shard.write(s.CommitTransaction(lsid=A, txnNumber=1))
    for req in (s.Insert(ns=NS, docs=[{"_id": 6}], routing=r, txn=t), s.AbortTransaction(lsid=A, txnNumber=1)):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(req)
        assert e.value.code == "TransactionCommitted"


def test_open_transactions_and_their_locks_come_back_from_the_store(shard):
    r = shard.routing(NS)
    t = txn(shard, A)
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=r, txn=t))
    restarted = ShardDocuments()
    restarted.clock = VectorClock(wall=lambda: float(WALL))
    restarted.load(shard.store)
    assert restarted.txns[A] == shard.documents.txns[A]
    assert restarted.txn_holder(NS, 1) == A and restarted.txn_holder(NS, 0) is None


def test_a_newer_transaction_on_the_session_drops_the_older_ones_writes(shard):
    r = shard.routing(NS)
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=r, txn=txn(shard, A, 1)))
    shard.write(s.Update(ns=NS, filter={"_id": 2}, update={"$set": {"v": 2}}, routing=r, txn=txn(shard, A, 2)))
    assert [w.id for w in shard.documents.txns[A].writes] == [2]
    assert shard.documents.txn_holder(NS, 1) is None
    shard.write(s.CommitTransaction(lsid=A, txnNumber=2))
    assert [d["v"] for d in latest(shard)] == [0, 0, 2]


def test_with_writes_keeps_one_final_image_per_document():
    rec = s.TxnRecorded(lsid=A, txnNumber=1, readAt=1, state="in-progress", startedAt=0.0)
    rec = txns.with_writes(rec, [s.DocumentWritten(ns=NS, skey="00", doc={"_id": 1, "v": 1})])
    rec = txns.with_writes(rec, [s.DocumentWritten(ns=NS, skey="00", doc={"_id": 2})])
    rec = txns.with_writes(rec, [s.DocumentRemoved(ns=NS, skey="00", id=1)])
    assert [(w.id, w.doc) for w in rec.writes] == [(2, {"_id": 2}), (1, None)]
    events = txns.pending(rec, ts=7)
    assert [type(e) for e in events] == [s.DocumentWritten, s.DocumentRemoved] and {e.ts for e in events} == {7}
    assert stamp(VectorClock(), events[0]).ts == 7, "the processor keeps a stamp an event carries"


def test_the_reaper_aborts_only_transactions_in_progress_past_their_lifetime_limit():
    from services.shard.sessions import expired_transactions, transaction_reaper_period

    def rec(lsid: str, state: str, started: float) -> s.TxnRecorded:
        return s.TxnRecorded(lsid=lsid, txnNumber=3, readAt=1, state=state, startedAt=started)  # type: ignore[arg-type]

    records = [rec("old", "in-progress", 0.0), rec("new", "in-progress", 50.0), rec("prep", "prepared", 0.0)]
    records.append(rec("done", "committed", 0.0))
    assert expired_transactions(records, now_s=60.0, limit_s=60) == [s.AbortTransaction(lsid="old", txnNumber=3)]
    assert transaction_reaper_period(60) == 15.0 and transaction_reaper_period(2) == 0.5


# ------------------------------------------------------------------ placement changes


def _migrate(shard, ns: str, index: int, recipient: str) -> int:
    """As the config server commits the migration of `ns`'s chunk `index`: its stamp."""
    from schemas import config as c

    coll = shard.catalog.collections[ns]
    ch = coll.chunks[index]
    doc = ch.doc().model_copy(update={"shard": recipient, "version": (coll.version().pair[0] + 1, 0)})
    shard.wall += 1
    ts = shard.clock.tick()
    shard.catalog_apply(
        [
            c.MigrationCommitted(
                id=f"m{ts}", ns=ns, epoch=coll.epoch, donor=ch.shard, recipient=recipient, chunks=[doc], ts=ts
            )
        ]
    )
    return ts


def test_writes_to_a_range_that_migrated_since_the_snapshot_are_migration_conflicts(shard):
    """MongoDB's throwIfMovedSince: the transaction's reads go to the owners at its snapshot, so
    it writes only where they still are (a statement, and again at its commit)."""
    from schemas import config as c

    ns = "d.k"
    shard.config(c.ShardCollection(ns=ns, key={"k": 1}))
    shard.config(c.SplitChunk(ns=ns, at=[{"k": 10}]))
    shard.write(s.Insert(ns=ns, docs=[{"_id": 5, "k": 5}], routing=shard.routing(ns)))
    _migrate(shard, ns, 1, "b")  # [10, max) is b's at the snapshot
    t = txn(shard, A)
    shard.write(s.Update(ns=ns, filter={"k": 5}, update={"$set": {"v": 1}}, routing=shard.routing(ns), txn=t))
    _migrate(shard, ns, 1, "a")  # it moves in, with its document (as the clone writes it)
    shard.write(s.Insert(ns=ns, docs=[{"_id": 15, "k": 15}], routing=shard.routing(ns)))
    for req in (
        s.Update(ns=ns, filter={"k": 15}, update={"$set": {"v": 1}}, routing=shard.routing(ns), txn=t),
        s.Insert(ns=ns, docs=[{"_id": 12, "k": 12}], routing=shard.routing(ns), txn=t),  # a key nobody wrote
    ):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(req)
        assert e.value.code == "MigrationConflict", req
    _migrate(shard, ns, 0, "b")  # the range the transaction wrote moves away before its commit
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.CommitTransaction(lsid=A, txnNumber=1))
    assert e.value.code == "MigrationConflict"
    assert [w.id for w in shard.documents.txns[A].writes] == [5], "the refused statements added nothing"


def test_a_ddl_critical_section_ends_the_transactions_that_wrote_its_namespaces(shard):
    from schemas import ddl as dd

    shard.write(
        s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=shard.routing(NS), txn=txn(shard, A))
    )
    shard.write(s.Insert(ns="d.other", docs=[{"_id": 1}], routing=shard.routing("d.other"), txn=txn(shard, B)))
    shard.write(dd.EnterDDLCriticalSection(id="x", namespaces=[NS]))
    assert shard.documents.txns[A].state == "aborted" and shard.documents.txn_holder(NS, 1) is None
    assert shard.documents.txns[B].state == "in-progress", "another namespace's: left be"
    assert shard.decider.decide(dd.EnterDDLCriticalSection(id="x", namespaces=[NS])).events == [], "a retry"
    with pytest.raises(CommandError) as e:
        shard.decider.decide(s.CommitTransaction(lsid=A, txnNumber=1))
    assert e.value.code == "NoSuchTransaction"
    shard.write(dd.EnterDDLCriticalSection(id="y", db="d"))  # a dropDatabase's: every collection of it
    assert shard.documents.txns[B].state == "aborted"


def test_nothing_of_a_transaction_lands_in_a_namespace_renamed_since_its_snapshot(shard):
    from schemas import ddl as dd

    t = txn(shard, A)
    shard.write(s.Update(ns=NS, filter={"_id": 1}, update={"$set": {"v": 1}}, routing=shard.routing(NS), txn=t))
    shard.wall += 1
    shard.catalog_apply([stamp(shard.clock, dd.CollectionRenamed(ns=NS, to="d.to"))])
    for req in (
        s.Insert(ns=NS, docs=[{"_id": 7}], routing=shard.routing(NS), txn=t),
        s.CommitTransaction(lsid=A, txnNumber=1),
    ):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(req)
        assert e.value.code == "SnapshotUnavailable", req
    assert [d["v"] for d in latest(shard)] == [0, 0, 0]


# ------------------------------------------------------------------ two-phase commit


class Participant(StampingShard):
    def __init__(self, path, shard_id: str) -> None:
        self.wall = float(WALL)
        self.clock = VectorClock(wall=lambda: self.wall)
        self.log_stamped = []
        from tests.shard_harness import ShardHarness

        ShardHarness.__init__(self, path, shard_id)


@pytest.fixture
def pair(tmp_path):
    from schemas import config as c

    shards = []
    for sid in ("a", "b"):
        sh = Participant(tmp_path / sid, sid)
        sh.config(c.CreateDatabase(db="d", primary="a"))
        sh.config(c.CreateDatabase(db="e", primary="b"))
        history.begin(sh.store, 0)
        shards.append(sh)
    yield shards
    for sh in shards:
        sh.close()


def test_two_phase_commit_applies_every_participants_writes_at_the_largest_prepare_stamp(pair):
    a, b = pair
    read_at = a.clock.tick()
    t = s.Txn(lsid=A, txnNumber=1, readAt=read_at)
    a.write(s.Insert(ns="d.c", docs=[{"_id": 1}], routing=a.routing("d.c"), txn=t))
    b.write(s.Insert(ns="e.c", docs=[{"_id": 2}], routing=b.routing("e.c"), txn=t))
    coordinate = s.CoordinateCommitTransaction(lsid=A, txnNumber=1, participants=["a", "b"])
    assert a.decider.decide(coordinate).result == {"decision": None}
    a.write(coordinate)
    assert a.decider.decide(coordinate).result == {"decision": None}, "a retry while the votes are out"
    b.wall += 30  # b's clock is ahead: the commit goes after its prepare stamp
    votes = {}
    for sh in (a, b):
        dec = sh.decider.decide(s.PrepareTransaction(lsid=A, txnNumber=1))
        events = [stamp(sh.clock, e) for e in dec.events]
        for e in events:
            sh.documents.apply(e, -1)
        sh.commit()
        votes[sh.shard_id] = dec.result["prepareTimestamp"]
    # Prepared: reads of what it holds wait, writes to it conflict, the reaper leaves it be.
    for req, code in (
        (s.Find(ns="e.c", routing=b.routing("e.c")), "PrepareConflict"),
        (s.Update(ns="e.c", filter={}, update={"$set": {"x": 1}}, routing=b.routing("e.c")), "PrepareConflict"),
        (s.AbortTransaction(lsid=A, txnNumber=2), "NoSuchTransaction"),
    ):
        with pytest.raises(CommandError) as e:
            b.decider.decide(req)
        assert e.value.code == code
    state, commit_at = txns.decision_of(votes)
    assert state == "committing" and commit_at == max(votes.values()) == votes["b"]
    a.write(s.AdvanceTxnCoordinator(lsid=A, txnNumber=1, state="committing", commitAt=commit_at))
    assert a.decider.decide(coordinate).result == {"decision": "commit", "commitAt": commit_at}
    with pytest.raises(CommandError):  # the decision is final
        a.decider.decide(s.AdvanceTxnCoordinator(lsid=A, txnNumber=1, state="aborting"))
    for sh in (a, b):
        assert sh.write(s.CommitTransaction(lsid=A, txnNumber=1, commitAt=commit_at)) == commit_at
    assert [e.ts for e in a.log_stamped if isinstance(e, s.DocumentWritten) and e.ns == "d.c"] == [commit_at]
    a.write(s.AdvanceTxnCoordinator(lsid=A, txnNumber=1, state="done"))
    assert a.documents.coordinators == {}
    # Gone, the coordinator still answers a retried commitTransaction from its own part.
    assert a.decider.decide(coordinate.model_copy(update={"participants": []})).result == {
        "decision": "commit",
        "commitAt": commit_at,
    }
    restarted = ShardDocuments()
    restarted.load(a.store)
    assert restarted.coordinators == {} and restarted.txns[A].state == "committed"


def test_a_participant_that_cannot_prepare_votes_no_and_the_coordinator_aborts_everywhere(pair):
    a, b = pair
    t = s.Txn(lsid=A, txnNumber=1, readAt=a.clock.tick())
    a.write(s.Insert(ns="d.c", docs=[{"_id": 1}], routing=a.routing("d.c"), txn=t))
    a.write(s.CoordinateCommitTransaction(lsid=A, txnNumber=1, participants=["a", "b"]))
    with pytest.raises(CommandError) as e:  # b never saw the transaction (its statement was lost)
        b.decider.decide(s.PrepareTransaction(lsid=A, txnNumber=1))
    assert e.value.code == "NoSuchTransaction"
    assert txns.decision_of({"a": 5, "b": None}) == ("aborting", None)
    a.write(s.AdvanceTxnCoordinator(lsid=A, txnNumber=1, state="aborting", why="b voted no"))
    assert a.decider.decide(s.CoordinateCommitTransaction(lsid=A, txnNumber=1)).result == {
        "decision": "abort",
        "why": "b voted no",
    }
    a.write(s.AbortTransaction(lsid=A, txnNumber=1))
    assert a.documents.txn_holder("d.c", 1) is None


def test_a_prepared_participant_never_decides_alone(pair):
    a, _ = pair
    t = s.Txn(lsid=A, txnNumber=1, readAt=a.clock.tick())
    a.write(s.Insert(ns="d.c", docs=[{"_id": 1}], routing=a.routing("d.c"), txn=t))
    a.write(s.PrepareTransaction(lsid=A, txnNumber=1))
    for req, code in (
        (s.Insert(ns="d.c", docs=[{"_id": 3}], routing=a.routing("d.c"), txn=t), "PreparedTransactionInProgress"),
        (
            s.Insert(ns="d.c", docs=[{"_id": 3}], routing=a.routing("d.c"), txn=t.model_copy(update={"txnNumber": 2})),
            "PreparedTransactionInProgress",
        ),
        (s.CommitTransaction(lsid=A, txnNumber=1), "InvalidOptions"),  # without the coordinator's commitAt
    ):
        with pytest.raises(CommandError) as e:
            a.decider.decide(req)
        assert e.value.code == code, req


def test_the_session_reaper_forgets_ended_transactions_of_expired_sessions_but_not_open_ones(shard):
    r = shard.routing(NS)
    shard.write(s.Insert(ns=NS, docs=[{"_id": 5}], routing=r, txn=txn(shard, A)))
    shard.write(s.CommitTransaction(lsid=A, txnNumber=1))
    shard.write(s.Insert(ns=NS, docs=[{"_id": 6}], routing=r, txn=txn(shard, B)))  # still open
    assert dict(shard.documents.session_last_writes())[A] == shard.documents.txns[A].startedAt
    shard.write(s.ForgetSessions(lsids=[A, B], before=shard.wall + 1))
    assert A not in shard.documents.txns and B in shard.documents.txns
    restarted = ShardDocuments()
    restarted.load(shard.store)
    assert list(restarted.txns) == [B]


def test_a_ddl_critical_section_waits_for_a_prepared_transaction_of_its_namespace(shard):
    from schemas import ddl as dd

    shard.write(s.Insert(ns=NS, docs=[{"_id": 5}], routing=shard.routing(NS), txn=txn(shard, A)))
    shard.write(s.PrepareTransaction(lsid=A, txnNumber=1))
    for section in (dd.EnterDDLCriticalSection(id="x", namespaces=[NS]), dd.EnterDDLCriticalSection(id="y", db="d")):
        with pytest.raises(CommandError) as e:
            shard.decider.decide(section)
        assert e.value.code == "PrepareConflict"
    assert shard.decider.decide(dd.EnterDDLCriticalSection(id="z", namespaces=["d.other"])).events


def test_recovering_a_commit_no_coordinator_began_aborts_the_part_so_the_answer_stays_true(pair):
    a, _ = pair
    t = s.Txn(lsid=A, txnNumber=1, readAt=a.clock.tick())
    a.write(s.Insert(ns="d.c", docs=[{"_id": 1}], routing=a.routing("d.c"), txn=t))
    ask = s.CoordinateCommitTransaction(lsid=A, txnNumber=1)  # a router that never saw it
    a.write(ask)
    assert a.decider.decide(ask).result["decision"] == "abort"
    assert a.documents.txns[A].state == "aborted" and a.documents.txn_holder("d.c", 1) is None
    late = a.decider.decide(s.CoordinateCommitTransaction(lsid=A, txnNumber=1, participants=["a", "b"]))
    assert late.result["decision"] == "abort" and late.events == [], "the original router's commit, late"
