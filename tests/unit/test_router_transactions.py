"""services/router/transactions.py: the router's per-session transaction state (issue 33,
decision 0020) as pure transitions, and the driver's requests to the participants."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from domain.protocol import ErrorCode
from libs.errors import CommandError
from schemas import shard as s
from services.router import transactions as t
from services.router.transactions import Participant, SessionTxn, TxnArgs, TxnState

LSID = "0b0b0b0b-0000-4000-8000-000000000001"
AT = (1_800_000_000 << 32) | 3


def _code(fn, *args) -> str:
    with pytest.raises(CommandError) as e:
        fn(*args)
    return e.value.code


def _open(n: int = 1, *parts: Participant) -> SessionTxn:
    return SessionTxn(LSID, n, AT, participants=parts)


# ------------------------------------------------------------------ statements


def test_a_start_opens_a_transaction_at_its_snapshot():
    assert t.begins(None, LSID, TxnArgs(1, start=True)) is None
    txn = t.started(LSID, TxnArgs(1, start=True), AT)
    assert txn.state is TxnState.IN_PROGRESS and txn.participants == ()
    assert txn.txn() == s.Txn(lsid=LSID, txnNumber=1, readAt=AT)


def test_a_newer_start_supersedes_the_open_transaction_and_only_an_open_one():
    old = _open(1, Participant("sh1", True))
    assert t.begins(old, LSID, TxnArgs(2, start=True)) is old  # to abort on its participants
    assert t.begins(t.ended(old, TxnState.COMMITTED), LSID, TxnArgs(2, start=True)) is None
    assert t.begins(t.ended(old, TxnState.ABORTED), LSID, TxnArgs(2, start=True)) is None


@pytest.mark.parametrize(
    ("current", "args", "code"),
    [
        (_open(5), TxnArgs(4), ErrorCode.TransactionTooOld),
        (_open(5), TxnArgs(4, start=True), ErrorCode.TransactionTooOld),
        (_open(5), TxnArgs(5, start=True), ErrorCode.ConflictingOperationInProgress),
        (None, TxnArgs(1), ErrorCode.NoSuchTransaction),  # never started
        (_open(5), TxnArgs(6), ErrorCode.NoSuchTransaction),  # a number nobody started
        (t.ended(_open(5), TxnState.COMMITTED), TxnArgs(5), ErrorCode.TransactionCommitted),
        (t.ended(_open(5), TxnState.ABORTED), TxnArgs(5), ErrorCode.NoSuchTransaction),
    ],
)
def test_statements_out_of_turn_get_mongodbs_codes(current, args, code):
    assert _code(t.begins, current, LSID, args) == code


def test_the_client_librarys_start_sent_again_gets_the_same_snapshot():
    assert t.resent_start(_open(5), 5) == AT
    assert t.resent_start(_open(5), 6) is None  # a new transaction
    assert t.resent_start(t.ended(_open(5), TxnState.ABORTED), 5) is None  # over: begins refuses it
    assert t.resent_start(None, 1) is None
    assert t.resent_start(_open(5, Participant("sh1")), 5) is None  # it ran a statement: a real conflict


def test_starts_of_one_session_take_turns():
    router = t.TransactionRouter(ask=None)  # type: ignore[arg-type]
    order: list[str] = []

    async def start(name: str, lsid: str) -> None:
        async with router.starting(lsid):
            order.append(f"{name}+")
            await asyncio.sleep(0.01)
            order.append(f"{name}-")

    async def go() -> None:
        await asyncio.gather(start("a", LSID), start("b", LSID), start("c", "other"))

    asyncio.run(go())
    assert order.index("a-") < order.index("b+"), order  # one session: one after the other
    assert order.index("c+") < order.index("a-"), order  # another session: meanwhile
    assert router._starts == {}  # nothing kept once done


def test_a_continuation_of_the_open_transaction_is_fine():
    assert t.begins(_open(5), LSID, TxnArgs(5)) is None


# ------------------------------------------------------------------ participants


def test_participants_in_first_reached_order_and_who_wrote():
    txn = _open()
    txn = t.reached(txn, "sh2", False)
    txn = t.reached(txn, "sh1", True)
    txn = t.reached(txn, "sh2", False)
    assert txn.participants == (Participant("sh2", False), Participant("sh1", True))
    assert txn.writers == ("sh1",) and txn.recovery_shard == "sh1"
    txn = t.reached(txn, "sh1", False)  # a read there later: still a writer
    assert txn.writers == ("sh1",)


def test_a_second_writer_makes_the_commit_two_phase_coordinated_by_the_first():
    txn = t.reached(t.reached(_open(), "sh1", True), "sh2", True)
    assert txn.writers == ("sh1", "sh2") and txn.recovery_shard == "sh1"
    assert t.commit_plan(txn, 1) == t.CommitPlan(("sh1", "sh2"), ())


@pytest.mark.parametrize(
    ("req", "result", "wrote"),
    [
        (s.Insert(ns="a.b", docs=[{}]), {"inserted": 1, "writeErrors": []}, True),
        (s.Insert(ns="a.b", docs=[{}]), {"inserted": 0, "writeErrors": [{}]}, False),
        (s.Update(ns="a.b", filter={}, update={}), {"matched": 0, "modified": 0}, False),
        (s.Update(ns="a.b", filter={}, update={}), {"matched": 1, "modified": 0}, True),
        (s.Update(ns="a.b", filter={}, update={}), {"matched": 0, "modified": 0, "upsertedId": 1}, True),
        (s.Delete(ns="a.b", filter={}), {"deleted": 2}, True),
        (s.FindAndModify(ns="a.b", query={}, remove=True), {"lastErrorObject": {"n": 0}, "value": None}, False),
        (s.FindAndModify(ns="a.b", query={}, remove=True), {"lastErrorObject": {"n": 1}, "value": {}}, True),
        (s.Find(ns="a.b"), {"docs": [{}], "cursorId": 0}, False),
    ],
)
def test_a_shards_reply_tells_whether_it_wrote(req, result, wrote):
    assert t.wrote(req, result) is wrote


def test_the_first_statements_read_concern_picks_the_snapshot():
    assert t.read_at(None) == {"level": "snapshot"}
    assert t.read_at({"level": "majority", "afterClusterTime": 5}) == {"level": "snapshot", "afterClusterTime": 5}
    assert t.read_at({"level": "snapshot", "atClusterTime": 7}) == {"level": "snapshot", "atClusterTime": 7}


# ------------------------------------------------------------------ commit and abort


def test_commit_plans():
    assert t.commit_plan(_open(), 1) == t.CommitPlan((), ())
    readers = _open(1, Participant("sh1"), Participant("sh2"))
    assert t.commit_plan(readers, 1) == t.CommitPlan((), ("sh1", "sh2"))
    one = _open(1, Participant("sh1"), Participant("sh2", True))
    assert t.commit_plan(one, 1) == t.CommitPlan(("sh2",), ("sh1",))
    assert t.commit_plan(t.ended(one, TxnState.COMMITTED), 1) == t.CommitPlan(("sh2",), ())  # a retry asks again


@pytest.mark.parametrize(
    ("current", "n", "token", "code"),
    [
        (None, 1, None, "Location50940"),  # mongos: "Cannot recover the transaction decision without a recoveryToken"
        (None, 1, {}, ErrorCode.NoSuchTransaction),  # read-only: safe to run again
        (_open(3), 2, None, ErrorCode.TransactionTooOld),
        (_open(3), 4, {}, ErrorCode.NoSuchTransaction),
        (t.ended(_open(3), TxnState.ABORTED), 3, None, ErrorCode.NoSuchTransaction),
    ],
)
def test_commits_out_of_turn(current, n, token, code):
    assert _code(t.commit_plan, current, n, token) == code


def test_a_commit_this_router_never_saw_asks_the_shard_its_recovery_token_names():
    plan = t.commit_plan(_open(3), 4, {"recoveryShardId": "sh2"})
    assert plan == t.CommitPlan(("sh2",), (), recovering=True)
    shards = Shards()
    router = t.TransactionRouter(shards)
    _run(router.commit(LSID, 7, {"recoveryShardId": "sh1"}))
    assert shards.kinds() == [("sh1", "CoordinateCommitTransaction", 7)]
    assert shards.sent[0][1].participants == [], "only asking for the outcome"
    assert router.sessions[LSID].state is TxnState.COMMITTED
    _run(router.commit(LSID, 7))  # asked again here: known now
    assert shards.kinds()[-1] == ("sh1", "CommitTransaction", 7)


def test_a_two_writer_commit_asks_the_coordinator_until_it_has_decided():
    answers = iter([{"decision": None}, {"decision": None}, {"decision": "commit", "commitAt": 9}])
    shards = Shards(coordinator=lambda req: next(answers))
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh2", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        stmt.reached("sh1", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        await router.commit(LSID, 1)

    _run(go())
    assert shards.kinds() == [("sh2", "CoordinateCommitTransaction", 1)] * 3
    assert [req.participants for _, req in shards.sent] == [["sh2", "sh1"], [], []]
    assert router.sessions[LSID].state is TxnState.COMMITTED


def test_a_two_phase_abort_is_no_such_transaction_and_ends_it_everywhere():
    shards = Shards(coordinator=lambda req: {"decision": "abort", "why": "sh1 voted no"})
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh1", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        stmt.reached("sh2", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        with pytest.raises(CommandError) as e:
            await router.commit(LSID, 1)
        assert e.value.code == ErrorCode.NoSuchTransaction and "sh1 voted no" in e.value.message

    _run(go())
    assert router.sessions[LSID].state is TxnState.ABORTED
    assert shards.kinds()[1:] == [("sh1", "AbortTransaction", 1), ("sh2", "AbortTransaction", 1)]


def test_aborts():
    txn = _open(1, Participant("sh1"), Participant("sh2", True))
    assert t.abort_plan(txn, 1) == ("sh1", "sh2")
    assert _code(t.abort_plan, t.ended(txn, TxnState.COMMITTED), 1) == ErrorCode.TransactionCommitted
    assert _code(t.abort_plan, t.ended(txn, TxnState.ABORTED), 1) == ErrorCode.NoSuchTransaction
    assert _code(t.abort_plan, None, 1) == ErrorCode.NoSuchTransaction


# ------------------------------------------------------------------ the driver


class Shards:
    """The driver's `ask`: records requests, answers from a table of (type, shard) -> error."""

    def __init__(self, errors: dict[tuple[str, str], str] | None = None, coordinator: Any = None) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.errors = errors or {}
        self.coordinator = coordinator or (lambda req: {"decision": "commit", "commitAt": 9})

    async def __call__(self, shard: str, req: Any) -> dict:
        self.sent.append((shard, req))
        if (code := self.errors.get((req.type, shard))) is not None:
            raise CommandError(code, "refused")
        if isinstance(req, s.CoordinateCommitTransaction):
            return self.coordinator(req)
        return {"committedAt": 9} if isinstance(req, s.CommitTransaction) else {}

    def kinds(self) -> list[tuple[str, str, int]]:
        return [(shard, req.type, req.txnNumber) for shard, req in self.sent]


