"""Retryable writes without a broker (docs/decisions/0015): the session fields' parsers and
MongoDB's refusals, the transactions table's pure logic, its fold (tombstones included) and
the shard's decisions on retries, findAndModify and ForgetSessions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.catalog import Catalog
from domain.session import client_session, parse_lsid, parse_stmt_ids, parse_txn_number, shard_session
from libs.errors import CommandError
from libs.store import Store
from schemas import Tombstone
from schemas import config as c
from schemas import shard as s
from services.config.decide import decide as config_decide
from services.shard.decide import ShardDecider
from services.shard.documents import SessionEntry, ShardDocuments, changelog_key, record_key
from services.shard.protocol import retryable

U1 = "00000000-0000-4000-8000-000000000001"
U2 = "00000000-0000-4000-8000-000000000002"


def code(fn, *args) -> str:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return e.value.code


# ------------------------------------------------------------------ session fields


def test_lsid_is_an_object_with_a_uuid_id():
    assert parse_lsid(None) is None
    assert parse_lsid({"id": U1.upper()}) == U1  # canonical form
    assert code(parse_lsid, "abc") == "TypeMismatch"
    assert code(parse_lsid, [U1]) == "TypeMismatch"
    assert code(parse_lsid, {"id": 5}) == "TypeMismatch"
    assert code(parse_lsid, {}) == "IDLFailedToParse"
    assert code(parse_lsid, {"id": U1, "uid": "x"}) == "IDLUnknownField"
    assert code(parse_lsid, {"id": "not-a-uuid"}) == "BadValue"


def test_txn_number_is_a_non_negative_integer():
    assert parse_txn_number(None) is None
    assert parse_txn_number(0) == 0 and parse_txn_number(7) == 7
    for wrong in ("1", 1.0, True, [1], {"$numberLong": "1"}):
        assert code(parse_txn_number, wrong) == "TypeMismatch", wrong
    assert code(parse_txn_number, -1) == "InvalidOptions"  # MongoDB: "Transaction number cannot be negative"
    assert code(parse_txn_number, 2**63) == "BadValue"


def test_stmt_ids_are_unique_int32s_one_per_statement():
    assert parse_stmt_ids([0, 5, 2], 3) == (0, 5, 2)
    assert code(parse_stmt_ids, [0, 1], 3) == "BadValue"
    assert code(parse_stmt_ids, [1, 1], 2) == "BadValue"
    assert code(parse_stmt_ids, [-1], 1) == "BadValue"
    assert code(parse_stmt_ids, [2**31], 1) == "BadValue"
    assert code(parse_stmt_ids, ["0"], 1) == "TypeMismatch"
    assert code(parse_stmt_ids, 0, 1) == "TypeMismatch"


def test_a_client_write_is_retryable_only_with_lsid_and_txn_number():
    base = {"ns": "d.c", "filter": {}, "update": {"$set": {"a": 1}}}
    assert client_session(s.Update(**base)) is None
    assert client_session(s.Update(**base, lsid={"id": U1})) is None  # a session, not a retryable write
    w = client_session(s.Update(**base, lsid={"id": U1}, txnNumber=3))
    assert w is not None and (w.lsid, w.txn_number) == (U1, 3)
    assert code(client_session, s.Update(**base, txnNumber=3)) == "InvalidOptions"  # no session id
    assert code(client_session, s.Update(**base, lsid={"id": U1}, txnNumber=3, stmtIds=[0])) == "BadValue"
    with pytest.raises(CommandError) as e:
        client_session(s.Update(**base, multi=True, lsid={"id": U1}, txnNumber=3))
    assert e.value.code == "InvalidOptions" and "multi=true" in e.value.message
    with pytest.raises(CommandError) as e:
        client_session(s.Delete(ns="d.c", filter={}, multi=True, lsid={"id": U1}, txnNumber=3))
    assert e.value.code == "InvalidOptions" and "limit=0" in e.value.message
    assert client_session(s.Update(**base, multi=True, lsid={"id": U1})) is None  # multi without txnNumber: fine


def test_a_shard_part_needs_one_statement_id_per_document():
    ins = s.Insert(ns="d.c", docs=[{"_id": 1}, {"_id": 2}], lsid={"id": U1}, txnNumber=1, stmtIds=[4, 7])
    assert shard_session(ins).stmt_ids == (4, 7)
    assert code(shard_session, ins.model_copy(update={"stmtIds": [4]})) == "BadValue"
    assert code(shard_session, ins.model_copy(update={"stmtIds": None})) == "TypeMismatch"
    assert code(shard_session, ins.model_copy(update={"txnNumber": None})) == "BadValue"  # stmtIds alone


# ------------------------------------------------------------------ the table, pure


def stmt(i: int, skey: str | None = "10", ns: str = "d.c") -> s.Statement:
    return s.Statement(stmtId=i, ns=ns, skey=skey, result={"n": 1})


def recorded(lsid: str, txn: int, part: str, *ids: int, at: float = 100.0) -> s.RetryableWriteRecorded:
    return s.RetryableWriteRecorded(
        lsid=lsid, txnNumber=txn, part=part, statements=[stmt(i) for i in ids], lastWriteAt=at
    )


def entry(*records: s.RetryableWriteRecorded) -> SessionEntry:
    r0 = records[0]
    return SessionEntry(r0.lsid, r0.txnNumber, {r.part: r for r in records})


def test_begin_skips_executed_statements_refuses_older_and_replaces_on_newer():
    e = entry(recorded(U1, 5, "0", 0, 1))
    from domain.session import RetryableWrite

    same = retryable.begin(e, RetryableWrite(U1, 5, (0, 1, 2)))
    assert set(same.executed) == {0, 1} and same.tombstones == ()
    assert code(retryable.begin, e, RetryableWrite(U1, 4, (0,))) == "TransactionTooOld"
    newer = retryable.begin(e, RetryableWrite(U1, 6, (0,)))
    assert newer.executed == {} and [t.key for t in newer.tombstones] == [record_key(U1, 5, "0")]
    # A second record under the same txnNumber gets a part of its own.
    [again] = retryable.record(same, [stmt(2)], now=1.0)
    assert again.part == "2" and again.txnNumber == 5
    [clash] = retryable.record(retryable.Begun(RetryableWrite(U1, 5, (0,)), {}, (), frozenset({"0"})), [stmt(0)], 1.0)
    assert clash.part == "0.1"


def test_merge_higher_txn_wins_equal_takes_the_union():
    mine = entry(recorded(U1, 5, "0", 0))
    assert retryable.merge(mine, s.SessionStatements(lsid=U1, txnNumber=4, lastWriteAt=1, statements=[stmt(3)])) == []
    higher = retryable.merge(mine, s.SessionStatements(lsid=U1, txnNumber=6, lastWriteAt=1, statements=[stmt(3)]))
    assert isinstance(higher[0], Tombstone) and higher[1].txnNumber == 6
    equal = retryable.merge(
        mine, s.SessionStatements(lsid=U1, txnNumber=5, lastWriteAt=1, statements=[stmt(0), stmt(3)])
    )
    assert [st.stmtId for st in equal[0].statements] == [3]  # statement 0 is here already
    # A statement that matched nothing here is replaced by the one that wrote a document.
    nothing = entry(s.RetryableWriteRecorded(lsid=U1, txnNumber=5, part="0", statements=[stmt(0, None)], lastWriteAt=1))
    [wrote] = retryable.merge(nothing, s.SessionStatements(lsid=U1, txnNumber=5, lastWriteAt=1, statements=[stmt(0)]))
    assert wrote.statements[0].skey == "10"


def test_in_range_takes_only_statements_about_documents_of_the_range():
    e = entry(
        s.RetryableWriteRecorded(
            lsid=U1,
            txnNumber=1,
            part="0",
            statements=[stmt(0, "10"), stmt(1, "30"), stmt(2, None), stmt(3, "10", ns="d.other")],
            lastWriteAt=7,
        )
    )
    got = retryable.in_range(e, "d.c", bytes.fromhex("05"), bytes.fromhex("20"))
    assert got is not None and [x.stmtId for x in got.statements] == [0] and got.lastWriteAt == 7
    assert retryable.in_range(e, "d.c", bytes.fromhex("40"), bytes.fromhex("50")) is None


def test_forget_keeps_sessions_that_wrote_since():
    sessions = {U1: entry(recorded(U1, 1, "0", 0, at=10)), U2: entry(recorded(U2, 1, "0", 0, at=50))}
    events, forgotten = retryable.forget(sessions, [U1, U2, "unknown"], before=20)
    assert forgotten == [U1] and [e.key for e in events] == [record_key(U1, 1, "0")]


# ------------------------------------------------------------------ the fold: replay gives the same table


def fold(tmp_path, events, name="a") -> ShardDocuments:
    store = Store(tmp_path / name)
    docs = ShardDocuments()
    docs.load(store)
    for e in events:
        docs.apply(e, -1)
    store.commit(docs.drain_changes().items(), None)
    return docs


def table(docs: ShardDocuments) -> dict:
    return {lsid: (e.txn_number, sorted(e.records)) for lsid, e in docs.sessions.items()}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([U1, U2]), st.integers(0, 3), st.lists(st.integers(0, 5), min_size=1, max_size=3)),
        max_size=12,
    )
)
def test_the_table_holds_each_sessions_latest_txn_and_reloads_identically(tmp_path_factory, writes):
    """Writes decided with begin/record (as the decider does), folded, then reloaded from the
    store: the same table, each session at its highest admitted txnNumber."""
    from domain.session import RetryableWrite

    tmp = tmp_path_factory.mktemp("fold")
    docs = fold(tmp, [])
    highest: dict[str, int] = {}
    for lsid, txn, ids in writes:
        w = RetryableWrite(lsid, txn, tuple(dict.fromkeys(ids)))
        try:
            begun = retryable.begin(docs.sessions.get(lsid), w)
        except CommandError as e:
            assert e.code == "TransactionTooOld" and txn < highest[lsid]
            continue
        new = [stmt(i) for i in w.stmt_ids if i not in begun.executed]
        events = [*begun.tombstones, *retryable.record(begun, new, 1.0)] if new else []
        for e in events:
            assert changelog_key(e) is not None  # every record and tombstone is keyed
            docs.apply(e, -1)
        highest[lsid] = max(highest.get(lsid, txn), txn)
    docs.store.commit(docs.drain_changes().items(), None)
    for lsid, e in docs.sessions.items():
        assert e.txn_number == highest[lsid]
    again = ShardDocuments()
    again.load(docs.store)
    assert table(again) == table(docs)
    docs.store.close()


# ------------------------------------------------------------------ the shard's decisions


class Shard:
    def __init__(self, tmp_path):
        self.catalog = Catalog(track_changes=False)
        for cmd in (c.AddShard(shard="a"), c.CreateDatabase(db="d", primary="a")):
            for e in config_decide(self.catalog, cmd).events:
                self.catalog.apply(e, self.catalog.config_time)
        self.store = Store(tmp_path / "docs")
        self.documents = ShardDocuments()
        self.documents.load(self.store)
        self.now = 100.0
        self.decider = ShardDecider("a", self.catalog, self.documents, wall=lambda: self.now)

    def run(self, req):
        d = self.decider.decide(req.model_copy(update={"routing": s.Routing(configTime=self.catalog.config_time)}))
        for e in d.events:
            self.documents.apply(e, -1)
        return d.events, d.result

    def find(self, flt):
        return self.run(s.Find(ns="d.c", filter=flt))[1]["docs"]


@pytest.fixture
def shard(tmp_path):
    sh = Shard(tmp_path)
    yield sh
    sh.store.close()


def session(txn: int, *stmt_ids: int) -> dict:
    return {"lsid": {"id": U1}, "txnNumber": txn, "stmtIds": list(stmt_ids)}


def test_an_inc_retried_applies_once_and_an_older_txn_is_refused(shard):
    shard.run(s.Insert(ns="d.c", docs=[{"_id": 1, "n": 0}]))
    inc = s.Update(ns="d.c", filter={"_id": 1}, update={"$inc": {"n": 1}}, **session(2, 0))
    assert shard.run(inc)[1] == {"matched": 1, "modified": 1}
    events, result = shard.run(inc)
    assert events == [] and result["matched"] == 1 and result["retried"]
    assert shard.find({"_id": 1})[0]["n"] == 1
    with pytest.raises(CommandError) as e:
        shard.run(inc.model_copy(update={"txnNumber": 1}))
    assert e.value.code == "TransactionTooOld"
    # A newer txnNumber runs, and replaces the session's records.
    events, _ = shard.run(inc.model_copy(update={"txnNumber": 3}))
    assert [e.type for e in events] == ["Tombstone", "DocumentWritten", "RetryableWriteRecorded"]
    assert shard.find({"_id": 1})[0]["n"] == 2
    assert shard.documents.sessions[U1].txn_number == 3


def test_an_insert_retried_is_answered_as_inserted_and_only_new_statements_run(shard):
    first = s.Insert(ns="d.c", docs=[{"_id": 1}, {"_id": 2}], **session(1, 0, 1))
    assert shard.run(first)[1] == {"inserted": 2, "writeErrors": []}
    again = s.Insert(ns="d.c", docs=[{"_id": 1}, {"_id": 2}, {"_id": 3}], **session(1, 0, 1, 2))
    events, result = shard.run(again)
    assert result == {"inserted": 3, "writeErrors": []}
    assert [e.type for e in events] == ["DocumentWritten", "RetryableWriteRecorded"]
    # Without a session the same insert is a duplicate.
    _, plain = shard.run(s.Insert(ns="d.c", docs=[{"_id": 1}]))
    assert plain["writeErrors"][0]["code"] == "DuplicateKey"


def test_a_write_without_a_session_records_nothing(shard):
    events, _ = shard.run(s.Insert(ns="d.c", docs=[{"_id": 1}]))
    assert [e.type for e in events] == ["DocumentWritten"] and shard.documents.sessions == {}


def test_a_multi_update_with_a_txn_number_is_refused_and_changes_nothing(shard):
    shard.run(s.Insert(ns="d.c", docs=[{"_id": 1, "n": 0}]))
    with pytest.raises(CommandError) as e:
        shard.run(s.Update(ns="d.c", filter={}, update={"$inc": {"n": 1}}, multi=True, **session(1, 0)))
    assert e.value.code == "InvalidOptions"
    assert shard.find({})[0]["n"] == 0


def test_find_and_modify_returns_the_same_document_on_retry(shard):
    shard.run(s.Insert(ns="d.c", docs=[{"_id": i, "n": i} for i in range(3)]))
    fam = s.FindAndModify(
        ns="d.c", query={}, sort={"n": -1}, update={"$inc": {"n": 10}}, new=True, fields={"n": 1}, **session(1, 0)
    )
    _, first = shard.run(fam)
    assert first == {"value": {"_id": 2, "n": 12}, "lastErrorObject": {"n": 1, "updatedExisting": True}}
    events, again = shard.run(fam)
    assert events == [] and again["value"] == first["value"]  # not 22: applied once
    assert shard.find({"_id": 2})[0]["n"] == 12
    # remove returns the pre-image; upsert reports the new _id
    _, removed = shard.run(s.FindAndModify(ns="d.c", query={"_id": 0}, remove=True, **session(2, 0)))
    assert removed == {"value": {"_id": 0, "n": 0}, "lastErrorObject": {"n": 1}}
    _, upserted = shard.run(s.FindAndModify(ns="d.c", query={"_id": 9}, update={"$set": {"n": 9}}, upsert=True))
    assert upserted == {"value": None, "lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": 9}}
    _, none = shard.run(s.FindAndModify(ns="d.c", query={"_id": 99}, update={"$set": {"n": 1}}))
    assert none == {"value": None, "lastErrorObject": {"n": 0, "updatedExisting": False}}


@pytest.mark.parametrize(
    "options",
    [
        {"remove": True, "update": {"$set": {"a": 1}}},
        {},
        {"remove": True, "upsert": True},
        {"remove": True, "new": True},
    ],
)
def test_find_and_modify_refuses_contradictory_options(shard, options):
    with pytest.raises(CommandError) as e:
        shard.run(s.FindAndModify(ns="d.c", query={}, **options))
    assert e.value.code == "FailedToParse"


def test_forget_sessions_tombstones_only_sessions_idle_since_before(shard):
    shard.run(s.Insert(ns="d.c", docs=[{"_id": 1}], **session(1, 0)))
    assert dict(shard.documents.session_last_writes()) == {U1: 100.0}
    events, result = shard.run(s.ForgetSessions(lsids=[U1], before=100.0))
    assert events == [] and result == {"forgotten": []}  # wrote at 100: not older than 100
    events, result = shard.run(s.ForgetSessions(lsids=[U1], before=101.0))
    assert result == {"forgotten": [U1]} and [e.type for e in events] == ["Tombstone"]
    assert events[0].key == record_key(U1, 1, "0") and shard.documents.sessions == {}
    shard.store.commit(shard.documents.drain_changes().items(), None)
    assert list(shard.store.scan(b"x/")) == []  # gone from the store too