async def _snapshot(rc: dict) -> int:
    return AT


def _run(coro):
    return asyncio.run(coro)


def test_a_one_writer_commit_ends_the_readers_and_commits_the_writer():
    shards = Shards({("AbortTransaction", "sh1"): ErrorCode.NoSuchTransaction})
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        assert stmt.txn.readAt == AT and stmt.recovery_token() == {}
        stmt.reached("sh1", s.Find(ns="a.b"), {"docs": []})
        stmt.reached("sh2", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        assert stmt.recovery_token() == {"recoveryShardId": "sh2"}
        await router.commit(LSID, 1)
        await router.commit(LSID, 1)  # retried: the writer answers the same

    _run(go())
    assert shards.kinds() == [
        ("sh1", "AbortTransaction", 1),  # NoSuchTransaction there is fine
        ("sh2", "CommitTransaction", 1),
        ("sh2", "CommitTransaction", 1),
    ]
    assert router.sessions[LSID].state is TxnState.COMMITTED


def test_a_failed_statement_aborts_everywhere_and_later_statements_find_no_transaction():
    shards = Shards()
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh1", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        stmt.reached("sh2", s.Insert(ns="a.b", docs=[{}]), None)  # failed there
        await router.failed(stmt)
        with pytest.raises(CommandError) as e:
            await router.begin(LSID, TxnArgs(1), _snapshot)
        assert e.value.code == ErrorCode.NoSuchTransaction

    _run(go())
    assert shards.kinds() == [("sh1", "AbortTransaction", 1), ("sh2", "AbortTransaction", 1)]


def test_a_newer_transaction_aborts_the_open_one_on_its_participants():
    shards = Shards()
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh1", s.Delete(ns="a.b", filter={}), {"deleted": 1})
        await router.begin(LSID, TxnArgs(2, start=True), _snapshot)

    _run(go())
    assert shards.kinds() == [("sh1", "AbortTransaction", 1)]
    assert router.sessions[LSID].txn_number == 2 and router.sessions[LSID].participants == ()


def test_a_refused_commit_aborts_and_an_unknown_outcome_can_be_retried():
    shards = Shards({("CommitTransaction", "sh1"): ErrorCode.ShardUnavailable})
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh1", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        with pytest.raises(CommandError):
            await router.commit(LSID, 1)
        assert router.sessions[LSID].state is TxnState.IN_PROGRESS  # nobody knows: the client retries
        shards.errors = {("CommitTransaction", "sh1"): ErrorCode.WriteConflict}
        with pytest.raises(CommandError):
            await router.commit(LSID, 1)
        assert router.sessions[LSID].state is TxnState.ABORTED

    _run(go())
    assert shards.kinds()[-1] == ("sh1", "AbortTransaction", 1)


def test_abort_reaches_every_participant_and_forget_drops_the_session():
    shards = Shards()
    router = t.TransactionRouter(shards)

    async def go() -> None:
        stmt = await router.begin(LSID, TxnArgs(1, start=True), _snapshot)
        stmt.reached("sh2", s.Find(ns="a.b"), None)  # failed there: still ended there
        stmt.reached("sh1", s.Insert(ns="a.b", docs=[{}]), {"inserted": 1})
        await router.abort(LSID, 1)

    _run(go())
    assert shards.kinds() == [("sh2", "AbortTransaction", 1), ("sh1", "AbortTransaction", 1)]
    router.forget([LSID])
    assert LSID not in router.sessions


def test_which_refusals_the_router_waits_out():
    from services.router.route import _waits

    write, read = s.Update(ns="a.b", filter={}, update={}), s.Find(ns="a.b")
    assert _waits(ErrorCode.WriteConflict, write, in_transaction=False)  # a plain write waits for the holder
    assert not _waits(ErrorCode.WriteConflict, write, in_transaction=True)  # first writer wins
    assert not _waits(ErrorCode.WriteConflict, read, in_transaction=False)
    assert _waits("PrepareConflict", read, in_transaction=True)  # the coordinator's decision follows at once
    assert not _waits(ErrorCode.DuplicateKey, write, in_transaction=False)
